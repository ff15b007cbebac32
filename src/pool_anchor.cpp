// Anchors: the recycled, never freed home of each pool's mutex (see pool_anchor.hpp).
#include <metronome/detail/pool_anchor.hpp>

#include <vector>

#include <pthread.h>

namespace metronome::detail {

namespace {

struct anchor_registry {
  std::mutex mtx;
  std::vector<pool_anchor*> free;
};

anchor_registry& registry() {
  // Never destroyed: a handle may still lock its anchor during static destruction.
  static anchor_registry* r = [] {
    auto* reg = new anchor_registry;
    // fork(): the child must not inherit the registry's mutex locked.
    ::pthread_atfork([] { registry().mtx.lock(); }, [] { registry().mtx.unlock(); },
                     [] { registry().mtx.unlock(); });
    return reg;
  }();
  return *r;
}

} // namespace

pool_anchor* acquire_pool_anchor(pool_core* core) {
  anchor_registry& r = registry();
  pool_anchor* a = nullptr;
  {
    std::lock_guard lk(r.mtx);
    if (!r.free.empty()) {
      a = r.free.back();
      r.free.pop_back();
    }
  }
  if (!a) a = new pool_anchor;
  std::lock_guard lk(a->mtx);
  a->core.store(core, std::memory_order_release);
  return a;
}

void retire_pool_anchor(pool_anchor* a) noexcept {
  {
    std::lock_guard lk(a->mtx);
    a->core.store(nullptr, std::memory_order_release);
    ++a->generation;
  }
  anchor_registry& r = registry();
  std::lock_guard lk(r.mtx);
  try {
    r.free.push_back(a);
  } catch (...) {
    // Out of memory: the anchor stays unbound and is not reused (a handle may still lock it).
  }
}

} // namespace metronome::detail
