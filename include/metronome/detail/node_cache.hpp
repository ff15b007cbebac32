// The node cache's interface: task node memory, and the allocator executors use for it.
#ifndef METRONOME_DETAIL_NODE_CACHE_HPP
#define METRONOME_DETAIL_NODE_CACHE_HPP

#include <chrono>
#include <cstddef>
#include <memory>
#include <new>
#include <utility>

namespace metronome::detail {

// Task node memory. In a pool the producer allocates and the workers free, so
// per-thread free lists alone never hand memory back to the producer, and glibc
// falls back to its locked arena (and a 64-byte block costs it 80 bytes). Here nodes
// of each size class (64, 80, 96, 128, 192, 256 bytes) are carved from 256 KiB chunks
// mapped from the system: a thread keeps the nodes it frees and hands the oldest back
// 64 at a time, each to its own chunk's free list; a thread with none takes a chunk's
// whole free list, or carves new nodes off its own chunk (no lock). A chunk whose
// nodes are all back is empty: up to 8 are kept for reuse, the rest unmapped (from a
// pool worker: when it is idle, see node_cache_defer_frees). Larger nodes go straight
// to operator new; with the CMake option METRONOME_NODE_CACHE=OFF, and in
// AddressSanitizer builds, every node is a plain operator new.
void node_deallocate(void* p, std::size_t size) noexcept;
// What a node is for, as a hint to where fresh chunks come from. A timed node (a delayed
// task, a wheel timeout) may wait long, and a service holds many at once: a million
// pending timeouts hold ~100 MiB of them. Once the cache has 16 MiB of chunks mapped, a
// thread that must carve timed nodes from a fresh chunk gets one of a 2 MiB region
// asked for huge pages (where large_arrays_use_huge_pages()), whose other seven chunks
// wait for the next timed carvers: a 4 KiB page fault costs up to 13 us on a virtual
// machine, more than the rest of a schedule() (docs/benchmarks.md, "Huge pages for timed
// nodes"). Brief nodes (executor work, immediate tasks) keep 4 KiB pages: they come and
// go, and a huge page would only raise the memory a burst holds. Either kind of node is
// freed with node_deallocate and may be reused for the other.
enum class node_lifetime : unsigned char { brief, timed };
void* node_allocate(std::size_t size, node_lifetime lifetime = node_lifetime::brief);

// Allocates a node for a T of `lifetime` and constructs it there with `args`; frees the
// node again when the constructor throws. T's constructor may be private: T befriends
// this function (node_access). The node is later destroyed and freed by T itself, with
// node_deallocate(p, sizeof(T)).
struct node_access {
  template <class T, class... Args>
  static T* construct(void* p, Args&&... args) {
    return ::new (p) T(std::forward<Args>(args)...);
  }
};
// Alignment: a node of `size` bytes is aligned to the largest power of two up to 64 that
// divides `size` (at least 16), from the cache or from the heap alike; since a type's
// size is a multiple of its alignment, a T aligned up to 64 bytes is aligned.
template <class T, class... Args>
T* construct_node(node_lifetime lifetime, Args&&... args) {
  static_assert(alignof(T) <= 64, "metronome: a callable aligned to more than 64 bytes is not supported");
  void* p = node_allocate(sizeof(T), lifetime);
  try {
    return node_access::construct<T>(p, std::forward<Args>(args)...);
  } catch (...) {
    node_deallocate(p, sizeof(T));
    throw;
  }
}
// For the calling thread: chunks that empty beyond the kept ones stay mapped instead
// of being unmapped, so a pool worker in a burst never waits in munmap(); it calls
// node_cache_trim() when it runs out of work. Later allocations reuse them first.
void node_cache_defer_frees(bool on) noexcept;
// Unmaps up to `max_chunks` empty chunks beyond the kept ones; false when there was none
// or (unless `force`) when a thread needed a new chunk within the last 20 ms: a pool
// idle between bursts keeps them rather than unmapping and faulting them in again.
bool node_cache_trim(std::size_t max_chunks, bool force = false) noexcept;
// Empty chunks beyond the kept ones wait for node_cache_trim().
bool node_cache_trim_pending() noexcept;
// How long after the last demand for a chunk node_cache_trim() unmaps: a pool idle
// between bursts keeps its chunks instead of unmapping and faulting them in again each
// time (and a munmap interrupts the other cores to flush their TLBs).
inline constexpr std::chrono::milliseconds node_cache_trim_delay{20};
// Bytes of chunks mapped now (in use, partly free, or empty and kept); 0 with the cache off.
std::size_t node_cache_mapped_bytes() noexcept;
// Bytes of large arrays (the delay queue's run, from 2 MiB up) that the library maps
// from the system instead of taking them from the heap: a heap profiler or mallinfo()
// does not see them. 0 in the portable fallback and with METRONOME_HUGE_PAGES=OFF.
std::size_t large_arrays_mapped_bytes() noexcept;
// Whether large arrays from 2 MiB up are mapped and asked for huge pages (Linux,
// METRONOME_HUGE_PAGES=ON).
bool large_arrays_use_huge_pages() noexcept;
// Empty chunks ready for use: kept ones, the unused chunks of the last huge region
// (timed carvers only), and up to two that a background thread maps and populates
// ahead of threads that need new chunks (prepare-ahead on only); 0 with the cache off.
std::size_t node_cache_empty_chunks() noexcept;
// Lets the node cache start its one background thread (at idle priority), which maps
// and populates chunks ahead of threads that need new ones, so that page faults are
// taken off the allocating threads. Off by default (the CMake option
// METRONOME_NODE_CACHE_PREPARE_AHEAD turns it on by default); turning it off stops
// nothing already started, only new demand no longer reaches the thread.
void node_cache_prepare_ahead(bool on) noexcept;

// std::allocator<void> in an executor means "use the recycling cache".
template <class T>
struct recycling_allocator {
  using value_type = T;
  recycling_allocator() noexcept = default;
  template <class U>
  recycling_allocator(const recycling_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    static_assert(alignof(T) <= 64, "metronome: a callable aligned to more than 64 bytes is not supported");
    return static_cast<T*>(node_allocate(n * sizeof(T)));
  }
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
