// manual_clock: moving time and telling the listeners (pools, wheels) built on it.
#include <metronome/manual_clock.hpp>

#include <metronome/detail/clock_listener.hpp>

#include "held_lock.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>

namespace metronome {

void manual_clock::advance(duration d) {
  if (d < duration::zero()) throw std::invalid_argument("metronome: manual_clock cannot go back");
  std::unique_lock lk(mtx_);
  auto now = now_.load(std::memory_order_relaxed);
  auto step = d.count();
  auto next = step > std::numeric_limits<clock::rep>::max() - now ? std::numeric_limits<clock::rep>::max() : now + step;
  set(lk, next);
}

void manual_clock::advance_to(time_point t) {
  std::unique_lock lk(mtx_);
  if (t.time_since_epoch().count() < now_.load(std::memory_order_relaxed))
    throw std::invalid_argument("metronome: manual_clock cannot go back");
  set(lk, t.time_since_epoch().count());
}

void manual_clock::set(const std::unique_lock<std::mutex>& lk, clock::rep t) {
  detail::assert_held(lk, mtx_);
  now_.store(t, std::memory_order_release);
  for (auto* l : listeners_) l->on_time_advanced();
}

bool manual_clock::all_quiescent(const std::unique_lock<std::mutex>& lk, clock::time_point& earliest) const {
  detail::assert_held(lk, mtx_);
  for (auto* l : listeners_) {
    clock::time_point due = clock::time_point::max();
    if (!l->quiescent(due)) return false;
    if (due < earliest) earliest = due;
  }
  return true;
}

// Under mtx_, which every decision and every advance takes, so decisions are serialised.
// Each listener answers under its own mutex; a pool thread that calls idle_point() has
// already counted itself as parked, so two pools going idle at once cannot each see the
// other busy and both wait (docs/design.md, "Auto-advance"). Every pool idle: jump to the
// earliest timed work (auto-advance, no hold), else tell wait_idle()'s waiters.
void manual_clock::check_idle(const std::unique_lock<std::mutex>& lk) {
  detail::assert_held(lk, mtx_);
  const bool jumps = auto_.load(std::memory_order_relaxed) && holds_ == 0;
  if (!jumps && idle_waiters_.load(std::memory_order_seq_cst) == 0) return;
  clock::time_point earliest = clock::time_point::max();
  if (!all_quiescent(lk, earliest)) return;
  if (jumps && earliest != clock::time_point::max()) {
    if (earliest.time_since_epoch().count() > now_.load(std::memory_order_relaxed))
      set(lk, earliest.time_since_epoch().count());
    return; // timed work will run: not idle yet
  }
  ++idle_verdicts_;
  idle_cv_.notify_all();
}

// The wait-idle invariant: a waiter counts itself in idle_waiters_ (seq_cst) before its
// first check, which takes each pool's mutex; a pool's last awake worker reads that count
// under the pool's mutex in the same hold as it parks. So either the waiter's check found
// the pool parked, or the worker saw the waiter and asks the clock (idle_point(), counted
// as parked) before parking, and that check wakes the waiter. Idleness that no parking
// worker reports is asked for where it comes: a transit's end with nobody awake wakes a
// worker to ask (pool_engine::leave_transit), a thread leaving a pool asks on its way out
// (worker_main), a listener that goes decides again (detach). The re-check every
// millisecond stays behind them. Stop-here test: hook worker_after_idle_point
// (test/handover/pool.cpp).
void manual_clock::wait_idle() {
  std::unique_lock lk(mtx_);
  for (auto* l : listeners_)
    if (l->runs_this_thread())
      throw std::logic_error("metronome: manual_clock::wait_idle() called on a thread of a pool on that clock");
  idle_waiters_.fetch_add(1, std::memory_order_seq_cst);
  struct leave {
    std::atomic<int>& n;
    ~leave() { n.fetch_sub(1, std::memory_order_seq_cst); }
  } counted{idle_waiters_};
  for (;;) {
    const std::uint64_t seen = idle_verdicts_;
    check_idle(lk);
    if (idle_verdicts_ != seen) return;
    if (idle_cv_.wait_for(lk, std::chrono::milliseconds(1), [&] { return idle_verdicts_ != seen; })) return;
  }
}

void manual_clock::set_auto_advance(bool on) {
  std::unique_lock lk(mtx_);
  auto_.store(on, std::memory_order_release);
  check_idle(lk);
}

void manual_clock::idle_point() {
  std::unique_lock lk(mtx_);
  check_idle(lk);
}

manual_clock::hold_guard::hold_guard(manual_clock& c) noexcept : c_(c) {
  std::lock_guard lk(c_.mtx_);
  ++c_.holds_;
}

manual_clock::hold_guard::~hold_guard() {
  std::unique_lock lk(c_.mtx_);
  if (--c_.holds_ == 0) c_.check_idle(lk);
}

void manual_clock::attach(detail::clock_listener* l) {
  std::lock_guard lk(mtx_);
  listeners_.push_back(l);
}

// A listener that goes may have been the one that refused the last decision (a pool
// destroyed from inside one of its own tasks, whose thread was awake and leaves without
// parking): the others may have asked already, and parked for good. Decide again. Tested by
// `a_pool_destroyed_from_its_own_task_after_another_pool_s_last_worker_asked_makes_the_clock_jump`.
void manual_clock::detach(detail::clock_listener* l) noexcept {
  std::unique_lock lk(mtx_);
  listeners_.erase(std::remove(listeners_.begin(), listeners_.end(), l), listeners_.end());
  check_idle(lk);
}

} // namespace metronome
