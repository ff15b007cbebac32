#include <metronome/detail/node_cache.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <new>
#include <thread>
#include <utility>

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define METRONOME_NODE_CACHE_OFF 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define METRONOME_NODE_CACHE_OFF 1
#endif

namespace metronome::detail {

#ifdef METRONOME_NODE_CACHE_OFF

// AddressSanitizer builds: every node is its own heap block, so that a use after free
// or an overflow into a neighbour is reported.
void* node_allocate(std::size_t size) { return ::operator new(size); }
void node_deallocate(void* p, std::size_t) noexcept { ::operator delete(p); }
void node_cache_defer_frees(bool) noexcept {}
bool node_cache_trim(std::size_t, bool) noexcept { return false; }
bool node_cache_trim_pending() noexcept { return false; }
std::size_t node_cache_mapped_bytes() noexcept { return 0; }
std::size_t node_cache_empty_chunks() noexcept { return 0; }

#else

namespace {

constexpr std::size_t class_sizes[] = {64, 96, 128, 192, 256};
constexpr int classes = 5;
constexpr unsigned flush_batch = 64;            // nodes a thread hands back at once
constexpr std::size_t chunk_bytes = 256u << 10; // aligned: a node finds its chunk by masking
constexpr std::size_t header_bytes = 64;        // the chunk's header; nodes follow it
constexpr std::size_t keep_empty = 8;           // empty chunks kept for reuse (2 MiB)
constexpr std::size_t populate_window = 64u << 10;
constexpr int prepared_slots = 2; // chunks mapped and populated ahead of demand
std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

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

int class_of(std::size_t size) noexcept {
  for (int c = 0; c < classes; ++c)
    if (size <= class_sizes[c]) return c;
  return -1;
}

chunk* chunk_of(const void* p) noexcept {
  return reinterpret_cast<chunk*>(reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t(chunk_bytes - 1));
}

std::uint32_t capacity_of(int c) noexcept {
  return static_cast<std::uint32_t>((chunk_bytes - header_bytes) / class_sizes[c]);
}

// Threads that must not spend time unmapping (pool workers running a burst) leave
// empty chunks beyond the kept ones for node_cache_trim().
thread_local bool defer_frees = false;

chunk* map_chunk() {
  // Over-map, keep the aligned part: a node's chunk is its address rounded down.
  void* p = ::mmap(nullptr, 2 * chunk_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t aligned = (base + chunk_bytes - 1) & ~std::uintptr_t(chunk_bytes - 1);
  if (aligned != base) ::munmap(p, aligned - base);
  if (const std::size_t tail = chunk_bytes - (aligned - base))
    ::munmap(reinterpret_cast<void*>(aligned + chunk_bytes), tail);
  return reinterpret_cast<chunk*>(aligned);
}

// Faults in [from, to) in one system call (Linux 5.14+; elsewhere the pages fault in
// one by one as nodes are carved): ~15 % cheaper per page, and no trap per page.
void populate(char* from, char* to) noexcept {
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;
#endif
  (void)::madvise(from, static_cast<std::size_t>(to - from), MADV_POPULATE_WRITE);
}

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
  // core (it runs SCHED_IDLE) instead of in the allocating thread. It never takes the
  // mutex (preempted while holding it at that priority, it would stall every thread
  // that frees or allocates): chunks go through atomic slots, demand through an atomic
  // wait. Started on first demand.
  std::atomic<chunk*> prepared[prepared_slots] = {};
  std::atomic<unsigned> demand{0};
  std::atomic<bool> preparer_started{false};

  void list_partial(chunk* ch) noexcept {
    ch->prev = nullptr;
    ch->next = partial[ch->cls];
    if (ch->next) ch->next->prev = ch;
    partial[ch->cls] = ch;
    ch->listed = true;
    partial_count[ch->cls].fetch_add(1, std::memory_order_relaxed);
  }
  void unlist_partial(chunk* ch) noexcept {
    if (ch->prev)
      ch->prev->next = ch->next;
    else
      partial[ch->cls] = ch->next;
    if (ch->next) ch->next->prev = ch->prev;
    ch->listed = false;
    partial_count[ch->cls].fetch_sub(1, std::memory_order_relaxed);
  }
  // Under m: publishes how many empty chunks wait beyond keep_empty.
  void note_surplus() noexcept {
    surplus.store(empty_count > keep_empty ? empty_count - keep_empty : 0, std::memory_order_relaxed);
  }
  // Under m: the most recently emptied chunk, or nullptr.
  chunk* pop_empty() noexcept {
    chunk* e = empty;
    if (e) {
      empty = e->next;
      --empty_count;
    }
    note_surplus();
    return e;
  }
  // Under m: moves up to `max` empty chunks beyond keep_empty onto `unmap`.
  void take_surplus(chunk*& unmap, std::size_t max) noexcept {
    for (std::size_t i = 0; i < max && empty_count > keep_empty; ++i) {
      chunk* e = pop_empty();
      e->next = unmap;
      unmap = e;
    }
    note_surplus();
  }
  // Under m. The chunk is empty: kept for reuse; beyond keep_empty, either moved to
  // `unmap` or, on a deferring thread, left as surplus for trim().
  void retire_empty(chunk* ch, chunk*& unmap) noexcept {
    if (ch->listed) unlist_partial(ch);
    ch->next = empty;
    empty = ch;
    ++empty_count;
    take_surplus(unmap, defer_frees ? 0 : empty_count);
  }
  // Unmaps the chunks of a list built by take_surplus (after the mutex is released).
  void release(chunk* unmap) noexcept {
    std::size_t n = 0;
    while (unmap) {
      chunk* next = unmap->next;
      ::munmap(unmap, chunk_bytes);
      unmap = next;
      ++n;
    }
    if (n != 0) mapped.fetch_sub(n, std::memory_order_relaxed);
  }

  // A chunk's whole free list (its nodes all of class c), or nullptr.
  free_node* take(int c) noexcept {
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
  void give(free_node* list) noexcept {
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
  void retire(chunk* ch, std::uint32_t carved) noexcept {
    chunk* unmap = nullptr;
    {
      std::lock_guard lk(m);
      ch->retired = true;
      ch->carved = carved;
      if (ch->nfree == carved) retire_empty(ch, unmap);
    }
    release(unmap);
  }
  chunk* fresh(int c) {
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
  void want_prepared() noexcept {
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
  void prepare() noexcept {
    ::pthread_setname_np(::pthread_self(), "metronome-mem");
    sched_param none{};
    (void)::sched_setscheduler(0, SCHED_IDLE, &none); // only on a core nobody else wants
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
  bool trim(std::size_t max_chunks, bool force) noexcept {
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
};

depot& the_depot();

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

depot& the_depot() {
  static depot* d = make_depot(); // never destroyed: threads may hand nodes back during exit
  return *d;
}

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
    defer_frees = false; // nothing runs on this thread any more: unmap what empties now
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
  if (k.bump + size > k.ready) { // populate the next window, so that a thread with few nodes maps little
    char* const window_end = std::min(k.ready + populate_window, reinterpret_cast<char*>(k.current) + chunk_bytes);
    populate(k.ready, window_end);
    k.ready = window_end;
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

void node_cache_defer_frees(bool on) noexcept { defer_frees = on; }
bool node_cache_trim(std::size_t max_chunks, bool force) noexcept { return the_depot().trim(max_chunks, force); }
bool node_cache_trim_pending() noexcept { return the_depot().surplus.load(std::memory_order_relaxed) != 0; }
std::size_t node_cache_mapped_bytes() noexcept {
  return the_depot().mapped.load(std::memory_order_relaxed) * chunk_bytes;
}
std::size_t node_cache_empty_chunks() noexcept {
  depot& d = the_depot();
  std::size_t n = 0;
  for (auto& slot : d.prepared) n += slot.load(std::memory_order_relaxed) != nullptr;
  std::lock_guard lk(d.m);
  return n + d.empty_count;
}

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
