// I/O on the pool's workers: who waits in the reactor (a parked worker), who polls it (a
// busy one), and the pool's side of its reactor adapter (reactor_adapter.hpp: the runs of
// Asio's scheduler).
#include "pool_engine.hpp"
#include <metronome/detail/pool_locator.hpp>
#include <metronome/detail/test_hooks.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include "pool_internal.hpp"

#include <metronome/detail/asio.hpp>

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

// The pool's reactor timer: on an executor of the pool that tracks no work.
std::unique_ptr<reactor_timer> make_pool_reactor_timer(net::execution_context& pool) {
  class pool_timer final : public reactor_timer {
  public:
    explicit pool_timer(scheduled_thread_pool& pool) : timer_(untracked_executor(pool.get_executor())) {}
    void arm(clock::time_point due) override {
      if (due == clock::time_point::max()) {
        timer_.cancel();
        return;
      }
      timer_.expires_at(due); // a wait still pending completes with operation_aborted: a no-op
      timer_.async_wait([](const error_code&) {}); // its completion ends the reactor's wait
    }

  private:
    net::basic_waitable_timer<clock, net::wait_traits<clock>, untracked_executor> timer_;
  };
  return std::make_unique<pool_timer>(static_cast<scheduled_thread_pool&>(pool));
}

// Asio's scheduler asks for its reactor when the first I/O object is made on the pool:
// the pool's workers start waiting in it from then on.
asio_internals::scheduler_task* pool_reactor_of(net::execution_context& ctx) {
  asio_internals::scheduler_task& reactor = reactor_adapter::reactor_of(ctx);
  if (pool_core* core = pool_locator::find(ctx)) engine(core)->attach_reactor(reactor);
  return &reactor;
}

} // namespace

void pool_engine::attach_io(net::execution_context& pool, int concurrency_hint) {
  reactor_.install(pool, concurrency_hint, &pool_reactor_of, &make_pool_reactor_timer);
}

// ---------------------------------------------------------------- the reactor

// The reactor invariant: while a reactor exists, a worker that parks with no leader
// needed takes the reactor role if it is free (park()), and every wake-up that would
// notify a condition variable nobody waits on interrupts the reactor instead
// (wake_some, wake_all, wake_for_new_head, park's hand-off): the
// role is taken and given up under mtx_, and an interrupt made before the waiter enters
// epoll_wait still ends that wait (Asio's interrupter is edge-triggered and re-armed by
// the interrupt). Stop-here test: hook reactor_before_wait (test/unit/scheduled_thread_pool/io.cpp).
void pool_engine::attach_reactor(asio_internals::scheduler_task& reactor) noexcept {
  std::unique_lock lk(mtx_); // (the scheduler's mutex is held: its lock comes before ours)
  reactor_.attach(reactor);
  wake_some(lk, 1); // a worker parked on a condition variable moves into the reactor
}

void pool_engine::interrupt_reactor(const held_lock& lk) noexcept {
  assert_held(lk, mtx_);
  reactor_.interrupt_unless(this_worker);
}

void pool_engine::park_in_reactor(worker& w, std::unique_lock<std::mutex>& lk, bool times_heap) {
  reactor_.take(&w);
  clock::time_point due = clock::time_point::max();
  if (times_heap) {
    parking_.lead(&w);
    due = heap_.top()->due();
  }
  --awake_;
  lk.unlock();
  METRONOME_TEST_HOOK(hook_point::reactor_before_wait);
  try {
    reactor_.wait(due);
  } catch (...) {
    report(std::current_exception()); // a completion handler threw, or no memory to arm the timer
  }
  lk.lock();
  ++awake_;
  parking_.stop_leading(&w);
  reactor_.leave();
}

// ---------------------------------------------------------------- fairness under load

// A worker waits in the reactor only when it parks; a pool whose workers never run out
// of tasks (handlers that re-post themselves, the usual way to slice a long computation)
// would leave I/O completions unrun until the load stops. Asio's scheduler puts its
// reactor back in the queue on each pass, Tokio polls its driver every 61 tasks
// (event_interval). Here, a worker between two tasks polls the reactor, without
// blocking, when nobody holds the reactor role and it has not run for
// reactor_adapter::poll_interval (200 us): an I/O completion waits at most that long plus
// one task. A time, not a task count: where workers park often (a service that is mostly
// I/O) the reactor runs anyway and nobody polls; where tasks are long, 61 of them would be
// far too long. A pool with no I/O object pays a counter per task (worker_main); one with
// a reactor, a relaxed load while a waiter holds the role, and a clock read while nobody
// does.
void pool_engine::poll_reactor_if_due(worker& w) noexcept {
  if (reactor_.held()) return; // a waiter runs completions as they come
  if (!reactor_.poll_due(clock::now().time_since_epoch().count())) return;
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
    if (reactor_.holder() != nullptr || state_.terminated()) return;
    reactor_.take(&w);
  }
  METRONOME_TEST_HOOK(hook_point::reactor_in_poll);
  try {
    reactor_.poll();
  } catch (...) {
    report(std::current_exception()); // a completion handler threw
  }
  {
    std::unique_lock lk(mtx_);
    reactor_.leave();
    if (parking_.has_unwoken_follower() || parking_.leader() != nullptr) wake_some(lk, 1); // into the reactor
  }
  METRONOME_TEST_HOOK(hook_point::reactor_after_poll);
}

void pool_engine::release_io() noexcept {
  // Before the pool's services (the reactor's timer service among them) shut down.
  reactor_.release();
}

} // namespace metronome::detail
