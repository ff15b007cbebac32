// The delay queue's run (delay_heap.hpp): a FIFO of entries whose keys never decrease,
// in a ring. Most delayed work arrives in due order (every wait of one length, every
// timeout of one length), and such a push is an append here: O(1), touching no other node.
#ifndef METRONOME_DETAIL_DUE_RUN_HPP
#define METRONOME_DETAIL_DUE_RUN_HPP

#include <metronome/detail/task.hpp>
#include "large_array.hpp"
#include "quad_heap.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace metronome::detail {

// The run: count_ ring slots from head_, holding live_ nodes in (due, seq) order and
// count_ - live_ holes (removed nodes, node pointer null).
// Invariant:
//   (O) the live entries' keys never decrease from the front to the back, and no key is
//       below last_, the key of the last entry appended (while the run is not empty);
//   (F) the front slot is never a hole, and an empty run has no slots;
//   (N) a node's heap_index_ is tag | its number: the front's number first_ plus its
//       distance from the front, modulo run_numbers (so no number is not_in_heap).
// Holes never outnumber the nodes for long: once they are more than half of 64 or more
// slots, the run is squeezed (renumbered in place). Not thread-safe.
class due_run {
public:
  using entry = delay_entry;

  explicit due_run(heap_index_t tag) noexcept : tag_(tag), run_numbers_(tag - 1) {}

  bool empty() const noexcept { return live_ == 0; }
  std::size_t size() const noexcept { return live_; }
  const entry& front() const noexcept { return slot(0); } // !empty(); never a hole (F)
  std::size_t capacity() const noexcept { return ring_.size(); }

  // Whether `e` may be appended without breaking (O).
  bool fits(const entry& e) const noexcept { return live_ == 0 || !key_before(e, last_); }
  bool full() const noexcept { return count_ == ring_.size(); }
  // Room for one more slot. May throw (std::bad_alloc, std::length_error): nothing changed.
  void grow() { resize_or_throw(ring_.size() == 0 ? 64 : ring_.size() * 2); }

  // fits(e) and !full().
  void append(const entry& e) noexcept {
    if (live_ == 0) clear();
    slot(count_) = e;
    e.node->heap_index_ = tag_ | number_of(count_);
    ++count_;
    ++live_;
    last_ = e;
  }

  // `n` is in the run.
  void remove(timed_node* n) noexcept {
    slot(position_of(n)).node = nullptr;
    n->heap_index_ = not_in_heap;
    --live_;
    settle();
  }

  // Re-keys `n` (in the run) to `e` without moving it, when it is the last slot and `e`
  // still keeps (O) there (compared with the slot before it, or with a hole's key, which
  // is no greater). False, nothing changed, otherwise.
  bool rekey_last(const timed_node* n, const entry& e) noexcept {
    if (position_of(n) != count_ - 1) return false;
    if (live_ != 1 && key_before(e, slot(count_ - 2))) return false;
    slot(count_ - 1) = e;
    last_ = e;
    return true;
  }

  // Moves `n` (in the run) to the back under the key `e` (fits(e)). Allocates nothing: a
  // full ring that cannot grow is squeezed, and n's slot, now a hole, makes the room.
  void move_to_back(timed_node* n, const entry& e) noexcept {
    remove(n);
    if (full() && !succeeds([&] { grow(); })) squeeze();
    append(e);
  }

  // Removes the nodes matching `pred`, calling `f` on each; O(size), allocates nothing.
  template <class Pred, class F>
  void remove_if(Pred&& pred, F&& f) noexcept {
    for (std::size_t k = 0; k < count_; ++k) {
      entry& e = slot(k);
      if (e.node && pred(e.node)) {
        timed_node* n = e.node;
        e.node = nullptr;
        n->heap_index_ = not_in_heap;
        --live_;
        f(n);
      }
    }
    settle();
  }

  // Gives the ring back when the run is empty, or halves it when under a quarter full
  // (keeping at least `min_kept` slots). Allocation failure keeps the old ring.
  void shrink_if_sparse(std::size_t min_kept) noexcept {
    if (ring_.size() <= min_kept) return;
    if (count_ == 0) {
      ring_.reset();
      head_ = 0;
    } else if (count_ < ring_.size() / 4) {
      succeeds([&] { resize_or_throw(ring_.size() / 2); });
    }
  }

private:
  entry& slot(std::size_t k) noexcept { return ring_[(head_ + k) & (ring_.size() - 1)]; }
  const entry& slot(std::size_t k) const noexcept { return ring_[(head_ + k) & (ring_.size() - 1)]; }

  heap_index_t number_of(std::size_t k) const noexcept {
    return static_cast<heap_index_t>((first_ + k) % run_numbers_);
  }
  std::size_t position_of(const timed_node* n) const noexcept {
    const heap_index_t number = n->heap_index_ & ~tag_;
    return number >= first_ ? number - first_ : number + run_numbers_ - first_;
  }

  // (F): drops the holes at the front; an empty run starts afresh. Squeezes when holes
  // are more than half.
  void settle() noexcept {
    if (live_ == 0) {
      clear();
      return;
    }
    while (slot(0).node == nullptr) {
      head_ = (head_ + 1) & (ring_.size() - 1);
      first_ = (first_ + 1) % run_numbers_;
      --count_;
    }
    if (count_ >= 64 && count_ - live_ > live_) squeeze();
  }

  void clear() noexcept {
    count_ = 0;
    live_ = 0;
    head_ = 0;
    first_ = 0;
  }

  // Moves the nodes together, in order, renumbering them (N): O(count).
  void squeeze() noexcept {
    std::size_t out = 0;
    for (std::size_t k = 0; k < count_; ++k) {
      const entry e = slot(k);
      if (!e.node) continue;
      slot(out) = e;
      e.node->heap_index_ = tag_ | number_of(out);
      ++out;
    }
    count_ = out;
  }

  // Makes the ring `size` slots (a power of two, at least count_); the nodes keep their
  // numbers. The ring keeps its first min(size, old size) slots (large_array::resize:
  // without a copy where the ring is mapped, so that neither doubling nor halving it
  // touches a fresh page but those it will use). So a shrink first moves the slots in
  // use to the ring's start; a growth leaves them, and moves only those that wrapped
  // round past the old end to the new slots after it. Throws with nothing changed but
  // the slots' place in the ring.
  void resize_or_throw(std::size_t size) {
    if (size >= run_numbers_) throw std::length_error("metronome: too many delayed tasks");
    const std::size_t old = ring_.size();
    if (size < old) to_start(); // then only [0, count_) is in use
    ring_.resize(size, size < old ? count_ : old);
    if (size > old && head_ + count_ > old) // wrapped: slot k is at (head_ + k) mod size now
      std::memcpy(static_cast<void*>(&ring_[old]), &ring_[0], (head_ + count_ - old) * sizeof(entry));
  }

  // Moves the slots in use to [0, count_), in order: head_ becomes 0.
  void to_start() noexcept {
    if (head_ == 0) return;
    entry* r = &ring_[0];
    if (head_ + count_ <= ring_.size())
      std::memmove(static_cast<void*>(r), r + head_, count_ * sizeof(entry));
    else // wrapped: the whole ring turns, O(its size)
      std::rotate(r, r + head_, r + ring_.size());
    head_ = 0;
  }

  const heap_index_t tag_;         // a single bit, above every number
  const heap_index_t run_numbers_; // numbers count modulo this
  large_array<entry> ring_;        // its size a power of two (or none)
  std::size_t head_ = 0;
  std::size_t count_ = 0; // slots in use, holes included
  std::size_t live_ = 0;  // nodes
  heap_index_t first_ = 0; // the front's number
  entry last_{};           // the key of the last entry appended (valid while live_ > 0)
};

} // namespace metronome::detail

#endif
