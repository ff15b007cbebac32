// The pool's delay queue, keyed by (due, sequence): a run for the nodes that come in due
// order, a 4-ary heap for the nearest others, and per-unit buckets over the next second
// with a second heap beyond them.
#ifndef METRONOME_DETAIL_DELAY_HEAP_HPP
#define METRONOME_DETAIL_DELAY_HEAP_HPP

#include <metronome/detail/task.hpp>
#include "delay_buckets.hpp"
#include "due_run.hpp"
#include "quad_heap.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace metronome::detail {

// The delay queue's order: (due, seq), seq breaking ties first come, first served.
// Four parts hold the nodes, each with its key inline next to the node pointer:
// - the run (due_run.hpp): a FIFO of nodes whose keys never decrease. A push whose key is
//   not below the run's last key is appended there: O(1). Most pushes are such (every
//   wait of one length, every timeout of one length);
// - the buckets (delay_buckets.hpp): the others due within the window, about a second
//   from the pool's time, one unsorted bucket per unit of time (262 us), in chunks; O(1)
//   to add and to remove;
// - the beyond heap (quad_heap.hpp): the others due after the window;
// - the near heap (quad_heap.hpp): the earliest of all. It takes in a bucket whole, or
//   the beyond heap's first unit, when they hold the earliest node (settle()).
// This class keeps them together. The invariant, re-established after every change by
// settle():
//   (H) the near heap's front is before every bucket and beyond node, and the near heap
//       is empty only when they are too;
//   (W) every bucket node's unit is in [buckets_.base(), end_), every beyond node's
//       >= end_, and end_ <= buckets_.base() + bucket_count;
//   (R) the near heap has room for every bucket and beyond node, so that settle(), which
//       runs inside noexcept removals, never allocates.
// So the earliest node is the smaller of the run's and the near heap's fronts. The near
// heap holds the records (nodes earlier than everything before them) and the buckets taken
// in, not the whole spread: with a million timers at random delays it stays in cache. The
// window moves with the pool's time (advance()), taking beyond nodes into buckets a few at
// a time, never a big list at once. Each node's heap_index_ says which part holds it (a
// tag bit per part) and where, so removal of any node (cancel) is O(1) in the run and the
// buckets, O(log n) in a heap. Not thread-safe: the pool guards it with its mutex.
class delay_heap {
public:
  static constexpr unsigned unit_shift = delay_buckets::unit_shift;
  static constexpr std::size_t bucket_count = delay_buckets::bucket_count;

  bool empty() const noexcept { return near_.empty() && run_.empty(); } // (H)
  std::size_t size() const noexcept { return near_.size() + run_.size() + buckets_.size() + beyond_.size(); }
  timed_node* top() const noexcept { return front().node; }
  clock::rep top_due() const noexcept { return front().due; }
  bool is_head(const timed_node* n) const noexcept { return !empty() && top() == n; }

  // Returns true when `n` became the head. `seq` orders equal due times (FIFO) and grows
  // from one push to the next; `now` is the pool's time (where the window starts). May
  // throw (std::bad_alloc, std::length_error) with nothing changed.
  bool push(timed_node* n, std::uint64_t seq, clock::rep now) {
    const entry e{n->due_.load(std::memory_order_relaxed), seq, n};
    if (run_.fits(e)) {
      if (run_.full()) run_.grow(); // may throw: nothing changed
      run_.append(e);
    } else {
      reserve_room(e, false); // may throw: nothing changed
      if (near_.empty() && buckets_.empty() && beyond_.empty()) restart_window(now);
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
    } else if ((at & run_bit) && run_.rekey_last(n, e)) { // the run's last, still in order
    } else if ((at & run_bit) && run_.fits(e)) {          // to the run's end
      run_.move_to_back(n, e);
    } else { // anywhere else: the room first, so that nothing has changed on failure
      if (!succeeds([&] { reserve_room(e, run_.fits(e)); })) return false;
      take_out(n);
      if (run_.fits(e))
        run_.append(e);
      else
        place_off_run(e);
      settle();
    }
    is_head = top() == n;
    return true;
  }

  // The pool's time moved to `now`: the window follows it (never past a bucket node), and
  // beyond nodes it now covers move into buckets, at most pull_budget of them (whole units)
  // per call (those it jumped past go to the near heap). Allocates only bucket chunks, and
  // stops short when there are none.
  void advance(clock::rep now) noexcept {
    const std::uint64_t u = unit_of(now);
    if (u <= buckets_.base()) return;
    if (buckets_.empty() && beyond_.empty()) {
      buckets_.set_base(u);
      end_ = u + bucket_count;
      return;
    }
    const std::uint64_t base = buckets_.empty() ? u : std::min(u, buckets_.earliest());
    buckets_.set_base(base);
    std::size_t moved = 0;
    while (!beyond_.empty()) {
      const entry e = beyond_.front();
      const std::uint64_t unit = unit_of(e.due);
      if (unit >= base + bucket_count) break;
      if (moved >= pull_budget && unit != unit_of(last_pulled_)) break; // whole units only
      if (unit < base) { // overdue (the window jumped past it): the near heap, room (R)
        beyond_.remove_at(0);
        near_.push(e);
      } else {
        if (!succeeds([&] { buckets_.reserve(e); })) break;
        beyond_.remove_at(0);
        buckets_.add(e);
      }
      last_pulled_ = e.due;
      ++moved;
    }
    end_ = beyond_.empty() ? base + bucket_count : std::min(base + bucket_count, unit_of(beyond_.front().due));
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
    run_.remove_if(pred, f);
    near_.remove_if(pred, f);
    beyond_.remove_if(pred, f);
    buckets_.remove_if(pred, f);
    settle();
    shrink_if_sparse();
  }

  // Gives storage back once the queue has emptied out: all of it when empty, else down to
  // twice the size when under a quarter of the capacity (amortised O(1) per removal).
  // Allocation failure only keeps the old storage.
  void shrink_if_sparse() noexcept {
    near_.shrink(near_.size() + buckets_.size() + beyond_.size(), min_kept); // (R)
    beyond_.shrink(beyond_.size(), min_kept);
    run_.shrink_if_sparse(min_kept);
    buckets_.shrink_if_sparse(bucket_entries_kept);
  }

  std::size_t capacity() const noexcept {
    return near_.capacity() + beyond_.capacity() + run_.capacity() + buckets_.capacity();
  }
  // Where the nodes wait (tests): in buckets, beyond the window.
  std::size_t bucketed() const noexcept { return buckets_.size(); }
  std::size_t beyond() const noexcept { return beyond_.size(); }

private:
  using entry = delay_entry;
  static constexpr std::size_t min_kept = 256; // entries kept without shrinking
  // The buckets' chunks kept once empty: a few timers spread over many units take a chunk
  // per unit.
  static constexpr std::size_t bucket_entries_kept = 64 * delay_buckets::chunk_size;
  static constexpr std::size_t pull_budget = 1024;
  // heap_index_: run_bit | its number in the run; else bucket_bit | its chunk and slot; else
  // beyond_bit | its slot in the beyond heap; else its slot in the near heap.
  static constexpr heap_index_t run_bit = heap_index_t(1) << 31;
  static constexpr heap_index_t bucket_bit = heap_index_t(1) << 30;
  static constexpr heap_index_t beyond_bit = heap_index_t(1) << 29;

  static std::uint64_t unit_of(clock::rep due) noexcept { return delay_buckets::unit_of(due); }

  const entry& front() const noexcept {
    if (run_.empty()) return near_.front();
    const entry& r = run_.front();
    return near_.empty() || key_before(r, near_.front()) ? r : near_.front();
  }

  // Room for one more node off the run wherever settle() may move it (R), room in e's
  // bucket, a beyond slot, and ring room when it goes to the run. May throw with nothing
  // changed.
  void reserve_room(const entry& e, bool to_run) {
    near_.reserve_for(near_.size() + buckets_.size() + beyond_.size() + 1);
    beyond_.reserve_for(beyond_.size() + 1);
    buckets_.reserve(e);
    if (to_run && run_.full()) run_.grow();
  }

  // Everything off the run is empty: the window starts at the pool's time.
  void restart_window(clock::rep now) noexcept {
    buckets_.set_base(unit_of(now));
    end_ = buckets_.base() + bucket_count;
  }

  // Off the run, by its unit (W); allocates nothing after reserve_room().
  void place_off_run(const entry& e) noexcept {
    const std::uint64_t u = unit_of(e.due);
    if (u < buckets_.base())
      near_.push(e);
    else if (u < end_)
      buckets_.add(e);
    else
      beyond_.push(e);
  }

  void take_out(timed_node* n) noexcept {
    const heap_index_t at = n->heap_index_;
    if (at & run_bit)
      run_.remove(n);
    else if (at & bucket_bit)
      buckets_.remove(n);
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
      if (!buckets_.empty()) {
        const std::uint64_t b = buckets_.earliest();
        if (!near_.empty() && unit_of(near_.front().due) < b) return;
        buckets_.take(b, [&](const entry& e) noexcept { near_.push(e); });
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

  quad_heap near_{0};
  quad_heap beyond_{beyond_bit};
  due_run run_{run_bit};
  delay_buckets buckets_{bucket_bit};
  std::uint64_t end_ = bucket_count; // the window's end (W): buckets below, beyond heap at and after
  clock::rep last_pulled_ = 0;       // advance()'s last move from beyond, to move whole units
};

} // namespace metronome::detail

#endif
