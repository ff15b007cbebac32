// The wheel's levels: ticks from time, linking and unlinking entries in slots, the
// occupied-slot bitmap, slots moving down a level (cascades) and the step from tick to
// tick. Everything here runs under the wheel's mutex; the arithmetic is in
// src/wheel_slots.hpp.
#include "wheel_engine.hpp"
#include "wheel_slots.hpp"

#include <algorithm>
#include <utility>

namespace metronome::detail {

std::uint64_t wheel_engine::divide_by_tick(std::uint64_t ns, std::uint64_t& rest) const noexcept {
  const auto tick = static_cast<std::uint64_t>(opts_.tick.count());
  rest = ns % tick;
  return ns / tick;
}

std::uint64_t wheel_engine::tick_of(clock::time_point t) const noexcept {
  if (t <= start_) return 0;
  std::uint64_t rest;
  return divide_by_tick(static_cast<std::uint64_t>((t - start_).count()), rest);
}

clock::time_point wheel_engine::time_of_tick(std::uint64_t n) const noexcept {
  // Ticks past the one time_point::max() is in saturate (start_ + tick * n overflowed
  // for a huge tick or a deadline at the end of time).
  if (n >= tick_of(clock::time_point::max())) return clock::time_point::max();
  return start_ + opts_.tick * static_cast<clock::rep>(n);
}

std::uint64_t wheel_engine::deadline_tick(clock::time_point current, clock::duration delay) const noexcept {
  // Never early: round the deadline up to the next tick boundary.
  if (delay < clock::duration::zero()) delay = clock::duration::zero();
  const clock::time_point due = saturating_add(current, delay);
  const auto since = due - start_;
  if (since <= clock::duration::zero()) return 0;
  std::uint64_t rest;
  const std::uint64_t q = divide_by_tick(static_cast<std::uint64_t>(since.count()), rest);
  // The clock's last tick is the one time_point::max() is in: a deadline rounded up past
  // it could never be reached (a manual clock stops at max), so it is due there.
  return std::min(q + (rest != 0 ? 1 : 0), tick_of(clock::time_point::max()));
}

std::size_t wheel_engine::level_for(std::uint64_t when) const noexcept {
  return wheel_slots::level_for(when, elapsed_, opts_.levels, span_bits_);
}

// Links a future entry into its slot: at least one slot ahead at level 0, two above
// (a level's next slot is the one moving down). Except when its deadline is in the
// slot moving down from the level above: then it joins that slot's tail, behind the
// older ones with the same deadline (ties stay in scheduling order). Deadlines past the
// top level's ring wait in its farthest slot.
void wheel_engine::link(const held_lock& lk, wheel_entry* e, std::size_t from_level) noexcept {
  assert_held(lk, mtx_);
  const std::uint64_t when = e->when_;
  std::size_t level = level_for(when);
  const std::size_t up = level + 1;
  if (up < opts_.levels && up != from_level && (when >> shift(up)) == (elapsed_ >> shift(up)) + 1 &&
      slots_[cascading(up)].count != 0)
    level = up;
  append(lk, e, level * (mask_ + 1) + wheel_slots::slot_in_level(when, elapsed_, level, span_bits_, mask_));
}

void wheel_engine::append(const held_lock& lk, wheel_entry* e, std::size_t index) noexcept {
  assert_held(lk, mtx_);
  slot_list& list = slots_[index];
  e->slot_index_ = static_cast<std::uint16_t>(index);
  e->mark_ = wheel_entry::no_mark;
  if (index <= mask_ && !marks_.empty() && list.count % mark_every == 0) mark(lk, e, index);
  e->prev_ = list.tail;
  e->next_.store(nullptr, std::memory_order_relaxed);
  if (list.tail)
    list.tail->next_.store(e, std::memory_order_relaxed);
  else
    list.head = e;
  list.tail = e;
  if (list.count++ == 0) set_occupied(index, true);
}

void wheel_engine::mark(const held_lock& lk, wheel_entry* e, std::size_t index) noexcept {
  assert_held(lk, mtx_);
  auto& marks = marks_[index];
  if (marks.size() >= wheel_entry::no_mark) return;
  try {
    marks.push_back(e);
  } catch (...) {
    return; // entry points are only a hint
  }
  e->mark_ = static_cast<std::uint8_t>(marks.size() - 1);
}

wheel_entry* wheel_engine::next_in_slot(wheel_entry* e) noexcept {
  return static_cast<wheel_entry*>(e->next_.load(std::memory_order_relaxed));
}

void wheel_engine::unlink(const held_lock& lk, wheel_entry* e) noexcept {
  assert_held(lk, mtx_);
  const std::size_t index = e->slot_index_;
  slot_list& list = slots_[index];
  wheel_entry* next = next_in_slot(e);
  if (e->prev_)
    e->prev_->next_.store(next, std::memory_order_relaxed);
  else
    list.head = next;
  if (next)
    next->prev_ = e->prev_;
  else
    list.tail = e->prev_;
  if (--list.count == 0) set_occupied(index, false);
  if (e->mark_ != wheel_entry::no_mark) { // the walk from the entry point before covers what follows
    marks_[index][e->mark_] = nullptr;
    e->mark_ = wheel_entry::no_mark;
  }
  e->prev_ = nullptr;
  e->next_.store(nullptr, std::memory_order_relaxed);
  e->slot_index_ = wheel_entry::no_slot;
}

void wheel_engine::set_occupied(std::size_t index, bool on) noexcept {
  const std::size_t level = index / (mask_ + 1), slot = index & mask_;
  std::uint64_t& word = occupied_[level * words_per_level_ + slot / 64];
  const std::uint64_t bit = std::uint64_t(1) << (slot % 64);
  word = on ? (word | bit) : (word & ~bit);
}

// The first occupied slot of `level` at or after `from`, going round; slots if none.
std::size_t wheel_engine::next_occupied(std::size_t level, std::size_t from) const noexcept {
  return wheel_slots::next_occupied(occupied_.data() + level * words_per_level_, words_per_level_, from, mask_ + 1);
}

// The next tick at which the wheel has something to do: a level-0 slot falls due, a
// level's next slot starts moving down, or a slot moving down owes its next batch.
std::uint64_t wheel_engine::next_event(const held_lock& lk) const noexcept {
  assert_held(lk, mtx_);
  const std::uint64_t soonest = elapsed_ + 1;
  std::uint64_t best = never;
  auto consider = [&](std::uint64_t t) { best = std::min(best, std::max(t, soonest)); };
  if (const std::size_t idx = next_occupied(0, static_cast<std::size_t>(soonest & mask_)); idx <= mask_) {
    const std::uint64_t distance = (idx - elapsed_) & mask_;
    consider(elapsed_ + (distance == 0 ? mask_ + 1 : distance));
  }
  for (std::size_t level = 1; level < opts_.levels; ++level) {
    if (const auto& list = slots_[cascading(level)]; list.count != 0 && cascades_[level].number != 0) {
      // The first tick by which progress_cascade() owes another batch.
      const cascade& c = cascades_[level];
      consider(wheel_slots::cascade_next_owed(list.count, cascade_batch, c.start, c.finish, c.total));
    }
    const std::uint64_t current = elapsed_ >> shift(level);
    const std::size_t idx = next_occupied(level, static_cast<std::size_t>((current + 2) & mask_));
    const std::uint64_t distance = (idx - current) & mask_;
    if (idx > mask_ || distance < 2) continue;          // found only the current or the moving slot
    consider((current + distance - 1) << shift(level)); // moves down once the slot before it is current
  }
  return best;
}

void wheel_engine::chain::push(wheel_entry* e) noexcept {
  e->next_.store(nullptr, std::memory_order_relaxed);
  append(e, e, 1);
}

void wheel_engine::chain::append(wheel_entry* first, wheel_entry* last, std::size_t n) noexcept {
  if (tail)
    tail->next_.store(first, std::memory_order_relaxed);
  else
    head = first;
  tail = last;
  count += n;
}

void wheel_engine::fire(const held_lock& lk, wheel_entry* e, chain& fired) noexcept {
  assert_held(lk, mtx_);
  e->slot_index_ = wheel_entry::no_slot;
  e->prev_ = nullptr;
  e->state_.store(wheel_entry::firing, std::memory_order_release);
  fired.push(e);
}

// Walks a list linked through next_: entries already due go to `fired`, the others
// are linked. Returns the earliest deadline linked (never if none).
std::uint64_t wheel_engine::place(const held_lock& lk, wheel_entry* e, chain& fired, std::size_t from_level) noexcept {
  assert_held(lk, mtx_);
  std::uint64_t earliest = never;
  std::size_t due = 0;
  while (e) {
    wheel_entry* next = next_in_slot(e);
    if (e->when_ <= elapsed_) {
      fire(lk, e, fired);
      ++due;
    } else {
      link(lk, e, from_level);
      if (e->when_ < earliest) earliest = e->when_;
    }
    e = next;
  }
  count_removed(lk, due);
  return earliest;
}

// Fired, cancelled or stopped entries leave pending(); only mutex holders write removed_.
void wheel_engine::count_removed(const held_lock& lk, std::size_t n) noexcept {
  assert_held(lk, mtx_);
  if (n) removed_.store(removed_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

// Level L's next slot n (deadlines in [n, n + 1) * 2^shift(L)) is occupied and the
// slot before it just became current: it starts moving down, to be linked one level
// down bit by bit until one lower slot before its first deadline, when that lower slot
// must be complete to start moving down itself. The entries stay where they are.
void wheel_engine::start_cascade(const held_lock& lk, std::size_t level, chain& fired) noexcept {
  assert_held(lk, mtx_);
  const std::uint64_t number = (elapsed_ >> shift(level)) + 1;
  cascade& c = cascades_[level];
  if (c.number == number) return; // already moving
  // The one before is finished on schedule; after a clock jump it may not be.
  const std::size_t before = level * (mask_ + 1) + static_cast<std::size_t>((number - 1) & mask_);
  if (slots_[before].count != 0) {
    wheel_entry* left = std::exchange(slots_[before], slot_list{}).head;
    set_occupied(before, false);
    place(lk, left, fired, level);
  }
  const std::uint64_t first = number << shift(level);
  const std::uint64_t lower_span = std::uint64_t(1) << shift(level - 1);
  c = cascade{number, elapsed_, std::max(elapsed_, first - lower_span - 1), slots_[cascading(level)].count};
}

// Links as many of the level's moving entries one level down as its schedule owes by
// now: all of them at its finish tick, a proportional share before.
void wheel_engine::progress_cascade(const held_lock& lk, std::size_t level, chain& fired) noexcept {
  assert_held(lk, mtx_);
  slot_list& moving = slots_[cascading(level)];
  const cascade& c = cascades_[level];
  if (moving.count == 0 || c.number != (elapsed_ >> shift(level)) + 1) return;
  const std::size_t keep = wheel_slots::cascade_keep(elapsed_, c.start, c.finish, c.total);
  std::size_t due = 0;
  while (moving.count > keep) {
    wheel_entry* e = moving.head;
    if (wheel_entry* next = next_in_slot(e)) __builtin_prefetch(next);
    unlink(lk, e);
    if (e->when_ <= elapsed_) { // only when the clock jumped past the schedule
      fire(lk, e, fired);
      ++due;
    } else {
      link(lk, e, level);
    }
  }
  count_removed(lk, due);
}

// Moves the wheel to `tick`, which no event lies before: levels top-down finish or
// continue what they are moving down and start on their next slot, then level 0's slot
// for this tick goes to the executor.
void wheel_engine::step(const held_lock& lk, std::uint64_t tick, chain& fired) noexcept {
  assert_held(lk, mtx_);
  elapsed_ = tick;
  for (std::size_t level = opts_.levels - 1; level >= 1; --level) {
    if (slots_[cascading(level)].count != 0) start_cascade(lk, level, fired);
    progress_cascade(lk, level, fired);
  }
  const auto index = static_cast<std::size_t>(tick & mask_);
  slot_list& list = slots_[index];
  if (list.count == 0) return;
  slot_list taken = std::exchange(list, slot_list{});
  set_occupied(index, false);
  if (!marks_.empty()) marks_[index].clear();
  if (opts_.levels == 1) { // one level: deadlines past the ring wait in it and go round again
    place(lk, taken.head, fired, no_level);
    return;
  }
  // Every entry of a level-0 slot is due at this very tick, and the slot's list is
  // linked through the ready queue's own field: hand the whole list over without
  // touching a single entry (they stay `pending`; from now on `when_ <= elapsed_`
  // tells cancel() that they left the wheel).
  fired.append(taken.head, taken.tail, taken.count);
  count_removed(lk, taken.count);
}

// A jump of many rotations over a wheel that holds only deadlines past its ring (a manual
// clock moved by years): every entry then sits in the top level, and whole rotations of
// it change no slot of any level, so they are skipped - stepping cascaded those entries
// round once per rotation, in time proportional to the distance (days for a jump to the
// clock's end on a 64 x 2 wheel). Returns the tick before which no entry is due (the
// earliest deadline, when it looked; elapsed_ when a cheap check said no).
std::uint64_t wheel_engine::skip_rotations(const held_lock& lk, std::uint64_t now_tick) noexcept {
  assert_held(lk, mtx_);
  const std::size_t top = opts_.levels - 1;
  const unsigned ring_bits = shift(top) + span_bits_ + 1; // (mask_ + 1) << shift(top) ticks
  if (ring_bits >= 62) return never;                      // the ring spans the clock: nothing past it
  const std::uint64_t ring = std::uint64_t(1) << ring_bits;
  if (now_tick - elapsed_ < 2 * ring) return elapsed_;
  for (std::size_t w = 0; w < top * words_per_level_; ++w)
    if (occupied_[w] != 0) return elapsed_; // deadlines within the ring: step to them
  std::uint64_t earliest = never;
  for (std::size_t i = top * (mask_ + 1); i < (top + 1) * (mask_ + 1); ++i)
    for (wheel_entry* e = slots_[i].head; e != nullptr; e = next_in_slot(e)) earliest = std::min(earliest, e->when_);
  if (earliest == never) return never; // empty: one step goes all the way
  const std::uint64_t until = std::min(earliest, now_tick);
  if (until > elapsed_ && until - elapsed_ >= 2 * ring) elapsed_ += ((until - elapsed_) / ring - 1) * ring;
  return earliest;
}

void wheel_engine::advance(const held_lock& lk, std::uint64_t now_tick, chain& fired) noexcept {
  assert_held(lk, mtx_);
  std::uint64_t nothing_before = 0; // no entry is due before this tick (nothing is added meanwhile)
  while (elapsed_ < now_tick) {
    if (elapsed_ >= nothing_before) nothing_before = skip_rotations(lk, now_tick);
    step(lk, std::min(now_tick, next_event(lk)), fired);
  }
  enrolled_.anchor->elapsed.store(elapsed_, std::memory_order_release);
}

} // namespace metronome::detail
