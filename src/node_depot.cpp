// The node cache's depot: mapping and unmapping chunks, the nodes threads hand back,
// empty chunks kept for reuse or trimmed, and the background thread that prepares
// chunks ahead of demand.
#include "node_depot.hpp"
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
chunk*depot::fresh(int c) {
  last_demand.store(now_ns(), std::memory_order_relaxed);
  chunk* ch = nullptr;
  {
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
  if (surplus.load(std::memory_order_relaxed) == 0) return false;
  if (!force &&
      now_ns() - last_demand.load(std::memory_order_relaxed) < std::int64_t(node_cache_trim_delay.count()) * 1000000)
    return false;
  chunk* unmap = nullptr;
  {
    std::lock_guard lk(m);
    take_surplus(unmap, max_chunks);
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
  return n + d.empty_count;
}

} // namespace metronome::detail

#endif
