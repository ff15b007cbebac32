// What the files of the pool engine (pool_core.cpp, pool_submit.cpp, pool_delay.cpp,
// pool_lifecycle.cpp, pool_reactor.cpp, pool_hosted.cpp) share: the worker record and
// the calling thread's place in a pool.
#ifndef METRONOME_SRC_POOL_INTERNAL_HPP
#define METRONOME_SRC_POOL_INTERNAL_HPP

#include "pool_engine.hpp"

#include <atomic>
#include <cstdint>
#include <limits>
#include <thread>

namespace metronome::detail {

// A producer of timed work takes the pool mutex: try_lock for about 3 us (16 x 8 pauses)
// before it blocks. The workers hold the mutex for a promotion or a park decision, well
// under that; a submitter that went to sleep on it instead paid a futex sleep and wake
// per contended push - with a million timers firing while they are submitted, 1 push in
// 85 slept, and the submit rate was 0.65x of this (docs/benchmarks.md, "The submitter's
// lock"). Bounded, then it blocks as std::mutex does. Mutual exclusion is the mutex's
// own: this changes only how long the caller tries before it sleeps.
inline void lock_as_timed_producer(held_lock& lk) noexcept {
  constexpr int tries = 16;
  constexpr int pauses = 8;
  for (int i = 0; i < tries; ++i) {
    if (lk.try_lock()) return;
    for (int k = 0; k < pauses; ++k) cpu_relax();
  }
  lk.lock();
}

struct worker {
  worker(pool_engine* p, std::size_t i, bool c) : pool(p), id(i), core(c) {}

  pool_engine* pool;
  std::size_t id;
  bool core;
  bool exited = false;  // guarded by the pool mutex
  bool retired = false; // an elastic thread that timed out: no longer counted in threads_ (park())
  std::thread thread;
  // Private continuation queue (defer from this thread); touched only by this thread.
  task_base* local_head = nullptr;
  task_base* local_tail = nullptr;
  unsigned tick = 0;
  // Fairness of I/O (pool_engine::poll_reactor_if_due): whether the pool has a reactor,
  // looked at again every 64 tasks until it has (it never goes away).
  bool has_reactor = false;
  unsigned io_tick = 0;
  alignas(64) std::atomic<std::uint64_t> completed{0};
  std::atomic<bool> busy{false};
  // Start-time histograms of this worker's scheduled tasks (queue wait, lateness):
  // written by this thread only (a relaxed load and store, no RMW), read by stats().
  latency_counters latency;
};

// The worker the calling thread is, if any.
extern thread_local worker* this_worker;
// The pool whose on_thread_start / on_thread_stop hook the calling thread is running:
// a pool thread too (join() from there deadlocked, or returned before the hook had).
extern thread_local const pool_engine* this_hook_pool;
// Set when a pool is destroyed from inside one of its own tasks: that worker must
// not touch the pool again once the task returns.
extern thread_local bool this_thread_orphaned;
// Set while a worker runs its on_thread_start hook (it is counted awake meanwhile).
extern thread_local bool this_thread_in_start_hook;

inline constexpr clock::rep no_due = std::numeric_limits<clock::rep>::max();

// A wheel's tick in the heap (wait_node::untracked_): timed like any wait, but not work
// that keeps the pool from terminating (idle_for_termination, ticks_in_heap_).
inline bool is_tick(const timed_node* n) noexcept {
  return n->kind_ == task_kind::wait && static_cast<const wait_node*>(n)->untracked_;
}

// Debug builds check the rule that no other thread is inside a call on a pool while it
// is destroyed (a task may destroy its own pool): the calls that queue work count
// themselves, and close() asserts that only its own thread's call, if any, is counted.
// A caller_runs task runs inside submit and may destroy the pool: its call leaves the
// count first (dismiss), and the scope then touches nothing.
#if !defined(NDEBUG)
extern thread_local int calls_dismissed;
class call_scope {
public:
  explicit call_scope(std::atomic<int>& calls) noexcept : calls_(calls), outer_dismissed_(calls_dismissed) {
    calls_.fetch_add(1, std::memory_order_relaxed);
    calls_dismissed = 0;
  }
  ~call_scope() {
    if (!calls_dismissed) calls_.fetch_sub(1, std::memory_order_relaxed);
    calls_dismissed = outer_dismissed_;
  }
  call_scope(const call_scope&) = delete;
  call_scope& operator=(const call_scope&) = delete;
  // Leaves the count now; the pool may be gone when the scope ends.
  static void dismiss(std::atomic<int>& calls) noexcept {
    calls.fetch_sub(1, std::memory_order_relaxed);
    calls_dismissed = 1;
  }

private:
  std::atomic<int>& calls_;
  int outer_dismissed_;
};
#define METRONOME_POOL_CALL(calls) call_scope metronome_call_scope_(calls)
#define METRONOME_POOL_CALL_DISMISS(calls) call_scope::dismiss(calls)
#else
#define METRONOME_POOL_CALL(calls) ((void)0)
#define METRONOME_POOL_CALL_DISMISS(calls) ((void)0)
#endif

// A FIFO chain of nodes linked through next_, built outside any queue and handed over
// whole (ready_queue::push_chain).
struct task_chain {
  task_base* first = nullptr;
  task_base* last = nullptr;
  std::size_t count = 0;

  void append(task_base* n) noexcept {
    n->next_.store(nullptr, std::memory_order_relaxed);
    if (last)
      last->next_.store(n, std::memory_order_relaxed);
    else
      first = n;
    last = n;
    ++count;
  }
};

inline task_base* pop_local(worker& w) noexcept {
  task_base* t = w.local_head;
  w.local_head = t->next_.load(std::memory_order_relaxed);
  if (!w.local_head) w.local_tail = nullptr;
  return t;
}

} // namespace metronome::detail

#endif
