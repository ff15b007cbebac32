// Pool anchors (detail/pool_anchor.hpp): a task's one-word anchor id names its anchor and
// the generation it recorded; an anchor is recycled with a new generation, never freed;
// the table holds at most anchor_blocks * anchor_block_size (1,048,576) anchors at once
// and refuses one more with std::length_error.
#include <metronome/detail/pool_anchor.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

using namespace metronome::detail;

namespace {
// Anchors only store their pool's pointer: a made-up one is never followed here.
pool_core* fake_core(std::uintptr_t i) { return reinterpret_cast<pool_core*>((i + 1) * 64); }
} // namespace

BOOST_AUTO_TEST_SUITE(pool_anchor_suite)

BOOST_AUTO_TEST_CASE(an_anchor_id_names_its_anchor_and_generation_and_a_recycled_anchor_moves_on) {
  pool_anchor* a = acquire_pool_anchor(fake_core(1));
  const pool_anchor_id id(a, a->generation);
  BOOST_TEST(id.anchor() == a);
  BOOST_TEST(id.generation() == a->generation);
  BOOST_TEST(a->core.load() == fake_core(1));
  retire_pool_anchor(a);
  BOOST_TEST(a->core.load() == nullptr);
  pool_anchor* b = acquire_pool_anchor(fake_core(2)); // the latest retired first
  BOOST_TEST(b == a);
  BOOST_TEST(id.anchor() == b);
  BOOST_TEST(b->generation != id.generation()); // the old id's pool is gone
  BOOST_TEST(b->core.load() == fake_core(2));
  retire_pool_anchor(b);
}

BOOST_AUTO_TEST_CASE(the_table_holds_a_million_anchors_and_refuses_one_more) {
  const std::size_t limit = anchor_blocks * anchor_block_size;
  std::vector<pool_anchor*> held;
  held.reserve(limit);
  bool refused = false;
  while (held.size() <= limit) { // anchors of this process's other pools count too
    try {
      held.push_back(acquire_pool_anchor(fake_core(held.size())));
    } catch (const std::length_error&) {
      refused = true;
      break;
    }
  }
  BOOST_TEST(refused);
  BOOST_TEST(held.size() <= limit);
  BOOST_TEST(held.size() + 16 >= limit);
  // Each one its own index, found again by its id.
  std::vector<bool> seen(limit);
  std::size_t found = 0;
  for (pool_anchor* a : held) {
    if (a->index < limit && !seen[a->index] && pool_anchor_id(a, a->generation).anchor() == a) ++found;
    if (a->index < limit) seen[a->index] = true;
  }
  BOOST_TEST(found == held.size());
  for (pool_anchor* a : held) retire_pool_anchor(a);
  pool_anchor* again = acquire_pool_anchor(fake_core(0)); // places come back as pools go
  BOOST_TEST(again != nullptr);
  retire_pool_anchor(again);
}

BOOST_AUTO_TEST_SUITE_END()
