#include <metronome/manual_clock.hpp>

#include <metronome/scheduled_thread_pool.hpp>

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <stdexcept>

using namespace std::chrono_literals;

BOOST_AUTO_TEST_SUITE(manual_clock_suite)

BOOST_AUTO_TEST_CASE(moves_only_when_told) {
  metronome::manual_clock c;
  auto t0 = c.now();
  BOOST_TEST((c.now() == t0));
  c.advance(5ms);
  BOOST_TEST((c.now() == t0 + 5ms));
  c.advance_to(t0 + 1h);
  BOOST_TEST((c.now() == t0 + 1h));
  c.advance(0ms);
  BOOST_TEST((c.now() == t0 + 1h));
}

BOOST_AUTO_TEST_CASE(refuses_to_go_back) {
  metronome::manual_clock c;
  BOOST_CHECK_THROW(c.advance(-1ms), std::invalid_argument);
  BOOST_CHECK_THROW(c.advance_to(c.now() - 1ns), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(a_pool_on_it_runs_an_hour_long_delay_at_once) {
  metronome::manual_clock c;
  metronome::pool_options o;
  o.time_source = &c;
  metronome::scheduled_thread_pool pool(o);
  auto f = pool.schedule([] { return 1; }, 1h);
  BOOST_TEST((pool.now() == c.now()));
  BOOST_TEST((f.delay() == std::chrono::nanoseconds(1h)));
  c.advance(59min);
  BOOST_TEST((f.wait_for(50ms) == std::future_status::timeout));
  BOOST_TEST(!f.is_done());
  c.advance(1min);
  BOOST_TEST(f.get() == 1); // would hang for an hour if the pool read the real clock
}

BOOST_AUTO_TEST_CASE(advance_releases_due_work_before_returning) {
  metronome::manual_clock c;
  metronome::pool_options o;
  o.time_source = &c;
  metronome::scheduled_thread_pool pool(o);
  auto f = pool.schedule([] {}, 10ms);
  BOOST_TEST(pool.stats().delayed_queued == 1u);
  c.advance(10ms);
  BOOST_TEST(pool.stats().delayed_queued == 0u); // moved to the ready path synchronously
  f.get();
}

BOOST_AUTO_TEST_SUITE_END()
