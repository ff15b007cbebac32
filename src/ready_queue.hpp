// The pool's ready queue: an intrusive MPSC queue of task nodes with a consumer lock.
#ifndef METRONOME_SRC_READY_QUEUE_HPP
#define METRONOME_SRC_READY_QUEUE_HPP

#include "platform.hpp"

#include <metronome/detail/task.hpp>
#include <metronome/detail/test_hooks.hpp>

#include <atomic>
#include <cassert>
#include <chrono>
#include <cstdint>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace metronome::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Intrusive FIFO of task nodes: Vyukov's MPSC queue (producers are wait-free: one
// exchange on tail_ and one release store of the link) made multi-consumer by a
// consumer spinlock held only for the few loads of one pop.
//
// Memory ordering: push publishes the node's contents with the release store of
// prev->next_; pop reads next_ with acquire, so a popped node's fields (and
// everything the producer wrote before push) are visible to the consumer. Between
// a producer's exchange and its link the chain is briefly broken: pop then reports
// `busy` rather than empty, and callers never park on `busy`.
//
// Waiting out the break (wait_for_link): a consumer that must have the next node spins
// briefly (the break is two instructions of a running producer), then blocks until a
// producer stores a link: a producer that sees link_waiters_ raised after its link
// wakes the waiters. Invariant: a blocked consumer wakes when the link it waits for is
// stored, or after at most link_wait_bound when the producer's look (relaxed, on its own
// cache line, so that a push costs no fence) missed the raise - so it never spins, and a
// missed wake-up costs that bound, never more. Tested by
// `a_consumer_waiting_for_a_stopped_producer_s_link_blocks_and_takes_the_node_when_linked`
// (hook ready_push_before_link, test/unit/detail/ready_queue.cpp).
//
// When Counted (the pool's ready queue), pushed_/popped_ count nodes; their difference
// is the queue length. They are seq_cst so that the pool's sleep/wake handshake
// (sleepers_ vs. these counters) is a Dekker pair: a parking worker and a pushing
// producer cannot both miss each other. A serial executor keeps its own count of
// pending tasks and uses the queue uncounted (one locked instruction less per push and
// per pop); its count sits where pushed_ would (owner_count()).
template <bool Counted>
class basic_task_queue {
public:
  basic_task_queue() noexcept : head_(&stub_), stub_(nullptr), tail_(&stub_) {}

  // Consumer-side probe: true when a node is (or is about to be) poppable. Reads only
  // the consumer's line and the head node's link, never the producers' counters, so
  // spinning consumers do not steal the line producers write on every push. Not a
  // substitute for empty() in the sleep/wake handshake.
  bool maybe_nonempty() const noexcept {
    const task_base* h = head_.load(std::memory_order_relaxed);
    return h != &stub_ || stub_.next_.load(std::memory_order_acquire) != nullptr;
  }
  basic_task_queue(const basic_task_queue&) = delete;
  basic_task_queue& operator=(const basic_task_queue&) = delete;

  void push(task_base* t) noexcept { push_chain(t, t, 1); }

  // Pushes the already linked chain first..last (last->next_ must be null).
  void push_chain(task_base* first, task_base* last, std::uint64_t count) noexcept {
    last->next_.store(nullptr, std::memory_order_relaxed);
    task_base* prev = tail_.exchange(last, std::memory_order_acq_rel);
    METRONOME_TEST_HOOK(hook_point::ready_push_before_link);
    prev->next_.store(first, std::memory_order_release);
    if constexpr (Counted) pushed_.fetch_add(count, std::memory_order_seq_cst);
    if (link_waiters_.load(std::memory_order_relaxed) != 0) [[unlikely]]
      wake_link_waiters();
  }

  // Uncounted: a count the owner keeps on the producers' line, which its producers write
  // on every push anyway (a serial executor's pending tasks: one line per push, not two).
  std::atomic<std::uint64_t>& owner_count() noexcept requires(!Counted) { return pushed_; }

  std::uint64_t size() const noexcept
    requires Counted
  {
    auto pushed = pushed_.load(std::memory_order_seq_cst);
    auto popped = popped_.load(std::memory_order_seq_cst);
    return pushed > popped ? pushed - popped : 0;
  }
  bool empty() const noexcept
    requires Counted
  {
    return size() == 0;
  }

  // Pops the oldest node, or nullptr when empty or momentarily busy.
  task_base* try_pop() noexcept {
    if (!maybe_nonempty()) return nullptr;
    if (!lock_.try_lock()) return nullptr;
    task_base* t = pop_head();
    lock_.unlock();
    return t;
  }

  // Pops with the consumer lock held, waiting out a producer between exchange and
  // link. Returns nullptr only when empty.
  task_base* pop_wait() noexcept
    requires Counted
  {
    if (empty()) return nullptr;
    consumer_guard g(*this);
    for (;;) {
      if (task_base* t = pop_head()) return t;
      if (empty()) return nullptr;
      wait_for_link(g);
    }
  }

  // The consumer lock: held for the few loads of one pop (or, rarely, across a wait for
  // a producer's link). lock() spins briefly, then blocks; unlock() wakes a blocked
  // locker when it sees one (its look is relaxed: a missed wake-up costs
  // link_wait_bound, as for the links above).
  struct spin_lock {
    std::atomic<std::uint32_t> locked_{0};
    std::atomic<std::uint32_t> waiters_{0};
    bool try_lock() noexcept {
      return locked_.load(std::memory_order_relaxed) == 0 && locked_.exchange(1, std::memory_order_acquire) == 0;
    }
    void lock() noexcept {
      for (int spins = 0; spins < 64; ++spins) {
        if (try_lock()) return;
        cpu_relax();
      }
      waiters_.fetch_add(1, std::memory_order_seq_cst);
      while (!try_lock()) platform::wait_while_equal(locked_, 1, link_wait_bound);
      waiters_.fetch_sub(1, std::memory_order_relaxed);
    }
    void unlock() noexcept {
      locked_.store(0, std::memory_order_release);
      if (waiters_.load(std::memory_order_relaxed) != 0) [[unlikely]]
        platform::wake_all(locked_);
    }
  };


  // Holds the consumer lock for a scope. The functions that need the lock held take one
  // as proof (debug builds check it is this queue's).
  class consumer_guard {
  public:
    explicit consumer_guard(basic_task_queue& q) noexcept : q_(q) { q_.lock_.lock(); }
    ~consumer_guard() { q_.lock_.unlock(); }
    consumer_guard(const consumer_guard&) = delete;
    consumer_guard& operator=(const consumer_guard&) = delete;

  private:
    friend basic_task_queue;
    basic_task_queue& q_;
  };

  // The lock itself, for the fork hooks alone: they hold it across fork() (taken in one
  // call, let go in another).
  spin_lock& consumer_lock() noexcept { return lock_; }

  // Pops the oldest node; nullptr when empty or busy (a producer linking).
  task_base* pop([[maybe_unused]] const consumer_guard& g) noexcept {
    assert(&g.q_ == this);
    return pop_head();
  }
  // The same for the queue's only consumer (a serial executor's drain: one drain at a
  // time), which needs no lock.
  task_base* pop_sole_consumer() noexcept { return pop_head(); }
  // A pop found the chain broken behind the head: waits (spin, then block) until the
  // head's link is stored, or no producer is linking past the head any more. The caller
  // holds the consumer lock (the head is its), and pops again after.
  void wait_for_link([[maybe_unused]] const consumer_guard& g) noexcept {
    assert(&g.q_ == this);
    wait_for_head_link();
  }
  // wait_for_link() for the queue's only consumer.
  void wait_for_link_sole_consumer() noexcept { wait_for_head_link(); }

private:
  task_base* pop_head() noexcept {
    task_base* head = head_.load(std::memory_order_relaxed);
    task_base* next = head->next_.load(std::memory_order_acquire);
    if (head == &stub_) {
      if (!next) return nullptr;
      head_.store(next, std::memory_order_relaxed);
      head = next;
      next = next->next_.load(std::memory_order_acquire);
    }
    if (next) {
      head_.store(next, std::memory_order_relaxed);
      __builtin_prefetch(next); // the next pop reads it: start that cache miss now
      return taken(head);
    }
    if (head != tail_.load(std::memory_order_acquire)) return nullptr; // busy
    push_stub();
    next = head->next_.load(std::memory_order_acquire);
    if (next) {
      head_.store(next, std::memory_order_relaxed);
      return taken(head);
    }
    return nullptr; // busy: a producer is linking behind the stub
  }

public:
  // The oldest queued node for which pred returns true, or nullptr; the node stays queued. Nodes cannot be popped while the lock is held,
  // and producers only ever store the last node's link (read here with acquire).
  // `prev` receives the node before it (nullptr when it is the head).
  template <class Pred>
  task_base* find(Pred&& pred, task_base*& prev, [[maybe_unused]] const consumer_guard& g) noexcept {
    assert(&g.q_ == this);
    prev = nullptr;
    for (task_base* n = head_.load(std::memory_order_relaxed); n; n = n->next_.load(std::memory_order_acquire)) {
      if (n != &stub_ && pred(n)) return n;
      prev = n;
    }
    return nullptr;
  }

  // Takes `n` (found by find() with `prev`) out of the middle of the queue. Refuses (false) when n is the last node, whose link a producer
  // may be about to store; any other node's link and its predecessor's are written once,
  // already, so unlinking touches nothing a producer writes.
  bool unlink(task_base* prev, task_base* n, [[maybe_unused]] const consumer_guard& g) noexcept {
    assert(&g.q_ == this);
    task_base* next = n->next_.load(std::memory_order_acquire);
    if (!next) return false;
    if (prev)
      prev->next_.store(next, std::memory_order_relaxed);
    else
      head_.store(next, std::memory_order_relaxed);
    taken(n);
    return true;
  }

  // fork(), in the child: the caller holds consumer_lock() (the fork hooks took it) and
  // no other thread exists. A
  // producer of the parent stopped between its exchange and its link left the chain
  // broken for good: pop saw `busy` at the break for ever, so nothing before it was taken
  // either. The queue is cut after the last node reachable from head_ (tail_ points
  // there again) and the count is what is reachable. The nodes behind the break are the
  // parent's pushes, unreachable here: they stay with the parent (the child's copy leaks).
  void repair_after_fork() noexcept {
    task_base* last = head_.load(std::memory_order_relaxed);
    std::uint64_t reachable = last == &stub_ ? 0 : 1;
    for (task_base* n = last->next_.load(std::memory_order_acquire); n; n = n->next_.load(std::memory_order_acquire)) {
      if (n != &stub_) ++reachable;
      last = n;
    }
    tail_.store(last, std::memory_order_relaxed);
    if constexpr (Counted) pushed_.store(popped_.load(std::memory_order_relaxed) + reachable, std::memory_order_seq_cst);
  }


private:
  static constexpr std::chrono::milliseconds link_wait_bound{1};

  void wait_for_head_link() noexcept {
    const task_base* h = head_.load(std::memory_order_relaxed);
    auto linked = [this, h] {
      return h->next_.load(std::memory_order_acquire) != nullptr || tail_.load(std::memory_order_acquire) == h;
    };
    for (int spins = 0; spins < 128; ++spins) {
      if (linked()) return;
      cpu_relax();
    }
    link_waiters_.fetch_add(1, std::memory_order_seq_cst);
    for (;;) {
      const std::uint32_t epoch = link_epoch_.load(std::memory_order_acquire);
      if (linked()) break;
      platform::wait_while_equal(link_epoch_, epoch, link_wait_bound);
    }
    link_waiters_.fetch_sub(1, std::memory_order_relaxed);
  }

  void wake_link_waiters() noexcept {
    link_epoch_.fetch_add(1, std::memory_order_release);
    platform::wake_all(link_epoch_);
  }

  task_base* taken(task_base* t) noexcept {
    if constexpr (Counted) popped_.store(popped_.load(std::memory_order_relaxed) + 1, std::memory_order_seq_cst);
    return t;
  }

  void push_stub() noexcept {
    stub_.next_.store(nullptr, std::memory_order_relaxed);
    task_base* prev = tail_.exchange(&stub_, std::memory_order_acq_rel);
    prev->next_.store(&stub_, std::memory_order_release);
  }

  // The consumers' line, the stub's, the producers' line (the class is padded to a
  // multiple of 64). Uncounted (a serial executor's queue, one per connection in a
  // service), the stub shares the consumer's line - a consumer reads its link with head_,
  // a producer writes it only when the queue was empty - and the queue takes two lines.
  // The pool's ready queue keeps the stub on a line of its own, as it was measured.
  alignas(64) std::atomic<task_base*> head_; // written under lock_, probed without
  spin_lock lock_;
  std::atomic<std::uint64_t> popped_{0};
  alignas(Counted ? 64 : alignof(task_base)) task_base stub_;
  // Producer side. Uncounted, pushed_ is the owner's count (owner_count()).
  alignas(64) std::atomic<task_base*> tail_;
  std::atomic<std::uint64_t> pushed_{0};
  std::atomic<std::uint32_t> link_waiters_{0}; // consumers blocked in wait_for_head_link()
  std::atomic<std::uint32_t> link_epoch_{0};   // their futex word: bumped by a producer that wakes them
};

using ready_queue = basic_task_queue<true>;
using uncounted_task_queue = basic_task_queue<false>;

} // namespace metronome::detail

#endif
