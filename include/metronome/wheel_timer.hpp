// wheel_timer: a hierarchical timing wheel that fires timeouts onto an executor.
#ifndef METRONOME_WHEEL_TIMER_HPP
#define METRONOME_WHEEL_TIMER_HPP

#include <metronome/detail/counted_ref.hpp>
#include <metronome/detail/pool_of.hpp>
#include <metronome/detail/timing_of.hpp>
#include <metronome/detail/wheel_core.hpp>
#include <metronome/errors.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/detail/asio.hpp>

#include <chrono>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace metronome {

class wheel_scheduler; // metronome/execution.hpp

/// A hierarchical timing wheel for very many timeouts (Linux/Kafka/Tokio style).
/**
 * Insert and cancel are O(1): a timeout is a node in a slot's intrusive list; each
 * level keeps a bitmap of occupied slots, so finding the next expiry never touches a
 * timeout that is not due (unlike Netty's single wheel, which decrements a
 * `remainingRounds` count on every pass). Timeouts cascade down the levels as time
 * passes. A timeout never fires early and fires at the first tick at or after its
 * deadline (plus scheduling noise).
 *
 * Due timeouts run on the executor given at construction (a metronome pool, or its
 * own executor, costs no allocation per firing). The wheel has no thread of its own: its tick is one
 * wait in the engine of that executor's context (the pool's heap, or the context's timing
 * service), run by the context's threads while the wheel holds timeouts; it only moves
 * timeouts and never runs user code. Once a pool it fires onto has terminated, the wheel
 * fires nothing more: what it holds is destroyed unrun with it. With
 * `wheel_options::time_source` set to a manual clock, `advance()` moves the wheel.
 *
 * A timeout that throws: to `wheel_options::exception_handler`, by default (and once
 * the wheel is destroyed) to the exception handler of the metronome pool running it;
 * on another executor it leaves the Asio handler that ran it (`io_context::run()`
 * throws it: Asio's rule, docs/semantics.md "Exceptions").
 *
 * Handles (`timeout`) may outlive the wheel. Destroying the wheel cancels the timeouts
 * it still holds; a timeout already handed to the executor stays expired, runs unless
 * cancelled first, and its handle still cancels it until it starts.
 *
 * Pick the wheel for many timeouts, most of them cancelled, where tick precision is
 * enough (idle and request timeouts); pick the pool's `schedule` for exact deadlines
 * and fewer timers. See docs/benchmarks.md.
 *
 * @par Thread Safety
 * All members are safe to call concurrently.
 */
class wheel_timer {
public:
  /// A handle to one scheduled timeout; cheap to copy, safe to drop (dropping never
  /// cancels), and safe to use after the wheel is destroyed.
  class timeout {
  public:
    timeout() noexcept = default;
    /// Prevents the timeout from firing: true iff it had not started. Unlinks it from
    /// the wheel at once and frees its function; wakes nobody.
    bool cancel() noexcept { return e_ && e_->cancel(); }
    /// Moves a timeout still waiting in the wheel so that it fires `delay` from now.
    /**
     * The idle-timeout pattern (restart on every read) at the cost of an unlink and a
     * link: the same node moves to its new slot; nothing is allocated or freed (save,
     * as for a new timeout, the rare growth of a level-0 slot's list of walk hints,
     * whose failure is ignored).
     * A delay <= 0 hands it to the executor now. Among equal deadlines it counts as
     * scheduled now (it fires after those scheduled before).
     *
     * @returns true iff the timeout was still waiting in the wheel and now has the new
     * deadline. false, with nothing changed, once it fell due (queued on the executor,
     * running or done), was cancelled, or its wheel is stopped or gone: a timeout is
     * never revived - schedule a new one.
     *
     * @par Thread Safety
     * Safe from any thread, concurrently with the wheel firing or cancelling it.
     */
    template <class Rep, class Period>
    bool reset(std::chrono::duration<Rep, Period> delay) noexcept {
      return e_ && e_->reset(detail::saturating_duration(delay));
    }
    /// Whether cancel() (or the wheel's stop) won over firing.
    bool is_cancelled() const noexcept { return e_ && e_->state() == detail::wheel_entry::cancelled; }
    /// Whether it fell due (queued on the executor, running or done).
    bool is_expired() const noexcept { return e_ && e_->is_due(); }
    /// Whether it refers to a timeout (a default-constructed one does not).
    bool valid() const noexcept { return static_cast<bool>(e_); }

  private:
    friend class wheel_timer;
    explicit timeout(detail::wheel_entry* e) noexcept : e_(e) {}
    detail::counted_ref<detail::wheel_entry> e_;
  };

  /// A wheel firing onto `pool`. @throws std::invalid_argument on bad options.
  explicit wheel_timer(scheduled_thread_pool& pool, wheel_options opts = {})
      : core_(detail::wheel_core::make(std::move(opts), pool.get_executor(), &detail::pool_of(pool),
                                                   &detail::pool_of(pool))) {}

  /// A wheel firing onto any Asio executor. A pool's own executor (`pool.get_executor()`)
  /// makes the same wheel as `wheel_timer(pool)`: the pool's `shutdown()` aborts its
  /// waits and firing allocates nothing. Over a strand, a serial executor or another
  /// executor of a pool, only `stop()` aborts them.
  template <class Executor>
  requires(!std::is_convertible_v<Executor&, scheduled_thread_pool&>) explicit wheel_timer(const Executor& ex,
                                                                                           wheel_options opts = {})
      : core_(detail::wheel_core::make(std::move(opts), net::any_io_executor(ex), own_pool(ex),
                                                   hosted_ticks(ex))) {}

  /// Stops the wheel (cancelling what never fired).
  ~wheel_timer() = default;

  /// The executor type, as `steady_timer`'s: type-erased.
  using executor_type = net::any_io_executor;
  /// The executor due timeouts and waits run on (a wait's default), as an Asio I/O
  /// object names it: the one given at construction.
  executor_type get_executor() const noexcept { return core_->executor(); }

  /// Runs `f` on the executor once `delay` has passed (at tick resolution).
  /**
   * A callable with an associated executor of its own (`asio::bind_executor(strand, f)`,
   * a connection's strand or serial executor) runs there, as Asio runs a handler: when
   * due it is dispatched from the wheel's executor to its own (inline when that thread
   * may run it). From then on the timeout is running: `cancel()` returns false.
   * @throws std::invalid_argument if `f` is empty; rejected_execution when stopped or
   * when `max_pending` timeouts are pending.
   */
  template <class F, class Rep, class Period>
  timeout schedule(F&& f, std::chrono::duration<Rep, Period> delay);

private:
  template <class D, class Rep, class Period>
  timeout schedule_callable(D&& fn, std::chrono::duration<Rep, Period> delay);

public:

  /// Waits for `delay` on the wheel: an Asio operation with signature
  /// `void(error_code)`, any completion token (default: the executor's, as
  /// `steady_timer::async_wait`'s: `deferred` from Asio 1.31), per-operation
  /// cancellation (completes with `operation_aborted`). `stop()` aborts pending waits,
  /// and so does the `shutdown()` of the pool the wheel fires onto, when built from the
  /// pool or its own executor (later waits too).
  /**
   * The handler runs on its associated executor (default: the wheel's), allocated with
   * its associated allocator; outstanding work on that executor is held until the
   * completion has been handed to it (Asio's rule). On a metronome pool every completion,
   * aborted ones included, is handed over by a pool worker running the wait's node:
   * completing allocates nothing when the handler runs on the pool. A handler that throws
   * is reported to the exception handler of the pool whose thread runs it; off a pool it
   * leaves the Asio handler that ran it (`io_context::run()` throws it: Asio's rule).
   */
  template <class Rep, class Period, class CompletionToken = net::default_completion_token_t<executor_type>>
  auto async_wait(std::chrono::duration<Rep, Period> delay,
                  CompletionToken&& token = net::default_completion_token_t<executor_type>());

  /// Timeouts waiting in the wheel (not yet due, not cancelled).
  std::size_t pending() const { return core_->pending(); }

  /// Stops the wheel: later schedule() throws rejected_execution; returns every
  /// timeout that never fired (now cancelled). Idempotent (later calls return none).
  /// Returns once the due timeouts another thread was handing to the executor as it
  /// stopped (a tick, an advance, a handle's `reset()`, a `schedule()` due now) are handed
  /// over and the `async_wait`s starting meanwhile are done with the pool, and - for a call
  /// that finds the wheel stopped by another thread's call - once that call has let go of
  /// the pool: from then on the wheel touches its pool no more, which may be destroyed.
  /// Called on a thread inside one of the wheel's hand-overs (a timeout's destructor, run
  /// as its executor refuses it), it waits for no other thread's hand-over (that thread
  /// cannot let the pool go before its own hand-over returns anyway).
  /// @throws std::bad_alloc when the list cannot be made: the wheel is stopped and every
  /// timeout cancelled all the same (none is lost or fires), only not returned.
  std::vector<timeout> stop() {
    bool unlisted = false;
    std::vector<detail::wheel_entry*> left = core_->stop(true, &unlisted);
    std::vector<timeout> out;
    try {
      out.reserve(left.size());
    } catch (...) {
      for (auto* e : left) e->release();
      throw;
    }
    for (auto* e : left) {
      if (e->no_handle_)
        e->release(); // an operation: its stopped completion is on its way to the executor
      else
        out.push_back(timeout(e));
    }
    if (unlisted) throw std::bad_alloc();
    return out;
  }

  /// The wheel's current time (its manual clock when it has one).
  clock::time_point now() const noexcept { return core_->now(); }

  /// The wheel as a P2300 timed scheduler (`stdexec::scheduler`, `exec::timed_scheduler`).
  /// Declared here, defined in <metronome/execution.hpp>: include it (it needs stdexec).
  wheel_scheduler get_scheduler() noexcept;

private:
  friend struct detail::core_access;
  // The engine that times the wheel's ticks on its context's threads (no thread of the
  // wheel's own): the pool's, or the hosted timing core of any other context.
  template <class Executor>
  static detail::pool_core* hosted_ticks(const Executor& ex) {
    return &detail::pool_core_of(ex);
  }
  // The pool a wheel fires onto directly: only through the pool's own executor, which
  // is what wheel_timer(pool) uses (any other executor of it carries properties or
  // ordering that firing must go through).
  template <class Executor>
  static detail::pool_core* own_pool(const Executor& ex) noexcept {
    if constexpr (std::is_same_v<Executor, scheduled_thread_pool::executor_type>)
      return detail::pool_of(ex);
    else
      return nullptr;
  }

  std::unique_ptr<detail::wheel_core> core_;
};

} // namespace metronome

#include <metronome/impl/wheel_timer.hpp>

#endif
