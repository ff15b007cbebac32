// A hosted core: a pool_core with no threads of its own, whose work (due waits, due
// tasks of serial executors, their completions) runs on the threads of an Asio context
// that drives it (timing_service.cpp). Everything else - the delay heap, cancel, the
// ready queue - is the pool's own code.
#include "pool_engine.hpp"

#include "pool_internal.hpp"
#include <metronome/detail/report.hpp>

#include <cassert>
#include <thread>

namespace metronome::detail {

// The hosted invariant: host_timed_ (under mtx_) is a due time the host will look at -
// its timer is armed for it, or a drive is requested or running. A head pushed before
// it asks for a drive (wake_for_new_head), work pushed asks for one
// (maybe_wake_after_push), and the drive, under mtx_, reads the head and sets
// host_timed_ to it before the host arms its timer. So no due time is left untimed:
// either the drive saw it, or its push found host_timed_ later and asked again.
// Kept by drive_hosted() and wake_for_new_head(); tested by the hosted-core
// stop-here test (test/unit/detail/timing_service.cpp, hook hosted_drive_before_arm).
pool_engine::drive_result pool_engine::drive_hosted(std::size_t budget) noexcept {
  assert(host_ && "metronome: drive_hosted() on a pool with threads of its own");
  worker& w = *host_worker_;
  worker* const outer = this_worker; // a host thread may be a metronome pool's worker too
  this_worker = &w;
  std::size_t ran = 0;
  while (ran < budget && !state_.at_least(lifecycle::stop, std::memory_order_acquire)) {
    task_base* t = nullptr;
    if (w.local_head) {
      t = pop_local(w);
    } else {
      const clock::rep nd = next_due_.load(std::memory_order_acquire);
      if (nd != no_due) {
        const clock::time_point current = clock::now();
        if (current.time_since_epoch().count() >= nd) {
          std::unique_lock lk(mtx_);
          task_sink* owed = nullptr;
          promote_due(lk, current, owed);
          lk.unlock();
          post_owed_drains(owed);
        }
      }
      t = ready_.try_pop();
    }
    if (!t) break;
    run_task(w, t);
    ++ran;
    if (rethrow_scope::pending()) break; // a handler threw: it leaves this drive (Asio's rule); the rest comes next drive
  }
  this_worker = outer;
  const bool stopped = rethrow_scope::pending();
  std::lock_guard lk(mtx_);
  host_timed_ = heap_.empty() ? no_due : heap_.top_due();
  return drive_result{clock::time_point(clock::duration(host_timed_)),
                      ran == budget || w.local_head != nullptr || (stopped && ready_.maybe_nonempty())};
}

void pool_engine::close_hosted() noexcept {
  assert(host_ && "metronome: close_hosted() on a pool with threads of its own");
  timed_node* delayed = nullptr;
  task_base* left = nullptr;
  auto keep = [&left](task_base* t) {
    t->next_.store(left, std::memory_order_relaxed);
    left = t;
  };
  {
    std::unique_lock lk(mtx_);
    state_.advance_to(lifecycle::stop);
    delayed = drain_heap(lk); // its waits join the ready queue, aborted
    {
      ready_queue::consumer_guard g(ready_);
      while (task_base* t = ready_.pop(g)) keep(t);
    }
    state_.set_terminated();
    host_timed_ = no_due;
  }
  worker& w = *host_worker_;
  while (w.local_head) keep(pop_local(w));
  discard_chain(delayed); // typed tasks (a serial executor's delayed work): cancelled
  while (left) {
    task_base* next = left->next_.load(std::memory_order_relaxed);
    discard_task(left, nullptr); // waits complete aborted; nothing is reported, as Asio's shutdown
    left = next;
  }
  // Invariant: the context destroys this engine after its shutdown, so no thread may be
  // inside it then. Threads in transit still are (a bound task's run on another executor
  // between enter_live() and its end - its handle may read done before it leaves; a
  // cancel() between taking its task out of the heap and cancel_delivered()); none
  // enters from now on (terminated), so the count only falls. A metronome pool waits for
  // the same count before it terminates (idle()). Tested by
  // `the_host_s_shutdown_waits_for_a_bound_periodic_run_still_leaving_the_engine`.
  std::unique_lock lk(mtx_);
  terminated_cv_.wait(lk, [this] { return in_transit_ == 0 && clock_askers_ == 0; }); // leave_transit() notifies a host's
}

} // namespace metronome::detail
