// Template bodies of scheduled_future (get, wait, async_wait).
#ifndef METRONOME_IMPL_SCHEDULED_FUTURE_HPP
#define METRONOME_IMPL_SCHEDULED_FUTURE_HPP

#include <metronome/detail/handler_op.hpp>
#include <metronome/detail/test_hooks.hpp>

#include <metronome/detail/asio.hpp>

#include <exception>
#include <future>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace metronome {
namespace detail {

template <class R>
struct wait_signature_of {
  using type = void(std::exception_ptr, R);
};
template <>
struct wait_signature_of<void> {
  using type = void(std::exception_ptr);
};
template <class R>
using wait_signature = typename wait_signature_of<R>::type;

// Holds the handler of one async_wait until the task ends, then hands the result to
// the handler's associated executor. Completed by the thread that ran the task, it
// dispatches (a handler with no executor of its own runs right there); ended by any
// other call (cancel(), dispose(), shutdown_now(), the pool's destruction), it never
// runs inside that call: posted to the handler's executor, or, with none, queued on the
// task's pool (through `repost_`, a node inside this one: no allocation) - unless that
// pool has no thread left (deliver_elsewhere).
// Per-operation cancellation (any type: abandoning a wait does nothing to the task)
// takes the hook out of the task's list, if the task has not ended, and completes it
// with operation_aborted, never inside the emit (the same way: posted, or queued on the
// task's pool). Whoever takes the hook out of the list (the task's
// ending, or the cancellation; under the task's stripe mutex) completes it, once.
// The hook holds a reference on the task until it is destroyed, so the slot's handler,
// which reaches the task, never meets a freed one.
template <class R, class Handler>
class wait_hook final : public completion_hook,
                        public handler_op<wait_hook<R, Handler>, Handler, net::system_executor> {
  using handler_base = handler_op<wait_hook, Handler, net::system_executor>;
  friend handler_base;
  static constexpr bool has_own_executor = detail::has_own_executor<Handler>;

public:
  wait_hook(Handler&& h, scheduled_task_base* task)
      : handler_base(std::move(h), net::system_executor()), task_(task), repost_(this) {
    this->hold_work();
    task_->add_ref();
    this->template connect_slot<canceller>(this);
  }
  ~wait_hook() { task_->release(); }

  void on_complete(bool by_runner) noexcept override {
    if (by_runner)
      deliver(false);
    else if constexpr (has_own_executor)
      deliver(true);
    else
      task_->deliver_elsewhere(&repost_);
  }

  // `immediate`: the task had ended before a call that must not run the handler inline.
  void deliver(bool immediate) noexcept {
    try {
      std::exception_ptr e = outcome();
      auto args = std::tuple_cat(std::make_tuple(e), result(e));
      std::apply([&](auto&... a) { this->complete_with(!immediate, std::move(a)...); }, args);
    } catch (...) { // copying the value failed: the handler is lost, so say so
      report_here(std::current_exception(), "completion");
      release_node(this);
    }
  }

  // The task had already ended when async_wait was called: the handler runs on its
  // executor, or with none on the task's pool, never inside async_wait (unless that pool
  // has no thread left). Out of memory,
  // async_wait throws and nothing is left behind (the handler is destroyed unrun).
  // (Through the system executor, a plain callback's first completion made Asio's
  // system_context, whose failure was reported and the handler lost.)
  void deliver_at_initiation() {
    if constexpr (has_own_executor) {
      const std::exception_ptr e = outcome();
      std::optional<decltype(std::tuple_cat(std::make_tuple(e), result(e)))> args;
      try {
        args.emplace(std::tuple_cat(std::make_tuple(e), result(e)));
      } catch (...) { // copying the value failed
        release_node(this);
        throw;
      }
      // The completion owns the node from here: released even when the post throws.
      std::apply([&](auto&... a) { this->complete_at_initiation(std::move(a)...); }, *args);
    } else {
      task_->deliver_elsewhere(&repost_);
    }
  }

private:
  struct canceller {
    explicit canceller(wait_hook* h) noexcept : self(h) {}
    wait_hook* self;
    void operator()(net::cancellation_type_t type) const noexcept {
      if (type == net::cancellation_type::none || !self->task_->remove_hook(self)) return;
      METRONOME_TEST_HOOK(hook_point::wait_removed_before_abort);
      self->abort();
    }
  };

  // Taken out of the task's list by a cancellation: the task goes on, the wait ends,
  // posted to the handler's executor or, with none, queued on the task's pool as any
  // completion ended elsewhere (never onto Asio's system_context and its threads).
  void abort() noexcept {
    if constexpr (has_own_executor) {
      complete_aborted(false);
    } else {
      repost_.aborted = true;
      task_->deliver_elsewhere(&repost_);
    }
  }
  void complete_aborted(bool may_run_inline) noexcept {
    std::exception_ptr e =
        std::make_exception_ptr(system_error(net::error::operation_aborted));
    if constexpr (std::is_void_v<R>)
      this->complete_with(may_run_inline, std::move(e));
    else
      this->complete_with(may_run_inline, std::move(e), R{});
  }

  // Runs the completion on the task's pool (deliver_elsewhere). A completion, as a wait
  // is: discarded (after shutdown_now(), or met by a termination) it still delivers, on
  // the discarding thread - never lost.
  struct repost_node final : task_base {
    explicit repost_node(wait_hook* o) noexcept : task_base(&run), owner(o) { kind_ = task_kind::completion; }
    static void run(task_base* t, unsigned, void*) {
      wait_hook* o = static_cast<repost_node*>(t)->owner;
      if (static_cast<repost_node*>(t)->aborted)
        o->complete_aborted(true);
      else
        o->deliver(false);
    }
    wait_hook* owner;
    bool aborted = false; // taken out by its cancellation slot: ends with operation_aborted
  };

  static void release_node(wait_hook* h) noexcept { handler_base::destroy(h); }

  // The task's exception, or the claim's (scheduled_result::claim_value): a null
  // result claims the value, and result() reads it next.
  std::exception_ptr outcome() const {
    std::exception_ptr e = task_->failure();
    if constexpr (!std::is_void_v<R>) {
      if (!e) e = static_cast<scheduled_result<R>&>(*task_).claim_value();
    }
    return e;
  }

  auto result(const std::exception_ptr& e) {
    if constexpr (std::is_void_v<R>) {
      return std::tuple<>();
    } else {
      auto& r = static_cast<scheduled_result<R>&>(*task_);
      if (e || !r.value_) return std::tuple<R>(R{});
      return std::tuple<R>(r.claimed_value());
    }
  }

  scheduled_task_base* task_;
  repost_node repost_;
};

} // namespace detail

/**
 * Completes with `void(std::exception_ptr)` (R = void) or `void(std::exception_ptr, R)`
 * when the task ends: a null pointer and the value; the task's exception; or a
 * `cancelled_error`. So `co_await f.async_wait(net::use_awaitable)` returns
 * the value or rethrows. The handler runs on its associated executor: dispatched from
 * the thread that ran the task when its run ends it (inline there when it has none);
 * posted when anything else ends it (`cancel()`, `dispose()`, `shutdown_now()`, the
 * pool's destructor), with no executor of its own to the task's pool - never inside the
 * call that ended the task, unless that pool has no thread left to run it (destroyed or
 * terminated: then on the calling thread). A wait started on a task that has already
 * ended completes the same way, posted: never inside `async_wait` (but for that same
 * case of a pool with no thread left). Allocated with its associated allocator;
 * outstanding work on that executor is held until the completion has been handed to
 * it (Asio's rule). A handler that throws is reported to the exception handler of the
 * pool whose thread runs it (else printed to stderr). Any number of waits may be
 * pending. For a periodic task it completes when the task stops. `R` must be default-
 * constructible (errors complete with `R{}`). A move-only `R` is moved into the first
 * completion (or `get()`) that takes it; the others complete with a
 * `std::future_error` (`future_already_retrieved`) and `R{}`, as a second `get()` throws.
 */
template <class R>
template <class CompletionToken>
auto scheduled_future<R>::async_wait(CompletionToken&& token) {
  static_assert(std::is_void_v<R> || std::is_default_constructible_v<R>,
                "metronome: async_wait needs a default-constructible R (an error completes with R{}, as co_spawn's "
                "void(std::exception_ptr, T) does); wait on a scheduled_future<std::optional<R>> instead");
  checked();
  // The initiation holds its own handle: with `deferred` it may launch later.
  return net::async_initiate<CompletionToken, detail::wait_signature<R>>(
      [](auto handler, scheduled_future self) {
        using H = std::decay_t<decltype(handler)>;
        auto* hook = detail::wait_hook<R, H>::create(std::move(handler), self.task_.get());
        if (!self.task_->add_hook(hook)) hook->deliver_at_initiation();
      },
      token, *this);
}

} // namespace metronome

#endif
