// wheel_timer::timeout::reset(d): a timeout still waiting in the wheel moves to a new
// deadline (an unlink and a link). Time is a manual clock, except where the timer
// thread's wake-up is the point. This executable counts the calling thread's
// allocations (operator new replaced).
#include <metronome/wheel_timer.hpp>

#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include "common/latch_task.hpp"

#include <boost/test/unit_test.hpp>

#include "common/counting_new.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

using metronome::test::allocations;

using namespace std::chrono_literals;
using metronome::manual_clock;
using metronome::scheduled_thread_pool;
using metronome::wheel_options;
using metronome::wheel_timer;

namespace {

// A wheel on a manual clock firing onto a one-thread pool; records (id, time run).
struct manual_wheel {
  manual_clock clock;
  metronome::test::gate busy; // before the pool: outlives the task waiting on it
  metronome::test::counter busy_started;
  scheduled_thread_pool pool{1};
  wheel_timer wheel;
  std::mutex m;
  std::vector<std::pair<int, metronome::clock::time_point>> fired;
  const metronome::clock::time_point t0 = clock.now();

  explicit manual_wheel(wheel_options o = {}) : wheel(pool, with_clock(o)) {}
  wheel_options with_clock(wheel_options o) {
    o.time_source = &clock;
    return o;
  }
  wheel_timer::timeout add(int id, metronome::clock::duration d) {
    return wheel.schedule(
        [this, id] {
          std::lock_guard lk(m);
          fired.emplace_back(id, clock.now());
        },
        d);
  }
  // What fell due by now has run when this returns (one pool thread, FIFO).
  std::vector<std::pair<int, metronome::clock::duration>> ran() {
    pool.submit([] {}).get();
    std::lock_guard lk(m);
    std::vector<std::pair<int, metronome::clock::duration>> out;
    for (auto& [id, at] : fired) out.emplace_back(id, at - t0);
    return out;
  }
  void occupy_pool() {
    pool.submit([this] {
      busy_started.add();
      busy.wait();
    });
    BOOST_REQUIRE(busy_started.wait_for_at_least(1));
  }
};

using runs = std::vector<std::pair<int, metronome::clock::duration>>;

} // namespace

BOOST_AUTO_TEST_SUITE(wheel_timer_reset)

BOOST_AUTO_TEST_CASE(reset_moves_a_waiting_timeout_later) {
  manual_wheel w;
  auto t = w.add(1, 10ms);
  w.clock.advance(8ms);
  BOOST_TEST(t.reset(10ms)); // now due at +18 ms
  w.clock.advance(5ms);      // +13 ms: past the old deadline
  BOOST_TEST(w.ran().empty());
  BOOST_TEST(!t.is_expired());
  BOOST_TEST(w.wheel.pending() == 1u);
  w.clock.advance(4ms);
  BOOST_TEST(w.ran().empty());
  w.clock.advance(1ms);
  BOOST_TEST((w.ran() == runs{{1, 18ms}}));
  BOOST_TEST(t.is_expired());
}

BOOST_AUTO_TEST_CASE(reset_moves_a_timeout_between_levels_both_ways) {
  manual_wheel w;
  auto far = w.add(1, 100s);    // a high level
  auto near = w.add(2, 300ms);  // level 0 or 1
  BOOST_TEST(far.reset(700ms)); // down
  BOOST_TEST(near.reset(50s));  // up
  w.clock.advance(699ms);
  BOOST_TEST(w.ran().empty());
  w.clock.advance(1ms);
  BOOST_TEST((w.ran() == runs{{1, 700ms}}));
  w.clock.advance(50s - 700ms - 1ms);
  BOOST_TEST(w.ran().size() == 1u);
  w.clock.advance(1ms);
  BOOST_TEST((w.ran() == runs{{1, 700ms}, {2, 50s}}));
}

// A slot a level up moving down bit by bit: a timeout reset out of it, and one reset
// into its deadline range, both fire on their tick.
BOOST_AUTO_TEST_CASE(reset_out_of_and_into_a_moving_slot) {
  wheel_options o;
  o.slots_per_level = 256; // level-1 slots span 128 ticks
  manual_wheel w(o);
  std::vector<wheel_timer::timeout> ts;
  for (int i = 0; i < 300; ++i) ts.push_back(w.add(i, 300ms)); // level 1, slot 2
  w.clock.advance(130ms);                                      // slot 2 is moving down
  BOOST_TEST(ts[0].reset(20ms));                               // out: due at +150 ms
  auto late = w.add(1000, 10ms);
  BOOST_TEST(late.reset(170ms)); // in: due at +300 ms, after the 299 others
  w.clock.advance(19ms);
  BOOST_TEST(w.ran().empty());
  w.clock.advance(1ms);
  BOOST_TEST((w.ran() == runs{{0, 150ms}}));
  w.clock.advance(150ms);
  const auto r = w.ran();
  BOOST_REQUIRE(r.size() == 301u);
  for (std::size_t i = 1; i < 300; ++i) BOOST_TEST((r[i] == runs::value_type{static_cast<int>(i), 300ms}));
  BOOST_TEST((r[300] == runs::value_type{1000, 300ms}));
}

BOOST_AUTO_TEST_CASE(a_reset_counts_as_a_new_scheduling_among_equal_deadlines) {
  manual_wheel w;
  auto a = w.add(1, 10ms);
  w.add(2, 10ms);
  w.add(3, 10ms);
  BOOST_TEST(a.reset(10ms));
  w.clock.advance(10ms);
  BOOST_TEST((w.ran() == runs{{2, 10ms}, {3, 10ms}, {1, 10ms}}));
}

BOOST_AUTO_TEST_CASE(reset_to_zero_hands_it_to_the_executor_now) {
  manual_wheel w;
  auto t = w.add(1, 1h);
  BOOST_TEST(t.reset(0ms));
  BOOST_TEST(t.is_expired());
  BOOST_TEST(w.wheel.pending() == 0u);
  BOOST_TEST((w.ran() == runs{{1, 0ms}}));
}

BOOST_AUTO_TEST_CASE(a_timeout_that_is_no_longer_waiting_is_not_revived) {
  manual_wheel w;
  // Fired and run.
  auto ran = w.add(1, 1ms);
  w.clock.advance(1ms);
  BOOST_TEST(w.ran().size() == 1u);
  BOOST_TEST(!ran.reset(1ms));
  // Cancelled.
  auto cancelled = w.add(2, 1ms);
  BOOST_TEST(cancelled.cancel());
  BOOST_TEST(!cancelled.reset(1ms));
  BOOST_TEST(cancelled.is_cancelled());
  // Due and queued on the executor, not run yet.
  w.occupy_pool();
  auto queued = w.add(3, 1ms);
  w.clock.advance(1ms);
  BOOST_TEST(queued.is_expired());
  BOOST_TEST(!queued.reset(1h));
  w.busy.open();
  w.clock.advance(1h);
  BOOST_TEST(w.ran().size() == 2u); // it ran once, at its first deadline
  // An empty handle.
  BOOST_TEST(!wheel_timer::timeout().reset(1ms));
  BOOST_TEST(w.wheel.pending() == 0u);
}

BOOST_AUTO_TEST_CASE(after_stop_and_after_the_wheel_is_gone_reset_says_false) {
  manual_clock c;
  scheduled_thread_pool pool(1);
  wheel_options o;
  o.time_source = &c;
  wheel_timer::timeout stopped, orphan;
  {
    wheel_timer wheel(pool, o);
    stopped = wheel.schedule([] {}, 1h);
    (void)wheel.stop();
    BOOST_TEST(!stopped.reset(1ms));
  }
  {
    wheel_timer wheel(pool, o);
    orphan = wheel.schedule([] {}, 1h);
  }
  BOOST_TEST(!orphan.reset(1ms));
  BOOST_TEST(orphan.is_cancelled());
  BOOST_TEST(stopped.is_cancelled());
}

BOOST_AUTO_TEST_CASE(reset_allocates_nothing_and_keeps_the_pending_count) {
  manual_wheel w;
  std::vector<wheel_timer::timeout> ts;
  for (int i = 0; i < 1000; ++i) ts.push_back(w.wheel.schedule([] {}, std::chrono::seconds(60 + i)));
  int moved = 0;
  const long before = allocations;
  for (int round = 0; round < 3; ++round)
    for (std::size_t i = 0; i < ts.size(); ++i)
      moved += ts[i].reset(std::chrono::seconds(120) + std::chrono::milliseconds(97 * i + round)) ? 1 : 0;
  const long after = allocations;
  BOOST_TEST(moved == 3000);
  BOOST_TEST(after == before);
  BOOST_TEST(w.wheel.pending() == 1000u);
  for (auto& t : ts) t.cancel();
}

// The idle-timeout pattern: every "read" restarts the timeout; it fires once, a full
// idle period after the last one.
BOOST_AUTO_TEST_CASE(restarting_on_every_read_fires_once_after_the_last) {
  manual_wheel w;
  auto idle = w.add(7, 30ms);
  for (int read = 0; read < 100; ++read) {
    w.clock.advance(10ms);
    BOOST_TEST(idle.reset(30ms));
  }
  BOOST_TEST(w.ran().empty());
  w.clock.advance(30ms);
  BOOST_TEST((w.ran() == runs{{7, 1030ms}}));
}

// On the real clock: the timer thread sleeps until the old deadline (an hour away); a
// reset to an earlier one wakes it. No timing is asserted, only that it fires.
BOOST_AUTO_TEST_CASE(an_earlier_deadline_wakes_the_timer_thread) {
  scheduled_thread_pool pool(1);
  wheel_timer wheel(pool);
  metronome::test::counter fired;
  auto t = wheel.schedule([&] { fired.add(); }, 1h);
  auto keep = wheel.schedule([] {}, 2h); // the timer thread has something to sleep for
  BOOST_TEST(t.reset(1ms));
  BOOST_TEST(fired.wait_for_at_least(1));
  keep.cancel();
}

// Resets race the clock, the executor and is_expired(): every timeout fires once.
BOOST_AUTO_TEST_CASE(resets_racing_the_clock_lose_nothing_and_fire_nothing_twice) {
  manual_clock c;
  scheduled_thread_pool pool(2);
  wheel_options o;
  o.time_source = &c;
  wheel_timer wheel(pool, o);
  constexpr int n = 400;
  std::vector<std::atomic<int>> ran(n);
  std::vector<wheel_timer::timeout> ts;
  for (int i = 0; i < n; ++i) ts.push_back(wheel.schedule([&ran, i] { ++ran[i]; }, std::chrono::milliseconds(1 + i % 40)));
  std::atomic<bool> stop{false};
  std::thread resetter([&] {
    for (int k = 0; !stop.load(); ++k) ts[static_cast<std::size_t>(k % n)].reset(std::chrono::milliseconds(k % 9));
  });
  std::thread watcher([&] {
    std::size_t seen = 0;
    for (int k = 0; !stop.load(); ++k) seen += ts[static_cast<std::size_t>(k % n)].is_expired() ? 1 : 0;
    (void)seen;
  });
  for (int i = 0; i < 150; ++i) c.advance(1ms);
  stop = true;
  resetter.join();
  watcher.join();
  c.advance(1h);
  pool.shutdown();
  pool.join();
  for (auto& r : ran) BOOST_TEST(r.load() == 1);
  BOOST_TEST(wheel.pending() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
