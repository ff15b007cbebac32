// metronome/execution.hpp: the pool, serial executors and wheels as P2300
// (std::execution) timed schedulers, over stdexec. Optional: the library builds and works
// without it; include this header where stdexec is on the include path (CMake: the
// target metronome::execution, made when stdexec is found).
//
//   pool.get_scheduler(), serial.get_scheduler(), wheel.get_scheduler() model
//   stdexec::scheduler and exec::timed_scheduler: schedule(), schedule_after(d),
//   schedule_at(t), now() (the pool's or wheel's time: its manual clock when it has one).
//
// Each operation is one node of the engine behind the scheduler (a wait in the pool's
// delay queue, an entry in the wheel), held inside the operation state: starting one
// allocates nothing. Completions: set_value() when due, on a thread that runs the
// scheduler's work (in serial order for a serial executor), never early;
// set_stopped() when a stop request or the scheduler's shutdown ends it first;
// set_error(std::exception_ptr) only when the delay queue could not grow (bad_alloc).
// docs/semantics.md, "std::execution", has every rule and the test of each.
#ifndef METRONOME_EXECUTION_HPP
#define METRONOME_EXECUTION_HPP

#include <metronome/detail/core_access.hpp>
#include <metronome/detail/pool_core.hpp>
#include <metronome/detail/pool_of.hpp>
#include <metronome/detail/task.hpp>
#include <metronome/detail/wheel_core.hpp>
#include <metronome/scheduled_thread_pool.hpp>
#include <metronome/serial_executor.hpp>
#include <metronome/wheel_timer.hpp>

#include <exec/timed_scheduler.hpp>
#include <stdexec/execution.hpp>

#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

namespace metronome {
namespace detail {

using exec_completions = stdexec::completion_signatures<stdexec::set_value_t(), stdexec::set_error_t(std::exception_ptr),
                                                        stdexec::set_stopped_t()>;

// When an operation falls due: `amount` after its start() (relative: schedule_after, the
// delay counts from start, not from the sender's making), or at the time point `amount`
// after the epoch (schedule_at).
struct exec_due {
  clock::duration amount;
  bool relative;

  clock::time_point at(clock::time_point current) const noexcept {
    return relative ? saturating_add(current, amount) : clock::time_point(amount);
  }
  clock::duration from(clock::time_point current) const noexcept {
    if (relative) return amount;
    const wide_int left = static_cast<wide_int>(amount.count()) - current.time_since_epoch().count();
    if (left <= 0) return clock::duration::zero();
    return left >= clock::duration::max().count() ? clock::duration::max() : clock::duration(static_cast<clock::rep>(left));
  }
};

// The sender of every metronome scheduler: `Scheduler::operation<Receiver>` is its state.
template <class Scheduler>
class timed_sender {
public:
  using sender_concept = stdexec::sender_t;
  using completion_signatures = exec_completions;

  struct attrs {
    Scheduler scheduler;
    Scheduler query(stdexec::get_completion_scheduler_t<stdexec::set_value_t>) const noexcept { return scheduler; }
  };

  timed_sender(Scheduler s, exec_due due) noexcept : scheduler_(std::move(s)), due_(due) {}

  attrs get_env() const noexcept { return attrs{scheduler_}; }

  template <class Receiver>
  typename Scheduler::template operation<std::decay_t<Receiver>> connect(Receiver&& r) const
      noexcept(std::is_nothrow_constructible_v<std::decay_t<Receiver>, Receiver>) {
    return typename Scheduler::template operation<std::decay_t<Receiver>>(scheduler_, due_, std::forward<Receiver>(r));
  }

private:
  Scheduler scheduler_;
  exec_due due_;
};

// The operation states (impl/execution.hpp).
template <class Receiver>
class pool_operation;
template <class Executor, class Receiver>
class serial_operation;
template <class Receiver>
class wheel_operation;
} // namespace detail

/// A `scheduled_thread_pool` as a P2300 timed scheduler: see this header's comment and
/// docs/semantics.md, "std::execution". Cheap to copy; compares equal for one pool.
class pool_scheduler {
public:
  using time_point = clock::time_point; ///< metronome::clock's (steady_clock)
  using duration = clock::duration;     ///< nanoseconds

  /// The scheduler of `pool` (as `pool.get_scheduler()`).
  explicit pool_scheduler(scheduled_thread_pool& pool) noexcept : core_(&detail::pool_of(pool)) {}

  /// The operation state of a sender connected to a `Receiver`: holds the delay queue's node.
  template <class Receiver>
  using operation = detail::pool_operation<Receiver>;
  /// The sender of schedule(), schedule_after() and schedule_at().
  using sender = detail::timed_sender<pool_scheduler>;

  /// Completes on a pool thread as soon as one takes it (after the work already due).
  sender schedule() const noexcept { return sender(*this, {clock::duration::zero(), true}); }
  /// Completes on a pool thread `d` after start(), never earlier.
  sender schedule_after(duration d) const noexcept { return sender(*this, {d, true}); }
  /// Completes on a pool thread at `t` (the pool's time), never earlier.
  sender schedule_at(time_point t) const noexcept { return sender(*this, {t.time_since_epoch(), false}); }
  /// The pool's time (its manual clock when it has one).
  time_point now() const noexcept { return core_->now(); }

  /// Equal for the scheduler of one pool.
  friend bool operator==(const pool_scheduler&, const pool_scheduler&) noexcept = default;

private:
  template <class>
  friend class detail::timed_sender;
  operator detail::pool_core&() const noexcept { return *core_; }

  detail::pool_core* core_;
};

/// A `serial_executor` as a P2300 timed scheduler: completions run in the executor's
/// order, one at a time with its other work. Compares equal for copies of one executor.
template <class Executor>
class serial_scheduler {
public:
  using time_point = clock::time_point; ///< metronome::clock's (steady_clock)
  using duration = clock::duration;     ///< nanoseconds

  /// The scheduler of `ex` (as `ex.get_scheduler()`).
  explicit serial_scheduler(serial_executor<Executor> ex) noexcept : ex_(std::move(ex)) {}

  /// The operation state of a sender connected to a `Receiver`: holds the delay queue's
  /// node and the turn in the executor's queue.
  template <class Receiver>
  using operation = detail::serial_operation<Executor, Receiver>;
  /// The sender of schedule(), schedule_after() and schedule_at().
  using sender = detail::timed_sender<serial_scheduler>;

  /// Takes a turn in the executor's queue at once (behind the work already queued).
  sender schedule() const noexcept { return sender(*this, {clock::duration::zero(), true}); }
  /// Takes a turn when `d` has passed since start(), never earlier.
  sender schedule_after(duration d) const noexcept { return sender(*this, {d, true}); }
  /// Takes a turn at `t` (the time of the engine that times the executor's delayed work).
  sender schedule_at(time_point t) const noexcept { return sender(*this, {t.time_since_epoch(), false}); }
  /// The time of the engine that times the executor's delayed work (its pool's clock).
  time_point now() const noexcept { return detail::core_access::serial_state(ex_).timers().now(); }

  /// The serial executor behind it.
  const serial_executor<Executor>& executor() const noexcept { return ex_; }

  /// Equal for copies of one serial executor.
  friend bool operator==(const serial_scheduler& a, const serial_scheduler& b) noexcept { return a.ex_ == b.ex_; }

private:
  template <class>
  friend class detail::timed_sender;
  operator const serial_executor<Executor>&() const noexcept { return ex_; }

  serial_executor<Executor> ex_;
};

/// A `wheel_timer` as a P2300 timed scheduler, at the wheel's tick resolution (never
/// early); completions on the wheel's executor.
class wheel_scheduler {
public:
  using time_point = clock::time_point; ///< metronome::clock's (steady_clock)
  using duration = clock::duration;     ///< nanoseconds

  /// The scheduler of `wheel` (as `wheel.get_scheduler()`).
  explicit wheel_scheduler(wheel_timer& wheel) noexcept : core_(&detail::core_access::core(wheel)) {}

  /// The operation state of a sender connected to a `Receiver`: holds the wheel's entry.
  template <class Receiver>
  using operation = detail::wheel_operation<Receiver>;
  /// The sender of schedule(), schedule_after() and schedule_at().
  using sender = detail::timed_sender<wheel_scheduler>;

  /// Handed to the wheel's executor at once.
  sender schedule() const noexcept { return sender(*this, {clock::duration::zero(), true}); }
  /// Fires on the first tick at or after `d` from start(), on the wheel's executor.
  sender schedule_after(duration d) const noexcept { return sender(*this, {d, true}); }
  /// Fires on the first tick at or after `t` (the wheel's time).
  sender schedule_at(time_point t) const noexcept { return sender(*this, {t.time_since_epoch(), false}); }
  /// The wheel's time (its manual clock when it has one).
  time_point now() const noexcept { return core_->now(); }

  /// Equal for the scheduler of one wheel.
  friend bool operator==(const wheel_scheduler&, const wheel_scheduler&) noexcept = default;

private:
  template <class>
  friend class detail::timed_sender;
  operator detail::wheel_core&() const noexcept { return *core_; }

  detail::wheel_core* core_;
};

} // namespace metronome

#include <metronome/impl/execution.hpp>

#endif
