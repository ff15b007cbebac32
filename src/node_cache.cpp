// The node cache's per-thread half: each thread's free lists and the chunk it carves
// from, the allocation and free fast paths, and handing everything back at thread exit.
// With the cache off (METRONOME_NODE_CACHE=OFF, AddressSanitizer builds), every node is a
// plain heap block.
#include "node_depot.hpp"

#include <algorithm>
#include <new>
#include <utility>

namespace metronome::detail {

#ifdef METRONOME_NODE_CACHE_OFF

// The cache is off (METRONOME_NODE_CACHE=OFF, AddressSanitizer builds): every node is
// its own heap block, so that heap profilers see it and a use after free or an overflow
// into a neighbour is reported.
void* node_allocate(std::size_t size) { return ::operator new(size); }
void node_deallocate(void* p, std::size_t) noexcept { ::operator delete(p); }
void node_cache_defer_frees(bool) noexcept {}
void node_cache_prepare_ahead(bool) noexcept {}
bool node_cache_trim(std::size_t, bool) noexcept { return false; }
bool node_cache_trim_pending() noexcept { return false; }
std::size_t node_cache_mapped_bytes() noexcept { return 0; }
std::size_t node_cache_empty_chunks() noexcept { return 0; }

#else

using namespace node_store;

namespace {

// One thread's nodes of one class: the ones it freed (newest first, handed back
// `flush_batch` at a time), a chunk's free list it took, and its chunk to carve from.
// Constant-initialised and trivially destructible, so that the fast paths reach it
// without a thread_local guard; `reaper` hands everything back when the thread exits.
struct class_cache {
  free_node* freed = nullptr;
  unsigned nfreed = 0;
  free_node* stock = nullptr;
  chunk* current = nullptr;
  char* bump = nullptr;
  char* bump_end = nullptr;
  char* ready = nullptr; // bump_end, or where the pages not yet populated start
};

thread_local class_cache caches[classes];
// 0: nothing cached yet, 1: the reaper is armed, 2: the thread's cache is gone (exit).
thread_local unsigned char cache_state = 0;

std::uint32_t carved_of(const class_cache& k, int c) noexcept {
  const auto first = reinterpret_cast<char*>(k.current) + header_bytes;
  return static_cast<std::uint32_t>(static_cast<std::size_t>(k.bump - first) / class_sizes[c]);
}

// The thread carves no more from its chunk of class c: the depot may empty it.
void retire_current(class_cache& k, int c) noexcept {
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
      retire_current(k, c);
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

void* carve(class_cache& k, int c) {
  const std::size_t size = class_sizes[c];
  if (k.bump == k.bump_end) {
    retire_current(k, c);
    chunk* ch = the_depot().fresh(c);
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
  chunk* ch = d.fresh(c);
  d.retire(ch, 1);
  return reinterpret_cast<char*>(ch) + header_bytes;
}

void* allocate_slow(int c) {
  if (cache_state != 1) {
    if (cache_state == 2) return allocate_uncached(c);
    arm();
  }
  class_cache& k = caches[c];
  if (free_node* n = the_depot().take(c)) {
    k.stock = n->next;
    return n;
  }
  return carve(k, c);
}

} // namespace

void* node_allocate(std::size_t size) {
  const int c = class_of(size);
  if (c < 0) return ::operator new(size);
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
  return allocate_slow(c);
}

void node_deallocate(void* p, std::size_t size) noexcept {
  const int c = class_of(size);
  if (c < 0) {
    ::operator delete(p);
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

} // namespace metronome::detail
