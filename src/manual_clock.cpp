// manual_clock: moving time and telling the listeners (pools, wheels) built on it.
#include <metronome/manual_clock.hpp>

#include <metronome/detail/clock_listener.hpp>

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace metronome {

void manual_clock::advance(duration d) {
  if (d < duration::zero()) throw std::invalid_argument("metronome: manual_clock cannot go back");
  std::lock_guard lk(mtx_);
  auto now = now_.load(std::memory_order_relaxed);
  auto step = d.count();
  auto next = step > std::numeric_limits<clock::rep>::max() - now ? std::numeric_limits<clock::rep>::max() : now + step;
  now_.store(next, std::memory_order_release);
  for (auto* l : listeners_) l->on_time_advanced();
}

void manual_clock::advance_to(time_point t) {
  std::lock_guard lk(mtx_);
  if (t.time_since_epoch().count() < now_.load(std::memory_order_relaxed))
    throw std::invalid_argument("metronome: manual_clock cannot go back");
  now_.store(t.time_since_epoch().count(), std::memory_order_release);
  for (auto* l : listeners_) l->on_time_advanced();
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
