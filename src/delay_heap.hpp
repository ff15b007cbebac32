// The pool's delay queue: a 4-ary heap of timed nodes keyed by (due, sequence) for the
// near future, a run beside it for the nodes that come in due order, and coarse levels
// for the far future that feed the heap as it empties.
#ifndef METRONOME_DETAIL_DELAY_HEAP_HPP
#define METRONOME_DETAIL_DELAY_HEAP_HPP

#include <metronome/detail/task.hpp>

#include <algorithm>
#include <cassert>
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
// - the far levels, for the others that are not due soon (see "The far levels" below):
//   a hierarchical timing wheel of unsorted lists, O(1) to add and to remove, that moves
//   the earliest list into the heap when the heap runs empty. The heap so holds only the
//   near future (one unit of time's worth of nodes) and stays in cache with a million
//   timers pending; order stays exact, because the heap is refilled before it is read.
// The earliest node is the smaller of the run's and the heap's fronts. Each node records
// where it is in heap_index_ (a heap slot, run_bit and its number in the run, or far_bit
// and its place in the far levels), so removal of any node (cancel) is O(log n) in the
// heap and O(1) elsewhere: in the run it leaves a hole, skipped at the front and squeezed
// out once holes outnumber the nodes. Not thread-safe: the pool guards it with its mutex.
//
// The far levels. Time is cut into units of 2^unit_shift ns (262 us by default), and a
// unit number into 6-bit digits. elapsed_ is the unit whose nodes the heap holds.
// A node of unit u > elapsed_ sits at level L, the highest digit where u and elapsed_
// differ, in slot (digit L of u): as in Tokio's and Linux's timer wheels, every node at
// a lower level is due before every node at a higher one, and within a level the lowest
// occupied slot comes first. The invariant, with one exception inside refill():
//   (F1) every heap node's unit <= elapsed_ < every far node's unit;
//   (F2) the far levels hold a node only if the heap holds one too.
// So the heap's front, or the run's, is the earliest node. When the heap empties, refill()
// takes the lowest occupied slot: at level 0 its nodes, all of one unit, become the heap
// (elapsed_ = that unit); above, elapsed_ moves to the slot's first unit and its nodes go
// down a level or more (each node moves down at most once per level). Moving elapsed_ to the start
// of the earliest slot leaves every other node where it belongs, since they differ from
// the new elapsed_ at the same digit as from the old one. Storage: the far nodes' entries
// live in an arena, linked per slot (no allocation when they move), and the heap keeps room
// for them all (entries_.capacity() >= heap + far nodes: (F3)), so a refill, which only
// runs in noexcept removals, never allocates.
class delay_heap {
public:
  // Units of 2^unit_shift ns for the far levels (tests pick small ones to reach every level).
  static constexpr unsigned default_unit_shift = 18;
  explicit delay_heap(unsigned unit_shift = default_unit_shift) noexcept : shift_(unit_shift) {
    for (auto& level : heads_)
      for (auto& h : level) h = nil;
  }

  bool empty() const noexcept { return entries_.empty() && live_ == 0; } // (F2)
  std::size_t size() const noexcept { return entries_.size() + live_ + far_count_; }
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
      push_off_run(e); // may throw: nothing changed
    }
    return top() == n;
  }

  timed_node* pop() noexcept {
    timed_node* n = top();
    remove(n);
    return n;
  }

  void remove(timed_node* n) noexcept {
    take_out(n);
    refill_if_drained();
  }

  // Moves `n`, which is queued, to where the new `due` and `seq` (a new sequence number)
  // put it; the caller stores `due` in the node afterwards. Returns false, with nothing
  // changed, when that needs storage that cannot be had (memory exhausted); else true,
  // and `is_head` tells whether it is the head now.
  bool rekey(timed_node* n, clock::rep due, std::uint64_t seq, bool& is_head) noexcept {
    const entry e{due, seq, n};
    const heap_index_t at = n->heap_index_;
    if (!(at & run_bit) && !(at & far_bit) && unit_of(due) <= elapsed_) { // stays in the heap (F1): in place
      const std::size_t i = at;
      place(i, e);
      if (i > 0 && before(e, entries_[(i - 1) / arity]))
        sift_up(i);
      else
        sift_down(i);
    } else if ((at & run_bit) && is_last_in_run(n) && (live_ == 1 || !before(e, run_entry(count_ - 2)))) {
      run_entry(count_ - 1) = e; // still the run's last, and in order: in place
      last_ = e;
    } else if ((at & run_bit) && fits_run(e)) { // to the run's end (its last key stays what it was)
      remove_from_run(n);                        // leaves a hole, or frees a slot
      if (count_ == ring_size_ && !try_grow_ring()) squeeze_run(); // the hole makes room
      append_run(e);
    } else { // anywhere else: the room first, so that nothing has changed on failure
      if (!reserve_one(fits_run(e))) return false;
      take_out(n);
      put(e); // allocates nothing after reserve_one()
      refill_if_drained();
    }
    is_head = top() == n;
    return true;
  }

  // Takes every node out, in due order (then FIFO); used by shutdown paths. Allocates
  // nothing.
  template <class F>
  void drain(F&& f) noexcept {
    while (!empty()) f(pop());
    shrink_if_sparse();
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
    for (std::uint32_t i = 0; far_count_ > 0 && i < arena_.size(); ++i) {
      timed_node* n = arena_[i].e.node;
      if (n && pred(n)) {
        far_unlink(i);
        f(n);
      }
    }
    refill_if_drained();
    shrink_if_sparse();
  }

  // Gives storage back once the queue has emptied out: all of it when empty, else down to
  // twice the size when under a quarter of the capacity (amortised O(1) per removal).
  // Allocation failure only keeps the old storage.
  void shrink_if_sparse() noexcept {
    const std::size_t cap = entries_.capacity();
    const std::size_t needed = entries_.size() + far_count_; // (F3)
    if (needed == 0) {
      if (cap > min_kept) std::vector<entry>().swap(entries_);
    } else if (cap > min_kept && needed < cap / 4) {
      try {
        std::vector<entry> smaller;
        smaller.reserve(needed * 2);
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
    if (far_count_ == 0 && !arena_.empty()) { // the free list is the whole arena: forget it
      std::vector<far_entry>().swap(arena_);
      free_ = nil;
    }
  }

  std::size_t capacity() const noexcept { return entries_.capacity() + ring_size_ + arena_.capacity(); }
  // How many nodes wait in the far levels (tests).
  std::size_t far_size() const noexcept { return far_count_; }

private:
  static constexpr std::size_t arity = 4;
  static constexpr std::size_t min_kept = 256; // entries kept without shrinking
  // heap_index_ of a node in the run: run_bit | its number. Numbers count modulo
  // run_numbers (so that no number is not_in_heap); the run holds fewer nodes than that.
  static constexpr heap_index_t run_bit = heap_index_t(1) << 31;
  static constexpr heap_index_t run_numbers = run_bit - 1;
  // heap_index_ of a node in the far levels (run_bit clear): far_bit | its arena entry.
  // Heap slots and arena entries stay below far_bit.
  static constexpr heap_index_t far_bit = heap_index_t(1) << 30;
  static constexpr std::uint32_t nil = ~std::uint32_t(0);
  static constexpr unsigned levels = 11, slots = 64, digit = 6; // 11 digits of 6 bits cover any unit

  struct entry {
    clock::rep due;
    std::uint64_t seq;
    timed_node* node; // null: a hole in the run
  };
  static bool before(const entry& a, const entry& b) noexcept {
    return a.due < b.due || (a.due == b.due && a.seq < b.seq);
  }

  // ---- all parts
  // Into the heap or the far levels (a node that does not fit the run). May throw with
  // nothing changed.
  void push_off_run(const entry& e) {
    if (entries_.size() + far_count_ + 1 >= far_bit) throw std::length_error("metronome: too many delayed tasks");
    const std::size_t needed = entries_.size() + far_count_ + 1; // (F3) after the push
    if (entries_.capacity() < needed) entries_.reserve(std::max<std::size_t>({16, needed, entries_.capacity() * 2}));
    if (goes_far(e) && free_ == nil) grow_arena();
    put(e);
  }

  // Room for one node more anywhere (rekey's move): heap capacity, a free arena entry,
  // and ring room when it goes to the run. False, with nothing changed, when there is none.
  bool reserve_one(bool to_run) noexcept {
    try {
      const std::size_t needed = entries_.size() + far_count_ + 1;
      if (needed >= far_bit) return false;
      if (entries_.capacity() < needed) entries_.reserve(std::max<std::size_t>({16, needed, entries_.capacity() * 2}));
      if (free_ == nil) grow_arena();
      if (to_run && count_ == ring_size_) grow_ring();
      return true;
    } catch (...) {
      return false;
    }
  }

  // Places e where it belongs; the room is there (push_off_run(), reserve_one()).
  void put(const entry& e) noexcept {
    if (fits_run(e)) {
      append_run(e);
    } else if (!goes_far(e)) {
      if (entries_.empty() && far_count_ == 0) elapsed_ = unit_of(e.due); // all empty: the heap's unit starts afresh
      entries_.push_back(e); // within capacity (F3)
      sift_up(entries_.size() - 1);
    } else {
      far_link(take_free(), e);
    }
  }

  // Removes n from wherever it is, without refilling the heap.
  void take_out(timed_node* n) noexcept {
    const heap_index_t at = n->heap_index_;
    if (at & run_bit)
      remove_from_run(n);
    else if (at & far_bit)
      far_unlink(at & ~far_bit);
    else
      remove_at(at);
  }

  const entry& front() const noexcept {
    if (live_ == 0) return entries_.front();
    const entry& r = run_entry(0); // never a hole
    return entries_.empty() || before(r, entries_.front()) ? r : entries_.front();
  }

  // ---- the far levels
  struct far_entry {
    entry e;                 // e.node null: free, linked through next
    std::uint32_t prev = nil; // in its slot's list
    std::uint32_t next = nil;
  };

  std::uint64_t unit_of(clock::rep due) const noexcept {
    return (static_cast<std::uint64_t>(due) ^ (std::uint64_t(1) << 63)) >> shift_; // order-preserving
  }
  // A node off the run whose unit is past elapsed_ goes far, unless everything is empty
  // (the heap then starts at its unit).
  bool goes_far(const entry& e) const noexcept {
    return unit_of(e.due) > elapsed_ && !(entries_.empty() && far_count_ == 0);
  }
  // Where a node of unit u > elapsed_ (or == elapsed_, inside refill) sits: level, slot.
  unsigned level_of(std::uint64_t u) const noexcept {
    const std::uint64_t x = u ^ elapsed_;
    return x == 0 ? 0u : static_cast<unsigned>(63 - __builtin_clzll(x)) / digit;
  }
  static unsigned slot_of(std::uint64_t u, unsigned level) noexcept {
    return static_cast<unsigned>(u >> (digit * level)) & (slots - 1);
  }

  void grow_arena() { // may throw: nothing changed
    if (arena_.size() >= far_bit) throw std::length_error("metronome: too many delayed tasks");
    arena_.emplace_back();
    free_ = static_cast<std::uint32_t>(arena_.size() - 1);
  }
  std::uint32_t take_free() noexcept { // free_ != nil
    const std::uint32_t i = free_;
    free_ = arena_[i].next;
    return i;
  }

  void far_link(std::uint32_t i, const entry& e) noexcept {
    const std::uint64_t u = unit_of(e.due);
    const unsigned level = level_of(u), slot = slot_of(u, level);
    std::uint32_t& head = heads_[level][slot];
    far_entry& f = arena_[i];
    f.e = e;
    f.prev = nil;
    f.next = head;
    if (head != nil) arena_[head].prev = i;
    head = i;
    occupied_[level] |= std::uint64_t(1) << slot;
    occupied_levels_ |= 1u << level;
    e.node->heap_index_ = far_bit | static_cast<heap_index_t>(i);
    ++far_count_;
  }

  // Out of its slot's list, back on the free list. Its level and slot are those of its unit
  // against today's elapsed_ (refill() keeps them so).
  void far_unlink(std::uint32_t i) noexcept {
    far_entry& f = arena_[i];
    if (f.prev != nil) {
      arena_[f.prev].next = f.next;
    } else {
      const std::uint64_t u = unit_of(f.e.due);
      const unsigned level = level_of(u), slot = slot_of(u, level);
      assert(heads_[level][slot] == i);
      heads_[level][slot] = f.next;
      if (f.next == nil) clear_slot(level, slot);
    }
    if (f.next != nil) arena_[f.next].prev = f.prev;
    f.e.node->heap_index_ = not_in_heap;
    f.e.node = nullptr;
    f.next = free_;
    free_ = i;
    --far_count_;
  }

  void clear_slot(unsigned level, unsigned slot) noexcept {
    occupied_[level] &= ~(std::uint64_t(1) << slot);
    if (occupied_[level] == 0) occupied_levels_ &= ~(1u << level);
  }

  void refill_if_drained() noexcept {
    if (entries_.empty() && far_count_ != 0) refill();
  }

  // The heap is empty and the far levels are not: takes their earliest slot (above).
  // Allocates nothing: the heap has room for every far node (F3); moving a node down a
  // level relinks it.
  void refill() noexcept {
    for (;;) {
      const unsigned level = static_cast<unsigned>(__builtin_ctz(occupied_levels_));
      const unsigned slot = static_cast<unsigned>(__builtin_ctzll(occupied_[level]));
      std::uint32_t i = heads_[level][slot];
      heads_[level][slot] = nil;
      clear_slot(level, slot);
      // The slot's first unit: elapsed_'s digits above `level`, then `slot`, then zeros.
      const unsigned above = digit * (level + 1);
      const std::uint64_t high = above >= 64 ? 0 : (elapsed_ >> above) << above;
      elapsed_ = high | (std::uint64_t(slot) << (digit * level));
      if (level == 0) { // one unit's nodes: the heap (it was empty), ordered in O(n)
        while (i != nil) {
          far_entry& f = arena_[i];
          const std::uint32_t next = f.next;
          f.e.node->heap_index_ = static_cast<heap_index_t>(entries_.size());
          entries_.push_back(f.e); // within capacity (F3)
          f.e.node = nullptr;
          f.next = free_;
          free_ = i;
          --far_count_;
          i = next;
        }
        for (std::size_t k = entries_.size() / arity + 1; k-- > 0;) sift_down(k);
        return;
      }
      while (i != nil) { // down a level or more, against the new elapsed_ (F1 holds after the loop)
        const std::uint32_t next = arena_[i].next;
        --far_count_; // far_link counts it again
        far_link(i, arena_[i].e);
        i = next;
      }
    }
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

  // The far levels (above): entries in arena_, a list per slot, free ones linked from free_.
  unsigned shift_;
  std::uint64_t elapsed_ = 0;
  std::size_t far_count_ = 0;
  std::vector<far_entry> arena_;
  std::uint32_t free_ = nil;
  std::uint32_t occupied_levels_ = 0;
  std::uint64_t occupied_[levels] = {};
  std::uint32_t heads_[levels][slots];
};

} // namespace metronome::detail

#endif
