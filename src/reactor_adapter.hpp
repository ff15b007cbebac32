// The reactor adapter: the one part of the pool's engine that runs Asio's scheduler (its
// private API is behind detail/asio_internals.hpp). The pool registers Asio's scheduler in
// itself with no thread of its own (scheduled_thread_pool.cpp), so that sockets, timers
// and streams made on the pool find their reactor; the pool's idle workers wait in it and
// its busy workers poll it (pool_reactor.cpp decides who, when).
#ifndef METRONOME_SRC_REACTOR_ADAPTER_HPP
#define METRONOME_SRC_REACTOR_ADAPTER_HPP

#include <metronome/detail/asio.hpp>
#include <metronome/detail/asio_internals.hpp>
#include <metronome/options.hpp>

#include <atomic>
#include <chrono>
#include <memory>

namespace metronome::detail {

// A timer of the reactor (a timerfd under epoll: as precise as a condition variable,
// where epoll's own timeout counts milliseconds): it ends a wait in the reactor at the
// pool's earliest due time. Its completion does nothing but end the wait. Made by the
// owner of the adapter (the pool's times on an executor that tracks no work, so that a
// far-off due time keeps no join() waiting).
class reactor_timer {
public:
  virtual ~reactor_timer() = default;
  // Arms the timer for `due`, or disarms it (time_point::max()). May throw (no memory).
  virtual void arm(clock::time_point due) = 0;
};

// The role: at most one worker at a time holds the reactor, to wait in it (parked) or to
// poll it (busy, between two tasks). Invariant: the role is taken and given up under the
// pool mutex (take, leave, holder), and only its holder runs the reactor and touches the
// timer (wait, poll); held() reads the role without the mutex, as a hint. An interrupt
// made before the holder enters its wait still ends that wait (Asio's interrupter is
// edge-triggered and re-armed by the interrupt).
class reactor_adapter {
public:
  // A busy worker polls when nobody holds the role and the reactor has not run for this
  // long: an I/O completion waits at most that long plus one task.
  static constexpr clock::rep poll_interval = std::chrono::nanoseconds(std::chrono::microseconds(200)).count();
  using timer_factory = std::unique_ptr<reactor_timer> (*)(net::execution_context& ctx);

  reactor_adapter() = default;
  reactor_adapter(const reactor_adapter&) = delete;
  reactor_adapter& operator=(const reactor_adapter&) = delete;
  ~reactor_adapter() { release(); }

  // Once, before any I/O object exists: registers Asio's scheduler in `ctx` with no
  // thread of its own and one unit of work never finished (so that it never stops for
  // lack of work between sockets). The scheduler calls `get_task` when the first I/O
  // object asks for the reactor; it returns reactor_of(ctx), after attach(). `hint`: the
  // concurrency hint (1: Asio's single-thread shortcuts). `make_timer(ctx)` makes the
  // reactor's timer when a wait first needs one. May throw (no memory).
  void install(net::execution_context& ctx, int hint, asio_internals::get_task_function get_task,
               timer_factory make_timer) {
    asio_internals::scheduler& io = asio_internals::make_scheduler(ctx, hint, get_task);
    io.work_started();
    io_ = &io;
    ctx_ = &ctx;
    make_timer_ = make_timer;
  }
  static asio_internals::scheduler_task& reactor_of(net::execution_context& ctx) {
    return *asio_internals::reactor_of(ctx);
  }
  // The scheduler asked for its reactor (the first I/O object): it exists from now on.
  void attach(asio_internals::scheduler_task& reactor) noexcept { reactor_.store(&reactor, std::memory_order_relaxed); }
  bool exists() const noexcept { return reactor_.load(std::memory_order_relaxed) != nullptr; }

  // ---- The role (pool mutex held).
  // The holder: an identity only (a worker of the pool), never dereferenced.
  const void* holder() const noexcept { return holder_; }
  void take(const void* w) noexcept {
    holder_ = w;
    held_.store(true, std::memory_order_relaxed);
  }
  void leave() noexcept {
    holder_ = nullptr;
    held_.store(false, std::memory_order_relaxed);
  }
  // Ends the holder's wait, unless nobody holds the role or the caller does (it looks
  // again after the completion it runs).
  void interrupt_unless(const void* self) noexcept {
    if (holder_ == nullptr || holder_ == self) return;
    asio_internals::interrupt(*reactor_.load(std::memory_order_relaxed));
  }

  // ---- Without the mutex.
  bool held() const noexcept { return held_.load(std::memory_order_relaxed); }
  // Whether a busy worker should poll at `now` (nanoseconds of the pool's clock).
  bool poll_due(clock::rep now) const noexcept {
    return !held() && now - ran_at_.load(std::memory_order_relaxed) >= poll_interval;
  }

  // The holder: times `due` (max(): nothing), waits for one completion (the timer's, or
  // I/O) and runs it, then every other one already ready, on this thread. Rethrows what a
  // completion handler throws, or the timer's std::bad_alloc.
  void wait(clock::time_point due);
  // The holder: runs the reactor once without blocking, and every completion ready.
  void poll();

  // Before the pool's services shut down (the timer's service among them).
  void release() noexcept { timer_.reset(); }

private:
  void after_run(bool threw) noexcept;

  asio_internals::scheduler* io_ = nullptr;
  net::execution_context* ctx_ = nullptr;
  timer_factory make_timer_ = nullptr;
  // Read by busy workers between tasks: a line of their own, away from the pool's parking
  // counters that every wake-up writes.
  alignas(64) std::atomic<asio_internals::scheduler_task*> reactor_{nullptr};
  std::atomic<bool> held_{false};       // holder_ != nullptr, for a look without the mutex
  std::atomic<clock::rep> ran_at_{0};   // when the reactor last ran (written by the holder)
  alignas(64) const void* holder_ = nullptr; // the pool mutex
  // The holder's alone.
  std::unique_ptr<reactor_timer> timer_;
  clock::time_point timer_due_ = clock::time_point::max();
};

} // namespace metronome::detail

#endif
