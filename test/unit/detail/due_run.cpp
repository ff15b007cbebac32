// due_run alone: the delay queue's FIFO of entries in due order (src/due_run.hpp).
#include "due_run.hpp"

#include <metronome/detail/node_cache.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <deque>
#include <memory>
#include <set>
#include <stdexcept>
#include <vector>

using namespace metronome::detail;

namespace {
struct node : timed_node {
  node() : timed_node(nullptr) {}
};
// A tag small enough that numbers wrap (modulo 127) within a test, and that the ring
// (at most 64 slots, below 127) runs out.
constexpr heap_index_t small_tag = heap_index_t(1) << 7;

void append(due_run& run, const delay_entry& e) {
  BOOST_REQUIRE(run.fits(e));
  if (run.full()) run.grow();
  run.append(e);
}
// Takes every node out from the front: their order.
std::vector<timed_node*> drain(due_run& run) {
  std::vector<timed_node*> order;
  while (!run.empty()) {
    timed_node* n = run.front().node;
    order.push_back(n);
    run.remove(n);
    BOOST_REQUIRE(n->heap_index_ == not_in_heap);
  }
  return order;
}
} // namespace

BOOST_AUTO_TEST_SUITE(due_run_suite)

// Only keys not below the last appended fit (O); the front is the first appended; each
// node's index carries the tag.
BOOST_AUTO_TEST_CASE(appends_in_due_order_and_refuses_an_earlier_key) {
  constexpr heap_index_t tag = heap_index_t(1) << 31;
  due_run run(tag);
  node a, b, c;
  BOOST_TEST(run.fits({5, 0, &a}));
  append(run, {5, 0, &a});
  append(run, {5, 1, &b});
  BOOST_TEST(!run.fits({5, 0, &c}));
  BOOST_TEST(!run.fits({4, 9, &c}));
  append(run, {7, 2, &c});
  BOOST_TEST(run.size() == 3u);
  BOOST_TEST(run.front().node == &a);
  for (node* n : {&a, &b, &c}) BOOST_TEST((n->heap_index_ & tag) != 0);
  BOOST_TEST((drain(run) == std::vector<timed_node*>{&a, &b, &c}));
  BOOST_TEST(run.fits({0, 0, &a})); // empty: anything fits
}

// Removing from the middle leaves a hole the front skips (F); once holes are more than
// half of 64 or more slots, the run is squeezed and renumbered, and every node can still
// be removed by its index.
BOOST_AUTO_TEST_CASE(holes_are_skipped_and_squeezed_out) {
  due_run run(heap_index_t(1) << 31);
  std::vector<std::unique_ptr<node>> nodes;
  for (int i = 0; i < 200; ++i) {
    nodes.push_back(std::make_unique<node>());
    append(run, {i, static_cast<std::uint64_t>(i), nodes.back().get()});
  }
  const std::size_t ring = run.capacity();
  for (int i = 0; i < 200; ++i)
    if (i % 3 != 0) run.remove(nodes[static_cast<std::size_t>(i)].get());
  run.remove(nodes[0].get()); // the front: the holes behind it go with it
  BOOST_TEST(run.front().node == nodes[3].get());
  std::vector<timed_node*> expected;
  for (int i = 3; i < 200; i += 3) expected.push_back(nodes[static_cast<std::size_t>(i)].get());
  BOOST_TEST(run.size() == expected.size());
  // Remove from the back by index (after the squeeze renumbered them), then drain.
  run.remove(expected.back());
  expected.pop_back();
  BOOST_TEST((drain(run) == expected));
  BOOST_TEST(run.capacity() == ring); // kept until shrink_if_sparse
  run.shrink_if_sparse(0);
  BOOST_TEST(run.capacity() == 0u);
}

// rekey_last re-keys the last node in place only while (O) holds against the slot before
// it; move_to_back moves any node to the back under a key that fits.
BOOST_AUTO_TEST_CASE(rekey_in_place_or_move_to_the_back) {
  due_run run(heap_index_t(1) << 31);
  node a, b, c;
  append(run, {10, 0, &a});
  append(run, {20, 1, &b});
  BOOST_TEST(!run.rekey_last(&a, {30, 2, &a})); // not the last
  BOOST_TEST(!run.rekey_last(&b, {5, 2, &b}));  // would go before a
  BOOST_TEST(run.rekey_last(&b, {15, 2, &b}));
  BOOST_TEST(!run.fits({14, 3, &c})); // the last key is now 15
  run.move_to_back(&a, {40, 3, &a});
  BOOST_TEST(run.front().node == &b);
  BOOST_TEST(run.front().due == 15);
  append(run, {40, 4, &c});
  BOOST_TEST((drain(run) == std::vector<timed_node*>{&b, &a, &c}));
}

// (N): numbers count modulo tag - 1 and wrap while nodes come and go; a ring that would
// reach that many slots is refused with std::length_error, nothing changed.
BOOST_AUTO_TEST_CASE(numbers_wrap_and_the_ring_is_bounded) {
  due_run run(small_tag);
  std::deque<std::unique_ptr<node>> live;
  std::uint64_t seq = 0;
  for (int round = 0; round < 1000; ++round) { // ~1000 numbers through a window of 40
    live.push_back(std::make_unique<node>());
    append(run, {round, seq++, live.back().get()});
    if (live.size() > 40) {
      BOOST_REQUIRE(run.front().node == live.front().get());
      run.remove(live.front().get());
      live.pop_front();
    }
    if (round % 7 == 0 && live.size() > 2) { // and from the middle, by index
      run.remove(live[1].get());
      live.erase(live.begin() + 1);
    }
  }
  std::vector<timed_node*> expected;
  for (auto& n : live) expected.push_back(n.get());
  BOOST_TEST((drain(run) == expected));

  std::vector<std::unique_ptr<node>> many;
  for (int i = 0; i < 64; ++i) {
    many.push_back(std::make_unique<node>());
    append(run, {i, seq++, many.back().get()});
  }
  BOOST_TEST(run.full());
  BOOST_CHECK_THROW(run.grow(), std::length_error);
  BOOST_TEST(run.size() == 64u);
  // move_to_back allocates nothing: the full ring squeezes out the hole it leaves.
  run.move_to_back(many[5].get(), {1000, seq++, many[5].get()});
  BOOST_TEST(run.size() == 64u);
  std::vector<timed_node*> order = drain(run);
  BOOST_TEST(order.back() == many[5].get());
  BOOST_TEST(order.front() == many[0].get());
}

// remove_if takes exactly the matching nodes, calling f on each, and leaves the rest in
// order.
BOOST_AUTO_TEST_CASE(remove_if_takes_the_matching_nodes) {
  due_run run(heap_index_t(1) << 31);
  std::vector<std::unique_ptr<node>> nodes;
  for (int i = 0; i < 100; ++i) {
    nodes.push_back(std::make_unique<node>());
    append(run, {i / 3, static_cast<std::uint64_t>(i), nodes.back().get()});
  }
  std::set<timed_node*> doomed{nodes[1].get()};
  for (std::size_t i = 0; i < 100; i += 2) doomed.insert(nodes[i].get());
  std::vector<timed_node*> taken;
  run.remove_if([&](timed_node* n) { return doomed.count(n) != 0; }, [&](timed_node* n) { taken.push_back(n); });
  std::size_t odd_kept = 0;
  std::vector<timed_node*> expected;
  for (std::size_t i = 3; i < 100; i += 2, ++odd_kept) expected.push_back(nodes[i].get());
  BOOST_TEST(taken.size() == 100u - odd_kept);
  for (timed_node* n : taken) BOOST_TEST(n->heap_index_ == not_in_heap);
  BOOST_TEST(run.front().node == nodes[3].get()); // (F): no hole at the front
  BOOST_TEST((drain(run) == expected));
}

// A run of 200,000 (4.8 MiB of entries) holds its ring in storage mapped for huge pages
// (large_array), through every doubling from 2 MiB up, keeps its order across them, and
// gives all of it back when emptied and shrunk. Where large arrays come from the heap
// (portable fallback, METRONOME_HUGE_PAGES=OFF), nothing is mapped.
BOOST_AUTO_TEST_CASE(a_run_past_2_mib_maps_its_ring_and_gives_it_back) {
  constexpr std::size_t n = 200000;
  const std::size_t before = large_arrays_mapped_bytes();
  due_run run(heap_index_t(1) << 31);
  std::vector<node> nodes(n);
  std::size_t most = 0;
  for (std::size_t i = 0; i < n; ++i) {
    append(run, {static_cast<std::int64_t>(i / 7), i, &nodes[i]});
    most = std::max(most, large_arrays_mapped_bytes() - before);
  }
  // 200,000 entries: a ring of 2^18 slots, 24 bytes each.
  const std::size_t ring_bytes = (std::size_t(1) << 18) * sizeof(delay_entry);
  if (large_arrays_use_huge_pages())
    BOOST_TEST(most >= ring_bytes);
  else
    BOOST_TEST(most == 0u);
  std::size_t in_order = 0;
  for (std::size_t i = 0; !run.empty(); ++i) {
    in_order += run.front().node == &nodes[i] ? 1 : 0;
    run.remove(run.front().node);
  }
  BOOST_TEST(in_order == n);
  run.shrink_if_sparse(64);
  BOOST_TEST(run.capacity() == 0u);
  BOOST_TEST(large_arrays_mapped_bytes() == before);
}

// A full ring that has wrapped round (its front past slot 0) doubles with its order
// kept: the slots past the old end move after it. A sparse one that has wrapped round
// halves with its order kept: its slots move to the start first.
BOOST_AUTO_TEST_CASE(a_wrapped_ring_keeps_its_order_through_a_doubling_and_a_halving) {
  due_run run(heap_index_t(1) << 31);
  std::vector<node> nodes(400);
  std::deque<timed_node*> expected;
  std::size_t next = 0;
  auto add = [&](std::size_t count) {
    for (std::size_t i = 0; i < count; ++i, ++next) {
      append(run, {static_cast<std::int64_t>(next), next, &nodes[next]});
      expected.push_back(&nodes[next]);
    }
  };
  auto take = [&](std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) {
      BOOST_REQUIRE(run.front().node == expected.front());
      run.remove(expected.front());
      expected.pop_front();
    }
  };
  add(64); // a full ring of 64
  take(40);
  add(40); // full again, its front at slot 40
  BOOST_TEST(run.capacity() == 64u);
  add(1); // doubles: 65 from slot 40 on in a ring of 128
  BOOST_TEST(run.capacity() == 128u);
  take(60); // 5 left, from slot 100 on
  add(30);  // 35: past the end, round to the start
  take(5);  // 30 left, from slot 105 round to slot 6
  run.shrink_if_sparse(64); // 30 < 128 / 4
  BOOST_TEST(run.capacity() == 64u);
  add(10);
  BOOST_TEST(run.size() == 40u);
  std::vector<timed_node*> want(expected.begin(), expected.end());
  BOOST_TEST((drain(run) == want));
}

// A mapped ring emptied from the front (a million timeouts cancelled in order) halves
// again and again without losing its order, and what it maps follows its size.
BOOST_AUTO_TEST_CASE(a_mapped_ring_emptied_from_the_front_halves_with_its_order_kept) {
  constexpr std::size_t n = 400000;
  const std::size_t before = large_arrays_mapped_bytes();
  due_run run(heap_index_t(1) << 31);
  std::vector<node> nodes(n);
  for (std::size_t i = 0; i < n; ++i) append(run, {static_cast<std::int64_t>(i), i, &nodes[i]});
  std::size_t in_order = 0, halvings = 0;
  for (std::size_t i = 0; i < n - 1000; ++i) {
    in_order += run.front().node == &nodes[i] ? 1 : 0;
    run.remove(run.front().node);
    const std::size_t cap = run.capacity();
    run.shrink_if_sparse(64);
    halvings += run.capacity() < cap ? 1 : 0;
    if (large_arrays_use_huge_pages() && run.capacity() * sizeof(delay_entry) >= (std::size_t(2) << 20))
      BOOST_REQUIRE(large_arrays_mapped_bytes() - before == ((run.capacity() * sizeof(delay_entry) + 4095) & ~std::size_t(4095)));
  }
  BOOST_TEST(in_order == n - 1000);
  BOOST_TEST(halvings >= 8u); // 2^19 slots down to 2^11
  for (std::size_t i = n - 1000; i < n; ++i) {
    in_order += run.front().node == &nodes[i] ? 1 : 0;
    run.remove(run.front().node);
  }
  BOOST_TEST(in_order == n);
  run.shrink_if_sparse(64);
  BOOST_TEST(large_arrays_mapped_bytes() == before);
}

BOOST_AUTO_TEST_SUITE_END()
