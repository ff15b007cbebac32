// Anchors: the recycled, never freed home of each pool's mutex (see pool_anchor.hpp).
#include <metronome/detail/pool_anchor.hpp>

#include <stdexcept>
#include <utility>

#include <pthread.h>

namespace metronome::detail {

std::atomic<pool_anchor*> anchor_table[anchor_blocks] = {};

namespace {

struct anchor_registry {
  std::mutex mtx;
  pool_anchor* free = nullptr; // retired anchors, linked by next_free
  std::size_t made = 0;        // anchors made: the table's blocks hold [0, made)
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

// A fresh anchor: the next index, in a block made when the index starts one. Under the
// registry's mutex.
pool_anchor* make_anchor(anchor_registry& r) {
  const std::size_t i = r.made;
  if (i >= anchor_blocks * anchor_block_size)
    throw std::length_error("metronome: more than 1048576 thread pools exist at once");
  std::atomic<pool_anchor*>& block = anchor_table[i >> anchor_block_bits];
  if ((i & (anchor_block_size - 1)) == 0) {
    auto* made = new pool_anchor[anchor_block_size];
    for (std::uint32_t k = 0; k < anchor_block_size; ++k) made[k].index = static_cast<std::uint32_t>(i + k);
    block.store(made, std::memory_order_release);
  }
  ++r.made;
  return block.load(std::memory_order_relaxed) + (i & (anchor_block_size - 1));
}

} // namespace

pool_anchor* acquire_pool_anchor(pool_core* core) {
  anchor_registry& r = registry();
  pool_anchor* a = nullptr;
  {
    std::lock_guard lk(r.mtx);
    if (r.free) {
      a = std::exchange(r.free, r.free->next_free);
    } else {
      a = make_anchor(r);
    }
  }
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
  a->next_free = r.free;
  r.free = a;
}

} // namespace metronome::detail
