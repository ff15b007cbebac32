// scheduled_future::reset(d): a task waiting in the delay queue moves to a new due time,
// in place. Time is the manual clock's. This executable counts the calling thread's
// allocations (operator new replaced) to show that reset() allocates and frees nothing.
#include <metronome/scheduled_future.hpp>

#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>
#include <metronome/serial_executor.hpp>

#include "common/latch_task.hpp"
#include "common/manual_pool.hpp"
#include "common/poll_until.hpp"

#include <boost/test/unit_test.hpp>

#include "common/counting_new.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

using metronome::test::allocations;
using metronome::test::frees;

using namespace std::chrono_literals;
using metronome::manual_clock;
using metronome::scheduled_thread_pool;
using metronome::test::on_clock;

namespace {

// On a one-thread pool: everything due before this call has run when it returns (the
// ready queue is FIFO and advance() promotes before it returns).
void flush(scheduled_thread_pool& pool) { pool.submit([] {}).get(); }

// Records the order in which tasks run.
struct run_log {
  std::mutex m;
  std::vector<int> order;
  auto task(int id) {
    return [this, id] {
      std::lock_guard lk(m);
      order.push_back(id);
    };
  }
  std::vector<int> get() {
    std::lock_guard lk(m);
    return order;
  }
};

} // namespace

BOOST_AUTO_TEST_SUITE(scheduled_future_reset)

BOOST_AUTO_TEST_CASE(reset_moves_a_waiting_task_later_and_it_runs_at_the_new_time) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  auto h = pool.schedule([] { return 1; }, 10ms);
  c.advance(8ms);
  BOOST_TEST(h.reset(10ms)); // now due at +18 ms
  BOOST_TEST((h.delay() == 10ms));
  c.advance(5ms); // +13 ms: past the old due time
  flush(pool);
  BOOST_TEST(!h.is_done());
  BOOST_TEST((h.delay() == 5ms));
  c.advance(5ms);
  BOOST_TEST(h.get() == 1);
}

BOOST_AUTO_TEST_CASE(reset_moves_a_waiting_task_earlier) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  auto h = pool.schedule([] { return 2; }, 1h);
  auto other = pool.schedule([] {}, 30min);
  BOOST_TEST(h.reset(1ms)); // the new head of the delay queue
  c.advance(1ms);
  BOOST_TEST(h.get() == 2);
  BOOST_TEST(!other.is_done());
}

BOOST_AUTO_TEST_CASE(reset_to_zero_makes_the_task_due_now_without_moving_the_clock) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  auto h = pool.schedule([] { return 3; }, 1h);
  BOOST_TEST(h.reset(0ms));
  BOOST_TEST(h.get() == 3); // a parked worker was told
}

BOOST_AUTO_TEST_CASE(reset_reorders_the_delay_queue) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  run_log log;
  auto a = pool.schedule(log.task(1), 10ms);
  auto b = pool.schedule(log.task(2), 20ms);
  auto d = pool.schedule(log.task(3), 30ms);
  BOOST_TEST(a.reset(25ms));
  BOOST_TEST(d.reset(25ms)); // same due time as a: reset later, runs later
  c.advance(30ms);
  flush(pool);
  BOOST_TEST((log.get() == std::vector<int>{2, 1, 3}));
}

BOOST_AUTO_TEST_CASE(a_task_that_is_no_longer_waiting_is_not_revived) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  // Done.
  auto ran = pool.schedule([] {}, 1ms);
  c.advance(1ms);
  ran.get();
  BOOST_TEST(!ran.reset(1ms));
  BOOST_TEST(ran.is_done());
  // Cancelled.
  auto cancelled = pool.schedule([] {}, 1ms);
  BOOST_TEST(cancelled.cancel());
  BOOST_TEST(!cancelled.reset(1ms));
  BOOST_TEST(cancelled.is_cancelled());
  // Due and queued behind a busy worker, not started yet.
  metronome::test::gate release;
  metronome::test::counter busy;
  auto blocker = pool.submit([&] {
    busy.add();
    release.wait();
  });
  BOOST_TEST(busy.wait_for_at_least(1));
  auto queued = pool.schedule([] { return 4; }, 1ms);
  c.advance(1ms); // promoted to the ready queue
  BOOST_TEST(!queued.reset(1h));
  release.open();
  BOOST_TEST(queued.get() == 4);
  // An empty handle.
  BOOST_TEST(!metronome::scheduled_future<int>().reset(1ms));
}

BOOST_AUTO_TEST_CASE(a_handle_whose_pool_is_gone_says_false) {
  manual_clock c;
  metronome::scheduled_future<void> h;
  {
    scheduled_thread_pool pool(on_clock(c));
    h = pool.schedule([] {}, 1h);
  }
  BOOST_TEST(h.is_cancelled());
  BOOST_TEST(!h.reset(1ms));
}

BOOST_AUTO_TEST_CASE(reset_allocates_and_frees_nothing) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  std::vector<metronome::scheduled_future<void>> hs;
  for (int i = 0; i < 1000; ++i) hs.push_back(pool.schedule([] {}, std::chrono::milliseconds(1 + i)));
  int moved = 0;
  const long a0 = allocations, f0 = frees;
  for (int round = 0; round < 3; ++round)
    for (auto& h : hs) moved += h.reset(std::chrono::hours(1) + std::chrono::milliseconds(round)) ? 1 : 0;
  const long a1 = allocations, f1 = frees;
  BOOST_TEST(moved == 3000);
  BOOST_TEST(a1 == a0);
  BOOST_TEST(f1 == f0);
  BOOST_TEST(pool.stats().delayed_queued == 1000u);
}

BOOST_AUTO_TEST_CASE(a_fixed_rate_grid_continues_from_the_new_due_time) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  std::atomic<int> runs{0};
  auto h = pool.schedule_at_fixed_rate([&] { ++runs; }, 10ms, 10ms);
  BOOST_TEST(h.reset(25ms)); // first run at +25 ms, then +35 ms
  c.advance(24ms);
  flush(pool);
  BOOST_TEST(runs.load() == 0);
  c.advance(1ms);
  flush(pool);
  BOOST_TEST(runs.load() == 1);
  BOOST_TEST(metronome::test::poll_until([&] { return pool.stats().delayed_queued == 1u; }));
  BOOST_TEST((h.delay() == 10ms));
  h.cancel();
}

// With jitter too: the grid the jitter is drawn around moves with the reset. (It kept the
// old grid, and every run the reset skipped fell due at once: 36,000 runs after a reset
// to an hour of a 100 ms task; found by an adversary pass.)
BOOST_AUTO_TEST_CASE(a_jittered_fixed_rate_grid_continues_from_the_new_due_time) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  std::atomic<int> runs{0};
  metronome::periodic_options po;
  po.jitter = 0.1;
  auto h = pool.schedule_at_fixed_rate([&] { ++runs; }, 100ms, 100ms, po);
  for (int i = 1; i <= 2; ++i) { // two runs, each when it falls due
    c.advance(h.delay());
    flush(pool);
    BOOST_REQUIRE_EQUAL(runs.load(), i);
    BOOST_REQUIRE(metronome::test::poll_until([&] { return pool.stats().delayed_queued == 1u; }));
  }
  BOOST_TEST(h.reset(1h));
  c.advance(1h);
  flush(pool);
  c.advance(50ms); // the next run is jittered around +1 h 100 ms: not due yet
  flush(pool);
  BOOST_TEST(runs.load() == 3);
  BOOST_TEST(metronome::test::poll_until([&] { return pool.stats().delayed_queued == 1u; }));
  BOOST_TEST((h.delay() > 0ms));
  h.cancel();
}

BOOST_AUTO_TEST_CASE(a_serial_executor_s_delayed_task_can_be_reset) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  auto serial = metronome::make_serial_executor(pool);
  run_log log;
  auto a = serial.schedule(log.task(1), 10ms);
  auto b = serial.schedule(log.task(2), 20ms);
  BOOST_TEST(a.reset(30ms));
  c.advance(20ms);
  b.get();
  BOOST_TEST(!a.is_done());
  c.advance(10ms);
  a.get();
  BOOST_TEST((log.get() == std::vector<int>{2, 1}));
}

// Resets race the clock and the workers: every task still runs exactly once.
BOOST_AUTO_TEST_CASE(resets_racing_promotion_lose_no_task_and_run_none_twice) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c, 2));
  constexpr int n = 500;
  std::vector<std::atomic<int>> ran(n);
  std::vector<metronome::scheduled_future<void>> hs;
  for (int i = 0; i < n; ++i) hs.push_back(pool.schedule([&ran, i] { ++ran[i]; }, std::chrono::milliseconds(1 + i % 50)));
  std::atomic<bool> stop{false};
  std::thread resetter([&] {
    int k = 0;
    while (!stop.load()) {
      hs[k % n].reset(std::chrono::milliseconds(k % 7));
      ++k;
    }
  });
  for (int i = 0; i < 200; ++i) c.advance(1ms);
  stop = true;
  resetter.join();
  c.advance(1h);
  for (auto& h : hs) h.get();
  for (auto& r : ran) BOOST_TEST(r.load() == 1);
}

BOOST_AUTO_TEST_SUITE_END()
