// The delay queue's buckets (delay_heap.hpp): one unsorted list per unit of time over a
// window of bucket_count units, for work due soon that arrives out of due order. O(1) to
// add and to remove; the earliest occupied unit is found with two bit scans.
#ifndef METRONOME_DETAIL_DELAY_BUCKETS_HPP
#define METRONOME_DETAIL_DELAY_BUCKETS_HPP

#include <metronome/detail/task.hpp>
#include "quad_heap.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

namespace metronome::detail {

// A unit is 2^unit_shift ns (262 us); the window is bucket_count units (1.07 s) from
// base(). A bucket keeps its entries, in no order, in chunks of chunk_size taken from a
// shared pool: taking a bucket in reads memory in sequence (an arena of linked entries
// made that a cache miss per entry with a million timers pending), and the storage is
// what is queued now, not what each bucket once held. Invariant:
//   (B) every entry's unit is in [base(), base() + bucket_count), so a unit has one
//       bucket (unit % bucket_count), and the buckets in window order start at base()'s;
//   (M) a bucket's bit in occupied_ is set exactly when it is not empty, and a word's
//       bit in summary_ exactly when that word of occupied_ is not zero;
//   (C) a bucket of n entries holds ceil(n / chunk_size) chunks, linked from its tail;
//       all but the tail are full, and the tail holds the entries past the others;
//   (I) a held node's heap_index_ is tag | its chunk << chunk_bits | its slot there.
// Not thread-safe.
class delay_buckets {
public:
  using entry = delay_entry;
  static constexpr unsigned unit_shift = 18;
  static constexpr std::size_t bucket_count = 4096;
  static constexpr unsigned chunk_bits = 5;
  static constexpr std::size_t chunk_size = std::size_t(1) << chunk_bits;

  // `tag`: a single bit, above chunk_bits.
  explicit delay_buckets(heap_index_t tag) noexcept : tag_(tag) {}

  // A due time's unit, order-preserving over the whole range of clock::rep.
  static std::uint64_t unit_of(clock::rep due) noexcept {
    return (static_cast<std::uint64_t>(due) ^ (std::uint64_t(1) << 63)) >> unit_shift;
  }

  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return chunks_.size() * chunk_size; }

  std::uint64_t base() const noexcept { return base_; }
  // Moves the window's start to `unit`; keeps (B): empty(), or unit <= earliest() and
  // every entry's unit below unit + bucket_count (the caller's window end).
  void set_base(std::uint64_t unit) noexcept { base_ = unit; }

  // Room for the next add() of an entry in e's unit. May throw (std::bad_alloc,
  // std::length_error when the chunk numbers below the tag run out) with nothing changed.
  void reserve(const entry& e) {
    if (bucket_of_entry(e).size % chunk_size != 0 || free_ != nil) return; // room in its tail, or a chunk free
    if (chunks_.size() >= (std::size_t(tag_) >> chunk_bits)) throw std::length_error("metronome: too many delayed tasks");
    auto c = std::make_unique<chunk>(); // may throw: nothing changed
    chunks_.push_back(std::move(c));    // may throw: nothing changed
    chunks_.back()->prev = free_;
    free_ = static_cast<std::uint32_t>(chunks_.size() - 1);
  }

  // After reserve(e), with e's unit in the window (B).
  void add(const entry& e) noexcept {
    const std::size_t b = bucket_of(unit_of(e.due));
    bucket& bk = buckets_[b];
    const std::size_t slot = bk.size % chunk_size;
    if (slot == 0) { // (C): a chunk from the pool becomes the tail
      const std::uint32_t c = free_;
      free_ = chunks_[c]->prev;
      chunks_[c]->prev = bk.tail;
      bk.tail = c;
    }
    chunks_[bk.tail]->e[slot] = e;
    e.node->heap_index_ = index_of(bk.tail, slot);
    ++bk.size;
    occupied_[b / 64] |= std::uint64_t(1) << (b % 64);
    summary_ |= std::uint64_t(1) << (b / 64);
    ++size_;
  }

  // `n` is in a bucket. The bucket's last entry takes its place (C); that node's index
  // follows (I).
  void remove(timed_node* n) noexcept {
    const heap_index_t i = n->heap_index_ & ~tag_;
    const std::uint32_t c = i >> chunk_bits;
    const std::size_t slot = i & (chunk_size - 1);
    const std::size_t b = bucket_of(unit_of(chunks_[c]->e[slot].due));
    bucket& bk = buckets_[b];
    chunk& tail = *chunks_[bk.tail];
    const std::size_t last = tail_fill(bk) - 1;
    n->heap_index_ = not_in_heap;
    if (c != bk.tail || slot != last) {
      chunks_[c]->e[slot] = tail.e[last];
      tail.e[last].node->heap_index_ = index_of(c, slot);
    }
    --bk.size;
    --size_;
    if (last == 0) { // the tail is empty: back to the pool
      const std::uint32_t t = bk.tail;
      bk.tail = tail.prev;
      tail.prev = free_;
      free_ = t;
    }
    if (bk.size == 0) mark_empty(b);
  }

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
  // f must not touch this object. The nodes' heap_index_ are f's to set. Its chunks go
  // back to the pool.
  template <class F>
  void take(std::uint64_t unit, F&& f) noexcept {
    constexpr std::size_t ahead = 8; // f writes each node: fetch them while it works
    const std::size_t b = bucket_of(unit);
    bucket& bk = buckets_[b];
    std::size_t fill = tail_fill(bk);
    for (std::uint32_t c = bk.tail; c != nil; fill = chunk_size) {
      chunk& k = *chunks_[c];
      for (std::size_t i = 0; i < fill; ++i) {
        if (i + ahead < fill) __builtin_prefetch(k.e[i + ahead].node, 1);
        f(k.e[i]);
      }
      const std::uint32_t prev = k.prev;
      k.prev = free_;
      free_ = c;
      c = prev;
    }
    size_ -= bk.size;
    bk = bucket{};
    mark_empty(b);
  }

  // Removes the nodes matching `pred`, calling `f` on each; O(entries + buckets),
  // allocates nothing.
  template <class Pred, class F>
  void remove_if(Pred&& pred, F&& f) noexcept {
    for (std::size_t b = 0; size_ != 0 && b < bucket_count; ++b) {
      if (buckets_[b].size == 0) continue;
      // From the last entry back: a removal moves the bucket's last entry, one already
      // looked at, into the place it leaves (and may give back chunks already passed).
      std::size_t fill = tail_fill(buckets_[b]);
      for (std::uint32_t c = buckets_[b].tail; c != nil; fill = chunk_size) {
        const std::uint32_t prev = chunks_[c]->prev; // before a removal may give c back
        for (std::size_t i = fill; i-- > 0;) {
          timed_node* n = chunks_[c]->e[i].node;
          if (pred(n)) {
            remove(n);
            f(n);
          }
        }
        c = prev;
      }
    }
  }

  // Gives the chunks back once every bucket is empty, unless they hold at most `kept`
  // entries.
  void shrink_if_sparse(std::size_t kept) noexcept {
    if (size_ == 0 && capacity() > kept) release_chunks();
  }

private:
  static constexpr std::uint32_t nil = ~std::uint32_t(0);
  struct chunk {
    entry e[chunk_size];
    std::uint32_t prev; // in its bucket, toward the first chunk; or the next free chunk
  };
  struct bucket {
    std::uint32_t tail = nil;
    std::uint32_t size = 0;
  };

  static std::size_t bucket_of(std::uint64_t unit) noexcept { return unit & (bucket_count - 1); }
  // How many entries a non-empty bucket's tail chunk holds (C).
  static std::size_t tail_fill(const bucket& bk) noexcept { return (bk.size - 1) % chunk_size + 1; }
  const bucket& bucket_of_entry(const entry& e) const noexcept { return buckets_[bucket_of(unit_of(e.due))]; }
  heap_index_t index_of(std::uint32_t c, std::size_t slot) const noexcept {
    return tag_ | static_cast<heap_index_t>(c << chunk_bits | slot);
  }

  void mark_empty(std::size_t b) noexcept { // (M)
    occupied_[b / 64] &= ~(std::uint64_t(1) << (b % 64));
    if (occupied_[b / 64] == 0) summary_ &= ~(std::uint64_t(1) << (b / 64));
  }

  void release_chunks() noexcept {
    std::vector<std::unique_ptr<chunk>>().swap(chunks_);
    free_ = nil;
  }

  const heap_index_t tag_;
  std::uint64_t base_ = 0;
  std::size_t size_ = 0;
  std::vector<std::unique_ptr<chunk>> chunks_; // by number
  std::uint32_t free_ = nil;   // the pool's free chunks, linked through prev
  std::uint64_t summary_ = 0;
  std::uint64_t occupied_[bucket_count / 64] = {};
  bucket buckets_[bucket_count];
};

} // namespace metronome::detail

#endif
