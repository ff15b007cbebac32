// The wheel timer's rules on a manual clock: options, never early and at most a tick
// late, deadline and scheduling order, cascades, cancel and memory, max_pending, stop(),
// the real clock, and async_wait. Lifetimes and failures are in lifetime.cpp.
#include <metronome/wheel_timer.hpp>

#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>
#include <metronome/serial_executor.hpp>

#include "wheel_engine.hpp"
#include "common/counting_executor.hpp"
#include "common/exception_log.hpp"
#include "common/io_churn.hpp"
#include "common/latch_task.hpp"
#include "common/poll_until.hpp"
#include "common/stderr_capture.hpp"
#include "common/threads.hpp"

#include <metronome/detail/asio.hpp>
#include <metronome/detail/node_cache.hpp>

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <functional>
#include <future>
#include <malloc.h>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace net = metronome::net;
using namespace std::chrono_literals;
using metronome::error_code;
using metronome::manual_clock;
using metronome::scheduled_thread_pool;
using metronome::wheel_options;
using metronome::wheel_timer;

namespace {
// The wheel's diagnostics, through the library's internal access to the engine.
struct wheel_access {
  static std::size_t moving(const wheel_timer& w, std::size_t level) {
    return metronome::detail::engine(metronome::detail::core_access::core(w)).moving(level);
  }
  static std::size_t touched_ahead(const wheel_timer& w) { return metronome::detail::engine(metronome::detail::core_access::core(w)).touched_ahead(); }
};
} // namespace

namespace {
struct manual_wheel {
  manual_clock clock;
  metronome::test::gate busy; // declared before the pool: outlives the task waiting on it
  metronome::test::counter busy_started;
  scheduled_thread_pool pool{1};
  wheel_timer wheel;
  std::mutex m;
  std::vector<std::pair<int, metronome::clock::time_point>> fired; // (id, time it ran)
  metronome::test::counter count;

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
          count.add();
        },
        d);
  }
  std::size_t fired_count() {
    std::lock_guard lk(m);
    return fired.size();
  }
  // Occupies the only pool thread until busy.open(): due timeouts queue behind it.
  void occupy_pool() {
    BOOST_REQUIRE(metronome::test::occupy_worker(pool, busy, busy_started));
  }
  // What fired ran in id order (the tests number timeouts in scheduling order).
  void check_fired_in_id_order() {
    std::lock_guard lk(m);
    for (std::size_t i = 0; i < fired.size(); ++i) BOOST_TEST(fired[i].first == static_cast<int>(i));
  }
};
// Schedules one timeout per delay (ms), advances the clock a tick at a time up to `last`
// and checks that none fires early and each runs on its own tick.
void fires_each_on_its_tick(manual_wheel& w, const std::vector<long>& delays, long last) {
  for (std::size_t i = 0; i < delays.size(); ++i) w.add(static_cast<int>(i), std::chrono::milliseconds(delays[i]));
  const auto t0 = w.clock.now();
  int expected = 0;
  for (long step = 1; step <= last; ++step) {
    w.clock.advance(1ms);
    for (long d : delays) expected += d == step;
    BOOST_REQUIRE(w.count.wait_for_at_least(expected));
    BOOST_REQUIRE(w.fired_count() == static_cast<std::size_t>(expected)); // none early
  }
  std::lock_guard lk(w.m);
  for (auto& [id, at] : w.fired)
    BOOST_TEST((at == t0 + std::chrono::milliseconds(delays[static_cast<std::size_t>(id)])));
}

} // namespace

BOOST_AUTO_TEST_SUITE(wheel_timer_suite)

// A wheel over a pool has no thread of its own: the pool's worker turns it (its tick is
// a wait in the pool's heap) and runs its timeouts; nothing is added while it holds
// timeouts, and the pool still terminates at join() while the wheel holds a far one.
BOOST_AUTO_TEST_CASE(a_wheel_over_a_pool_starts_no_thread_and_its_timeouts_run_on_the_pool) {
  const std::size_t before = metronome::test::process_threads();
  scheduled_thread_pool pool(1);
  auto wheel = std::make_unique<wheel_timer>(pool);
  auto far = wheel->schedule([] {}, std::chrono::hours(1));
  std::promise<bool> on_pool[3];
  for (int i = 0; i < 3; ++i)
    wheel->schedule([&, i] { on_pool[i].set_value(pool.get_executor().running_in_this_thread()); },
                    std::chrono::milliseconds(2 + 3 * i));
  BOOST_TEST(metronome::test::process_threads() == before + 1); // the pool's one worker
  for (auto& p : on_pool) {
    auto f = p.get_future();
    BOOST_REQUIRE((f.wait_for(20s) == std::future_status::ready));
    BOOST_TEST(f.get());
  }
  BOOST_TEST(metronome::test::process_threads() == before + 1);
  BOOST_CHECK_EQUAL(wheel->pending(), 1u);
  pool.shutdown();
  BOOST_TEST(pool.await_termination(20s)); // the far timeout's tick does not hold it
  wheel.reset();
  BOOST_TEST(far.is_cancelled());
}

BOOST_AUTO_TEST_CASE(rejects_bad_options) {
  scheduled_thread_pool pool(1);
  auto bad = [&](wheel_options o) { BOOST_CHECK_THROW(wheel_timer(pool, o), std::invalid_argument); };
  wheel_options o;
  o.tick = 0ms;
  bad(o);
  o = {};
  o.slots_per_level = 48;
  bad(o);
  o = {};
  o.slots_per_level = 8192;
  bad(o);
  o = {};
  o.slots_per_level = 1;
  bad(o);
  o = {};
  o.slots_per_level = 2; // a level's slot would span no more than the one below
  bad(o);
  o = {};
  o.levels = 0;
  bad(o);
  o = {};
  o.levels = 8; // 9 + 8 * 7 = 65 bits
  bad(o);
  o.levels = 7; // 57 bits: fine
  BOOST_CHECK_NO_THROW(wheel_timer(pool, o));
}

BOOST_AUTO_TEST_CASE(never_early_and_at_most_one_tick_late) {
  manual_wheel w;
  const auto t0 = w.clock.now();
  w.add(1, 2500us); // deadline rounds up to tick 3
  w.clock.advance(2ms);
  BOOST_TEST(w.wheel.pending() == 1u);
  w.clock.advance(500us); // exactly the deadline, mid-tick: not yet on a tick
  BOOST_TEST(w.wheel.pending() == 1u);
  w.clock.advance(500us); // tick 3
  BOOST_TEST(w.count.wait_for_at_least(1));
  BOOST_TEST((w.fired[0].second == t0 + 3ms));
  BOOST_TEST(w.wheel.pending() == 0u);
}

BOOST_AUTO_TEST_CASE(a_deadline_at_the_end_of_time_fires_when_the_clock_gets_there) {
  // Rounded up to a whole tick, these deadlines would lie past the tick time_point::max()
  // is in, which the clock never reaches (a manual clock stops at max).
  manual_wheel w;
  w.add(0, std::chrono::nanoseconds::max());                                            // saturates at max
  w.add(1, (metronome::clock::time_point::max() - w.clock.now()) - 1ns);                 // mid last tick
  w.clock.advance(1h);
  BOOST_TEST(w.wheel.pending() == 2u);
  w.clock.advance_to(metronome::clock::time_point::max());
  BOOST_TEST(w.count.wait_for_at_least(2));
  BOOST_TEST(w.wheel.pending() == 0u);
  std::lock_guard lk(w.m);
  for (auto& [id, at] : w.fired) BOOST_TEST((at == metronome::clock::time_point::max())); // never early
}

// A tick of any length: the timer thread's next wake-up saturates at time_point::max()
// (start + tick * n overflowed: UBSan, in the ASan build of .ci/run).
BOOST_AUTO_TEST_CASE(a_huge_tick_never_overflows_the_timer_s_wake_up) {
  {
    wheel_options o;
    o.tick = metronome::clock::duration::max(); // no second tick the clock could reach
    scheduled_thread_pool pool(1);
    BOOST_CHECK_THROW((wheel_timer{pool, o}), std::invalid_argument);
    o.tick = std::chrono::hours(24 * 365); // x 512 slots: 512 years
    BOOST_CHECK_THROW((wheel_timer{pool, o}), std::invalid_argument);
  }
  for (auto tick : {metronome::clock::duration::max() / 512, metronome::clock::duration(std::chrono::hours(24 * 30))}) {
    scheduled_thread_pool pool(1);
    wheel_options o;
    o.tick = tick;
    wheel_timer wheel(pool, o);
    auto a = wheel.schedule([] {}, 1ms);
    auto b = wheel.schedule([] {}, std::chrono::nanoseconds::max());
    BOOST_TEST(wheel.pending() == 2u);
    BOOST_TEST(a.cancel());
    BOOST_TEST(b.cancel());
  }
}

BOOST_AUTO_TEST_CASE(fires_in_deadline_order) {
  manual_wheel w;
  std::mt19937 rng(5);
  std::map<int, long> deadline_ms;
  for (int i = 0; i < 2000; ++i) {
    long ms = 1 + static_cast<long>(rng() % 300);
    deadline_ms[i] = ms;
    w.add(i, std::chrono::milliseconds(ms));
  }
  const auto t0 = w.clock.now();
  int expected = 0;
  for (int step = 1; step <= 300; ++step) {
    w.clock.advance(1ms);
    for (auto& [id, ms] : deadline_ms) expected += ms == step;
    BOOST_REQUIRE(w.count.wait_for_at_least(expected));
  }
  std::lock_guard lk(w.m);
  BOOST_REQUIRE(w.fired.size() == 2000u);
  for (auto& [id, at] : w.fired) BOOST_TEST((at == t0 + std::chrono::milliseconds(deadline_ms[id]))); // on its tick
}

// 4 slots x 3 levels: slots span 1, 2 and 4 ticks, the top ring covers 16 ticks.
// Delays just below, at and above each level's reach cascade and still fire on their
// own tick; later ones wait at the top and go round it again.
BOOST_AUTO_TEST_CASE(cascades_across_level_boundaries) {
  wheel_options o;
  o.slots_per_level = 4;
  o.levels = 3;
  manual_wheel w(o);
  const std::vector<long> delays = {1, 3, 4, 5, 15, 16, 17, 63, 64, 65, 100, 200, 1000};
  fires_each_on_its_tick(w, delays, 1000);
}

// Levels wider than one 64-bit occupancy word: 256 slots x 2 levels (level-1 slots span
// 128 ticks, the top ring 32,768 ticks; later deadlines go round it again).
BOOST_AUTO_TEST_CASE(wide_levels_fire_on_their_tick) {
  wheel_options o;
  o.slots_per_level = 256;
  o.levels = 2;
  manual_wheel w(o);
  const std::vector<long> delays = {1, 63, 64, 65, 127, 128, 255, 256, 257, 511, 512, 700, 65535, 65536, 70000};
  for (std::size_t i = 0; i < delays.size(); ++i) w.add(static_cast<int>(i), std::chrono::milliseconds(delays[i]));
  const auto t0 = w.clock.now();
  int expected = 0;
  long at = 0;
  for (long d : delays) { // jump straight to each deadline's edges: just before, on it
    if (d - 1 > at) {
      w.clock.advance(std::chrono::milliseconds(d - 1 - at));
      at = d - 1;
      BOOST_REQUIRE(w.count.wait_for_at_least(expected));
      BOOST_REQUIRE(w.fired_count() == static_cast<std::size_t>(expected)); // none early
    }
    w.clock.advance(1ms);
    ++at;
    ++expected;
    BOOST_REQUIRE(w.count.wait_for_at_least(expected));
  }
  std::lock_guard lk(w.m);
  for (auto& [id, when] : w.fired)
    BOOST_TEST((when == t0 + std::chrono::milliseconds(delays[static_cast<std::size_t>(id)])));
}

BOOST_AUTO_TEST_CASE(timeouts_of_one_tick_fire_in_scheduling_order) {
  manual_wheel w; // one pool thread: the executor keeps the wheel's order
  for (int i = 0; i < 500; ++i) w.add(i, 5ms);
  for (int i = 500; i < 1000; ++i) w.add(i, 600ms); // one level up first, then cascaded
  w.clock.advance(5ms);
  BOOST_TEST(w.count.wait_for_at_least(500));
  w.clock.advance(595ms);
  BOOST_TEST(w.count.wait_for_at_least(1000));
  w.check_fired_in_id_order();
}

// While it waits for a tick, the wheel walks that tick's timeouts from entry points
// (one per 32 linked) to bring them into cache: every timeout still linked is visited
// exactly once, whatever was cancelled (entry points included), and entry points of an
// earlier round of the slot are gone. (The manual clock walks it in advance().)
BOOST_AUTO_TEST_CASE(the_next_tick_is_walked_once_per_timeout_despite_cancels) {
  manual_wheel w;
  std::vector<wheel_timer::timeout> handles;
  for (int i = 0; i < 1000; ++i) handles.push_back(w.add(i, 10ms));
  std::size_t cancelled = 0;
  for (int i = 0; i < 1000; ++i) // every third (entry points 0, 96, 192...) and 30..40 (around 32)
    if (i % 3 == 0 || (i >= 30 && i <= 40)) cancelled += handles[static_cast<std::size_t>(i)].cancel() ? 1 : 0;
  const std::size_t left = 1000 - cancelled;
  w.clock.advance(8ms);
  BOOST_TEST(wheel_access::touched_ahead(w.wheel) == 0u); // tick 9 is empty
  w.clock.advance(1ms);
  BOOST_TEST(wheel_access::touched_ahead(w.wheel) == left);
  w.clock.advance(1ms);
  BOOST_TEST(w.count.wait_for_at_least(left));
  BOOST_TEST(w.fired_count() == left);
  handles.clear(); // frees the nodes
  // The same slot one round later, filled by a level-1 slot moving down.
  for (int i = 0; i < 300; ++i) handles.push_back(w.add(i, 512ms)); // tick 522, slot 10 again
  w.clock.advance(511ms);
  BOOST_TEST(wheel_access::touched_ahead(w.wheel) == 300u);
  w.clock.advance(1ms);
  BOOST_TEST(w.count.wait_for_at_least(left + 300));
  BOOST_TEST(w.wheel.pending() == 0u);
}

// A level's slot moves down while the slot before it is current, a share each tick,
// not in one burst: 256 slots, so level-1 slots span 128 ticks; deadlines 256..383 sit
// in level-1 slot 2, which moves down from tick 128 and is done by tick 254.
BOOST_AUTO_TEST_CASE(a_cascade_is_spread_over_the_slot_before_it) {
  wheel_options o;
  o.slots_per_level = 256;
  manual_wheel w(o);
  constexpr int n = 12800;
  for (int i = 0; i < n; ++i) w.add(i, std::chrono::milliseconds(256 + i % 128));
  using access = wheel_access;
  w.clock.advance(127ms);
  BOOST_TEST(access::moving(w.wheel, 1) == 0u); // still linked in its level-1 slot
  w.clock.advance(1ms);
  BOOST_TEST(access::moving(w.wheel, 1) == static_cast<std::size_t>(n)); // tick 128: started
  std::size_t left = n, most = 0;
  for (int tick = 129; tick <= 254; ++tick) {
    w.clock.advance(1ms);
    const std::size_t now = access::moving(w.wheel, 1);
    BOOST_REQUIRE(now <= left);
    most = std::max(most, left - now);
    left = now;
  }
  BOOST_TEST(left == 0u);                                    // all moved before the first deadline
  BOOST_TEST(most <= static_cast<std::size_t>(n / 126 + 2)); // an even share per tick
  BOOST_TEST(w.fired_count() == 0u);
  BOOST_TEST(w.wheel.pending() == static_cast<std::size_t>(n));
  const auto t0 = w.clock.now() - 254ms;
  for (int tick = 255; tick < 384; ++tick) { // each fires on its tick
    w.clock.advance(1ms);
    BOOST_REQUIRE(w.count.wait_for_at_least(tick < 256 ? 0 : (tick - 255) * (n / 128)));
  }
  std::lock_guard lk(w.m);
  BOOST_REQUIRE(w.fired.size() == static_cast<std::size_t>(n));
  for (auto& [id, at] : w.fired) BOOST_TEST((at == t0 + std::chrono::milliseconds(256 + id % 128)));
}

// Timeouts with the same deadline fire in scheduling order even when the earlier ones
// wait a level up (moving down bit by bit) and later ones are scheduled mid-move.
BOOST_AUTO_TEST_CASE(ties_keep_scheduling_order_across_a_moving_slot) {
  wheel_options o;
  o.slots_per_level = 256; // level-1 slots span 128 ticks
  manual_wheel w(o);
  for (int i = 0; i < 300; ++i) w.add(i, 300ms); // tick 0: level 1, slot 2
  w.clock.advance(130ms);                        // slot 2 is moving down
  BOOST_TEST(wheel_access::moving(w.wheel, 1) > 0u);
  for (int i = 300; i < 600; ++i) w.add(i, 170ms); // same deadline, tick 130
  w.clock.advance(100ms);                          // moved
  for (int i = 600; i < 900; ++i) w.add(i, 70ms);  // same deadline, level 0
  w.clock.advance(69ms);
  BOOST_TEST(w.fired_count() == 0u);
  w.clock.advance(1ms);
  BOOST_TEST(w.count.wait_for_at_least(900));
  w.check_fired_in_id_order();
}

// Ties keep scheduling order whatever the levels in between: on a small wheel (16 slots x
// 3 levels: 1024 ticks), A is scheduled, the clock moves a tick at a time, then B with the
// same deadline, for deadlines and gaps that put A at each level and B below it (or in
// A's slot moving down). Deadlines within the span; README states the exception beyond.
BOOST_AUTO_TEST_CASE(ties_keep_scheduling_order_at_every_level_of_a_small_wheel) {
  wheel_options o;
  o.slots_per_level = 16;
  o.levels = 3;
  for (long a_delay : {10L, 20L, 100L, 300L, 1000L}) {
    for (long gap : {1L, 5L, 8L, 9L, 64L, 65L, 200L, 512L, 900L}) {
      if (gap >= a_delay) continue;
      manual_wheel w(o);
      w.add(0, std::chrono::milliseconds(a_delay));
      for (long i = 0; i < gap; ++i) w.clock.advance(1ms);
      w.add(1, std::chrono::milliseconds(a_delay - gap));
      w.clock.advance(std::chrono::milliseconds(a_delay - gap));
      BOOST_REQUIRE(w.count.wait_for_at_least(2));
      BOOST_TEST_CONTEXT("A at +" << a_delay << " ms, B " << gap << " ticks later") { w.check_fired_in_id_order(); }
    }
  }
}

// One level only: a ring of 8 slots; deadlines past it go round again.
BOOST_AUTO_TEST_CASE(a_single_level_goes_round) {
  wheel_options o;
  o.slots_per_level = 8;
  o.levels = 1;
  manual_wheel w(o);
  const std::vector<long> delays = {1, 7, 8, 9, 15, 16, 17, 50};
  fires_each_on_its_tick(w, delays, 50);
}

// A due timeout still queued on the executor can be cancelled: it never runs.
BOOST_AUTO_TEST_CASE(cancel_while_queued_on_the_executor) {
  manual_wheel w;
  w.occupy_pool();
  auto t = w.add(1, 1ms);
  w.clock.advance(1ms); // due: handed to the pool, behind the busy task
  BOOST_TEST(t.is_expired());
  BOOST_TEST(w.wheel.pending() == 0u);
  BOOST_TEST(t.cancel());
  BOOST_TEST(t.is_cancelled());
  BOOST_TEST(!t.cancel());
  auto after = w.add(2, 1ms);
  w.clock.advance(1ms);
  w.busy.open();
  BOOST_TEST(w.count.wait_for_at_least(1));
  std::lock_guard lk(w.m);
  BOOST_REQUIRE(w.fired.size() == 1u);
  BOOST_TEST(w.fired[0].first == 2);
}

// Without handles the executor owns a due timeout alone (no atomic read-modify-write
// on that path): it still runs exactly once, unless a handle cancelled it before going
// away, and its function is freed either way.
BOOST_AUTO_TEST_CASE(a_due_timeout_without_handles_runs_once_unless_cancelled_and_is_freed) {
  manual_wheel w;
  w.occupy_pool();
  auto kept = std::make_shared<int>(0), dropped = std::make_shared<int>(0);
  std::atomic<int> kept_runs{0}, dropped_runs{0};
  w.wheel.schedule([kept, &kept_runs] { kept_runs.fetch_add(1); }, 1ms); // handle discarded at once
  {
    auto t = w.wheel.schedule([dropped, &dropped_runs] { dropped_runs.fetch_add(1); }, 1ms);
    w.clock.advance(1ms); // both due: queued behind the busy task
    BOOST_TEST(t.is_expired());
    BOOST_TEST(t.cancel());
  } // the last handle goes: the queue's reference is the only one left
  w.add(3, 1ms);
  w.clock.advance(1ms);
  w.busy.open();
  BOOST_TEST(w.count.wait_for_at_least(1)); // runs after both
  BOOST_TEST(metronome::test::poll_until([&] { return kept.use_count() == 1 && !w.pool.stats().active; }));
  BOOST_TEST(kept_runs.load() == 1);
  BOOST_TEST(dropped_runs.load() == 0);
  BOOST_TEST(dropped.use_count() == 1);
}

BOOST_AUTO_TEST_CASE(a_big_jump_fires_everything_due_in_order) {
  manual_wheel w;
  for (int i = 0; i < 100; ++i) w.add(i, std::chrono::milliseconds(1 + i * 37));
  w.clock.advance(1h);
  BOOST_TEST(w.count.wait_for_at_least(100));
  w.check_fired_in_id_order();
}

BOOST_AUTO_TEST_CASE(cancel_unlinks_at_once_and_frees_the_function) {
  manual_wheel w;
  auto token = std::make_shared<int>(0);
  auto t = w.wheel.schedule([token] {}, 10ms);
  BOOST_TEST(token.use_count() == 2);
  BOOST_TEST(w.wheel.pending() == 1u);
  BOOST_TEST(t.cancel());
  BOOST_TEST(!t.cancel());
  BOOST_TEST(t.is_cancelled());
  BOOST_TEST(token.use_count() == 1);
  BOOST_TEST(w.wheel.pending() == 0u);
  w.clock.advance(20ms);
  BOOST_TEST(!t.is_expired());
}

BOOST_AUTO_TEST_CASE(cancel_after_firing_returns_false) {
  manual_wheel w;
  auto t = w.add(1, 1ms);
  w.clock.advance(1ms);
  BOOST_TEST(w.count.wait_for_at_least(1));
  BOOST_TEST(metronome::test::poll_until([&] { return t.is_expired() && !w.pool.stats().active; }));
  BOOST_TEST(!t.cancel());
  BOOST_TEST(!t.is_cancelled());
}

BOOST_AUTO_TEST_CASE(a_million_schedule_and_cancel_return_their_memory) {
  manual_wheel w;
  const auto heap0 = mallinfo2().uordblks;
  const auto mapped0 = metronome::detail::node_cache_mapped_bytes(); // timeouts are node-cache nodes
  {
    std::vector<wheel_timer::timeout> ts;
    ts.reserve(1000000);
    for (int i = 0; i < 1000000; ++i) ts.push_back(w.wheel.schedule([] {}, std::chrono::seconds(60 + i % 600)));
    BOOST_TEST(w.wheel.pending() == 1000000u);
    std::size_t won = 0;
    for (auto& t : ts) won += t.cancel();
    BOOST_TEST(won == 1000000u);
    BOOST_TEST(w.wheel.pending() == 0u);
  }
  BOOST_TEST(mallinfo2().uordblks < heap0 + (4u << 20));
  // 1,000,000 nodes were ~61 MiB of chunks: the cache keeps a few empty ones for reuse.
  BOOST_TEST(metronome::detail::node_cache_mapped_bytes() < mapped0 + (4u << 20));
}

BOOST_AUTO_TEST_CASE(max_pending_rejects_beyond_the_limit) {
  wheel_options o;
  o.max_pending = 2;
  manual_wheel w(o);
  auto a = w.add(1, 10ms);
  auto b = w.add(2, 10ms);
  BOOST_CHECK_THROW(w.add(3, 10ms), metronome::rejected_execution);
  a.cancel();
  BOOST_CHECK_NO_THROW(w.add(4, 10ms));
}

// Three threads schedule past the limit at once: exactly max_pending are accepted and
// pending() never reads more. A refused schedule added to the count, then took it back:
// pending() read max_pending + 1 in between (adversary pass 7: 8 rounds in 200).
BOOST_AUTO_TEST_CASE(max_pending_holds_exactly_under_racing_producers) {
  metronome::scheduled_thread_pool pool(1);
  int over = 0, wrong_accepted = 0;
  for (int round = 0; round < 150; ++round) {
    wheel_options o;
    o.max_pending = 64;
    wheel_timer wheel(pool, o);
    std::atomic<int> accepted{0};
    std::atomic<std::size_t> most{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> producers;
    for (int t = 0; t < 3; ++t)
      producers.emplace_back([&] {
        while (!go.load()) std::this_thread::yield();
        for (int i = 0; i < 120; ++i) {
          try {
            (void)wheel.schedule([] {}, 1h);
            ++accepted;
          } catch (const metronome::rejected_execution&) {
          }
          const std::size_t p = wheel.pending();
          std::size_t m = most.load();
          while (p > m && !most.compare_exchange_weak(m, p)) {
          }
        }
      });
    go = true;
    for (auto& t : producers) t.join();
    over += most.load() > 64 ? 1 : 0;
    wrong_accepted += accepted.load() != 64 ? 1 : 0;
  }
  BOOST_CHECK_EQUAL(over, 0);
  BOOST_CHECK_EQUAL(wrong_accepted, 0);
}

// A manual clock moved by years over a small wheel (64 slots x 2 levels: a ring of about
// 2 s at 1 ms): the timeouts past the ring were cascaded round once per rotation, in time
// proportional to the distance - a jump to the clock's end never returned (adversary
// pass 8). Whole rotations are skipped; nothing fires early, order and ties hold.
BOOST_AUTO_TEST_CASE(a_jump_of_years_over_a_small_wheel_returns_and_keeps_order) {
  using years = std::chrono::duration<std::int64_t, std::ratio<31556952>>;
  wheel_options o;
  o.slots_per_level = 64;
  o.levels = 2;
  manual_wheel w(o);
  const auto t0 = w.clock.now();
  w.add(0, 1h);
  w.add(1, years(10));
  w.add(2, years(10)); // a tie: scheduling order
  w.add(3, years(10) + 1ms);
  w.add(4, years(200));
  w.add(5, std::chrono::nanoseconds::max()); // the clock's end
  auto drained = [&] { w.pool.submit([] {}).wait(); };
  w.clock.advance(years(5));
  drained();
  BOOST_TEST(w.fired_count() == 1u);
  w.clock.advance_to(t0 + years(10) + 1ms - 1ns);
  drained();
  BOOST_TEST(w.fired_count() == 3u); // not 3 yet: its tick is still ahead
  w.clock.advance(1ns);
  drained();
  BOOST_TEST(w.fired_count() == 4u);
  w.clock.advance_to(metronome::clock::time_point::max());
  drained();
  BOOST_TEST(w.fired_count() == 6u);
  w.check_fired_in_id_order();
  BOOST_TEST(w.wheel.pending() == 0u);
}

BOOST_AUTO_TEST_CASE(stop_returns_what_never_fired) {
  manual_wheel w;
  std::vector<wheel_timer::timeout> ts;
  for (int i = 0; i < 10; ++i) ts.push_back(w.add(i, std::chrono::milliseconds(1 + i)));
  ts[7].cancel();
  ts[8].cancel();
  ts[9].cancel();
  w.clock.advance(2ms); // 0 and 1 fire
  BOOST_TEST(w.count.wait_for_at_least(2));
  auto left = w.wheel.stop();
  BOOST_TEST(left.size() == 5u); // 2..6
  for (auto& t : left) BOOST_TEST(t.is_cancelled());
  BOOST_TEST(w.wheel.pending() == 0u);
  BOOST_CHECK_THROW(w.add(11, 1ms), metronome::rejected_execution);
  BOOST_TEST(w.wheel.stop().empty());
  w.clock.advance(1h);
  BOOST_TEST(w.fired_count() == 2u);
}

BOOST_AUTO_TEST_CASE(fires_onto_any_executor_on_the_real_clock) {
  net::io_context io;
  auto guard = net::make_work_guard(io);
  std::thread t([&] { io.run(); });
  {
    wheel_timer wheel(io.get_executor());
    std::promise<std::thread::id> ran_on;
    const auto start = metronome::clock::now();
    wheel.schedule([&] { ran_on.set_value(std::this_thread::get_id()); }, 20ms);
    BOOST_TEST((ran_on.get_future().get() == t.get_id()));
    BOOST_TEST((metronome::clock::now() - start >= 20ms)); // never early
  }
  guard.reset();
  t.join();
}

// On the real clock the timer thread walks each busy tick ahead of time while another
// thread cancels timeouts of those ticks: every timeout fires once unless its cancel won.
BOOST_AUTO_TEST_CASE(busy_ticks_on_the_real_clock_fire_what_was_not_cancelled) {
  constexpr int n = 20000;
  std::vector<std::atomic<int>> runs(n);
  std::vector<char> won(n, 0);
  {
    scheduled_thread_pool pool(2);
    wheel_timer wheel(pool);
    std::vector<wheel_timer::timeout> handles;
    handles.reserve(n);
    for (int i = 0; i < n; ++i) // ~5,000 per tick over four ticks
      handles.push_back(wheel.schedule([&runs, i] { runs[static_cast<std::size_t>(i)].fetch_add(1); },
                                       20ms + std::chrono::milliseconds(i % 4)));
    std::thread canceller([&] {
      for (std::size_t i = 0; i < n; i += 3) won[i] = handles[i].cancel() ? 1 : 0;
    });
    canceller.join();
    BOOST_TEST(metronome::test::poll_until([&] { return wheel.pending() == 0; }));
    handles.clear();
    pool.shutdown();
    BOOST_TEST(pool.await_termination(20s));
  }
  int wrong = 0, cancelled = 0;
  for (std::size_t i = 0; i < n; ++i) {
    wrong += runs[i].load() != (won[i] ? 0 : 1) ? 1 : 0;
    cancelled += won[i];
  }
  BOOST_TEST(wrong == 0);
  BOOST_TEST_MESSAGE(cancelled << " of " << n << " cancelled before firing");
}

BOOST_AUTO_TEST_CASE(async_wait_completes_and_cancels) {
  manual_wheel w;
  auto f = w.wheel.async_wait(5ms, net::use_future);
  w.clock.advance(5ms);
  f.get(); // success

  net::cancellation_signal sig;
  std::promise<metronome::error_code> p;
  net::post(w.pool, [&] {
    w.wheel.async_wait(
        1h, net::bind_cancellation_slot(sig.slot(), [&](metronome::error_code ec) { p.set_value(ec); }));
    sig.emit(net::cancellation_type::terminal);
  });
  BOOST_TEST((p.get_future().get() == net::error::operation_aborted));
  BOOST_TEST(w.wheel.pending() == 0u);

  auto g = w.wheel.async_wait(1h, net::use_future);
  w.wheel.stop();
  BOOST_CHECK_THROW(g.get(), metronome::system_error); // aborted by stop()
}

// Waits the default token starts (the executor's, as steady_timer::async_wait's): true
// when there is one (Asio 1.31 on: deferred), else false, and nothing is started.
template <class Wheel, class Clock>
bool wait_with_the_default_token(Wheel& wheel, Clock& clock, std::promise<metronome::error_code>& done) {
  if constexpr (requires { wheel.async_wait(5ms); }) {
    auto op = wheel.async_wait(5ms); // deferred: nothing started yet
    BOOST_TEST(wheel.pending() == 0u);
    std::move(op)([&](metronome::error_code ec) { done.set_value(ec); });
    BOOST_TEST(wheel.pending() == 1u);
    clock.advance(5ms);
    return true;
  } else {
    return false;
  }
}

// An I/O object's executor, and the default completion token it gives async_wait.
BOOST_AUTO_TEST_CASE(the_wheel_names_its_executor_and_its_waits_default_to_its_token) {
  manual_wheel w;
  BOOST_TEST((w.wheel.get_executor() == net::any_io_executor(w.pool.get_executor())));
  std::promise<metronome::error_code> done;
  constexpr bool has_default = !std::is_void_v<net::default_completion_token_t<net::any_io_executor>>;
  BOOST_TEST(wait_with_the_default_token(w.wheel, w.clock, done) == has_default);
  if (has_default) BOOST_TEST(!done.get_future().get()); // completed, not aborted
}

// A manual clock standing at its end (time_point::max()): every deadline rounds to its
// last tick, which has come; new timeouts fire at once (they waited in the inbox for an
// advance that cannot move the clock further).
BOOST_AUTO_TEST_CASE(timeouts_scheduled_when_the_manual_clock_stands_at_its_end_fire) {
  manual_wheel w;
  w.add(0, std::chrono::milliseconds(5));
  w.clock.advance_to(metronome::clock::time_point::max());
  BOOST_REQUIRE(w.count.wait_for_at_least(1));
  w.add(1, std::chrono::milliseconds(5));
  w.add(2, std::chrono::hours(5));
  w.add(3, metronome::clock::duration::max());
  BOOST_CHECK(w.count.wait_for_at_least(4));
  BOOST_CHECK_EQUAL(w.wheel.pending(), 0u);
  w.check_fired_in_id_order();
}

// As Asio runs a handler on its associated executor: a timeout bound to a connection's
// serial executor (or a strand) runs there, with no hand-written re-post.
BOOST_AUTO_TEST_CASE(a_timeout_bound_to_an_executor_runs_on_it) {
  scheduled_thread_pool pool(2);
  wheel_timer wheel(pool);
  auto serial = metronome::make_serial_executor(pool.get_executor());
  std::promise<bool> in_serial;
  auto t = wheel.schedule(net::bind_executor(serial, [&] { in_serial.set_value(serial.running_in_this_thread()); }), 2ms);
  auto f = in_serial.get_future();
  BOOST_REQUIRE((f.wait_for(20s) == std::future_status::ready));
  BOOST_TEST(f.get());
  BOOST_TEST(!t.cancel()); // it ran

  net::io_context io;
  wheel_timer io_wheel(io.get_executor());
  auto strand = net::make_strand(io);
  bool in_strand = false;
  io_wheel.schedule(net::bind_executor(strand, [&] { in_strand = strand.running_in_this_thread(); }), 1ms);
  io.run();
  BOOST_TEST(in_strand);
}

BOOST_AUTO_TEST_SUITE_END()
