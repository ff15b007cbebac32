// fork() with the library busy in the parent: the child must be able to use, destroy and
// exit past everything the parent made, promptly. A plain program (the child runs the
// static destructors of a normal exit); each case forks a child bounded by alarm(), and
// the program fails unless every child exits 0 within it.
//  - a thread of the parent blocked in get(): the parking stripe's condition variable it
//    waited on blocked the child's exit for ever;
//  - a wheel of the parent whose timer thread sleeps: its destruction in the child
//    waited for that thread for ever; new timeouts on it must be refused;
//  - a pool of the parent, busy: destroyed at once, queued work cancelled;
//  - fork() from inside a pool task, the child carrying on in that task: the worker
//    record it runs on was freed in the child (ASan);
//  - a parent's serial delayed task in the timing pool at the fork, its executor's lock
//    held by a parent thread: the child's timer thread delivered it and blocked there,
//    so the child's own delays never completed;
//  - forks repeated while producers post, schedule and use the timing pool: each child
//    exits promptly, and the parent accounts for every task (run = posted; every
//    async_delay on the timing pool completed once);
//  - (test hooks) a producer of the parent stopped between its exchange of the ready
//    queue's tail and its link: in the child the queue stopped at the break for ever,
//    so the pool's destruction left the tasks queued before it unrun and uncancelled.
#include <metronome/async_delay.hpp>
#include <metronome/errors.hpp>
#include <metronome/serial_executor.hpp>
#include <metronome/scheduled_thread_pool.hpp>
#include <metronome/wheel_timer.hpp>
#if defined(METRONOME_TEST_HOOKS)
#include <metronome/detail/test_hooks.hpp>
#endif

#include "common/sanitizers.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <metronome/detail/asio.hpp>

using namespace std::chrono_literals;

namespace {

// Waits for the child: 0 when it exited 0.
int reap(pid_t pid, const char* what) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return 1;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  std::fprintf(stderr, "fork_child: %s: child %s %d\n", what, WIFEXITED(status) ? "exited with" : "killed by signal",
               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  return 1;
}

int parent_objects_in_the_child() {
  auto pool = std::make_unique<metronome::scheduled_thread_pool>(2);
  auto wheel = std::make_unique<metronome::wheel_timer>(*pool);
  auto far = wheel->schedule([] {}, 1h);
  auto long_task = pool->schedule([] { return 1; }, 1h);
  std::atomic<bool> waiting{false};
  std::thread waiter([&] {
    waiting = true;
    try {
      (void)long_task.get(); // parked on a stripe across the fork
    } catch (...) {
    }
  });
  while (!waiting.load()) std::this_thread::yield();
  std::this_thread::sleep_for(50ms); // not synchronisation: lets the waiter park and the timer thread sleep
  const pid_t pid = ::fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    ::alarm(20);
    bool refused = false;
    try {
      (void)wheel->schedule([] {}, 1ms);
    } catch (const metronome::rejected_execution&) {
      refused = true;
    }
    if (!refused) ::_exit(2);
    wheel.reset();
    pool.reset();
    if (!far.is_cancelled()) ::_exit(3);
    if (!long_task.is_cancelled()) ::_exit(4);
    std::exit(0); // static destructors: the stripes among them
  }
  const int bad = reap(pid, "parent's wheel, pool and a waiter");
  long_task.cancel();
  waiter.join();
  return bad;
}

int fork_inside_a_task() {
  metronome::scheduled_thread_pool pool(2);
  std::atomic<pid_t> child{-1};
  pool.submit([&] {
        const pid_t pid = ::fork();
        if (pid == 0) {
          ::alarm(20);
          // The child goes on in this task: posts, submits, makes and destroys a pool.
          metronome::net::post(pool, [] {});
          try {
            (void)pool.submit([] {});
          } catch (const metronome::rejected_execution&) {
          }
          { metronome::scheduled_thread_pool fresh(1); fresh.submit([] {}).get(); }
          return; // the task returns: the worker's thread, the child's only one, ends
        }
        child = pid;
      })
      .wait();
  if (child.load() <= 0) return 1;
  return reap(child.load(), "fork inside a task");
}

#if !METRONOME_TEST_ASAN // see main()
int forks_while_producers_run() {
  auto pool = std::make_unique<metronome::scheduled_thread_pool>(2);
  metronome::net::io_context io; // the parent's: async_delay on it goes through the timing pool
  auto guard = metronome::net::make_work_guard(io);
  std::thread io_thread([&] { io.run(); });
  std::atomic<bool> stop{false};
  std::atomic<long> posted{0}, ran{0}, delays_started{0}, delays_done{0}, serial_ran{0}, serial_scheduled{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < 2; ++p)
    producers.emplace_back([&] {
      auto serial = metronome::make_serial_executor(io.get_executor());
      while (!stop.load()) {
        metronome::net::post(*pool, [&] { ++ran; });
        ++posted;
        metronome::async_delay(io.get_executor(), std::chrono::microseconds(300),
                               [&](metronome::error_code) { ++delays_done; });
        ++delays_started;
        serial.schedule([&] { ++serial_ran; }, std::chrono::microseconds(200));
        ++serial_scheduled;
        pool->schedule([] {}, 1h).cancel();
        std::this_thread::yield();
      }
    });
  int bad = 0;
  for (int i = 0; i < 30; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(300 + (i * 211) % 1500)); // not synchronisation: spreads the forks
    const pid_t pid = ::fork();
    if (pid < 0) return bad + 1;
    if (pid == 0) {
      ::alarm(20);
      pool.reset(); // the parent's, terminated here: returns at once
      metronome::net::io_context mine;
      int got = 0;
      metronome::async_delay(mine.get_executor(), 1ms, [&](metronome::error_code ec) { got += ec ? 0 : 1; });
      mine.run(); // the timing pool restarted in the child
      metronome::scheduled_thread_pool fresh(1);
      got += fresh.submit([] { return 1; }).get();
      ::_exit(got == 2 ? 0 : 6);
    }
    bad += reap(pid, "a fork while producers run");
  }
  stop = true;
  for (auto& t : producers) t.join();
  pool.reset(); // runs what is queued
  // A serial executor's delayed task holds no work on io until its drain is posted: a
  // producer preempted between its async_delay and its serial.schedule left a serial
  // task due after the last delay, so io.run() could return first and the drain then
  // went to a stopped (later destroyed) io - counted as lost, or a crash at exit. The
  // guard stays until every serial task has run (bounded: a loss still fails).
  const auto limit = std::chrono::steady_clock::now() + 20s;
  while (serial_ran.load() != serial_scheduled.load() && std::chrono::steady_clock::now() < limit)
    std::this_thread::yield();
  guard.reset();
  io_thread.join(); // every delay and serial task has completed on io
  if (ran.load() != posted.load() || delays_done.load() != delays_started.load() ||
      serial_ran.load() != serial_scheduled.load()) {
    std::fprintf(stderr, "fork_child: parent lost work across forks: ran %ld of %ld, delays %ld of %ld, serial %ld of %ld\n",
                 ran.load(), posted.load(), delays_done.load(), delays_started.load(), serial_ran.load(),
                 serial_scheduled.load());
    ++bad;
  }
  return bad;
}
#endif

// An executor over an io_context whose execute() takes a mutex first: stands for an
// executor whose lock (or condition variable) a thread of the parent holds at the fork,
// as an io_context's is while another thread posts to it or waits in it.
struct locking_executor {
  metronome::net::io_context* io;
  std::mutex* m;
  metronome::net::execution_context& query(metronome::net::execution::context_t) const noexcept { return *io; }
  static constexpr metronome::net::execution::blocking_t query(metronome::net::execution::blocking_t) noexcept {
    return metronome::net::execution::blocking.never;
  }
  locking_executor require(metronome::net::execution::blocking_t::never_t) const noexcept { return *this; }
  template <class F>
  void execute(F&& f) const {
    std::lock_guard lk(*m);
    metronome::net::post(io->get_executor(), std::forward<F>(f));
  }
  bool operator==(const locking_executor& o) const noexcept { return io == o.io && m == o.m; }
  bool operator!=(const locking_executor& o) const noexcept { return !(*this == o); }
};

// The timing pool restarted in the child delivered the parent's delayed work there: a
// serial executor's delayed task of the parent fell due in the child and its drain was
// posted to the parent's executor, whose lock a parent thread held at the fork - the
// child's only timer thread blocked for good, and the child's own async_delay and
// serial delayed work never completed (seen: fork_child's producers case, the timer
// thread in pthread_cond_signal / pthread_mutex_lock of the parent's io_context; and a
// serial executor over a new net::thread_pool in the child never running its task).
int a_parent_s_delayed_work_stays_with_the_parent() {
  metronome::net::io_context io; // never run: the parent's delayed task is only to be delivered
  std::mutex m;
  auto serial = metronome::make_serial_executor(locking_executor{&io, &m});
  std::atomic<int> ran{0};
  // In the io_context's timing service at the fork (forked at once), due in the child.
  // (Scheduled first: its host is the executor it came with, whose execute() takes m.)
  (void)serial.schedule([&] { ++ran; }, 300ms);
  std::atomic<bool> held{false}, let_go{false};
  std::thread holder([&] { // a thread of the parent, holding the executor's lock at the fork
    std::lock_guard lk(m);
    held = true;
    while (!let_go.load()) std::this_thread::yield();
  });
  while (!held.load()) std::this_thread::yield();
  const pid_t pid = ::fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    ::alarm(20);
    int got = 0;
    metronome::net::io_context mine;
    metronome::async_delay(mine.get_executor(), 600ms, [&](metronome::error_code ec) { got += ec ? 0 : 1; });
    mine.run_for(5s); // due after the parent's task: the timer thread must not be stuck on it
    metronome::net::thread_pool tp(1);
    auto child_serial = metronome::make_serial_executor(tp.get_executor());
    auto h = child_serial.schedule([] { return 1; }, 2ms);
    if (h.wait_for(5s) == std::future_status::ready) got += h.get();
    tp.join();
    ::_exit(got == 2 && ran.load() == 0 ? 0 : 7);
  }
  int bad = reap(pid, "a parent's delayed work at the fork");
  let_go = true;
  holder.join();
  // The task is the parent's: it runs here, once the timer thread can take the lock.
  auto guard = metronome::net::make_work_guard(io);
  while (ran.load() == 0) io.run_one();
  std::lock_guard lk(m); // the timer thread's execute() is over: io and m may go
  return bad + (ran.load() == 1 ? 0 : 1);
}

#if defined(METRONOME_TEST_HOOKS)
std::atomic<std::thread::id> stop_thread{};
std::atomic<bool> stopped{false};
std::atomic<bool> resume{false};

void stop_mid_push(metronome::detail::hook_point p) {
  if (p != metronome::detail::hook_point::ready_push_before_link || std::this_thread::get_id() != stop_thread.load())
    return;
  stopped = true;
  while (!resume.load()) std::this_thread::yield();
}

int fork_while_a_producer_is_mid_push() {
  auto pool = std::make_unique<metronome::scheduled_thread_pool>(1);
  std::atomic<bool> release_worker{false};
  std::atomic<bool> worker_busy{false};
  metronome::net::post(*pool, [&] {
    worker_busy = true;
    while (!release_worker.load()) std::this_thread::yield();
  });
  while (!worker_busy.load()) std::this_thread::yield();
  // Queued behind the busy worker, before the break.
  auto a = pool->submit([] { return 1; });
  auto b = pool->submit([] { return 2; });
  metronome::detail::test_hook = &stop_mid_push;
  std::thread producer([&] {
    stop_thread = std::this_thread::get_id();
    metronome::net::post(*pool, [] {}); // stops after its exchange, before its link
  });
  while (!stopped.load()) std::this_thread::yield();
  const pid_t pid = ::fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    ::alarm(20);
    metronome::detail::test_hook = nullptr;
    pool.reset(); // terminated in the child: what it had queued is cancelled
    if (!a.is_cancelled() || !b.is_cancelled()) ::_exit(5);
    std::exit(0);
  }
  const int bad = reap(pid, "a producer stopped mid-push at the fork");
  resume = true;
  producer.join();
  metronome::detail::test_hook = nullptr;
  release_worker = true;
  if (a.get() != 1 || b.get() != 2) return bad + 1; // the parent's queue is whole
  return bad;
}
#endif

} // namespace

int main() {
  int bad = parent_objects_in_the_child();
  bad += fork_inside_a_task();
  bad += a_parent_s_delayed_work_stays_with_the_parent();
  // Not under AddressSanitizer: GCC 12's ASan allocator takes no lock across fork(), so a
  // child forked while a producer allocates can block for ever in the allocator's mutex
  // (seen: the child's first operator new waiting in SizeClassAllocator64::
  // GetFromAllocator, held by a parent thread at the fork). glibc's malloc is fork-safe.
#if !METRONOME_TEST_ASAN
  bad += forks_while_producers_run();
#endif
#if defined(METRONOME_TEST_HOOKS)
  bad += fork_while_a_producer_is_mid_push();
#endif
  std::fprintf(stderr, "fork_child: %s\n", bad == 0 ? "ok" : "FAILED");
  return bad == 0 ? 0 : 1;
}
