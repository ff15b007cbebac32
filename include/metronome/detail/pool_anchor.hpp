// Pool anchors: where a handle finds its pool, or learns that it is gone.
#ifndef METRONOME_DETAIL_POOL_ANCHOR_HPP
#define METRONOME_DETAIL_POOL_ANCHOR_HPP

#include <atomic>
#include <cstdint>
#include <mutex>

namespace metronome::detail {

class pool_core;

// Where a handle finds its pool. The anchor holds the pool's mutex and a pointer to the
// pool; anchors are never freed, only recycled with a new generation. So a handle that
// outlives its pool (scheduled_future, pending_task) locks a mutex that still exists,
// sees that the generation moved on, and leaves the pool alone.
//
// Invariant: `core` is non-null and `generation` equals the one a task recorded exactly
// while that task's pool exists; both change only under `mtx`, when the pool goes.
struct pool_anchor {
  std::mutex mtx;
  std::atomic<pool_core*> core{nullptr};
  std::uint32_t generation = 0;
};

// A free anchor bound to `core` (its mutex unlocked). @throws std::bad_alloc.
pool_anchor* acquire_pool_anchor(pool_core* core);
// The pool is gone: unbinds the anchor (under its mutex) and recycles it.
void retire_pool_anchor(pool_anchor* a) noexcept;

} // namespace metronome::detail

#endif
