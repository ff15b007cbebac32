// async_timeout: a coroutine run with a deadline (Tokio's `timeout(d, future)`).
#ifndef METRONOME_ASYNC_TIMEOUT_HPP
#define METRONOME_ASYNC_TIMEOUT_HPP

#include <metronome/async_delay.hpp>

#include <metronome/detail/asio.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <exception>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace metronome {
namespace detail {

inline std::exception_ptr timed_out_exception() {
  return std::make_exception_ptr(system_error(error_code(net::error::timed_out),
                                                             "metronome: async_timeout"));
}

template <class T>
struct timeout_signature {
  using type = void(std::exception_ptr, T);
};
template <>
struct timeout_signature<void> {
  using type = void(std::exception_ptr);
};

// The group's condition: whichever finishes first, the other is cancelled (terminal).
struct cancel_the_other {
  template <class... Args>
  net::cancellation_type_t operator()(Args&&...) const noexcept {
    return net::cancellation_type::terminal;
  }
};

// The group's completion (order, the coroutine's result, the deadline's error_code)
// turned into the coroutine's signature. The deadline won only if its wait completed
// first and without error (an aborted wait: the user's cancellation or a shutdown) -
// and, for a timeout <= 0, only if the coroutine ended aborted (it was suspended when
// cancelled): as Tokio's `timeout(Duration::ZERO, f)` polls `f` first, work that ends
// without suspending delivers its own outcome.
template <class Handler, class T>
class timeout_handler {
public:
  timeout_handler(Handler h, bool zero) : handler_(std::move(h)), zero_(zero) {}

  template <class V>
  void operator()(std::array<std::size_t, 2> order, std::exception_ptr e, V&& v, error_code deadline) {
    if (timed_out(order, e, deadline))
      std::move(handler_)(timed_out_exception(), T());
    else
      std::move(handler_)(std::move(e), std::forward<V>(v));
  }
  void operator()(std::array<std::size_t, 2> order, std::exception_ptr e, error_code deadline) {
    if (timed_out(order, e, deadline))
      std::move(handler_)(timed_out_exception());
    else
      std::move(handler_)(std::move(e));
  }

  const Handler& get() const noexcept { return handler_; }

private:
  bool timed_out(std::array<std::size_t, 2> order, const std::exception_ptr& e, error_code deadline) const noexcept {
    return order[0] == 1 && !deadline && (!zero_ || (e && aborted(e)));
  }
  // The outcome of a coroutine cancelled while suspended (unless it filtered cancellation).
  static bool aborted(const std::exception_ptr& e) noexcept {
    try {
      std::rethrow_exception(e);
    } catch (const system_error& x) {
      return x.code() == net::error::operation_aborted;
    } catch (...) {
      return false;
    }
  }

  Handler handler_;
  bool zero_; // the timeout was <= 0
};

template <class Executor>
class initiate_timeout {
public:
  using executor_type = Executor;
  explicit initiate_timeout(const Executor& ex) : ex_(ex) {}
  executor_type get_executor() const noexcept { return ex_; }

  template <class Handler, class T, class AwaitableExecutor>
  void operator()(Handler&& handler, net::awaitable<T, AwaitableExecutor> coroutine,
                  clock::duration timeout) const {
    namespace x = net::experimental;
    x::make_parallel_group(net::co_spawn(ex_, std::move(coroutine), detail::deferred),
                           async_delay(ex_, timeout, detail::deferred))
        .async_wait(cancel_the_other(), timeout_handler<std::decay_t<Handler>, T>(std::forward<Handler>(handler),
                                                                                  timeout <= clock::duration::zero()));
  }

private:
  Executor ex_;
};

} // namespace detail

/// Runs a coroutine with a deadline: its result, or `asio::error::timed_out`.
/**
 * @code
 * try {
 *   int v = co_await metronome::async_timeout(strand, 2s, fetch(), asio::use_awaitable);
 * } catch (const system_error& e) {
 *   if (e.code() == asio::error::timed_out) ...
 * }
 * @endcode
 * `co_spawn`s `coroutine` on `target`'s executor and waits `timeout` there (an
 * `async_delay`: on a metronome pool, one node of its delay queue, so a `manual_clock`
 * drives it). The signature is `co_spawn`'s: `void(std::exception_ptr, T)`
 * (`void(std::exception_ptr)` for `awaitable<void>`), so `co_await` returns the value
 * or rethrows.
 *
 * - Done first: its value, or its exception, at once (the deadline's wait is cancelled).
 * - Deadline first: the coroutine is cancelled through its cancellation slot
 *   (`cancellation_type::terminal`: the `co_await` it is suspended in throws
 *   `operation_aborted` unless it filtered cancellation), and the operation completes
 *   only once the coroutine has finished — its clean-up included, no frame left
 *   running — with a `system_error` carrying `asio::error::timed_out`
 *   (and a value-initialised `T`), whatever the cancelled coroutine returned or threw.
 * - Per-operation cancellation through the handler's slot cancels both the coroutine
 *   and the deadline; the coroutine's own outcome is delivered (usually
 *   `operation_aborted`). So does a deadline whose pool aborted the wait at shutdown.
 *
 * @param target an Asio executor or execution context: the coroutine is co-spawned on
 * its executor, and the deadline is an `async_delay` there.
 * @param timeout from the launch (with `deferred`, from when the operation is launched);
 * <= 0: due at once, and the coroutine goes first, as Tokio's `timeout(Duration::ZERO,
 * f)` polls `f` first: a coroutine that ends without suspending delivers its value or
 * its exception; one that suspends is cancelled there and times out (unless it catches
 * the cancellation and ends otherwise: then that outcome is delivered).
 * @param coroutine the `asio::awaitable<T>` to run; its executor type must accept
 * `target`'s executor, as for `co_spawn`.
 * @param token any completion token; the handler runs on its associated executor
 * (default: `target`'s). Default token: `target`'s executor's, as for `async_delay`
 * (`deferred` from Asio 1.31; none before, then pass one).
 * @throws std::invalid_argument if `coroutine` is empty (default-constructed or moved
 * from); std::bad_alloc when the operation cannot be started.
 *
 * @par Thread Safety
 * Cancellation reaches the coroutine from the thread where the deadline's wait or the
 * handler's slot completes: as for any coroutine cancelled from outside, give it a
 * serialised executor (a strand, a `serial_executor`, a one-thread pool or an
 * `io_context` run by one thread) when its pool has several threads.
 */
template <class Target, class Rep, class Period, class T, class AwaitableExecutor,
          class CompletionToken = detail::delay_default_token_t<Target>>
auto async_timeout(Target&& target, std::chrono::duration<Rep, Period> timeout,
                   net::awaitable<T, AwaitableExecutor> coroutine,
                   CompletionToken&& token = detail::delay_default_token_t<Target>()) {
  static_assert(detail::is_delay_target_v<Target>,
                "metronome::async_timeout: the first argument must be an Asio executor or execution context");
  if (!coroutine.valid()) throw std::invalid_argument("metronome: async_timeout of an empty awaitable");
  using executor = detail::delay_executor_t<Target>;
  using signature = typename detail::timeout_signature<T>::type;
  return net::async_initiate<CompletionToken, signature>(
      detail::initiate_timeout<executor>(detail::delay_target<std::remove_cvref_t<Target>>::get(target)), token,
      std::move(coroutine), detail::saturating_duration(timeout));
}

} // namespace metronome

namespace METRONOME_NET_NAMESPACE {

template <template <class, class> class Associator, class Handler, class T, class Default>
struct associator<Associator, metronome::detail::timeout_handler<Handler, T>, Default> {
  using type = typename Associator<Handler, Default>::type;
  static type get(const metronome::detail::timeout_handler<Handler, T>& h) noexcept {
    return Associator<Handler, Default>::get(h.get());
  }
  static auto get(const metronome::detail::timeout_handler<Handler, T>& h, const Default& d) noexcept
      -> decltype(Associator<Handler, Default>::get(h.get(), d)) {
    return Associator<Handler, Default>::get(h.get(), d);
  }
};

} // namespace METRONOME_NET_NAMESPACE

#endif
