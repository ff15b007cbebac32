// manual_clock: moving time and telling the listeners (pools, wheels) built on it.
#include <metronome/manual_clock.hpp>

#include <metronome/detail/clock_listener.hpp>

#include "held_lock.hpp"

#include <algorithm>
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

// Under mtx_, which every decision and every advance takes, so decisions are serialised.
// Each listener answers under its own mutex; a pool thread that calls idle_point() has
// already counted itself as parked, so two pools going idle at once cannot each see the
// other busy and both wait (docs/design.md, "Auto-advance").
void manual_clock::check_idle(const std::unique_lock<std::mutex>& lk) {
  detail::assert_held(lk, mtx_);
  if (!auto_.load(std::memory_order_relaxed) || holds_ > 0) return;
  clock::time_point earliest = clock::time_point::max();
  for (auto* l : listeners_) {
    clock::time_point due = clock::time_point::max();
    if (!l->quiescent(due)) return;
    if (due < earliest) earliest = due;
  }
  if (earliest == clock::time_point::max()) return; // no timed work: nothing to jump to
  if (earliest.time_since_epoch().count() > now_.load(std::memory_order_relaxed))
    set(lk, earliest.time_since_epoch().count());
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

void manual_clock::detach(detail::clock_listener* l) noexcept {
  std::lock_guard lk(mtx_);
  listeners_.erase(std::remove(listeners_.begin(), listeners_.end(), l), listeners_.end());
}

} // namespace metronome
