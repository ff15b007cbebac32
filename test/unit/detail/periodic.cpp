#include <metronome/detail/periodic.hpp>

#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>
#include <metronome/serial_executor.hpp>

#include "common/manual_pool.hpp"
#include "common/poll_until.hpp"

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <semaphore>
#include <stdexcept>
#include <vector>

using namespace std::chrono_literals;
using mclock = metronome::clock;
using metronome::manual_clock;
using metronome::periodic_options;
using metronome::scheduled_thread_pool;
using metronome::test::on_clock;
using metronome::test::poll_until;

BOOST_AUTO_TEST_SUITE(periodic_jitter)

BOOST_AUTO_TEST_CASE(jittered_stays_within_the_fraction_and_is_seeded) {
  const mclock::time_point nominal(1h);
  std::uint64_t s1 = 99, s2 = 99;
  bool moved = false;
  for (int i = 0; i < 1000; ++i) {
    const auto a = metronome::detail::jittered(nominal, 100ms, 0.25, s1);
    const auto b = metronome::detail::jittered(nominal, 100ms, 0.25, s2);
    BOOST_TEST((a == b)); // same seed, same sequence
    BOOST_TEST((a >= nominal - 25ms && a <= nominal + 25ms));
    moved |= a != nominal;
  }
  BOOST_TEST(moved);
  std::uint64_t s = 1;
  BOOST_TEST((metronome::detail::jittered(nominal, 100ms, 0.0, s) == nominal));
}

// Each run after the first is due within ±jitter·period of its grid point, and the grid
// does not drift (the jittered time is never the base of the next one).
BOOST_AUTO_TEST_CASE(fixed_rate_runs_are_jittered_around_a_grid_that_does_not_drift) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  const mclock::time_point t0 = c.now();
  std::counting_semaphore<> ran(0);
  periodic_options o;
  o.jitter = 0.2;
  auto h = pool.schedule_at_fixed_rate([&] { ran.release(); }, 0ms, 100ms, o);
  ran.acquire(); // the first run: at once, not jittered
  int off_grid = 0;
  for (int k = 1; k <= 40; ++k) {
    BOOST_TEST_REQUIRE(poll_until([&] { return h.delay() > 0ns; }));
    const mclock::time_point due = c.now() + h.delay();
    const mclock::time_point grid = t0 + k * 100ms;
    BOOST_TEST_REQUIRE((due >= grid - 20ms && due <= grid + 20ms), "run " << k);
    off_grid += due != grid;
    c.advance_to(due);
    ran.acquire();
  }
  BOOST_TEST(off_grid > 30);
  h.cancel();
}

// A jittered periodic task runs its run scheduled at time_point::max() once and ends,
// whatever the jitter draws: the end of time is decided on the schedule. (It was decided
// on the jittered due time: a draw below max ran the task again at once, until a draw
// saturated - 10 to 13 of 20 tasks ran more than once.)
BOOST_AUTO_TEST_CASE(a_jittered_task_runs_at_the_end_of_time_once) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  periodic_options o;
  o.jitter = 0.5;
  constexpr int n = 20;
  std::atomic<int> at_max[n] = {};       // first due at max()
  std::atomic<int> reaching_max[n] = {}; // 1 h, 100 and 200 years later, then saturated at max()
  std::vector<metronome::scheduled_future<void>> handles;
  for (int i = 0; i < n; ++i) {
    handles.push_back(pool.schedule_at_fixed_rate([&, i] { ++at_max[i]; }, std::chrono::nanoseconds::max(), 1ms, o));
    handles.push_back(pool.schedule_with_fixed_delay([&, i] { ++at_max[i]; }, std::chrono::nanoseconds::max(), 1ms, o));
    handles.push_back(pool.schedule_at_fixed_rate([&, i] { ++reaching_max[i]; }, 1h, 24h * 365 * 100, o));
  }
  c.advance_to(mclock::time_point::max());
  for (auto& h : handles) {
    BOOST_TEST_REQUIRE((h.wait_for(10s) == std::future_status::ready));
    BOOST_TEST(!h.is_cancelled());
  }
  for (int i = 0; i < n; ++i) {
    BOOST_TEST(at_max[i].load() == 2, "tasks " << i << " at max() ran " << at_max[i].load() << " times (want 1 each)");
    BOOST_TEST(reaching_max[i].load() == 4, "task " << i << " reaching max() ran " << reaching_max[i].load() << " times");
  }
  BOOST_TEST(pool.stats().delayed_queued == 0u);
}

BOOST_AUTO_TEST_CASE(jitter_outside_zero_to_one_throws) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  for (double j : {1.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    periodic_options o;
    o.jitter = j;
    BOOST_CHECK_THROW(pool.schedule_at_fixed_rate([] {}, 0ms, 10ms, o), std::invalid_argument);
    BOOST_CHECK_THROW(pool.schedule_with_fixed_delay([] {}, 0ms, 10ms, o), std::invalid_argument);
    auto serial = metronome::make_serial_executor(pool.get_executor());
    BOOST_CHECK_THROW(serial.schedule_at_fixed_rate([] {}, 0ms, 10ms, o), std::invalid_argument);
  }
  BOOST_TEST(pool.stats().delayed_queued == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
