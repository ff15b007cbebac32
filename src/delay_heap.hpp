// The pool's delay queue: a 4-ary heap of timed nodes keyed by (due, sequence), and a
// run beside it for the nodes that come in due order.
#ifndef METRONOME_DETAIL_DELAY_HEAP_HPP
#define METRONOME_DETAIL_DELAY_HEAP_HPP

#include <metronome/detail/task.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <vector>

namespace metronome::detail {

// The delay queue's order: (due, seq), seq breaking ties first come, first served.
// Two parts hold the nodes, each with its key inline next to the node pointer:
// - the run: a FIFO of nodes whose keys never decrease, in a ring. A push whose key is
//   not below the run's last key is appended there: O(1), touching no other node. Most
//   pushes are such (every wait of one length, every timeout of one length);
// - a 4-ary min-heap for the others (the four children of a slot share two cache lines).
// The earliest node is the smaller of the two fronts. Each node records where it is in
// heap_index_ (a heap slot, or run_bit and its number in the run), so removal of any
// node (cancel) is O(log n) in the heap and O(1) in the run: there it leaves a hole,
// skipped at the front and squeezed out once holes outnumber the nodes. Not
// thread-safe: the pool guards it with its mutex.
class delay_heap {
public:
  bool empty() const noexcept { return entries_.empty() && live_ == 0; }
  std::size_t size() const noexcept { return entries_.size() + live_; }
  timed_node* top() const noexcept { return front().node; }
  clock::rep top_due() const noexcept { return front().due; }
  bool is_head(const timed_node* n) const noexcept { return !empty() && top() == n; }

  // Returns true when `n` became the head. `seq` orders equal due times (FIFO) and
  // grows from one push to the next. May throw (std::bad_alloc, std::length_error)
  // with nothing changed.
  bool push(timed_node* n, std::uint64_t seq) {
    const entry e{n->due_.load(std::memory_order_relaxed), seq, n};
    if (fits_run(e)) {
      if (count_ == ring_size_) grow_ring(); // may throw: nothing changed
      append_run(e);
    } else {
      if (entries_.size() >= run_bit) throw std::length_error("metronome: too many delayed tasks");
      entries_.push_back(e);
      sift_up(entries_.size() - 1);
    }
    return top() == n;
  }

  timed_node* pop() noexcept {
    timed_node* n = top();
    remove(n);
    return n;
  }

  void remove(timed_node* n) noexcept {
    if (n->heap_index_ & run_bit)
      remove_from_run(n);
    else
      remove_at(n->heap_index_);
  }

  // Moves `n`, which is queued, to where the new `due` and `seq` (a new sequence number)
  // put it; the caller stores `due` in the node afterwards. Returns false, with nothing
  // changed, when that needs storage that cannot be had (memory exhausted); else true,
  // and `is_head` tells whether it is the head now.
  bool rekey(timed_node* n, clock::rep due, std::uint64_t seq, bool& is_head) noexcept {
    const entry e{due, seq, n};
    if (!(n->heap_index_ & run_bit)) { // in the heap: in place, allocating nothing
      const std::size_t i = n->heap_index_;
      place(i, e);
      if (i > 0 && before(e, entries_[(i - 1) / arity]))
        sift_up(i);
      else
        sift_down(i);
    } else if (is_last_in_run(n) && (live_ == 1 || !before(e, run_entry(count_ - 2)))) {
      run_entry(count_ - 1) = e; // still the run's last, and in order: in place
      last_ = e;
    } else if (fits_run(e)) { // to the run's end (its last key stays what it was)
      remove_from_run(n);      // leaves a hole, or frees a slot
      if (count_ == ring_size_ && !try_grow_ring()) squeeze_run(); // the hole makes room
      append_run(e);
    } else { // into the heap: the room first, so that nothing has changed on failure
      try {
        if (entries_.size() + 1 >= run_bit) return false;
        if (entries_.size() == entries_.capacity()) entries_.reserve(std::max<std::size_t>(16, entries_.size() * 2));
      } catch (...) {
        return false;
      }
      remove_from_run(n);
      entries_.push_back(e);
      sift_up(entries_.size() - 1);
    }
    is_head = top() == n;
    return true;
  }

  // Takes every node out, in due order (then FIFO); used by shutdown paths. Allocates
  // nothing.
  template <class F>
  void drain(F&& f) noexcept {
    std::sort(entries_.begin(), entries_.end(), before);
    std::size_t h = 0, r = 0;
    for (;;) {
      while (r < count_ && run_entry(r).node == nullptr) ++r;
      const bool heap_left = h < entries_.size(), run_left = r < count_;
      if (!heap_left && !run_left) break;
      const entry& e = !run_left || (heap_left && before(entries_[h], run_entry(r))) ? entries_[h++] : run_entry(r++);
      e.node->heap_index_ = not_in_heap;
      f(e.node);
    }
    entries_.clear();
    clear_run();
  }

  // Removes the nodes matching `pred`, calling `f` on each; O(n), allocates nothing.
  template <class Pred, class F>
  void remove_if(Pred&& pred, F&& f) noexcept {
    for (std::size_t k = 0; k < count_; ++k) {
      entry& e = run_entry(k);
      if (e.node && pred(e.node)) {
        timed_node* n = e.node;
        e.node = nullptr;
        n->heap_index_ = not_in_heap;
        --live_;
        f(n);
      }
    }
    settle_run();
    std::size_t kept = 0;
    for (const entry e : entries_) { // writes only behind itself (kept <= the position read)
      if (pred(e.node)) {
        e.node->heap_index_ = not_in_heap;
        f(e.node);
      } else {
        entries_[kept++] = e;
      }
    }
    if (kept != entries_.size()) {
      entries_.resize(kept);
      for (std::size_t i = 0; i < entries_.size(); ++i) entries_[i].node->heap_index_ = static_cast<heap_index_t>(i);
      for (std::size_t i = entries_.size() / arity + 1; i-- > 0;) sift_down(i);
    }
    shrink_if_sparse();
  }

  // Gives storage back once the queue has emptied out: all of it when empty, else down to
  // twice the size when under a quarter of the capacity (amortised O(1) per removal).
  // Allocation failure only keeps the old storage.
  void shrink_if_sparse() noexcept {
    const std::size_t cap = entries_.capacity();
    if (entries_.empty()) {
      if (cap > min_kept) std::vector<entry>().swap(entries_);
    } else if (cap > min_kept && entries_.size() < cap / 4) {
      try {
        std::vector<entry> smaller;
        smaller.reserve(entries_.size() * 2);
        smaller.assign(entries_.begin(), entries_.end());
        entries_.swap(smaller);
      } catch (...) {
      }
    }
    if (count_ == 0) {
      if (ring_size_ > min_kept) {
        ring_.reset();
        ring_size_ = 0;
        head_ = 0;
      }
    } else if (ring_size_ > min_kept && count_ < ring_size_ / 4) {
      resize_ring(ring_size_ / 2); // keeps the ring on failure
    }
  }

  std::size_t capacity() const noexcept { return entries_.capacity() + ring_size_; }

private:
  static constexpr std::size_t arity = 4;
  static constexpr std::size_t min_kept = 256; // entries kept without shrinking
  // heap_index_ of a node in the run: run_bit | its number. Numbers count modulo
  // run_numbers (so that no number is not_in_heap); the run holds fewer nodes than that.
  static constexpr heap_index_t run_bit = heap_index_t(1) << 31;
  static constexpr heap_index_t run_numbers = run_bit - 1;

  struct entry {
    clock::rep due;
    std::uint64_t seq;
    timed_node* node; // null: a hole in the run
  };
  static bool before(const entry& a, const entry& b) noexcept {
    return a.due < b.due || (a.due == b.due && a.seq < b.seq);
  }

  // ---- both parts
  const entry& front() const noexcept {
    if (live_ == 0) return entries_.front();
    const entry& r = run_entry(0); // never a hole
    return entries_.empty() || before(r, entries_.front()) ? r : entries_.front();
  }

  // ---- the run
  bool fits_run(const entry& e) const noexcept {
    return live_ == 0 || !before(e, last_);
  }

  entry& run_entry(std::size_t k) noexcept { return ring_[(head_ + k) & (ring_size_ - 1)]; }
  const entry& run_entry(std::size_t k) const noexcept { return ring_[(head_ + k) & (ring_size_ - 1)]; }

  heap_index_t number_of(std::size_t k) const noexcept {
    return static_cast<heap_index_t>((first_ + k) % run_numbers);
  }
  std::size_t position_of(const timed_node* n) const noexcept {
    const heap_index_t number = n->heap_index_ & ~run_bit;
    return number >= first_ ? number - first_ : number + run_numbers - first_;
  }
  bool is_last_in_run(const timed_node* n) const noexcept { return position_of(n) == count_ - 1; }

  void append_run(const entry& e) noexcept { // room checked by the caller
    if (live_ == 0) clear_run();
    run_entry(count_) = e;
    e.node->heap_index_ = run_bit | number_of(count_);
    ++count_;
    ++live_;
    last_ = e;
  }

  void remove_from_run(timed_node* n) noexcept {
    run_entry(position_of(n)).node = nullptr;
    n->heap_index_ = not_in_heap;
    --live_;
    settle_run();
  }

  // The front is a node (holes there are dropped), an empty run starts afresh, and holes
  // never outnumber the nodes for long (squeezed out when they are more than half).
  void settle_run() noexcept {
    if (live_ == 0) {
      clear_run();
      return;
    }
    while (run_entry(0).node == nullptr) {
      head_ = (head_ + 1) & (ring_size_ - 1);
      first_ = (first_ + 1) % run_numbers;
      --count_;
    }
    if (count_ >= 64 && count_ - live_ > live_) squeeze_run();
  }

  void clear_run() noexcept {
    count_ = 0;
    live_ = 0;
    head_ = 0;
    first_ = 0;
  }

  // Moves the nodes together in the ring, in order, renumbering them: O(count).
  void squeeze_run() noexcept {
    std::size_t out = 0;
    for (std::size_t k = 0; k < count_; ++k) {
      const entry e = run_entry(k);
      if (!e.node) continue;
      run_entry(out) = e;
      e.node->heap_index_ = run_bit | number_of(out);
      ++out;
    }
    count_ = out;
  }

  void grow_ring() { resize_ring_or_throw(ring_size_ == 0 ? 64 : ring_size_ * 2); }
  bool try_grow_ring() noexcept {
    try {
      grow_ring();
      return true;
    } catch (...) {
      return false;
    }
  }
  void resize_ring(std::size_t size) noexcept {
    try {
      resize_ring_or_throw(size);
    } catch (...) {
    }
  }
  // Moves the run to a ring of `size` (a power of two, at least count_), front first;
  // the nodes keep their numbers.
  void resize_ring_or_throw(std::size_t size) {
    if (size >= run_numbers) throw std::length_error("metronome: too many delayed tasks");
    std::unique_ptr<entry[]> bigger(new entry[size]);
    for (std::size_t k = 0; k < count_; ++k) bigger[k] = run_entry(k);
    ring_ = std::move(bigger);
    ring_size_ = size;
    head_ = 0;
  }

  // ---- the heap
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

  std::vector<entry> entries_; // the heap
  std::unique_ptr<entry[]> ring_; // the run: count_ entries from head_, ring_size_ a power of two
  std::size_t ring_size_ = 0;
  std::size_t head_ = 0;
  std::size_t count_ = 0; // entries in the run, holes included; the front is never a hole
  std::size_t live_ = 0;  // nodes in the run
  heap_index_t first_ = 0; // the number of the run's front
  entry last_{};           // the key of the run's last node appended (valid while live_ > 0)
};

} // namespace metronome::detail

#endif
