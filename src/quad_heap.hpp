// A 4-ary min-heap of delay-queue entries keyed by (due, sequence), each node knowing its
// slot: the delay queue's near heap and its beyond heap (delay_heap.hpp).
#ifndef METRONOME_DETAIL_QUAD_HEAP_HPP
#define METRONOME_DETAIL_QUAD_HEAP_HPP

#include <metronome/detail/task.hpp>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace metronome::detail {

// A queued node's key, kept beside the node pointer wherever the node waits.
struct delay_entry {
  clock::rep due;
  std::uint64_t seq;
  timed_node* node; // null: a hole in the run, or a free bucket entry
};
inline bool key_before(const delay_entry& a, const delay_entry& b) noexcept {
  return a.due < b.due || (a.due == b.due && a.seq < b.seq);
}

// Runs f, which may throw with nothing changed: whether it succeeded. The delay queue's
// parts grow their storage this way inside noexcept removals and re-keys.
template <class F>
bool succeeds(F&& f) noexcept {
  try {
    f();
    return true;
  } catch (...) {
    return false;
  }
}

// A 4-ary min-heap of entries (the four children of a slot share two cache lines). A
// node's heap_index_ is tag | its slot, so that it can be removed from anywhere in
// O(log n). Slots stay below max_size.
class quad_heap {
public:
  static constexpr std::size_t max_size = std::size_t(1) << 29;
  explicit quad_heap(heap_index_t tag) noexcept : tag_(tag) {}

  bool empty() const noexcept { return v_.empty(); }
  std::size_t size() const noexcept { return v_.size(); }
  std::size_t capacity() const noexcept { return v_.capacity(); }
  const delay_entry& front() const noexcept { return v_.front(); }

  // Room for n entries. May throw (std::bad_alloc, std::length_error) with nothing changed.
  void reserve_for(std::size_t n) {
    if (n >= max_size) throw std::length_error("metronome: too many delayed tasks");
    if (v_.capacity() < n) v_.reserve(std::max<std::size_t>({16, n, v_.capacity() * 2}));
  }
  // Allocates nothing within the room reserve_for() made.
  void push(const delay_entry& e) {
    v_.push_back(e);
    sift_up(v_.size() - 1);
  }
  void remove_at(std::size_t i) noexcept {
    timed_node* gone = v_[i].node;
    const delay_entry last = v_.back();
    v_.pop_back();
    gone->heap_index_ = not_in_heap;
    if (i != v_.size()) move_to(i, last);
  }
  // Gives slot i (the same node) the key e.
  void move_to(std::size_t i, const delay_entry& e) noexcept {
    place(i, e);
    if (i > 0 && key_before(e, v_[(i - 1) / arity]))
      sift_up(i);
    else
      sift_down(i);
  }
  // Removes the entries matching `pred`, calling `f` on each node; O(n), allocates nothing.
  template <class Pred, class F>
  void remove_if(Pred& pred, F& f) noexcept {
    std::size_t kept = 0;
    for (const delay_entry e : v_) { // writes only behind itself (kept <= the position read)
      if (pred(e.node)) {
        e.node->heap_index_ = not_in_heap;
        f(e.node);
      } else {
        v_[kept++] = e;
      }
    }
    if (kept == v_.size()) return;
    v_.resize(kept);
    for (std::size_t i = 0; i < v_.size(); ++i) v_[i].node->heap_index_ = tag_ | static_cast<heap_index_t>(i);
    for (std::size_t i = v_.size() / arity + 1; i-- > 0;) sift_down(i);
  }
  // Gives storage back: all of it when nothing is to be kept, else down to twice `keep`
  // (>= size()) when under a quarter of the capacity. Allocation failure keeps the old.
  void shrink(std::size_t keep, std::size_t min_kept) noexcept {
    const std::size_t cap = v_.capacity();
    if (keep == 0) {
      if (cap > min_kept) std::vector<delay_entry>().swap(v_);
    } else if (cap > min_kept && keep < cap / 4) {
      try {
        std::vector<delay_entry> smaller;
        smaller.reserve(keep * 2);
        smaller.assign(v_.begin(), v_.end());
        v_.swap(smaller);
      } catch (...) {
      }
    }
  }

private:
  static constexpr std::size_t arity = 4;
  void place(std::size_t i, const delay_entry& e) noexcept {
    v_[i] = e;
    e.node->heap_index_ = tag_ | static_cast<heap_index_t>(i);
  }
  void sift_up(std::size_t i) noexcept {
    const delay_entry e = v_[i];
    while (i > 0) {
      const std::size_t parent = (i - 1) / arity;
      if (!key_before(e, v_[parent])) break;
      place(i, v_[parent]);
      i = parent;
    }
    place(i, e);
  }
  void sift_down(std::size_t i) noexcept {
    if (i >= v_.size()) return;
    const delay_entry e = v_[i];
    const std::size_t size = v_.size();
    for (;;) {
      const std::size_t first = i * arity + 1;
      if (first >= size) break;
      std::size_t best = first;
      const std::size_t end = first + arity < size ? first + arity : size;
      for (std::size_t c = first + 1; c < end; ++c)
        if (key_before(v_[c], v_[best])) best = c;
      if (!key_before(v_[best], e)) break;
      place(i, v_[best]);
      i = best;
    }
    place(i, e);
  }

  std::vector<delay_entry> v_;
  heap_index_t tag_;
};

} // namespace metronome::detail

#endif
