#include <metronome/scheduled_thread_pool.hpp>

#include <boost/test/unit_test.hpp>

BOOST_AUTO_TEST_SUITE(pool_executor)
BOOST_AUTO_TEST_CASE(placeholder_compiles) { BOOST_TEST(true); }
BOOST_AUTO_TEST_SUITE_END()
