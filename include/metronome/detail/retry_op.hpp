// async_retry's composed operation (include/metronome/retry.hpp).
#ifndef METRONOME_DETAIL_RETRY_OP_HPP
#define METRONOME_DETAIL_RETRY_OP_HPP

#include <metronome/async_delay.hpp>
#include <metronome/backoff.hpp>
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

namespace detail {

template <class Signature>
struct retry_signature_traits {
  static constexpr bool valid = false;
};
template <class Error, class... Args>
struct retry_signature_traits<void(Error, Args...)> {
  static constexpr bool valid = std::is_same_v<Error, error_code> ||
                                std::is_same_v<Error, std::error_code> || std::is_same_v<Error, std::exception_ptr>;
};

// The operation is called `op(token)`, or `op(attempt, token)` when it takes the
// attempt's number (1 for the first) before its token.
template <class Operation, class Token>
inline constexpr bool takes_attempt_v = std::is_invocable_v<Operation&, std::size_t, Token>;

// Signature = void: the operation's own, probed as Asio does (`op(token)`, or
// `op(1, token)`).
template <class Signature, class Operation, class = void>
struct retry_signature {
  using type = Signature;
};
template <class Operation>
struct retry_signature<void, Operation, std::enable_if_t<!takes_attempt_v<Operation, signature_probe>>> {
  using type = detail::completion_signature_of_t<Operation&>;
};
template <class Operation>
struct retry_signature<void, Operation, std::enable_if_t<takes_attempt_v<Operation, signature_probe>>> {
  using type = typename decltype(std::declval<Operation&>()(std::size_t{1}, signature_probe{}))::type;
};

// What a retry that was cancelled during a pause (or whose pause its timing pool
// aborted) reports in place of the last attempt's error.
template <class Error>
Error aborted_retry_error() {
  const error_code aborted(net::error::operation_aborted);
  if constexpr (std::is_same_v<Error, std::exception_ptr>)
    return std::make_exception_ptr(system_error(aborted));
  else
    return Error(aborted);
}

template <class Executor, class Operation, class RetryIf, class Signature>
class retry_op;

// The composed operation handed to one attempt. Its first move (the attempt's initiating
// function taking it) sets `taken`: if the attempt throws before that, the retry still
// holds its own handler and can complete with the exception (retry_op::attempt).
template <class Self>
class attempt_handler {
public:
  attempt_handler(Self&& self, bool* taken) noexcept : self_(std::move(self)), taken_(taken) {}
  attempt_handler(attempt_handler&& o) noexcept : self_(std::move(o.self_)), taken_(o.taken_) { *taken_ = true; }
  attempt_handler(const attempt_handler&) = delete;
  attempt_handler& operator=(const attempt_handler&) = delete;
  attempt_handler& operator=(attempt_handler&&) = delete;
  ~attempt_handler() = default;

  template <class... A>
  void operator()(A&&... a) {
    self_(std::forward<A>(a)...);
  }
  const Self& get() const noexcept { return self_; }
  Self& self() noexcept { return self_; }

private:
  Self self_;
  bool* taken_;
};

// Ground rules. One attempt or one pause is outstanding at a time, never both; `pausing`
// says which one the next invocation completes. The operation, the predicate and the
// backoff live in `state`, allocated with the handler's associated allocator, so that
// an attempt's operation keeps its address while the composed operation moves into the
// attempt's handler. The state is freed before the user's handler runs.
template <class Executor, class Operation, class RetryIf, class Error, class... Args>
class retry_op<Executor, Operation, RetryIf, void(Error, Args...)> {
  using values = std::tuple<Error, std::decay_t<Args>...>;

  // What the operation is made of, until the launch allocates its state.
  struct parts {
    Executor ex;
    Operation op;
    RetryIf retry_if;
    backoff policy;
  };
  struct state : parts {
    explicit state(parts&& p) : parts(std::move(p)) {}
    std::optional<values> last; // the failed attempt the pause follows
    bool pausing = false;
    bool started = false;        // the first attempt was started (it throws out of async_retry)
    bool handler_taken = false;  // the running attempt took its handler (attempt_handler)
    std::size_t attempts = 0;    // started so far (the running one's number)
  };

public:
  retry_op(const Executor& ex, Operation op, RetryIf retry_if, backoff policy)
      : init_{ex, std::move(op), std::move(retry_if), policy} {}

  // Launch: the first attempt at once.
  template <class Self>
  void operator()(Self& self) {
    using alloc = typename std::allocator_traits<typename Self::allocator_type>::template rebind_alloc<state>;
    state_ = std::allocate_shared<state>(alloc(self.get_allocator()), std::move(init_));
    attempt(self);
  }

  // An attempt's completion (`Error, Args...`) or a pause's (`error_code`): `pausing` says which.
  template <class Self, class A0, class... A>
  void operator()(Self& self, A0&& a0, A&&... a) {
    constexpr bool pause_like = sizeof...(A) == 0 && std::is_convertible_v<A0, error_code>;
    constexpr bool attempt_like = std::is_constructible_v<values, A0&&, A&&...>;
    static_assert(pause_like || attempt_like,
                  "metronome::async_retry: the operation completed with arguments its signature does not take");
    if (state_->pausing) {
      if constexpr (pause_like) pause_done(self, error_code(std::forward<A0>(a0)));
      return;
    }
    if constexpr (attempt_like) attempt_done(self, values(std::forward<A0>(a0), std::forward<A>(a)...));
  }

private:
  // A later attempt that throws before taking its handler ends the retry: with that
  // exception when the signature's error is an exception_ptr (the other values
  // value-initialised); otherwise the exception leaves this intermediate handler (out of
  // the executor's run(), as for any Asio handler) and the retry's handler is destroyed
  // unrun. The first attempt's exception leaves async_retry itself.
  template <class Self>
  void attempt(Self& self) {
    state_->pausing = false;
    std::shared_ptr<state> keep = state_; // the operation must outlive its own call
    const bool first = !keep->started;
    keep->started = true;
    keep->handler_taken = false;
    attempt_handler<Self> h(std::move(self), &keep->handler_taken);
    ++keep->attempts;
    try {
      if constexpr (takes_attempt_v<Operation, attempt_handler<Self>>)
        keep->op(keep->attempts, std::move(h));
      else
        keep->op(std::move(h));
    } catch (...) {
      if constexpr (std::is_same_v<Error, std::exception_ptr> && (std::is_default_constructible_v<std::decay_t<Args>> && ...)) {
        if (!first && !keep->handler_taken) return finish(h.self(), values(std::current_exception(), std::decay_t<Args>()...));
      }
      throw;
    }
  }

  template <class Self>
  void attempt_done(Self& self, values&& v) {
    state& s = *state_;
    const Error& e = std::get<0>(v);
    if (!e || self.get_cancellation_state().cancelled() != net::cancellation_type::none || !s.retry_if(e))
      return finish(self, std::move(v));
    const std::optional<clock::duration> pause = s.policy.next();
    if (!pause) return finish(self, std::move(v)); // attempts ran out: the last error
    s.last.emplace(std::move(v));
    s.pausing = true;
    const Executor ex = s.ex;
    async_delay(ex, *pause, std::move(self));
  }

  template <class Self>
  void pause_done(Self& self, error_code ec) {
    state& s = *state_;
    if (ec || self.get_cancellation_state().cancelled() != net::cancellation_type::none) {
      values v = std::move(*s.last);
      std::get<0>(v) = aborted_retry_error<Error>();
      return finish(self, std::move(v));
    }
    s.last.reset();
    attempt(self);
  }

  template <class Self>
  void finish(Self& self, values&& v) {
    values out(std::move(v));
    state_.reset(); // freed before the upcall, as Asio's operations do
    std::apply([&](auto&&... x) { self.complete(std::move(x)...); }, std::move(out));
  }

  parts init_; // moved into state_ at the launch
  std::shared_ptr<state> state_;
};

template <class Signature, class Target, class Operation, class RetryIf, class CompletionToken>
auto start_retry(Target& target, const backoff& policy, Operation&& op, RetryIf&& retry_if, CompletionToken&& token) {
  static_assert(is_delay_target_v<Target>,
                "metronome::async_retry: the first argument must be an Asio executor or execution context");
  using op_type = std::decay_t<Operation>;
  using sig = typename retry_signature<Signature, op_type>::type;
  static_assert(retry_signature_traits<sig>::valid,
                "metronome::async_retry: the operation must complete with an error first "
                "(error_code, std::error_code or std::exception_ptr)");
  if (is_empty_callable(op)) throw std::invalid_argument("metronome: async_retry of an empty operation");
  if (is_empty_callable(retry_if)) throw std::invalid_argument("metronome: async_retry with an empty predicate");
  using executor = delay_executor_t<Target>;
  const executor ex = delay_target<std::remove_cvref_t<Target>>::get(target);
  return net::async_compose<CompletionToken, sig>(
      retry_op<executor, op_type, std::decay_t<RetryIf>, sig>(ex, std::forward<Operation>(op),
                                                              std::forward<RetryIf>(retry_if), policy),
      token, ex);
}

} // namespace detail

} // namespace metronome

namespace METRONOME_NET_NAMESPACE {

template <template <class, class> class Associator, class Self, class Default>
struct associator<Associator, metronome::detail::attempt_handler<Self>, Default> {
  using type = typename Associator<Self, Default>::type;
  static type get(const metronome::detail::attempt_handler<Self>& h) noexcept { return Associator<Self, Default>::get(h.get()); }
  static auto get(const metronome::detail::attempt_handler<Self>& h, const Default& d) noexcept
      -> decltype(Associator<Self, Default>::get(h.get(), d)) {
    return Associator<Self, Default>::get(h.get(), d);
  }
};

} // namespace METRONOME_NET_NAMESPACE

#endif
