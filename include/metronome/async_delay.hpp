#ifndef METRONOME_ASYNC_DELAY_HPP
#define METRONOME_ASYNC_DELAY_HPP

#include <metronome/detail/node_cache.hpp>
#include <metronome/detail/pool_core.hpp>
#include <metronome/options.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include <boost/asio/associated_allocator.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/append.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/query.hpp>
#include <boost/system/error_code.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace metronome {
namespace detail {

template <class Executor>
pool_core& pool_core_of(const Executor& ex) {
  decltype(auto) ctx = boost::asio::query(ex, boost::asio::execution::context);
  static_assert(std::is_convertible_v<decltype(ctx), scheduled_thread_pool&>,
                "metronome::async_delay needs a metronome executor (a pool's, or a serial_executor over one)");
  return static_cast<scheduled_thread_pool&>(ctx).core();
}

// One pending delay: a node in the pool's delay queue that owns the handler. The
// node is allocated with the handler's associated allocator and freed before the
// handler runs.
template <class Executor>
bool runs_on_pool(const Executor& ex, const pool_core& core) noexcept {
  if constexpr (requires { boost::asio::query(ex, boost::asio::execution::context); }) {
    decltype(auto) ctx = boost::asio::query(ex, boost::asio::execution::context);
    return &static_cast<const boost::asio::execution_context&>(ctx) == core.context();
  } else {
    return false;
  }
}

template <class Handler, class IoExecutor>
class delay_op final : public wait_node {
  using handler_executor = boost::asio::associated_executor_t<Handler, IoExecutor>;
  using handler_allocator = boost::asio::associated_allocator_t<Handler>;
  using node_alloc = node_allocator_for<handler_allocator>; // std::allocator -> recycling cache
  using alloc_traits = typename std::allocator_traits<typename node_alloc::type>::template rebind_traits<delay_op>;
  using work_guard = boost::asio::executor_work_guard<handler_executor>;

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
    typename alloc_traits::allocator_type a(node_alloc::get(boost::asio::get_associated_allocator(h)));
    delay_op* op = alloc_traits::allocate(a, 1);
    try {
      alloc_traits::construct(a, op, std::move(h), io_ex, core);
    } catch (...) {
      alloc_traits::deallocate(a, op, 1);
      throw;
    }
    auto slot = boost::asio::get_associated_cancellation_slot(op->handler_);
    if (slot.is_connected()) {
      op->slot_connected_ = true;
      slot.template emplace<cancel_handler>(cancel_handler{op, &core});
    }
    if (!core.add_wait(op, due, current)) {
      // The pool has terminated: complete aborted through the handler's executor.
      op->aborted_ = true;
      do_complete(op, false);
    }
  }

  delay_op(Handler&& h, const IoExecutor& io_ex, const pool_core& core)
      : wait_node(&do_complete), handler_(std::move(h)),
        executor_(boost::asio::get_associated_executor(handler_, io_ex)) {
    // Outstanding work for the handler's executor, unless that is this very pool,
    // whose delay queue already keeps it from terminating.
    if (!runs_on_pool(executor_, core)) work_.emplace(executor_);
  }

private:
  // Owns the node until the handler's executor runs it; destroyed unrun (the executor
  // dropped it), it frees the node without invoking the handler.
  struct finisher {
    delay_op* op;
    boost::system::error_code ec;
    finisher(delay_op* o, boost::system::error_code e) noexcept : op(o), ec(e) {}
    finisher(finisher&& o) noexcept : op(std::exchange(o.op, nullptr)), ec(o.ec) {}
    finisher& operator=(finisher&&) = delete;
    ~finisher() {
      if (op) free_node(op);
    }
    void operator()() { std::exchange(op, nullptr)->finish(ec); }
  };

  static void free_node(delay_op* op) noexcept {
    typename alloc_traits::allocator_type a(node_alloc::get(boost::asio::get_associated_allocator(op->handler_)));
    alloc_traits::destroy(a, op);
    alloc_traits::deallocate(a, op, 1);
  }

  // run: a worker fires it (dispatch: inline when the handler's executor is this
  // pool); !run: never ran (shutdown_now / terminated): post from here.
  static void do_complete(task_base* b, unsigned action) {
    const bool run = action == run_action;
    auto* op = static_cast<delay_op*>(b);
    const boost::system::error_code ec =
        (run && !op->aborted_) ? boost::system::error_code() : boost::asio::error::operation_aborted;
    if (op->slot_connected_) {
      // The slot belongs to the handler's executor context (Asio's rule): clear it
      // there, and keep the node alive until then, so that a cancellation emitted in
      // the meantime finds the wait already out of the delay queue and does nothing.
      handler_executor ex(op->executor_);
      if (run)
        boost::asio::dispatch(ex, finisher(op, ec));
      else
        boost::asio::post(ex, finisher(op, ec));
      return;
    }
    Handler handler(std::move(op->handler_));
    handler_executor ex(std::move(op->executor_));
    if (op->work_) {
      work_guard work(std::move(*op->work_)); // held until the handler is queued
      free_node(op);
      deliver(std::move(handler), ex, ec, run);
    } else {
      free_node(op);
      deliver(std::move(handler), ex, ec, run);
    }
  }

  // On the handler's executor.
  void finish(boost::system::error_code ec) {
    boost::asio::get_associated_cancellation_slot(handler_).clear();
    Handler handler(std::move(handler_));
    free_node(this); // releases the work guard too: we are running on that executor
    std::move(handler)(ec);
  }

  static void deliver(Handler&& handler, const handler_executor& ex, boost::system::error_code ec, bool run) {
    if (run)
      boost::asio::dispatch(ex, boost::asio::append(std::move(handler), ec));
    else
      boost::asio::post(ex, boost::asio::append(std::move(handler), ec));
  }

  Handler handler_;
  handler_executor executor_;
  std::optional<work_guard> work_;
  bool slot_connected_ = false;
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
 * its associated allocator. Per-operation cancellation (any type: terminal, partial,
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
