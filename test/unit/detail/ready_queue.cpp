#include "ready_queue.hpp"
#include <metronome/detail/test_hooks.hpp>

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <ctime>
#include <pthread.h>
#include <memory>
#include <thread>
#include <vector>

using namespace metronome::detail;

namespace {
struct item : task_base {
  item(int p, int s) : task_base(nullptr), producer(p), seq(s) {}
  int producer;
  int seq;
};
} // namespace

BOOST_AUTO_TEST_SUITE(ready_queue_suite)

BOOST_AUTO_TEST_CASE(is_fifo_for_one_producer) {
  ready_queue q;
  std::vector<std::unique_ptr<item>> items;
  for (int i = 0; i < 100; ++i) {
    items.push_back(std::make_unique<item>(0, i));
    q.push(items.back().get());
  }
  BOOST_TEST(q.size() == 100u);
  for (int i = 0; i < 100; ++i) {
    auto* t = static_cast<item*>(q.pop_wait());
    BOOST_REQUIRE(t);
    BOOST_TEST(t->seq == i);
  }
  BOOST_TEST(q.empty());
  BOOST_TEST(q.pop_wait() == nullptr);
}

BOOST_AUTO_TEST_CASE(unlink_takes_a_node_out_of_the_middle_but_never_the_last) {
  ready_queue q;
  std::vector<std::unique_ptr<item>> items;
  for (int i = 0; i < 5; ++i) {
    items.push_back(std::make_unique<item>(0, i));
    q.push(items.back().get());
  }
  task_base* prev = nullptr;
  {
    ready_queue::consumer_guard g(q);
    auto seq_is = [](int s) { return [s](task_base* n) { return static_cast<item*>(n)->seq == s; }; };
    task_base* n = q.find(seq_is(2), prev, g);
    BOOST_REQUIRE(n == items[2].get());
    BOOST_TEST(q.unlink(prev, n, g));
    n = q.find(seq_is(0), prev, g); // the head
    BOOST_TEST(q.unlink(prev, n, g));
    n = q.find(seq_is(4), prev, g); // the last: a producer may be linking behind it
    BOOST_TEST(!q.unlink(prev, n, g));
    BOOST_TEST(q.find(seq_is(2), prev, g) == nullptr);
  }
  BOOST_TEST(q.size() == 3u);
  std::vector<int> rest;
  while (task_base* t = q.pop_wait()) rest.push_back(static_cast<item*>(t)->seq);
  BOOST_TEST((rest == std::vector<int>{1, 3, 4}));
  BOOST_TEST(q.empty());
}

#if defined(METRONOME_TEST_HOOKS)
namespace {
std::atomic<bool> held{false};
std::atomic<bool> let_go{false};
void hold_before_link(hook_point p) {
  if (p != hook_point::ready_push_before_link || held.load()) return;
  held = true;
  while (!let_go.load()) std::this_thread::yield();
}
} // namespace

// fork(): a producer stopped between its exchange and its link never finishes in the
// child. Before the repair pop reported `busy` at the break for ever (nothing before it
// could be taken); after it, what is reachable pops in order, the count is right, and
// new pushes link behind the cut.
BOOST_AUTO_TEST_CASE(repair_after_fork_cuts_the_queue_at_a_producer_stopped_mid_push) {
  ready_queue q;
  std::vector<std::unique_ptr<item>> items;
  for (int i = 0; i < 4; ++i) items.push_back(std::make_unique<item>(0, i));
  q.push(items[0].get());
  q.push(items[1].get());
  test_hook = &hold_before_link;
  std::thread producer([&] { q.push(items[2].get()); });
  while (!held.load()) std::this_thread::yield();
  q.consumer_lock().lock(); // as the fork hooks hold it; the producer is "not in the child"
  q.repair_after_fork();
  q.consumer_lock().unlock();
  test_hook = nullptr;
  BOOST_TEST(q.size() == 2u);
  q.push(items[3].get());
  std::vector<int> got;
  while (task_base* t = q.try_pop()) got.push_back(static_cast<item*>(t)->seq);
  BOOST_TEST(got == (std::vector<int>{0, 1, 3}), boost::test_tools::per_element());
  BOOST_TEST(q.empty());
  let_go = true; // in the test the stopped producer still exists: it links into a node already popped
  producer.join();
}
// wait_for_link: a consumer that must have the next node while its producer is stopped
// between its exchange and its link blocks - it does not spin (its CPU time over 300 ms
// stays a small part of it) - and takes the node once the producer links (its wake-up).
template <bool Counted>
void a_consumer_blocks_on_a_stopped_producer() {
  held = false;
  let_go = false;
  metronome::detail::basic_task_queue<Counted> q;
  std::vector<std::unique_ptr<item>> items;
  for (int i = 0; i < 2; ++i) items.push_back(std::make_unique<item>(0, i));
  q.push(items[0].get());
  test_hook = &hold_before_link;
  std::thread producer([&] { q.push(items[1].get()); });
  while (!held.load()) std::this_thread::yield();
  test_hook = nullptr;
  std::atomic<int> got{-1};
  std::atomic<bool> first{false};
  std::thread consumer([&] {
    auto pop = [&]() -> task_base* {
      if constexpr (Counted) {
        return q.pop_wait();
      } else {
        for (;;) {
          if (task_base* t = q.pop_sole_consumer()) return t;
          q.wait_for_link_sole_consumer();
        }
      }
    };
    first = static_cast<item*>(pop())->seq == 0;
    got = static_cast<item*>(pop())->seq; // blocks: the second node is not linked yet
  });
  clockid_t cpu{};
  BOOST_REQUIRE(::pthread_getcpuclockid(consumer.native_handle(), &cpu) == 0);
  auto cpu_ms = [&] {
    timespec ts{};
    ::clock_gettime(cpu, &ts);
    return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(50)); // let it reach the wait
  const double before = cpu_ms();
  std::this_thread::sleep_for(std::chrono::milliseconds(300)); // (the measured window; nothing waits on it)
  const double burnt = cpu_ms() - before;
  BOOST_TEST(got.load() == -1);
  BOOST_TEST(burnt < 60.0, "the waiting consumer used " << burnt << " ms of CPU in 300 ms: it spins");
  let_go = true;
  producer.join();
  consumer.join();
  BOOST_TEST(first.load());
  BOOST_TEST(got.load() == 1);
}

BOOST_AUTO_TEST_CASE(a_consumer_waiting_for_a_stopped_producer_s_link_blocks_and_takes_the_node_when_linked) {
  a_consumer_blocks_on_a_stopped_producer<true>();  // the pool's ready queue: pop_wait
  a_consumer_blocks_on_a_stopped_producer<false>(); // a serial executor's queue: its drain's wait
}
#endif

BOOST_AUTO_TEST_CASE(push_chain_keeps_order) {
  ready_queue q;
  item a(0, 0), b(0, 1), c(0, 2);
  a.next_.store(&b);
  b.next_.store(&c);
  q.push_chain(&a, &c, 3);
  BOOST_TEST(static_cast<item*>(q.pop_wait())->seq == 0);
  BOOST_TEST(static_cast<item*>(q.pop_wait())->seq == 1);
  BOOST_TEST(static_cast<item*>(q.pop_wait())->seq == 2);
  BOOST_TEST(q.pop_wait() == nullptr);
}

// Two producers push their own items, 0..per_producer-1 each, while `consumers`
// threads pop with `pop` (nullptr: nothing yet); checks nothing is lost, nothing taken
// twice, and each consumer sees each producer's items in order.
template <class Queue, class Pop>
void two_producers_lose_nothing(Queue& q, int consumers, Pop pop) {
  constexpr int per_producer = 200000;
  std::vector<std::unique_ptr<item>> items;
  for (int p = 0; p < 2; ++p)
    for (int i = 0; i < per_producer; ++i) items.push_back(std::make_unique<item>(p, i));
  std::atomic<int> consumed{0};
  std::vector<std::atomic<int>> seen(2 * per_producer);
  std::atomic<bool> order_ok{true};
  auto consumer = [&] {
    int last[2] = {-1, -1};
    while (consumed.load() < 2 * per_producer) {
      if (auto* t = static_cast<item*>(pop(q))) {
        if (t->seq <= last[t->producer]) order_ok = false;
        last[t->producer] = t->seq;
        seen[t->producer * per_producer + t->seq].fetch_add(1);
        consumed.fetch_add(1);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int c = 0; c < consumers; ++c) threads.emplace_back(consumer);
  for (int p = 0; p < 2; ++p)
    threads.emplace_back([&, p] {
      for (int i = 0; i < per_producer; ++i) q.push(items[p * per_producer + i].get());
    });
  for (auto& t : threads) t.join();
  BOOST_TEST(order_ok.load());
  int wrong = 0;
  for (auto& s : seen) wrong += s.load() != 1;
  BOOST_TEST(wrong == 0);
}

// Two producers and two consumers (TSan checks the publication).
BOOST_AUTO_TEST_CASE(many_producers_many_consumers_lose_nothing) {
  ready_queue q;
  two_producers_lose_nothing(q, 2, [](ready_queue& rq) { return rq.try_pop(); });
  BOOST_TEST(q.empty());
}

// The serial executor's queue (no counters; its owner counts): one consumer that pops
// without the lock, as a serial drain does.
BOOST_AUTO_TEST_CASE(the_uncounted_queue_keeps_per_producer_order_for_one_consumer) {
  uncounted_task_queue q;
  two_producers_lose_nothing(q, 1, [](uncounted_task_queue& uq) { return uq.pop_sole_consumer(); });
  BOOST_TEST(q.pop_sole_consumer() == nullptr);
  BOOST_TEST(!q.maybe_nonempty());
}

BOOST_AUTO_TEST_SUITE_END()
