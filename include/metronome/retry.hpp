// async_retry: an asynchronous operation run again with backoff delays.
#ifndef METRONOME_RETRY_HPP
#define METRONOME_RETRY_HPP

#include <metronome/async_delay.hpp>
#include <metronome/backoff.hpp>
#include <metronome/detail/retry_op.hpp>
#include <metronome/detail/task.hpp>

#include <metronome/detail/asio.hpp>

#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>

namespace metronome {

/// The default retry predicate of `async_retry`: every failure is worth another attempt.
struct retry_any {
  template <class Error>
  /// Always true.
  bool operator()(const Error&) const noexcept {
    return true;
  }
};

/// Runs an asynchronous operation again, with `backoff` pauses, until it succeeds.
/**
 * @code
 * auto [ec] = co_await metronome::async_retry(
 *     pool, metronome::backoff({.initial = 100ms, .cap = 5s, .max_retries = 6}),
 *     [&](auto&& token) { return sock.async_connect(ep, std::forward<decltype(token)>(token)); },
 *     asio::as_tuple(asio::use_awaitable));
 * @endcode
 *
 * @param target an Asio executor or execution context: the pauses are `async_delay`
 * waits on it (so a pool on a `manual_clock` times them), and the operation holds
 * outstanding work on it while it runs, as Asio's composed operations do.
 * @param policy the pauses: the first attempt starts at once; after each failed one,
 * `policy.next()` is waited for, and when it says stop the last attempt's result is
 * delivered. `max_retries = N` allows N retries, N + 1 attempts; 0 retries forever.
 * @param op called once per attempt with a completion token, it starts the attempt and
 * returns what the initiating function returns: `[&](auto&& t) { return
 * sock.async_connect(ep, std::forward<decltype(t)>(t)); }`, or a coroutine, `[&](auto&&
 * t) { return asio::co_spawn(ex, call(), std::forward<decltype(t)>(t)); }`. An `op`
 * that takes a `std::size_t` before the token gets the attempt's number, 1 for the
 * first: `[&](std::size_t attempt, auto&& t) { ... }`. Its
 * completion signature (probed as `asio::completion_signature_of` does, or given as
 * the first template argument: `async_retry<void(error_code, std::size_t)>(...)`) is
 * `async_retry`'s, and must start with a `error_code`, a
 * `std::error_code` or a `std::exception_ptr`: an attempt succeeded when it is empty.
 * The callable stays at one address for the whole operation and is called from the
 * handler's executor; it is destroyed before the handler runs.
 * @param retry_if `bool(const Error&)`, asked after each failed attempt whether to try
 * again (default `retry_any`: always); false delivers that attempt's result. It must not
 * throw.
 * @param token any completion token; the handler gets the last attempt's arguments.
 * Default (the form without `retry_if`): `target`'s executor's default token, as for
 * `async_delay` (`deferred` from Asio 1.31; none before, then pass one).
 *
 * Per-operation cancellation (terminal, Asio's default for composed operations)
 * through the handler's slot reaches the running attempt (its operation sees the
 * slot) or the pause. A cancelled attempt's own result is delivered, whatever the
 * predicate says; a cancelled pause delivers `asio::error::operation_aborted` (for a
 * `std::exception_ptr`: a `system_error` with it) and the values of the
 * attempt before it. So does a pause its timing pool aborts (at shutdown). The
 * intermediate handlers run on the handler's associated executor (default: `target`'s)
 * and the state is allocated with its associated allocator. Each pause is one node in
 * the delay queue; there is no other timer.
 *
 * @throws std::invalid_argument if `op` or `retry_if` is empty (a null function
 * pointer, an empty `std::function`); what `op` throws on the first attempt. When `op`
 * throws on a later attempt (before it took its token), the retry ends: with that
 * exception when the error is a `std::exception_ptr` (the other values
 * value-initialised); with another error type the exception leaves the pause's
 * completion, as any Asio handler's does (out of `io_context::run()`, or to the pool's
 * exception handler), and the retry's handler is destroyed unrun.
 *
 * @par Thread Safety
 * As for any Asio operation: emit cancellation from the handler's executor; the
 * operation's I/O objects are used from that executor.
 */
template <class Signature = void, class Target, class Operation,
          class CompletionToken = detail::delay_default_token_t<Target>>
auto async_retry(Target&& target, backoff policy, Operation&& op,
                 CompletionToken&& token = detail::delay_default_token_t<Target>()) {
  return detail::start_retry<Signature>(target, policy, std::forward<Operation>(op), retry_any{},
                                        std::forward<CompletionToken>(token));
}

/// As above, retrying only the failures `retry_if(error)` accepts.
template <class Signature = void, class Target, class Operation, class RetryIf, class CompletionToken>
auto async_retry(Target&& target, backoff policy, Operation&& op, RetryIf&& retry_if, CompletionToken&& token) {
  return detail::start_retry<Signature>(target, policy, std::forward<Operation>(op), std::forward<RetryIf>(retry_if),
                                        std::forward<CompletionToken>(token));
}

} // namespace metronome

#endif
