// Pool anchors: where a handle finds its pool, or learns that it is gone.
#ifndef METRONOME_DETAIL_POOL_ANCHOR_HPP
#define METRONOME_DETAIL_POOL_ANCHOR_HPP

#include <atomic>
#include <cstddef>
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
// 64 bytes, on a cache line of its own: neighbouring anchors in the table are other
// pools' mutexes.
struct alignas(64) pool_anchor {
  std::mutex mtx;
  std::atomic<pool_core*> core{nullptr};
  std::uint32_t generation = 0;
  std::uint32_t index = 0;          // its place in the anchor table (never changes)
  pool_anchor* next_free = nullptr; // the registry's free list (under its mutex)

  // The pool, for a task whose generation matches (checked under `mtx`, or known, as on
  // the pool's own threads). Relaxed: `core` changes only under `mtx`, with the generation.
  pool_core* pool() const noexcept { return core.load(std::memory_order_relaxed); }
};

// The anchor table: anchors live in blocks of anchor_block_size, made as needed and never
// freed, so that a task names its anchor with a 32-bit index (pool_anchor_at) and keeps
// index and generation in one 64-bit word (pool_anchor_id): a pointer and a generation
// took 12 bytes of every task node. At most anchor_blocks * anchor_block_size pools
// exist at once (acquire_pool_anchor throws beyond).
inline constexpr std::uint32_t anchor_block_bits = 6;
inline constexpr std::uint32_t anchor_block_size = 1u << anchor_block_bits;
inline constexpr std::size_t anchor_blocks = 16384; // 1,048,576 pools
extern std::atomic<pool_anchor*> anchor_table[anchor_blocks];

// The anchor at `index` (one an anchor had: its block exists).
inline pool_anchor* pool_anchor_at(std::uint32_t index) noexcept {
  return anchor_table[index >> anchor_block_bits].load(std::memory_order_acquire) + (index & (anchor_block_size - 1));
}

// A task's name for its pool's anchor: the anchor's index and the generation the task
// recorded, in one word.
struct pool_anchor_id {
  std::uint64_t word;
  pool_anchor_id(const pool_anchor* a, std::uint32_t generation) noexcept
      : word(std::uint64_t(generation) << 32 | a->index) {}
  pool_anchor* anchor() const noexcept { return pool_anchor_at(static_cast<std::uint32_t>(word)); }
  std::uint32_t generation() const noexcept { return static_cast<std::uint32_t>(word >> 32); }
};

// A free anchor bound to `core` (its mutex unlocked). @throws std::bad_alloc, or
// std::length_error when anchor_blocks * anchor_block_size pools exist already.
pool_anchor* acquire_pool_anchor(pool_core* core);
// The pool is gone: unbinds the anchor (under its mutex) and recycles it.
void retire_pool_anchor(pool_anchor* a) noexcept;

} // namespace metronome::detail

#endif
