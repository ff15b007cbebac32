// handler_op: the completion handler an asynchronous operation holds, and its
// completion.
#ifndef METRONOME_DETAIL_HANDLER_OP_HPP
#define METRONOME_DETAIL_HANDLER_OP_HPP

#include <metronome/detail/hand_over_hold.hpp>
#include <metronome/detail/internal_post.hpp>
#include <metronome/detail/node_cache.hpp>
#include <metronome/detail/report.hpp>
#include <metronome/detail/slot_handler.hpp>

#include <metronome/detail/asio.hpp>

#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace metronome::detail {

// The completion handler of one asynchronous operation (async_delay, a wheel wait, a
// handle's async_wait), held in the operation's node from initiation to completion.
// Derived is the node type: it derives from this, is created with create() (through
// the handler's associated allocator; std::allocator means the node cache) and
// provides `static void release_node(Derived*) noexcept`, called once the handler has
// been taken out (destroy() it, or drop the completion's reference to it).
//
// complete_with() follows Asio's rules for a handler completed on its own executor:
// - outstanding work on that executor (hold_work()) is held until the executor has
//   taken the completion, and let go on the completing thread after that call returned
//   (the executor counts the queued completion as work of its own from then on): so
//   `io_context::run()` cannot return, and the io_context cannot be destroyed, while
//   the completing thread is still inside its post;
// - the cancellation slot is cleared in the handler's context; the node, which the
//   slot's cancel handler reaches, lives until then;
// - the node is released before the handler runs, so the handler may start another
//   operation in the same memory;
// - a completion handed to an executor over a pool that is not the pool's own (a strand
//   over it) keeps a shut-down pool from terminating until it runs or is destroyed
//   (hand_over_hold): it may wait in the strand's queue, unseen by the pool.
// A handler that throws is reported like other work of the pool it runs on (else
// printed): it never escapes into the library code that completed it.
template <class Derived, class Handler, class DefaultExecutor>
class handler_op {
  using executor_type = net::associated_executor_t<Handler, DefaultExecutor>;
  using handler_allocator = net::associated_allocator_t<Handler>;
  using alloc_source = node_allocator_for<handler_allocator>;
  using node_alloc = typename std::allocator_traits<typename alloc_source::type>::template rebind_alloc<Derived>;
  using alloc_traits = std::allocator_traits<node_alloc>;
  // Outstanding work on the handler's executor: for a standard executor, a copy of it
  // that tracks work (one executor, where executor_work_guard keeps two); for a legacy
  // one, its work guard.
  template <class E, class = void>
  struct work_holder {
    using type = net::executor_work_guard<E>;
    static type make(const E& ex) { return type(ex); }
  };
  template <class E>
  struct work_holder<E, std::enable_if_t<net::execution::is_executor<E>::value>> {
    using type = std::decay_t<decltype(net::prefer(std::declval<const E&>(),
                                                           net::execution::outstanding_work.tracked))>;
    static type make(const E& ex) { return net::prefer(ex, net::execution::outstanding_work.tracked); }
  };
  using work_type = typename work_holder<executor_type>::type;

public:
  // Derived's constructor takes the handler first and passes it on to handler_op's.
  template <class H, class... Args>
  static Derived* create(H&& h, Args&&... args) {
    node_alloc a(alloc_source::get(net::get_associated_allocator(h)));
    Derived* p = alloc_traits::allocate(a, 1);
    try {
      ::new (static_cast<void*>(p)) Derived(std::forward<H>(h), std::forward<Args>(args)...);
    } catch (...) {
      alloc_traits::deallocate(a, p, 1);
      throw;
    }
    return p;
  }

  // Destroys and frees a node that complete_with() was not called on, or whose
  // completion has taken the handler out.
  static void destroy(Derived* p) noexcept {
    handler_op& self = *p;
    if (self.slot_connected_) self.disconnect_slot();
    node_alloc a(std::move(self.alloc_));
    p->~Derived();
    alloc_traits::deallocate(a, p, 1);
  }

  Handler& handler() noexcept { return handler_; }

protected:
  template <class H>
  handler_op(H&& h, const DefaultExecutor& ex)
      : alloc_(alloc_source::get(net::get_associated_allocator(h))), handler_(std::forward<H>(h)),
        executor_(net::get_associated_executor(handler_, ex)) {}
  ~handler_op() = default;

public:
  handler_op(const handler_op&) = delete;
  handler_op& operator=(const handler_op&) = delete;

protected:

  const executor_type& handler_executor() const noexcept { return executor_; }

  // Outstanding work on the handler's executor until the completion is handed to it.
  void hold_work() { work_.emplace(work_holder<executor_type>::make(executor_)); }

  // Installs a Canceller in the handler's cancellation slot, if it has one.
  template <class Canceller, class... Args>
  void connect_slot(Args&&... args) {
    auto slot = net::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) {
      slot.template emplace<Canceller>(std::forward<Args>(args)...);
      slot_connected_ = true;
    }
  }

  // Hands `args` to the handler on its executor and gives the node to the completion:
  // dispatch when `may_run_inline` (the handler runs right here if this thread is in
  // its executor's context), else post (never inside the calling function).
  template <class... Args>
  void complete_with(bool may_run_inline, Args... args) noexcept {
    // Declared first: let go last, once the executor has the completion (or it failed).
    [[maybe_unused]] std::optional<work_type> work(std::move(work_));
    work_.reset();
    try {
      const executor_type ex(executor_);
      completion<Args...> c(static_cast<Derived*>(this), hold_type::for_executor(ex), std::move(args)...);
      internal_post_scope internal; // a completion: a shut-down pool still takes it
      if (may_run_inline)
        net::dispatch(ex, std::move(c));
      else
        net::post(ex, std::move(c));
    } catch (...) {
      // The executor could not take it (out of memory): the completion, destroyed,
      // released the node, and `work` lets go here; the handler is lost, so say so.
      report_here(std::current_exception(), "completion");
    }
  }

  // As complete_with(false, args...) from inside an initiating function: if the handler's
  // executor cannot take the completion (out of memory), the node is released (the
  // handler destroyed unrun) and the exception leaves the initiating call, as Asio's
  // own operations do - never a handler lost without a word to its caller.
  template <class... Args>
  void complete_at_initiation(Args... args) {
    [[maybe_unused]] std::optional<work_type> work(std::move(work_));
    work_.reset();
    const executor_type ex(executor_);
    completion<Args...> c(static_cast<Derived*>(this), hold_type::for_executor(ex), std::move(args)...);
    internal_post_scope internal;
    net::post(ex, std::move(c));
  }

private:
  using hold_type = hand_over_hold_for<executor_type>;

  // Owns the node until the handler's executor runs it (or destroys it unrun).
  template <class... Args>
  class completion {
  public:
    completion(Derived* op, hold_type hold, Args&&... args)
        : op_(op), alloc_(net::get_associated_allocator(op->handler_)), hold_(std::move(hold)),
          args_(std::move(args)...) {}
    completion(completion&& o) noexcept(std::is_nothrow_move_constructible_v<std::tuple<Args...>>)
        : op_(std::exchange(o.op_, nullptr)), alloc_(o.alloc_), hold_(std::move(o.hold_)), args_(std::move(o.args_)) {}
    completion& operator=(completion&&) = delete;
    ~completion() {
      if (op_) finish(op_, nullptr);
    }

    // Asio allocates whatever carries the completion through the handler's allocator.
    using allocator_type = handler_allocator;
    allocator_type get_allocator() const noexcept { return alloc_; }

    // Run by the handler's executor. Off a metronome pool the handler's exception leaves
    // this function, as any Asio handler's does (out of io_context::run()); inside an
    // Asio handler of metronome's own (a drive, a drain) it leaves that one instead.
    void operator()() {
      hold_.release(); // on the pool's worker: the pool cannot terminate under the handler
      rethrow_scope scope;
      finish(std::exchange(op_, nullptr), &args_);
      scope.rethrow_if_any();
    }

  private:
    // In the handler's context; `args` null: destroyed unrun.
    static void finish(Derived* op, std::tuple<Args...>* args) noexcept {
      handler_op& self = *op;
      if (self.slot_connected_) self.disconnect_slot();
      Handler handler(std::move(self.handler_));
      Derived::release_node(op);
      if (!args) return;
      internal_post_scope user(false); // the handler's own posts are its own
      try {
        std::apply([&](Args&... a) { std::move(handler)(std::move(a)...); }, *args);
      } catch (...) {
        report_here(std::current_exception(), "completion handler");
      }
    }

    Derived* op_;
    handler_allocator alloc_;
    [[no_unique_address]] hold_type hold_; // let go after ~completion()'s body has finished the node
    std::tuple<Args...> args_;
  };

  void disconnect_slot() noexcept {
    before_slot_clear(handler_); // cancel_after's emission is over, and none starts
    net::get_associated_cancellation_slot(handler_).clear();
    slot_connected_ = false;
  }

  node_alloc alloc_;
  std::optional<work_type> work_; // before handler_: a node destroyed unrun lets go after it
  Handler handler_;
  executor_type executor_;
  bool slot_connected_ = false;
};

} // namespace metronome::detail

#endif
