// The pool's producers: pushing ready work (and losing the race with termination), the
// executor path (post, and defer's queue local to a worker), dropping refused work,
// discard_oldest's eviction, and internal_post_scope.
#include <metronome/detail/internal_post.hpp>
#include "pool_engine.hpp"
#include <metronome/detail/scheduled_task.hpp>
#include <metronome/detail/test_hooks.hpp>
#include <metronome/errors.hpp>

#include "pool_internal.hpp"

#include <exception>
#include <mutex>
#include <thread>

namespace metronome::detail {

namespace {
thread_local bool posting_internal = false;
// Counts the calling thread's post_op() calls: every post_sample_every-th is timed.
thread_local unsigned post_tick = 0;
constexpr unsigned post_sample_mask = pool_stats::post_sample_every - 1;
static_assert((pool_stats::post_sample_every & post_sample_mask) == 0, "a power of two");
} // namespace

internal_post_scope::internal_post_scope(bool on) noexcept : outer_(posting_internal) { posting_internal = on; }
internal_post_scope::~internal_post_scope() { posting_internal = outer_; }
bool internal_post_scope::active() noexcept { return posting_internal; }

// ---------------------------------------------------------------- ready queue

bool pool_core::push_ready(task_base* t) noexcept { return engine(*this).push_ready_chain(t, t, 1); }

void pool_core::repost_from_worker(task_base* t) noexcept {
  if (!running_in_this_thread()) {
    push_ready(t);
    return;
  }
  engine(*this).ready_.push(t); // no termination race: this worker is awake, so the pool is not idle
}

bool pool_engine::push_ready_chain(task_base* first, task_base* last, std::size_t count) noexcept {
  ready_.push_chain(first, last, count);
  METRONOME_TEST_HOOK(hook_point::producer_after_push);
  if (state_.terminated() && terminated_for_good()) {
    clear_after_termination();
    return true;
  }
  maybe_wake_after_push();
  if (count > 1 && parking_.someone_parking()) {
    std::unique_lock lk(mtx_);
    wake_some(lk, count - 1);
  }
  return false;
}

// A push lost the race with termination: nobody will run what is in the ready queue.
// Drops and reports it (an Asio strand's invoker too: `post` never runs a handler
// inline; work the pool accepted cannot be queued behind it, see begin_hand_over()),
// save a typed task still pending: marked handed back and not touched again - its submission, which holds a reference, rejects it by its policy
// (submit_scheduled).
void pool_engine::clear_after_termination() noexcept {
  task_base* left = nullptr;
  {
    ready_queue::consumer_guard g(ready_);
    while (task_base* x = ready_.pop(g)) {
      if (x->is_scheduled() && static_cast<scheduled_task_base*>(x)->phase() == scheduled_task_base::pending) {
        static_cast<scheduled_task_base*>(x)->mark_left_queue(scheduled_task_base::handed_back);
        continue;
      }
      x->next_.store(left, std::memory_order_relaxed);
      left = x;
    }
  }
  while (left) {
    task_base* x = left;
    left = x->next_.load(std::memory_order_relaxed);
    if (x->is_scheduled()) { // cancelled in place by discard_oldest, which counted it
      static_cast<scheduled_task_base*>(x)->release();
      continue;
    }
    if (!x->is_completion()) rejected_.fetch_add(1); // a wait aborted is not refused work
    discard_task(x, "metronome: work dropped: the pool has terminated");
  }
}

// terminate() sets the termination and takes it back, under the mutex, when it finds
// work pushed meanwhile: a producer that saw it set looks again under the mutex before
// it drops anything.
bool pool_engine::terminated_for_good() noexcept {
  std::lock_guard lk(mtx_);
  return state_.terminated();
}

void pool_core::post(task_base* t, bool continuation, bool internal) noexcept {
  pool_engine& e = engine(*this);
  METRONOME_POOL_CALL(e.calls_);
  worker* w = this_worker;
  const bool inside = w != nullptr && w->pool == &e;
  if (e.state_.refuses_post(inside, internal || posting_internal)) {
    e.drop_outside(t);
    return;
  }
  if (inside && continuation) {
    t->next_.store(nullptr, std::memory_order_relaxed);
    if (w->local_tail)
      w->local_tail->next_.store(t, std::memory_order_relaxed);
    else
      w->local_head = t;
    w->local_tail = t;
    return;
  }
  if (!inside) METRONOME_TEST_HOOK(hook_point::outside_post_before_push);
  push_ready(t);
}

void pool_core::post_op(op_node* t, bool continuation, bool internal) noexcept {
  t->strand_invoker_ = internal; // post_op's internal work is a strand's invoker
  if ((++post_tick & post_sample_mask) == 0) {
    t->queued_at_ = now().time_since_epoch().count();
    t->sampled_ = true;
  }
  post(t, continuation, internal);
}

void pool_engine::drop_outside(task_base* t) noexcept {
  rejected_.fetch_add(1);
  discard_task(t, state_.at_least(lifecycle::stop) ? "metronome: work dropped: the pool was shut down now"
                                                   : "metronome: work dropped: the pool is shut down");
}

void pool_engine::discard_task(task_base* t, const char* why) noexcept {
  const bool is_op = t->kind_ == task_kind::op;
  discard(t);
  // Every `why` names a shutdown the user asked for (or the terminated pool it left).
  if (is_op && why) report_dropped(std::make_exception_ptr(rejected_execution(why)));
}

// discard_oldest: takes the oldest queued task of the typed API out of the ready queue
// and cancels it (when it is the very last node it is cancelled in place and dropped when
// popped). Executor-path work is never evicted: it may be a serial executor's drain, a
// strand's invoker or a completion. False if no such task is queued.
bool pool_engine::discard_oldest_user_task() noexcept {
  auto is_user_task = [](task_base* n) {
    return n->is_scheduled() && static_cast<scheduled_task_base*>(n)->phase() == scheduled_task_base::pending;
  };
  scheduled_task_base* victim = nullptr;
  bool unlinked = false;
  std::uint32_t old = 0;
  bool cancelled_in_place = false;
  {
    ready_queue::consumer_guard g(ready_);
    task_base* prev = nullptr;
    victim = static_cast<scheduled_task_base*>(ready_.find(is_user_task, prev, g));
    if (victim) {
      unlinked = ready_.unlink(prev, victim, g);
      if (!unlinked && victim->begin_cancel(old)) {
        victim->add_ref(); // keeps it alive once a worker pops and releases it
        cancelled_in_place = true;
      }
    }
  }
  // Notifications outside the consumer lock.
  if (unlinked) {
    victim->finish_cancelled(); // false if a handle's cancel() won first: cancelled either way
    victim->release();          // the queue's reference
    return true;
  }
  if (cancelled_in_place) {
    victim->complete_cancel(old);
    victim->release();
    return true;
  }
  return false;
}

void pool_core::work_finished() noexcept {
  if (tracked_work_.fetch_sub(1) == 1) {
    pool_engine& e = engine(*this);
    std::unique_lock lk(e.mtx_);
    if (e.state_.seeks_termination()) e.wake_all(lk);
  }
}

} // namespace metronome::detail
