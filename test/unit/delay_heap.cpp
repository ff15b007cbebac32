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
  node(long long due, std::uint64_t seq) : timed_node(nullptr) {
    set_due(mclock::time_point(mclock::duration(due)));
    seq_ = seq;
  }
};
} // namespace

BOOST_AUTO_TEST_SUITE(delay_heap_suite)

BOOST_AUTO_TEST_CASE(pops_in_due_then_sequence_order) {
  std::mt19937 rng(7);
  std::vector<std::unique_ptr<node>> nodes;
  delay_heap heap;
  for (std::uint64_t i = 0; i < 5000; ++i) {
    nodes.push_back(std::make_unique<node>(rng() % 300, i)); // many equal due times
    heap.push(nodes.back().get());
  }
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
  std::vector<std::unique_ptr<node>> nodes;
  delay_heap heap;
  for (std::uint64_t i = 0; i < 2000; ++i) {
    nodes.push_back(std::make_unique<node>(rng() % 10000, i));
    heap.push(nodes.back().get());
  }
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

BOOST_AUTO_TEST_CASE(push_reports_a_new_head) {
  node a(10, 0), b(5, 1), c(7, 2);
  delay_heap heap;
  BOOST_TEST(heap.push(&a));
  BOOST_TEST(heap.push(&b));
  BOOST_TEST(!heap.push(&c));
  BOOST_TEST(heap.top() == &b);
}

BOOST_AUTO_TEST_CASE(remove_if_keeps_heap_order) {
  std::vector<std::unique_ptr<node>> nodes;
  delay_heap heap;
  for (std::uint64_t i = 0; i < 100; ++i) {
    nodes.push_back(std::make_unique<node>(static_cast<long long>((i * 37) % 101), i));
    heap.push(nodes.back().get());
  }
  std::size_t removed = 0;
  heap.remove_if([](timed_node* n) { return n->seq_ % 2 == 0; }, [&](timed_node*) { ++removed; });
  BOOST_TEST(removed == 50u);
  timed_node* prev = nullptr;
  while (!heap.empty()) {
    timed_node* n = heap.pop();
    BOOST_TEST(n->seq_ % 2 == 1u);
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

BOOST_AUTO_TEST_SUITE_END()
