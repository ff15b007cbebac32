#ifndef METRONOME_TEST_IO_CHURN_HPP
#define METRONOME_TEST_IO_CHURN_HPP

#include <metronome/detail/asio.hpp>

#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <sched.h>
#include <thread>

namespace metronome::test {

// Keeps the calling thread, and every thread started while it lives (a pool's workers,
// a wheel's thread), on one CPU. There a thread that wakes another is usually
// preempted by it at once, so an interleaving that needs the waker to fall behind
// happens nearly every time instead of now and then. Gives the CPUs back at the end.
class on_one_cpu {
public:
  on_one_cpu() noexcept {
    if (::sched_getaffinity(0, sizeof saved_, &saved_) != 0) return;
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &saved_)) {
        CPU_SET(c, &one);
        break;
      }
    pinned_ = ::sched_setaffinity(0, sizeof one, &one) == 0;
  }
  on_one_cpu(const on_one_cpu&) = delete;
  on_one_cpu& operator=(const on_one_cpu&) = delete;
  ~on_one_cpu() {
    if (pinned_) ::sched_setaffinity(0, sizeof saved_, &saved_);
  }

private:
  cpu_set_t saved_{};
  bool pinned_ = false;
};

// Asio's rule for a handler completed on another executor: the operation holds work on
// that executor until the executor has taken the completion, and lets go right after,
// on the completing thread. Here each of `n` operations completes onto a fresh
// io_context run by a thread of its own; the test lets go of its own work guard once
// the handler ran, and destroys the io_context the moment run() has returned for want
// of work. Work let go earlier (before the post) would let run() return before the
// handler ran, and the round hangs; work let go later (in the handler's context) lets
// run() return, and the io_context be destroyed, while the completing thread is still
// inside its post, about to signal the io_context's condition variable: ThreadSanitizer
// reports it, and the io_context is on the heap so that AddressSanitizer sees any later
// touch. Declare an on_one_cpu before the pool: the completing pool thread, preempted
// by the io thread it wakes, then falls behind the io_context's destruction nearly
// every round (on two free CPUs, rarely).
// `start(io, ran)` starts one operation whose handler, bound to `io`, calls `ran()`.
template <class Start>
void complete_onto_dying_io_contexts(int n, Start start) {
  // One runner thread serves the io_contexts in turn (a thread per round is slow under
  // the sanitizers).
  std::mutex m;
  std::condition_variable cv;
  metronome::net::io_context* to_run = nullptr; // handed to the runner; null again once run() returned
  bool finished = false;
  std::thread runner([&] {
    std::unique_lock lk(m);
    for (;;) {
      cv.wait(lk, [&] { return to_run || finished; });
      if (!to_run) return;
      lk.unlock();
      to_run->run();
      lk.lock();
      to_run = nullptr;
      cv.notify_all();
    }
  });
  for (int i = 0; i < n; ++i) {
    auto io = std::make_unique<metronome::net::io_context>();
    auto guard = metronome::net::make_work_guard(*io);
    {
      std::lock_guard lk(m);
      to_run = io.get();
    }
    cv.notify_all();
    std::promise<void> ran;
    start(*io, std::function<void()>([&ran] { ran.set_value(); }));
    ran.get_future().get();
    guard.reset(); // now only the operation's work keeps run() going
    {
      std::unique_lock lk(m);
      cv.wait(lk, [&] { return to_run == nullptr; });
    }
    io.reset();
  }
  {
    std::lock_guard lk(m);
    finished = true;
  }
  cv.notify_all();
  runner.join();
}

} // namespace metronome::test

#endif
