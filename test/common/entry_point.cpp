// The one translation unit that defines the Boost.Test module (Boost.MySQL's layout).
#define BOOST_TEST_MODULE metronome
#include <boost/test/unit_test.hpp>
