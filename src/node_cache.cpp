#include <metronome/detail/node_cache.hpp>

#include <mutex>
#include <vector>

namespace metronome::detail {

namespace {

constexpr std::size_t class_sizes[] = {64, 96, 128, 192, 256};
constexpr int classes = 5;
constexpr unsigned batch = 64;
constexpr std::size_t depot_bytes = 2u << 20;

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

struct depot {
  std::mutex m;
  std::vector<free_node*> batches[classes];

  free_node* take(int c) noexcept {
    std::lock_guard lk(m);
    if (batches[c].empty()) return nullptr;
    free_node* b = batches[c].back();
    batches[c].pop_back();
    return b;
  }
  void give(int c, free_node* b) noexcept {
    {
      std::lock_guard lk(m);
      if (batches[c].size() * batch * class_sizes[c] < depot_bytes) {
        try {
          batches[c].push_back(b);
          return;
        } catch (...) {
        }
      }
    }
    free_chain(b);
  }
};

depot& the_depot() {
  static depot* d = new depot; // never destroyed: threads may free nodes during exit
  return *d;
}

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
