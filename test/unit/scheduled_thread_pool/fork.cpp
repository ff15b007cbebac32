// fork() with pools busy in the parent: an io_context's timing, a pool and a wheel made in
// the child work; a pool of the parent is terminated in the child. Not under
// ThreadSanitizer, which refuses threads started after fork() (test/CMakeLists.txt leaves
// this file out of a TSan build). The plain program test/programs/fork_child.cpp forks
// with the whole library busy and checks the child's exit.
#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/serial_executor.hpp>
#include <metronome/wheel_timer.hpp>

#include "common/latch_task.hpp"
#include "common/poll_until.hpp"
#include "common/sanitizers.hpp"

#include <metronome/detail/asio.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <memory>
#include <optional>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace std::chrono_literals;
using metronome::scheduled_thread_pool;
using metronome::test::poll_until;
using metronome::test::ready;

BOOST_AUTO_TEST_SUITE(pool_fork_suite)

#if !METRONOME_TEST_TSAN // TSan refuses threads started after fork()
BOOST_AUTO_TEST_CASE(after_fork_an_io_context_s_timing_runs_delayed_serial_work_in_the_child) {
  metronome::net::io_context io;
  auto serial = metronome::make_serial_executor(io.get_executor());
  // The io_context's timing service exists before the fork, busy with far-future work.
  auto far = serial.schedule([] {}, 1h);
  // A pool and a wheel of the parent keep running across the fork. Not under
  // AddressSanitizer: GCC 12's ASan allocator takes no lock across fork(), so a child
  // forked while a parent thread allocates or frees can block for ever in the
  // allocator's mutex (CI's ASan run, once: this child hung until the test's timeout).
  // There the parent forks with no thread of its own running.
  constexpr bool parent_busy = !METRONOME_TEST_ASAN;
  std::optional<scheduled_thread_pool> parent_pool;
  std::optional<metronome::wheel_timer> parent_wheel;
  std::atomic<int> parent_ticks{0};
  metronome::scheduled_future<void> ticking;
  metronome::wheel_timer::timeout parent_timeout;
  if (parent_busy) {
    parent_pool.emplace(2);
    parent_wheel.emplace(*parent_pool);
    ticking = parent_pool->schedule_at_fixed_rate([&] { ++parent_ticks; }, 0ms, 1ms);
    parent_timeout = parent_wheel->schedule([] {}, 1h);
    BOOST_REQUIRE(poll_until([&] { return parent_ticks.load() > 2; }));
  }
  const pid_t pid = ::fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 1;
    try {
      auto guard = metronome::net::make_work_guard(io);
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
  const bool exited = poll_until([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, 60s);
  if (!exited) { // a hung child fails here, not at the test's timeout
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  BOOST_REQUIRE(exited);
  BOOST_CHECK(WIFEXITED(status));
  BOOST_CHECK_EQUAL(WEXITSTATUS(status), 0);
  BOOST_CHECK(far.cancel());
  if (parent_busy) {
    const int ticks = parent_ticks.load();
    BOOST_CHECK(poll_until([&] { return parent_ticks.load() > ticks; })); // the parent's pool goes on
    BOOST_CHECK(ticking.cancel());
  }
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
