// Template bodies of wheel_timer (its nodes, schedule, async_wait).
#ifndef METRONOME_IMPL_WHEEL_TIMER_HPP
#define METRONOME_IMPL_WHEEL_TIMER_HPP

#include <metronome/detail/handler_op.hpp>
#include <metronome/detail/node_cache.hpp>

#include <metronome/detail/asio.hpp>

#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace metronome {

namespace detail {

template <class F>
class wheel_task final : public wheel_entry {
public:
  // refs: the wheel's and the returned handle's.
  static wheel_task* create(F&& f) { return construct_node<wheel_task>(node_lifetime::timed, std::move(f)); }

private:
  friend class wheel_entry;
  friend struct node_access;
  // Cancelled only through handles, which hold references.
  static constexpr bool cancellers_hold_refs = true;
  explicit wheel_task(F&& f) : wheel_entry(&dispatch_action<wheel_task>, 2) { ::new (&storage_) F(std::move(f)); }
  ~wheel_task() = default;

  F& fn() noexcept { return *std::launder(reinterpret_cast<F*>(&storage_)); }

  void on_fire() noexcept {
    try {
      fn()();
    } catch (...) {
      wheel_core::report(this, std::current_exception());
    }
  }
  void on_drop() noexcept {
    if (live_) {
      live_ = false;
      fn().~F();
    }
  }
  void on_cancel_queued() noexcept { on_drop(); } // the callable goes at once
  void on_discarded() noexcept { on_drop(); }
  void on_settled_cancelled(bool) noexcept {} // the cancel dropped it
  void on_destroy() noexcept {
    on_drop();
    this->~wheel_task();
    node_deallocate(this, sizeof(wheel_task));
  }

  bool live_ = true; // the callable is constructed (guarded by the entry's state machine)
  alignas(F) unsigned char storage_[sizeof(F)];
};

// A timeout whose function captures one pointer is one 64-byte node (no vtable; small
// fields in the task header's padding; Itanium C++ ABI layout, as g++ and clang use).
struct one_pointer_timeout {
  void* p;
  void operator()() const {}
};
static_assert(sizeof(wheel_task<one_pointer_timeout>) <= 64, "metronome: a small timeout is one 64-byte node");

// A wheel's async_wait: the node holds the handler. Every completion of a wait on a
// metronome pool is delivered by a worker of that pool running the node - fired, or
// cancelled (a wait cancelled out of the wheel is pushed into the pool's queue for it) -
// so that completing allocates nothing when the handler runs on the pool (the default):
// the worker dispatches it inline. Without a pool, an abort is posted to the handler's
// executor, which may allocate.
template <class Handler, class DefaultExecutor>
class wheel_wait_op final : public wheel_entry, public handler_op<wheel_wait_op<Handler, DefaultExecutor>, Handler, DefaultExecutor> {
  using handler_base = handler_op<wheel_wait_op, Handler, DefaultExecutor>;
  friend handler_base;

  // The slot reaches the node without owning a reference: it takes one for the cancel.
  // The node is alive here: until the completion has cleared the slot (in the handler's
  // context, where Asio requires emission to happen), the queue's or the completion's
  // reference is held.
  struct cancel_handler {
    wheel_wait_op* op;
    void operator()(net::cancellation_type_t type) const {
      if (type == net::cancellation_type::none) return;
      wheel_wait_op* w = op;
      w->add_ref();
      w->cancel();
      w->release(); // never the last: the queue's or the completion's reference is held
    }
  };

public:
  // refs: the wheel's only (no handle). `pool`: the wheel's pool, or nullptr.
  wheel_wait_op(Handler&& h, const DefaultExecutor& ex, pool_core* pool)
      : wheel_entry(&dispatch_action<wheel_wait_op>, 1, true), handler_base(std::move(h), ex), pool_(pool) {
    this->hold_work();
    this->template connect_slot<cancel_handler>(cancel_handler{this});
    if (pool_) pool_->wheel_wait_started(); // last: nothing after it throws
  }

private:
  friend class wheel_entry;
  // A connected cancellation slot reaches the node without a reference (and takes one
  // to cancel): a worker may never assume that the queue's reference is the last.
  static constexpr bool cancellers_hold_refs = false;

  void on_fire() noexcept { deliver(true, error_code()); }
  // Out of the wheel, never to fire: to the pool's queue (with a reference of its own),
  // whose worker delivers operation_aborted in on_settled_cancelled().
  void on_drop() noexcept {
    if (delivered_) return;
    if (pool_) {
      add_ref();
      pool_->push_ready(this);
    } else {
      deliver(false, net::error::operation_aborted);
    }
  }
  void on_cancel_queued() noexcept {} // the executor's settle() delivers operation_aborted
  void on_discarded() noexcept { deliver(false, net::error::operation_aborted); }
  // Cancelled while queued, or cancelled out of the wheel and pushed by on_drop().
  void on_settled_cancelled(bool run) noexcept {
    if (!delivered_) deliver(run, net::error::operation_aborted);
  }
  void on_destroy() noexcept { handler_base::destroy(this); }
  static void release_node(wheel_wait_op* w) noexcept { w->release(); }

  // The completion holds a reference until the handler has been taken out: the slot's
  // cancel handler may reach the node until the handler's context clears it.
  void deliver(bool may_run_inline, error_code ec) noexcept {
    delivered_ = true;
    add_ref();
    // Counted done first: the handler may run inline and destroy the pool. This is a
    // worker of the pool (awake: the pool cannot terminate before the completion is
    // queued), unless the pool has already terminated or stopped.
    if (pool_) pool_->wheel_wait_done();
    this->complete_with(may_run_inline, ec);
  }

  pool_core* pool_;
  bool delivered_ = false;
};

} // namespace detail

template <class F, class Rep, class Period>
inline wheel_timer::timeout wheel_timer::schedule(F&& f, std::chrono::duration<Rep, Period> delay) {
  using D = std::decay_t<F>;
  static_assert(std::is_invocable_v<D&>, "metronome: the timeout must be callable with no arguments");
  if (detail::is_empty_callable(f)) throw std::invalid_argument("metronome: empty function");
  if constexpr (detail::has_own_executor<D>) {
    // Its own executor: the timeout hands it there when due.
    return schedule_callable(
        [fn = D(std::forward<F>(f))]() mutable {
          const auto ex = net::get_associated_executor(fn);
          net::dispatch(ex, detail::with_hand_over_hold(ex, std::move(fn)));
        },
        delay);
  } else {
    return schedule_callable(D(std::forward<F>(f)), delay);
  }
}

template <class D, class Rep, class Period>
inline wheel_timer::timeout wheel_timer::schedule_callable(D&& fn, std::chrono::duration<Rep, Period> delay) {
  auto* e = detail::wheel_task<std::decay_t<D>>::create(std::move(fn)); // the wheel's reference and the handle's
  timeout handle(e);
  core_->insert(e, detail::saturating_duration(delay)); // refused: cancelled, the handle lets go
  return handle;
}

template <class Rep, class Period, class CompletionToken>
inline auto wheel_timer::async_wait(std::chrono::duration<Rep, Period> delay, CompletionToken&& token) {
  return net::async_initiate<CompletionToken, void(error_code)>(
      [core = core_.get()](auto handler, clock::duration d) {
        using H = std::decay_t<decltype(handler)>;
        detail::wheel_entry* e;
        {
          // On a metronome pool the handler's default executor is the pool's own (not
          // through any_io_executor, whose type erasure allocates to complete). A
          // stopped wheel counts on no pool (it may be gone); a stop() meanwhile waits
          // for this use of it, until the wait is counted on the pool (which then keeps
          // the pool up until it completes). No completion runs inside the use.
          const detail::wheel_core::pool_use use(*core);
          detail::pool_core* pool = use.pool();
          const auto* pex = core->executor().template target<scheduled_thread_pool::executor_type>();
          if (pex && pool)
            e = detail::wheel_wait_op<H, scheduled_thread_pool::executor_type>::create(std::move(handler), *pex,
                                                                                        pool);
          else
            e = detail::wheel_wait_op<H, net::any_io_executor>::create(std::move(handler), core->executor(),
                                                                               pool);
        }
        try {
          core->insert(e, d);
        } catch (...) {
          // Refused (stopped): the wait was cancelled, which completes it with operation_aborted.
        }
      },
      token, detail::saturating_duration(delay));
}

} // namespace metronome

#endif
