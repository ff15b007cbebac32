#ifndef METRONOME_DETAIL_NODE_CACHE_HPP
#define METRONOME_DETAIL_NODE_CACHE_HPP

#include <cstddef>
#include <memory>
#include <new>

namespace metronome::detail {

// Recycles task nodes between threads. In a pool the producer allocates and the
// workers free, so per-thread caches alone never hand memory back to the producer
// and glibc falls back to its locked arena. Here each thread keeps a free list per
// size class (64, 96, 128, 192, 256 bytes); a thread with too many hands a batch of 64 nodes to
// a global depot, and a thread with none takes a whole batch: one mutex operation per
// 64 nodes. The depot keeps at most ~2 MiB per class; the rest goes back to malloc
// (from a pool worker: when it is idle, see node_cache_defer_frees).
// Larger nodes go straight to operator new.
void* node_allocate(std::size_t size);
void node_deallocate(void* p, std::size_t size) noexcept;
// For the calling thread: batches beyond the depot's bound are kept (up to 256 MiB per
// class) instead of freed, so a pool worker in a burst never waits in free(); it calls
// node_cache_trim() when it runs out of work. Later allocations reuse the excess first.
void node_cache_defer_frees(bool on) noexcept;
// Frees up to `max_batches` (at most 8) batches of excess; false when there was none.
bool node_cache_trim(std::size_t max_batches) noexcept;

// std::allocator<void> in an executor means "use the recycling cache".
template <class T>
struct recycling_allocator {
  using value_type = T;
  recycling_allocator() noexcept = default;
  template <class U>
  recycling_allocator(const recycling_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(node_allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { node_deallocate(p, n * sizeof(T)); }
  friend bool operator==(const recycling_allocator&, const recycling_allocator&) noexcept { return true; }
  friend bool operator!=(const recycling_allocator&, const recycling_allocator&) noexcept { return false; }
};

template <class Alloc>
struct node_allocator_for {
  using type = Alloc;
  static const Alloc& get(const Alloc& a) noexcept { return a; }
};
template <class T>
struct node_allocator_for<std::allocator<T>> {
  using type = recycling_allocator<void>;
  static type get(const std::allocator<T>&) noexcept { return {}; }
};

} // namespace metronome::detail

#endif
