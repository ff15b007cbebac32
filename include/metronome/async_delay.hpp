#ifndef METRONOME_ASYNC_DELAY_HPP
#define METRONOME_ASYNC_DELAY_HPP

#include <metronome/detail/handler_op.hpp>
#include <metronome/detail/pool_core.hpp>
#include <metronome/detail/pool_locator.hpp>
#include <metronome/detail/pool_of.hpp>
#include <metronome/detail/serial_core.hpp>
#include <metronome/detail/timing_of.hpp>
#include <metronome/options.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/detail/asio.hpp>

#include <chrono>
#include <type_traits>
#include <utility>

namespace metronome {
namespace detail {

template <class T>
inline constexpr bool is_any_executor_v =
    net::execution::is_executor<T>::value || net::is_executor<T>::value;

template <class T>
inline constexpr bool is_context_v = std::is_convertible_v<T&, net::execution_context&>;

// The executor a wait started on `T` (an executor or an execution context) completes on.
template <class T, class = void>
struct delay_target {
  using executor_type = void; // neither: async_delay's static_assert says so
};
template <class T>
struct delay_target<T, std::enable_if_t<is_any_executor_v<T>>> {
  using executor_type = T;
  static const T& get(const T& ex) noexcept { return ex; }
};
template <class T>
struct delay_target<T, std::enable_if_t<!is_any_executor_v<T> && is_context_v<T>>> {
  using executor_type = decltype(std::declval<T&>().get_executor());
  static executor_type get(T& ctx) noexcept { return ctx.get_executor(); }
};

template <class T>
using delay_executor_t = typename delay_target<std::remove_cvref_t<T>>::executor_type;

struct no_default_token {}; // the target has none: a token must be passed

template <class T, class = void>
struct delay_default_token {
  using type = no_default_token;
};
template <class T>
struct delay_default_token<
    T, std::enable_if_t<!std::is_void_v<net::default_completion_token_t<delay_executor_t<T>>>>> {
  using type = net::default_completion_token_t<delay_executor_t<T>>;
};
template <class T>
using delay_default_token_t = typename delay_default_token<T>::type;

template <class T>
inline constexpr bool is_delay_target_v = !std::is_void_v<delay_executor_t<T>>;

template <class>
inline constexpr bool always_false_v = false;

template <class Executor>
bool runs_on_pool(const Executor& ex, const pool_core& core) noexcept {
  if constexpr (requires { net::query(ex, net::execution::context); }) {
    decltype(auto) ctx = net::query(ex, net::execution::context);
    return &static_cast<const net::execution_context&>(ctx) == core.context();
  } else {
    return false;
  }
}

// One pending delay: a node in the pool's delay queue that owns the handler.
template <class Handler, class IoExecutor>
class delay_op final : public wait_node, public handler_op<delay_op<Handler, IoExecutor>, Handler, IoExecutor> {
  using handler_base = handler_op<delay_op, Handler, IoExecutor>;
  friend handler_base;

  // The slot stays connected until the completion clears it in the handler's context,
  // which may be after the pool is gone: the pool is reached through its anchor.
  struct cancel_handler {
    delay_op* op;
    pool_anchor* anchor;
    std::uint32_t generation;
    void operator()(net::cancellation_type_t type) const {
      if (type != net::cancellation_type::none) pool_core::cancel_wait(anchor, generation, op);
    }
  };

public:
  static void start(Handler&& h, const IoExecutor& io_ex, pool_core& core, clock::time_point due,
                    clock::time_point current) {
    delay_op* d = handler_base::create(std::move(h), io_ex, core);
    bool queued = false;
    try {
      queued = core.add_wait(d, due, current);
    } catch (...) {
      handler_base::destroy(d);
      throw;
    }
    if (!queued) { // the pool has terminated: complete aborted, through the handler's executor
      d->aborted_ = true; // (out of memory for that post: the handler is destroyed unrun and this throws)
      d->complete_at_initiation(error_code(net::error::operation_aborted));
    }
  }

  delay_op(Handler&& h, const IoExecutor& io_ex, pool_core& core)
      : wait_node(&do_complete), handler_base(std::move(h), io_ex) {
    // Outstanding work for the handler's executor, unless that is this very pool,
    // whose delay queue already keeps it from terminating.
    if (!runs_on_pool(this->handler_executor(), core)) this->hold_work();
    this->template connect_slot<cancel_handler>(cancel_handler{this, core.anchor(), core.anchor_generation()});
  }

private:
  static void release_node(delay_op* d) noexcept { handler_base::destroy(d); }

  // run: a worker fires it (dispatch: inline when the handler's executor is this pool);
  // discard: it never ran (shutdown_now, terminated pool): post. A connected slot keeps
  // the node until the handler's context clears it, so that a cancellation emitted in
  // the meantime finds the wait already out of the delay queue and does nothing.
  static void do_complete(task_base* b, unsigned action, void* /*io*/) {
    auto* d = static_cast<delay_op*>(b);
    const bool run = action == run_action;
    d->complete_with(run, (run && !d->aborted_) ? error_code()
                                                : error_code(net::error::operation_aborted));
  }
};

template <class Executor>
class initiate_delay {
public:
  using executor_type = Executor;
  explicit initiate_delay(const Executor& ex) : ex_(ex) {}
  executor_type get_executor() const noexcept { return ex_; }

  // relative: the delay counts from launch (matters for `deferred`).
  template <class Handler>
  void operator()(Handler&& handler, clock::duration amount, bool relative) const {
    pool_core& core = pool_core_of(ex_);
    const clock::time_point current = core.now();
    const clock::time_point due = relative ? saturating_add(current, amount) : clock::time_point(amount);
    using H = std::decay_t<Handler>; // a named (lvalue) handler is copied, as by any Asio operation
    delay_op<H, Executor>::start(H(std::forward<Handler>(handler)), ex_, core, due, current);
  }

private:
  Executor ex_;
};

// Both entry points: the wait on `target` for `amount` (from launch when `relative`).
template <class Target, class CompletionToken>
auto start_delay(Target& target, clock::duration amount, bool relative, CompletionToken&& token) {
  using executor = delay_executor_t<Target>;
  return net::async_initiate<CompletionToken, void(error_code)>(
      initiate_delay<executor>(delay_target<std::remove_cvref_t<Target>>::get(target)), token, amount, relative);
}

} // namespace detail

/// Waits for `delay` as an Asio asynchronous operation, on any executor.
/**
 * @param target an Asio executor or execution context: a `scheduled_thread_pool` or its
 * executor, a `serial_executor`, an `io_context` or its executor, a strand, an
 * `any_io_executor`... When a metronome pool is behind it, the wait is one node in that
 * pool's delay queue (no timer object); otherwise one node in the timing service of the
 * executor's execution context (an `io_context`'s: one Asio timer for all its waits,
 * driven by the threads that run it), which reads the real clock.
 * @param delay <= 0 completes as soon as the pool or timing service takes it (never
 * inside this call); too large saturates. With `deferred`, the delay counts from the launch.
 * @param token any completion token; signature `void(error_code)`.
 *
 * The handler runs through its associated executor (default: `target`'s executor) —
 * inline on the firing pool thread when that is the pool itself — and the node is
 * allocated with its associated allocator. Until the completion has been handed to
 * that executor, the operation holds outstanding work on it, and lets go on the
 * completing thread once the executor took it (Asio's rule: `io_context::run()` does
 * not return while a wait is pending, nor while its completion is being posted). A handler that
 * throws is reported to the exception handler of the pool whose thread runs it; off a
 * pool it leaves the Asio handler that ran it (`io_context::run()` throws it: Asio's
 * rule, docs/semantics.md "Exceptions"). Per-operation cancellation (any type: terminal, partial,
 * total) through the associated cancellation slot takes the wait out of the delay
 * queue and completes it with `asio::error::operation_aborted`; a wait that already
 * fell due completes normally. Over an `io_context`, every due wait completes inside
 * one handler of its timing service, so one `run_one()` may run several of them
 * (docs/semantics.md, "Exceptions"). Waits pending at the timing pool's `shutdown()` (or the
 * context's, for a timing service), and
 * waits started after it, complete with `operation_aborted`. As for any Asio slot, emit
 * the cancellation signal from the handler's executor context.
 */
template <class Target, class Rep, class Period, class CompletionToken = detail::delay_default_token_t<Target>>
auto async_delay(Target&& target, std::chrono::duration<Rep, Period> delay,
                 CompletionToken&& token = detail::delay_default_token_t<Target>()) {
  if constexpr (detail::is_delay_target_v<Target>) {
    return detail::start_delay(target, detail::saturating_duration(delay), true, std::forward<CompletionToken>(token));
  } else {
    static_assert(detail::always_false_v<Target>,
                  "metronome::async_delay: the first argument must be an Asio executor or execution context");
  }
}

/// Waits until `when` (a `metronome::clock` time point); see async_delay.
template <class Target, class Duration, class CompletionToken = detail::delay_default_token_t<Target>>
auto async_delay_until(Target&& target, std::chrono::time_point<clock, Duration> when,
                       CompletionToken&& token = detail::delay_default_token_t<Target>()) {
  if constexpr (detail::is_delay_target_v<Target>) {
    return detail::start_delay(target, detail::saturating_duration(when.time_since_epoch()), false,
                               std::forward<CompletionToken>(token));
  } else {
    static_assert(detail::always_false_v<Target>,
                  "metronome::async_delay_until: the first argument must be an Asio executor or execution context");
  }
}

} // namespace metronome

#endif
