// A wheel has no thread of its own: its ticks are one wait in the engine of the context it
// fires onto - the pool's own heap, or, over any other Asio context, that context's hosted
// timing core (timing_service.hpp) - run by that context's threads, armed only while the
// wheel holds timeouts. In a pool the tick is untracked: it does not keep the pool from
// terminating, and it stays timed after shutdown() (the wheel keeps delivering: what
// falls due then is refused by the pool, or runs on the executor it was bound to) until
// termination. Once its pool has terminated the wheel no longer ticks: what it still
// holds is destroyed unrun with the wheel.
#include "pool_engine.hpp"
#include <metronome/detail/report.hpp>
#include <metronome/detail/test_hooks.hpp>
#include "wheel_engine.hpp"

#include <atomic>
#include <new>

namespace metronome::detail {

// The tick node. It names its wheel by anchor and id, never by pointer: the wheel may be
// gone while the host still holds the node. Who frees it: the wheel's destructor when it
// is idle (in no queue); otherwise the node itself, when the host runs or discards it and
// it finds the wheel gone, or the wheel's tick_ no longer pointing at it (the destructor
// saw it busy and let go of it). Both sides read tick_ and tick_state_ under the wheel's
// mutex, so exactly one frees it.
// Tested by `a_tick_running_when_its_wheel_is_destroyed_frees_itself_once` (hooks
// wheel_tick_after_unlock, wheel_destroy_after_tick_look) (test/handover/wheel.cpp).
namespace {
std::atomic<long> ticks_alive{0};
} // namespace

struct wheel_tick final : wait_node {
  wheel_tick(wheel_anchor& a, std::uint64_t wheel_id) noexcept : wait_node(&complete), anchor(&a), id(wheel_id) {
    untracked_ = true; // a pool hosting it terminates while it waits (pool_internal.hpp)
    ticks_alive.fetch_add(1, std::memory_order_relaxed);
  }
  ~wheel_tick() { ticks_alive.fetch_sub(1, std::memory_order_relaxed); }
  wheel_tick(const wheel_tick&) = delete;
  wheel_tick& operator=(const wheel_tick&) = delete;

  static void complete(task_base* b, unsigned action, void* /*io*/) noexcept {
    auto* t = static_cast<wheel_tick*>(b);
    wheel_anchor& a = *t->anchor;
    std::unique_lock lk(a.mtx);
    if (!wheel_engine::enrolled(a, t->id)) {
      lk.unlock();
      delete t;
      return;
    }
    wheel_engine& w = *a.core;
    if (w.tick_ != t) { // the wheel's destructor saw it busy and left it to free itself
      lk.unlock();
      delete t;
      return;
    }
    if (action != run_action || t->aborted_) {
      // The host context shuts down (its core closed): no more ticks; the wheel must be
      // destroyed before its executor's context, as any I/O object.
      w.tick_state_ = wheel_engine::tick_state::idle;
      w.sleeping_until_.store(0, std::memory_order_relaxed); // producers ask no more
      return;
    }
    w.tick_state_ = wheel_engine::tick_state::running;
    if (!w.tick_once(lk)) { // the wheel went away meanwhile (a timeout's drop destroyed it)
      lk.unlock();
      delete t;
    }
  }

  wheel_anchor* anchor;
  std::uint64_t id;
};

long wheel_ticks_alive() noexcept { return ticks_alive.load(std::memory_order_relaxed); }
wheel_tick* make_wheel_tick(wheel_anchor& a, std::uint64_t id) { return new wheel_tick(a, id); }
void free_wheel_tick(wheel_tick* t) noexcept { delete t; }
wait_node* wheel_tick_node(wheel_tick* t) noexcept { return t; }

// The hosted tick invariant: while the wheel holds a deadline, the tick is armed no later
// than it, or running (and then, before it goes idle, it reads every deadline under the
// mutex and arms itself for the earliest). sleeping_until_ is the armed tick (never when
// idle, 0 while running): a producer whose deadline is earlier takes the mutex and re-arms
// (a Dekker pair with tick_once(), which stores it before its last look at the inbox).
// Kept by rearm_tick() and tick_once(); tested by
// `a_timeout_pushed_while_the_hosted_tick_chooses_its_deadline_fires_on_time` (hook
// wheel_timer_before_sleep) (test/unit/detail/timing_service.cpp).
void wheel_engine::rearm_tick(const held_lock& lk, std::uint64_t when) noexcept {
  assert_held(lk, mtx_);
  if (!tick_ || stopped_ || forked_child_.load(std::memory_order_relaxed) || tick_state_ == tick_state::running) return;
  if (tick_state_ == tick_state::armed) {
    if (tick_at_ <= when) return;
    // Taken out of the heap by the host meanwhile: it is about to run, and will look.
    if (!withdraw_tick(lk)) return;
  }
  wheel_tick_node(tick_)->aborted_ = false;
  try {
    if (host_->add_wait(wheel_tick_node(tick_), time_of_tick(when), now())) {
      tick_state_ = tick_state::armed;
      tick_at_ = when;
      sleeping_until_.store(when, std::memory_order_seq_cst);
    } else {
      sleeping_until_.store(0, std::memory_order_relaxed); // the host context has shut down
    }
  } catch (...) { // no memory to grow the host's heap: the next deadline tries again
    sleeping_until_.store(never, std::memory_order_relaxed);
    report_here(std::current_exception(), "wheel_timer");
  }
}

// An armed tick taken back out of the host's heap. False when the host took it first (it
// is queued there, or running): it will look at the wheel.
bool wheel_engine::withdraw_tick(const held_lock& lk) noexcept {
  assert_held(lk, mtx_);
  if (!tick_ || tick_state_ != tick_state::armed ||
      !pool_core::withdraw_wait(host_->anchor(), host_->anchor_generation(), wheel_tick_node(tick_)))
    return false;
  tick_state_ = tick_state::idle;
  return true;
}

// The tick: the wheel's turns (take_turn(), wheel_clock.cpp) on a host thread, until
// the wheel may sleep; then it arms itself for that.
bool wheel_engine::tick_once(std::unique_lock<std::mutex>& lk) noexcept {
  chain fired;
  for (;;) {
    if (stopped_ || forked_child_.load(std::memory_order_relaxed)) {
      tick_state_ = tick_state::idle;
      // The wheel's destructor, past its look at the tick (it saw it busy), let go of
      // it: the tick frees itself (false), else the destructor frees it, idle.
      return tick_ != nullptr;
    }
    std::uint64_t until = never;
    const turn next = take_turn(lk, fired, true, until);
    if (next == turn::wheel_gone) return false;
    if (next == turn::again) continue;
    tick_state_ = tick_state::idle;
    if (until != never) rearm_tick(lk, until);
    return true;
  }
}

} // namespace metronome::detail
