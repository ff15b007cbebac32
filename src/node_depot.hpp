// The node cache's shared half: chunks of nodes mapped from the system and the depot
// that every thread hands nodes back to and takes chunks from. The per-thread half is in
// node_cache.cpp.
#ifndef METRONOME_SRC_NODE_DEPOT_HPP
#define METRONOME_SRC_NODE_DEPOT_HPP

#include <metronome/detail/node_cache.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

// Off (every node a plain operator new, seen by heap profilers and sanitizers): with
// the CMake option METRONOME_NODE_CACHE=OFF, and in AddressSanitizer builds.
#ifndef METRONOME_NODE_CACHE_OFF
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define METRONOME_NODE_CACHE_OFF 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define METRONOME_NODE_CACHE_OFF 1
#endif
#endif

// The background preparer's default (CMake option METRONOME_NODE_CACHE_PREPARE_AHEAD).
#ifndef METRONOME_NODE_CACHE_PREPARE_AHEAD
#define METRONOME_NODE_CACHE_PREPARE_AHEAD 0
#endif

#ifndef METRONOME_NODE_CACHE_OFF

namespace metronome::detail::node_store {

inline constexpr std::size_t class_sizes[] = {64, 96, 128, 192, 256};
inline constexpr int classes = 5;
inline constexpr unsigned flush_batch = 64;            // nodes a thread hands back at once
inline constexpr std::size_t chunk_bytes = 256u << 10; // aligned: a node finds its chunk by masking
inline constexpr std::size_t header_bytes = 64;        // the chunk's header; nodes follow it
inline constexpr std::size_t keep_empty = 8;           // empty chunks kept for reuse (2 MiB)
inline constexpr int prepared_slots = 2; // chunks mapped and populated ahead of demand

struct free_node {
  free_node* next;
};

// A chunk of nodes of one size class. Its owner thread carves nodes off the front
// (bump allocation, no lock); nodes handed back go onto the chunk's own free list
// (under the depot's mutex), so that the chunk is known to be empty, and unmapped,
// once every node carved from it is back.
struct chunk {
  free_node* free = nullptr;
  std::uint32_t nfree = 0;
  std::uint32_t carved = 0; // set when retired
  chunk* prev = nullptr;    // partial list of its class; `next` also links the empty list
  chunk* next = nullptr;
  std::uint32_t populated = 0; // bytes from the chunk's start whose pages are in
  std::uint8_t cls = 0;
  bool retired = false; // its owner carves no more from it
  bool listed = false;  // in its class's partial list
};
static_assert(sizeof(chunk) <= header_bytes);

inline int class_of(std::size_t size) noexcept {
  for (int c = 0; c < classes; ++c)
    if (size <= class_sizes[c]) return c;
  return -1;
}

inline chunk* chunk_of(const void* p) noexcept {
  return reinterpret_cast<chunk*>(reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t(chunk_bytes - 1));
}

inline std::uint32_t capacity_of(int c) noexcept {
  return static_cast<std::uint32_t>((chunk_bytes - header_bytes) / class_sizes[c]);
}

// Faults in the pages of [from, to) in one system call where the system has one.
void populate(char* from, char* to) noexcept;

// What all threads share: chunks with nodes handed back, empty chunks, and (only when
// enabled: node_cache_prepare_ahead) chunks prepared ahead by a background thread.
struct depot {
  std::mutex m;
  chunk* partial[classes] = {}; // chunks with nodes handed back and some still in use
  std::atomic<std::size_t> partial_count[classes] = {};
  chunk* empty = nullptr; // every carved node back: reusable by any class, or unmapped
  std::size_t empty_count = 0;
  std::atomic<std::size_t> surplus{0};      // empty chunks beyond keep_empty
  std::atomic<std::size_t> mapped{0};       // chunks mapped
  std::atomic<std::int64_t> last_demand{0}; // when a thread last needed a new chunk (ns)
  // The preparer: a thread that keeps prepared_slots chunks mapped and populated ahead
  // of threads that need new ones, so that the kernel zeroes their pages on an idle
  // core (it runs at idle priority) instead of in the allocating thread. It never takes
  // the mutex (preempted while holding it at that priority, it would stall every thread
  // that frees or allocates): chunks go through atomic slots, demand through an atomic
  // wait. Started on the first demand after it is enabled, never by default.
  std::atomic<chunk*> prepared[prepared_slots] = {};
  std::atomic<unsigned> demand{0};
  std::atomic<bool> preparer_started{false};
  // Whether the preparer may be started (node_cache_prepare_ahead; the build's default).
  std::atomic<bool> prepare_ahead{METRONOME_NODE_CACHE_PREPARE_AHEAD != 0};

  // A chunk's whole free list (its nodes all of class c), or nullptr.
  free_node* take(int c) noexcept;
  // Hands back a list of nodes (linked through next), each to its own chunk.
  void give(free_node* list) noexcept;
  // The owner carves no more from ch, of which `carved` nodes were handed out.
  void retire(chunk* ch, std::uint32_t carved) noexcept;
  // A chunk for class c: an empty one, a prepared one, or a new mapping.
  chunk* fresh(int c);
  bool trim(std::size_t max_chunks, bool force) noexcept;

private:
  void list_partial(chunk* ch) noexcept;
  void unlist_partial(chunk* ch) noexcept;
  void note_surplus() noexcept;
  chunk* pop_empty() noexcept;
  void take_surplus(chunk*& unmap, std::size_t max) noexcept;
  void retire_empty(chunk* ch, chunk*& unmap) noexcept;
  void release(chunk* unmap) noexcept;
  void want_prepared() noexcept;
  void prepare() noexcept;
};

// The process's depot, never destroyed: threads may hand nodes back during exit.
depot& the_depot();

} // namespace metronome::detail::node_store

#endif

#endif
