// The wheel's clock: reading the time, the loop's turn and the sleep it chooses, the walk
// that brings the next tick's timeouts into cache, and moving on a manual clock.
#include <metronome/detail/report.hpp>
#include <metronome/detail/test_hooks.hpp>
#include "wheel_engine.hpp"
#include <metronome/manual_clock.hpp>

#include "platform.hpp"

#include <algorithm>

namespace metronome::detail {

clock::time_point wheel_core::now() const noexcept {
  const wheel_engine& e = engine(*this);
  return e.manual_ ? e.manual_->now() : clock::now();
}

// A manual clock's advance (docs/design.md, "Telling the listeners"). Its hand-over is
// counted as a tick's is: stop() and the destructor wait for it, so the pool it pushes to
// is still there (a wheel stopped on another thread, then its pool destroyed, while this
// hand-over ran pushed into a freed pool). A timeout run or dropped in it may destroy the
// wheel; the generation is checked before the wheel is touched again.
void wheel_engine::on_time_advanced() {
  chain fired;
  std::unique_lock lk(mtx_);
  if (stopped_) return;
  drain_inbox(lk, fired);
  advance(lk, tick_of(now()), fired);
  wheel_anchor& a = *enrolled_.anchor;
  const std::uint64_t id = enrolled_.id;
  hand_over_unlocked(a, lk, fired, false); // lets go of the mutex
  lk.lock();
  if (enrolled(a, id) && !stopped_) touch_next_tick(lk); // as a tick does before it sleeps
}

// Brings the next tick's timeouts into this thread's cache before that tick (the tick's
// last turn, before it sleeps), so that they are found in a nearby cache rather than in memory (a miss paid one
// entry after another: each entry's link is in the one before). The slot's list is walked from all its entry points side by side, so the
// cache misses overlap. The mutex is let go between groups of entry points: a cancel()
// waits for one group at most. Returns whether it touched anything.
bool wheel_engine::touch_next_tick(std::unique_lock<std::mutex>& lk) noexcept {
  wheel_anchor& a = *enrolled_.anchor;
  const std::uint64_t id = enrolled_.id;
  const std::uint64_t tick = elapsed_ + 1;
  if (marks_.empty() || touched_ >= tick) return false;
  const auto index = static_cast<std::size_t>(tick & mask_);
  if (slots_[index].count < touch_at_least) return false;
  touched_ = tick;
  touched_entries_ = 0;
  constexpr std::size_t group = 32;
  wheel_entry* cursor[group + 1];
  for (std::size_t first = 0; !stopped_ && elapsed_ < tick && first < marks_[index].size(); first += group) {
    const auto& marks = marks_[index];
    std::size_t n = std::min(group, marks.size() - first);
    std::copy_n(marks.begin() + static_cast<std::ptrdiff_t>(first), n, cursor);
    if (wheel_entry* head = slots_[index].head; first == 0 && head && head->mark_ == wheel_entry::no_mark)
      cursor[n++] = head; // the first entry point was unlinked: nobody walks from before it
    for (bool walking = true; walking;) {
      walking = false;
      for (std::size_t i = 0; i < n; ++i) {
        if (wheel_entry* e = cursor[i]) { // each step reads the next entry: n misses in flight
          ++touched_entries_;
          wheel_entry* next = next_in_slot(e);
          cursor[i] = next && next->mark_ == wheel_entry::no_mark ? next : nullptr;
          walking = true;
        }
      }
    }
    // Let go between groups; the mutex is the anchor's, so re-taking it is safe, but the
    // wheel may have been destroyed meanwhile (its destructor does not wait for a walk):
    // the caller, too, reads nothing of it before it has looked at the generation.
    lk.unlock();
    METRONOME_TEST_HOOK(hook_point::wheel_touch_after_unlock);
    lk.lock();
    if (!enrolled(a, id)) return true;
    if (tick_of(now()) >= tick) break; // due: hand it over rather than touch the rest
  }
  return true;
}

// One turn of the wheel's loop (a tick takes them until the wheel may sleep: tick_once(),
// wheel_tick.cpp): takes the inbox, moves the wheel to now and dispatches what fell due
// (the mutex let go meanwhile: that code may destroy the wheel, turn::wheel_gone); else,
// with `touch_ahead`, walks the next tick's timeouts (the mutex let go); else chooses the
// tick to sleep until (`until`, never for none) and publishes it in sleeping_until_: a
// producer with an earlier deadline then wakes the loop. A Dekker pair with the producers
// (wheel_producer_* hooks): whatever a producer pushed before it could see `until` is in
// the inbox at the last look, so turn::sleep misses nothing.
wheel_engine::turn wheel_engine::take_turn(std::unique_lock<std::mutex>& lk, chain& fired, bool touch_ahead,
                                           std::uint64_t& until) noexcept {
  assert_held(lk, mtx_);
  wheel_anchor& a = *enrolled_.anchor;
  const std::uint64_t id = enrolled_.id;
  sleeping_until_.store(0, std::memory_order_relaxed);
  const bool arrived = drain_inbox(lk, fired) != never;
  advance(lk, tick_of(now()), fired);
  if (fired.head) {
    // Counted as a hand-over: the wheel may be destroyed on another thread meanwhile, and
    // its destructor waits for this dispatch, which reads nothing of the wheel (it was a
    // use after free under ThreadSanitizer when the tick read the wheel's executor here).
    hand_over_unlocked(a, lk, fired, false);
    lk.lock();
    return enrolled(a, id) ? turn::again : turn::wheel_gone;
  }
  // The lock was let go: look again - if the wheel is still there (as after a hand-over).
  // Stop-here test: `a_wheel_destroyed_while_its_tick_walks_ahead_is_not_read_again`.
  if (touch_ahead && touch_next_tick(lk)) return enrolled(a, id) ? turn::again : turn::wheel_gone;
  until = next_event(lk);
  if (arrived && elapsed_ + 1 < until) until = elapsed_ + 1;
  METRONOME_TEST_HOOK(hook_point::wheel_timer_before_sleep);
  sleeping_until_.store(until, std::memory_order_seq_cst);
  const bool linked = drain_inbox(lk, fired) != never;
  if (fired.head || (linked && next_event(lk) < until)) return turn::again;
  return turn::sleep;
}

} // namespace metronome::detail
