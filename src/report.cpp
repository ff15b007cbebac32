#include <metronome/detail/pool_core.hpp>
#include <metronome/detail/report.hpp>

#include <algorithm>
#include <mutex>
#include <pthread.h>
#include <vector>

namespace metronome::detail {

namespace {

// Live pools, for current_pool(). Looked through only when user code threw, so one
// mutex is enough; a pool stays alive while it is listed.
struct pool_list {
  std::mutex m;
  std::vector<pool_core*> pools;
};

pool_list& live_pools() {
  static pool_list* list = [] {
    auto* l = new pool_list; // never destroyed: workers may report during exit
    // fork(): the child must not inherit the mutex locked.
    ::pthread_atfork([] { live_pools().m.lock(); }, [] { live_pools().m.unlock(); }, [] { live_pools().m.unlock(); });
    return l;
  }();
  return *list;
}

} // namespace

void register_pool(pool_core* pool) noexcept {
  auto& l = live_pools();
  std::lock_guard lk(l.m);
  try {
    l.pools.push_back(pool);
  } catch (...) {
    // Out of memory: exceptions on this pool's threads go to stderr instead.
  }
}

void unregister_pool(pool_core* pool) noexcept {
  auto& l = live_pools();
  std::lock_guard lk(l.m);
  l.pools.erase(std::remove(l.pools.begin(), l.pools.end(), pool), l.pools.end());
}

pool_core* current_pool() noexcept {
  auto& l = live_pools();
  std::lock_guard lk(l.m);
  for (pool_core* p : l.pools)
    if (p->running_in_this_thread()) return p; // stays alive after the unlock: we are one of its workers
  return nullptr;
}

void report_here(std::exception_ptr e, const char* where) noexcept {
  if (pool_core* p = current_pool())
    p->report(std::move(e));
  else
    print_unhandled(std::move(e), where);
}

void call_exception_handler(const std::function<void(std::exception_ptr)>& handler, std::exception_ptr e,
                            const char* where) noexcept {
  try {
    handler(std::move(e));
  } catch (...) {
    print_unhandled(std::current_exception(), where);
  }
}

} // namespace metronome::detail
