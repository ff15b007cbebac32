#ifndef METRONOME_INTERVAL_HPP
#define METRONOME_INTERVAL_HPP

#include <metronome/async_delay.hpp>
#include <metronome/detail/periodic.hpp>
#include <metronome/options.hpp>

#include <metronome/detail/asio.hpp>

#include <chrono>
#include <memory>
#include <utility>

namespace metronome {

namespace detail {

// What an interval and its pending tick share (the tick may outlive the interval).
//
// Ground rules. `next` is the due time of the next tick not yet handed out. take() hands
// out the tick at `next` and provisionally moves `next` one period on (what follows a
// tick that completes on time); the missed-tick policy is applied only when the tick
// completes (settle(), at the time it completes), as the pool decides at the end of a
// run: a wait that completes late is followed by what the policy says, not by the
// on-time next tick already chosen. An aborted tick is given back (`next` = its due).
struct interval_state {
  clock::time_point next;  // due time of the next tick not yet handed out (see above)
  clock::duration period;
  missed_tick missed;
  bool pending = false;    // a tick is outstanding
  bool rearm = false;      // reset() while pending: the aborted wait starts again at `next`
  bool moved = false;      // reset() while pending: `next` is the new grid's, keep it
  bool cancelled = false;  // cancel() while pending: the tick completes aborted, reset() or not
  bool ended = false;      // the tick at time_point::max() was handed out: the grid has no more
  clock::time_point pending_due{};
  net::cancellation_signal signal; // the pending wait's slot
  net::cancellation_slot user_slot;
  bool user_slot_connected = false;

  // The pending tick is over (completed, or its handler destroyed): the user's slot no
  // longer forwards to this interval.
  void release_user_slot() noexcept {
    if (user_slot_connected) {
      user_slot.clear();
      user_slot_connected = false;
    }
  }
  // The pending tick was not consumed: the next async_tick hands it out again.
  void give_back_tick() noexcept {
    next = pending_due;
    ended = false;
  }

  // Hands out the tick due at `next`; `next` moves one period on until settle() applies
  // the policy (while the tick is outstanding, next_tick() is the on-time successor).
  clock::time_point take() noexcept {
    const clock::time_point due = next;
    if (due == clock::time_point::max()) { // the end of time: nothing comes after this tick
      ended = true;
      return due;
    }
    next = saturating_add(due, period);
    return due;
  }
  // The tick due at `due` completed at `now`: the policy chooses what follows it, as
  // for a periodic run that started and ended at `now` (on time - the next grid point
  // still ahead - it is one period on under every policy).
  void settle(clock::time_point due, clock::time_point now) noexcept {
    const clock::time_point at = due > now ? due : now; // completes at its due time or later
    next = next_periodic_due(false, missed, period, due, at, at);
  }
};

// Cancels the pending tick. After a reset() its wait may already be out of the queue
// (aborted, to start again): it must then complete aborted instead.
inline void cancel_pending_tick(interval_state& s, net::cancellation_type_t t) {
  s.rearm = false;
  s.cancelled = true;
  s.signal.emit(t);
}

} // namespace detail

/// Ticks on a fixed grid for coroutines and other asynchronous code (Tokio's `interval`).
/**
 * Ticks fall due at `start`, `start + period`, `start + 2·period`… (by default `start`
 * is the construction time, so the first tick completes at once; a duration `first`
 * instead of a time point counts from the construction time). `async_tick(token)`
 * waits for the next one (signature `void(error_code, clock::time_point due)`); the wait
 * is one node in the delay queue of the metronome pool behind the executor (else the
 * timing service of its context) and the handler runs on its associated executor (default: the
 * interval's). The `missed_tick` policy decides what follows a tick when it completes,
 * as for `schedule_at_fixed_rate` at the end of a run: a tick that completes before the
 * next grid point is followed one period later under every policy. One that completes
 * later - asked for late, or its wait completed late (the clock jumped, the pool was
 * busy) - is followed, under `burst`, by the missed ticks at once, one per call;
 * under `delay`, by a tick one period after its completion (the grid shifts); under
 * `skip`, by the first grid point after its completion. Period 300 ms from t0, a wait
 * completing at t0 + 950 ms for the tick due at 600: `burst` then hands out 900 at once
 * and 1200; `delay` 1250, 1550…; `skip` 1200, 1500…. A grid starting far in the past
 * (`time_point::min()`) follows the same rules.
 *
 * One tick at a time: an `async_tick` while another is outstanding completes at once
 * (posted, never inline) with `asio::error::already_started` and leaves the outstanding
 * one alone. `cancel()` and per-operation cancellation (any type) complete the
 * outstanding tick with `operation_aborted`; such a tick is not consumed (the next call
 * waits for the same due time). `reset()` restarts the grid one period from now (a
 * pending tick waits for the new time). Destroying the interval cancels its tick.
 *
 * A period too long for the clock saturates (its ticks after the first fall due at
 * `time_point::max()`); one under a nanosecond throws `std::invalid_argument`. The tick
 * due at `time_point::max()` (reachable with a `manual_clock`) is the grid's last: every
 * `async_tick` after it completes at once (posted) with `asio::error::eof` and
 * `time_point::max()`, until `reset()` starts a new grid.
 *
 * @par Thread Safety
 * As for Asio I/O objects: distinct objects are safe; one object must be used from one
 * context at a time (a coroutine, a strand), the handler's context included.
 */
template <class Executor>
class basic_interval {
public:
  /// The executor its waits complete on (the target's).
  using executor_type = Executor;

  /// Ticks every `period`, the first one now. @throws std::invalid_argument if period < 1 ns.
  template <class Target, class Rep, class Ratio>
  basic_interval(Target&& target, std::chrono::duration<Rep, Ratio> period, missed_tick missed = missed_tick::burst)
      : ex_(detail::delay_target<std::remove_cvref_t<Target>>::get(target)) {
    init(detail::pool_core_of(ex_).now(), period, missed);
  }

  /// Ticks every `period` from `start`. @throws std::invalid_argument if period < 1 ns.
  template <class Target, class Duration, class Rep, class Ratio>
  basic_interval(Target&& target, std::chrono::time_point<clock, Duration> start,
                 std::chrono::duration<Rep, Ratio> period, missed_tick missed = missed_tick::burst)
      : ex_(detail::delay_target<std::remove_cvref_t<Target>>::get(target)) {
    init(clock::time_point(detail::saturating_duration(start.time_since_epoch())), period, missed);
  }

  /// Ticks every `period`, the first one `first` from now (<= 0: now), as
  /// `schedule_at_fixed_rate(f, initial_delay, period)` counts its first run.
  /// @throws std::invalid_argument if period < 1 ns.
  template <class Target, class Rep1, class Ratio1, class Rep2, class Ratio2>
  basic_interval(Target&& target, std::chrono::duration<Rep1, Ratio1> first,
                 std::chrono::duration<Rep2, Ratio2> period, missed_tick missed = missed_tick::burst)
      : ex_(detail::delay_target<std::remove_cvref_t<Target>>::get(target)) {
    init(detail::saturating_add(detail::pool_core_of(ex_).now(), first), period, missed);
  }

  /// Movable (the moved-from interval is empty); not copyable.
  basic_interval(basic_interval&&) noexcept = default;
  basic_interval& operator=(basic_interval&&) = delete;
  ~basic_interval() {
    if (state_) cancel();
  }

  /// The executor given at construction.
  executor_type get_executor() const noexcept { return ex_; }
  /// The period between ticks.
  clock::duration period() const noexcept { return state_->period; }
  /// What follows a tick that completes late (missed_tick).
  missed_tick missed() const noexcept { return state_->missed; }
  /// Due time of the next tick not yet handed out (while a tick is outstanding: the one
  /// after it if it completes on time; the policy settles it when it completes).
  clock::time_point next_tick() const noexcept { return state_->next; }

  /// Waits for the next tick; see the class comment. Signature `void(error_code, clock::time_point)`.
  template <class CompletionToken = net::default_completion_token_t<Executor>>
  auto async_tick(CompletionToken&& token = net::default_completion_token_t<Executor>());

  /// Completes the outstanding tick (if any) with `operation_aborted`.
  void cancel() noexcept {
    if (state_->pending) detail::cancel_pending_tick(*state_, net::cancellation_type::terminal);
  }

  /// Restarts the grid: the next tick falls due one period from now.
  void reset() { reset_at(detail::saturating_add(detail::pool_core_of(ex_).now(), state_->period)); }

  /// Restarts the grid at `start`: the next tick falls due then.
  void reset_at(clock::time_point start);

private:
  template <class Rep, class Ratio>
  void init(clock::time_point start, std::chrono::duration<Rep, Ratio> period, missed_tick missed);

  Executor ex_;
  std::shared_ptr<detail::interval_state> state_;
};

/// The common case: any executor, type-erased.
using interval = basic_interval<net::any_io_executor>;

} // namespace metronome

#include <metronome/impl/interval.hpp>

#endif
