// The timing wheel's arithmetic (src/wheel_slots.hpp), checked against the plain
// definitions it computes.
#include "wheel_slots.hpp" // src/: the engine's own, not installed

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <random>
#include <vector>

using namespace metronome::detail::wheel_slots;

BOOST_AUTO_TEST_SUITE(wheel_slots_suite)

BOOST_AUTO_TEST_CASE(a_deadline_goes_to_the_lowest_level_whose_next_slot_holds_it) {
  // 8 slots per level: a level-L slot spans 4^L ticks (span_bits 2), three levels.
  constexpr unsigned span_bits = 2;
  constexpr std::size_t levels = 3;
  static_assert(level_for(1, 0, levels, span_bits) == 0);
  static_assert(level_for(7, 0, levels, span_bits) == 0);  // level 1's slot 1: [4, 8)
  static_assert(level_for(8, 0, levels, span_bits) == 1);  // level 1's slot 2
  static_assert(level_for(31, 0, levels, span_bits) == 1); // level 2's slot 1: [16, 32)
  static_assert(level_for(32, 0, levels, span_bits) == 2);
  static_assert(level_for(1'000'000, 0, levels, span_bits) == 2); // past the ring: the top
  static_assert(level_for(13, 9, levels, span_bits) == 0);        // relative to elapsed
  static_assert(level_for(16, 9, levels, span_bits) == 1);
  static_assert(level_for(5, 0, 1, span_bits) == 0); // one level holds everything
}

BOOST_AUTO_TEST_CASE(a_deadline_past_the_ring_waits_in_its_farthest_slot) {
  constexpr unsigned span_bits = 2;
  constexpr std::uint64_t mask = 7;
  static_assert(slot_in_level(3, 0, 0, span_bits, mask) == 3);
  static_assert(slot_in_level(9, 2, 0, span_bits, mask) == 1);  // goes round
  static_assert(slot_in_level(20, 2, 0, span_bits, mask) == 1); // capped: current (2) + 7 = 9
  static_assert(slot_in_level(20, 0, 1, span_bits, mask) == 5); // 20 >> 2
  static_assert(slot_in_level(1000, 0, 1, span_bits, mask) == 7);
}

BOOST_AUTO_TEST_CASE(next_occupied_finds_the_first_set_bit_going_round) {
  for (const std::size_t slots : {std::size_t(8), std::size_t(64), std::size_t(256)}) {
    const std::size_t words = (slots + 63) / 64;
    std::mt19937 rng(static_cast<unsigned>(slots));
    for (int round = 0; round < 200; ++round) {
      std::vector<std::uint64_t> bits(words, 0);
      std::vector<bool> set(slots, false);
      const int count = round % 5; // none, then a few
      for (int i = 0; i < count; ++i) {
        const std::size_t s = rng() % slots;
        set[s] = true;
        bits[s / 64] |= std::uint64_t(1) << (s % 64);
      }
      for (std::size_t from = 0; from < slots; ++from) {
        std::size_t expected = slots;
        for (std::size_t k = 0; k < slots; ++k)
          if (set[(from + k) % slots]) {
            expected = (from + k) % slots;
            break;
          }
        BOOST_TEST_REQUIRE(next_occupied(bits.data(), words, from, slots) == expected);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_moving_slot_keeps_a_falling_share_until_its_finish) {
  BOOST_TEST(cascade_keep(10, 10, 20, 100) == 100u); // nothing owed at the start
  BOOST_TEST(cascade_keep(15, 10, 20, 100) == 50u);
  BOOST_TEST(cascade_keep(19, 10, 20, 100) == 10u);
  BOOST_TEST(cascade_keep(20, 10, 20, 100) == 0u); // all at the finish
  BOOST_TEST(cascade_keep(30, 10, 20, 100) == 0u); // and after it (a clock jump)
  BOOST_TEST(cascade_keep(11, 10, 20, 3) == 3u);   // rounds up: never early
}

BOOST_AUTO_TEST_CASE(the_next_batch_of_a_moving_slot_is_owed_when_its_share_is_reached) {
  // 1000 entries over ticks 100..1100, batches of 100: 900 left after the next batch,
  // owed when the share kept falls to 900 (tick 200).
  BOOST_TEST(cascade_next_owed(1000, 100, 100, 1100, 1000) == 200u);
  BOOST_TEST(cascade_next_owed(50, 100, 100, 1100, 1000) == 1100u); // the last batch: at the finish
  // At the owed tick the schedule keeps no more than is left after one batch, and one
  // tick before it, more.
  const std::uint64_t owed = cascade_next_owed(1000, 100, 100, 1100, 1000);
  BOOST_TEST(cascade_keep(owed, 100, 1100, 1000) <= 900u);
  BOOST_TEST(cascade_keep(owed - 1, 100, 1100, 1000) > 900u);
}

BOOST_AUTO_TEST_SUITE_END()
