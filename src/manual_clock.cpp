// manual_clock: moving time and telling the listeners (pools, wheels) built on it.
#include <metronome/manual_clock.hpp>

#include <metronome/detail/clock_listener.hpp>
#include <metronome/detail/test_hooks.hpp>

#include "held_lock.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <thread>
#include <utility>

namespace metronome {

void manual_clock::advance(duration d) {
  if (d < duration::zero()) throw std::invalid_argument("metronome: manual_clock cannot go back");
  std::unique_lock lk(mtx_);
  wait_turn(lk);
  auto now = now_.load(std::memory_order_relaxed);
  auto step = d.count();
  auto next = step > std::numeric_limits<clock::rep>::max() - now ? std::numeric_limits<clock::rep>::max() : now + step;
  set(lk, next);
}

void manual_clock::advance_to(time_point t) {
  std::unique_lock lk(mtx_);
  wait_turn(lk);
  if (t.time_since_epoch().count() < now_.load(std::memory_order_relaxed))
    throw std::invalid_argument("metronome: manual_clock cannot go back");
  set(lk, t.time_since_epoch().count());
}

// An advance on another thread is telling the listeners: wait until it has told them all.
// The teller's own thread (code its advance runs) goes on: set() only moves the time then.
void manual_clock::wait_turn(std::unique_lock<std::mutex>& lk) {
  detail::assert_held(lk, mtx_);
  const auto me = std::this_thread::get_id();
  turn_cv_.wait(lk, [&] { return !telling_ || teller_ == me; });
}

// Moves the time to `t` and tells every listener. Inside the teller's own advance (its
// listeners' code advancing again) it only moves the time: the outer telling tells all
// again before it returns, with nothing called re-entrantly. A decision asked while
// telling (a pool going idle, a hold let go, a listener leaving) is made at the end, and
// its jump told in the same loop - not by recursion: auto-advance may jump many times.
void manual_clock::set(std::unique_lock<std::mutex>& lk, clock::rep t) {
  detail::assert_held(lk, mtx_);
  now_.store(t, std::memory_order_release);
  if (telling_) { // wait_turn() let only the teller's thread through
    retell_ = true;
    return;
  }
  telling_ = true;
  teller_ = std::this_thread::get_id();
  for (;;) {
    tell_listeners(lk);
    if (!std::exchange(decision_owed_, false) || !decide(lk, t)) break;
    now_.store(t, std::memory_order_release); // the decision's jump
  }
  telling_ = false;
  teller_ = {};
  turn_cv_.notify_all();
}

// The telling invariant: one thread at a time tells (telling_, teller_), each listener
// called without mtx_ and named in calling_. A listener leaves (detach) under mtx_: out
// of the list at once, with the telling's cursor moved back when it was behind it, so no
// other listener is skipped or told twice; and it waits while calling_ names it - unless
// it leaves from inside that very call on the teller's thread (a timeout run or dropped
// there destroys its wheel; the listener's code after that touches nothing of itself). So
// no listener is called after its detach() returns, and nothing a listener's call runs
// waits for the clock's mutex to be let go by its own thread. Stop-here test: hook
// clock_before_tell (test/handover/wheel.cpp).
void manual_clock::tell_listeners(std::unique_lock<std::mutex>& lk) {
  detail::assert_held(lk, mtx_);
  do {
    retell_ = false;
    for (next_ = 0; next_ < listeners_.size();) {
      detail::clock_listener* l = listeners_[next_++];
      calling_ = l;
      lk.unlock();
      METRONOME_TEST_HOOK(hook_point::clock_before_tell);
      l->on_time_advanced();
      lk.lock();
      calling_ = nullptr;
      if (detach_waiters_.load(std::memory_order_relaxed) > 0) turn_cv_.notify_all();
    }
  } while (retell_);
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

// Under mtx_, so decisions are serialised, and never while an advance tells the
// listeners: one not yet told would look idle with its due work still in its heap, so the
// decision is owed to the telling's end (set()). Each listener answers under its own mutex;
// a pool thread that calls idle_point() has already counted itself as parked, so two pools
// going idle at once cannot each see the other busy and both wait (docs/design.md,
// "Auto-advance"). Every pool idle: jump to the earliest timed work (auto-advance, no
// hold), else tell wait_idle()'s waiters.
void manual_clock::check_idle(std::unique_lock<std::mutex>& lk) {
  detail::assert_held(lk, mtx_);
  METRONOME_TEST_HOOK(hook_point::clock_deciding);
  if (telling_) {
    decision_owed_ = true;
    return;
  }
  clock::rep jump_to = 0;
  if (decide(lk, jump_to)) set(lk, jump_to);
}

// The decision itself: true, with the time to jump to, when the clock jumps.
bool manual_clock::decide(const std::unique_lock<std::mutex>& lk, clock::rep& jump_to) {
  detail::assert_held(lk, mtx_);
  const bool jumps = auto_.load(std::memory_order_relaxed) && holds_ == 0;
  if (!jumps && idle_waiters_.load(std::memory_order_seq_cst) == 0) return false;
  clock::time_point earliest = clock::time_point::max();
  if (!all_quiescent(lk, earliest)) return false;
  if (jumps && earliest != clock::time_point::max()) {
    if (earliest.time_since_epoch().count() <= now_.load(std::memory_order_relaxed)) return false;
    jump_to = earliest.time_since_epoch().count();
    return true; // timed work will run: not idle yet
  }
  ++idle_verdicts_;
  idle_cv_.notify_all();
  return false;
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
  if (telling_ && teller_ == std::this_thread::get_id())
    throw std::logic_error("metronome: manual_clock::wait_idle() called from inside an advance of that clock");
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
// Also where a listener leaves an advance's telling (the telling invariant, above).
void manual_clock::detach(detail::clock_listener* l) noexcept {
  std::unique_lock lk(mtx_);
  if (auto it = std::find(listeners_.begin(), listeners_.end(), l); it != listeners_.end()) {
    const auto index = static_cast<std::size_t>(it - listeners_.begin());
    listeners_.erase(it);
    if (telling_ && index < next_) --next_;
  }
  if (calling_ == l && teller_ != std::this_thread::get_id()) {
    detach_waiters_.fetch_add(1, std::memory_order_seq_cst);
    turn_cv_.wait(lk, [&] { return calling_ != l; });
    detach_waiters_.fetch_sub(1, std::memory_order_seq_cst);
  }
  check_idle(lk);
}

} // namespace metronome
