// The one translation unit that defines the Boost.Test module (Boost.MySQL's layout).
#define BOOST_TEST_MODULE metronome
#if defined(METRONOME_BOOST_TEST_HEADER_ONLY) // Boost.Test compiled in (test/CMakeLists.txt)
#include <boost/test/included/unit_test.hpp>
#else
#include <boost/test/unit_test.hpp>
#endif
