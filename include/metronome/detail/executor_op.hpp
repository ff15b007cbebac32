// The node of fire-and-forget executor work (execute, post, defer).
#ifndef METRONOME_DETAIL_EXECUTOR_OP_HPP
#define METRONOME_DETAIL_EXECUTOR_OP_HPP

#include <metronome/detail/task.hpp>

#include <memory>
#include <utility>

namespace metronome::detail {

// Fire-and-forget work: the function object lives in the node (one allocation,
// through the executor's allocator). The node is freed before the function runs, as
// Asio does, so a handler that posts again can reuse the memory.
template <class F, class Alloc>
class executor_op final : public op_node {
  using alloc_traits = typename std::allocator_traits<Alloc>::template rebind_traits<executor_op>;
  using node_alloc = typename alloc_traits::allocator_type;

public:
  template <class G>
  static executor_op* create(G&& g, const Alloc& a) {
    node_alloc na(a);
    executor_op* p = alloc_traits::allocate(na, 1);
    try {
      alloc_traits::construct(na, p, std::forward<G>(g), a);
    } catch (...) {
      alloc_traits::deallocate(na, p, 1);
      throw;
    }
    return p;
  }

  template <class G>
  executor_op(G&& g, const Alloc& a) : op_node(&do_complete), f_(std::forward<G>(g)), alloc_(a) {}

private:
  static void do_complete(task_base* b, unsigned action, void* /*io*/) {
    const bool run = action == run_action;
    auto* op = static_cast<executor_op*>(b);
    node_alloc na(op->alloc_);
    F f(std::move(op->f_));
    alloc_traits::destroy(na, op);
    alloc_traits::deallocate(na, op, 1);
    if (run) std::move(f)();
  }

  F f_;
  [[no_unique_address]] Alloc alloc_; // an empty allocator takes no room beside queued_at_
};

} // namespace metronome::detail

#endif
