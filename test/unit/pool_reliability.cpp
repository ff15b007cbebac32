// Regression tests for the engine's concurrency and lifetime defects: each case names
// the rule it protects (nothing lost, nothing stuck, nothing crashes) and failed before
// its fix (some only under AddressSanitizer, which CI runs).
#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/manual_clock.hpp>
#include <metronome/serial_executor.hpp>
#include <metronome/wheel_timer.hpp>

#include "common/latch_task.hpp"
#include "common/manual_pool.hpp"
#include "common/poll_until.hpp"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/defer.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using metronome::manual_clock;
using metronome::on_exception;
using metronome::periodic_options;
using metronome::pool_options;
using metronome::rejection_policy;
using metronome::scheduled_thread_pool;
using metronome::test::counter;
using metronome::test::gate;
using metronome::test::on_clock;
using metronome::test::poll_until;

namespace {

// Collects what an exception handler receives.
struct reported {
  std::mutex m;
  std::vector<std::exception_ptr> seen;
  std::function<void(std::exception_ptr)> handler() {
    return [this](std::exception_ptr e) {
      std::lock_guard lk(m);
      seen.push_back(e);
    };
  }
  std::size_t count() {
    std::lock_guard lk(m);
    return seen.size();
  }
  // Every report carried an exception with this message.
  bool all_are(const char* what) {
    std::lock_guard lk(m);
    for (auto& e : seen) {
      if (!e) return false;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        if (std::strcmp(ex.what(), what) != 0) return false;
      } catch (...) {
        return false;
      }
    }
    return true;
  }
};

// A pool whose only worker is held inside a task until release().
struct held_pool {
  explicit held_pool(pool_options o) : pool(std::move(o)) {
    BOOST_REQUIRE(metronome::test::occupy_worker(pool, release_gate, entered));
  }
  void release() { release_gate.open(); }
  ~held_pool() { release(); }

  counter entered;
  gate release_gate;
  scheduled_thread_pool pool;
};

[[maybe_unused]] bool ready(std::future_status s) { return s == std::future_status::ready; }

} // namespace

BOOST_AUTO_TEST_SUITE(pool_reliability_suite)

// ---------------------------------------------------------------- periodic exceptions

BOOST_AUTO_TEST_CASE(a_throwing_periodic_task_stops_and_the_handler_receives_its_exception) {
  reported r;
  pool_options o;
  o.exception_handler = r.handler();
  scheduled_thread_pool pool(o);
  auto h = pool.schedule_at_fixed_rate([] { throw std::runtime_error("x"); }, 0ms, 10ms);
  BOOST_REQUIRE(ready(h.wait_for(20s)));
  BOOST_CHECK_THROW(h.get(), std::runtime_error);
  BOOST_CHECK(!h.is_cancelled());
  pool.submit([] {}).wait(); // the worker lives on
  BOOST_CHECK_EQUAL(r.count(), 1u);
  BOOST_CHECK(r.all_are("x"));
}

BOOST_AUTO_TEST_CASE(a_throwing_periodic_task_under_continue_reports_every_run) {
  reported r;
  manual_clock clk;
  pool_options o = on_clock(clk);
  o.exception_handler = r.handler();
  scheduled_thread_pool pool(o);
  std::atomic<int> runs{0};
  auto h = pool.schedule_at_fixed_rate(
      [&] {
        ++runs;
        throw std::runtime_error("y");
      },
      0ms, 10ms, periodic_options{metronome::missed_tick::burst, on_exception::continue_});
  for (int i = 1; i <= 3; ++i) {
    BOOST_REQUIRE(poll_until([&] { return runs.load() == i && r.count() == std::size_t(i); }));
    clk.advance(10ms);
  }
  BOOST_CHECK(h.cancel());
  BOOST_CHECK(r.all_are("y"));
}

BOOST_AUTO_TEST_CASE(a_throwing_periodic_task_with_the_default_handler_does_not_crash) {
  scheduled_thread_pool pool(1);
  auto h = pool.schedule_with_fixed_delay([] { throw std::runtime_error("printed, not fatal"); }, 0ms, 1ms);
  BOOST_REQUIRE(ready(h.wait_for(20s)));
  BOOST_CHECK_THROW(h.get(), std::runtime_error);
  BOOST_CHECK_EQUAL(pool.submit([] { return 7; }).get(), 7);
}

BOOST_AUTO_TEST_CASE(a_throwing_periodic_serial_task_reaches_the_pool_handler) {
  reported r;
  pool_options o;
  o.threads = 2;
  o.exception_handler = r.handler();
  scheduled_thread_pool pool(o);
  auto serial = metronome::make_serial_executor(pool);
  auto h = serial.schedule_at_fixed_rate([] { throw std::runtime_error("z"); }, 0ms, 5ms);
  BOOST_REQUIRE(ready(h.wait_for(20s)));
  BOOST_CHECK_THROW(h.get(), std::runtime_error);
  BOOST_CHECK_EQUAL(r.count(), 1u);
  BOOST_CHECK(r.all_are("z"));
}

BOOST_AUTO_TEST_CASE(an_exception_handler_that_throws_is_reported_on_stderr_and_the_worker_lives) {
  pool_options o;
  o.exception_handler = [](std::exception_ptr) { throw std::logic_error("handler broke"); };
  scheduled_thread_pool pool(o);
  // stderr to a file for the duration.
  std::FILE* tmp = std::tmpfile();
  BOOST_REQUIRE(tmp);
  std::fflush(stderr);
  const int saved = ::dup(2);
  ::dup2(::fileno(tmp), 2);
  boost::asio::post(pool, [] { throw std::runtime_error("task broke"); });
  pool.submit([] {}).wait();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::rewind(tmp);
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, tmp);
  std::fclose(tmp);
  const std::string text(buf, n);
  BOOST_TEST_INFO("stderr: " << text);
  BOOST_CHECK(text.find("handler broke") != std::string::npos);
  BOOST_CHECK_EQUAL(pool.submit([] { return 1; }).get(), 1);
}

// ---------------------------------------------------------------- lost wake-ups

BOOST_AUTO_TEST_CASE(delayed_work_after_a_cancelled_earlier_task_runs_on_time) {
  scheduled_thread_pool pool(2);
  pool.submit([] {}).wait(); // workers started and parked
  for (int round = 0; round < 3; ++round) {
    auto first = pool.schedule([] {}, 100ms);
    BOOST_REQUIRE(first.cancel());
    std::this_thread::sleep_for(20ms); // the scenario: time passes between the two schedules
    const auto start = std::chrono::steady_clock::now();
    auto second = pool.schedule([] {}, 100ms);
    BOOST_REQUIRE_MESSAGE(ready(second.wait_for(10s)), "the second task never ran (lost wake-up)");
    // Generous: a lost wake-up delays it by the leader's stale deadline or forever.
    BOOST_CHECK(std::chrono::steady_clock::now() - start < 3s);
  }
}

BOOST_AUTO_TEST_CASE(delayed_serial_work_over_io_context_survives_a_cancel) {
  boost::asio::io_context io;
  auto guard = boost::asio::make_work_guard(io);
  std::thread runner([&] { io.run(); });
  auto serial = metronome::make_serial_executor(io.get_executor());
  auto first = serial.schedule([] {}, 100ms);
  BOOST_CHECK(first.cancel());
  std::this_thread::sleep_for(20ms);
  auto second = serial.schedule([] {}, 100ms); // due after the cancelled one
  BOOST_CHECK_MESSAGE(ready(second.wait_for(10s)), "delayed serial work lost on the shared timing pool");
  serial.dispose(); // the timing pool's thread is out of io's post() (it may still be when the task ran)
  guard.reset();
  runner.join();
}

// ---------------------------------------------------------------- stranded serial drain

BOOST_AUTO_TEST_CASE(a_pool_task_waiting_for_a_serial_task_over_the_same_pool_is_not_stranded) {
  scheduled_thread_pool pool(2);
  auto serial = metronome::make_serial_executor(pool);
  for (int round = 0; round < 5; ++round) {
    pool.submit([] {}).wait();
    std::this_thread::sleep_for(20ms); // the scenario: the other worker has gone to sleep
    auto waited = pool.submit([&] { return ready(serial.submit([] {}).wait_for(10s)); });
    BOOST_CHECK_MESSAGE(waited.get(), "the serial drain was queued without waking the idle worker");
  }
}

// ---------------------------------------------------------------- termination

BOOST_AUTO_TEST_CASE(join_returns_after_shutdown_even_with_tracked_work_outstanding) {
  scheduled_thread_pool pool(1);
  // Tracked work that only outside work could finish, and outside work is dropped now.
  auto guard = boost::asio::make_work_guard(pool.get_executor());
  pool.shutdown();
  BOOST_CHECK_MESSAGE(pool.await_termination(10s), "tracked work kept a shut-down, idle pool alive");
  pool.join();
  BOOST_CHECK(pool.is_terminated());
}

BOOST_AUTO_TEST_CASE(a_strand_over_a_shut_down_pool_runs_what_it_accepted) {
  pool_options o;
  o.exception_handler = [](std::exception_ptr) {};
  held_pool hp(o);
  auto strand = boost::asio::make_strand(hp.pool.get_executor());
  std::atomic<int> ran{0};
  // Queued before shutdown: it reaches the strand from a pool thread (as a completion does).
  boost::asio::post(hp.pool.get_executor(), [&] { boost::asio::post(strand, [&] { ++ran; }); });
  hp.pool.shutdown();
  // Outside, after shutdown: the strand's invoker is the pool's internal work (dropping it
  // would leave the strand locked and lose every handler queued behind it).
  boost::asio::post(strand, [&] { ++ran; });
  hp.release();
  BOOST_CHECK(poll_until([&] { return ran.load() == 2; }, 10s));
  BOOST_CHECK(hp.pool.await_termination(10s));
}

BOOST_AUTO_TEST_CASE(a_serial_executor_over_a_shut_down_pool_refuses_outside_work_and_runs_inside_work) {
  reported r;
  pool_options o;
  o.exception_handler = r.handler();
  held_pool hp(o);
  auto serial = metronome::make_serial_executor(hp.pool);
  std::atomic<int> ran{0};
  // Queued before shutdown: it posts to the serial executor from a pool thread.
  boost::asio::post(hp.pool.get_executor(), [&] { boost::asio::post(serial, [&] { ++ran; }); });
  hp.pool.shutdown();
  boost::asio::post(serial, [&] { ran += 100; });                           // outside: dropped, reported
  BOOST_CHECK_THROW(serial.submit([] {}), metronome::rejected_execution); // outside, typed: refused
  hp.release();
  BOOST_CHECK(poll_until([&] { return ran.load() == 1; }, 10s));
  BOOST_CHECK(hp.pool.await_termination(10s));
  BOOST_CHECK_EQUAL(ran.load(), 1);
  BOOST_CHECK_EQUAL(r.count(), 1u);
  BOOST_CHECK_EQUAL(hp.pool.stats().rejected, 2u);
}

BOOST_AUTO_TEST_CASE(a_completion_reaching_a_shut_down_pool_from_outside_still_runs) {
  scheduled_thread_pool pool(1);
  auto h = pool.schedule([] {}, 1h);
  std::atomic<int> ran{0};
  h.async_wait(boost::asio::bind_executor(pool.get_executor(), [&](std::exception_ptr e) {
    if (e) ++ran;
  }));
  pool.shutdown(); // the delayed task still runs when due (run_delayed_after_shutdown)
  BOOST_REQUIRE(h.cancel()); // from outside: its completion goes to the pool from here
  BOOST_CHECK_MESSAGE(poll_until([&] { return ran.load() == 1; }, 10s),
                      "the completion was dropped as outside work");
  BOOST_CHECK(pool.await_termination(10s));
}

// ---------------------------------------------------------------- handles after the pool

BOOST_AUTO_TEST_CASE(a_pending_task_and_its_handle_outlive_the_pool) {
  std::vector<metronome::pending_task> left;
  metronome::scheduled_future<int> delayed, ready;
  std::atomic<int> ran{0};
  {
    held_pool hp(pool_options::fixed(1));
    ready = hp.pool.submit([&] { return ++ran; });
    delayed = hp.pool.schedule([&] { return ++ran; }, 1h);
    left = hp.pool.shutdown_now();
    BOOST_CHECK_EQUAL(left.size(), 2u);
    hp.release();
  } // the pool is gone
  BOOST_CHECK(!delayed.is_done());
  BOOST_CHECK(delayed.delay() <= 0ns);
  BOOST_CHECK(delayed.cancel());
  BOOST_CHECK(delayed.is_cancelled());
  BOOST_CHECK(!delayed.cancel());
  for (auto& t : left) t(); // the cancelled one does not run
  BOOST_CHECK_EQUAL(ran.load(), 1);
  BOOST_CHECK_EQUAL(ready.get(), 1);
  BOOST_CHECK(!ready.cancel());
}

BOOST_AUTO_TEST_CASE(handles_of_work_the_destructor_cancelled_stay_usable) {
  metronome::scheduled_future<void> h, p;
  {
    scheduled_thread_pool pool(1);
    h = pool.schedule([] {}, 1h);
    p = pool.schedule_at_fixed_rate([] {}, 1h, 1h);
  }
  BOOST_CHECK(h.is_cancelled());
  BOOST_CHECK(p.is_cancelled());
  BOOST_CHECK(!h.cancel());
  BOOST_CHECK(!p.cancel());
  BOOST_CHECK(h.delay() == 0ns);
  BOOST_CHECK_THROW(h.get(), metronome::cancelled_error);
}

BOOST_AUTO_TEST_CASE(cancels_racing_the_pool_s_destruction_are_safe) {
  for (int round = 0; round < 20; ++round) {
    std::vector<metronome::scheduled_future<void>> handles;
    auto pool = std::make_unique<scheduled_thread_pool>(2);
    for (int i = 0; i < 200; ++i) handles.push_back(pool->schedule([] {}, 1h + i * 1ms));
    std::atomic<bool> go{false};
    std::thread canceller([&] {
      while (!go.load()) {
      }
      for (auto& h : handles) {
        h.cancel();
        (void)h.delay();
      }
    });
    go = true;
    pool.reset();
    canceller.join();
    for (auto& h : handles) BOOST_CHECK(h.is_cancelled());
  }
}

// ---------------------------------------------------------------- discard_oldest

BOOST_AUTO_TEST_CASE(discard_oldest_never_evicts_a_serial_executor_s_drain) {
  pool_options o;
  o.max_queued = 2;
  o.rejection = rejection_policy::discard_oldest;
  held_pool hp(o);
  auto serial = metronome::make_serial_executor(hp.pool);
  std::atomic<bool> serial_ran{false};
  boost::asio::post(serial, [&] { serial_ran = true; }); // its drain: internal work in the ready queue
  auto a = hp.pool.submit([] { return 1; });
  auto b = hp.pool.submit([] { return 2; }); // full: evicts a, the oldest user task
  BOOST_CHECK(a.is_cancelled());
  hp.release();
  BOOST_CHECK_EQUAL(b.get(), 2);
  BOOST_CHECK(poll_until([&] { return serial_ran.load(); }));
  BOOST_CHECK_GE(hp.pool.stats().rejected, 1u);
}

BOOST_AUTO_TEST_CASE(discard_oldest_keeps_the_ready_queue_bounded) {
  pool_options o;
  o.max_queued = 4;
  o.rejection = rejection_policy::discard_oldest;
  held_pool hp(o);
  std::vector<metronome::scheduled_future<int>> hs;
  for (int i = 0; i < 200; ++i) {
    hs.push_back(hp.pool.submit([i] { return i; }));
    BOOST_REQUIRE_LE(hp.pool.stats().ready_queued, 5u); // the bound, plus at most one cancelled in place
  }
  hp.release();
  for (int i = 0; i < 200; ++i) {
    if (i < 196)
      BOOST_CHECK(hs[i].is_cancelled()); // evicted, oldest first
    else
      BOOST_CHECK_EQUAL(hs[i].get(), i); // the newest ones run
  }
  BOOST_CHECK_EQUAL(hp.pool.stats().rejected, 196u);
}

BOOST_AUTO_TEST_CASE(discard_oldest_with_only_internal_work_queued_discards_the_new_task) {
  pool_options o;
  o.max_queued = 1;
  o.rejection = rejection_policy::discard_oldest;
  held_pool hp(o);
  std::atomic<bool> posted_ran{false};
  boost::asio::post(hp.pool, [&] { posted_ran = true; });
  auto late = hp.pool.submit([] {});
  BOOST_CHECK(late.is_cancelled());
  BOOST_CHECK_EQUAL(hp.pool.stats().rejected, 1u);
  hp.release();
  BOOST_CHECK(poll_until([&] { return posted_ran.load(); }));
}

// ---------------------------------------------------------------- destroyed from inside

BOOST_AUTO_TEST_CASE(a_pool_destroyed_from_its_own_task_runs_the_continuations_that_task_deferred) {
  auto* pool = new scheduled_thread_pool(2);
  counter done;
  gate posted; // the rule: no other thread is inside a call on the pool when it goes
  std::atomic<int> continuation_ran{0};
  boost::asio::post(*pool, [&, pool] {
    boost::asio::defer(pool->get_executor(), [&] { ++continuation_ran; });
    posted.wait();
    delete pool;
    done.add();
  });
  posted.open();
  BOOST_REQUIRE(done.wait_for_at_least(1));
  BOOST_CHECK_EQUAL(continuation_ran.load(), 1);
}

// ---------------------------------------------------------------- serial order

BOOST_AUTO_TEST_CASE(delayed_serial_tasks_run_in_due_order_on_four_threads) {
  scheduled_thread_pool pool(4);
  for (int round = 0; round < 5; ++round) {
    auto serial = metronome::make_serial_executor(pool);
    std::mutex m;
    std::vector<int> order;
    std::vector<metronome::scheduled_future<void>> hs;
    for (int i = 0; i < 30; ++i) {
      const auto d = std::chrono::milliseconds(20 * (i % 3)); // 0, 20, 40, 0, 20, 40...
      hs.push_back(serial.schedule(
          [&, i] {
            std::lock_guard lk(m);
            order.push_back(i);
          },
          d));
    }
    for (auto& h : hs) BOOST_REQUIRE(ready(h.wait_for(20s)));
    std::vector<int> expected;
    for (int r = 0; r < 3; ++r)
      for (int i = r; i < 30; i += 3) expected.push_back(i);
    BOOST_CHECK_EQUAL_COLLECTIONS(order.begin(), order.end(), expected.begin(), expected.end());
  }
}

BOOST_AUTO_TEST_CASE(delayed_serial_tasks_falling_due_together_run_in_due_order_on_four_threads) {
  manual_clock clk;
  scheduled_thread_pool pool(on_clock(clk, 4));
  for (int round = 0; round < 20; ++round) {
    auto serial = metronome::make_serial_executor(pool);
    std::mutex m;
    std::vector<int> order;
    std::vector<metronome::scheduled_future<void>> hs;
    for (int i = 0; i < 30; ++i) {
      const auto d = std::chrono::milliseconds(1 + (i % 3)); // 1, 2, 3, 1, 2, 3...
      hs.push_back(serial.schedule(
          [&, i] {
            std::lock_guard lk(m);
            order.push_back(i);
          },
          d));
    }
    clk.advance(3ms); // all due at once
    for (auto& h : hs) BOOST_REQUIRE(ready(h.wait_for(20s)));
    std::vector<int> expected;
    for (int r = 0; r < 3; ++r)
      for (int i = r; i < 30; i += 3) expected.push_back(i);
    BOOST_CHECK_EQUAL_COLLECTIONS(order.begin(), order.end(), expected.begin(), expected.end());
  }
}

BOOST_AUTO_TEST_SUITE_END()
