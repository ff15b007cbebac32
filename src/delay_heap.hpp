// The pool's delay queue, keyed by (due, sequence): a run for the nodes that come in due
// order, a 4-ary heap for the nearest others, and per-unit buckets over the next second
// with a second heap beyond them.
#ifndef METRONOME_DETAIL_DELAY_HEAP_HPP
#define METRONOME_DETAIL_DELAY_HEAP_HPP

#include <metronome/detail/task.hpp>
#include "quad_heap.hpp"

#include <algorithm>
#include <iterator>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <vector>

namespace metronome::detail {

// The delay queue's order: (due, seq), seq breaking ties first come, first served.
// Four parts hold the nodes, each with its key inline next to the node pointer:
// - the run: a FIFO of nodes whose keys never decrease, in a ring. A push whose key is
//   not below the run's last key is appended there: O(1), touching no other node. Most
//   pushes are such (every wait of one length, every timeout of one length);
// - the buckets: the others due within the window, about a second from the pool's time,
//   one unsorted list per unit of time (2^unit_shift ns, 262 us); O(1) to add and to
//   remove, entries in an arena;
// - the beyond heap: the others due after the window (a 4-ary heap);
// - the near heap: the earliest of all (a 4-ary heap). It takes in a bucket whole, or the
//   beyond heap's first unit, when they hold the earliest node (settle()).
// The invariant, re-established after every change by settle():
//   (H) the near heap's front is before every bucket and beyond node, and the near heap
//       is empty only when they are too;
//   (W) every bucket node's unit is in [base_, end_), every beyond node's >= end_, and
//       end_ <= base_ + bucket_count (a unit has one bucket: unit % bucket_count).
// So the earliest node is the smaller of the run's and the near heap's fronts. The near
// heap holds the records (nodes earlier than everything before them) and the buckets taken
// in, not the whole spread: with a million timers at random delays it stays in cache. The
// window moves with the pool's time (advance()), taking beyond nodes into buckets a few at
// a time, never a big list at once. Each node records where it is in heap_index_, so
// removal of any node (cancel) is O(1) in the run and the buckets, O(log n) in a heap.
// The near heap keeps room for every bucket and beyond node ((R): its capacity >= the
// three counts), so settle(), which runs inside noexcept removals, never allocates. Not
// thread-safe: the pool guards it with its mutex.
class delay_heap {
  struct bucket_entry;

public:
  static constexpr unsigned unit_shift = 18;         // 262 us
  static constexpr std::size_t bucket_count = 4096;  // a window of 1.07 s

  delay_heap() noexcept { std::fill(std::begin(heads_), std::end(heads_), nil); }

  bool empty() const noexcept { return near_.empty() && live_ == 0; } // (H)
  std::size_t size() const noexcept { return near_.size() + live_ + bucketed_ + beyond_.size(); }
  timed_node* top() const noexcept { return front().node; }
  clock::rep top_due() const noexcept { return front().due; }
  bool is_head(const timed_node* n) const noexcept { return !empty() && top() == n; }

  // Returns true when `n` became the head. `seq` orders equal due times (FIFO) and grows
  // from one push to the next; `now` is the pool's time (where the window starts). May
  // throw (std::bad_alloc, std::length_error) with nothing changed.
  bool push(timed_node* n, std::uint64_t seq, clock::rep now) {
    const entry e{n->due_.load(std::memory_order_relaxed), seq, n};
    if (fits_run(e)) {
      if (count_ == ring_size_) grow_ring(); // may throw: nothing changed
      append_run(e);
    } else {
      reserve_room(false); // may throw: nothing changed
      if (near_.empty() && bucketed_ == 0 && beyond_.empty()) restart_window(now);
      place_off_run(e);
      settle();
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
    settle();
  }

  // Moves `n`, which is queued, to where the new `due` and `seq` (a new sequence number)
  // put it; the caller stores `due` in the node afterwards. Returns false, with nothing
  // changed, when that needs storage that cannot be had (memory exhausted); else true,
  // and `is_head` tells whether it is the head now.
  bool rekey(timed_node* n, clock::rep due, std::uint64_t seq, bool& is_head) noexcept {
    const entry e{due, seq, n};
    const heap_index_t at = n->heap_index_;
    if ((at & (run_bit | bucket_bit | beyond_bit)) == 0) { // in the near heap: in place
      near_.move_to(at, e);
      settle();
    } else if ((at & run_bit) && is_last_in_run(n) && (live_ == 1 || !key_before(e, run_entry(count_ - 2)))) {
      run_entry(count_ - 1) = e; // still the run's last, and in order: in place
      last_ = e;
    } else if ((at & run_bit) && fits_run(e)) { // to the run's end (its last key stays what it was)
      remove_from_run(n);                        // leaves a hole, or frees a slot
      if (count_ == ring_size_ && !try_grow_ring()) squeeze_run(); // the hole makes room
      append_run(e);
    } else { // anywhere else: the room first, so that nothing has changed on failure
      if (!succeeds([&] { reserve_room(fits_run(e)); })) return false;
      take_out(n);
      if (fits_run(e))
        append_run(e);
      else
        place_off_run(e);
      settle();
    }
    is_head = top() == n;
    return true;
  }

  // The pool's time moved to `now`: the window follows it (never past a bucket node), and
  // beyond nodes it now covers move into buckets, at most pull_budget of them (whole units)
  // per call (those it jumped past go to the near heap). Allocates only arena entries, and
// stops short when there are none.
  void advance(clock::rep now) noexcept {
    const std::uint64_t u = unit_of(now);
    if (u <= base_) return;
    if (bucketed_ == 0 && beyond_.empty()) {
      base_ = u;
      end_ = u + bucket_count;
      return;
    }
    base_ = bucketed_ != 0 ? std::min(u, earliest_bucket()) : u;
    std::size_t moved = 0;
    while (!beyond_.empty()) {
      const entry e = beyond_.front();
      const std::uint64_t unit = unit_of(e.due);
      if (unit >= base_ + bucket_count) break;
      if (moved >= pull_budget && unit != unit_of(last_pulled_)) break; // whole units only
      if (unit < base_) { // overdue (the window jumped past it): the near heap, room (R)
        beyond_.remove_at(0);
        near_.push(e);
      } else {
        if (free_ == nil && !succeeds([&] { grow_arena(); })) break;
        beyond_.remove_at(0);
        bucket_link(take_free(), e);
      }
      last_pulled_ = e.due;
      ++moved;
    }
    end_ = beyond_.empty() ? base_ + bucket_count : std::min(base_ + bucket_count, unit_of(beyond_.front().due));
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
    near_.remove_if(pred, f);
    beyond_.remove_if(pred, f);
    for (std::size_t i = 0; bucketed_ != 0 && i < arena_.size(); ++i) {
      timed_node* n = arena_[i].e.node;
      if (n && pred(n)) {
        bucket_unlink(static_cast<std::uint32_t>(i));
        f(n);
      }
    }
    settle();
    shrink_if_sparse();
  }

  // Gives storage back once the queue has emptied out: all of it when empty, else down to
  // twice the size when under a quarter of the capacity (amortised O(1) per removal).
  // Allocation failure only keeps the old storage.
  void shrink_if_sparse() noexcept {
    near_.shrink(near_.size() + bucketed_ + beyond_.size(), min_kept); // (R)
    beyond_.shrink(beyond_.size(), min_kept);
    if (count_ == 0) {
      if (ring_size_ > min_kept) {
        ring_.reset();
        ring_size_ = 0;
        head_ = 0;
      }
    } else if (ring_size_ > min_kept && count_ < ring_size_ / 4) {
      resize_ring(ring_size_ / 2); // keeps the ring on failure
    }
    if (bucketed_ == 0 && arena_.size() > min_kept) { // every entry is free: forget them
      std::vector<bucket_entry>().swap(arena_);
      free_ = nil;
    }
  }

  std::size_t capacity() const noexcept {
    return near_.capacity() + beyond_.capacity() + ring_size_ + arena_.capacity();
  }
  // Where the nodes wait (tests): in buckets, beyond the window.
  std::size_t bucketed() const noexcept { return bucketed_; }
  std::size_t beyond() const noexcept { return beyond_.size(); }

private:
  using entry = delay_entry;
  static constexpr auto before = key_before;
  static constexpr std::size_t min_kept = 256; // entries kept without shrinking
  static constexpr std::size_t pull_budget = 1024;
  // heap_index_: run_bit | its number in the run; else bucket_bit | its arena entry; else
  // beyond_bit | its slot in the beyond heap; else its slot in the near heap. Run numbers
  // count modulo run_numbers (so that no number is not_in_heap); the run holds fewer nodes.
  static constexpr heap_index_t run_bit = heap_index_t(1) << 31;
  static constexpr heap_index_t run_numbers = run_bit - 1;
  static constexpr heap_index_t bucket_bit = heap_index_t(1) << 30;
  static constexpr heap_index_t beyond_bit = heap_index_t(1) << 29;
  static constexpr std::uint32_t nil = ~std::uint32_t(0);

  // ---- all parts
  const entry& front() const noexcept {
    if (live_ == 0) return near_.front();
    const entry& r = run_entry(0); // never a hole
    return near_.empty() || before(r, near_.front()) ? r : near_.front();
  }

  // Room for one more node off the run wherever settle() may move it (R), a free arena
  // entry, a beyond slot, and ring room when it goes to the run. May throw with nothing
  // changed.
  void reserve_room(bool to_run) {
    near_.reserve_for(near_.size() + bucketed_ + beyond_.size() + 1);
    beyond_.reserve_for(beyond_.size() + 1);
    if (free_ == nil) grow_arena();
    if (to_run && count_ == ring_size_) grow_ring();
  }

  // Off the run, by its unit (W); allocates nothing after reserve_room().
  void place_off_run(const entry& e) noexcept {
    const std::uint64_t u = unit_of(e.due);
    if (u < base_)
      near_.push(e);
    else if (u < end_)
      bucket_link(take_free(), e);
    else
      beyond_.push(e);
  }

  void take_out(timed_node* n) noexcept {
    const heap_index_t at = n->heap_index_;
    if (at & run_bit)
      remove_from_run(n);
    else if (at & bucket_bit)
      bucket_unlink(at & ~bucket_bit);
    else if (at & beyond_bit)
      beyond_.remove_at(at & ~beyond_bit);
    else
      near_.remove_at(at);
  }

  // (H): while a bucket or the beyond heap holds a node not after the near heap's front's
  // unit, or the near heap is empty, takes that bucket (or the beyond heap's first unit)
  // in. Every bucket node is before every beyond node (W), so the earliest bucket is
  // looked at first. Allocates nothing (R).
  void settle() noexcept {
    for (;;) {
      if (bucketed_ != 0) {
        const std::uint64_t b = earliest_bucket();
        if (!near_.empty() && unit_of(near_.front().due) < b) return;
        take_in_bucket(b);
      } else if (!beyond_.empty()) {
        const std::uint64_t o = unit_of(beyond_.front().due);
        if (!near_.empty() && unit_of(near_.front().due) < o) return;
        do {
          const entry e = beyond_.front();
          beyond_.remove_at(0);
          near_.push(e);
        } while (!beyond_.empty() && unit_of(beyond_.front().due) == o);
      } else {
        return;
      }
    }
  }

  // ---- the buckets
  struct bucket_entry {
    entry e{};               // e.node null: free, linked through next
    std::uint32_t prev = nil; // in its bucket's list
    std::uint32_t next = nil;
  };

  static std::uint64_t unit_of(clock::rep due) noexcept {
    return (static_cast<std::uint64_t>(due) ^ (std::uint64_t(1) << 63)) >> unit_shift; // order-preserving
  }
  static std::size_t bucket_of(std::uint64_t unit) noexcept { return unit & (bucket_count - 1); }

  // Everything off the run is empty: the window starts at the pool's time.
  void restart_window(clock::rep now) noexcept {
    base_ = unit_of(now);
    end_ = base_ + bucket_count;
  }

  void grow_arena() { // may throw: nothing changed
    if (arena_.size() >= bucket_bit) throw std::length_error("metronome: too many delayed tasks");
    arena_.emplace_back();
    arena_.back().next = free_;
    free_ = static_cast<std::uint32_t>(arena_.size() - 1);
  }
  std::uint32_t take_free() noexcept { // free_ != nil
    const std::uint32_t i = free_;
    free_ = arena_[i].next;
    return i;
  }
  void give_back(std::uint32_t i) noexcept {
    arena_[i].e.node = nullptr;
    arena_[i].next = free_;
    free_ = i;
  }

  void bucket_link(std::uint32_t i, const entry& e) noexcept {
    const std::size_t b = bucket_of(unit_of(e.due));
    bucket_entry& f = arena_[i];
    f.e = e;
    f.prev = nil;
    f.next = heads_[b];
    if (f.next != nil) arena_[f.next].prev = i;
    heads_[b] = i;
    occupied_[b / 64] |= std::uint64_t(1) << (b % 64);
    summary_ |= std::uint64_t(1) << (b / 64);
    e.node->heap_index_ = bucket_bit | static_cast<heap_index_t>(i);
    ++bucketed_;
  }

  void bucket_unlink(std::uint32_t i) noexcept {
    bucket_entry& f = arena_[i];
    if (f.prev != nil) {
      arena_[f.prev].next = f.next;
    } else {
      const std::size_t b = bucket_of(unit_of(f.e.due));
      heads_[b] = f.next;
      if (f.next == nil) mark_empty(b);
    }
    if (f.next != nil) arena_[f.next].prev = f.prev;
    f.e.node->heap_index_ = not_in_heap;
    give_back(i);
    --bucketed_;
  }

  void mark_empty(std::size_t b) noexcept {
    occupied_[b / 64] &= ~(std::uint64_t(1) << (b % 64));
    if (occupied_[b / 64] == 0) summary_ &= ~(std::uint64_t(1) << (b / 64));
  }

  // The earliest unit with a bucket node (bucketed_ != 0): the first occupied bucket from
  // base_'s, going round (W).
  std::uint64_t earliest_bucket() const noexcept {
    const std::size_t start = bucket_of(base_);
    std::size_t word = start / 64;
    std::uint64_t bits = occupied_[word] & (~std::uint64_t(0) << (start % 64));
    if (bits == 0) {
      const std::uint64_t later = word == 63 ? 0 : summary_ & (~std::uint64_t(0) << (word + 1));
      word = static_cast<std::size_t>(__builtin_ctzll(later != 0 ? later : summary_));
      bits = occupied_[word];
      if (later == 0 && word == start / 64) bits &= ~(~std::uint64_t(0) << (start % 64)); // wrapped to the start word
    }
    const std::size_t b = word * 64 + static_cast<std::size_t>(__builtin_ctzll(bits));
    return base_ + ((b - start) & (bucket_count - 1));
  }

  // Moves the bucket of `unit` into the near heap (room: (R)).
  void take_in_bucket(std::uint64_t unit) noexcept {
    const std::size_t b = bucket_of(unit);
    std::uint32_t i = heads_[b];
    heads_[b] = nil;
    mark_empty(b);
    while (i != nil) {
      const std::uint32_t next = arena_[i].next;
      near_.push(arena_[i].e);
      give_back(i);
      --bucketed_;
      i = next;
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
  // Runs f, which may throw with nothing changed: whether it succeeded.
  template <class F>
  static bool succeeds(F&& f) noexcept {
    try {
      f();
      return true;
    } catch (...) {
      return false;
    }
  }
  bool try_grow_ring() noexcept { return succeeds([&] { grow_ring(); }); }
  void resize_ring(std::size_t size) noexcept { succeeds([&] { resize_ring_or_throw(size); }); }
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

  quad_heap near_{0};
  quad_heap beyond_{beyond_bit};
  std::unique_ptr<entry[]> ring_; // the run: count_ entries from head_, ring_size_ a power of two
  std::size_t ring_size_ = 0;
  std::size_t head_ = 0;
  std::size_t count_ = 0; // entries in the run, holes included; the front is never a hole
  std::size_t live_ = 0;  // nodes in the run
  heap_index_t first_ = 0; // the number of the run's front
  entry last_{};           // the key of the run's last node appended (valid while live_ > 0)
  // The buckets and their window (W): an arena of entries, a list per bucket, free ones
  // linked from free_; a bit per occupied bucket, and a bit per non-zero word of those.
  std::uint64_t base_ = 0;
  std::uint64_t end_ = bucket_count;
  clock::rep last_pulled_ = 0;
  std::size_t bucketed_ = 0;
  std::vector<bucket_entry> arena_;
  std::uint32_t free_ = nil;
  std::uint64_t summary_ = 0;
  std::uint64_t occupied_[bucket_count / 64] = {};
  std::uint32_t heads_[bucket_count] = {};
};

} // namespace metronome::detail

#endif
