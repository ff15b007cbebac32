// The pool's delay queue: typed submissions, the heap under the pool mutex, promotion of
// due work (leader-follower waiting is in park(), pool_core.cpp), periodic runs, cancel,
// async_delay waits.
#include <metronome/detail/periodic.hpp>
#include <metronome/detail/report.hpp>
#include "pool_engine.hpp"
#include <metronome/detail/test_hooks.hpp>
#include <metronome/errors.hpp>
#include <metronome/manual_clock.hpp>

#include "pool_internal.hpp"

#include <new>
#include <thread>
#include <utility>

namespace metronome::detail {

// ---------------------------------------------------------------- submission

void pool_core::submit_scheduled(scheduled_task_base* t, clock::time_point due, clock::time_point current) {
  pool_engine& e = engine(*this);
  METRONOME_POOL_CALL(e.calls_);
  if (due <= current) {
    promote_due_before(current);
    t->set_due(current);
    if (e.state_.refuses_new_work()) {
      e.reject_scheduled(t, false);
      return;
    }
    if (e.opts_.max_queued != 0 && e.ready_.size() >= e.opts_.max_queued) {
      if (e.opts_.rejection != rejection_policy::discard_oldest || !e.discard_oldest_user_task()) {
        e.reject_scheduled(t, false);
        return;
      }
      e.rejected_.fetch_add(1); // the evicted task
    }
    METRONOME_TEST_HOOK(hook_point::submit_before_push);
    if (push_ready(t)) {
      // Met a terminated pool (it terminated after the check above). The task may still
      // be in the queue behind a node another producer has not linked yet: clear again
      // until it has left. Handed back: the submission came too late after all. (Else a
      // worker ran it before the pool went idle, or shutdown_now() returns it.)
      while (!t->has_left_queue()) {
        {
          ready_queue::consumer_guard g(e.ready_);
          e.ready_.wait_for_link(g); // spin briefly, then block until the producer has linked
        }
        e.clear_after_termination();
      }
      if (t->is_handed_back()) e.reject_scheduled(t, false);
    }
    return;
  }
  t->set_due(due);
  METRONOME_TEST_HOOK(hook_point::delayed_submit_before_lock);
  std::unique_lock lk(e.mtx_, std::defer_lock);
  lock_as_timed_producer(lk);
  if (t->phase() != scheduled_task_base::pending) {
    // Cancelled before it got here (a serial executor's dispose() cancels what it tracks,
    // and this task was tracked before being queued): the cancel found nothing to take
    // out of the heap, so it must not go in. Drop the queue's reference.
    lk.unlock();
    t->release();
    return;
  }
  if (e.state_.refuses_new_work()) {
    lk.unlock();
    e.reject_scheduled(t, true);
    return;
  }
  try {
    e.heap_push(lk, t, current); // grows the heap here, on the caller, or throws with nothing queued
  } catch (...) {
    lk.unlock();
    t->finish_cancelled();
    t->release();
    throw;
  }
  e.ask_clock_after_outside_push(lk);
}

// An auto-advancing manual clock decides when the last awake worker parks; with every
// worker already parked (or letting the clock decide), timed work pushed from outside
// would never make it jump: the push asks the clock itself, as a released hold does.
//
// Invariant: the pool does not terminate while an asker is inside (clock_askers_, under
// mtx_; quiescent() does not count it: the asker is who asks). The jump may run the
// pushed work, and its completion may let the caller's program destroy the pool, while
// the asking thread - not one of the pool's, which the destructor would join - is still
// on its way out of this call. It leaves under mtx_ and then touches nothing of the pool
// but that mutex's unlock (its debug call count is dismissed first). Tested by
// `the_pool_s_destructor_waits_for_an_outside_push_still_inside_the_clock_s_jump` (hook
// outside_push_after_clock), test/handover/pool.cpp.
void pool_engine::ask_clock_after_outside_push(std::unique_lock<std::mutex>& lk) noexcept {
  if (!manual_ || awake_ != 0 || !manual_->auto_advance()) return;
  ++clock_askers_;
  lk.unlock(); // the clock's mutex comes before ours
  manual_->idle_point();
  METRONOME_TEST_HOOK(hook_point::outside_push_after_clock);
  lk.lock();
  METRONOME_POOL_CALL_DISMISS(calls_); // the caller's count: left while the pool surely exists
  if (--clock_askers_ == 0) last_one_out(lk);
}

void pool_engine::reject_scheduled(scheduled_task_base* t, bool timed) {
  rejected_.fetch_add(1);
  const char* why = state_.terminated()                    ? "metronome: the pool has terminated"
                    : state_.at_least(lifecycle::shutdown) ? "metronome: the pool is shut down"
                                                           : "metronome: the ready queue is full";
  rejection_policy policy = opts_.rejection;
  // caller_runs never runs delayed or periodic work early, on the caller: refused as abort.
  if (policy == rejection_policy::caller_runs && (timed || t->is_periodic())) policy = rejection_policy::abort;
  // A bound task whose executor runs on this pool (a strand over it) runs there: the
  // pool must not terminate before the hand-over has reached that strand's queue, and a
  // terminated pool could never run it (refused as abort). Tested by
  // `caller_runs_hands_a_task_bound_to_a_strand_over_the_pool_to_it_until_the_pool_terminates`.
  if (policy == rejection_policy::caller_runs && t->bound_ && t->bound_context() == context_) {
    if (!begin_hand_over()) {
      policy = rejection_policy::abort;
      why = "metronome: the pool has terminated";
    } else {
      pool_anchor* const a = anchor_;
      const std::uint32_t g = generation_;
      METRONOME_POOL_CALL_DISMISS(calls_);
      run_detached(t); // takes a hold of its own for the strand's queue
      end_hand_over_through(a, g); // through the anchor: the run may have destroyed the pool
      return;
    }
  }
  switch (policy) {
  case rejection_policy::abort:
    t->finish_cancelled();
    t->release();
    throw rejected_execution(why);
  case rejection_policy::caller_runs:
    METRONOME_POOL_CALL_DISMISS(calls_); // the task may destroy the pool
    run_detached(t);
    return;
  case rejection_policy::discard:
  case rejection_policy::discard_oldest:
    t->finish_cancelled();
    t->release();
    return;
  }
}

// ---------------------------------------------------------------- heap

// May throw (std::bad_alloc, std::length_error) with nothing changed.
//
// Manual clock: `current` was read before mtx_, and only an advance moves time. The
// invariant: the clock stores its new time before its advance takes mtx_ to promote
// (on_time_advanced), so a time read here, under mtx_, that is before `n`'s due time
// means that advance has not promoted yet and will find `n`; a time at or past it means
// the advance may have promoted without `n`, and a worker is woken to promote it (park()
// promotes what is due; a busy one does when it parks). Tested by
// `a_delayed_task_pushed_after_an_advance_past_its_due_time_runs` and its two siblings
// (hooks delayed_submit_before_lock, wait_before_lock, reschedule_before_lock),
// test/handover/pool.cpp.
void pool_engine::heap_push(const held_lock& lk, timed_node* n, clock::time_point current) {
  assert_held(lk, mtx_);
  n->timed_ = true;
  if (heap_.push(n, next_seq_++, current.time_since_epoch().count())) heap_changed(lk);
  if (is_tick(n)) ++ticks_in_heap_;
  wake_if_due_on_manual_clock(lk, n->due());
}

// On a manual clock nobody looks at the heap until time moves: work already due when it
// enters (or is reset into) the heap gets a parked worker to promote it (park() promotes
// what is due; a busy one does when it parks). The time is read under mtx_ (see
// heap_push for why that read is the one that counts).
void pool_engine::wake_if_due_on_manual_clock(const held_lock& lk, clock::time_point due) noexcept {
  assert_held(lk, mtx_);
  if (manual_ && due <= now()) wake_some(lk, 1);
}

// The head changed: publish its due time and, if it is a new earliest, wake the leader.
void pool_engine::heap_changed(const held_lock& lk) noexcept {
  assert_held(lk, mtx_);
  update_next_due(lk);
  wake_for_new_head(lk);
}

// Only a new earliest task wakes the leader (or a follower, to become leader). The
// delay-queue invariant (docs/design.md): every change of the head happens under mtx_;
// a leader computes its deadline from the head under mtx_ and waits on its condition variable,
// which releases mtx_ atomically; so a head pushed after that is seen by this notify.
void pool_engine::wake_for_new_head(const held_lock& lk) noexcept {
  assert_held(lk, mtx_);
  if (manual_) return; // time moves only through on_time_advanced()
  if (host_) { // the hosted invariant (drive_hosted): a head before what the host times asks
    if (!heap_.empty() && heap_.top_due() < host_timed_) {
      host_timed_ = heap_.top_due();
      host_->request_drive();
    }
    return;
  }
  if (parking_.leader() != nullptr) {
    if (parking_.leader() == reactor_.holder())
      interrupt_reactor(lk);
    else
      parking_.notify_leader();
  } else if (parking_.wake_follower()) {
  } else if (reactor_.holder() != nullptr) {
    interrupt_reactor(lk); // it waits without a deadline: it comes back to time the heap
  } else if (!parking_.someone_spinning()) {
    // Every worker is busy and none times the heap: an elastic pool below its maximum
    // starts a thread, which parks as the leader - as one starts for ready work nobody
    // is free to take. (Without it, delayed work waited for a busy core thread.) If it
    // cannot, the next worker to park times the heap.
    grow(lk);
  }
}

// Release: a thread that reads the new value (promote_due_before) also sees the ready
// chain that the promotion pushed before storing it.
void pool_engine::update_next_due(const held_lock& lk) noexcept {
  assert_held(lk, mtx_);
  next_due_.store(heap_.empty() ? no_due : heap_.top_due(), std::memory_order_release);
}

std::size_t pool_engine::promote_due(const held_lock& lk, clock::time_point current, task_sink*& owed) noexcept {
  assert_held(lk, mtx_);
  task_chain ready;
  bool popped = false;
  const clock::rep limit = current.time_since_epoch().count();
  heap_.advance(limit); // the buckets' window follows the time
  while (!heap_.empty() && heap_.top_due() <= limit) {
    timed_node* n = heap_.pop();
    popped = true;
    if (is_tick(n)) --ticks_in_heap_;
    if (n->is_scheduled()) {
      auto* st = static_cast<scheduled_task_base*>(n);
      if (task_sink* sink = st->sink()) {
        // Into its serial executor's queue here, under the mutex, so that due serial
        // tasks keep their due order whatever the number of workers.
        if (sink->enqueue_due(st)) {
          sink->owed_next_ = owed;
          owed = sink;
        }
        continue;
      }
    }
    ready.append(n);
  }
  if (ready.count) ready_.push_chain(ready.first, ready.last, ready.count);
  if (popped) {
    update_next_due(lk); // after the push: see promote_due_before()
    heap_.shrink_if_sparse();
  }
  if (owed) ++in_transit_; // until post_owed_drains() has posted them: the pool is not idle
  return ready.count;
}

// Caller does not hold mtx_. The drains leave the heap's custody under the mutex and
// reach the ready queue (or another executor) after it: in_transit_ keeps the pool from
// terminating in between (it would drop them), and whoever makes it 0 after shutdown
// lets parked workers look again.
void pool_engine::post_owed_drains(task_sink* owed) noexcept {
  if (!owed) return;
  METRONOME_TEST_HOOK(hook_point::owed_drain_before_post);
  while (owed) {
    task_sink* next = owed->owed_next_; // posting may let the sink go
    owed->owed_next_ = nullptr;
    owed->post_owed_drain();
    owed = next;
  }
  METRONOME_TEST_HOOK(hook_point::owed_drain_after_post);
  std::unique_lock lk(mtx_);
  leave_transit(lk);
}

// Auto-advance (or a wait_idle() waiter): the last awake worker does not ask the clock
// while something is in transit (the clock would refuse: not quiescent), so the thread
// that ends the last transit - a cancel's completions delivered, a serial executor's
// drains posted, a completion queued - with every worker parked has one ask again. It
// takes no other lock for that (it may hold a serial executor's registry, or be the
// thread telling the pools of a jump, where the clock would only owe the decision): it
// wakes a parked worker, which asks as it parks again, and owes the ask (clock_ask_owed_)
// to a worker that is between its own ask and its park (let_manual_clock_decide), which
// then asks again.
// Tested by `a_cancel_leaving_the_last_transit_with_every_worker_parked_makes_the_clock_jump`,
// `a_transit_ended_while_the_last_worker_asks_the_clock_makes_it_ask_again`,
// `the_last_transit_left_inside_a_jump_makes_the_clock_decide_again` (test/handover/pool.cpp).
void pool_engine::leave_transit(const held_lock& lk) noexcept {
  assert_held(lk, mtx_);
  if (--in_transit_ != 0) return;
  last_one_out(lk);
  if (manual_ && awake_ == 0 && manual_->wants_idle_points()) {
    clock_ask_owed_ = true;
    wake_some(lk, 1);
  }
}

// The last thread in transit (leave_transit) or asking the clock
// (ask_clock_after_outside_push) has left: a host's close_hosted() and a terminating
// pool's idle check wait for both counts to reach zero.
void pool_engine::last_one_out(const held_lock& lk) noexcept {
  assert_held(lk, mtx_);
  if (host_) terminated_cv_.notify_all();
  if (state_.seeks_termination()) wake_all(lk);
}

void pool_engine::cancel_delivered() noexcept {
  std::unique_lock lk(mtx_);
  leave_transit(lk);
}

// Promotion outside park(), by who asks:
// - a worker's pick (`by_worker`): opportunistic - if the mutex is busy, the next pick,
//   or park(), which promotes under the lock, catches up; the worker takes one task
//   itself and wakes others for the rest when nobody is spinning;
// - a producer of due-now work (`by_producer`): only when the heap's head (next_due_,
//   read with acquire) is due; waits for a promotion in progress elsewhere to finish, so
//   its own work queues behind everything due (promote_due_before);
// - the manual clock (`by_clock`): always, under the mutex (next_due_ read without it
//   could miss a head pushed by a thread this one never synchronised with).
void pool_engine::promote(clock::time_point current, promoter who) noexcept {
  if (who == promoter::by_producer) {
    const clock::rep nd = next_due_.load(std::memory_order_acquire);
    if (nd == no_due || nd > current.time_since_epoch().count()) return;
  }
  std::unique_lock lk(mtx_, std::defer_lock);
  if (who == promoter::by_worker) {
    if (!lk.try_lock()) return;
  } else {
    lk.lock();
  }
  task_sink* owed = nullptr;
  const std::size_t n = promote_due(lk, current, owed);
  if (who != promoter::by_worker)
    wake_some(lk, n);
  else if (n > 1 && !parking_.someone_spinning())
    wake_some(lk, n - 1);
  lk.unlock();
  post_owed_drains(owed);
}

void pool_engine::on_time_advanced() { promote(now(), promoter::by_clock); }

// A terminated pool runs nothing again: idle, with no timed work, whatever its joined
// workers left in awake_ (a core worker leaves park() awake when the pool terminates).
// Tested by `a_terminated_pool_on_the_clock_does_not_stop_the_others_jumping`.
bool pool_engine::quiescent(clock::time_point& next_due) noexcept {
  std::lock_guard lk(mtx_);
  if (state_.terminated()) return true;
  if (awake_ > 0 || in_transit_ > 0 || !ready_.empty()) return false;
  if (!heap_.empty()) next_due = heap_.top()->due();
  return true;
}

bool pool_engine::on_cancelled(const held_lock& lk, scheduled_task_base* t, bool in_transit) noexcept {
  assert_held(lk, mtx_);
  if (!heap_remove(lk, t)) return false; // queued elsewhere: dropped when taken
  if (in_transit) {
    // In transit until the canceller has delivered the task's completions (its handle's
    // async_wait may post to this very pool): a shut-down pool must not terminate in
    // between. cancel_delivered() ends it, and wakes the workers to look for termination.
    ++in_transit_;
  } else if (state_.seeks_termination()) {
    wake_all(lk); // the node kept a terminating pool up: its workers look again
  }
  return true;
}

bool pool_engine::on_reset(const held_lock& lk, scheduled_task_base* t, clock::duration delay) noexcept {
  assert_held(lk, mtx_);
  // Out of the heap: queued to run (or in a serial queue), running, between two periodic
  // runs, or cancelled. A cancel that won its CAS but waits for this mutex finds the
  // node in the heap either way.
  if (t->heap_index_ == not_in_heap || t->phase() != scheduled_task_base::pending) return false;
  const clock::time_point current = now();
  const clock::time_point due = saturating_add(current, delay);
  const bool was_head = heap_.is_head(t);
  bool is_head = false;
  if (!heap_.rekey(t, due.time_since_epoch().count(), next_seq_++, is_head)) return false; // out of memory
  t->set_due(due);
  // A periodic task's grid continues from the new due time: its un-jittered schedule
  // (what the next runs are computed from) moves too, or the runs the reset skipped would
  // all fall due at once behind it.
  if (t->is_periodic()) t->extras().nominal = due;
  if (was_head || is_head) update_next_due(lk);
  if (is_head) wake_for_new_head(lk);
  wake_if_due_on_manual_clock(lk, due);
  return true;
}

// ---------------------------------------------------------------- async_delay waits

// A terminated pool's heap takes nothing: the termination is decided under mtx_, and a
// wait looks at the termination again under it before its push (it may have passed the first
// look just before), so it is either in the heap when the last worker decides - and then
// holds the termination, unless it is a wheel's tick - or refused (false: the caller
// completes it aborted; a tick goes idle). Tested by
// `a_wait_added_as_its_pool_terminates_is_refused_and_completes_aborted` (hook
// wait_before_lock) (test/handover/pool.cpp).
bool pool_core::add_wait(wait_node* n, clock::time_point due, clock::time_point current) {
  pool_engine& e = engine(*this);
  METRONOME_POOL_CALL(e.calls_);
  n->set_due(due);
  if (e.state_.terminated()) return false;
  // A wheel's tick is timed after shutdown() too: the wheel delivers until termination;
  // so is a cancel_after's deadline, as a delayed one-shot task is (keeps_deadline).
  const bool keeps_deadline = e.keeps_deadline(n);
  const bool kept_after_shutdown = n->untracked_ || keeps_deadline;
  if (due > current && (!e.state_.at_least(lifecycle::shutdown) || kept_after_shutdown)) {
    METRONOME_TEST_HOOK(hook_point::wait_before_lock);
    std::unique_lock lk(e.mtx_, std::defer_lock);
    lock_as_timed_producer(lk);
    if (e.state_.terminated()) return false;
    // Cancelled before it got here (wait_node::adding_): queued aborted, never timed.
    const bool cancelled = std::exchange(n->adding_, false) && n->cancel_before_add_;
    if (!cancelled && (!e.state_.at_least(lifecycle::shutdown) || kept_after_shutdown)) {
      e.heap_push(lk, n, current); // may throw std::bad_alloc with nothing queued
      e.ask_clock_after_outside_push(lk);
      return true;
    }
    if (cancelled) n->aborted_ = true;
  }
  if (e.state_.at_least(lifecycle::shutdown) && !keeps_deadline) n->aborted_ = true; // (a due deadline emits)
  // Its time had passed at initiation: its start counts as queue wait from now, as typed
  // work's whose delay had passed (record_wait_start). It queues behind the waits and
  // tasks already due (promoted first, one load when none is), as typed work due now
  // does: waits of one due time complete in initiation order. Tested by
  // `a_wait_initiated_past_its_due_time_queues_behind_waits_already_due`.
  promote_due_before(current);
  if (due < current) n->set_due(current);
  push_ready(n);
  return true;
}

bool pool_engine::heap_remove(const held_lock& lk, timed_node* n) noexcept {
  assert_held(lk, mtx_);
  if (n->heap_index_ == not_in_heap) return false;
  const bool was_head = heap_.is_head(n);
  heap_.remove(n);
  if (is_tick(n)) --ticks_in_heap_;
  if (was_head) {
    update_next_due(lk);
    // A hosted core's host times the old head: let it time the new one (or nothing, so
    // that its context may run out of work).
    if (host_) host_->request_drive();
  }
  heap_.shrink_if_sparse();
  return true;
}

pool_engine* pool_engine::take_wait_out(const held_lock& lk, pool_anchor* anchor, std::uint32_t generation,
                                        wait_node* n) noexcept {
  assert_held(lk, anchor->mtx);
  pool_engine* core = engine(anchor->pool());
  if (!core || anchor->generation != generation) return nullptr; // the pool is gone
  return core->heap_remove(lk, n) ? core : nullptr;              // or the wait already left the queue
}

// A handle's completion ended elsewhere (scheduled_task_base::deliver_elsewhere): queued
// on the task's pool, as Asio posts a handler with no executor of its own to its I/O
// object's executor. Into the ready queue under the mutex, in transit until the wake-up
// is done, so that the pool neither terminates without running it nor is destroyed
// under the push (cancel_wait's rule). The node is a completion: after shutdown_now() a
// worker discards it, and its discard delivers too (as an aborted wait's). False,
// nothing queued, when the pool is gone or terminated: no thread of it would run it.
// Tested by `a_completion_queued_on_a_pool_being_destroyed_runs_on_its_worker_before_the_pool_goes`
// (hook completion_before_wake, test/handover/pool.cpp) and, raced by the pool's ending,
// `plain_callback_waits_ended_by_cancel_race_the_pool_s_ending` (test/stress/pool.cpp).
bool pool_engine::post_completion(pool_anchor* anchor, std::uint32_t generation, task_base* n) noexcept {
  pool_engine* core = nullptr;
  {
    std::lock_guard lk(anchor->mtx);
    core = engine(anchor->pool());
    if (!core || anchor->generation != generation || core->state_.terminated()) return false;
    core->ready_.push(n);
    ++core->in_transit_;
  }
  METRONOME_TEST_HOOK(hook_point::completion_before_wake);
  core->maybe_wake_after_push();
  core->cancel_delivered();
  return true;
}

void pool_core::cancel_wait(pool_anchor* anchor, std::uint32_t generation, wait_node* n) noexcept {
  pool_engine* core = nullptr;
  {
    std::unique_lock lk(anchor->mtx);
    core = pool_engine::take_wait_out(lk, anchor, generation, n);
    if (!core) {
      // Not in the queue yet: add_wait() reads this under the same mutex (wait_node::adding_).
      // Tested by `a_stop_request_before_the_wait_is_queued_completes_it_stopped`
      // (hook wait_before_lock, test/handover/execution.cpp).
      if (n->adding_) n->cancel_before_add_ = true;
      return;
    }
    n->aborted_ = true;
    // Into the ready queue before the mutex goes: a pool that is being joined sees it
    // and cannot terminate (and drop the completion) once the heap is empty. In transit
    // until the wake-up below is done, so that the pool is not destroyed under it.
    core->ready_.push(n);
    ++core->in_transit_;
  }
  core->maybe_wake_after_push();
  core->cancel_delivered();
}

bool pool_core::withdraw_wait(pool_anchor* anchor, std::uint32_t generation, wait_node* n) noexcept {
  std::unique_lock lk(anchor->mtx);
  pool_engine* core = pool_engine::take_wait_out(lk, anchor, generation, n);
  // A deadline kept after shutdown() held a terminating pool up: its workers look again.
  // Invariant: the removal and the wake-up happen under one hold of the pool's mutex
  // (anchor->mtx is it), so a worker parked as the leader until that deadline looks at
  // the heap only after both - it cannot miss the wake and sleep on to a deadline that
  // is gone. Tested by `an_operation_completing_after_shutdown_lets_its_timing_pool_terminate`
  // (test/unit/cancel_after.cpp: the worker held through shutdown() at worker_before_park,
  // then as the leader at leader_before_wait while the operation ends; the deadline an
  // hour away) and the stress round `cancel_after_deadlines_race_their_timing_pool_s_shutdown`
  // (test/stress/async_delay.cpp).
  if (core && core->state_.seeks_termination()) core->wake_all(lk);
  return core != nullptr;
}

void pool_core::promote_due_before(clock::time_point current) noexcept {
  engine(*this).promote(current, pool_engine::promoter::by_producer);
}

// ---------------------------------------------------------------- running scheduled tasks

void pool_engine::run_scheduled(scheduled_task_base* t) noexcept {
  if (t->bound_) {
    hand_off_bound(t);
    return;
  }
  if (!t->try_start()) { // cancelled while queued
    t->release();
    return;
  }
  const clock::time_point started = now();
  record_start(t, started);
  std::exception_ptr e = t->invoke();
  if (this_thread_orphaned && t->kind_ == task_kind::periodic) {
    t->finish_cancelled(true);
    t->release();
    return;
  }
  if (t->kind_ == task_kind::one_shot) {
    t->finish(std::move(e));
    t->release();
    return;
  }
  if (e) {
    if (task_sink* sink = t->sink())
      sink->report(e);
    else
      report(e);
    if (t->extras().periodic.on_error == on_exception::stop) {
      end_periodic(t, std::move(e));
      return;
    }
  }
  reschedule(t, started);
}

// One relaxed store on the worker's own counters; off the pool's workers (a serial
// executor's drain elsewhere) one relaxed RMW on the pool's shared ones.
void pool_engine::record_start(const timed_node* t, clock::time_point started) noexcept {
  const std::size_t b = latency_histogram::bucket_of(started - t->due());
  worker* w = this_worker;
  if (w != nullptr && w->pool == this) {
    latency_counters::bump_owned(t->timed_ ? w->latency.lateness[b] : w->latency.queue_wait[b]);
  } else {
    (t->timed_ ? shared_latency_.lateness[b] : shared_latency_.queue_wait[b]).fetch_add(1, std::memory_order_relaxed);
  }
}

// A sampled post (post_op) weighs post_sample_every: the histogram estimates every post.
void pool_engine::record_post_wait(worker& w, const op_node* t) noexcept {
  const auto waited = now().time_since_epoch() - clock::duration(t->queued_at_);
  const std::size_t b = latency_histogram::bucket_of(waited);
  latency_counters::bump_owned(w.latency.queue_wait[b], pool_stats::post_sample_every);
}

// A wait that fell due (async_delay, cancel_after): as a delayed task, lateness when it
// went through the delay queue, else queue wait from its initiation (add_wait). Aborted
// waits and a wheel's ticks are not timed.
void pool_engine::record_wait_start(const wait_node* n) noexcept {
  if (n->aborted_ || n->untracked_) return;
  record_start(n, now());
}

void pool_engine::record_lateness_here(clock::time_point due) noexcept {
  worker* w = this_worker;
  if (w == nullptr) return;
  const std::size_t b = latency_histogram::bucket_of(w->pool->now() - due);
  latency_counters::bump_owned(w->latency.lateness[b]);
}

void pool_engine::run_detached(scheduled_task_base* t) noexcept {
  if (t->bound_) {
    if (std::exception_ptr e = t->hand_off(true)) print_unhandled(e, "handing a task to its executor");
    return;
  }
  run_once(t);
}

void pool_engine::run_once(scheduled_task_base* t) noexcept {
  if (!t->try_start()) {
    t->wait_for_settled_cancel(); // a bound one's run on its executor, whose context may go next
    t->release();
    return;
  }
  // A periodic task's last run (handed back by shutdown_now(), or run detached): a
  // cancel() during it returned true, so it ends cancelled - as on the pool, where the
  // run's end finds the request and does not reschedule - unless the run threw (its
  // error, as there). Tested by `a_cancel_during_a_handed_back_periodic_run_ends_it_cancelled`.
  std::exception_ptr e = t->invoke();
  if (!e && t->cancel_was_requested()) {
    t->finish_cancelled(true);
    t->release();
    return;
  }
  t->finish(std::move(e));
  t->release();
}

// ---------------------------------------------------------------- tasks bound to an executor

// A bound task (a callable with an associated executor of its own, bind_executor) waits
// in this pool like any task; when a worker takes it, the worker dispatches it to that
// executor (hand_off_bound) and the whole run happens there (run_bound).
//
// Invariant: exactly one bound_run owns the pool's reference on a handed-over task, and
// the task stays pending until try_start() on the bound executor: a cancel() in between
// wins (true) and the run never happens; a bound_run destroyed unrun (the executor's
// context destroyed or shut down) ends the task cancelled (drop_bound). The pool does not
// wait for a handed-over task (its executor may never run again), so every later touch
// of the pool goes through the anchor (enter_live: the pool if it exists and has not
// terminated, held in transit until cancel_delivered()). A periodic task away on its
// executor counts as tracked work of the pool (join() without shutdown() keeps waiting,
// as for a periodic task in the heap) until its run has rescheduled it, or it ended.
// Tested by `a_periodic_run_ending_on_its_executor_as_the_pool_is_destroyed_ends_cancelled`
// (hook bound_before_reschedule) and `a_bound_task_cancelled_after_its_hand_over_never_runs`
// (hook bound_before_dispatch), test/handover/pool.cpp.
void pool_engine::hand_off_bound(scheduled_task_base* t) noexcept {
  if (t->phase() != scheduled_task_base::pending) { // cancelled while queued
    t->wait_for_settled_cancel(); // before the pool may terminate and destroy its strands' service
    t->release();
    return;
  }
  // Out of the ready queue, though still pending: a submission that then meets the
  // pool terminated must not wait for it to leave (submit_scheduled). Tested by
  // `a_submission_that_meets_the_terminated_pool_after_its_bound_task_was_handed_over_returns`.
  t->mark_left_queue(scheduled_task_base::handed_over);
  // The pool's part of its lateness: up to the hand-over (its wait on the bound executor
  // is that executor's, as for an async_delay handler bound elsewhere).
  record_start(t, now());
  if (t->is_periodic()) work_started();
  METRONOME_TEST_HOOK(hook_point::bound_before_dispatch);
  if (std::exception_ptr e = t->hand_off(false)) report(e); // failed before anything ran: the pool is here
}

pool_engine* pool_engine::enter_live(const scheduled_task_base* t) noexcept {
  pool_anchor* a = t->anchor();
  std::lock_guard lk(a->mtx);
  pool_engine* core = engine(a->pool());
  if (!core || a->generation != t->generation() || core->state_.terminated()) return nullptr;
  ++core->in_transit_;
  return core;
}

void pool_engine::run_bound(scheduled_task_base* t, bool detached) noexcept {
  if (detached || t->kind_ == task_kind::one_shot) {
    run_once(t); // needs nothing of the pool
    return;
  }
  if (!t->try_start()) { // cancelled after the hand-over
    drop_bound(t, false);
    return;
  }
  clock::time_point started = clock::now();
  if (pool_engine* p = enter_live(t)) {
    started = p->now(); // the pool's clock (a manual one)
    p->cancel_delivered();
  }
  std::exception_ptr e = t->invoke();
  METRONOME_TEST_HOOK(hook_point::bound_before_reschedule);
  if (pool_engine* p = enter_live(t)) {
    p->end_bound_run(t, std::move(e), started);
    return;
  }
  // The pool is gone or terminated: this run was the last (its destructor cancels
  // periodic tasks it still holds). A run that threw ends with its exception.
  if (e) {
    print_unhandled(e, "periodic task");
    t->finish(std::move(e));
    t->release();
    return;
  }
  t->finish_cancelled(true);
  t->release();
}

// In transit (enter_live): as run_scheduled after a run, then lets go of the tracked
// work and of the transit.
void pool_engine::end_bound_run(scheduled_task_base* t, std::exception_ptr e, clock::time_point started) noexcept {
  bool again = true;
  if (e) {
    report(e);
    if (t->extras().periodic.on_error == on_exception::stop) {
      end_periodic(t, std::move(e));
      again = false;
    }
  }
  if (again) reschedule(t, started);
  METRONOME_TEST_HOOK(hook_point::bound_run_before_leaving);
  work_finished();
  cancel_delivered();
}

void pool_engine::drop_bound(scheduled_task_base* t, bool detached) noexcept {
  t->finish_cancelled(); // false when a cancel() came first: cancelled either way
  if (!detached && t->is_periodic()) {
    if (pool_engine* p = enter_live(t)) {
      p->work_finished();
      p->cancel_delivered();
    }
  }
  t->release();
}

void run_bound_task(scheduled_task_base* t, bool detached) noexcept { pool_engine::run_bound(t, detached); }
void drop_bound_task(scheduled_task_base* t, bool detached) noexcept { pool_engine::drop_bound(t, detached); }

// A periodic task that will not run again completes (done, with its error if any).
void pool_engine::end_periodic(scheduled_task_base* t, std::exception_ptr e) noexcept {
  t->finish(std::move(e));
  t->release();
}

void pool_engine::reschedule(scheduled_task_base* t, clock::time_point started) noexcept {
  const clock::time_point current = now();
  const task_extras& x = t->extras();
  const bool jittered = x.periodic.jitter > 0.0;
  // The run's time on the schedule: with jitter, its un-jittered due time (the first
  // run is not jittered). The run scheduled at the end of the clock's range is the last
  // (due at max again, it would run for ever once a manual clock got there) - decided
  // on the schedule, so the jitter's draw cannot move it (a draw below max ran it again).
  const clock::time_point scheduled = jittered && x.nominal != clock::time_point{} ? x.nominal : t->due();
  if (scheduled == clock::time_point::max()) {
    end_periodic(t, nullptr);
    return;
  }
  const clock::time_point next =
      jittered ? next_jittered_due(t->extras(), t->due(), started, current)
               : next_periodic_due(x.fixed_delay, x.periodic.missed, x.period, t->due(), started, current);

  METRONOME_TEST_HOOK(hook_point::reschedule_before_lock);
  std::unique_lock lk(mtx_);
  if (state_.ends_periodic(opts_.continue_periodic_after_shutdown) || !t->try_rearm()) {
    lk.unlock();
    t->finish_cancelled(true);
    t->release();
    return;
  }
  t->set_due(next);
  t->timed_ = true; // every run after the first has a due time, even one already passed
  if (next > current) {
    try {
      heap_push(lk, t, current);
      return;
    } catch (...) {
      // Out of memory for the next run: the task ends with the error (its handle's get()
      // throws it, the handler hears of it) rather than the worker dying.
      std::exception_ptr e = std::current_exception();
      lk.unlock();
      if (t->try_start()) { // else a cancel won in between: it stays cancelled
        report(e);
        end_periodic(t, e);
      } else {
        t->release();
      }
      return;
    }
  }
  lk.unlock();
  if (task_sink* sink = t->sink()) {
    if (sink->enqueue_due(t)) sink->post_owed_drain();
  } else {
    push_ready(t);
  }
}

} // namespace metronome::detail
