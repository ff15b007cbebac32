#ifndef METRONOME_CANCEL_AFTER_HPP
#define METRONOME_CANCEL_AFTER_HPP

#include <metronome/async_delay.hpp>
#include <metronome/detail/cancel_after_op.hpp>

#include <metronome/detail/asio.hpp>

#include <chrono>
#include <type_traits>
#include <utility>

namespace metronome {

/// A completion token adapter: the operation it is given to is cancelled when time is up.
/**
 * Made by `cancel_after` / `cancel_at`. `Timing` is `void` when the timer lives in the
 * pool behind the operation's I/O executor (else the handler's executor's: a pool, or
 * its context's timing service), or the type of an explicit executor naming where it
 * lives.
 */
template <class CompletionToken, class Timing = void>
class cancel_after_t {
public:
  /// @cond internal
  template <class T>
  cancel_after_t(T&& token, clock::duration amount, bool relative, net::cancellation_type_t type,
                 detail::timing_holder<Timing> timing)
      : token_(std::forward<T>(token)), amount_(amount), relative_(relative), type_(type), timing_(std::move(timing)) {}

  CompletionToken token_;
  clock::duration amount_;
  bool relative_;
  net::cancellation_type_t type_;
  detail::timing_holder<Timing> timing_;
  /// @endcond
};

/// The partial form, Asio's `partial_cancel_after`: `cancel_after(timeout[, type])` and
/// `cancel_after(timing, timeout[, type])` without a token. Call it with a token
/// (`cancel_after(5s)(asio::use_awaitable)`), or pass it as the token itself: the
/// operation's default completion token is adapted (Asio 1.31 and later: `deferred`;
/// before, only an I/O object whose executor names a default token).
template <class Timing = void>
class partial_cancel_after {
public:
  /// @cond internal
  partial_cancel_after(clock::duration amount, bool relative, net::cancellation_type_t type,
                       detail::timing_holder<Timing> timing)
      : amount_(amount), relative_(relative), type_(type), timing_(std::move(timing)) {}
  /// @endcond
  /// Adapts `token`: the full form `cancel_after(..., token)` is this call.
  template <class CompletionToken>
  auto operator()(CompletionToken&& token) const& {
    return cancel_after_t<std::decay_t<CompletionToken>, Timing>(std::forward<CompletionToken>(token), amount_,
                                                                 relative_, type_, timing_);
  }
  /// As above, moving the timing executor.
  template <class CompletionToken>
  auto operator()(CompletionToken&& token) && {
    return cancel_after_t<std::decay_t<CompletionToken>, Timing>(std::forward<CompletionToken>(token), amount_,
                                                                 relative_, type_, std::move(timing_));
  }
  /// @cond internal
  clock::duration amount_;
  bool relative_;
  net::cancellation_type_t type_;
  detail::timing_holder<Timing> timing_;
  /// @endcond
};

namespace detail {

template <class Target>
auto timing_of(Target&& target) {
  static_assert(is_delay_target_v<Target>,
                "metronome::cancel_after: the timing argument must be an Asio executor or execution context");
  using executor = delay_executor_t<Target>;
  return timing_holder<executor>{executor(delay_target<std::remove_cvref_t<Target>>::get(target))};
}

template <class D>
inline constexpr bool is_duration_v = false;
template <class Rep, class Period>
inline constexpr bool is_duration_v<std::chrono::duration<Rep, Period>> = true;
template <class T>
inline constexpr bool is_time_point_v = false;
template <class C, class D>
inline constexpr bool is_time_point_v<std::chrono::time_point<C, D>> = true;

} // namespace detail

/// The partial forms (no token), as Asio's: `cancel_after(timeout[, type])`,
/// `cancel_after(timing, timeout[, type])`, `cancel_at(deadline[, type])`,
/// `cancel_at(timing, deadline[, type])`; see partial_cancel_after.
template <class Rep, class Period>
partial_cancel_after<> cancel_after(std::chrono::duration<Rep, Period> timeout,
                                    net::cancellation_type_t type = net::cancellation_type::terminal) {
  return {detail::saturating_duration(timeout), true, type, {}};
}
/// As above, timed in the delay queue behind `timing`.
template <class Target, class Rep, class Period>
  requires(!detail::is_duration_v<std::remove_cvref_t<Target>>)
auto cancel_after(Target&& timing, std::chrono::duration<Rep, Period> timeout,
                  net::cancellation_type_t type = net::cancellation_type::terminal) {
  auto t = detail::timing_of(std::forward<Target>(timing));
  using executor = typename decltype(t)::executor_type;
  return partial_cancel_after<executor>(detail::saturating_duration(timeout), true, type, std::move(t));
}
/// As above, at `deadline`.
template <class Duration>
partial_cancel_after<> cancel_at(std::chrono::time_point<clock, Duration> deadline,
                                 net::cancellation_type_t type = net::cancellation_type::terminal) {
  return {detail::saturating_duration(deadline.time_since_epoch()), false, type, {}};
}
/// As above, at `deadline`, timed in the delay queue behind `timing`.
template <class Target, class Duration>
  requires(!detail::is_time_point_v<std::remove_cvref_t<Target>>)
auto cancel_at(Target&& timing, std::chrono::time_point<clock, Duration> deadline,
               net::cancellation_type_t type = net::cancellation_type::terminal) {
  auto t = detail::timing_of(std::forward<Target>(timing));
  using executor = typename decltype(t)::executor_type;
  return partial_cancel_after<executor>(detail::saturating_duration(deadline.time_since_epoch()), false, type,
                                        std::move(t));
}

/// Adapts `token` so that the operation it completes is cancelled after `timeout`.
/**
 * `co_await sock.async_read_some(buf, metronome::cancel_after(5s, asio::use_awaitable))`
 * completes with `asio::error::operation_aborted` (as the operation reports a
 * cancellation) when 5 s pass first. Works with any completion token (callbacks,
 * `use_awaitable`, `use_future`, `deferred`: the timeout counts from the launch).
 * Asio's forms and order: `cancel_after(timeout[, type], token)`,
 * `cancel_after(timing, timeout[, type], token)`, and the partial forms without a token
 * (partial_cancel_after), e.g. `sock.async_read_some(buf, metronome::cancel_after(5s))`.
 *
 * When time is up, `type` (default terminal) is emitted on the cancellation slot the
 * operation sees, from the handler's associated executor (the rule for any Asio slot:
 * use a serialised one — a strand, an `io_context` thread, a coroutine — when the
 * operation may complete on another thread at the same moment). A slot already
 * associated with the token's handler keeps working: what it emits is forwarded to the
 * operation. The timer is one node in a metronome delay queue: the pool behind the
 * operation's I/O executor (else the handler's executor), or the timing service of that
 * executor's context (an `io_context`'s, driven by its own threads);
 * pass `timing` (an executor or execution context, e.g. a pool on a manual clock) to
 * choose. When the operation completes first, the node leaves the queue at once. After
 * the timing pool's `shutdown()` the timer is kept (and one started later is timed) as a
 * delayed one-shot task is, per `pool_options::run_delayed_after_shutdown` (default: a
 * drain keeps its deadlines; the pool terminates once they fired or their operations
 * completed). With that option off, once the pool has terminated (or the context of
 * its timing service has shut down), the operation runs without a timeout; if the
 * timer cannot be queued for lack of memory, the cancellation is emitted at once.
 */
template <class Rep, class Period, class CompletionToken>
  requires(!std::is_same_v<std::remove_cvref_t<CompletionToken>, net::cancellation_type_t>)
auto cancel_after(std::chrono::duration<Rep, Period> timeout, CompletionToken&& token) {
  return metronome::cancel_after(timeout)(std::forward<CompletionToken>(token));
}

/// As above, emitting `type` (e.g. `cancellation_type::partial`) when time is up.
template <class Rep, class Period, class CompletionToken>
auto cancel_after(std::chrono::duration<Rep, Period> timeout, net::cancellation_type_t type,
                  CompletionToken&& token) {
  return metronome::cancel_after(timeout, type)(std::forward<CompletionToken>(token));
}

/// As above, with the timer in the delay queue behind `timing` (an executor or execution
/// context: a pool, e.g. on a manual clock, or an `io_context`'s timing service). The
/// argument order is Asio's `cancel_after(timer, timeout[, type], token)`.
template <class Target, class Rep, class Period, class CompletionToken>
  requires(!detail::is_duration_v<std::remove_cvref_t<Target>>)
auto cancel_after(Target&& timing, std::chrono::duration<Rep, Period> timeout, net::cancellation_type_t type,
                  CompletionToken&& token) {
  return metronome::cancel_after(std::forward<Target>(timing), timeout, type)(std::forward<CompletionToken>(token));
}

/// As above, emitting `cancellation_type::terminal`.
template <class Target, class Rep, class Period, class CompletionToken>
  requires(!detail::is_duration_v<std::remove_cvref_t<Target>> &&
           !std::is_same_v<std::remove_cvref_t<CompletionToken>, net::cancellation_type_t>)
auto cancel_after(Target&& timing, std::chrono::duration<Rep, Period> timeout, CompletionToken&& token) {
  return metronome::cancel_after(std::forward<Target>(timing), timeout)(std::forward<CompletionToken>(token));
}

/// Adapts `token` so that the operation is cancelled at `deadline`; see cancel_after.
/// Asio's order: `cancel_at(deadline[, type], token)`.
template <class Duration, class CompletionToken>
auto cancel_at(std::chrono::time_point<clock, Duration> deadline, net::cancellation_type_t type,
               CompletionToken&& token) {
  return metronome::cancel_at(deadline, type)(std::forward<CompletionToken>(token));
}

/// As above, emitting `cancellation_type::terminal`.
template <class Duration, class CompletionToken>
  requires(!std::is_same_v<std::remove_cvref_t<CompletionToken>, net::cancellation_type_t>)
auto cancel_at(std::chrono::time_point<clock, Duration> deadline, CompletionToken&& token) {
  return metronome::cancel_at(deadline)(std::forward<CompletionToken>(token));
}

/// As above, with the timer in the delay queue behind `timing`:
/// `cancel_at(timing, deadline[, type], token)`.
template <class Target, class Duration, class CompletionToken>
  requires(!detail::is_time_point_v<std::remove_cvref_t<Target>>)
auto cancel_at(Target&& timing, std::chrono::time_point<clock, Duration> deadline, net::cancellation_type_t type,
               CompletionToken&& token) {
  return metronome::cancel_at(std::forward<Target>(timing), deadline, type)(std::forward<CompletionToken>(token));
}

/// As above, emitting `cancellation_type::terminal`.
template <class Target, class Duration, class CompletionToken>
  requires(!detail::is_time_point_v<std::remove_cvref_t<Target>> &&
           !std::is_same_v<std::remove_cvref_t<CompletionToken>, net::cancellation_type_t>)
auto cancel_at(Target&& timing, std::chrono::time_point<clock, Duration> deadline, CompletionToken&& token) {
  return metronome::cancel_at(std::forward<Target>(timing), deadline)(std::forward<CompletionToken>(token));
}

} // namespace metronome

#include <metronome/impl/cancel_after.hpp>

#endif
