// The pool's reactor: Asio's scheduler registered in the pool (scheduled_thread_pool.cpp)
// with no thread of its own, run by a parked worker (the reactor role of park()).
#include "pool_engine.hpp"
#include <metronome/detail/test_hooks.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include "pool_internal.hpp"

#include <metronome/detail/asio.hpp>
#include <metronome/detail/asio_internals.hpp>

#include <utility>

namespace metronome::detail {

namespace {

// The pool's executor, except that work it is asked to track is not tracked: the reactor
// timer's pending wait must not keep the pool from terminating (join() would wait for a
// far-off delayed task's due time).
class untracked_executor {
public:
  explicit untracked_executor(scheduled_thread_pool::executor_type ex) noexcept : ex_(std::move(ex)) {}
  scheduled_thread_pool& query(net::execution::context_t) const noexcept {
    return net::query(ex_, net::execution::context);
  }
  static constexpr net::execution::blocking_t query(net::execution::blocking_t) noexcept {
    return net::execution::blocking.possibly;
  }
  template <class F>
  void execute(F&& f) const {
    ex_.execute(std::forward<F>(f));
  }
  [[maybe_unused]] friend bool operator==(const untracked_executor& a, const untracked_executor& b) noexcept { return a.ex_ == b.ex_; }
  [[maybe_unused]] friend bool operator!=(const untracked_executor& a, const untracked_executor& b) noexcept { return a.ex_ != b.ex_; }

private:
  scheduled_thread_pool::executor_type ex_;
};

} // namespace

struct reactor_timer {
  explicit reactor_timer(scheduled_thread_pool& pool) : timer(untracked_executor(pool.get_executor())) {}
  net::basic_waitable_timer<clock, net::wait_traits<clock>, untracked_executor> timer;
};

reactor_timer* make_reactor_timer(pool_engine& core) {
  auto* ctx = const_cast<net::execution_context*>(core.context());
  return new reactor_timer(*static_cast<scheduled_thread_pool*>(ctx));
}

void arm_reactor_timer(reactor_timer& t, clock::time_point due) {
  if (due == clock::time_point::max()) {
    t.timer.cancel();
    return;
  }
  t.timer.expires_at(due); // a wait still pending completes with operation_aborted: a no-op
  t.timer.async_wait([](const error_code&) {}); // its completion ends wait_one()
}

void destroy_reactor_timer(reactor_timer* t) noexcept { delete t; }

// ---------------------------------------------------------------- the reactor

// The reactor invariant: while a reactor exists, a worker that parks with no leader
// needed takes the reactor role if it is free (park()), and every wake-up that would
// notify a condition variable nobody waits on interrupts the reactor instead
// (wake_some, wake_all, wake_for_new_head, park's hand-off): the
// role is taken and given up under mtx_, and an interrupt made before the waiter enters
// epoll_wait still ends that wait (Asio's interrupter is edge-triggered and re-armed by
// the interrupt). Stop-here test: hook reactor_before_wait (test/unit/scheduled_thread_pool/io.cpp).
void pool_engine::attach_reactor(asio_internals::scheduler_task* reactor) noexcept {
  std::unique_lock lk(mtx_); // (the scheduler's mutex is held: its lock comes before ours)
  reactor_.store(reactor, std::memory_order_relaxed);
  wake_some(lk, 1); // a worker parked on a condition variable moves into the reactor
}

void pool_engine::interrupt_reactor(const held_lock& lk) noexcept {
  assert_held(lk, mtx_);
  if (reactor_waiter_ == nullptr || reactor_waiter_ == this_worker) return; // (itself: it looks again after its completion)
  asio_internals::interrupt(*reactor_.load(std::memory_order_relaxed));
}

void pool_engine::take_reactor_role(worker& w, const held_lock& lk) noexcept {
  assert_held(lk, mtx_);
  reactor_waiter_ = &w;
  reactor_held_.store(true, std::memory_order_relaxed);
}

void pool_engine::leave_reactor_role(const held_lock& lk) noexcept {
  assert_held(lk, mtx_);
  reactor_waiter_ = nullptr;
  reactor_held_.store(false, std::memory_order_relaxed);
}

// What every run of the reactor leaves behind, by the worker holding the role: a timer
// that expired meanwhile (its completion may have run in a poll) must be armed again for
// a head due at the same time; a throw leaves the timer's state unknown.
void pool_engine::after_reactor_run(bool threw) noexcept {
  const clock::time_point now = clock::now();
  reactor_ran_at_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  if (threw || (reactor_timer_due_ != clock::time_point::max() && now >= reactor_timer_due_))
    reactor_timer_due_ = clock::time_point::min();
}

void pool_engine::park_in_reactor(worker& w, std::unique_lock<std::mutex>& lk, bool times_heap) {
  take_reactor_role(w, lk);
  clock::time_point due = clock::time_point::max();
  if (times_heap) {
    leader_ = &w;
    due = heap_.top()->due();
  }
  --awake_;
  lk.unlock();
  METRONOME_TEST_HOOK(hook_point::reactor_before_wait);
  try {
    // The heap's head is timed by a timer of the reactor (a timerfd: as precise as the
    // condition variable, where epoll's own timeout counts milliseconds). Only the
    // worker holding the role touches it.
    if (due != reactor_timer_due_) {
      if (!reactor_timer_) reactor_timer_ = make_reactor_timer(*this);
      arm_reactor_timer(*reactor_timer_, due);
      reactor_timer_due_ = due;
    }
    // One completion (the timer's, or I/O), on this worker; then every other one already
    // ready, in one go (poll(): no blocking), before the pool's queues are looked at again.
    asio_internals::run_ready(*io_);
    after_reactor_run(false);
  } catch (...) {
    report(std::current_exception()); // a completion handler threw, or no memory to arm the timer
    after_reactor_run(true);
  }
  lk.lock();
  ++awake_;
  if (leader_ == &w) leader_ = nullptr;
  leave_reactor_role(lk);
}

// ---------------------------------------------------------------- fairness under load

// A worker waits in the reactor only when it parks; a pool whose workers never run out
// of tasks (handlers that re-post themselves, the usual way to slice a long computation)
// would leave I/O completions unrun until the load stops. Asio's scheduler puts its
// reactor back in the queue on each pass, Tokio polls its driver every 61 tasks
// (event_interval). Here, a worker between two tasks polls the reactor, without
// blocking, when nobody holds the reactor role and it has not run for io_poll_interval:
// an I/O completion waits at most that long plus one task. A time, not a task count:
// where workers park often (a service that is mostly I/O) the reactor runs anyway and
// nobody polls; where tasks are long, 61 of them would be far too long. A pool with no
// I/O object pays a counter per task (worker_main); one with a reactor, a relaxed load
// while a waiter holds the role, and a clock read while nobody does.
namespace {
constexpr clock::rep io_poll_interval = std::chrono::nanoseconds(std::chrono::microseconds(200)).count();
} // namespace

void pool_engine::poll_reactor_if_due(worker& w) noexcept {
  if (reactor_held_.load(std::memory_order_relaxed)) return; // a waiter runs completions as they come
  if (clock::now().time_since_epoch().count() - reactor_ran_at_.load(std::memory_order_relaxed) < io_poll_interval)
    return;
  poll_reactor(w);
}

// The hand-over invariant: the poller takes the reactor role under mtx_ exactly as a
// parking worker does (only if nobody holds it), so no worker waits in the reactor while
// it polls; a worker that parks meanwhile waits on a condition variable instead. Giving
// the role back, the poller wakes one such worker, which takes the role (park()): while
// a reactor exists and a worker is parked, one parked worker is in the reactor. The
// poller stays counted awake, so the pool cannot terminate under it (terminate() needs
// an idle pool). Stop-here test: hook reactor_in_poll
// (test/unit/scheduled_thread_pool/io.cpp).
void pool_engine::poll_reactor(worker& w) noexcept {
  {
    std::unique_lock lk(mtx_);
    if (reactor_waiter_ != nullptr || state_.terminated()) return;
    take_reactor_role(w, lk);
  }
  METRONOME_TEST_HOOK(hook_point::reactor_in_poll);
  try {
    asio_internals::poll_ready(*io_);
    after_reactor_run(false);
  } catch (...) {
    report(std::current_exception()); // a completion handler threw
    after_reactor_run(true);
  }
  {
    std::unique_lock lk(mtx_);
    leave_reactor_role(lk);
    if (followers_ > wake_tokens_ || leader_ != nullptr) wake_some(lk, 1); // into the reactor
  }
  METRONOME_TEST_HOOK(hook_point::reactor_after_poll);
}


void pool_engine::release_io() noexcept {
  // Before the pool's services (the reactor's timer service among them) shut down.
  destroy_reactor_timer(reactor_timer_);
  reactor_timer_ = nullptr;
}

} // namespace metronome::detail
