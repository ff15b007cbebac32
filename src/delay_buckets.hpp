// The delay queue's buckets (delay_heap.hpp): one unsorted list per unit of time over a
// window of bucket_count units, for work due soon that arrives out of due order. O(1) to
// add and to remove; the earliest occupied unit is found with two bit scans.
#ifndef METRONOME_DETAIL_DELAY_BUCKETS_HPP
#define METRONOME_DETAIL_DELAY_BUCKETS_HPP

#include <metronome/detail/task.hpp>
#include "quad_heap.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <vector>

namespace metronome::detail {

// A unit is 2^unit_shift ns (262 us); the window is bucket_count units (1.07 s) from
// base(). Entries live in an arena, each linked into its unit's list or, free, into the
// free list. Invariant:
//   (B) every entry's unit is in [base(), base() + bucket_count), so a unit has one
//       bucket (unit % bucket_count), and the buckets in window order start at base()'s;
//   (M) a bucket's bit in occupied_ is set exactly when its list is not empty, and a
//       word's bit in summary_ exactly when that word of occupied_ is not zero;
//   (I) a linked node's heap_index_ is tag | its arena entry.
// Not thread-safe.
class delay_buckets {
public:
  using entry = delay_entry;
  static constexpr unsigned unit_shift = 18;
  static constexpr std::size_t bucket_count = 4096;

  explicit delay_buckets(heap_index_t tag) noexcept : tag_(tag) { std::fill(std::begin(heads_), std::end(heads_), nil); }

  // A due time's unit, order-preserving over the whole range of clock::rep.
  static std::uint64_t unit_of(clock::rep due) noexcept {
    return (static_cast<std::uint64_t>(due) ^ (std::uint64_t(1) << 63)) >> unit_shift;
  }

  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return arena_.capacity(); }

  std::uint64_t base() const noexcept { return base_; }
  // Moves the window's start to `unit`; keeps (B): empty(), or unit <= earliest() and
  // every entry's unit below unit + bucket_count (the caller's window end).
  void set_base(std::uint64_t unit) noexcept { base_ = unit; }

  // A free entry for the next add(). has_free() after grow(), which may throw
  // (std::bad_alloc, std::length_error) with nothing changed.
  bool has_free() const noexcept { return free_ != nil; }
  void grow() {
    if (arena_.size() >= tag_) throw std::length_error("metronome: too many delayed tasks");
    arena_.emplace_back();
    arena_.back().next = free_;
    free_ = static_cast<std::uint32_t>(arena_.size() - 1);
  }

  // has_free(), and e's unit in the window (B).
  void add(const entry& e) noexcept {
    const std::uint32_t i = free_;
    free_ = arena_[i].next;
    const std::size_t b = bucket_of(unit_of(e.due));
    slot& f = arena_[i];
    f.e = e;
    f.prev = nil;
    f.next = heads_[b];
    if (f.next != nil) arena_[f.next].prev = i;
    heads_[b] = i;
    occupied_[b / 64] |= std::uint64_t(1) << (b % 64);
    summary_ |= std::uint64_t(1) << (b / 64);
    e.node->heap_index_ = tag_ | static_cast<heap_index_t>(i);
    ++size_;
  }

  // `n` is in a bucket.
  void remove(timed_node* n) noexcept { unlink(n->heap_index_ & ~tag_); }

  // The earliest unit with an entry (!empty()): the first occupied bucket from base()'s,
  // going round (B).
  std::uint64_t earliest() const noexcept {
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

  // Empties the bucket of `unit`, calling f(entry) on each of its entries (in no order);
  // f must not touch this object. The nodes' heap_index_ are f's to set.
  template <class F>
  void take(std::uint64_t unit, F&& f) noexcept {
    const std::size_t b = bucket_of(unit);
    std::uint32_t i = heads_[b];
    heads_[b] = nil;
    mark_empty(b);
    while (i != nil) {
      const std::uint32_t next = arena_[i].next;
      f(arena_[i].e);
      give_back(i);
      --size_;
      i = next;
    }
  }

  // Removes the nodes matching `pred`, calling `f` on each; O(arena), allocates nothing.
  template <class Pred, class F>
  void remove_if(Pred&& pred, F&& f) noexcept {
    for (std::size_t i = 0; size_ != 0 && i < arena_.size(); ++i) {
      timed_node* n = arena_[i].e.node;
      if (n && pred(n)) {
        unlink(static_cast<std::uint32_t>(i));
        f(n);
      }
    }
  }

  // Forgets the arena once every entry is free (keeping it when it is at most min_kept).
  void shrink_if_sparse(std::size_t min_kept) noexcept {
    if (size_ == 0 && arena_.size() > min_kept) {
      std::vector<slot>().swap(arena_);
      free_ = nil;
    }
  }

private:
  static constexpr std::uint32_t nil = ~std::uint32_t(0);
  struct slot {
    entry e{};                // e.node null: free, linked through next
    std::uint32_t prev = nil; // in its bucket's list
    std::uint32_t next = nil;
  };

  static std::size_t bucket_of(std::uint64_t unit) noexcept { return unit & (bucket_count - 1); }

  void unlink(std::uint32_t i) noexcept {
    slot& f = arena_[i];
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
    --size_;
  }

  void give_back(std::uint32_t i) noexcept {
    arena_[i].e.node = nullptr;
    arena_[i].next = free_;
    free_ = i;
  }

  void mark_empty(std::size_t b) noexcept { // (M)
    occupied_[b / 64] &= ~(std::uint64_t(1) << (b % 64));
    if (occupied_[b / 64] == 0) summary_ &= ~(std::uint64_t(1) << (b / 64));
  }

  const heap_index_t tag_; // a single bit, above every arena index
  std::uint64_t base_ = 0;
  std::size_t size_ = 0;
  std::vector<slot> arena_;
  std::uint32_t free_ = nil;
  std::uint64_t summary_ = 0;
  std::uint64_t occupied_[bucket_count / 64] = {};
  std::uint32_t heads_[bucket_count] = {};
};

} // namespace metronome::detail

#endif
