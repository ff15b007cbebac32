// The node cache: task, timeout and handler nodes carved from chunks the library maps
// itself, in one file by concept. Three parts:
// 1. the shared declarations (size classes, chunks, the depot);
// 2. the depot (what all threads share): mapping and unmapping chunks, the nodes threads
//    hand back, empty chunks kept for reuse or trimmed, and the opt-in background thread
//    that prepares chunks ahead of demand;
// 3. the per-thread half: each thread's free lists and the chunk it carves from, the
//    allocation and free fast paths, and handing everything back at thread exit.
// With the cache off (METRONOME_NODE_CACHE=OFF, AddressSanitizer builds), every node is a
// plain heap block.
//
// The invariants: a node belongs to the chunk its address masks to (chunk_of); a chunk is
// carved by its owner thread alone (no lock) until retired; nodes handed back go to their
// own chunk's free list under the depot's mutex, so a retired chunk whose every carved
// node is back is known empty and may be reused or unmapped; the preparer never takes the
// mutex (chunks pass through atomic slots). fork(): the depot's mutex is taken across it
// (pthread_atfork), and the child, with no preparer thread, starts its own on demand.
// Tested by test/unit/detail/node_cache.cpp.

// ---------------------------------------------------------------- 1. declarations
#include <metronome/detail/node_cache.hpp>

#include "platform.hpp"

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

// Alignment: the chunk's header is 64 bytes and every class a multiple of 16, so every
// node is 16-aligned; a type's size is a multiple of its alignment, so a type aligned to
// 32 or 64 bytes lands in a class that is a multiple of that (80 holds none of them).
// The 64-byte class holds a task with a two-pointer callable (scheduled_task.hpp), the
// 80-byte one a task with a three-pointer callable or a wheel timeout with a two-pointer one.
inline constexpr std::size_t class_sizes[] = {64, 80, 96, 128, 192, 256};
inline constexpr int classes = 6;
inline constexpr unsigned flush_batch = 64;            // nodes a thread hands back at once
inline constexpr std::size_t chunk_bytes = 256u << 10; // aligned: a node finds its chunk by masking
inline constexpr std::size_t header_bytes = 64;        // the chunk's header; nodes follow it
inline constexpr std::size_t keep_empty = 8;           // empty chunks kept for reuse (2 MiB)
inline constexpr int prepared_slots = 2; // chunks mapped and populated ahead of demand
// Timed nodes (node_lifetime::timed): once this many chunks are mapped (16 MiB), a timed
// carver's fresh chunk is one of a region of region_chunks, mapped at once and asked to
// be one huge page; the others are spares, kept for the next timed carvers. Below it a
// region's unused part (up to 2 MiB resident) would be more than 1/8 of the cache
// (measured at 4 MiB: 100 k pending timeouts held 6 % more, docs/benchmarks.md).
inline constexpr std::size_t huge_after = 64;
inline constexpr std::size_t region_chunks = platform::huge_page_bytes / chunk_bytes;

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
  // Never carved chunks of the last huge region, for timed carvers only (fewer than
  // region_chunks); unmapped by a forced trim. The count is read without the mutex.
  chunk* spare = nullptr;
  std::atomic<std::size_t> spare_count{0};
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
  // A chunk for class c: an empty one, a prepared one, or a new mapping. Timed: past
  // huge_after chunks, an empty one, a spare, or the first of a new huge region.
  chunk* fresh(int c, node_lifetime lifetime);
  bool trim(std::size_t max_chunks, bool force) noexcept;

private:
  void list_partial(chunk* ch) noexcept;
  void unlist_partial(chunk* ch) noexcept;
  void note_surplus() noexcept;
  chunk* pop_empty() noexcept;
  void take_surplus(chunk*& unmap, std::size_t max) noexcept;
  void retire_empty(chunk* ch, chunk*& unmap) noexcept;
  void release(chunk* unmap) noexcept;
  chunk* fresh_timed();
  void want_prepared() noexcept;
  void prepare() noexcept;
};

// The process's depot, never destroyed: threads may hand nodes back during exit.
depot& the_depot();

} // namespace metronome::detail::node_store

#endif


// ---------------------------------------------------------------- 2. the depot
// The node cache's depot: mapping and unmapping chunks, the nodes threads hand back,
// empty chunks kept for reuse or trimmed, and the background thread that prepares
// chunks ahead of demand.
#include "platform.hpp"

#ifndef METRONOME_NODE_CACHE_OFF

#include <chrono>
#include <new>
#include <thread>
#include <utility>

#include <pthread.h>

namespace metronome::detail {
namespace node_store {

namespace {

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Threads that must not spend time unmapping (pool workers running a burst) leave
// empty chunks beyond the kept ones for node_cache_trim().
thread_local bool defer_frees = false;

chunk* map_chunk() { return static_cast<chunk*>(platform::allocate_aligned_pages(chunk_bytes)); }

} // namespace

void populate(char* from, char* to) noexcept { platform::populate_pages(from, static_cast<std::size_t>(to - from)); }

void depot::list_partial(chunk* ch) noexcept {
  ch->prev = nullptr;
  ch->next = partial[ch->cls];
  if (ch->next) ch->next->prev = ch;
  partial[ch->cls] = ch;
  ch->listed = true;
  partial_count[ch->cls].fetch_add(1, std::memory_order_relaxed);
}

void depot::unlist_partial(chunk* ch) noexcept {
  if (ch->prev)
    ch->prev->next = ch->next;
  else
    partial[ch->cls] = ch->next;
  if (ch->next) ch->next->prev = ch->prev;
  ch->listed = false;
  partial_count[ch->cls].fetch_sub(1, std::memory_order_relaxed);
}

// Under m: publishes how many empty chunks wait beyond keep_empty.
void depot::note_surplus() noexcept {
  surplus.store(empty_count > keep_empty ? empty_count - keep_empty : 0, std::memory_order_relaxed);
}

// Under m: the most recently emptied chunk, or nullptr.
chunk*depot::pop_empty() noexcept {
  chunk* e = empty;
  if (e) {
    empty = e->next;
    --empty_count;
  }
  note_surplus();
  return e;
}

// Under m: moves up to `max` empty chunks beyond keep_empty onto `unmap`.
void depot::take_surplus(chunk*& unmap, std::size_t max) noexcept {
  for (std::size_t i = 0; i < max && empty_count > keep_empty; ++i) {
    chunk* e = pop_empty();
    e->next = unmap;
    unmap = e;
  }
  note_surplus();
}

// Under m. The chunk is empty: kept for reuse; beyond keep_empty, either moved to
// `unmap` or, on a deferring thread, left as surplus for trim().
void depot::retire_empty(chunk* ch, chunk*& unmap) noexcept {
  if (ch->listed) unlist_partial(ch);
  ch->next = empty;
  empty = ch;
  ++empty_count;
  take_surplus(unmap, defer_frees ? 0 : empty_count);
}

// Unmaps the chunks of a list built by take_surplus (after the mutex is released).
void depot::release(chunk* unmap) noexcept {
  std::size_t n = 0;
  while (unmap) {
    chunk* next = unmap->next;
    platform::free_aligned_pages(unmap, chunk_bytes);
    unmap = next;
    ++n;
  }
  if (n != 0) mapped.fetch_sub(n, std::memory_order_relaxed);
}

// A chunk's whole free list (its nodes all of class c), or nullptr.
free_node*depot::take(int c) noexcept {
  if (partial_count[c].load(std::memory_order_relaxed) == 0) return nullptr;
  std::lock_guard lk(m);
  chunk* ch = partial[c];
  if (!ch) return nullptr;
  unlist_partial(ch);
  free_node* list = ch->free;
  ch->free = nullptr;
  ch->nfree = 0;
  return list;
}

// Hands back a list of nodes (linked through next), each to its own chunk. The
// nodes are sorted by chunk before taking the mutex (a batch usually spans one or
// two chunks), so that the mutex is held for a few splices, not a walk of the list.
void depot::give(free_node* list) noexcept {
  struct run {
    chunk* ch;
    free_node* head;
    free_node* tail;
    std::uint32_t n;
  };
  constexpr int max_runs = 8;
  while (list) {
    run runs[max_runs];
    int nruns = 0;
    free_node* rest = nullptr; // nodes of a ninth chunk and beyond: the next round
    while (list) {
      free_node* n = list;
      list = n->next;
      chunk* ch = chunk_of(n);
      int r = 0;
      while (r < nruns && runs[r].ch != ch) ++r;
      if (r == nruns) {
        if (nruns == max_runs) {
          n->next = rest;
          rest = n;
          continue;
        }
        runs[nruns++] = run{ch, nullptr, n, 0};
      }
      n->next = runs[r].head;
      runs[r].head = n;
      ++runs[r].n;
    }
    chunk* unmap = nullptr;
    {
      std::lock_guard lk(m);
      for (int r = 0; r < nruns; ++r) {
        chunk* ch = runs[r].ch;
        runs[r].tail->next = ch->free;
        ch->free = runs[r].head;
        ch->nfree += runs[r].n;
        if (ch->retired && ch->nfree == ch->carved)
          retire_empty(ch, unmap);
        else if (!ch->listed)
          list_partial(ch);
      }
    }
    release(unmap);
    list = rest;
  }
}

// The owner carves no more from ch, of which `carved` nodes were handed out.
void depot::retire(chunk* ch, std::uint32_t carved) noexcept {
  chunk* unmap = nullptr;
  {
    std::lock_guard lk(m);
    ch->retired = true;
    ch->carved = carved;
    if (ch->nfree == carved) retire_empty(ch, unmap);
  }
  release(unmap);
}
// A chunk for a timed carver once huge_after chunks are mapped (where huge pages are
// asked for): an empty one (its pages are in), a spare, or the first chunk of a new
// region of region_chunks, aligned and asked to be one huge page (MADV_HUGEPAGE: one
// fault and one zeroing for 2 MiB instead of 512), whose others become the spares. Null
// when the rule does not apply (the caller maps one chunk as for any node).
chunk* depot::fresh_timed() {
  if (!platform::huge_pages_asked() || mapped.load(std::memory_order_relaxed) < huge_after) return nullptr;
  {
    std::lock_guard lk(m);
    if (chunk* e = pop_empty()) return e;
    if (chunk* e = spare) {
      spare = e->next;
      spare_count.fetch_sub(1, std::memory_order_relaxed);
      return e;
    }
  }
  auto* region = static_cast<char*>(platform::allocate_huge_pages(platform::huge_page_bytes));
  mapped.fetch_add(region_chunks, std::memory_order_relaxed);
  // The spares' headers are written before the mutex is taken: the first write faults in
  // the whole region (milliseconds on a virtual machine whose host backs it lazily), and
  // threads handing nodes back wait for that mutex.
  auto* last = ::new (region + chunk_bytes) chunk{};
  chunk* first = last;
  for (std::size_t i = 2; i < region_chunks; ++i) {
    auto* e = ::new (region + i * chunk_bytes) chunk{};
    e->next = first;
    first = e;
  }
  std::lock_guard lk(m);
  last->next = spare;
  spare = first;
  spare_count.fetch_add(region_chunks - 1, std::memory_order_relaxed);
  return reinterpret_cast<chunk*>(region);
}

chunk*depot::fresh(int c, node_lifetime lifetime) {
  last_demand.store(now_ns(), std::memory_order_relaxed);
  chunk* ch = lifetime == node_lifetime::timed ? fresh_timed() : nullptr;
  if (!ch) {
    std::lock_guard lk(m);
    ch = pop_empty();
  }
  std::uint32_t populated = 0;
  if (ch) {
    populated = ch->populated;
  } else {
    for (auto& slot : prepared)
      if (slot.load(std::memory_order_relaxed) && (ch = slot.exchange(nullptr, std::memory_order_acquire))) break;
    if (ch) {
      populated = chunk_bytes;
    } else {
      ch = map_chunk();
      mapped.fetch_add(1, std::memory_order_relaxed);
    }
    want_prepared();
  }
  ::new (ch) chunk{};
  ch->cls = static_cast<std::uint8_t>(c);
  ch->populated = populated;
  return ch;
}

void depot::want_prepared() noexcept {
  if (!prepare_ahead.load(std::memory_order_relaxed)) return; // off: the allocating threads populate
  if (!preparer_started.load(std::memory_order_relaxed) && !preparer_started.exchange(true)) {
    try {
      std::thread([this] { prepare(); }).detach();
    } catch (...) {
      return; // no thread: allocating threads populate their chunks themselves
    }
  }
  demand.fetch_add(1, std::memory_order_release);
  demand.notify_one();
}

void depot::prepare() noexcept {
  platform::name_this_thread("metronome-mem");
  platform::run_at_idle_priority();
  for (;;) {
    const unsigned seen = demand.load(std::memory_order_acquire);
    for (auto& slot : prepared) {
      if (slot.load(std::memory_order_relaxed)) continue;
      chunk* ch = nullptr;
      try {
        ch = map_chunk();
      } catch (const std::bad_alloc&) {
        break;
      }
      mapped.fetch_add(1, std::memory_order_relaxed);
      populate(reinterpret_cast<char*>(ch), reinterpret_cast<char*>(ch) + chunk_bytes);
      slot.store(ch, std::memory_order_release); // only this thread fills the slots
    }
    demand.wait(seen, std::memory_order_acquire);
  }
}

bool depot::trim(std::size_t max_chunks, bool force) noexcept {
  const bool spares = force && spare_count.load(std::memory_order_relaxed) != 0;
  if (surplus.load(std::memory_order_relaxed) == 0 && !spares) return false;
  if (!force &&
      now_ns() - last_demand.load(std::memory_order_relaxed) < std::int64_t(node_cache_trim_delay.count()) * 1000000)
    return false;
  chunk* unmap = nullptr;
  {
    std::lock_guard lk(m);
    take_surplus(unmap, max_chunks);
    if (spares) { // all of them: a region's spares are few
      while (chunk* e = spare) {
        spare = e->next;
        e->next = unmap;
        unmap = e;
      }
      spare_count.store(0, std::memory_order_relaxed);
    }
  }
  const bool any = unmap != nullptr;
  release(unmap);
  return any;
}
namespace {

depot* make_depot() {
  auto* d = new depot;
  // fork(): the mutex is not held across it, and the child, which has no preparer
  // thread, starts its own on demand.
  ::pthread_atfork([] { the_depot().m.lock(); }, [] { the_depot().m.unlock(); },
                   [] {
                     depot& c = the_depot();
                     c.preparer_started.store(false, std::memory_order_relaxed);
                     c.m.unlock();
                   });
  return d;
}

} // namespace

depot& the_depot() {
  static depot* d = make_depot(); // never destroyed: threads may hand nodes back during exit
  return *d;
}


} // namespace node_store

using node_store::the_depot;

void node_cache_defer_frees(bool on) noexcept { node_store::defer_frees = on; }
void node_cache_prepare_ahead(bool on) noexcept { the_depot().prepare_ahead.store(on, std::memory_order_relaxed); }
bool node_cache_trim(std::size_t max_chunks, bool force) noexcept { return the_depot().trim(max_chunks, force); }
bool node_cache_trim_pending() noexcept { return the_depot().surplus.load(std::memory_order_relaxed) != 0; }
std::size_t node_cache_mapped_bytes() noexcept {
  return the_depot().mapped.load(std::memory_order_relaxed) * node_store::chunk_bytes;
}
std::size_t node_cache_empty_chunks() noexcept {
  node_store::depot& d = the_depot();
  std::size_t n = 0;
  for (auto& slot : d.prepared) n += slot.load(std::memory_order_relaxed) != nullptr;
  std::lock_guard lk(d.m);
  return n + d.empty_count + d.spare_count.load(std::memory_order_relaxed);
}

} // namespace metronome::detail

#endif

// ---------------------------------------------------------------- 3. the per-thread half
// The node cache's per-thread half: each thread's free lists and the chunk it carves
// from, the allocation and free fast paths, and handing everything back at thread exit.
// With the cache off (METRONOME_NODE_CACHE=OFF, AddressSanitizer builds), every node is a
// plain heap block.

#include <algorithm>
#include <new>
#include <utility>

namespace metronome::detail {

namespace {
// A node from the heap (larger than the cache's classes, or the cache off): aligned as
// the cache's nodes are, to the largest power of two up to 64 that divides its size -
// a type's size is a multiple of its alignment, so a T aligned up to 64 bytes is aligned
// (operator new alone gives 16). Freed with the same alignment, found from the size.
constexpr std::size_t heap_node_alignment(std::size_t size) noexcept {
  const std::size_t a = size & (~size + 1); // the lowest set bit
  return a == 0 || a > 64 ? 64 : a;
}
[[maybe_unused]] void* heap_node_allocate(std::size_t size) {
  const std::size_t a = heap_node_alignment(size);
  if (a <= __STDCPP_DEFAULT_NEW_ALIGNMENT__) return ::operator new(size);
  return ::operator new(size, std::align_val_t(a));
}
[[maybe_unused]] void heap_node_deallocate(void* p, std::size_t size) noexcept {
  const std::size_t a = heap_node_alignment(size);
  if (a <= __STDCPP_DEFAULT_NEW_ALIGNMENT__)
    ::operator delete(p);
  else
    ::operator delete(p, std::align_val_t(a));
}
} // namespace

#ifdef METRONOME_NODE_CACHE_OFF

// The cache is off (METRONOME_NODE_CACHE=OFF, AddressSanitizer builds): every node is
// its own heap block, so that heap profilers see it and a use after free or an overflow
// into a neighbour is reported.
void* node_allocate(std::size_t size, node_lifetime) { return heap_node_allocate(size); }
void node_deallocate(void* p, std::size_t size) noexcept { heap_node_deallocate(p, size); }
void node_cache_defer_frees(bool) noexcept {}
void node_cache_prepare_ahead(bool) noexcept {}
bool node_cache_trim(std::size_t, bool) noexcept { return false; }
bool node_cache_trim_pending() noexcept { return false; }
std::size_t node_cache_mapped_bytes() noexcept { return 0; }
std::size_t node_cache_empty_chunks() noexcept { return 0; }

#else

using namespace node_store;

namespace {

// The chunk a thread carves nodes of one class and one lifetime from.
struct carver {
  chunk* current = nullptr;
  char* bump = nullptr;
  char* bump_end = nullptr;
  char* ready = nullptr; // bump_end, or where the pages not yet populated start
};

// One thread's nodes of one class: the ones it freed (newest first, handed back
// `flush_batch` at a time), a chunk's free list it took, and its chunks to carve from,
// one per node_lifetime (brief and timed nodes share the lists: only fresh chunks differ).
// Constant-initialised and trivially destructible, so that the fast paths reach it
// without a thread_local guard; `reaper` hands everything back when the thread exits.
struct class_cache {
  free_node* freed = nullptr;
  unsigned nfreed = 0;
  free_node* stock = nullptr;
  carver carvers[2]; // by node_lifetime
};

thread_local class_cache caches[classes];
// 0: nothing cached yet, 1: the reaper is armed, 2: the thread's cache is gone (exit).
thread_local unsigned char cache_state = 0;

std::uint32_t carved_of(const carver& k, int c) noexcept {
  const auto first = reinterpret_cast<char*>(k.current) + header_bytes;
  return static_cast<std::uint32_t>(static_cast<std::size_t>(k.bump - first) / class_sizes[c]);
}

// The thread carves no more from its chunk of class c: the depot may empty it.
void retire_current(carver& k, int c) noexcept {
  if (k.current) {
    k.current->populated = static_cast<std::uint32_t>(k.ready - reinterpret_cast<char*>(k.current));
    const std::uint32_t carved = carved_of(k, c);
    the_depot().retire(std::exchange(k.current, nullptr), carved);
  }
  k.bump = k.bump_end = k.ready = nullptr;
}

struct reaper {
  bool armed = false;
  ~reaper() {
    node_cache_defer_frees(false); // nothing runs on this thread any more: unmap what empties now
    depot& d = the_depot();
    for (int c = 0; c < classes; ++c) {
      class_cache& k = caches[c];
      d.give(std::exchange(k.freed, nullptr));
      k.nfreed = 0;
      d.give(std::exchange(k.stock, nullptr));
      for (carver& v : k.carvers) retire_current(v, c);
    }
    cache_state = 2;
  }
};
thread_local reaper the_reaper;

// First use of the cache on this thread: make sure it is handed back at exit.
void arm() noexcept {
  cache_state = 1;
  the_reaper.armed = true; // constructs it, which registers its destructor
}

void* carve(class_cache& cache, int c, node_lifetime lifetime) {
  const std::size_t size = class_sizes[c];
  carver& k = cache.carvers[static_cast<int>(lifetime)];
  if (k.bump == k.bump_end) {
    retire_current(k, c);
    chunk* ch = the_depot().fresh(c, lifetime);
    k.current = ch;
    k.bump = reinterpret_cast<char*>(ch) + header_bytes;
    k.bump_end = k.bump + std::size_t(capacity_of(c)) * size;
    k.ready = reinterpret_cast<char*>(ch) + ch->populated;
  }
  void* p = k.bump;
  k.bump += size;
  return p;
}

// After this thread's cache is gone: one node straight from (or to) the depot.
void* allocate_uncached(int c) {
  depot& d = the_depot();
  if (free_node* list = d.take(c)) {
    d.give(list->next);
    return list;
  }
  chunk* ch = d.fresh(c, node_lifetime::brief);
  d.retire(ch, 1);
  return reinterpret_cast<char*>(ch) + header_bytes;
}

void* allocate_slow(int c, node_lifetime lifetime) {
  if (cache_state != 1) {
    if (cache_state == 2) return allocate_uncached(c);
    arm();
  }
  class_cache& k = caches[c];
  if (free_node* n = the_depot().take(c)) {
    k.stock = n->next;
    return n;
  }
  return carve(k, c, lifetime);
}

inline void* allocate(std::size_t size, node_lifetime lifetime) {
  const int c = class_of(size);
  if (c < 0) return heap_node_allocate(size);
  class_cache& k = caches[c];
  if (free_node* n = k.freed) {
    k.freed = n->next;
    --k.nfreed;
    return n;
  }
  if (free_node* n = k.stock) {
    k.stock = n->next;
    return n;
  }
  return allocate_slow(c, lifetime);
}

} // namespace

void* node_allocate(std::size_t size, node_lifetime lifetime) { return allocate(size, lifetime); }

void node_deallocate(void* p, std::size_t size) noexcept {
  const int c = class_of(size);
  if (c < 0) {
    heap_node_deallocate(p, size);
    return;
  }
  auto* n = static_cast<free_node*>(p);
  if (cache_state != 1) {
    if (cache_state == 2) {
      n->next = nullptr;
      the_depot().give(n);
      return;
    }
    arm();
  }
  class_cache& k = caches[c];
  n->next = k.freed;
  k.freed = n;
  if (++k.nfreed >= 2 * flush_batch) {
    // Hand the oldest `flush_batch` nodes back; keep the newest (warm) ones.
    free_node* keep_tail = k.freed;
    for (unsigned i = 1; i < flush_batch; ++i) keep_tail = keep_tail->next;
    free_node* give = keep_tail->next;
    keep_tail->next = nullptr;
    k.nfreed = flush_batch;
    the_depot().give(give);
  }
}

#endif

std::size_t large_arrays_mapped_bytes() noexcept { return platform::large_mapped_bytes(); }
bool large_arrays_use_huge_pages() noexcept { return platform::huge_pages_asked(); }

} // namespace metronome::detail
