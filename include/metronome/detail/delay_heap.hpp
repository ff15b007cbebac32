#ifndef METRONOME_DETAIL_DELAY_HEAP_HPP
#define METRONOME_DETAIL_DELAY_HEAP_HPP

#include <metronome/detail/task.hpp>

#include <vector>

namespace metronome::detail {

// A 4-ary min-heap of timed nodes ordered by (due, seq). Every node records its slot
// in heap_index_, so removal of any node (cancel) is O(log n). Not thread-safe: the
// pool guards it with its mutex.
class delay_heap {
public:
  bool empty() const noexcept { return nodes_.empty(); }
  std::size_t size() const noexcept { return nodes_.size(); }
  timed_node* top() const noexcept { return nodes_.front(); }

  // Returns true when `n` became the head.
  bool push(timed_node* n) {
    nodes_.push_back(n);
    n->heap_index_ = nodes_.size() - 1;
    sift_up(nodes_.size() - 1);
    return n->heap_index_ == 0;
  }

  timed_node* pop() noexcept {
    timed_node* n = nodes_.front();
    remove_at(0);
    return n;
  }

  void remove(timed_node* n) noexcept { remove_at(n->heap_index_); }

  // Takes every node out (no order); used by shutdown paths.
  template <class F>
  void drain(F&& f) {
    auto all = std::move(nodes_);
    nodes_.clear();
    for (auto* n : all) {
      n->heap_index_ = not_in_heap;
      f(n);
    }
  }

  // Removes the nodes matching `pred`, calling `f` on each; O(n).
  template <class Pred, class F>
  void remove_if(Pred&& pred, F&& f) {
    std::vector<timed_node*> keep;
    keep.reserve(nodes_.size());
    std::vector<timed_node*> gone;
    for (auto* n : nodes_) (pred(n) ? gone : keep).push_back(n);
    if (gone.empty()) return;
    nodes_ = std::move(keep);
    for (std::size_t i = 0; i < nodes_.size(); ++i) nodes_[i]->heap_index_ = i;
    for (std::size_t i = nodes_.size() / 4 + 1; i-- > 0;) sift_down(i);
    for (auto* n : gone) {
      n->heap_index_ = not_in_heap;
      f(n);
    }
  }

private:
  static constexpr std::size_t arity = 4;

  void place(std::size_t i, timed_node* n) noexcept {
    nodes_[i] = n;
    n->heap_index_ = i;
  }

  void remove_at(std::size_t i) noexcept {
    timed_node* gone = nodes_[i];
    timed_node* last = nodes_.back();
    nodes_.pop_back();
    gone->heap_index_ = not_in_heap;
    if (i == nodes_.size()) return;
    place(i, last);
    if (i > 0 && due_before(last, nodes_[(i - 1) / arity]))
      sift_up(i);
    else
      sift_down(i);
  }

  void sift_up(std::size_t i) noexcept {
    timed_node* n = nodes_[i];
    while (i > 0) {
      std::size_t parent = (i - 1) / arity;
      if (!due_before(n, nodes_[parent])) break;
      place(i, nodes_[parent]);
      i = parent;
    }
    place(i, n);
  }

  void sift_down(std::size_t i) noexcept {
    if (i >= nodes_.size()) return;
    timed_node* n = nodes_[i];
    const std::size_t size = nodes_.size();
    for (;;) {
      std::size_t first = i * arity + 1;
      if (first >= size) break;
      std::size_t best = first;
      std::size_t end = first + arity < size ? first + arity : size;
      for (std::size_t c = first + 1; c < end; ++c)
        if (due_before(nodes_[c], nodes_[best])) best = c;
      if (!due_before(nodes_[best], n)) break;
      place(i, nodes_[best]);
      i = best;
    }
    place(i, n);
  }

  std::vector<timed_node*> nodes_;
};

} // namespace metronome::detail

#endif
