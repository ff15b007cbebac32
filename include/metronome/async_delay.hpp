// async_delay and async_delay_until: Asio operations that wait on a metronome pool's
// delay queue.
#ifndef METRONOME_ASYNC_DELAY_HPP
#define METRONOME_ASYNC_DELAY_HPP

#include <metronome/detail/handler_op.hpp>
#include <metronome/detail/pool_of.hpp>
#include <metronome/options.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include <boost/asio/async_result.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/query.hpp>
#include <boost/system/error_code.hpp>

#include <chrono>
#include <type_traits>
#include <utility>

namespace metronome {
namespace detail {

template <class Executor>
pool_core& pool_core_of(const Executor& ex) noexcept {
  static_assert(runs_on_a_metronome_pool<Executor>(),
                "metronome::async_delay needs a metronome executor (a pool's, or a serial_executor over one)");
  return *pool_of(ex);
}

template <class Executor>
bool runs_on_pool(const Executor& ex, const pool_core& core) noexcept {
  if constexpr (requires { boost::asio::query(ex, boost::asio::execution::context); }) {
    decltype(auto) ctx = boost::asio::query(ex, boost::asio::execution::context);
    return &static_cast<const boost::asio::execution_context&>(ctx) == core.context();
  } else {
    return false;
  }
}

// One pending delay: a node in the pool's delay queue that owns the handler.
template <class Handler, class IoExecutor>
class delay_op final : public wait_node, public handler_op<delay_op<Handler, IoExecutor>, Handler, IoExecutor> {
  using handler_base = handler_op<delay_op, Handler, IoExecutor>;
  friend handler_base;

  struct cancel_handler {
    delay_op* op;
    pool_core* core;
    void operator()(boost::asio::cancellation_type_t type) const {
      if (type != boost::asio::cancellation_type::none) core->cancel_wait(op);
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
      d->aborted_ = true;
      do_complete(d, discard_action);
    }
  }

  delay_op(Handler&& h, const IoExecutor& io_ex, pool_core& core)
      : wait_node(&do_complete), handler_base(std::move(h), io_ex) {
    // Outstanding work for the handler's executor, unless that is this very pool,
    // whose delay queue already keeps it from terminating.
    if (!runs_on_pool(this->handler_executor(), core)) this->hold_work();
    this->template connect_slot<cancel_handler>(cancel_handler{this, &core});
  }

private:
  static void release_node(delay_op* d) noexcept { handler_base::destroy(d); }

  // run: a worker fires it (dispatch: inline when the handler's executor is this pool);
  // discard: it never ran (shutdown_now, terminated pool): post. A connected slot keeps
  // the node until the handler's context clears it, so that a cancellation emitted in
  // the meantime finds the wait already out of the delay queue and does nothing.
  static void do_complete(task_base* b, unsigned action) {
    auto* d = static_cast<delay_op*>(b);
    const bool run = action == run_action;
    d->complete_with(run, (run && !d->aborted_) ? boost::system::error_code()
                                                : boost::system::error_code(boost::asio::error::operation_aborted));
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

} // namespace detail

/// Waits for `delay` on a metronome pool's delay queue, as an Asio asynchronous operation.
/**
 * @param ex a metronome executor: a `scheduled_thread_pool`'s, or a `serial_executor`
 * over one. The wait is one node in that pool's delay queue (no timer object).
 * @param delay <= 0 completes as soon as a worker takes it (never inside this call);
 * too large saturates. With `deferred`, the delay counts from the launch.
 * @param token any completion token; signature `void(boost::system::error_code)`.
 *
 * The handler runs through its associated executor (default: `ex`) — inline on the
 * firing pool thread when that is the pool itself — and the node is allocated with
 * its associated allocator. Until the handler has run, the operation holds outstanding
 * work on that executor, and lets it go there, after the handler. A handler that throws
 * is reported to the exception handler of the pool whose thread runs it (else printed
 * to stderr). Per-operation cancellation (any type: terminal, partial,
 * total) through the associated cancellation slot takes the wait out of the delay
 * queue and completes it with `asio::error::operation_aborted`; a wait that already
 * fell due completes normally. Waits pending at `shutdown()`, and waits started after
 * it, complete with `operation_aborted`. As for any Asio slot, emit the cancellation
 * signal from the handler's executor context.
 */
template <class Executor, class Rep, class Period,
          class CompletionToken = boost::asio::default_completion_token_t<Executor>>
auto async_delay(const Executor& ex, std::chrono::duration<Rep, Period> delay,
                 CompletionToken&& token = boost::asio::default_completion_token_t<Executor>()) {
  return boost::asio::async_initiate<CompletionToken, void(boost::system::error_code)>(
      detail::initiate_delay<Executor>(ex), token, detail::saturating_duration(delay), true);
}

/// Waits until `when` on a metronome pool's delay queue; see async_delay.
template <class Executor, class Duration, class CompletionToken = boost::asio::default_completion_token_t<Executor>>
auto async_delay_until(const Executor& ex, std::chrono::time_point<clock, Duration> when,
                       CompletionToken&& token = boost::asio::default_completion_token_t<Executor>()) {
  return boost::asio::async_initiate<CompletionToken, void(boost::system::error_code)>(
      detail::initiate_delay<Executor>(ex), token, detail::saturating_duration(when.time_since_epoch()), false);
}

} // namespace metronome

#endif
