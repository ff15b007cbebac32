#include <metronome/detail/node_cache.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

namespace metronome::detail {

namespace {

constexpr std::size_t class_sizes[] = {64, 96, 128, 192, 256};
constexpr int classes = 5;
constexpr unsigned batch = 64;
constexpr std::size_t depot_bytes = 2u << 20;    // kept for reuse, per class
constexpr std::size_t excess_bytes = 256u << 20; // held for an idle moment, per class

struct free_node {
  free_node* next;
};

int class_of(std::size_t size) noexcept {
  for (int c = 0; c < classes; ++c)
    if (size <= class_sizes[c]) return c;
  return -1;
}

void free_chain(free_node* n) noexcept {
  while (n) {
    free_node* next = n->next;
    ::operator delete(static_cast<void*>(n));
    n = next;
  }
}

// Threads that must not spend time in free() (pool workers running a burst) leave
// batches beyond the depot's bound as excess, which they free when idle.
thread_local bool defer_frees = false;

struct depot {
  std::mutex m;
  std::vector<free_node*> batches[classes];
  std::vector<free_node*> excess[classes];
  std::atomic<std::size_t> excess_count{0}; // over all classes; read without the mutex

  free_node* take(int c) noexcept {
    std::lock_guard lk(m);
    for (auto* from : {&excess[c], &batches[c]}) {
      if (from->empty()) continue;
      free_node* b = from->back();
      from->pop_back();
      if (from == &excess[c]) excess_count.fetch_sub(1, std::memory_order_relaxed);
      return b;
    }
    return nullptr;
  }
  void give(int c, free_node* b) noexcept {
    {
      std::lock_guard lk(m);
      try {
        if (batches[c].size() * batch * class_sizes[c] < depot_bytes) {
          batches[c].push_back(b);
          return;
        }
        if (defer_frees && excess[c].size() * batch * class_sizes[c] < excess_bytes) {
          excess[c].push_back(b);
          excess_count.fetch_add(1, std::memory_order_relaxed);
          return;
        }
      } catch (...) {
      }
    }
    free_chain(b);
  }
  bool trim(std::size_t max_batches) noexcept {
    if (excess_count.load(std::memory_order_relaxed) == 0) return false;
    free_node* taken[8];
    const std::size_t limit = std::min<std::size_t>(max_batches, 8);
    std::size_t n = 0;
    {
      std::lock_guard lk(m);
      for (int c = 0; c < classes && n < limit; ++c)
        while (!excess[c].empty() && n < limit) {
          taken[n++] = excess[c].back();
          excess[c].pop_back();
        }
      excess_count.fetch_sub(n, std::memory_order_relaxed);
    }
    for (std::size_t i = 0; i < n; ++i) free_chain(taken[i]);
    return n != 0;
  }
};

depot& the_depot() {
  static depot* d = new depot; // never destroyed: threads may free nodes during exit
  return *d;
}

} // namespace

void node_cache_defer_frees(bool on) noexcept { defer_frees = on; }
bool node_cache_trim(std::size_t max_batches) noexcept { return the_depot().trim(max_batches); }

namespace {

struct thread_cache {
  free_node* head[classes] = {};
  unsigned count[classes] = {};

  ~thread_cache() {
    for (int c = 0; c < classes; ++c) free_chain(head[c]);
  }
};

thread_local thread_cache cache;

} // namespace

void* node_allocate(std::size_t size) {
  const int c = class_of(size);
  if (c < 0) return ::operator new(size);
  thread_cache& tc = cache;
  if (!tc.head[c]) {
    tc.head[c] = the_depot().take(c);
    tc.count[c] = tc.head[c] ? batch : 0;
    if (!tc.head[c]) return ::operator new(class_sizes[c]);
  }
  free_node* n = tc.head[c];
  tc.head[c] = n->next;
  --tc.count[c];
  return n;
}

void node_deallocate(void* p, std::size_t size) noexcept {
  const int c = class_of(size);
  if (c < 0) {
    ::operator delete(p);
    return;
  }
  thread_cache& tc = cache;
  auto* n = static_cast<free_node*>(p);
  n->next = tc.head[c];
  tc.head[c] = n;
  if (++tc.count[c] >= 2 * batch) {
    // Hand the oldest `batch` nodes to the depot; keep the newest (warm) ones.
    free_node* keep_tail = tc.head[c];
    for (unsigned i = 1; i < batch; ++i) keep_tail = keep_tail->next;
    free_node* give = keep_tail->next;
    keep_tail->next = nullptr;
    tc.count[c] = batch;
    the_depot().give(c, give);
  }
}

} // namespace metronome::detail
