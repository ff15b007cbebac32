// scheduled_thread_pool::stats(): the queue-wait and lateness histograms and the
// one-line printing. Time is the manual clock's: every duration here is exact.
#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/async_delay.hpp>
#include <metronome/manual_clock.hpp>
#include <metronome/serial_executor.hpp>
#include <metronome/wheel_timer.hpp>

#include "common/latch_task.hpp"
#include "common/manual_pool.hpp"
#include "common/poll_until.hpp"

#include <metronome/detail/asio.hpp>
#include <boost/test/unit_test.hpp>
#include "common/print_duration.hpp"

#include <chrono>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using metronome::latency_histogram;
using metronome::manual_clock;
using metronome::pool_options;
using metronome::scheduled_thread_pool;
using metronome::test::on_clock;
using metronome::test::poll_until;

BOOST_AUTO_TEST_SUITE(pool_stats)

BOOST_AUTO_TEST_CASE(a_task_due_at_t_run_at_t_plus_5ms_is_in_the_5ms_lateness_bucket) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  auto h = pool.schedule([] {}, 10ms);
  c.advance(15ms); // due at +10 ms, promoted and started at +15 ms
  h.get();
  const auto s = pool.stats();
  BOOST_TEST(s.lateness.total() == 1u);
  BOOST_TEST(s.lateness.count(latency_histogram::bucket_of(5ms)) == 1u);
  BOOST_TEST(latency_histogram::lower_bound(latency_histogram::bucket_of(5ms)) <= 5ms);
  BOOST_TEST(s.queue_wait.total() == 0u);
}

BOOST_AUTO_TEST_CASE(a_task_on_time_is_in_the_first_lateness_bucket) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  auto h = pool.schedule([] {}, 10ms);
  c.advance(10ms);
  h.get();
  BOOST_TEST(pool.stats().lateness.count(0) == 1u);
}

BOOST_AUTO_TEST_CASE(queue_wait_runs_from_submission_to_start) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  metronome::test::gate release;
  metronome::test::counter started;
  auto blocker = pool.submit([&] {
    started.add();
    release.wait();
  });
  BOOST_TEST(started.wait_for_at_least(1)); // started at once: a wait of 0
  auto waiting = pool.submit([] {});       // queued behind it at +0
  c.advance(3ms);
  release.open();
  blocker.get();
  waiting.get();
  const auto s = pool.stats();
  BOOST_TEST(s.queue_wait.total() == 2u);
  BOOST_TEST(s.queue_wait.count(0) == 1u);
  BOOST_TEST(s.queue_wait.count(latency_histogram::bucket_of(3ms)) == 1u);
  BOOST_TEST(s.lateness.total() == 0u);
}

BOOST_AUTO_TEST_CASE(a_periodic_task_s_later_runs_count_as_lateness) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  metronome::test::counter runs;
  auto h = pool.schedule_at_fixed_rate([&] { runs.add(); }, 0ms, 10ms);
  BOOST_TEST(runs.wait_for_at_least(1)); // the first run: ready at once, a queue wait
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 1u; }));
  c.advance(10ms); // on time
  BOOST_TEST(runs.wait_for_at_least(2));
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 1u; }));
  c.advance(12ms); // due at +20 ms, run at +22 ms
  BOOST_TEST(runs.wait_for_at_least(3));
  h.cancel();
  BOOST_TEST(poll_until([&] { return pool.stats().lateness.total() == 2u; }));
  const auto s = pool.stats();
  BOOST_TEST(s.queue_wait.total() == 1u);
  BOOST_TEST(s.lateness.count(0) == 1u);
  BOOST_TEST(s.lateness.count(latency_histogram::bucket_of(2ms)) == 1u);
}

BOOST_AUTO_TEST_CASE(a_serial_executor_s_tasks_are_counted_by_the_pool_that_runs_them) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  auto serial = metronome::make_serial_executor(pool);
  serial.submit([] {}).get();
  auto late = serial.schedule([] {}, 1ms);
  c.advance(2ms);
  late.get();
  const auto s = pool.stats();
  BOOST_TEST(s.queue_wait.total() == 1u);
  BOOST_TEST(s.lateness.count(latency_histogram::bucket_of(1ms)) == 1u);
}

BOOST_AUTO_TEST_CASE(counts_of_retired_elastic_threads_are_kept) {
  scheduled_thread_pool pool(pool_options::cached(1, 3, 1ms));
  metronome::test::gate release;
  metronome::test::counter running;
  std::vector<metronome::scheduled_future<void>> hs;
  for (int i = 0; i < 3; ++i)
    hs.push_back(pool.submit([&] {
      running.add();
      release.wait();
    }));
  BOOST_TEST(running.wait_for_at_least(3));
  release.open();
  for (auto& h : hs) h.get();
  BOOST_TEST(poll_until([&] { return pool.stats().threads == 1u; })); // two retired
  BOOST_TEST(pool.stats().queue_wait.total() == 3u);
}

// ---- Executor-path work, async_delay, cancel_after and wheel timeouts.

BOOST_AUTO_TEST_CASE(posts_count_their_queue_wait_one_in_post_sample_every_weighted_by_it) {
  constexpr int every = static_cast<int>(metronome::pool_stats::post_sample_every);
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  metronome::test::gate release;
  metronome::test::counter started, ran;
  // A new thread counts its posts from 0: its 4 x every posts (the first one holds the
  // only worker) are timed 4 times, each queued at +0.
  std::thread poster([&] {
    metronome::net::post(pool, [&] {
      started.add();
      release.wait();
    });
    for (int i = 1; i < 4 * every; ++i) metronome::net::post(pool, [&] { ran.add(); });
  });
  poster.join();
  BOOST_TEST(started.wait_for_at_least(1));
  c.advance(3ms);
  release.open();
  BOOST_TEST(ran.wait_for_at_least(4 * every - 1));
  BOOST_TEST(poll_until([&] { return pool.stats().queue_wait.total() == 4u * every; }));
  const auto s = pool.stats();
  BOOST_TEST(s.queue_wait.count(latency_histogram::bucket_of(3ms)) == 4u * every);
  BOOST_TEST(s.lateness.total() == 0u);
}

BOOST_AUTO_TEST_CASE(an_async_delay_due_at_10ms_completing_at_15ms_is_in_the_5ms_lateness_bucket) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  metronome::test::counter done;
  metronome::async_delay(pool, 10ms, [&](metronome::error_code) { done.add(); });
  c.advance(15ms);
  BOOST_TEST(done.wait_for_at_least(1));
  BOOST_TEST(poll_until([&] { return pool.stats().lateness.total() == 1u; }));
  const auto s = pool.stats();
  BOOST_TEST(s.lateness.count(latency_histogram::bucket_of(5ms)) == 1u);
  BOOST_TEST(s.queue_wait.total() == 0u); // its handler ran inline, on the pool
}

BOOST_AUTO_TEST_CASE(an_async_delay_already_due_counts_as_queue_wait_from_its_start) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  c.advance(100ms);
  metronome::test::gate release;
  metronome::test::counter started, done;
  auto blocker = pool.submit([&] { // queue wait 0
    started.add();
    release.wait();
  });
  BOOST_TEST(started.wait_for_at_least(1));
  // Due 50 ms before it starts: queued at +100 ms behind the blocker, delivered at +103 ms.
  metronome::async_delay_until(pool, metronome::clock::time_point(50ms),
                               [&](metronome::error_code) { done.add(); });
  c.advance(3ms);
  release.open();
  BOOST_TEST(done.wait_for_at_least(1));
  BOOST_TEST(poll_until([&] { return pool.stats().queue_wait.total() == 2u; }));
  const auto s = pool.stats();
  BOOST_TEST(s.queue_wait.count(latency_histogram::bucket_of(3ms)) == 1u);
  BOOST_TEST(s.lateness.total() == 0u);
}

BOOST_AUTO_TEST_CASE(a_cancelled_async_delay_counts_nothing) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  std::promise<metronome::error_code> p;
  metronome::net::cancellation_signal sig;
  auto handler = [&](metronome::error_code ec) { p.set_value(ec); };
  metronome::async_delay(pool, 10ms, metronome::net::bind_cancellation_slot(sig.slot(), handler));
  sig.emit(metronome::net::cancellation_type::terminal);
  BOOST_TEST((p.get_future().get() == metronome::net::error::operation_aborted));
  c.advance(15ms);
  BOOST_TEST(pool.stats().lateness.total() == 0u);
}

namespace {
// A pool on a manual clock and a 1 ms wheel over it on the same clock.
struct wheel_on_manual_pool {
  manual_clock c;
  scheduled_thread_pool pool{on_clock(c)};
  metronome::wheel_timer wheel{pool, [this] {
                                 metronome::wheel_options o;
                                 o.tick = 1ms;
                                 o.time_source = &c;
                                 return o;
                               }()};
};
} // namespace

BOOST_AUTO_TEST_CASE(a_wheel_timeout_fired_onto_the_pool_counts_its_lateness_from_its_tick) {
  wheel_on_manual_pool f;
  auto& c = f.c;
  auto& pool = f.pool;
  auto& wheel = f.wheel;
  metronome::test::counter fired;
  auto t = wheel.schedule([&] { fired.add(); }, 10ms);
  c.advance(15ms); // its tick is +10 ms; it starts at +15 ms
  BOOST_TEST(fired.wait_for_at_least(1));
  BOOST_TEST(poll_until([&] { return pool.stats().lateness.total() == 1u; }));
  BOOST_TEST(pool.stats().lateness.count(latency_histogram::bucket_of(5ms)) == 1u);
}

BOOST_AUTO_TEST_CASE(a_wheel_wait_fired_onto_the_pool_counts_its_lateness) {
  wheel_on_manual_pool f;
  auto& c = f.c;
  auto& pool = f.pool;
  auto& wheel = f.wheel;
  metronome::test::counter done;
  wheel.async_wait(4ms, [&](metronome::error_code) { done.add(); });
  c.advance(6ms);
  BOOST_TEST(done.wait_for_at_least(1));
  BOOST_TEST(poll_until([&] { return pool.stats().lateness.total() == 1u; }));
  BOOST_TEST(pool.stats().lateness.count(latency_histogram::bucket_of(2ms)) == 1u);
}

BOOST_AUTO_TEST_CASE(stats_print_as_one_line) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  auto h = pool.schedule([] {}, 1ms);
  c.advance(6ms); // 5 ms late
  h.get();
  std::ostringstream os;
  os << pool.stats();
  const std::string line = os.str();
  BOOST_TEST(line.find('\n') == std::string::npos);
  BOOST_TEST(line.find("threads=1 ") == 0u);
  BOOST_TEST(line.find("| queue_wait n=0 | lateness n=1 p50<8.39ms p99<8.39ms max<8.39ms") != std::string::npos,
             line);
}

BOOST_AUTO_TEST_SUITE_END()
