// Scheduled tasks: their states (pending, running, done, cancelled), cancel, and waiting
// on a handle.
#include "pool_engine.hpp"
#include <metronome/detail/scheduled_task.hpp>
#include <metronome/detail/test_hooks.hpp>
#include <metronome/errors.hpp>

#include "fork_hooks.hpp"

#include <array>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace metronome::detail {

namespace {

// Threads blocked in get()/wait() park on one of a few striped mutex/condvar pairs,
// keyed by the task's address, so a task node carries no mutex of its own. A
// completing task touches a stripe only when its has_waiters flag is set.
// The stripe also lists the async waits (completion hooks) of its tasks, so that a node
// carries no list head either: in one of 16 buckets chosen by more bits of the same
// hash (1,024 buckets in all), each a doubly linked list of the hooks of every task that
// hashes there, under the stripe's mutex. An ending task with waiters walks its bucket.
struct parking_stripe {
  std::mutex mtx;
  std::condition_variable cv;
  std::array<completion_hook*, 16> hooks{};
};

std::array<parking_stripe, 64>& all_stripes() noexcept {
  static std::array<parking_stripe, 64> stripes;
  return stripes;
}

// Where p's waiters are: its stripe, and its hooks' bucket in that stripe (hold the
// stripe's mutex to touch the bucket). One hash: the top bits choose the stripe, the
// next ones the bucket.
struct stripe_place {
  parking_stripe& stripe;
  completion_hook*& hooks;
};

stripe_place place_of(const void* p) noexcept {
  auto h = reinterpret_cast<std::uintptr_t>(p);
  h ^= h >> 17;
  h *= 0x9E3779B97F4A7C15ull;
  parking_stripe& st = all_stripes()[(h >> 58) & 63];
  return {st, st.hooks[(h >> 54) & 15]};
}

parking_stripe& stripe_for(const void* p) noexcept { return place_of(p).stripe; }

void unlink_hook(completion_hook* h) noexcept {
  *h->pprev_ = h->next_;
  if (h->next_) h->next_->pprev_ = h->pprev_;
  h->next_ = nullptr;
  h->pprev_ = nullptr;
}

} // namespace

// fork(): no stripe is held across it; in the child the condition variables are made
// anew (one that a parent's thread was parked on blocked the child's exit for ever: its
// destructor waited for that waiter).
void stripes_prepare_fork() noexcept {
  for (auto& st : all_stripes()) st.mtx.lock();
}
void stripes_parent_after_fork() noexcept {
  for (auto& st : all_stripes()) st.mtx.unlock();
}
void stripes_child_after_fork() noexcept {
  for (auto& st : all_stripes()) {
    ::new (&st.cv) std::condition_variable();
    st.mtx.unlock();
  }
}

scheduled_task_base::scheduled_task_base(pool_core* pool, complete_fn act) noexcept
    : timed_node(act), anchor_id_(pool->anchor(), pool->anchor_generation()) {
  cancel_removes_first_ = engine(pool)->time_source() != nullptr;
}

void scheduled_task_base::deliver_elsewhere(task_base* n) const noexcept {
  if (!pool_engine::post_completion(anchor(), generation(), n)) n->complete(true);
}

void scheduled_task_base::complete_common(task_base* t, unsigned action) {
  const bool run = action == run_action;
  auto* self = static_cast<scheduled_task_base*>(t);
  if (run) {
    pool_engine::run_detached(self);
  } else {
    self->finish_cancelled();
    self->release();
  }
}

bool scheduled_task_base::try_start() noexcept {
  std::uint32_t s = state_.load(std::memory_order_acquire);
  while ((s & phase_mask) == pending) {
    if (state_.compare_exchange_weak(s, (s & ~phase_mask) | running, std::memory_order_acq_rel)) return true;
  }
  return false;
}

namespace {
thread_local scheduled_task_base::dispatch_frame* dispatch_frames = nullptr;
// The bound tasks whose callable a cancel() on this thread is destroying (settling).
thread_local scheduled_task_base::dispatch_frame* settling_frames = nullptr;

bool on_frames(const scheduled_task_base::dispatch_frame* list, const scheduled_task_base* t) noexcept {
  for (; list; list = list->prev)
    if (list->task == t) return true;
  return false;
}
} // namespace

void scheduled_task_base::enter_dispatch(dispatch_frame& f) noexcept {
  add_ref();
  dispatchers()->fetch_add(1, std::memory_order_acq_rel);
  f.task = this;
  f.prev = dispatch_frames;
  dispatch_frames = &f;
}

// A dispatch that ran the hand-over inline and found the task cancelled let go of the
// pool's reference without waiting for that cancel() (exempt: the cancel() waits for
// this thread to leave). Out of the dispatch, this thread waits for it here, before it
// returns to its pool, which could otherwise terminate and destroy its strand service
// while the cancel() still destroys the strand's last copy. Tested by
// `a_worker_that_ran_a_cancelled_bound_task_inline_waits_for_the_cancel_once_out_of_its_dispatch`.
void scheduled_task_base::leave_dispatch(dispatch_frame& f) noexcept {
  dispatch_frames = f.prev;
  std::atomic<std::uint32_t>& count = *dispatchers();
  if (count.fetch_sub(1, std::memory_order_acq_rel) == 1) count.notify_all(); // (our reference holds the node)
  wait_for_settled_cancel();
  release();
}

// The dispatching thread's tail (Asio's dispatch or post still holds copies of the
// executor after the run may have begun elsewhere) is short and takes no lock the ending
// thread holds: blocks (atomic::wait) until the last dispatcher leaves.
void scheduled_task_base::wait_for_dispatchers() const noexcept {
  if (!bound_) return;
  std::atomic<std::uint32_t>& count = *dispatchers();
  for (std::uint32_t n = count.load(std::memory_order_acquire); n != 0; n = count.load(std::memory_order_acquire)) {
    if (on_frames(dispatch_frames, this)) return; // this thread dispatches it: an inline run ending
    count.wait(n, std::memory_order_acquire);
  }
}

// Invariant: a thread that lets go of a bound task a handle's cancel() won (a worker that
// finds it cancelled, the pool's destructor, a bound_run destroyed by its executor's
// context, a pending_task) waits until that cancel() has settled - destroyed the callable
// and its copies of the executor - unless it is itself inside a dispatch of the task,
// which that cancel() waits for. Once the pool or the executor has let go of the task,
// the executor's context may go (the pool's strand service in its destructor, an
// io_context destroying the hand-over), and a strand copy destroyed after its service
// locks a destroyed mutex. Tested by
// `the_pool_s_destructor_waits_for_a_cancel_destroying_a_bound_task_s_callable_queued_on_its_strand`,
// `a_worker_that_finds_a_bound_task_cancelled_waits_for_the_cancel_to_destroy_its_callable`.
void scheduled_task_base::wait_for_settled_cancel() const noexcept {
  if (!bound_) return;
  for (std::uint32_t s = state_.load(std::memory_order_acquire); (s & settling) != 0;
       s = state_.load(std::memory_order_acquire)) {
    // This thread's own cancel() (settling_frames): destroying the callable dropped the
    // last copy of a strand whose queue held this task's hand-over (a strand left locked
    // by a dropped invoker, kept by the copies of the tasks queued in it), and destroys
    // it here.
    if (on_frames(dispatch_frames, this) || on_frames(settling_frames, this)) return;
    state_.wait(s, std::memory_order_acquire); // the cancel() notifies as it clears settling
  }
}

void scheduled_task_base::finish(std::exception_ptr e) noexcept {
  destroy_callable(); // first: its storage then keeps `e`, and a bound task's executor copy is gone
  wait_for_dispatchers();
  // Hand-over to a handle: `e` is written before the acq_rel exchange to done below, and a
  // handle reads it (failure()) only after an acquire load that saw done. See
  // docs/design.md "Task nodes"; tested by `a_handle_held_between_keeping_the_error_and_done_sees_pending_then_the_error`.
  if (e) keep_error(std::move(e));
  METRONOME_TEST_HOOK(hook_point::runner_error_kept);
  std::uint32_t old = state_.load(std::memory_order_relaxed);
  while (!state_.compare_exchange_weak(old, (old & has_waiters) | done, std::memory_order_acq_rel)) {
  }
  notify_terminal(old, true);
}

bool scheduled_task_base::finish_cancelled(bool by_runner) noexcept {
  wait_for_dispatchers();
  std::uint32_t old = state_.load(std::memory_order_acquire);
  for (;;) {
    if ((old & phase_mask) >= done) {
      wait_for_settled_cancel();
      return false;
    }
    if (state_.compare_exchange_weak(old, (old & has_waiters) | cancelled, std::memory_order_acq_rel)) break;
  }
  destroy_callable();
  notify_terminal(old, by_runner);
  return true;
}

bool scheduled_task_base::begin_cancel(std::uint32_t& old) noexcept {
  old = state_.load(std::memory_order_acquire);
  while ((old & phase_mask) == pending)
    if (state_.compare_exchange_weak(old, (old & has_waiters) | cancelled, std::memory_order_acq_rel)) {
      wait_for_dispatchers(); // short: a dispatch that did not start it returns at once
      return true;
    }
  return false;
}

bool scheduled_task_base::try_rearm() noexcept {
  std::uint32_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    if ((s & phase_mask) != running || (s & cancel_requested)) return false;
    if (state_.compare_exchange_weak(s, (s & has_waiters) | pending, std::memory_order_acq_rel)) return true;
  }
}

// Takes a cancelled task out of its pool's delay queue if the pool still exists (the
// anchor tells: see pool_anchor.hpp) and the node is there; drops the queue's reference
// (the caller's handle keeps one). `in_transit`: the completions are still to come.
bool scheduled_task_base::take_out_of_queue(bool in_transit) noexcept {
  bool removed = false;
  {
    pool_anchor* a = anchor();
    std::unique_lock lk(a->mtx);
    if (a->generation == generation())
      removed = engine(a->pool())->on_cancelled(lk, this, in_transit);
  }
  if (removed) release();
  return removed;
}

bool scheduled_task_base::cancel() noexcept {
  std::uint32_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    const std::uint32_t phase = s & phase_mask;
    if (phase == pending) {
      // A bound task is cancelled settling: see below.
      if (state_.compare_exchange_weak(s, (s & has_waiters) | cancelled | (bound_ ? settling : 0),
                                       std::memory_order_acq_rel)) {
        // We own the callable now: no worker can start it. Java's order (FutureTask's
        // cancel(), then remove(this)): its completions first, while the node still
        // waits in the delay queue - which keeps the pool from terminating meanwhile, as
        // a handle's async_wait may post to this very pool - then out of the queue under
        // the pool mutex, once. On a manual clock the node leaves first and the
        // completions go in transit: the clock, deciding meanwhile, would otherwise move
        // time to a cancelled task's due time. See docs/design.md "A cancel's completions".
        METRONOME_TEST_HOOK(hook_point::handle_before_anchor);
        const bool removed_first = cancel_removes_first_ && take_out_of_queue(true);
        if (removed_first) METRONOME_TEST_HOOK(hook_point::handle_before_completions);
        std::uint32_t before_end = s;
        if (!bound_) {
          destroy_callable();
        } else {
          dispatch_frame settle{this, settling_frames};
          settling_frames = &settle;
          destroy_callable();
          settling_frames = settle.prev;
          // Invariant: once cancel() returned true, or a handle says done, no thread is
          // inside a dispatch of this task (holding copies of its executor, whose context
          // may be destroyed then). A worker that took it before the exchange may be in
          // its dispatch, or enter it only now: the callable's executor copy is gone
          // (destroy_callable, under the copy's lock), so one that enters from here on
          // dispatches nothing, and one that copied it first counts in dispatchers() by
          // now. Waited for only after the winning exchange: a dispatch that did not
          // start the task returns at once, while a cancel() of a periodic run in
          // progress must not wait for the run. Until then the task is settling: the
          // pool sees it cancelled, its handles do not see it done. Tested by
          // `a_cancel_does_not_return_while_a_worker_that_entered_the_dispatch_after_it_holds_the_executor`,
          // `a_bound_task_cancelled_while_its_dispatcher_holds_the_executor_is_not_done_before_it_lets_go`.
          wait_for_dispatchers();
          before_end = state_.fetch_and(~settling, std::memory_order_acq_rel); // waiters that came meanwhile
          state_.notify_all(); // threads blocked in wait_for_settled_cancel() (the handle's reference holds the node)
        }
        notify_terminal(before_end, false); // waits complete elsewhere, never inside cancel()
        if (cancel_removes_first_) {
          // The pool exists: the removal keeps it from terminating until this (in transit).
          if (removed_first) engine(pool())->cancel_delivered();
        } else {
          METRONOME_TEST_HOOK(hook_point::cancel_before_removal);
          take_out_of_queue(false);
        }
        return true;
      }
    } else if (phase == running && kind_ == task_kind::periodic && !(s & cancel_requested)) {
      if (state_.compare_exchange_weak(s, s | cancel_requested, std::memory_order_acq_rel)) return true;
    } else {
      return false;
    }
  }
}

bool scheduled_task_base::reset(clock::duration delay) noexcept {
  if (phase() != pending) return false;
  pool_anchor* a = anchor();
  std::unique_lock lk(a->mtx);
  if (a->generation != generation()) return false; // the pool is gone
  return engine(a->pool())->on_reset(lk, this, delay);
}

// Invariant: every wait (a blocking wait() or a hook) sets has_waiters in the state word,
// under the stripe mutex, before it is listed, and gives up if that read-modify-write
// finds the task ended. The transition that ends a task keeps the flag, and passes the
// word it replaced here. So a task whose old word has no has_waiters has no wait and
// gets none: its ending touches neither the list nor the stripe (one read-modify-write
// less per task). Else its hooks are taken out of the stripe's bucket under the stripe
// mutex, unlisted (a later remove_hook() finds nothing), and complete outside it, newest
// first. Tested by `a_wait_added_as_its_task_ends_completes_exactly_once` (hook
// wait_hook_before_flag) and `waits_on_tasks_sharing_a_bucket_complete_with_their_own_task`.
void scheduled_task_base::notify_terminal(std::uint32_t old_state, bool by_runner) noexcept {
  METRONOME_TEST_HOOK(hook_point::task_before_closing_waits);
  if (!(old_state & has_waiters)) return;
  const stripe_place place = place_of(this);
  completion_hook* taken = nullptr;
  {
    std::lock_guard lk(place.stripe.mtx);
    completion_hook** tail = &taken;
    for (completion_hook* h = place.hooks; h;) {
      completion_hook* next = h->next_;
      if (h->waited_ == this) {
        unlink_hook(h);
        *tail = h;
        tail = &h->next_;
      }
      h = next;
    }
  }
  place.stripe.cv.notify_all();
  while (taken) {
    completion_hook* next = taken->next_;
    taken->on_complete(by_runner);
    taken = next;
  }
}

// The list of waits: changed only under the task's stripe mutex (see notify_terminal()).
bool scheduled_task_base::add_hook(completion_hook* h) noexcept {
  METRONOME_TEST_HOOK(hook_point::wait_hook_before_flag);
  const stripe_place place = place_of(this);
  std::lock_guard lk(place.stripe.mtx);
  if (ended(flag_waiting())) return false;
  completion_hook*& head = place.hooks;
  h->waited_ = this;
  h->next_ = head;
  if (head) head->pprev_ = &h->next_;
  h->pprev_ = &head;
  head = h;
  return true;
}

// False once the ending took it (it completes then).
bool scheduled_task_base::remove_hook(completion_hook* h) noexcept {
  std::lock_guard lk(stripe_for(this).mtx);
  if (!h->pprev_) return false;
  assert(h->waited_ == this);
  unlink_hook(h);
  return true;
}

void scheduled_task_base::wait() const {
  if (is_terminal()) return;
  auto& st = stripe_for(this);
  std::unique_lock lk(st.mtx);
  std::uint32_t s = flag_waiting();
  while (!ended(s)) {
    st.cv.wait(lk);
    s = state_.load(std::memory_order_acquire);
  }
}

bool scheduled_task_base::wait_until(clock::time_point deadline) const {
  if (is_terminal()) return true;
  auto& st = stripe_for(this);
  std::unique_lock lk(st.mtx);
  std::uint32_t s = flag_waiting();
  while (!ended(s)) {
    if (st.cv.wait_until(lk, deadline) == std::cv_status::timeout) return is_terminal();
    s = state_.load(std::memory_order_acquire);
  }
  return true;
}

clock::duration scheduled_task_base::delay() const noexcept {
  if (is_terminal()) return clock::duration::zero();
  METRONOME_TEST_HOOK(hook_point::handle_before_anchor);
  pool_anchor* a = anchor();
  std::lock_guard lk(a->mtx);
  if (a->generation != generation()) return clock::duration::zero(); // the pool is gone
  return due() - a->pool()->now();
}

std::exception_ptr scheduled_task_base::failure() const {
  const std::uint32_t phase = this->phase();
  if (phase == cancelled) return std::make_exception_ptr(cancelled_error());
  if (phase == done) return kept_error();
  return nullptr;
}

void scheduled_task_base::rethrow_if_failed() const {
  if (auto e = failure()) std::rethrow_exception(e);
}

} // namespace metronome::detail
