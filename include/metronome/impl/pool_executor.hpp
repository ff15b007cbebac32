// scheduled_thread_pool::executor_type: the pool's Asio executor.
#ifndef METRONOME_IMPL_POOL_EXECUTOR_HPP
#define METRONOME_IMPL_POOL_EXECUTOR_HPP

#include <metronome/detail/executor_op.hpp>
#include <metronome/detail/hand_over_hold.hpp>
#include <metronome/detail/node_cache.hpp>

#include <metronome/detail/asio.hpp>
#include <metronome/detail/asio_internals.hpp>

#include <exception>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace metronome::detail {

// An Asio strand's invoker: the strand queues it on the pool on behalf of handlers it
// already accepted, so it is internal work (accepted after shutdown until the pool
// terminates). Dropping it would leave the strand locked, every handler behind it lost.
// (detail/asio_internals.hpp; test/unit/scheduled_thread_pool/lifecycle.cpp breaks if it moves.)
template <class F>
using is_strand_invoker = asio_internals::is_strand_invoker<F>;

template <class Allocator, unsigned Bits>
struct is_own_pool_executor<scheduled_thread_pool::basic_executor_type<Allocator, Bits>> : std::true_type {};

} // namespace metronome::detail

namespace metronome {

namespace detail {
struct executor_bits {
  static constexpr unsigned blocking_never = 1;
  static constexpr unsigned relationship_continuation = 2;
  static constexpr unsigned outstanding_work_tracked = 4;
};
} // namespace detail

/// The executor of a `scheduled_thread_pool`: a standard Asio executor that also
/// keeps the Networking-TS members.
/**
 * - `execute(f)`: with `blocking.possibly` (the default) and called on one of the
 *   pool's threads, runs `f` inline (this is what `asio::dispatch` gets); with
 *   `relationship.continuation` and on a pool thread, queues `f` on that thread's
 *   private queue, run right after the current task without any atomic operation
 *   or wake-up (this is what `asio::defer` gets); otherwise queues on the shared
 *   ready queue, waking a parked worker only when no worker is awake to take it.
 * - Never throws for queueing reasons: after shutdown, work from outside the pool is
 *   dropped, counted in `stats().rejected` and reported to the exception handler as
 *   `rejected_execution` (an installed one: the default handler does not print work
 *   dropped by a shutdown the user asked for); work from the pool's own threads is accepted until the pool
 *   is idle. An empty function is reported as `std::invalid_argument`.
 * - Exceptions thrown by the function go to the pool's exception handler.
 *
 * @par Thread Safety
 * Distinct objects: safe. Shared objects: safe for const members.
 */
template <class Allocator, unsigned Bits>
class scheduled_thread_pool::basic_executor_type : detail::executor_bits {
public:
  basic_executor_type(const basic_executor_type& o) noexcept : pool_(o.pool_), allocator_(o.allocator_) {
    if constexpr ((Bits & outstanding_work_tracked) != 0)
      if (pool_) pool_->core_->work_started();
  }
  basic_executor_type(basic_executor_type&& o) noexcept
      : pool_(std::exchange(o.pool_, nullptr)), allocator_(std::move(o.allocator_)) {
    if constexpr ((Bits & outstanding_work_tracked) == 0) o.pool_ = pool_;
  }
  ~basic_executor_type() {
    if constexpr ((Bits & outstanding_work_tracked) != 0)
      if (pool_) pool_->core_->work_finished();
  }
  basic_executor_type& operator=(const basic_executor_type& o) noexcept {
    if (this != &o) {
      basic_executor_type tmp(o);
      swap(tmp);
    }
    return *this;
  }
  basic_executor_type& operator=(basic_executor_type&& o) noexcept {
    if (this != &o) {
      basic_executor_type tmp(std::move(o));
      swap(tmp);
    }
    return *this;
  }

  // ---- require / prefer
  constexpr basic_executor_type<Allocator, Bits | blocking_never>
  require(net::execution::blocking_t::never_t) const {
    return {pool_, allocator_};
  }
  constexpr basic_executor_type<Allocator, Bits & ~blocking_never>
  require(net::execution::blocking_t::possibly_t) const {
    return {pool_, allocator_};
  }
  constexpr basic_executor_type<Allocator, Bits & ~relationship_continuation>
  require(net::execution::relationship_t::fork_t) const {
    return {pool_, allocator_};
  }
  constexpr basic_executor_type<Allocator, Bits | relationship_continuation>
  require(net::execution::relationship_t::continuation_t) const {
    return {pool_, allocator_};
  }
  basic_executor_type<Allocator, Bits | outstanding_work_tracked>
  require(net::execution::outstanding_work_t::tracked_t) const {
    return {pool_, allocator_};
  }
  basic_executor_type<Allocator, Bits & ~outstanding_work_tracked>
  require(net::execution::outstanding_work_t::untracked_t) const {
    return {pool_, allocator_};
  }
  template <class OtherAllocator>
  basic_executor_type<OtherAllocator, Bits> require(net::execution::allocator_t<OtherAllocator> a) const {
    return {pool_, a.value()};
  }
  basic_executor_type<std::allocator<void>, Bits> require(net::execution::allocator_t<void>) const {
    return {pool_, std::allocator<void>()};
  }

  // ---- query
  static constexpr net::execution::mapping_t query(net::execution::mapping_t) noexcept {
    return net::execution::mapping.thread;
  }
  scheduled_thread_pool& query(net::execution::context_t) const noexcept { return *pool_; }
  static constexpr net::execution::blocking_t query(net::execution::blocking_t) noexcept {
    return (Bits & blocking_never) ? net::execution::blocking_t(net::execution::blocking.never)
                                   : net::execution::blocking_t(net::execution::blocking.possibly);
  }
  static constexpr net::execution::relationship_t query(net::execution::relationship_t) noexcept {
    return (Bits & relationship_continuation)
               ? net::execution::relationship_t(net::execution::relationship.continuation)
               : net::execution::relationship_t(net::execution::relationship.fork);
  }
  static constexpr net::execution::outstanding_work_t
  query(net::execution::outstanding_work_t) noexcept {
    return (Bits & outstanding_work_tracked)
               ? net::execution::outstanding_work_t(net::execution::outstanding_work.tracked)
               : net::execution::outstanding_work_t(net::execution::outstanding_work.untracked);
  }
  template <class OtherAllocator>
  constexpr Allocator query(net::execution::allocator_t<OtherAllocator>) const noexcept {
    return allocator_;
  }
  constexpr Allocator query(net::execution::allocator_t<void>) const noexcept { return allocator_; }
  std::size_t query(net::execution::occupancy_t) const noexcept { return pool_->core_->thread_count(); }

  /// Whether the calling thread is one of the pool's workers.
  bool running_in_this_thread() const noexcept { return pool_->core_->running_in_this_thread(); }

  friend bool operator==(const basic_executor_type& a, const basic_executor_type& b) noexcept {
    return a.pool_ == b.pool_ && a.allocator_ == b.allocator_;
  }
  friend bool operator!=(const basic_executor_type& a, const basic_executor_type& b) noexcept { return !(a == b); }

  template <class Function>
  void execute(Function&& f) const {
    if constexpr ((Bits & blocking_never) == 0) {
      if (pool_->core_->running_in_this_thread()) {
        std::decay_t<Function> tmp(std::forward<Function>(f));
        std::move(tmp)();
        return;
      }
    }
    submit_op(std::forward<Function>(f), allocator_, (Bits & relationship_continuation) != 0);
  }

  // ---- Networking TS
  scheduled_thread_pool& context() const noexcept { return *pool_; }
  void on_work_started() const noexcept { pool_->core_->work_started(); }
  void on_work_finished() const noexcept { pool_->core_->work_finished(); }

  template <class Function, class OtherAllocator>
  void dispatch(Function&& f, const OtherAllocator& a) const {
    if (pool_->core_->running_in_this_thread()) {
      std::decay_t<Function> tmp(std::forward<Function>(f));
      std::move(tmp)();
      return;
    }
    submit_op(std::forward<Function>(f), a, false);
  }
  template <class Function, class OtherAllocator>
  void post(Function&& f, const OtherAllocator& a) const {
    submit_op(std::forward<Function>(f), a, false);
  }
  template <class Function, class OtherAllocator>
  void defer(Function&& f, const OtherAllocator& a) const {
    submit_op(std::forward<Function>(f), a, true);
  }

private:
  friend class scheduled_thread_pool;
  template <class, unsigned>
  friend class basic_executor_type;

  basic_executor_type(scheduled_thread_pool* pool, const Allocator& a) noexcept : pool_(pool), allocator_(a) {
    if constexpr ((Bits & outstanding_work_tracked) != 0)
      if (pool_) pool_->core_->work_started();
  }

  void swap(basic_executor_type& o) noexcept {
    std::swap(pool_, o.pool_);
    std::swap(allocator_, o.allocator_);
  }

  template <class Function, class OtherAllocator>
  void submit_op(Function&& f, const OtherAllocator& a, bool continuation) const {
    using F = std::decay_t<Function>;
    auto& core = *pool_->core_;
    if (detail::is_empty_callable(f)) {
      core.report(std::make_exception_ptr(std::invalid_argument("metronome: empty function")));
      return;
    }
    using node_alloc = detail::node_allocator_for<OtherAllocator>;
    op_node_ptr op =
        detail::executor_op<F, typename node_alloc::type>::create(std::forward<Function>(f), node_alloc::get(a));
    core.post_op(op, continuation, detail::is_strand_invoker<F>::value);
  }
  using op_node_ptr = detail::op_node*;

  scheduled_thread_pool* pool_;
  Allocator allocator_;
};

inline scheduled_thread_pool::executor_type scheduled_thread_pool::get_executor() noexcept {
  return {this, std::allocator<void>()};
}

inline scheduled_thread_pool::executor_type scheduled_thread_pool::executor() noexcept { return get_executor(); }

} // namespace metronome

#endif
