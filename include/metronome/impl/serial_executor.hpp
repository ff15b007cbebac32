// Template bodies of serial_executor (its shared state, submission, execute and dispatch).
#ifndef METRONOME_IMPL_SERIAL_EXECUTOR_HPP
#define METRONOME_IMPL_SERIAL_EXECUTOR_HPP

#include <metronome/detail/executor_op.hpp>
#include <metronome/detail/internal_post.hpp>
#include <metronome/detail/node_cache.hpp>
#include <metronome/detail/serial_core.hpp>

#include <metronome/detail/asio.hpp>

#include <concepts>
#include <exception>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <optional>
#include <mutex>
#include <utility>

namespace metronome {

namespace detail {

template <class Executor>
class serial_state final : public serial_core {
public:
  serial_state(const Executor& ex, serial_options opts, pool_core& timers, pool_core* owner)
      : serial_core(std::move(opts), timers, owner), inner_(ex) {}
  const Executor& inner() const noexcept { return inner_; }

  // Work held on the underlying executor for the tracked copies of this serial executor
  // (and the Networking-TS work count): one tracked copy of the underlying executor while
  // any is held, as each of a strand's tracked copies holds one. Under a mutex of its own:
  // the first taker makes it and the last one lets it go, never racing each other.
  void work_started() noexcept {
    if constexpr (has_tracked_) {
      std::lock_guard lk(work_mtx_);
      if (work_count_++ == 0) work_.emplace(net::prefer(inner_, net::execution::outstanding_work.tracked));
    }
  }
  void work_finished() noexcept {
    if constexpr (has_tracked_) {
      std::optional<tracked_executor> gone; // destroyed outside the mutex
      std::lock_guard lk(work_mtx_);
      if (--work_count_ == 0) gone.swap(work_);
    }
  }

private:
  void post_drain(drain_post how) noexcept override {
    if constexpr (std::is_same_v<Executor, scheduled_thread_pool::executor_type>) {
      post_drain_to_pool(*pool_of(inner_), how);
    } else {
      try {
        // Internal work too, as on a pool: behind a type-erased or wrapped executor
        // (any_io_executor, a strand) may be a shut-down metronome pool, which would
        // drop the drain as outside work - and with it delayed tasks accepted before the
        // shutdown, their handles never completed.
        internal_post_scope internal;
        net::post(inner_, drain_job{shared_from_this()});
      } catch (...) {
        report(std::current_exception());
      }
    }
  }

  bool inner_running_in_this_thread() const noexcept override {
    if constexpr (requires { { inner_.running_in_this_thread() } -> std::convertible_to<bool>; })
      return inner_.running_in_this_thread();
    else
      return false;
  }

  static constexpr bool has_tracked_ =
      requires(const Executor& e) { net::prefer(e, net::execution::outstanding_work.tracked); };
  template <class E>
  struct tracked_of {
    using type = std::decay_t<decltype(net::prefer(std::declval<const E&>(), net::execution::outstanding_work.tracked))>;
  };
  using tracked_executor = typename std::conditional_t<has_tracked_, tracked_of<Executor>, std::type_identity<Executor>>::type;

  Executor inner_;
  std::mutex work_mtx_;
  std::size_t work_count_ = 0;
  std::optional<tracked_executor> work_;
};

} // namespace detail

template <class Executor>
inline serial_executor<Executor>::serial_executor(from_inner, const Executor& ex, serial_options opts) {
  detail::pool_core* owner = detail::pool_of(ex);
  detail::pool_core& timers = owner ? *owner : detail::pool_core_of(ex);
  state_ = std::make_shared<detail::serial_state<Executor>>(ex, std::move(opts), timers, owner);
}

template <class Executor>
template <class F>
inline auto serial_executor<Executor>::submit(F&& f) const {
  using R = std::invoke_result_t<std::decay_t<F>&>;
  auto* t = new_task<R>(std::forward<F>(f), detail::task_kind::one_shot);
  return start<R>(t, clock::time_point::min()); // due now: behind serial tasks already due
}

template <class Executor>
template <class F, class Rep, class Period>
inline auto serial_executor<Executor>::schedule(F&& f, std::chrono::duration<Rep, Period> delay) const {
  using R = std::invoke_result_t<std::decay_t<F>&>;
  auto* t = new_task<R>(std::forward<F>(f), detail::task_kind::one_shot, detail::node_lifetime::timed);
  return start<R>(t, detail::saturating_add(state_->timers().now(), delay));
}

template <class Executor>
inline serial_executor<Executor>::serial_executor(const serial_executor& o) noexcept
    : state_(o.state_), blocking_never_(o.blocking_never_), tracked_(o.tracked_) {
  if (tracked_) state_->work_started();
}

template <class Executor>
inline serial_executor<Executor>::serial_executor(serial_executor&& o) noexcept
    : state_(std::move(o.state_)), blocking_never_(o.blocking_never_), tracked_(std::exchange(o.tracked_, false)) {}

template <class Executor>
inline serial_executor<Executor>& serial_executor<Executor>::operator=(serial_executor o) noexcept {
  std::swap(state_, o.state_);
  std::swap(blocking_never_, o.blocking_never_);
  std::swap(tracked_, o.tracked_);
  return *this;
}

template <class Executor>
inline serial_executor<Executor>::~serial_executor() {
  if (tracked_) state_->work_finished();
}

template <class Executor>
inline serial_executor<Executor> serial_executor<Executor>::prefer(
    net::execution::outstanding_work_t::tracked_t) const& noexcept {
  serial_executor s(*this);
  if (!s.tracked_) {
    s.state_->work_started();
    s.tracked_ = true;
  }
  return s;
}

template <class Executor>
inline serial_executor<Executor> serial_executor<Executor>::prefer(
    net::execution::outstanding_work_t::untracked_t) const& noexcept {
  serial_executor s(*this);
  if (s.tracked_) {
    s.state_->work_finished();
    s.tracked_ = false;
  }
  return s;
}

template <class Executor>
inline serial_executor<Executor> serial_executor<Executor>::require(net::execution::blocking_t::never_t) const& noexcept {
  return with_blocking_never(serial_executor(*this), true);
}
template <class Executor>
inline serial_executor<Executor> serial_executor<Executor>::require(net::execution::blocking_t::never_t) && noexcept {
  return with_blocking_never(std::move(*this), true);
}
template <class Executor>
inline serial_executor<Executor> serial_executor<Executor>::require(net::execution::blocking_t::possibly_t) const& noexcept {
  return with_blocking_never(serial_executor(*this), false);
}
template <class Executor>
inline serial_executor<Executor> serial_executor<Executor>::require(net::execution::blocking_t::possibly_t) && noexcept {
  return with_blocking_never(std::move(*this), false);
}

template <class Executor>
inline net::execution::blocking_t serial_executor<Executor>::query(net::execution::blocking_t) const noexcept {
  return blocking_never_ ? net::execution::blocking_t(net::execution::blocking.never)
                         : net::execution::blocking_t(net::execution::blocking.possibly);
}

template <class Executor>
template <class Function>
inline void serial_executor<Executor>::execute(Function&& f) const {
  if (!blocking_never_ && state_->running_in_this_thread()) {
    std::decay_t<Function> tmp(std::forward<Function>(f));
    std::move(tmp)();
    return;
  }
  enqueue_op(std::forward<Function>(f), !blocking_never_);
}

template <class Executor>
template <class Function, class Allocator>
inline void serial_executor<Executor>::dispatch(Function&& f, const Allocator&) const {
  if (state_->running_in_this_thread()) {
    std::decay_t<Function> tmp(std::forward<Function>(f));
    std::move(tmp)();
    return;
  }
  enqueue_op(std::forward<Function>(f), true);
}

template <class Executor>
template <class R, class F>
inline detail::scheduled_task_base* serial_executor<Executor>::new_task(F&& f, detail::task_kind kind,
                                                                       detail::node_lifetime lifetime) const {
  if (state_->is_disposed()) throw rejected_execution("metronome: serial_executor is disposed");
  if (state_->refuses_outside_work()) {
    state_->note_rejected();
    throw rejected_execution("metronome: the pool under this serial_executor is shut down");
  }
  // A callable bound to an executor of its own (bind_executor) is handed there when its
  // turn comes in this executor's order, and runs there (a bound task, as on the pool).
  auto* t = detail::make_scheduled_task<R, true, detail::has_own_executor<std::decay_t<F>>>(
      &state_->timers(), std::forward<F>(f), kind, lifetime);
  t->extras().sink = state_;
  return t;
}

template <class Executor>
inline detail::scheduled_task_base* serial_executor<Executor>::adopt(detail::scheduled_task_base* t) noexcept {
  t->add_ref();
  return t;
}

template <class Executor>
inline void serial_executor<Executor>::reject(detail::scheduled_task_base* t) const {
  t->finish_cancelled();
  t->release();
  throw rejected_execution("metronome: serial_executor is disposed");
}

template <class Executor>
template <class R>
inline scheduled_future<R> serial_executor<Executor>::start(detail::scheduled_task_base* t, clock::time_point due) const {
  scheduled_future<R> h(adopt(t));
  const clock::time_point now = state_->timers().now();
  if (due <= now) {
    state_->timers().promote_due_before(now); // behind serial tasks already due
    t->set_due(now);
    if (!state_->try_enqueue(t)) reject(t);
    return h;
  }
  state_->track(t);
  if (state_->is_disposed()) { // raced with dispose(): it may not have seen us
    reject(t);
  }
  state_->timers().submit_scheduled(t, due, now);
  return h;
}

template <class Executor>
template <class F, class Rep1, class Period1, class Rep2, class Period2>
inline scheduled_future<void> serial_executor<Executor>::periodic(F&& f, std::chrono::duration<Rep1, Period1> initial,
                                                           std::chrono::duration<Rep2, Period2> period,
                                                           bool fixed_delay, periodic_options options) const {
  const clock::duration p = detail::checked_period(period);
  detail::check_jitter(options);
  auto* t = new_task<void>(std::forward<F>(f), detail::task_kind::periodic, detail::node_lifetime::timed);
  t->extras().period = p;
  t->extras().fixed_delay = fixed_delay;
  t->extras().periodic = options;
  scheduled_future<void> h(adopt(t));
  state_->track(t);
  if (state_->is_disposed()) reject(t);
  const clock::time_point now = state_->timers().now();
  const clock::time_point due = detail::saturating_add(now, initial);
  if (due <= now) {
    state_->timers().promote_due_before(now);
    t->set_due(now);
    if (!state_->try_enqueue(t)) reject(t);
    return h;
  }
  state_->timers().submit_scheduled(t, due, now);
  return h;
}

template <class Executor>
template <class Function>
inline void serial_executor<Executor>::enqueue_op(Function&& f, bool may_run_here) const {
  using F = std::decay_t<Function>;
  if (detail::is_empty_callable(f)) {
    state_->report(std::make_exception_ptr(std::invalid_argument("metronome: empty function")));
    return;
  }
  // As the pool underneath refuses outside work after shutdown - but not the library's
  // completion of work already accepted (a handle's async_wait ended by cancel() or
  // shutdown() on another thread), which the pool and a strand over it take.
  if (!detail::internal_post_scope::active() && state_->refuses_outside_work()) {
    state_->note_rejected();
    state_->report_dropped(std::make_exception_ptr(
        rejected_execution("metronome: work dropped: the pool under this serial_executor is shut down")));
    return;
  }
  detail::task_base* op =
      detail::executor_op<F, detail::recycling_allocator<void>>::create(std::forward<Function>(f), {});
  if (!state_->try_enqueue(op, may_run_here)) {
    op->complete(false);
    state_->report_refused();
  }
}

template <class Executor>
inline serial_executor<Executor> serial_executor<Executor>::with_blocking_never(serial_executor&& s, bool never) noexcept {
  s.blocking_never_ = never;
  return std::move(s);
}

} // namespace metronome

#endif
