// quad_heap alone: the 4-ary heap of delay-queue entries behind the delay queue's near and
// beyond heaps (src/quad_heap.hpp).
#include "quad_heap.hpp"

#include <boost/test/unit_test.hpp>

#include <memory>
#include <random>
#include <set>
#include <tuple>
#include <vector>

using namespace metronome::detail;

namespace {
struct node : timed_node {
  node() : timed_node(nullptr) {}
};
} // namespace

BOOST_AUTO_TEST_SUITE(quad_heap_suite)

// Random pushes, removals from anywhere, re-keys in place and remove_if against an
// ordered set: the front, the size and every node's slot (tag | position) agree after
// each step; a removed node reads not_in_heap.
BOOST_AUTO_TEST_CASE(random_operations_agree_with_an_ordered_set) {
  constexpr heap_index_t tag = heap_index_t(1) << 29;
  for (unsigned seed = 1; seed <= 10; ++seed) {
    std::mt19937 rng(seed);
    quad_heap heap(tag);
    std::vector<std::unique_ptr<node>> nodes;
    using key = std::tuple<long long, std::uint64_t, timed_node*>;
    std::set<key> model;
    std::vector<delay_entry> where; // each node's key, by node number
    std::uint64_t seq = 0;
    auto check = [&] {
      BOOST_REQUIRE_EQUAL(heap.size(), model.size());
      if (!model.empty()) BOOST_REQUIRE(heap.front().node == std::get<2>(*model.begin()));
      for (const auto& k : model) {
        const heap_index_t at = std::get<2>(k)->heap_index_;
        BOOST_REQUIRE((at & tag) != 0);
        BOOST_REQUIRE((at & ~tag) < heap.size());
      }
    };
    for (int step = 0; step < 3000; ++step) {
      const unsigned op = rng() % 10;
      if (op < 5 || model.empty()) {
        nodes.push_back(std::make_unique<node>());
        const delay_entry e{static_cast<long long>(rng() % 500), seq++, nodes.back().get()};
        heap.reserve_for(heap.size() + 1);
        heap.push(e);
        model.insert({e.due, e.seq, e.node});
      } else if (op < 7) { // remove any
        auto it = model.begin();
        std::advance(it, static_cast<long>(rng() % model.size()));
        timed_node* n = std::get<2>(*it);
        heap.remove_at(n->heap_index_ & ~tag);
        BOOST_REQUIRE(n->heap_index_ == not_in_heap);
        model.erase(it);
      } else if (op < 9) { // re-key in place
        auto it = model.begin();
        std::advance(it, static_cast<long>(rng() % model.size()));
        timed_node* n = std::get<2>(*it);
        const delay_entry e{static_cast<long long>(rng() % 500), seq++, n};
        heap.move_to(n->heap_index_ & ~tag, e);
        model.erase(it);
        model.insert({e.due, e.seq, n});
      } else { // remove_if: the odd sequence numbers
        std::set<timed_node*> odd;
        for (const auto& k : model)
          if (std::get<1>(k) % 2) odd.insert(std::get<2>(k));
        std::size_t called = 0;
        auto pred = [&](timed_node* n) { return odd.count(n) != 0; };
        auto f = [&](timed_node* n) {
          BOOST_REQUIRE(n->heap_index_ == not_in_heap);
          ++called;
        };
        heap.remove_if(pred, f);
        BOOST_REQUIRE_EQUAL(called, odd.size());
        for (auto it = model.begin(); it != model.end();)
          it = std::get<1>(*it) % 2 ? model.erase(it) : std::next(it);
      }
      check();
    }
    while (!model.empty()) { // pops in key order
      BOOST_REQUIRE(heap.front().node == std::get<2>(*model.begin()));
      heap.remove_at(0);
      model.erase(model.begin());
    }
    BOOST_TEST(heap.empty());
  }
}

// Storage: refused past max_size with nothing changed; given back down to twice what is
// kept once under a quarter used, and all of it when nothing is kept.
BOOST_AUTO_TEST_CASE(storage_is_bounded_and_given_back) {
  quad_heap heap(0);
  BOOST_CHECK_THROW(heap.reserve_for(quad_heap::max_size), std::length_error);
  BOOST_TEST(heap.capacity() == 0u);
  std::vector<std::unique_ptr<node>> nodes;
  for (std::uint64_t i = 0; i < 4096; ++i) {
    nodes.push_back(std::make_unique<node>());
    heap.reserve_for(heap.size() + 1);
    heap.push({static_cast<long long>(4096 - i), i, nodes.back().get()});
  }
  BOOST_TEST(heap.front().node == nodes.back().get());
  while (heap.size() > 100) heap.remove_at(heap.size() - 1);
  heap.shrink(heap.size(), 256);
  BOOST_TEST(heap.capacity() <= 200u);
  BOOST_TEST(heap.size() == 100u);
  while (!heap.empty()) heap.remove_at(0);
  heap.shrink(0, 16);
  BOOST_TEST(heap.capacity() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
