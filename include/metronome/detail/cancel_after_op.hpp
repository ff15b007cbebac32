#ifndef METRONOME_DETAIL_CANCEL_AFTER_OP_HPP
#define METRONOME_DETAIL_CANCEL_AFTER_OP_HPP

#include <metronome/async_delay.hpp>
#include <metronome/detail/hand_over_hold.hpp>
#include <metronome/detail/internal_post.hpp>
#include <metronome/detail/node_cache.hpp>
#include <metronome/detail/pool_core.hpp>
#include <metronome/detail/report.hpp>
#include <metronome/detail/slot_handler.hpp>
#include <metronome/detail/test_hooks.hpp>

#include <metronome/detail/asio.hpp>

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <type_traits>
#include <utility>

namespace metronome::detail {

// Where a cancel_after timer lives: void = found from the operation.
template <class Timing>
struct timing_holder {
  using executor_type = Timing;
  Timing ex;
};
template <>
struct timing_holder<void> {};

// The one node of a cancel_after: the timer in a pool's delay queue and the
// cancellation signal the wrapped operation sees. Three references: the pool's (the
// delay queue, then the emission it posts), the wrapped handler's (until the operation
// completes or its handler is destroyed) and the initiating call's (until arm()
// returns). docs/design.md, "cancel_after", states the protocol.
template <class Executor, class HandlerAllocator>
class cancel_after_op final : public wait_node {
  using alloc_source = node_allocator_for<HandlerAllocator>;
  using node_alloc = typename std::allocator_traits<typename alloc_source::type>::template rebind_alloc<cancel_after_op>;
  using alloc_traits = std::allocator_traits<node_alloc>;

  struct forward_cancel {
    net::cancellation_signal* target;
    void operator()(net::cancellation_type_t type) const { target->emit(type); }
  };

  // Emits in the handler's context; owns the pool's reference.
  class emitter {
  public:
    explicit emitter(cancel_after_op* n) noexcept : n_(n) {}
    emitter(emitter&& o) noexcept : n_(std::exchange(o.n_, nullptr)) {}
    emitter& operator=(emitter&&) = delete;
    ~emitter() {
      if (n_) n_->release();
    }
    void operator()() {
      cancel_after_op* n = std::exchange(n_, nullptr);
      n->emit_unless_done();
      n->release();
    }

  private:
    cancel_after_op* n_;
  };

public:
  static cancel_after_op* create(const HandlerAllocator& ha, const Executor& ex, net::cancellation_type_t type,
                                 pool_core& core) {
    node_alloc a(alloc_source::get(ha));
    cancel_after_op* p = alloc_traits::allocate(a, 1);
    try {
      ::new (static_cast<void*>(p)) cancel_after_op(a, ex, type, core);
    } catch (...) {
      alloc_traits::deallocate(a, p, 1);
      throw;
    }
    return p;
  }

  net::cancellation_slot slot() noexcept { return signal_.slot(); }

  // Forwards what the handler's own slot emits to the operation. Before arm().
  void chain(net::cancellation_slot user) {
    if (!user.is_connected()) return;
    user.template emplace<forward_cancel>(forward_cancel{&signal_});
    user_slot_ = user;
    user_slot_connected_ = true;
  }

  // Starts the timer, once the operation has been initiated; drops the initiating
  // call's reference. An operation that completed meanwhile takes the timer out again.
  void arm(pool_core& core, clock::time_point due, clock::time_point current) noexcept {
    bool queued = false;
    try {
      queued = core.add_wait(this, due, current);
    } catch (...) {
      // No memory for the queue slot: the timeout cannot be kept, so it is up now.
      emit_unless_done();
    }
    if (!queued) release(); // the pool's reference: never queued
    // seq_cst with op_finished(): either it saw the node queued, or this sees it done.
    else if (op_done_.load() && pool_core::withdraw_wait(anchor_, generation_, this))
      release();
    release();
  }

  // Drops the initiating call's and the pool's references (the operation's
  // initiation threw before arm()).
  void abandon() noexcept {
    release();
    release();
  }

  // A metronome operation is about to clear its cancellation slot (its completion, or
  // its handler destroyed unrun): from here on nothing emits. An emission in progress
  // holds the mutex, so the slot's handler is not destroyed under it - the completion
  // may run on any thread (a handler with no executor runs on the worker that ended
  // the task) while the emission runs in the handler's executor (a system thread).
  void before_slot_clear() noexcept {
    std::lock_guard lk(emit_mtx_);
    op_done_.store(true);
  }

  // The operation completed, or its handler was destroyed unrun: in the handler's
  // context. Stops the timer and drops the handler's reference.
  void op_finished() noexcept {
    op_done_.store(true);
    if (user_slot_connected_) {
      user_slot_.clear();
      user_slot_connected_ = false;
    }
    if (pool_core::withdraw_wait(anchor_, generation_, this)) release();
    release();
  }

private:
  cancel_after_op(const node_alloc& a, const Executor& ex, net::cancellation_type_t type, pool_core& core)
      : wait_node(&do_complete), alloc_(a), executor_(ex), type_(type), anchor_(core.anchor()),
        generation_(core.anchor_generation()) {
    deadline_ = true; // kept after its pool's shutdown() as a delayed task is (wait_node)
  }
  ~cancel_after_op() = default;

  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    node_alloc a(std::move(alloc_));
    this->~cancel_after_op();
    alloc_traits::deallocate(a, this, 1);
  }

  void emit_unless_done() noexcept {
    std::lock_guard lk(emit_mtx_);
    if (op_done_.load()) return;
    METRONOME_TEST_HOOK(hook_point::cancel_after_emitting);
    internal_post_scope user(false); // the operation's cancel handler is not library work
    signal_.emit(type_);
  }

  // The pool is done with the node: fired (run), aborted (shutdown) or discarded.
  static void do_complete(task_base* b, unsigned action, void* /*io*/) {
    auto* n = static_cast<cancel_after_op*>(b);
    if (action != run_action || n->aborted_ || n->op_done_.load()) {
      n->release();
      return;
    }
    emitter e(n);
    try {
      internal_post_scope internal; // the library's own completion work
      net::post(n->executor_, with_hand_over_hold(n->executor_, std::move(e)));
    } catch (...) {
      report_here(std::current_exception(), "cancel_after");
    }
  }

  node_alloc alloc_;
  net::cancellation_signal signal_;
  Executor executor_;
  net::cancellation_type_t type_;
  pool_anchor* anchor_;
  std::uint32_t generation_;
  std::atomic<int> refs_{3};
  std::atomic<bool> op_done_{false};
  std::mutex emit_mtx_; // an emission against before_slot_clear()
  bool user_slot_connected_ = false;
  net::cancellation_slot user_slot_;
};

// The wrapped operation's handler is the user's with the node's slot
// (slot_handler<Handler, cancel_after_link<Node>>): the link holds the handler's
// reference to the node and lets it go when the operation completes or destroys it.
template <class Node>
class cancel_after_link {
public:
  explicit cancel_after_link(Node* n) noexcept : node_(n) {}
  cancel_after_link(cancel_after_link&& o) noexcept : node_(std::exchange(o.node_, nullptr)) {}
  cancel_after_link& operator=(cancel_after_link&&) = delete;
  ~cancel_after_link() {
    if (node_) node_->op_finished();
  }

  net::cancellation_slot slot() const noexcept { return node_->slot(); }
  void before_slot_clear() noexcept {
    if (node_) node_->before_slot_clear();
  }

  template <class Wrapper, class... Args>
  static void complete(Wrapper& w, Args&&... args) {
    std::exchange(w.link().node_, nullptr)->op_finished();
    std::move(w.handler())(std::forward<Args>(args)...);
  }

private:
  Node* node_;
};

template <class Initiation, class Timing>
class initiate_cancel_after {
public:
  template <class I>
  initiate_cancel_after(I&& init, clock::duration amount, bool relative, net::cancellation_type_t type,
                        const timing_holder<Timing>& timing)
      : init_(std::forward<I>(init)), amount_(amount), relative_(relative), type_(type), timing_(timing) {}

  // The wrapped operation's I/O executor, for whoever asks.
  auto get_executor() const noexcept
    requires requires(const Initiation& i) { i.get_executor(); }
  {
    return init_.get_executor();
  }

  template <class Handler, class... Args>
  void operator()(Handler&& handler, Args&&... args) const {
    const auto io_ex = io_executor();
    start(std::forward<Handler>(handler), io_ex, std::forward<Args>(args)...);
  }

private:
  template <class Handler, class IoExecutor, class... Args>
  void start(Handler&& handler, const IoExecutor& io_ex, Args&&... args) const {
    using H = std::decay_t<Handler>;
    using handler_executor = net::associated_executor_t<H, std::decay_t<decltype(io_ex)>>;
    using node = cancel_after_op<handler_executor, net::associated_allocator_t<H>>;

    H h(std::forward<Handler>(handler));
    const handler_executor hex = net::get_associated_executor(h, io_ex);
    pool_core& core = timing_core(hex);
    const clock::time_point current = core.now();
    const clock::time_point due = relative_ ? saturating_add(current, amount_) : clock::time_point(amount_);
    node* n = node::create(net::get_associated_allocator(h), hex, type_, core);
    try {
      n->chain(net::get_associated_cancellation_slot(h));
    } catch (...) {
      n->abandon();
      n->op_finished();
      throw;
    }
    try {
      std::move(init_)(slot_handler<H, cancel_after_link<node>>(std::move(h), cancel_after_link<node>(n)),
                       std::forward<Args>(args)...);
    } catch (...) {
      n->abandon(); // the handler's reference went with the wrapped handler
      throw;
    }
    n->arm(core, due, current);
  }

  auto io_executor() const noexcept {
    if constexpr (requires { init_.get_executor(); })
      return init_.get_executor();
    else
      return net::system_executor();
  }

  template <class HandlerExecutor>
  pool_core& timing_core(const HandlerExecutor& hex) const {
    if constexpr (!std::is_void_v<Timing>)
      return pool_core_of(timing_.ex);
    else if constexpr (requires { init_.get_executor(); })
      return pool_core_of(init_.get_executor());
    else
      return pool_core_of(hex);
  }

  mutable Initiation init_;
  clock::duration amount_;
  bool relative_;
  net::cancellation_type_t type_;
  timing_holder<Timing> timing_;
};

} // namespace metronome::detail

#endif
