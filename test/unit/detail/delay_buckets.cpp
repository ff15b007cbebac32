// delay_buckets alone: the delay queue's per-unit lists over its window
// (src/delay_buckets.hpp).
#include "delay_buckets.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

using namespace metronome::detail;

namespace {
struct node : timed_node {
  node() : timed_node(nullptr) {}
};
constexpr heap_index_t tag = heap_index_t(1) << 30;
constexpr long long unit_ns = 1LL << delay_buckets::unit_shift;

// A due time in unit `u` (as unit_of counts), `offset` ns into it.
long long due_in(std::uint64_t u, long long offset = 0) {
  return static_cast<long long>((u << delay_buckets::unit_shift) ^ (std::uint64_t(1) << 63)) + offset;
}
void add(delay_buckets& b, const delay_entry& e) {
  b.reserve(e);
  b.add(e);
}
} // namespace

BOOST_AUTO_TEST_SUITE(delay_buckets_suite)

// unit_of keeps the order of due times over the whole range of the clock.
BOOST_AUTO_TEST_CASE(units_keep_the_order_of_due_times) {
  const long long dues[] = {std::numeric_limits<long long>::min(), -unit_ns - 1, -1, 0, unit_ns - 1, unit_ns,
                            std::numeric_limits<long long>::max()};
  for (std::size_t i = 1; i < std::size(dues); ++i)
    BOOST_TEST(delay_buckets::unit_of(dues[i - 1]) <= delay_buckets::unit_of(dues[i]));
  BOOST_TEST(delay_buckets::unit_of(0) == delay_buckets::unit_of(unit_ns - 1));
  BOOST_TEST(delay_buckets::unit_of(0) + 1 == delay_buckets::unit_of(unit_ns));
  BOOST_TEST(delay_buckets::unit_of(due_in(12345, 7)) == 12345u);
}

// (B): earliest() searches from base()'s bucket round the ring, so a unit late in the
// window whose bucket number is below base()'s is found after the early ones.
BOOST_AUTO_TEST_CASE(earliest_goes_round_from_the_base) {
  for (std::uint64_t base : {std::uint64_t(1000), std::uint64_t(4096 * 7 + 4000), std::uint64_t(4096 * 3 + 63)}) {
    delay_buckets b(tag);
    b.set_base(base);
    node late, mid, early;
    add(b, {due_in(base + 4095), 0, &late}); // bucket just before base's
    add(b, {due_in(base + 100), 1, &mid});
    BOOST_TEST(b.earliest() == base + 100);
    add(b, {due_in(base + 1, 5), 2, &early});
    BOOST_TEST(b.earliest() == base + 1);
    BOOST_TEST((early.heap_index_ & tag) != 0);
    b.remove(&early);
    BOOST_TEST(early.heap_index_ == not_in_heap);
    BOOST_TEST(b.earliest() == base + 100);
    b.remove(&mid);
    BOOST_TEST(b.earliest() == base + 4095);
    b.set_base(base + 4000); // the window moves on (before the earliest)
    BOOST_TEST(b.earliest() == base + 4095);
    b.remove(&late);
    BOOST_TEST(b.empty());
  }
}

// take() empties one bucket, handing over each of its entries once, and leaves the
// others; a unit's entries share its bucket however many there are.
BOOST_AUTO_TEST_CASE(take_empties_one_bucket) {
  delay_buckets b(tag);
  b.set_base(50);
  std::vector<std::unique_ptr<node>> nodes;
  for (int i = 0; i < 30; ++i) {
    nodes.push_back(std::make_unique<node>());
    add(b, {due_in(50 + static_cast<std::uint64_t>(i % 3), i), static_cast<std::uint64_t>(i), nodes.back().get()});
  }
  std::set<timed_node*> got;
  b.take(51, [&](const delay_entry& e) {
    BOOST_TEST(delay_buckets::unit_of(e.due) == 51u);
    got.insert(e.node);
  });
  BOOST_TEST(got.size() == 10u);
  BOOST_TEST(b.size() == 20u);
  BOOST_TEST(b.earliest() == 50u);
  b.take(50, [](const delay_entry&) {});
  BOOST_TEST(b.earliest() == 52u);
  // The chunks of a bucket taken go back to the pool: its 10 nodes back in another unit
  // grow nothing.
  const std::size_t capacity = b.capacity();
  b.set_base(52);
  for (std::size_t i = 1; i < 30; i += 3) add(b, {due_in(900), 100, nodes[i].get()});
  BOOST_TEST(b.capacity() == capacity);
  BOOST_TEST(b.earliest() == 52u);
  BOOST_TEST(b.size() == 20u);
}

// The chunk numbers stay below the tag (I): when they run out, reserve() refuses with
// std::length_error and nothing changes; a chunk given back is taken again.
BOOST_AUTO_TEST_CASE(chunk_numbers_stay_below_the_tag) {
  delay_buckets b(heap_index_t(1) << (delay_buckets::chunk_bits + 2)); // 4 chunks
  std::vector<std::unique_ptr<node>> nodes;
  for (int i = 0; i < 6; ++i) nodes.push_back(std::make_unique<node>());
  for (std::uint64_t u = 0; u < 4; ++u) add(b, {due_in(u), u, nodes[u].get()}); // a chunk each
  add(b, {due_in(0, 1), 4, nodes[4].get()});                                    // its tail has room
  BOOST_CHECK_THROW(b.reserve({due_in(7), 5, nodes[5].get()}), std::length_error);
  BOOST_TEST(b.size() == 5u);
  BOOST_TEST(b.capacity() == 4 * delay_buckets::chunk_size);
  b.remove(nodes[3].get()); // unit 3's chunk back to the pool
  add(b, {due_in(7), 5, nodes[5].get()});
  BOOST_TEST(b.capacity() == 4 * delay_buckets::chunk_size);
  BOOST_TEST(b.size() == 5u);
}

// A bucket longer than a chunk: removals anywhere keep each node's index on its entry (the
// last entry moves into the place left, and an emptied tail chunk goes back), and a take
// hands over exactly the entries left.
BOOST_AUTO_TEST_CASE(a_bucket_over_many_chunks_keeps_its_entries) {
  delay_buckets b(tag);
  b.set_base(0);
  std::mt19937 rng(3);
  std::vector<std::unique_ptr<node>> nodes;
  std::set<timed_node*> in;
  for (int i = 0; i < 300; ++i) {
    nodes.push_back(std::make_unique<node>());
    add(b, {due_in(2, i), static_cast<std::uint64_t>(i), nodes.back().get()});
    in.insert(nodes.back().get());
  }
  BOOST_TEST(b.capacity() == (300 + delay_buckets::chunk_size - 1) / delay_buckets::chunk_size * delay_buckets::chunk_size);
  std::shuffle(nodes.begin(), nodes.end(), rng);
  for (std::size_t i = 0; i < 200; ++i) {
    b.remove(nodes[i].get());
    BOOST_REQUIRE(nodes[i]->heap_index_ == not_in_heap);
    in.erase(nodes[i].get());
  }
  BOOST_TEST(b.size() == 100u);
  std::set<timed_node*> got;
  b.take(2, [&](const delay_entry& e) { BOOST_REQUIRE(got.insert(e.node).second); });
  BOOST_TEST((got == in));
  BOOST_TEST(b.empty());
  b.shrink_if_sparse(0);
  BOOST_TEST(b.capacity() == 0u);
}

// Random adds, removals, takes, moves of the base and remove_if against a model of
// units: earliest() is the model's least unit and the bitmaps (M) never lose a bucket.
BOOST_AUTO_TEST_CASE(random_operations_agree_with_a_model) {
  for (unsigned seed = 1; seed <= 8; ++seed) {
    std::mt19937 rng(seed);
    delay_buckets b(tag);
    std::uint64_t base = rng() % 100000;
    b.set_base(base);
    std::vector<std::unique_ptr<node>> nodes;
    std::map<timed_node*, std::uint64_t> model; // node -> unit
    auto check = [&] {
      BOOST_REQUIRE_EQUAL(b.size(), model.size());
      if (model.empty()) return;
      std::uint64_t least = ~std::uint64_t(0);
      for (auto& [n, u] : model) least = std::min(least, u);
      BOOST_REQUIRE_EQUAL(b.earliest(), least);
    };
    for (int step = 0; step < 4000; ++step) {
      const unsigned op = rng() % 12;
      if (op < 6 || model.empty()) {
        nodes.push_back(std::make_unique<node>());
        // Spread over the window, or bunched in a few units.
        const std::uint64_t u = base + (op % 2 ? rng() % delay_buckets::bucket_count : rng() % 4);
        add(b, {due_in(u, static_cast<long long>(rng() % unit_ns)), 0, nodes.back().get()});
        model[nodes.back().get()] = u;
      } else if (op < 9) {
        auto it = model.begin();
        std::advance(it, static_cast<long>(rng() % model.size()));
        b.remove(it->first);
        BOOST_REQUIRE(it->first->heap_index_ == not_in_heap);
        model.erase(it);
      } else if (op < 10) { // take the earliest bucket
        const std::uint64_t u = b.earliest();
        b.take(u, [&](const delay_entry& e) {
          BOOST_REQUIRE(model.at(e.node) == u);
          e.node->heap_index_ = not_in_heap;
          model.erase(e.node);
        });
      } else if (op < 11) { // move the base up to the earliest, keeping (B)
        std::uint64_t least = base + delay_buckets::bucket_count;
        std::uint64_t most = base;
        for (auto& [n, u] : model) least = std::min(least, u), most = std::max(most, u);
        const std::uint64_t lowest = most + 1 > delay_buckets::bucket_count ? most + 1 - delay_buckets::bucket_count : 0;
        if (least > base && least >= lowest) {
          base = std::max(lowest, base + rng() % (least - base + 1));
          b.set_base(base);
        }
      } else {
        b.remove_if([&](timed_node*) { return rng() % 5 == 0; },
                    [&](timed_node* n) { model.erase(n); });
      }
      check();
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
