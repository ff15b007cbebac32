#include "delay_heap.hpp"

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <tuple>
#include <vector>

using mclock = metronome::clock;
using namespace metronome::detail;

namespace {
struct node : timed_node {
  node(long long due, std::uint64_t s) : timed_node(nullptr), seq(s) {
    set_due(mclock::time_point(mclock::duration(due)));
  }
  std::uint64_t seq;
};
// `now`: the pool's time at the push (where the buckets' window starts).
bool push(delay_heap& heap, timed_node* n, long long now = 0) { return heap.push(n, static_cast<node*>(n)->seq, now); }
bool due_before(const timed_node* a, const timed_node* b) {
  return a->due() < b->due() ||
         (a->due() == b->due() && static_cast<const node*>(a)->seq < static_cast<const node*>(b)->seq);
}
// Pushes `count` nodes, node i with due time due_of(i) and sequence number i.
template <class DueOf>
std::vector<std::unique_ptr<node>> fill(delay_heap& heap, std::uint64_t count, DueOf due_of) {
  std::vector<std::unique_ptr<node>> nodes;
  for (std::uint64_t i = 0; i < count; ++i) {
    nodes.push_back(std::make_unique<node>(static_cast<long long>(due_of(i)), i));
    push(heap, nodes.back().get());
  }
  return nodes;
}
// A due time for the random tests: mostly "now + one length", else near (0-200 ns), far
// (up to 2^40 ns, about 18 minutes), or an end of the clock's range.
long long any_due(std::mt19937& rng, long long clock) {
  switch (rng() % 8) {
  case 0: case 1: case 2: case 3: return clock + 50;
  case 4: case 5: return clock + static_cast<long long>(rng() % 200);
  case 6: return clock + static_cast<long long>((std::uint64_t(rng()) << 8 | rng() % 256) % (std::uint64_t(1) << (rng() % 41)));
  default: return rng() % 2 ? std::numeric_limits<long long>::max() - static_cast<long long>(rng() % 4)
                             : std::numeric_limits<long long>::min() + static_cast<long long>(rng() % 4);
  }
}
} // namespace

BOOST_AUTO_TEST_SUITE(delay_heap_suite)

BOOST_AUTO_TEST_CASE(pops_in_due_then_sequence_order) {
  std::mt19937 rng(7);
  delay_heap heap;
  auto nodes = fill(heap, 5000, [&](std::uint64_t) { return rng() % 300; }); // many equal due times
  timed_node* prev = nullptr;
  std::size_t popped = 0;
  while (!heap.empty()) {
    timed_node* n = heap.pop();
    BOOST_TEST(n->heap_index_ == not_in_heap);
    if (prev) BOOST_TEST(!due_before(n, prev));
    prev = n;
    ++popped;
  }
  BOOST_TEST(popped == 5000u);
}

BOOST_AUTO_TEST_CASE(removes_any_node_and_keeps_indices_consistent) {
  std::mt19937 rng(11);
  delay_heap heap;
  auto nodes = fill(heap, 2000, [&](std::uint64_t) { return rng() % 10000; });
  std::shuffle(nodes.begin(), nodes.end(), rng);
  for (std::size_t i = 0; i < 1000; ++i) {
    heap.remove(nodes[i].get());
    BOOST_TEST(nodes[i]->heap_index_ == not_in_heap);
  }
  BOOST_TEST(heap.size() == 1000u);
  for (std::size_t i = 1000; i < 2000; ++i) BOOST_TEST(nodes[i]->heap_index_ != not_in_heap);
  timed_node* prev = nullptr;
  while (!heap.empty()) {
    timed_node* n = heap.pop();
    if (prev) BOOST_TEST(!due_before(n, prev));
    prev = n;
  }
}

// reset() re-keys a node: earlier and later due times, new sequence numbers (a
// re-keyed node counts as scheduled now among equal due times), the head reported, and
// the queue pops in order afterwards.
BOOST_AUTO_TEST_CASE(rekey_moves_a_node_up_or_down_and_reports_the_head) {
  std::mt19937 rng(5);
  delay_heap heap;
  auto nodes = fill(heap, 3000, [&](std::uint64_t) { return rng() % 1000; });
  std::uint64_t seq = 3000;
  auto rekey = [&](node* n, long long due) {
    n->seq = seq;
    bool head = false;
    BOOST_TEST(heap.rekey(n, due, seq++, head));
    n->set_due(mclock::time_point(mclock::duration(due)));
    return head;
  };
  for (int i = 0; i < 2000; ++i) {
    node* n = nodes[rng() % nodes.size()].get();
    const bool head = rekey(n, static_cast<long long>(rng() % 1200));
    BOOST_TEST(head == (heap.top() == n));
  }
  BOOST_TEST(rekey(nodes[0].get(), -1));
  timed_node* prev = nullptr;
  std::size_t popped = 0;
  while (!heap.empty()) {
    timed_node* n = heap.pop();
    if (prev) BOOST_TEST(!due_before(n, prev));
    prev = n;
    ++popped;
  }
  BOOST_TEST(popped == 3000u);
}

// Nodes that come in due order (waits or timeouts of one length) go to the run; a reset
// of the run's last node to a later time stays in place, allocating nothing.
BOOST_AUTO_TEST_CASE(nodes_in_due_order_cost_no_reordering) {
  delay_heap heap;
  auto nodes = fill(heap, 1000, [](std::uint64_t i) { return 100 + i; });
  const auto capacity = heap.capacity();
  node* last = nodes.back().get();
  bool head = true;
  BOOST_TEST(heap.rekey(last, 5000, 1000, head));
  last->seq = 1000;
  last->set_due(mclock::time_point(mclock::duration(5000)));
  BOOST_TEST(!head);
  BOOST_TEST(heap.capacity() == capacity);
  for (std::size_t i = 0; i < nodes.size(); ++i) BOOST_TEST(heap.pop() == nodes[i].get());
  BOOST_TEST(heap.empty());
}

// Removals in any order from the run leave holes that are skipped at the front and
// squeezed out, and the storage is given back once the queue empties out.
BOOST_AUTO_TEST_CASE(holes_left_by_removals_are_squeezed_and_storage_given_back) {
  std::mt19937 rng(3);
  delay_heap heap;
  auto nodes = fill(heap, 100000, [](std::uint64_t i) { return 1000 + i; });
  const auto full = heap.capacity();
  std::shuffle(nodes.begin(), nodes.end(), rng);
  for (std::size_t i = 0; i + 10 < nodes.size(); ++i) {
    heap.remove(nodes[i].get());
    heap.shrink_if_sparse();
  }
  BOOST_TEST(heap.size() == 10u);
  BOOST_TEST(heap.capacity() < full / 100);
  std::vector<timed_node*> left;
  while (!heap.empty()) left.push_back(heap.pop());
  BOOST_TEST(std::is_sorted(left.begin(), left.end(), due_before));
  for (std::size_t i = nodes.size() - 10; i < nodes.size(); ++i)
    BOOST_TEST((std::find(left.begin(), left.end(), nodes[i].get()) != left.end()));
  heap.shrink_if_sparse();
  BOOST_TEST(heap.capacity() <= 512u);
}

// Random operations against a reference (an ordered set of the keys): pushes in due
// order and out of it (due times from the near future to minutes away, and the ends of
// the clock's range), pops, removals, re-keys, remove_if, drain. The head, the size and
// each node's "queued" mark agree with the reference after every step.
BOOST_AUTO_TEST_CASE(random_operations_agree_with_an_ordered_set) {
  bool bucketed_seen = false, beyond_seen = false; // every part took part
  for (unsigned seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    delay_heap heap;
    std::vector<std::unique_ptr<node>> nodes;
    using key = std::tuple<long long, std::uint64_t, node*>;
    std::set<key> model;
    std::uint64_t seq = 0;
    long long clock = 0;
    auto key_of = [](node* n) { return key{n->due().time_since_epoch().count(), n->seq, n}; };
    auto check = [&] {
      BOOST_REQUIRE_EQUAL(heap.size(), model.size());
      BOOST_REQUIRE_EQUAL(heap.empty(), model.empty());
      if (!model.empty()) {
        BOOST_REQUIRE(heap.top() == std::get<2>(*model.begin()));
        BOOST_REQUIRE_EQUAL(heap.top_due(), std::get<0>(*model.begin()));
      }
    };
    auto queued = [&] {
      std::vector<node*> q;
      for (const auto& k : model) q.push_back(std::get<2>(k));
      return q;
    };
    for (int step = 0; step < 4000; ++step) {
      const unsigned op = rng() % 100;
      clock += static_cast<long long>(rng() % 3);
      if (rng() % 50 == 0) { // time moves on by up to 2^31 ns: the buckets' window follows
        clock += static_cast<long long>(rng() % (1u << 31));
        heap.advance(clock);
      }
      if (op < 40 || model.empty()) { // push: mostly "now + one length", sometimes anything
        const long long due = any_due(rng, clock);
        nodes.push_back(std::make_unique<node>(due, seq++));
        node* n = nodes.back().get();
        const bool head = push(heap, n, clock);
        model.insert(key_of(n));
        BOOST_REQUIRE(head == (std::get<2>(*model.begin()) == n));
      } else if (op < 60) { // pop
        timed_node* n = heap.pop();
        BOOST_REQUIRE(n == std::get<2>(*model.begin()));
        BOOST_REQUIRE(n->heap_index_ == not_in_heap);
        model.erase(model.begin());
      } else if (op < 80) { // remove any
        auto q = queued();
        node* n = q[rng() % q.size()];
        heap.remove(n);
        BOOST_REQUIRE(n->heap_index_ == not_in_heap);
        model.erase(key_of(n));
      } else if (op < 97) { // re-key any
        auto q = queued();
        node* n = q[rng() % q.size()];
        const long long any = any_due(rng, clock);
        const long long due = rng() % 2 ? clock + 50 : any > std::numeric_limits<long long>::min() + 20 ? any - 20 : any;
        model.erase(key_of(n));
        bool head = false;
        BOOST_REQUIRE(heap.rekey(n, due, seq, head));
        n->seq = seq++;
        n->set_due(mclock::time_point(mclock::duration(due)));
        model.insert(key_of(n));
        BOOST_REQUIRE(head == (std::get<2>(*model.begin()) == n));
      } else { // remove_if: a third of them
        const unsigned pick = rng() % 3;
        std::size_t removed = 0;
        heap.remove_if([&](timed_node* n) { return static_cast<node*>(n)->seq % 3 == pick; },
                       [&](timed_node* n) {
                         BOOST_REQUIRE(n->heap_index_ == not_in_heap);
                         model.erase(key_of(static_cast<node*>(n)));
                         ++removed;
                       });
        for (const auto& k : model) BOOST_REQUIRE(std::get<1>(k) % 3 != pick);
      }
      if (step % 7 == 0) heap.shrink_if_sparse();
      check();
      bucketed_seen = bucketed_seen || heap.bucketed() > 0;
      beyond_seen = beyond_seen || heap.beyond() > 0;
      for (const auto& k : model) BOOST_REQUIRE(std::get<2>(k)->heap_index_ != not_in_heap);
    }
    std::vector<timed_node*> out;
    heap.drain([&](timed_node* n) { out.push_back(n); });
    BOOST_REQUIRE_EQUAL(out.size(), model.size());
    std::size_t i = 0;
    for (const auto& k : model) BOOST_REQUIRE(out[i++] == std::get<2>(k));
    BOOST_REQUIRE(heap.empty());
  }
  BOOST_TEST(bucketed_seen);
  BOOST_TEST(beyond_seen);
}

BOOST_AUTO_TEST_CASE(push_reports_a_new_head) {
  node a(10, 0), b(5, 1), c(7, 2);
  delay_heap heap;
  BOOST_TEST(push(heap, &a));
  BOOST_TEST(push(heap, &b));
  BOOST_TEST(!push(heap, &c));
  BOOST_TEST(heap.top() == &b);
}

BOOST_AUTO_TEST_CASE(remove_if_keeps_heap_order) {
  delay_heap heap;
  auto nodes = fill(heap, 100, [](std::uint64_t i) { return (i * 37) % 101; });
  std::size_t removed = 0;
  heap.remove_if([](timed_node* n) { return static_cast<node*>(n)->seq % 2 == 0; }, [&](timed_node*) { ++removed; });
  BOOST_TEST(removed == 50u);
  timed_node* prev = nullptr;
  while (!heap.empty()) {
    timed_node* n = heap.pop();
    BOOST_TEST(static_cast<node*>(n)->seq % 2 == 1u);
    if (prev) BOOST_TEST(!due_before(n, prev));
    prev = n;
  }
}

BOOST_AUTO_TEST_CASE(saturating_add_never_wraps) {
  auto now = mclock::time_point(std::chrono::hours(1));
  BOOST_TEST((saturating_add(now, std::chrono::nanoseconds::max()) == mclock::time_point::max()));
  BOOST_TEST((saturating_add(now, std::chrono::hours::max()) == mclock::time_point::max()));
  BOOST_TEST((saturating_add(now, std::chrono::seconds(-5)) == now));
  BOOST_TEST((saturating_add(now, std::chrono::milliseconds(3)) == now + std::chrono::milliseconds(3)));
  BOOST_TEST((saturating_add(mclock::time_point::max() - std::chrono::nanoseconds(1), std::chrono::seconds(1)) ==
              mclock::time_point::max()));
}

// Any source duration converts without undefined behaviour: finer than a nanosecond,
// narrow or unsigned counts, floating point (NaN is zero, infinities saturate).
BOOST_AUTO_TEST_CASE(saturating_duration_takes_any_source_duration) {
  using metronome::detail::saturating_duration;
  using ns = std::chrono::nanoseconds;
  BOOST_TEST((saturating_duration(std::chrono::duration<long long, std::pico>(2999)) == ns(2)));
  BOOST_TEST((saturating_duration(std::chrono::duration<long long, std::pico>(-2999)) == ns(-2)));
  BOOST_TEST((saturating_duration(std::chrono::duration<long long, std::atto>(std::numeric_limits<long long>::max())) ==
              ns(9223372036LL)));
  BOOST_TEST((saturating_duration(std::chrono::duration<int>(std::numeric_limits<int>::max())) ==
              ns(std::numeric_limits<int>::max() * 1'000'000'000LL)));
  BOOST_TEST((saturating_duration(std::chrono::duration<unsigned long long, std::milli>(~0ull)) == ns::max()));
  BOOST_TEST((saturating_duration(std::chrono::hours::min()) == ns::min()));
  BOOST_TEST((saturating_duration(std::chrono::duration<double>(std::nan(""))) == ns::zero()));
  BOOST_TEST((saturating_duration(std::chrono::duration<double>(HUGE_VAL)) == ns::max()));
  BOOST_TEST((saturating_duration(std::chrono::duration<double>(-HUGE_VAL)) == ns::min()));
  BOOST_TEST((saturating_duration(std::chrono::duration<double, std::milli>(1.5)) == ns(1'500'000)));
  BOOST_TEST((saturating_add(mclock::time_point(std::chrono::hours(1)), std::chrono::duration<double>(std::nan(""))) ==
              mclock::time_point(std::chrono::hours(1))));
}

// shutdown_now() hands back delayed work in this order.
BOOST_AUTO_TEST_CASE(drain_gives_due_then_fifo_order) {
  std::mt19937 rng(11);
  delay_heap heap;
  auto nodes = fill(heap, 3000, [&](std::uint64_t) { return rng() % 100; }); // many equal due times
  std::vector<timed_node*> out;
  heap.drain([&](timed_node* n) { out.push_back(n); });
  BOOST_TEST(heap.empty());
  BOOST_REQUIRE(out.size() == 3000u);
  for (std::size_t i = 1; i < out.size(); ++i) {
    BOOST_TEST(!due_before(out[i], out[i - 1]));
    BOOST_TEST(out[i]->heap_index_ == not_in_heap);
  }
}

// With a million-timer spread (random delays of 0-200 ms, pushed at the same time), the
// nodes wait in buckets and the near heap holds only the earliest: every node still comes
// out in order, also after 5,000 cancels of any of them, and the storage goes back.
BOOST_AUTO_TEST_CASE(spread_nodes_wait_in_buckets_and_come_out_in_order) {
  std::mt19937 rng(5);
  delay_heap heap;
  const long long start = 3'000'000'000'000LL;
  std::vector<std::unique_ptr<node>> nodes;
  for (std::uint64_t i = 0; i < 20000; ++i) {
    nodes.push_back(std::make_unique<node>(start + static_cast<long long>(rng() % 200'000'000), i));
    push(heap, nodes.back().get(), start);
  }
  BOOST_TEST(heap.size() == 20000u);
  BOOST_TEST(heap.bucketed() > 18000u); // the run and the near heap hold the few records
  std::shuffle(nodes.begin(), nodes.end(), rng);
  for (std::size_t i = 0; i < 5000; ++i) {
    heap.remove(nodes[i].get());
    BOOST_TEST(nodes[i]->heap_index_ == not_in_heap);
  }
  std::vector<timed_node*> out;
  while (!heap.empty()) {
    heap.advance(heap.top_due()); // the pool's time reaches each node as it pops
    out.push_back(heap.pop());
  }
  BOOST_TEST(out.size() == 15000u);
  BOOST_TEST(std::is_sorted(out.begin(), out.end(), due_before));
  BOOST_TEST(heap.bucketed() == 0u);
  heap.shrink_if_sparse();
  BOOST_TEST(heap.capacity() <= 1024u); // the arena and the near heap's room given back
}

// A quarter of a million nodes out of order in one unit (262 us) wait in one bucket, a
// chain of chunks, and come out in order.
BOOST_AUTO_TEST_CASE(a_crowded_unit_waits_in_one_bucket_and_comes_out_in_order) {
  delay_heap heap;
  const long long start = 5'000'000'000'000LL & ~((1LL << delay_heap::unit_shift) - 1); // a unit's start
  constexpr long long unit = 1LL << delay_heap::unit_shift;
  constexpr std::uint64_t count = (std::uint64_t(1) << 18) + 1000;
  std::vector<std::unique_ptr<node>> nodes;
  nodes.reserve(count + 2);
  // The run's last is five units on, the near heap's front in the first unit: what comes
  // between waits in buckets.
  nodes.push_back(std::make_unique<node>(start + 5 * unit, 0));
  push(heap, nodes.back().get(), start);
  nodes.push_back(std::make_unique<node>(start, 1));
  push(heap, nodes.back().get(), start);
  for (std::uint64_t i = 0; i < count; ++i) { // due times falling in the second unit: each off the run
    const long long offset = static_cast<long long>((count - 1 - i) * std::uint64_t(unit - 1) / count);
    nodes.push_back(std::make_unique<node>(start + unit + offset, i + 2));
    push(heap, nodes.back().get(), start);
  }
  BOOST_TEST(heap.size() == count + 2);
  BOOST_TEST(heap.bucketed() == count);
  std::vector<timed_node*> out;
  out.reserve(count + 2);
  while (!heap.empty()) out.push_back(heap.pop());
  BOOST_TEST(out.size() == count + 2);
  BOOST_TEST(std::is_sorted(out.begin(), out.end(), due_before));
}

// Nodes due after the window (a second ahead) wait in the beyond heap and move into
// buckets as the window follows the time, whole units at a time; a jump of the time past
// some of them puts those in the near heap. Order holds throughout.
BOOST_AUTO_TEST_CASE(beyond_nodes_move_into_the_window_as_time_moves) {
  std::mt19937 rng(9);
  delay_heap heap;
  const long long start = 1'000'000'000LL, second = 1'000'000'000LL;
  std::vector<std::unique_ptr<node>> nodes;
  for (std::uint64_t i = 0; i < 6000; ++i) {
    nodes.push_back(std::make_unique<node>(start + second + static_cast<long long>(rng() % (10 * second)), i));
    push(heap, nodes.back().get(), start);
  }
  BOOST_TEST(heap.beyond() > 5000u);
  heap.advance(start + 3 * second); // about 2/10 of them come within the window
  BOOST_TEST(heap.beyond() < 5000u);
  BOOST_TEST(heap.bucketed() > 0u);
  heap.advance(start + 6 * second); // a jump past some of them
  std::vector<timed_node*> out;
  while (!heap.empty()) out.push_back(heap.pop());
  BOOST_TEST(out.size() == 6000u);
  BOOST_TEST(std::is_sorted(out.begin(), out.end(), due_before));
}

// A node re-keyed between the parts (buckets, the near heap, beyond the window) lands
// where its new key puts it, and reports the head.
BOOST_AUTO_TEST_CASE(rekey_moves_nodes_between_the_parts) {
  delay_heap heap;
  const long long ms = 1'000'000, start = 5'000 * ms;
  node a(start + 500 * ms, 0), h(start + 10 * ms, 1), c(start + 900 * ms, 2), b(start + 100 * ms, 3),
      d(start + 5'000 * ms, 4);
  push(heap, &a, start); // the run
  push(heap, &h, start); // before the run's last: a bucket, taken into the near heap
  push(heap, &c, start); // the run
  push(heap, &b, start); // a bucket
  push(heap, &d, start); // the run
  BOOST_TEST(heap.bucketed() == 1u);
  bool head = false;
  BOOST_TEST(heap.rekey(&b, start + 5 * ms, 5, head)); // bucket -> the head
  b.seq = 5;
  b.set_due(mclock::time_point(mclock::duration(start + 5 * ms)));
  BOOST_TEST(head);
  BOOST_TEST(heap.rekey(&h, start + 3'000 * ms, 6, head)); // in the near heap, in place: later
  h.seq = 6;
  h.set_due(mclock::time_point(mclock::duration(start + 3'000 * ms)));
  BOOST_TEST(!head);
  BOOST_TEST(heap.rekey(&a, start + 2'000 * ms, 7, head)); // run -> beyond the window
  a.seq = 7;
  a.set_due(mclock::time_point(mclock::duration(start + 2'000 * ms)));
  BOOST_TEST(!head);
  const std::vector<timed_node*> want{&b, &c, &a, &h, &d};
  for (timed_node* n : want) BOOST_TEST(heap.pop() == n);
  BOOST_TEST(heap.empty());
}

BOOST_AUTO_TEST_SUITE_END()
