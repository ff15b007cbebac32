// The clock, and the options and policy types of pools, periodic tasks, serial executors
// and wheels.
#ifndef METRONOME_OPTIONS_HPP
#define METRONOME_OPTIONS_HPP

#include <metronome/latency_histogram.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <iosfwd>
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
  /// What follows a late run: burst (default), delay or skip.
  missed_tick missed = missed_tick::burst;
  /// A run that throws stops the task (default) or the schedule continues.
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
  /// and exit after `keep_alive` without work. 0 or `threads` means fixed size; between
  /// 1 and `threads - 1` the constructor throws std::invalid_argument. It bounds the
  /// threads counted as workers: one that timed out leaves the count at once, while it
  /// still runs `on_thread_stop` and ends (as Java's pool lowers its worker count), so
  /// for that while `stats().threads` may read more.
  std::size_t max_threads = 0;
  /// Idle time after which an elastic (non-core) thread exits.
  std::chrono::nanoseconds keep_alive = std::chrono::seconds(60);
  /// Threads are named `<prefix>-<n>`; over the OS limit of 15 characters the prefix is
  /// cut at its end, keeping `-<n>` whole.
  std::string thread_name_prefix = "metronome";
  /// Policy for the typed API when work is refused.
  rejection_policy rejection = rejection_policy::abort;
  /// Bound of the ready queue for the typed API; 0 = unbounded.
  std::size_t max_queued = 0;
  /// After shutdown(), delayed one-shot tasks still run when due (else they are cancelled).
  bool run_delayed_after_shutdown = true;
  /// After shutdown(), periodic tasks keep running (else they are cancelled).
  bool continue_periodic_after_shutdown = false;
  /// Receives exceptions of fire-and-forget work, and a `rejected_execution` for each
  /// piece of executor-path work dropped by a shutdown. Default: prints the former to
  /// stderr, and says nothing about work a shutdown the user asked for dropped.
  std::function<void(std::exception_ptr)> exception_handler;
  /// Time source: nullptr = `clock` (steady_clock); else a manual clock that must
  /// outlive the pool.
  manual_clock* time_source = nullptr;
  /// Called on each worker thread (core and elastic) before it takes its first task.
  /**
   * The argument is the worker's number, the `<n>` of its name `<prefix>-<n>`: core
   * threads are 1..threads, elastic threads get the next numbers (never reused while
   * the pool lives). Use it for affinity, priority, a logging context. Empty (the
   * default): nothing is called and nothing is paid. An exception it throws goes to
   * `exception_handler` and the thread runs on as if the hook had returned.
   */
  std::function<void(std::size_t)> on_thread_start;
  /// Called on each worker thread after its last task, just before the thread exits
  /// (an elastic thread retiring, or every thread at termination).
  /**
   * Every stop hook has returned when `join()` (or the destructor) returns. A thread that
   * a pool destroyed from inside one of its own tasks detaches runs it too, after that
   * task; its exceptions are then printed to stderr (the pool is gone). Otherwise an
   * exception goes to `exception_handler`. Empty: nothing is called.
   */
  std::function<void(std::size_t)> on_thread_stop;

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
  std::size_t threads = 0;           ///< live worker threads (one that timed out, until it ends)
  std::size_t active = 0;            ///< workers running a task now
  std::size_t ready_queued = 0;      ///< tasks waiting in the ready queue
  std::size_t delayed_queued = 0;    ///< tasks waiting in the delay queue
  std::size_t completed = 0;         ///< tasks (and periodic runs) finished
  std::size_t rejected = 0;          ///< submissions refused, every policy counted
  std::size_t largest_pool_size = 0; ///< most threads alive at once
  /// Executor-path work is timed one post in this many, counted per posting thread; each
  /// timed post counts this many in `queue_wait`.
  static constexpr std::size_t post_sample_every = 64;
  /// Ready-queue wait, from being queued to starting on a worker, of:
  /// - tasks of the typed API (`submit`, a `schedule…` whose delay had already passed, a
  ///   serial executor's `submit`), and a periodic task's first run when its initial
  ///   delay is 0 (every one);
  /// - executor-path work queued on the pool: `asio::post`, `asio::defer`, and
  ///   `asio::dispatch` / `execute` called off the pool's threads (coroutines' posts, a
  ///   strand's invoker) - sampled: one post in `post_sample_every` of each posting
  ///   thread, counted `post_sample_every` times. A dispatch that runs inline has no wait;
  /// - an `async_delay` or `cancel_after` wait on the pool whose due time had passed when
  ///   it started: from its start to the delivery below.
  latency_histogram queue_wait;
  /// Lateness, from the due time to the start (every one, not sampled), of:
  /// - delayed tasks and every later run of a periodic task: the timer's lateness plus
  ///   the wait for a free worker;
  /// - `async_delay` and `cancel_after` waits in the pool's delay queue that fall due (not
  ///   cancelled or aborted), up to the moment a worker delivers them: runs the handler
  ///   (its executor is this pool) or hands it to its executor (cancel_after: the
  ///   emission), whose own queue is not counted;
  /// - timeouts (and `async_wait`s) of a `wheel_timer(pool, …)` on the pool's clock: from
  ///   the time of the tick they fire on (the deadline rounded up to the wheel's tick) to
  ///   their callable's start. Not timeouts scheduled with a delay <= 0. (A wheel built on
  ///   an executor posts its timeouts: they count as executor-path work.)
  latency_histogram lateness;
};

/// One compact line: every counter, then the two histograms (count, p50, p99, max by
/// bucket bound).
std::ostream& operator<<(std::ostream& os, const pool_stats& s);

/// Options of a `serial_executor`.
struct serial_options {
  /// Tasks run per drain turn before the drain re-posts itself to the underlying
  /// executor, so one busy serial executor cannot starve others on the same pool. >= 1.
  std::size_t batch = 64;
  /// Receives exceptions thrown by fire-and-forget tasks (and work dropped because the
  /// pool underneath was shut down). Default (empty): the pool's handler when the
  /// underlying executor is a metronome pool; over another executor the exception leaves
  /// the drain's Asio handler, as from an `asio::strand` (`io_context::run()` throws it:
  /// docs/semantics.md "Exceptions").
  std::function<void(std::exception_ptr)> exception_handler;
};

/// Options of a `wheel_timer`.
struct wheel_options {
  /// Resolution: a timeout fires on the first tick at or after its deadline. > 0.
  clock::duration tick = std::chrono::milliseconds(1);
  /// Slots per level (S): a power of two from 4 to 4096. Each level is a ring of S
  /// slots; a slot of level L spans (S/2)^L ticks, so the first level takes every
  /// deadline less than S/2 to S ticks away, and a level's slot moves down while the
  /// slot before it is current (spread over that time, never in one burst).
  std::size_t slots_per_level = 512;
  /// Levels: S * (S/2)^(levels-1) ticks are covered (512 * 256^4 = 2^41 ticks of 1 ms:
  /// about 69 years); later deadlines wait at the top level and move down as time passes.
  /// log2(S) + log2(S/2) * (levels-1) <= 60.
  std::size_t levels = 5;
  /// Most timeouts pending at once; 0 = unbounded. Beyond it schedule() throws
  /// rejected_execution (Netty's maxPendingTimeouts).
  std::size_t max_pending = 0;
  /// Time source: nullptr = the real clock (ticks timed by the executor's context); else a manual clock that
  /// moves the wheel synchronously in advance(). Must outlive the wheel.
  manual_clock* time_source = nullptr;
  /// Receives the exceptions that timeouts throw (never a null pointer), on the thread
  /// that ran the timeout. Empty (default), or once the wheel is destroyed: the
  /// exception handler of the metronome pool the timeout runs on; on another executor
  /// the exception leaves the Asio handler that ran the timeout (`io_context::run()`
  /// throws it: docs/semantics.md "Exceptions"). A handler that throws has its exception
  /// printed to stderr, and the wheel goes on.
  std::function<void(std::exception_ptr)> exception_handler;
};

} // namespace metronome

#endif
