// Regression tests for the pool's rules beyond its concurrency: due order for work
// submitted due now behind delayed work already due, memory given back by the delay
// queue, the answers to misuse (calls after join(), bad options, caller_runs after
// shutdown()), and fork(). Each failed before its fix.
#include <metronome/detail/node_cache.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/serial_executor.hpp>
#include <metronome/wheel_timer.hpp>

#include "common/latch_task.hpp"
#include "common/poll_until.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/test/unit_test.hpp>

#include "common/sanitizers.hpp"

#include <atomic>
#include <chrono>
#include <csignal>
#include <future>
#include <malloc.h>
#include <stdexcept>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace std::chrono_literals;
using metronome::pool_options;
using metronome::rejection_policy;
using metronome::scheduled_thread_pool;
using metronome::test::counter;
using metronome::test::gate;
using metronome::test::poll_until;

namespace {

[[maybe_unused]] bool ready(std::future_status s) { return s == std::future_status::ready; }

std::size_t heap_in_use() {
  struct mallinfo2 mi = ::mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

} // namespace

BOOST_AUTO_TEST_SUITE(pool_rules_suite)

// Due order holds for work submitted due now: a task already due but not yet promoted
// (its only worker is busy, so nobody looked at the heap) runs before a task submitted
// after its due time with no delay, as in Java's delay queue. It used to be overtaken.
BOOST_AUTO_TEST_CASE(a_due_now_submission_queues_behind_a_delayed_task_already_due) {
  scheduled_thread_pool pool(pool_options::single_thread());
  gate hold;
  counter held;
  pool.submit([&] {
    held.add();
    hold.wait();
  });
  BOOST_REQUIRE(held.wait_for_at_least(1));
  std::mutex m;
  std::vector<int> order;
  auto record = [&](int id) {
    return [&, id] {
      std::lock_guard lk(m);
      order.push_back(id);
    };
  };
  auto a = pool.schedule(record(1), 1ms);
  BOOST_REQUIRE(poll_until([&] { return a.delay() <= std::chrono::nanoseconds::zero(); }, 10s));
  auto b = pool.submit(record(2));
  auto c = pool.schedule(record(3), 0ms);
  hold.open();
  c.wait();
  b.wait();
  a.wait();
  BOOST_CHECK((order == std::vector<int>{1, 2, 3}));
}

// The same on a serial executor: a serial task due now joins behind serial tasks already due.
BOOST_AUTO_TEST_CASE(a_due_now_serial_task_queues_behind_a_delayed_serial_task_already_due) {
  scheduled_thread_pool pool(pool_options::single_thread());
  auto serial = metronome::make_serial_executor(pool);
  gate hold;
  counter held;
  pool.submit([&] {
    held.add();
    hold.wait();
  });
  BOOST_REQUIRE(held.wait_for_at_least(1));
  std::mutex m;
  std::vector<int> order;
  auto record = [&](int id) {
    return [&, id] {
      std::lock_guard lk(m);
      order.push_back(id);
    };
  };
  auto a = serial.schedule(record(1), 1ms);
  BOOST_REQUIRE(poll_until([&] { return a.delay() <= std::chrono::nanoseconds::zero(); }, 10s));
  auto c = serial.submit(record(2)); // went straight to the serial queue, ahead of 1 (adversary pass 6)
  auto b = serial.schedule(record(3), 0ms);
  auto d = serial.schedule_at_fixed_rate(record(4), 0ms, 1h);
  hold.open();
  c.wait();
  b.wait();
  a.wait();
  BOOST_CHECK(poll_until([&] {
    std::lock_guard lk(m);
    return order.size() == 4u;
  }));
  d.cancel();
  std::lock_guard lk(m);
  BOOST_CHECK((order == std::vector<int>{1, 2, 3, 4}));
}

// An exception handler that logs by posting to its own pool: after shutdown that post is
// dropped and reported - to the handler, which posts again... The stack overflowed
// (adversary pass 7: SIGSEGV every run). Eight handlers deep on one thread, a report goes
// to stderr instead.
BOOST_AUTO_TEST_CASE(an_exception_handler_that_posts_to_its_shut_down_pool_does_not_recurse_for_ever) {
  std::atomic<int> reports{0};
  scheduled_thread_pool* self = nullptr;
  metronome::pool_options o;
  o.threads = 1;
  o.exception_handler = [&](std::exception_ptr) {
    ++reports;
    boost::asio::post(*self, [] {}); // "log on the pool"
  };
  scheduled_thread_pool pool(o);
  self = &pool;
  pool.shutdown();
  boost::asio::post(pool, [] {});
  BOOST_CHECK_EQUAL(reports.load(), 8);
  BOOST_CHECK_EQUAL(pool.stats().rejected, 9u); // every drop counted, the last one printed
  boost::asio::post(pool, [] {}); // and again: the depth went back to 0
  BOOST_CHECK_EQUAL(reports.load(), 16);
}

BOOST_AUTO_TEST_CASE(the_delay_queue_gives_memory_back_when_it_empties_out) {
  scheduled_thread_pool pool(1);
  std::vector<metronome::scheduled_future<void>> hs;
  hs.reserve(200'000);
  const std::size_t before = heap_in_use();
  for (int i = 0; i < 200'000; ++i) hs.push_back(pool.schedule([] {}, 1h));
  for (auto& h : hs) BOOST_REQUIRE(h.cancel());
  hs.clear();
  hs.shrink_to_fit();
  const std::size_t after = heap_in_use();
  BOOST_TEST_MESSAGE("heap in use before " << before << ", after " << after);
  // 200k queue entries are ~4.8 MiB; what stays must be far less. The task nodes' own
  // memory is the node cache's, which keeps some chunks for reuse by design (its tests
  // bound that); where its chunks come from malloc (the portable fallback) they are
  // counted here, so they are allowed for.
  const std::size_t node_cache = metronome::detail::node_cache_mapped_bytes();
  BOOST_CHECK_LT(after, before + 1024 * 1024 + node_cache);
  BOOST_CHECK_EQUAL(pool.stats().delayed_queued, 0u);
}

// ---------------------------------------------------------------- misuse

BOOST_AUTO_TEST_CASE(submit_after_join_says_the_pool_has_terminated) {
  scheduled_thread_pool pool(1);
  pool.join();
  try {
    pool.submit([] {});
    BOOST_FAIL("no exception");
  } catch (const metronome::rejected_execution& e) {
    BOOST_CHECK(std::string(e.what()).find("terminated") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(an_elastic_bound_below_the_core_size_is_refused) {
  BOOST_CHECK_THROW(scheduled_thread_pool(pool_options::cached(4, 2)), std::invalid_argument);
  BOOST_CHECK_NO_THROW(scheduled_thread_pool(pool_options::cached(2, 2)));
}

BOOST_AUTO_TEST_CASE(a_period_below_a_nanosecond_is_refused) {
  scheduled_thread_pool pool(1);
  const std::chrono::duration<double> tiny(1e-10);
  BOOST_CHECK_THROW(pool.schedule_at_fixed_rate([] {}, 0ms, tiny), std::invalid_argument);
  BOOST_CHECK_THROW(pool.schedule_with_fixed_delay([] {}, 0ms, tiny), std::invalid_argument);
  const std::chrono::duration<double> nan(std::numeric_limits<double>::quiet_NaN());
  BOOST_CHECK_THROW(pool.schedule_at_fixed_rate([] {}, 0ms, nan), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(caller_runs_after_shutdown_never_runs_delayed_or_periodic_work_early) {
  pool_options o;
  o.rejection = rejection_policy::caller_runs;
  scheduled_thread_pool pool(o);
  pool.shutdown();
  std::atomic<int> ran{0};
  BOOST_CHECK_THROW(pool.schedule([&] { ++ran; }, 1h), metronome::rejected_execution);
  BOOST_CHECK_THROW(pool.schedule_at_fixed_rate([&] { ++ran; }, 1h, 1h), metronome::rejected_execution);
  BOOST_CHECK_THROW(pool.schedule_with_fixed_delay([&] { ++ran; }, 0ms, 1h), metronome::rejected_execution);
  BOOST_CHECK_EQUAL(ran.load(), 0);
  auto now = pool.submit([&] { return ++ran; }); // due now: runs on the caller
  BOOST_CHECK_EQUAL(now.get(), 1);
  BOOST_CHECK_EQUAL(pool.stats().rejected, 4u);
}

// ---------------------------------------------------------------- fork

#if !METRONOME_TEST_TSAN // TSan refuses threads started after fork()
BOOST_AUTO_TEST_CASE(after_fork_an_io_context_s_timing_runs_delayed_serial_work_in_the_child) {
  boost::asio::io_context io;
  auto serial = metronome::make_serial_executor(io.get_executor());
  // The io_context's timing service exists before the fork, busy with far-future work.
  auto far = serial.schedule([] {}, 1h);
  // A pool and a wheel of the parent keep running across the fork.
  scheduled_thread_pool parent_pool(2);
  metronome::wheel_timer parent_wheel(parent_pool);
  std::atomic<int> parent_ticks{0};
  auto ticking = parent_pool.schedule_at_fixed_rate([&] { ++parent_ticks; }, 0ms, 1ms);
  auto parent_timeout = parent_wheel.schedule([] {}, 1h);
  BOOST_REQUIRE(poll_until([&] { return parent_ticks.load() > 2; }));
  const pid_t pid = ::fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 1;
    try {
      auto guard = boost::asio::make_work_guard(io);
      std::thread runner([&] { io.run(); });
      auto h = serial.schedule([] {}, 5ms);
      const bool ran = ready(h.wait_for(10s));
      const bool cancelled = far.cancel(); // its mutex is usable in the child
      serial.dispose();
      // A pool and a wheel made in the child work.
      bool child_pool_ok = false, child_wheel_ok = false;
      {
        scheduled_thread_pool child(2);
        child_pool_ok = child.submit([] { return 41; }).get() == 41;
        metronome::wheel_timer wheel(child);
        std::atomic<bool> fired{false};
        auto t = wheel.schedule([&] { fired = true; }, 2ms);
        child_wheel_ok = poll_until([&] { return fired.load(); }, 10s);
      }
      if (!child_pool_ok || !child_wheel_ok) ::_exit(4);
      guard.reset();
      io.stop();
      runner.join();
      code = ran && cancelled ? 0 : 2;
    } catch (...) {
      code = 3;
    }
    ::_exit(code);
  }
  int status = 0;
  BOOST_REQUIRE_EQUAL(::waitpid(pid, &status, 0), pid);
  BOOST_CHECK(WIFEXITED(status));
  BOOST_CHECK_EQUAL(WEXITSTATUS(status), 0);
  BOOST_CHECK(far.cancel());
  const int ticks = parent_ticks.load();
  BOOST_CHECK(poll_until([&] { return parent_ticks.load() > ticks; })); // the parent's pool goes on
  BOOST_CHECK(ticking.cancel());
}

// A pool of the parent, in the child: terminated (no threads; its work is the parent's).
// Its destructor, join() and await_termination() return at once - they waited for ever
// for workers that do not exist in the child, so a child returning from main() with a
// global pool hung (adversary pass) - what it had queued is destroyed unrun, and new
// submissions are refused as by a terminated pool. The parent's pool goes on.
BOOST_AUTO_TEST_CASE(a_pool_of_the_parent_is_terminated_in_the_child_and_destroyed_there_at_once) {
  auto pool = std::make_unique<scheduled_thread_pool>(1);
  metronome::test::gate busy;
  metronome::test::counter started;
  BOOST_REQUIRE(metronome::test::occupy_worker(*pool, busy, started));
  auto queued = pool->submit([] { return 1; });   // behind the busy worker
  auto delayed = pool->schedule([] { return 2; }, 1h);
  const pid_t pid = ::fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 0;
    try {
      if (!pool->is_terminated()) code = 2;
      if (!pool->await_termination(0ms)) code = 3;
      bool refused = false;
      try {
        (void)pool->submit([] { return 3; });
      } catch (const metronome::rejected_execution&) {
        refused = true;
      }
      if (!refused) code = 4;
      pool->join();
      pool.reset();
      if (!queued.is_cancelled() || !delayed.is_cancelled()) code = 5;
    } catch (...) {
      code = 6;
    }
    ::_exit(code);
  }
  int status = 0;
  bool exited = poll_until([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, 20s);
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  BOOST_CHECK(exited);
  BOOST_CHECK(WIFEXITED(status));
  BOOST_CHECK_EQUAL(WEXITSTATUS(status), 0);
  busy.open();
  BOOST_CHECK_EQUAL(queued.get(), 1); // the parent's pool runs its work
  BOOST_CHECK(delayed.cancel());
}
#endif

BOOST_AUTO_TEST_SUITE_END()
