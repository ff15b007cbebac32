#include <metronome/detail/delay_heap.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <memory>
#include <random>
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
bool push(delay_heap& heap, timed_node* n) { return heap.push(n, static_cast<node*>(n)->seq); }
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
  for (std::size_t i = 1000; i < 2000; ++i) BOOST_TEST(nodes[i]->heap_index_ < heap.size());
  timed_node* prev = nullptr;
  while (!heap.empty()) {
    timed_node* n = heap.pop();
    if (prev) BOOST_TEST(!due_before(n, prev));
    prev = n;
  }
}

// reset() re-keys a node where it stands: earlier and later due times, new sequence
// numbers (a re-keyed node counts as scheduled now among equal due times), the head
// reported, and the heap pops in order afterwards with nothing allocated.
BOOST_AUTO_TEST_CASE(rekey_moves_a_node_up_or_down_and_reports_the_head) {
  std::mt19937 rng(5);
  delay_heap heap;
  auto nodes = fill(heap, 3000, [&](std::uint64_t) { return rng() % 1000; });
  const auto capacity = heap.capacity();
  std::uint64_t seq = 3000;
  for (int i = 0; i < 2000; ++i) {
    node* n = nodes[rng() % nodes.size()].get();
    n->seq = seq;
    n->set_due(mclock::time_point(mclock::duration(static_cast<long long>(rng() % 1200))));
    const bool head = heap.rekey(n, seq++);
    BOOST_TEST(head == (heap.top() == n));
  }
  node* first = nodes[0].get();
  first->seq = seq;
  first->set_due(mclock::time_point(mclock::duration(-1)));
  BOOST_TEST(heap.rekey(first, seq++));
  BOOST_TEST(heap.capacity() == capacity);
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

BOOST_AUTO_TEST_SUITE_END()
