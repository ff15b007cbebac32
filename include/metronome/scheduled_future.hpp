// scheduled_future: the handle of a submitted or scheduled task.
#ifndef METRONOME_SCHEDULED_FUTURE_HPP
#define METRONOME_SCHEDULED_FUTURE_HPP

#include <metronome/detail/counted_ref.hpp>
#include <metronome/detail/scheduled_task.hpp>
#include <metronome/errors.hpp>
#include <metronome/options.hpp>

#include <chrono>
#include <future>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace metronome {

class scheduled_thread_pool;
template <class>
class serial_executor;

/// A handle to a task submitted to a `scheduled_thread_pool`.
/**
 * Handles are cheap (one pointer and a reference count), copyable and movable, and
 * safe to drop from any thread. Dropping or destroying a handle never cancels its
 * task.
 *
 * A one-shot task's handle becomes done when the task returns (value), throws
 * (exception) or is cancelled. A periodic task's handle (`scheduled_future<void>`)
 * becomes done only when the task stops: cancelled, rejected, or stopped by an
 * exception under `on_exception::stop`.
 *
 * @par Thread Safety
 * Distinct handle objects: safe. One handle object: const members safe.
 */
template <class R>
class scheduled_future {
public:
  /// The task's result type.
  using value_type = R;

  /// An empty handle (`valid() == false`).
  scheduled_future() noexcept = default;

  /// Whether this handle refers to a task.
  bool valid() const noexcept { return static_cast<bool>(task_); }

  /// Cancels the task if it has not started (one-shot) or prevents further runs (periodic).
  /**
   * @returns true iff this call prevented the run (one-shot) or further runs
   * (periodic; a run in progress completes). false if the task already started,
   * finished, or was cancelled before.
   * A cancelled task leaves the delay queue at once and its callable is destroyed
   * (for a periodic run in progress: when that run returns). Wakes no worker.
   */
  bool cancel() noexcept { return task_ && task_->cancel(); }

  /// Moves a task still waiting in the delay queue so that it falls due `delay` from now.
  /**
   * The idle-timeout pattern (restart on every read) and debouncing: the node stays
   * where it is in memory and is re-keyed in the delay queue (a removal and an insert,
   * O(log n); the task node is neither allocated nor freed, the queue's own storage may
   * grow by one slot). A delay <= 0 makes it due now.
   *
   * @returns true iff the task was still waiting in the delay queue and now has the new
   * due time. false, with nothing changed, when the task is no longer waiting there:
   * it fell due (it may be queued to run, running, or done), was cancelled, or its pool
   * is gone; such a task is never revived: schedule a new one. Also false, with the old
   * due time kept, in the rare case that the queue needs a slot and memory is exhausted.
   * A periodic task's next run moves; a fixed-rate grid then continues from the new due
   * time. Like a new earliest task, an earlier due time wakes the pool's timed waiter;
   * a later one wakes nobody. Equal due times keep the order of the calls that set them
   * (a reset counts as a new submission).
   *
   * @par Thread Safety
   * Safe from any thread, concurrently with the pool running or cancelling the task.
   */
  template <class Rep, class Period>
  bool reset(std::chrono::duration<Rep, Period> delay) noexcept {
    return task_ && task_->reset(detail::saturating_duration(delay));
  }

  /// Whether the task ended by cancellation (including discard by a rejection policy).
  bool is_cancelled() const noexcept { return task_ && task_->is_cancelled(); }

  /// Whether the task has ended: returned, threw, or was cancelled.
  bool is_done() const noexcept { return task_ && task_->is_terminal(); }

  /// Blocks until done.
  void wait() const { checked().wait(); }

  /// Blocks until done or `timeout` of real time passed.
  template <class Rep, class Period>
  std::future_status wait_for(std::chrono::duration<Rep, Period> timeout) const {
    return wait_until(detail::saturating_add(clock::now(), timeout));
  }

  /// Blocks until done or the real clock reaches `deadline`.
  template <class Duration>
  std::future_status wait_until(std::chrono::time_point<clock, Duration> deadline) const {
    const clock::time_point d(detail::saturating_duration(deadline.time_since_epoch()));
    return checked().wait_until(d) ? std::future_status::ready : std::future_status::timeout;
  }

  /// Waits, then returns the result.
  /**
   * @throws cancelled_error if the task was cancelled; the task's own exception if
   * it threw. For a move-only `R` the value is moved out, once for all the handles of
   * the task: a later get() throws std::future_error (future_already_retrieved), as
   * std::future's second get() fails.
   */
  R get() const {
    auto& t = checked();
    t.wait();
    t.rethrow_if_failed();
    if constexpr (!std::is_void_v<R>) {
      auto& r = static_cast<detail::scheduled_result<R>&>(t);
      if (std::exception_ptr e = r.claim_value()) std::rethrow_exception(e);
      return r.claimed_value();
    }
  }

  /// Time left until the task is due (negative when overdue), read from the pool's clock.
  clock::duration delay() const noexcept { return task_ ? task_->delay() : clock::duration::zero(); }

  /// Whether this is a periodic task's handle.
  bool is_periodic() const noexcept { return task_ && task_->is_periodic(); }

  /// Asynchronously waits for the result; see impl/scheduled_future.hpp.
  template <class CompletionToken>
  auto async_wait(CompletionToken&& token);

  /// Equal when both refer to the same task (or both are empty).
  friend bool operator==(const scheduled_future& a, const scheduled_future& b) noexcept {
    return a.task_.get() == b.task_.get();
  }

private:
  friend class scheduled_thread_pool;
  template <class>
  friend class serial_executor;
  template <class>
  friend class scheduled_future;

  explicit scheduled_future(detail::scheduled_task_base* t) noexcept : task_(t) {}

  detail::scheduled_task_base& checked() const {
    if (!task_) throw std::logic_error("metronome: scheduled_future has no task");
    return *task_.get();
  }

  detail::counted_ref<detail::scheduled_task_base> task_;
};

} // namespace metronome

#include <metronome/impl/scheduled_future.hpp>

#endif
