// The timing wheel's arithmetic as pure functions: ticks from nanoseconds, the level and
// slot a deadline belongs to, the occupied-slot bitmap search, and a moving slot's
// schedule. wheel_engine calls them with its own state; test/unit/detail/wheel_slots.cpp checks
// them directly.
#ifndef METRONOME_DETAIL_WHEEL_SLOTS_HPP
#define METRONOME_DETAIL_WHEEL_SLOTS_HPP

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace metronome::detail::wheel_slots {

// A level-L slot spans 2^shift(L) ticks.
constexpr unsigned shift(std::size_t level, unsigned span_bits) noexcept {
  return static_cast<unsigned>(level * span_bits);
}

// The lowest level whose ring may hold the deadline `when` at `elapsed`: the one below the
// first level whose current or next slot contains it. (Level L's next slot is moving down
// or empty, so a deadline there belongs one level lower; the level above keeps what is
// further.)
constexpr std::size_t level_for(std::uint64_t when, std::uint64_t elapsed, std::size_t levels,
                                unsigned span_bits) noexcept {
  const std::size_t top = levels - 1;
  for (std::size_t level = 0; level < top; ++level) {
    const unsigned up = shift(level + 1, span_bits);
    if ((when >> up) - (elapsed >> up) <= 1) return level;
  }
  return top;
}

// The slot of `level` (0 .. mask) that holds `when`; deadlines past the ring wait in its
// farthest slot.
constexpr std::size_t slot_in_level(std::uint64_t when, std::uint64_t elapsed, std::size_t level,
                                    unsigned span_bits, std::uint64_t mask) noexcept {
  const std::uint64_t current = elapsed >> shift(level, span_bits);
  std::uint64_t number = when >> shift(level, span_bits);
  if (number - current > mask) number = current + mask;
  return static_cast<std::size_t>(number & mask);
}

// The first set bit of a level's bitmap (`words` words) at or after `from`, going round;
// `slots` when none is set.
constexpr std::size_t next_occupied(const std::uint64_t* words, std::size_t word_count, std::size_t from,
                                    std::size_t slots) noexcept {
  const std::size_t first = from / 64;
  const auto bit = static_cast<unsigned>(from % 64);
  if (const std::uint64_t w = words[first] & (~std::uint64_t(0) << bit))
    return first * 64 + static_cast<std::size_t>(std::countr_zero(w));
  for (std::size_t i = 1; i < word_count; ++i) {
    const std::size_t k = (first + i) % word_count;
    if (words[k]) return k * 64 + static_cast<std::size_t>(std::countr_zero(words[k]));
  }
  if (const std::uint64_t w = words[first] & ((std::uint64_t(1) << bit) - 1))
    return first * 64 + static_cast<std::size_t>(std::countr_zero(w));
  return slots;
}

// A slot moving down from `start` to `finish` (ticks) with `total` entries at its start:
// how many it may still hold at `elapsed` (all before the start, none from the finish on).
inline std::size_t cascade_keep(std::uint64_t elapsed, std::uint64_t start, std::uint64_t finish,
                                std::size_t total) noexcept {
  if (elapsed >= finish) return 0;
  const double share = static_cast<double>(finish - elapsed) / static_cast<double>(finish - start);
  return static_cast<std::size_t>(std::ceil(share * static_cast<double>(total)));
}

// The first tick by which such a slot, holding `count` entries now, owes its next batch
// of `batch` (or all that is left).
inline std::uint64_t cascade_next_owed(std::size_t count, std::size_t batch, std::uint64_t start,
                                       std::uint64_t finish, std::size_t total) noexcept {
  const std::size_t moved = std::min(count, batch);
  const double left = static_cast<double>(count - moved) / static_cast<double>(total);
  const double ahead = left * static_cast<double>(finish - start);
  return ahead >= static_cast<double>(finish) ? 0 : finish - static_cast<std::uint64_t>(ahead);
}

} // namespace metronome::detail::wheel_slots

#endif
