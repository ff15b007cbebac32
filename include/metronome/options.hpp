#ifndef METRONOME_OPTIONS_HPP
#define METRONOME_OPTIONS_HPP

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <string>

namespace metronome {

/// The clock every due time is expressed in.
using clock = std::chrono::steady_clock;

class manual_clock;

/// What a pool does with work it cannot accept (after shutdown, or a full ready queue).
enum class rejection_policy {
  abort,         ///< throw `rejected_execution`
  caller_runs,   ///< run the task on the submitting thread before the call returns
  discard,       ///< drop the task; its handle is cancelled
  discard_oldest ///< drop the oldest queued ready task to make room (after shutdown: discard)
};

/// What a fixed-rate task does when it falls behind its schedule.
enum class missed_tick {
  burst, ///< next due = previous due + period (catch up, Java's behaviour)
  delay, ///< next due = start of the late run + period (the grid shifts)
  skip   ///< next due = first grid point after now (missed ticks are dropped)
};

/// What a periodic task does when one of its runs throws.
enum class on_exception {
  stop,     ///< no further runs; the handle's get() rethrows
  continue_ ///< report to the exception handler and keep the schedule
};

/// Per-task options of `schedule_at_fixed_rate` / `schedule_with_fixed_delay`.
struct periodic_options {
  missed_tick missed = missed_tick::burst;
  on_exception on_error = on_exception::stop;
  /// Spreads runs (folly FunctionScheduler-style): each run after the first is due at
  /// its time on the schedule plus a uniform offset in [-jitter, +jitter] x period. The
  /// schedule itself does not move (fixed rate: the grid stays first due + k x period).
  /// 0 = none; outside [0, 1) -> std::invalid_argument from the scheduling call.
  double jitter = 0.0;
};

/// Construction options of a `scheduled_thread_pool`.
/**
 * Use the named constructors for the classic pool family: `fixed(n)`,
 * `single_thread()`, `cached(core, max, keep_alive)`.
 */
struct pool_options {
  /// Core worker threads, started at construction; at least 1.
  std::size_t threads = 1;
  /// Elastic upper bound; threads beyond `threads` start when work finds nobody idle
  /// and exit after `keep_alive` without work. 0 (or <= threads) means fixed size.
  std::size_t max_threads = 0;
  /// Idle time after which an elastic (non-core) thread exits.
  std::chrono::nanoseconds keep_alive = std::chrono::seconds(60);
  /// Threads are named `<prefix>-<n>` (truncated to the OS limit of 15 characters).
  std::string thread_name_prefix = "metronome";
  /// Policy for the typed API when work is refused.
  rejection_policy rejection = rejection_policy::abort;
  /// Bound of the ready queue for the typed API; 0 = unbounded.
  std::size_t max_queued = 0;
  /// After shutdown(), delayed one-shot tasks still run when due (else they are cancelled).
  bool run_delayed_after_shutdown = true;
  /// After shutdown(), periodic tasks keep running (else they are cancelled).
  bool continue_periodic_after_shutdown = false;
  /// Receives exceptions of fire-and-forget work; default prints to stderr.
  std::function<void(std::exception_ptr)> exception_handler;
  /// Time source: nullptr = `clock` (steady_clock); else a manual clock that must
  /// outlive the pool.
  manual_clock* time_source = nullptr;

  /// `n` threads, fixed.
  static pool_options fixed(std::size_t n) {
    pool_options o;
    o.threads = n;
    return o;
  }
  /// One thread: due work runs strictly in (due time, submission) order.
  static pool_options single_thread() { return fixed(1); }
  /// `core` threads always, up to `max` under load, extra ones exit after `keep_alive`.
  static pool_options cached(std::size_t core, std::size_t max,
                             std::chrono::nanoseconds keep_alive = std::chrono::seconds(60)) {
    pool_options o;
    o.threads = core;
    o.max_threads = max;
    o.keep_alive = keep_alive;
    return o;
  }
};

/// A snapshot of a pool's counters; see `scheduled_thread_pool::stats()`.
struct pool_stats {
  std::size_t threads = 0;           ///< live worker threads
  std::size_t active = 0;            ///< workers running a task now
  std::size_t ready_queued = 0;      ///< tasks waiting in the ready queue
  std::size_t delayed_queued = 0;    ///< tasks waiting in the delay queue
  std::size_t completed = 0;         ///< tasks (and periodic runs) finished
  std::size_t rejected = 0;          ///< submissions refused, every policy counted
  std::size_t largest_pool_size = 0; ///< most threads alive at once
};

} // namespace metronome

#endif
