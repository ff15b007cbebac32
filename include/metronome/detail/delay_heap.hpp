// The pool's delay queue: a 4-ary heap of timed nodes keyed by (due, sequence).
#ifndef METRONOME_DETAIL_DELAY_HEAP_HPP
#define METRONOME_DETAIL_DELAY_HEAP_HPP

#include <metronome/detail/task.hpp>

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace metronome::detail {

// A 4-ary min-heap of timed nodes ordered by (due, seq). The key is stored inline
// next to the node pointer, so sifting compares contiguous memory (the four children
// of a slot share two cache lines) instead of chasing every child's node. Each node
// records its slot in heap_index_, so removal of any node (cancel) is O(log n). Not
// thread-safe: the pool guards it with its mutex.
class delay_heap {
public:
  bool empty() const noexcept { return entries_.empty(); }
  std::size_t size() const noexcept { return entries_.size(); }
  timed_node* top() const noexcept { return entries_.front().node; }
  clock::rep top_due() const noexcept { return entries_.front().due; }

  // Returns true when `n` became the head. `seq` orders equal due times (FIFO).
  bool push(timed_node* n, std::uint64_t seq) {
    if (entries_.size() >= not_in_heap) throw std::length_error("metronome: too many delayed tasks");
    entries_.push_back(entry{n->due_.load(std::memory_order_relaxed), seq, n});
    sift_up(entries_.size() - 1);
    return n->heap_index_ == 0;
  }

  timed_node* pop() noexcept {
    timed_node* n = entries_.front().node;
    remove_at(0);
    return n;
  }

  void remove(timed_node* n) noexcept { remove_at(n->heap_index_); }

  // Moves `n`, which is in the heap, to where its due time (read again) and `seq` now
  // put it. Returns true when it is the head afterwards. Allocates nothing.
  bool rekey(timed_node* n, std::uint64_t seq) noexcept {
    const std::size_t i = n->heap_index_;
    const entry e{n->due_.load(std::memory_order_relaxed), seq, n};
    place(i, e);
    if (i > 0 && before(e, entries_[(i - 1) / arity]))
      sift_up(i);
    else
      sift_down(i);
    return n->heap_index_ == 0;
  }

  // Takes every node out, in due order (then FIFO); used by shutdown paths.
  template <class F>
  void drain(F&& f) noexcept {
    auto all = std::move(entries_);
    entries_.clear();
    std::sort(all.begin(), all.end(), before);
    for (auto& e : all) {
      e.node->heap_index_ = not_in_heap;
      f(e.node);
    }
  }

  // Removes the nodes matching `pred`, calling `f` on each; O(n), allocates nothing.
  template <class Pred, class F>
  void remove_if(Pred&& pred, F&& f) noexcept {
    std::size_t kept = 0;
    for (const entry e : entries_) { // writes only behind itself (kept <= the position read)
      if (pred(e.node)) {
        e.node->heap_index_ = not_in_heap;
        f(e.node);
      } else {
        entries_[kept++] = e;
      }
    }
    if (kept == entries_.size()) return;
    entries_.resize(kept);
    for (std::size_t i = 0; i < entries_.size(); ++i) entries_[i].node->heap_index_ = static_cast<heap_index_t>(i);
    for (std::size_t i = entries_.size() / arity + 1; i-- > 0;) sift_down(i);
    shrink_if_sparse();
  }

  // Gives storage back once the heap has emptied out: all of it when empty, else down to
  // twice the size when under a quarter of the capacity (amortised O(1) per removal).
  // Allocation failure only keeps the old storage.
  void shrink_if_sparse() noexcept {
    const std::size_t cap = entries_.capacity();
    if (entries_.empty()) {
      if (cap > min_kept) std::vector<entry>().swap(entries_);
      return;
    }
    if (cap <= min_kept || entries_.size() >= cap / 4) return;
    try {
      std::vector<entry> smaller;
      smaller.reserve(entries_.size() * 2);
      smaller.assign(entries_.begin(), entries_.end());
      entries_.swap(smaller);
    } catch (...) {
    }
  }

  std::size_t capacity() const noexcept { return entries_.capacity(); }

private:
  static constexpr std::size_t arity = 4;
  static constexpr std::size_t min_kept = 256; // entries kept without shrinking

  struct entry {
    clock::rep due;
    std::uint64_t seq;
    timed_node* node;
  };

  static bool before(const entry& a, const entry& b) noexcept {
    return a.due < b.due || (a.due == b.due && a.seq < b.seq);
  }

  void place(std::size_t i, const entry& e) noexcept {
    entries_[i] = e;
    e.node->heap_index_ = static_cast<heap_index_t>(i);
  }

  void remove_at(std::size_t i) noexcept {
    timed_node* gone = entries_[i].node;
    const entry last = entries_.back();
    entries_.pop_back();
    gone->heap_index_ = not_in_heap;
    if (i == entries_.size()) return;
    place(i, last);
    if (i > 0 && before(last, entries_[(i - 1) / arity]))
      sift_up(i);
    else
      sift_down(i);
  }

  void sift_up(std::size_t i) noexcept {
    const entry e = entries_[i];
    while (i > 0) {
      std::size_t parent = (i - 1) / arity;
      if (!before(e, entries_[parent])) break;
      place(i, entries_[parent]);
      i = parent;
    }
    place(i, e);
  }

  void sift_down(std::size_t i) noexcept {
    if (i >= entries_.size()) return;
    const entry e = entries_[i];
    const std::size_t size = entries_.size();
    for (;;) {
      std::size_t first = i * arity + 1;
      if (first >= size) break;
      std::size_t best = first;
      std::size_t end = first + arity < size ? first + arity : size;
      for (std::size_t c = first + 1; c < end; ++c)
        if (before(entries_[c], entries_[best])) best = c;
      if (!before(entries_[best], e)) break;
      place(i, entries_[best]);
      i = best;
    }
    place(i, e);
  }

  std::vector<entry> entries_;
};

} // namespace metronome::detail

#endif
