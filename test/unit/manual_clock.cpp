#include <metronome/manual_clock.hpp>

#include <metronome/async_delay.hpp>
#include <metronome/backoff.hpp>
#include <metronome/cancel_after.hpp>
#include <metronome/scheduled_thread_pool.hpp>
#include <metronome/serial_executor.hpp>

#include "common/accounting.hpp"
#include "common/latch_task.hpp"
#include "common/manual_pool.hpp"
#include "common/poll_until.hpp"

#include <metronome/detail/asio.hpp>
#include <boost/test/unit_test.hpp>

#include <functional>
#include <future>
#include <mutex>
#include <utility>
#include <vector>

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

// Auto-advance: time jumps to the next due time once every pool thread on the clock is
// idle. Real time plays no part: each test would hang (and time out) if it did not jump.
BOOST_AUTO_TEST_SUITE(manual_clock_auto_advance)

namespace net = metronome::net;
using metronome::detail::as_tuple; // net::experimental::as_tuple in Asio 1.22
using metronome::manual_clock;
using metronome::scheduled_thread_pool;
using metronome::test::on_clock;

BOOST_AUTO_TEST_CASE(a_retry_coroutine_that_sleeps_for_minutes_finishes_at_once) {
  manual_clock c;
  c.set_auto_advance(true);
  scheduled_thread_pool pool(on_clock(c));
  const auto t0 = c.now();
  std::promise<int> done;
  net::co_spawn(
      pool,
      [&]() -> net::awaitable<void> {
        metronome::backoff b({.initial = std::chrono::minutes(1), .cap = std::chrono::minutes(10),
                              .full_jitter = false, .max_retries = 3});
        int attempts = 0;
        for (;;) {
          ++attempts;
          // An attempt that never answers, given up after 30 s.
          auto [ec] = co_await metronome::async_delay(pool.get_executor(), std::chrono::hours(1),
                                                      metronome::cancel_after(30s, as_tuple(net::use_awaitable)));
          if (!ec) break;
          auto d = b.next();
          if (!d) break;
          co_await metronome::async_delay(pool.get_executor(), *d, net::use_awaitable);
        }
        done.set_value(attempts);
      },
      net::detached);
  BOOST_TEST(done.get_future().get() == 4);
  // 4 timeouts of 30 s and back-offs of 1, 2 and 4 minutes, exactly.
  BOOST_TEST(((c.now() - t0) == 4 * 30s + std::chrono::minutes(7)));
  BOOST_TEST(pool.stats().delayed_queued == 0u);
}

BOOST_AUTO_TEST_CASE(time_does_not_move_while_a_worker_is_busy) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c, 2));
  const auto t0 = c.now();
  metronome::test::gate gate;
  std::promise<void> started;
  auto busy = pool.submit([&] {
    started.set_value();
    gate.wait();
    return c.now();
  });
  started.get_future().get();
  auto later = pool.schedule([&] { return c.now(); }, 1h);
  c.set_auto_advance(true); // checks at once: a worker is busy, so no jump
  BOOST_TEST((c.now() == t0));
  gate.open();
  BOOST_TEST((busy.get() == t0)); // no jump while it ran
  BOOST_TEST((later.get() == t0 + 1h)); // then the pool went idle and time jumped
}

BOOST_AUTO_TEST_CASE(pools_sharing_a_clock_jump_to_the_earliest_due_time_first) {
  manual_clock c;
  scheduled_thread_pool a(on_clock(c)), b(on_clock(c));
  const auto t0 = c.now();
  std::mutex m;
  std::vector<std::pair<char, manual_clock::time_point>> seen;
  {
    auto hold = c.hold(); // the test thread sets up work: no jumps meanwhile
    c.set_auto_advance(true);
    a.schedule([&] { std::lock_guard lk(m); seen.emplace_back('a', c.now()); }, 10min);
    b.schedule([&] { std::lock_guard lk(m); seen.emplace_back('b', c.now()); }, 5min);
    BOOST_TEST((c.now() == t0));
  } // released: the clock checks at once
  BOOST_TEST(metronome::test::poll_until([&] {
    std::lock_guard lk(m);
    return seen.size() == 2;
  }));
  std::lock_guard lk(m);
  BOOST_TEST(seen[0].first == 'b');
  BOOST_TEST((seen[0].second == t0 + 5min));
  BOOST_TEST(seen[1].first == 'a');
  BOOST_TEST((seen[1].second == t0 + 10min));
}

// A pool that has terminated (shut down and joined, not yet destroyed) runs nothing
// again: it must not keep another pool on the same clock from jumping, nor wait_idle()
// from returning.
BOOST_AUTO_TEST_CASE(a_terminated_pool_on_the_clock_does_not_stop_the_others_jumping) {
  auto c = std::make_shared<manual_clock>(); // outlives a wait_idle() left hanging
  scheduled_thread_pool done(on_clock(*c, 2)), live(on_clock(*c));
  done.submit([] {}).get();
  done.shutdown();
  BOOST_REQUIRE(done.await_termination(std::chrono::seconds(10)));
  const auto t0 = c->now();
  c->set_auto_advance(true);
  auto f = live.schedule([c] { return c->now(); }, 5min);
  BOOST_REQUIRE((f.wait_for(std::chrono::seconds(10)) == std::future_status::ready));
  BOOST_TEST((f.get() == t0 + 5min));
  c->set_auto_advance(false);
  BOOST_TEST(metronome::test::finishes_within(std::chrono::seconds(10), [c] { c->wait_idle(); }));
}

BOOST_AUTO_TEST_CASE(off_by_default_and_without_timed_work_nothing_moves) {
  manual_clock c;
  BOOST_TEST(!c.auto_advance());
  scheduled_thread_pool pool(on_clock(c));
  const auto t0 = c.now();
  c.set_auto_advance(true);
  BOOST_TEST((pool.submit([&] { return c.now(); }).get() == t0));
  BOOST_TEST((c.now() == t0));
}

// wait_idle(): after advance(), everything the due work set off on the pool has ended -
// here a fixed-rate task posting to a serial executor, which starts a coroutine that hops
// through a post of its own and posts its result to a second serial executor (2 workers:
// the hops land on either). Looked at without waiting, the result is not there yet.
BOOST_AUTO_TEST_CASE(wait_idle_after_advance_sees_everything_the_due_work_set_off) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c, 2));
  auto target = metronome::make_serial_executor(pool);
  auto results = metronome::make_serial_executor(pool);
  std::vector<manual_clock::time_point> seen; // touched on `results` only, read after wait_idle()
  const auto t0 = c.now();
  auto poller = pool.schedule_at_fixed_rate(
      [&] {
        net::post(target, [&] {
          net::co_spawn(
              target,
              [&]() -> net::awaitable<void> {
                const auto at = c.now();
                co_await net::post(co_await net::this_coro::executor, net::use_awaitable);
                net::post(results, [&seen, at] { seen.push_back(at); });
              },
              net::detached);
        });
      },
      100ms, 100ms);
  for (std::size_t k = 1; k <= 20; ++k) {
    c.advance(100ms);
    c.wait_idle();
    BOOST_REQUIRE(seen.size() == k);
    BOOST_TEST((seen.back() == t0 + static_cast<int>(k) * 100ms));
  }
  poller.cancel();
  c.wait_idle(); // an idle pool: returns at once
  BOOST_TEST(seen.size() == 20u);
}

BOOST_AUTO_TEST_CASE(wait_idle_without_pools_returns_and_on_a_pool_thread_throws) {
  manual_clock c;
  c.wait_idle();
  scheduled_thread_pool pool(on_clock(c));
  BOOST_CHECK_THROW(pool.submit([&] { c.wait_idle(); }).get(), std::logic_error);
  c.wait_idle();
}

// With auto-advance, wait_idle() returns once no pool holds timed work: the clock jumps
// through a chain of delayed tasks, each scheduling the next, and the test sees its end.
BOOST_AUTO_TEST_CASE(wait_idle_with_auto_advance_returns_when_no_timed_work_is_left) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  const auto t0 = c.now();
  std::vector<manual_clock::time_point> runs; // written on the pool's one worker
  std::function<void()> step = [&] {
    runs.push_back(c.now());
    if (runs.size() < 3) pool.schedule(step, std::chrono::minutes(runs.size() * 5));
  };
  {
    auto hold = c.hold();
    c.set_auto_advance(true);
    pool.schedule(step, 1min);
  }
  c.wait_idle();
  BOOST_REQUIRE(runs.size() == 3u);
  BOOST_TEST((runs[0] == t0 + 1min));
  BOOST_TEST((runs[1] == t0 + 6min));
  BOOST_TEST((runs[2] == t0 + 16min));
  BOOST_TEST((c.now() == t0 + 16min));
}

BOOST_AUTO_TEST_SUITE_END()
