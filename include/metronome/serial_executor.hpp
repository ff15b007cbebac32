// serial_executor: ordered (strand-like) execution over any Asio executor, with delayed
// work.
#ifndef METRONOME_SERIAL_EXECUTOR_HPP
#define METRONOME_SERIAL_EXECUTOR_HPP

#include <metronome/detail/pool_of.hpp>
#include <metronome/detail/serial_properties.hpp>
#include <metronome/detail/timing_of.hpp>
#include <metronome/errors.hpp>
#include <metronome/scheduled_future.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/detail/asio.hpp>

#include <concepts>
#include <memory>
#include <type_traits>
#include <utility>

namespace metronome {

namespace detail {

template <class Executor>
class serial_state;

} // namespace detail

template <class Executor>
class serial_scheduler; // metronome/execution.hpp

/// An ordered ("serial", strand-like) executor over any Asio executor: RxJava's
/// ExecutorScheduler worker done the Asio way.
/**
 * Guarantees: tasks submitted from one thread run in submission order; at most one
 * task of a serial executor runs at a time; each task happens-before the next. After
 * `serial_options::batch` tasks in one turn the drain re-posts itself to the
 * underlying executor, so many serial executors share a pool fairly.
 *
 * It is itself a standard Asio executor (and keeps the Networking-TS members), so
 * `asio::post(serial, f)`, `co_spawn(serial, ...)` and `bind_executor(serial, h)` work.
 * `execute` with `blocking.possibly` (`asio::dispatch`, an I/O completion) runs inline
 * from inside this serial executor's own drain (`running_in_this_thread()`), and also
 * when nothing of it is queued or running and the calling thread runs work of the
 * underlying executor (its `running_in_this_thread()`): the drain starts right there,
 * as an Asio strand's dispatch does. Otherwise, and always with `blocking.never`
 * (`asio::post`), it queues.
 *
 * Delayed work (`schedule`, `schedule_at_fixed_rate`, `schedule_with_fixed_delay`)
 * waits in the delay queue of the metronome pool underneath (or of the underlying
 * context's timing service, run by its threads) and joins this executor's queue when
 * due; a callable bound to another executor (`bind_executor`) is handed there in its turn.
 *
 * `dispose()` cancels everything this executor still holds — queued and delayed
 * tasks, periodic tasks (a run in progress completes) — and rejects later work,
 * without touching the underlying executor or other serial executors.
 *
 * Copies share state; equality is by state.
 *
 * @par Thread Safety
 * All members are safe to call concurrently.
 */
template <class Executor>
class serial_executor {
public:
  /// The executor the drains run on.
  using inner_executor_type = Executor;

  /// A serial executor over `ex` (convertible to `Executor`). @throws std::invalid_argument if `opts.batch` is 0.
  template <class Ex> // never for a copy, checked first (as asio::strand): see the test over any_io_executor
    requires(!std::is_same_v<Ex, serial_executor>) && std::is_convertible_v<const Ex&, Executor>
  explicit serial_executor(const Ex& ex, serial_options o = {}) : serial_executor(from_inner{}, ex, std::move(o)) {}

  serial_executor(const serial_executor& o) noexcept;            ///< Shares the state; a tracked copy holds work too.
  serial_executor(serial_executor&& o) noexcept;                 ///< Takes the state and the work held.
  serial_executor& operator=(serial_executor o) noexcept;       ///< Copy or move assignment.
  ~serial_executor();                                            ///< Lets go of the work held, if tracked.

  /// The executor the drains run on.
  const Executor& get_inner_executor() const noexcept { return state_->inner(); }

  /// Whether the calling thread is running a task of this serial executor.
  bool running_in_this_thread() const noexcept { return state_->running_in_this_thread(); }

  // ---- typed API (handles as on the pool). Each call throws rejected_execution after
  // dispose() and once the metronome pool under it is shut down, whatever that pool's
  // rejection_policy (docs/semantics.md, "Rejection"); max_queued does not count it.

  /// Queues `f`; @returns its handle. @throws rejected_execution after dispose().
  template <class F>
  auto submit(F&& f) const;

  /// Runs `f` on this serial executor after `delay`. @throws rejected_execution after dispose().
  template <class F, class Rep, class Period>
  auto schedule(F&& f, std::chrono::duration<Rep, Period> delay) const;

  /// Runs `f` on this serial executor at a fixed rate; see scheduled_thread_pool.
  template <class F, class Rep1, class Period1, class Rep2, class Period2>
  scheduled_future<void> schedule_at_fixed_rate(F&& f, std::chrono::duration<Rep1, Period1> initial_delay,
                                                std::chrono::duration<Rep2, Period2> period,
                                                periodic_options options = {}) const {
    return periodic(std::forward<F>(f), initial_delay, period, false, options);
  }

  /// Runs `f` on this serial executor with a fixed delay between runs.
  template <class F, class Rep1, class Period1, class Rep2, class Period2>
  scheduled_future<void> schedule_with_fixed_delay(F&& f, std::chrono::duration<Rep1, Period1> initial_delay,
                                                   std::chrono::duration<Rep2, Period2> delay,
                                                   periodic_options options = {}) const {
    return periodic(std::forward<F>(f), initial_delay, delay, true, options);
  }

  /// Cancels every task this executor holds and rejects later ones. Idempotent.
  /** When it returns, no library thread posts to the underlying executor any more (due
   * delayed work racing it is discarded): call it before destroying that executor's
   * context (an `io_context`) while delayed serial work may still be falling due. */
  void dispose() const noexcept { state_->dispose(); }
  bool is_disposed() const noexcept { return state_->is_disposed(); } ///< Whether dispose() was called.
  /// As a P2300 timed scheduler, in this executor's order (<metronome/execution.hpp>).
  serial_scheduler<Executor> get_scheduler() const noexcept;

  /// @name Asio executor (standard executor properties and execute)
  /// blocking.never / blocking.possibly (`dispatch` runs inline on the executor's own
  /// thread); outstanding_work.tracked: the copy holds work on the underlying executor
  /// while it exists, as a strand's does; relationship and allocator preferences
  /// accepted and ignored; the underlying executor's context.
  ///@{
  // Rvalue overloads move the state: asio::post() applies three of these to a temporary,
  // and each copy is an atomic increment and decrement of the shared state.
  /// The standard executor requirements (Asio's execution properties, `execute`): see the group.
  serial_executor require(net::execution::blocking_t::never_t) const& noexcept;
  serial_executor require(net::execution::blocking_t::never_t) && noexcept;
  serial_executor require(net::execution::blocking_t::possibly_t) const& noexcept;
  serial_executor require(net::execution::blocking_t::possibly_t) && noexcept;
  serial_executor prefer(net::execution::outstanding_work_t::tracked_t) const& noexcept;
  serial_executor prefer(net::execution::outstanding_work_t::untracked_t) const& noexcept;
  // Preferences that change nothing here: fork or continuation, an allocator (a serial
  // executor's nodes come from its underlying executor's).
  template <class Property>
    requires detail::serial_neutral_property<Property>
  serial_executor prefer(Property) const& noexcept {
    return *this;
  }
  template <class Property>
    requires detail::serial_neutral_property<Property>
  serial_executor prefer(Property) && noexcept {
    return std::move(*this);
  }

  decltype(auto) query(net::execution::context_t) const noexcept {
    return net::query(state_->inner(), net::execution::context);
  }
  net::execution::blocking_t query(net::execution::blocking_t) const noexcept;
  static constexpr net::execution::relationship_t query(net::execution::relationship_t) noexcept {
    return net::execution::relationship.fork;
  }
  net::execution::outstanding_work_t query(net::execution::outstanding_work_t) const noexcept {
    return tracked_ ? net::execution::outstanding_work_t(net::execution::outstanding_work.tracked)
                    : net::execution::outstanding_work_t(net::execution::outstanding_work.untracked);
  }
  static constexpr std::allocator<void> query(net::execution::allocator_t<void>) noexcept { return {}; }

  template <class Function>
  void execute(Function&& f) const;

  ///@}

  /// Equal when both are copies of one serial executor (one queue).
  friend bool operator==(const serial_executor& a, const serial_executor& b) noexcept { return a.state_ == b.state_; }
  /// Not equal.
  friend bool operator!=(const serial_executor& a, const serial_executor& b) noexcept { return a.state_ != b.state_; }

  /// @name Networking TS executor (context, work counting, dispatch, post, defer)
  /// The older executor requirements, for code written against them.
  ///@{
  /// The underlying executor's execution context.
  auto& context() const noexcept { return query(net::execution::context); }
  /// Holds work on the underlying executor (until on_work_finished()).
  void on_work_started() const noexcept { state_->work_started(); }
  /// Lets go of the work on_work_started() took.
  void on_work_finished() const noexcept { state_->work_finished(); }
  /// Runs `f` inline when called on this executor's own thread, else queues it.
  template <class Function, class Allocator>
  void dispatch(Function&& f, const Allocator&) const;
  /// Queues `f`.
  template <class Function, class Allocator>
  void post(Function&& f, const Allocator&) const {
    enqueue_op(std::forward<Function>(f));
  }
  /// Queues `f` (as post).
  template <class Function, class Allocator>
  void defer(Function&& f, const Allocator& a) const { post(std::forward<Function>(f), a); }
  ///@}

private:
  struct from_inner {};
  serial_executor(from_inner, const Executor& ex, serial_options opts);

  template <class R, class F>
  detail::scheduled_task_base* new_task(F&& f, detail::task_kind kind,
                                        detail::node_lifetime lifetime = detail::node_lifetime::brief) const;

  // The handle's reference; the node's own reference (refs_ = 1) stays with the queues.
  static detail::scheduled_task_base* adopt(detail::scheduled_task_base* t) noexcept;

  void reject(detail::scheduled_task_base* t) const;

  template <class R>
  scheduled_future<R> start(detail::scheduled_task_base* t, clock::time_point due) const;

  template <class F, class Rep1, class Period1, class Rep2, class Period2>
  scheduled_future<void> periodic(F&& f, std::chrono::duration<Rep1, Period1> initial,
                                  std::chrono::duration<Rep2, Period2> period, bool fixed_delay,
                                  periodic_options options) const;

  // may_run_here: blocking.possibly (see serial_core::try_enqueue).
  template <class Function>
  void enqueue_op(Function&& f, bool may_run_here = false) const;

  template <class>
  friend class scheduled_future;
  friend struct detail::core_access;

  static serial_executor with_blocking_never(serial_executor&& s, bool never) noexcept;

  std::shared_ptr<detail::serial_state<Executor>> state_;
  bool blocking_never_ = false;
  bool tracked_ = false; // this copy holds work on the underlying executor
};

/// A serial executor over `ex`.
template <class Executor>
serial_executor<Executor> make_serial_executor(const Executor& ex, serial_options opts = {}) {
  return serial_executor<Executor>(ex, std::move(opts));
}

/// A serial executor over a pool's (or any execution context's) executor.
template <class ExecutionContext>
requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
auto make_serial_executor(ExecutionContext& ctx, serial_options opts = {}) {
  return make_serial_executor(ctx.get_executor(), std::move(opts));
}

} // namespace metronome

#include <metronome/impl/serial_executor.hpp>

#endif
