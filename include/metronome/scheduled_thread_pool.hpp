// scheduled_thread_pool and pending_task.
#ifndef METRONOME_SCHEDULED_THREAD_POOL_HPP
#define METRONOME_SCHEDULED_THREAD_POOL_HPP

#include <metronome/detail/core_access.hpp>
#include <metronome/detail/pool_core.hpp>
#include <metronome/errors.hpp>
#include <metronome/options.hpp>
#include <metronome/scheduled_future.hpp>

#include <metronome/detail/asio.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <type_traits>
#include <vector>

namespace metronome {

/// A task that `shutdown_now()` took out of the pool before it ran.
/**
 * Move-only and invocable once: calling it runs the task on the calling thread
 * (completing its handle, if it has one; a periodic task runs once and its handle
 * completes) - a task whose callable is bound to an executor of its own is dispatched
 * there and runs there, once. Destroying it unrun cancels the task's handle (executor-path work is
 * simply destroyed).
 */
class pending_task {
public:
  pending_task() noexcept = default;
  /// Moves the task out of `o` (left empty).
  pending_task(pending_task&& o) noexcept : task_(std::exchange(o.task_, nullptr)) {}
  /// Destroys the task held (unrun, its handle cancelled), then takes `o`'s.
  pending_task& operator=(pending_task&& o) noexcept;
  ~pending_task();

  /// Runs the task. @throws std::logic_error if already run or empty; an executor-path
  /// task's own exception propagates.
  void operator()();

  /// Whether it holds a task.
  explicit operator bool() const noexcept { return task_ != nullptr; }
  /// Whether this came from `submit`/`schedule…` (it has a handle) rather than the executor path.
  bool has_handle() const noexcept { return task_ && task_->is_scheduled(); }
  /// Whether it is a periodic task (fixed rate or fixed delay).
  bool is_periodic() const noexcept { return task_ && task_->kind_ == detail::task_kind::periodic; }

private:
  friend class scheduled_thread_pool;
  explicit pending_task(detail::task_base* t) noexcept : task_(t) {}
  detail::task_base* task_ = nullptr;
};

class pool_scheduler; // metronome/execution.hpp

/// A thread pool that runs immediate, delayed and periodic work: Java's
/// ScheduledThreadPoolExecutor as an Asio execution context.
/**
 * Immediate work goes through a lock-free ready queue; delayed work waits in a
 * 4-ary heap with O(log n) removal, driven by the pool's own workers
 * (leader-follower: at most one timed wait). See README.md for the rules on order,
 * periodic runs, cancellation, rejection and shutdown.
 *
 * @par Bound callables
 * A callable with an associated executor of its own (`net::bind_executor(strand, f)`: a
 * strand, an `io_context`'s executor, a serial_executor, any executor) runs there, as
 * Asio runs a bound handler. The task waits in this pool; when due, a worker dispatches
 * it to that executor (inline when the worker may run it there) and the whole run
 * happens there; a periodic task is rescheduled here once that run has ended, so runs
 * never overlap. The handle stays cancellable until the run starts there. An executor
 * that destroys the task unrun (its context destroyed or shut down) ends it cancelled.
 * No outstanding work is held on that executor while the task waits here; once handed
 * over it is that executor's queued work. The pool does not wait for a task handed over
 * (after shutdown or destruction, a periodic one ends cancelled after its run there).
 * A callable with no executor of its own runs on the pool, at no extra cost.
 *
 * @par Thread Safety
 * All members are safe to call concurrently from any thread.
 */
class scheduled_thread_pool : public net::execution_context {
public:
  template <class Allocator, unsigned Bits>
  class basic_executor_type;

  /// The pool's Asio executor: blocking.possibly, relationship.fork,
  /// outstanding_work.untracked, std::allocator.
  using executor_type = basic_executor_type<std::allocator<void>, 0>;

  /// A fixed pool of `threads` workers. @throws std::invalid_argument if 0;
  /// std::length_error when 1,048,576 pools exist already.
  explicit scheduled_thread_pool(std::size_t threads);
  /// A pool built from `options`. @throws std::invalid_argument on bad options;
  /// std::length_error when 1,048,576 pools exist already.
  explicit scheduled_thread_pool(pool_options options);

  /// Runs what is ready, cancels delayed and periodic work not yet due (handles
  /// cancelled) and joins. On one of the pool's own threads it joins the others and
  /// detaches that one.
  ~scheduled_thread_pool();

  /// The pool's Asio executor (post, dispatch, defer, co_spawn).
  executor_type get_executor() noexcept;
  /// Same as get_executor().
  executor_type executor() noexcept;
  /// The pool as a P2300 timed scheduler (`stdexec::scheduler`, `exec::timed_scheduler`).
  /// Declared here, defined in <metronome/execution.hpp>: include it (it needs stdexec).
  pool_scheduler get_scheduler() noexcept;

  /// The pool's current time (its manual clock when it has one).
  clock::time_point now() const noexcept { return core_->now(); }

  /// Runs `f` as soon as a worker is free.
  /**
   * @returns a handle to `f`'s result.
   * @throws std::invalid_argument if `f` is empty; rejected_execution per policy.
   * @par Bound callables
   * `f` bound to an executor (`bind_executor`) is handed there by the worker and runs
   * there (see the class comment).
   */
  template <class F>
  auto submit(F&& f);

  /// Runs `f` after `delay` (<= 0: now; too large: saturates, never wraps).
  /**
   * @par Bound callables
   * `f` bound to an executor (`bind_executor`) runs on that executor when due; cancel()
   * wins until it starts there (see the class comment).
   */
  template <class F, class Rep, class Period>
  auto schedule(F&& f, std::chrono::duration<Rep, Period> delay);

  /// Runs `f` at `when` (in the past: now).
  /**
   * @par Bound callables
   * As schedule().
   */
  template <class F, class Duration>
  auto schedule_at(F&& f, std::chrono::time_point<clock, Duration> when);

  /// Runs `f` after `initial_delay`, then every `period` on a fixed grid.
  /**
   * Next due = previous due + period; runs never overlap; missed ticks follow
   * `options.missed`. @throws std::invalid_argument if `period` <= 0 or `f` is empty.
   * @par Bound callables
   * `f` bound to an executor (`bind_executor`) runs on that executor; the next run is
   * scheduled here when the run there has ended, still on the grid.
   */
  template <class F, class Rep1, class Period1, class Rep2, class Period2>
  scheduled_future<void> schedule_at_fixed_rate(F&& f, std::chrono::duration<Rep1, Period1> initial_delay,
                                                std::chrono::duration<Rep2, Period2> period,
                                                periodic_options options = {});

  /// Runs `f` after `initial_delay`, then `delay` after the end of each run.
  /**
   * @throws std::invalid_argument if `delay` <= 0 or `f` is empty.
   * @par Bound callables
   * `f` bound to an executor (`bind_executor`) runs on that executor; `delay` counts
   * from the end of the run there.
   */
  template <class F, class Rep1, class Period1, class Rep2, class Period2>
  scheduled_future<void> schedule_with_fixed_delay(F&& f, std::chrono::duration<Rep1, Period1> initial_delay,
                                                   std::chrono::duration<Rep2, Period2> delay,
                                                   periodic_options options = {});

  /// Stops accepting work; ready work still runs; delayed and periodic work per options.
  void shutdown();

  /// Stops accepting work and starts nothing more; returns the tasks that never ran.
  /** Tasks a worker had already taken when this is called still run. Not returned: a
   *  task bound to the pool itself (to a strand or serial executor over it: it ends
   *  cancelled), and an `asio::strand`'s invoker (destroyed unrun with its handlers, as
   *  at an `io_context`'s destruction); pending `async_delay` waits complete with
   *  `operation_aborted`. docs/semantics.md, "Shutdown and lifecycle". */
  std::vector<pending_task> shutdown_now();

  /// Waits until the pool has terminated. Without shutdown(), waits until no
  /// outstanding work (ready, delayed, tracked) is left, then the pool terminates.
  /** @throws std::logic_error when called from one of the pool's threads. */
  void join();

  /// Waits up to `timeout` for termination; returns whether the pool terminated.
  template <class Rep, class Period>
  bool await_termination(std::chrono::duration<Rep, Period> timeout) {
    return core_->await_termination(detail::saturating_duration(timeout));
  }

  /// Whether shutdown() or shutdown_now() was called (or the pool terminated in a forked child).
  bool is_shutdown() const noexcept { return core_->is_shutdown(); }
  /// Whether the pool has terminated: shut down or joined, and idle.
  bool is_terminated() const noexcept { return core_->is_terminated(); }

  /// A snapshot of the pool's counters.
  pool_stats stats() const { return core_->stats(); }

private:
  friend struct detail::core_access;
  template <class R, class F>
  detail::scheduled_task_base* make_one_shot(F&& f, detail::node_lifetime lifetime = detail::node_lifetime::brief);
  template <class R>
  scheduled_future<R> enqueue(detail::scheduled_task_base* t, clock::time_point due);
  template <class R>
  scheduled_future<R> enqueue(detail::scheduled_task_base* t, clock::time_point due, clock::time_point current);
  template <class F, class Rep1, class Period1, class Rep2, class Period2>
  scheduled_future<void> periodic(F&& f, std::chrono::duration<Rep1, Period1> initial,
                                  std::chrono::duration<Rep2, Period2> period, bool fixed_delay,
                                  periodic_options options);

  std::unique_ptr<detail::pool_core> core_;
};

} // namespace metronome

#include <metronome/impl/scheduled_thread_pool.hpp>
#include <metronome/impl/pool_executor.hpp>

#endif
