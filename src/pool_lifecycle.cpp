// The pool's lifecycle: shutdown, shutdown_now, the destructor's close, join and
// termination, stats, and the restart of a pool's threads in a forked child.
#include "pool_engine.hpp"
#include <metronome/detail/test_hooks.hpp>

#include "fork_hooks.hpp"
#include "pool_internal.hpp"

#include <cassert>
#include <new>

#include <pthread.h>

namespace metronome::detail {

namespace {

// Links n in front of the chain `head` (through next_; n is out of every queue).
template <class Node>
void link_front(Node*& head, Node* n) noexcept {
  n->next_.store(head, std::memory_order_relaxed);
  head = n;
}

// The chain reversed (so that a chain built with link_front keeps its taking order).
template <class Node>
Node* reversed(Node* head) noexcept {
  Node* out = nullptr;
  while (head) {
    Node* next = static_cast<Node*>(head->next_.load(std::memory_order_relaxed));
    head->next_.store(out, std::memory_order_relaxed);
    out = head;
    head = next;
  }
  return out;
}

} // namespace

// ---------------------------------------------------------------- termination

// The termination invariant (docs/design.md): the pool terminates only when, under mtx_,
// every live worker but the caller (and a destructor running on one of them) is parked,
// nothing is ready, delayed (save wheels' ticks) or in transit (a promotion's serial
// drains, a cancel's completions), no wheel wait is undelivered, and no tracked work is
// outstanding - unless the pool is shut down or being destroyed, when tracked work can
// only be finished by work from the pool's own threads, and none is left. Only a shut
// down or joined pool looks for it (park()). A producer that pushes after the check
// sees the termination and drops (and reports) its work.
bool pool_engine::idle_for_termination(const held_lock& lk, int awake_expected) const noexcept {
  assert_held(lk, mtx_);
  return awake_ == awake_expected &&
         state_.may_terminate({.queued = !ready_.empty() || heap_.size() != ticks_in_heap_ || in_transit_ != 0 || clock_askers_ != 0,
                               .wheel_waits = wheel_waits_.load() != 0,
                               .hand_overs = hand_overs_.load() != 0,
                               .tracked_work = tracked_work_.load() != 0});
}

// ---------------------------------------------------------------- hand-overs to a strand

// The library hands work the pool accepted (a bound task, an operation's completion, a
// wheel timeout bound to an executor) to an executor over this pool that is not the
// pool's own: an Asio strand over it, a serial executor, any_io_executor holding one.
// When another thread has just locked that strand (its post of the strand's invoker has
// not reached the pool yet), the work waits in the strand's queue where the pool cannot
// see it. Were the pool to terminate meanwhile, it would refuse that invoker (a
// terminated pool runs nothing, and `post` never runs a handler inline) and the work
// would be lost.
//
// Invariant: after shutdown() (or during join() or the destructor), the pool does not
// terminate while a hand-over is counted, i.e. between begin_hand_over() and the work's
// run (end_hand_over_here(), on a worker of this pool) or its destruction unrun
// (end_hand_over(), through the anchor). The locked strand's invoker is on its way
// then (queued, running, or being posted by the thread that locked it), so the count
// always comes down while the pool lives. shutdown_now() and a destructor called from
// one of the pool's own tasks do not wait for it: they destroy strand invokers anyway.
//
// Who counts it up keeps the pool from terminating at that moment: a worker of this pool
// (awake: the termination check, under mtx_, comes after its park), else the caller
// takes mtx_ and counts nothing on a terminated pool. Counted down on a worker of this
// pool, it needs no lock either: that worker is awake and looks for the termination when
// it parks. Stop-here tests (hook outside_post_before_push, test/handover/pool.cpp):
// `a_bound_task_queued_behind_a_strand_an_outside_poster_locked_runs_before_the_pool_terminates`
// and its completion and coroutine variants.
bool pool_core::begin_hand_over() noexcept {
  pool_engine& e = engine(*this);
  if (running_in_this_thread()) {
    e.hand_overs_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  std::lock_guard lk(e.mtx_);
  if (e.state_.terminated()) return false;
  e.hand_overs_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void pool_core::end_hand_over(const pool_core* core, pool_anchor* anchor, std::uint32_t generation) noexcept {
  // On a worker of that pool, the pool exists and that worker is awake.
  if (pool_core* here = current(); here != nullptr && here == core) {
    engine(here)->end_hand_over_here();
    return;
  }
  pool_engine::end_hand_over_through(anchor, generation);
}

void pool_engine::end_hand_over_through(pool_anchor* anchor, std::uint32_t generation) noexcept {
  std::unique_lock lk(anchor->mtx);
  pool_engine* core = engine(anchor->pool());
  if (!core || anchor->generation != generation) return; // the pool is gone
  if (core->hand_overs_.fetch_sub(1, std::memory_order_relaxed) == 1 && core->state_.seeks_termination())
    core->wake_all(lk); // parked workers look for the termination again
}

void pool_core::wheel_wait_done() noexcept {
  pool_engine& e = engine(*this);
  if (e.wheel_waits_.fetch_sub(1, std::memory_order_seq_cst) == 1) {
    std::unique_lock lk(e.mtx_);
    if (e.state_.seeks_termination() || e.state_.closing) e.wake_all(lk);
  }
}

// A worker in the reactor counts as parked, but it could still run an I/O completion
// (one the reactor had ready, or an operation a caller aborts by closing its socket once
// the pool reads terminated). So the pool terminates only with nobody in the reactor: the
// caller interrupts the reactor waiter instead, which finds the pool idle on its way out
// and terminates it (park()); "terminated" means no thread of the pool runs user code any
// more. Stop-here test: `a_pool_is_not_terminated_while_a_worker_is_in_its_reactor`
// (hook reactor_before_wait, test/unit/scheduled_thread_pool/io.cpp).
void pool_engine::terminate(const held_lock& lk) noexcept {
  assert_held(lk, mtx_);
  if (reactor_.holder() != nullptr && reactor_.holder() != this_worker) {
    interrupt_reactor(lk);
    return;
  }
  state_.set_terminated();
  METRONOME_TEST_HOOK(hook_point::worker_terminating);
  // A producer may have pushed between our emptiness check and the store above; it
  // will see the termination and drop its work. If the queue is not empty now, we back off.
  if (!ready_.empty()) {
    state_.take_back_termination();
    return;
  }
  parking_.wake_all();
  interrupt_reactor(lk);
  terminated_cv_.notify_all();
}

// ---------------------------------------------------------------- shutdown

void pool_engine::shutdown() {
  timed_node* gone = nullptr;
  {
    std::unique_lock lk(mtx_);
    if (state_.at_least(lifecycle::shutdown)) return;
    state_.advance_to(lifecycle::shutdown);
    sweep_for_shutdown(lk, gone);
    update_next_due(lk);
    gone = queue_aborted_waits(lk, gone);
    ++in_transit_; // until the wheels over this pool have queued their aborted waits
    wake_all(lk);
  }
  discard_chain(gone);
  {
    std::lock_guard lk(wheels_mtx_);
    for (pool_shutdown_listener* w : wheels_) w->on_pool_shutdown();
  }
  std::unique_lock lk(mtx_);
  leave_transit(lk);
}

void pool_engine::attach_wheel(pool_shutdown_listener* w) {
  std::lock_guard lk(wheels_mtx_);
  wheels_.push_back(w);
}

void pool_engine::detach_wheel(pool_shutdown_listener* w) noexcept {
  std::lock_guard lk(wheels_mtx_);
  std::erase(wheels_, w);
}

// Takes out of the heap what shutdown() does not keep (per the two options).
void pool_engine::sweep_for_shutdown(const held_lock& lk, timed_node*& gone) noexcept {
  assert_held(lk, mtx_);
  heap_.remove_if(
      [this](timed_node* n) {
        if (n->kind_ == task_kind::wait) // a wheel's tick stays (add_wait), and a kept deadline
          return !is_tick(n) && !keeps_deadline(static_cast<const wait_node*>(n));
        if (n->kind_ == task_kind::periodic) return !opts_.continue_periodic_after_shutdown;
        return !opts_.run_delayed_after_shutdown;
      },
      [&](timed_node* n) { link_front(gone, n); });
  gone = reversed(gone);
}

// Waits in `gone` are aborted and queued as ready work here, under
// the mutex, so that the pool never looks idle (and terminates) while they are on their
// way; what is left (tasks to cancel) the caller discards with discard_chain() after
// releasing the mutex (cancelling runs completion hooks).
timed_node* pool_engine::queue_aborted_waits(const held_lock& lk, timed_node* gone) noexcept {
  assert_held(lk, mtx_);
  task_chain waits, keep;
  while (gone) {
    timed_node* n = gone;
    gone = static_cast<timed_node*>(n->next_.load(std::memory_order_relaxed));
    if (n->kind_ == task_kind::wait) {
      // Completes with operation_aborted on a pool thread, so a coroutine waiting on it
      // resumes where its continuations are still accepted.
      static_cast<wait_node*>(n)->aborted_ = true;
      waits.append(n);
    } else {
      keep.append(n);
    }
  }
  if (waits.count) ready_.push_chain(waits.first, waits.last, waits.count);
  return static_cast<timed_node*>(keep.first);
}

// Empties the heap: its waits are queued aborted (above), the tasks
// returned in due order.
timed_node* pool_engine::drain_heap(const held_lock& lk) noexcept {
  assert_held(lk, mtx_);
  timed_node* gone = nullptr;
  heap_.drain([&](timed_node* n) { link_front(gone, n); });
  ticks_in_heap_ = 0;
  update_next_due(lk);
  return queue_aborted_waits(lk, reversed(gone));
}

void pool_engine::discard_chain(timed_node* first) noexcept {
  while (first) {
    auto* next = static_cast<timed_node*>(first->next_.load(std::memory_order_relaxed));
    discard_task(first, "metronome: work dropped: the pool is shut down");
    first = next;
  }
}

pool_engine::taken_tasks pool_engine::shutdown_now() {
  task_base* taken = nullptr; // ready work first (it became ready earlier), then delayed in due order
  std::size_t count = 0;
  {
    std::unique_lock lk(mtx_);
    state_.advance_to(lifecycle::stop);
    // async_delay waits are not returned: they go back to the ready queue, aborted, and a
    // worker discards them (their handlers destroyed unrun, on the pool's own threads).
    // Completed here, on the caller's thread, a wait's node was freed while a task on the
    // pool - the handler's context - could still be emitting on its cancellation slot.
    task_chain waits;
    task_base* ready = nullptr;
    auto take = [&](task_base* t) {
      if (t->is_completion()) {
        waits.append(t);
        return;
      }
      if (t->is_scheduled()) // its submission may be waiting to see it leave (submit_scheduled)
        static_cast<scheduled_task_base*>(t)->mark_left_queue(scheduled_task_base::returned);
      t->next_.store(ready, std::memory_order_relaxed);
      ready = t;
      ++count;
    };
    // Called from one of this pool's tasks: that thread's continuations (defer) come first
    // - they would have run right after it. (Another worker's stay with it: dropped and
    // reported when it exits.)
    if (running_in_this_thread())
      while (this_worker->local_head) take(pop_local(*this_worker));
    {
      ready_queue::consumer_guard g(ready_);
      for (;;) {
        if (task_base* t = ready_.pop(g)) {
          take(t);
          continue;
        }
        if (ready_.empty()) break;
        ready_.wait_for_link(g); // a producer between its exchange and its link
      }
    }
    if (waits.count) ready_.push_chain(waits.first, waits.last, waits.count);
    timed_node* delayed = drain_heap(lk); // its waits go the same way
    for (timed_node* n = delayed; n; n = static_cast<timed_node*>(n->next_.load(std::memory_order_relaxed))) ++count;
    ++in_transit_; // until the wheels over this pool have queued their aborted waits
    // `ready` is newest first: reversed, then `delayed` (in due order) after it.
    taken = reversed(ready);
    task_base* tail = taken;
    while (tail && tail->next_.load(std::memory_order_relaxed)) tail = tail->next_.load(std::memory_order_relaxed);
    if (tail)
      tail->next_.store(delayed, std::memory_order_relaxed);
    else
      taken = delayed;
    wake_all(lk);
  }
  // The wheels over this pool abort their pending waits, as for shutdown(): each goes to
  // the ready queue, where a worker discards it (their handlers destroyed unrun). A wait
  // left in a wheel kept the pool from terminating: join() never returned.
  {
    std::lock_guard lk(wheels_mtx_);
    for (pool_shutdown_listener* w : wheels_) w->on_pool_shutdown();
  }
  {
    std::unique_lock lk(mtx_);
    leave_transit(lk);
  }
  return taken_tasks{taken, count};
}

void pool_engine::discard_taken(task_base* head) noexcept {
  // No memory for the caller's list: nothing taken is silently lost, every task is cancelled.
  while (head) {
    task_base* next = head->next_.load(std::memory_order_relaxed);
    discard_task(head, "metronome: work dropped: the pool was shut down now");
    head = next;
  }
}

task_base* pool_engine::next_taken(taken_tasks& taken, const net::execution_context* pool) noexcept {
  task_base* t = taken.head;
  taken.head = t->next_.load(std::memory_order_relaxed);
  t->next_.store(nullptr, std::memory_order_relaxed);
  if (t->kind_ == task_kind::wait) {
    t->complete(false); // completes with operation_aborted
    return nullptr;
  }
  if (t->strand_invoker_) {
    // An Asio strand's invoker holds the pool's executor and runs handlers that post to
    // the pool: handed out, it could outlive the pool. Destroyed here, unrun, while the
    // pool exists; the strand's handlers go with the strand, as at an io_context's
    // destruction. Test: `shutdown_now_destroys_a_strand_s_invoker_instead_of_returning_it`.
    discard_task(t, nullptr);
    return nullptr;
  }
  if (!t->is_scheduled()) return t;
  auto* st = static_cast<scheduled_task_base*>(t);
  if (st->phase() != scheduled_task_base::pending) {
    st->release(); // cancelled while it waited
    return nullptr;
  }
  if (st->bound_context() == pool) {
    // Bound to this pool itself (a strand or serial executor over it, its own
    // executor): stopped, it could never run there, and its callable's copies of the
    // executor must go before the pool does. Cancelled here, while the pool exists.
    discard_task(t, nullptr);
    return nullptr;
  }
  return t;
}

void pool_engine::close() noexcept {
  if (state_.forked_child) {
    discard_left_in_child();
    return;
  }
  if (!state_.terminated()) {
    timed_node* gone = nullptr;
    task_sink* owed = nullptr;
    {
      std::unique_lock lk(mtx_);
      state_.advance_to(lifecycle::shutdown);
      state_.closing = true;
      promote_due(lk, now(), owed);
      gone = drain_heap(lk);
      // In transit until discard_chain() has ended them: the tasks' handles queue their
      // waits' completions on this pool (post_completion), which must not terminate
      // first (they would run here, inside the destructor). Tested by
      // `a_destructor_held_before_ending_its_delayed_tasks_keeps_the_pool_for_their_waits`
      // (hook close_before_discard, test/handover/pool.cpp).
      if (gone) ++in_transit_;
      wake_all(lk);
    }
    post_owed_drains(owed);
    METRONOME_TEST_HOOK(hook_point::close_before_discard);
    discard_chain(gone);
    if (gone) cancel_delivered();
  }
  if (running_in_this_thread()) {
    // Destroyed from one of our own tasks: help run what is ready, this thread's
    // deferred continuations included, then let the others terminate; this thread is
    // detached and never touches the pool again.
    worker& self = *this_worker;
    for (;;) {
      task_base* t = self.local_head ? pop_local(self) : ready_.pop_wait();
      if (!t) break;
      run_task(self, t);
    }
    std::unique_lock lk(mtx_);
    state_.closer_in_pool = true;
    if (!state_.terminated() && idle_for_termination(lk, 1)) terminate(lk);
    wake_all(lk);
    this_thread_orphaned = true;
    this_worker = nullptr; // the rest of the task runs on a thread of no pool
  } else if (this_hook_pool == this) {
    // Destroyed from one of its own threads' hooks: that thread is detached (join_threads)
    // and leaves without touching the pool again (worker_main). In its start hook it is
    // counted awake, which would keep the others from terminating: it gives that up; and
    // with no other thread awake, it terminates the pool itself (none may be left to).
    // Stop hooks run awake only in a terminated pool, or retiring (not counted).
    std::unique_lock lk(mtx_);
    if (this_thread_in_start_hook && !state_.terminated()) --awake_;
    if (!state_.terminated() && idle_for_termination(lk, 0)) terminate(lk);
    wake_all(lk);
    this_thread_orphaned = true;
  }
  join_threads();
}

void pool_engine::join() {
  if (running_in_this_thread() || this_hook_pool == this) // (its thread hooks run on its threads too)
    throw std::logic_error("metronome: join() called from one of the pool's threads");
  {
    std::unique_lock lk(mtx_);
    state_.joining = true;
    wake_all(lk);
    terminated_cv_.wait(lk, [this] { return state_.terminated(); });
  }
  METRONOME_TEST_HOOK(hook_point::join_before_threads);
  join_threads();
}

// Joins the workers one at a time (allocating nothing: the destructor's path), without
// holding the mutex while it waits; a worker running this detaches its own thread.
void pool_engine::join_threads() {
  std::lock_guard jl(join_mtx_);
  std::unique_lock lk(mtx_);
  terminated_cv_.wait(lk, [this] { return state_.terminated(); });
  for (;;) {
    std::thread th;
    for (auto& w : workers_) {
      if (w->thread.joinable()) {
        th = std::move(w->thread);
        break;
      }
    }
    if (!th.joinable()) return;
    lk.unlock();
    if (th.get_id() == std::this_thread::get_id())
      th.detach();
    else
      th.join();
    lk.lock();
  }
}

bool pool_core::await_termination(clock::duration timeout) {
  pool_engine& e = engine(*this);
  std::unique_lock lk(e.mtx_);
  auto deadline = saturating_add(clock::now(), timeout);
  return e.terminated_cv_.wait_until(lk, deadline, [&e] { return e.state_.terminated(); });
}

bool pool_core::is_shutdown() const noexcept {
  return engine(*this).state_.at_least(lifecycle::shutdown, std::memory_order_acquire);
}
bool pool_core::is_terminated() const noexcept { return engine(*this).state_.terminated(std::memory_order_acquire); }
std::size_t pool_core::thread_count() const noexcept {
  return engine(*this).live_.load(std::memory_order_relaxed);
}
void pool_core::wheel_wait_started() noexcept { engine(*this).wheel_waits_.fetch_add(1, std::memory_order_seq_cst); }

pool_stats pool_core::stats() const {
  pool_stats s;
  const pool_engine& e = engine(*this);
  std::lock_guard lk(e.mtx_);
  s.threads = e.live_.load();
  s.completed = e.retired_completed_.load();
  e.shared_latency_.add_to(s);
  for (auto& w : e.workers_) {
    if (w->exited) continue;
    s.active += w->busy.load(std::memory_order_relaxed) ? 1 : 0;
    s.completed += w->completed.load(std::memory_order_relaxed);
    w->latency.add_to(s);
  }
  s.ready_queued = e.ready_.size();
  s.delayed_queued = e.heap_.size() - e.ticks_in_heap_; // (wheels' ticks are not the user's work)
  s.rejected = e.rejected_.load();
  s.largest_pool_size = e.largest_.load();
  return s;
}

// ---------------------------------------------------------------- fork

void ensure_fork_hooks() noexcept {
  static const bool registered = [] {
    ::pthread_atfork(
        [] {
          wheels_prepare_fork();
          pools_prepare_fork();
          stripes_prepare_fork();
        },
        [] {
          stripes_parent_after_fork();
          pools_parent_after_fork();
          wheels_parent_after_fork();
        },
        [] {
          stripes_child_after_fork();
          pools_child_after_fork();
          wheels_child_after_fork();
        });
    return true;
  }();
  (void)registered;
}

// Every live pool, for the fork hooks. No pool's mutex is taken while this list's mutex
// is held, except by the hooks.
struct fork_registry {
  std::mutex m;
  pool_engine* head = nullptr;

  static fork_registry& get() {
    static fork_registry* r = [] {
      ensure_fork_hooks();
      return new fork_registry; // never destroyed: pools may outlive static destruction order
    }();
    return *r;
  }
  static void prepare() {
    fork_registry& r = get();
    r.m.lock();
    for (pool_engine* p = r.head; p; p = p->fork_next_) p->lock_for_fork();
  }
  static void parent() {
    fork_registry& r = get();
    for (pool_engine* p = r.head; p; p = p->fork_next_) p->unlock_after_fork();
    r.m.unlock();
  }
  static void child() {
    fork_registry& r = get();
    for (pool_engine* p = r.head; p; p = p->fork_next_) {
      p->ready_.repair_after_fork(); // a producer of the parent may have stopped mid-push
      p->unlock_after_fork();
      if (p->state_.restart_after_fork.load(std::memory_order_relaxed))
        p->restart_in_child();
      else
        p->terminate_in_child();
    }
    r.m.unlock();
  }
};

void pools_prepare_fork() noexcept { fork_registry::prepare(); }
void pools_parent_after_fork() noexcept { fork_registry::parent(); }
void pools_child_after_fork() noexcept { fork_registry::child(); }

void pool_engine::enroll_for_fork() noexcept {
  fork_registry& r = fork_registry::get();
  std::lock_guard lk(r.m);
  fork_next_ = r.head;
  if (r.head) r.head->fork_prev_ = this;
  r.head = this;
}

void pool_engine::leave_fork_registry() noexcept {
  fork_registry& r = fork_registry::get();
  std::lock_guard lk(r.m);
  if (fork_prev_)
    fork_prev_->fork_next_ = fork_next_;
  else
    r.head = fork_next_;
  if (fork_next_) fork_next_->fork_prev_ = fork_prev_;
  fork_prev_ = fork_next_ = nullptr;
}

// Before fork(): no thread of this pool is inside the mutex or a pop when the child's
// copy is made (the child then finds both free).
void pool_engine::lock_for_fork() noexcept {
  mtx_.lock();
  ready_.consumer_lock().lock();
}

void pool_engine::unlock_after_fork() noexcept {
  ready_.consumer_lock().unlock();
  mtx_.unlock();
}

// In the child, after unlock_after_fork(): none of the workers exist. Their records
// describe threads of the parent (neither joinable nor detachable here), and the
// condition variables and the join mutex may count waiters or an owner that are gone.
void pool_engine::forget_threads_in_child() noexcept {
  for (auto& w : workers_) {
    ::new (&w->thread) std::thread(); // the parent's handle, never joined here
    // Not freed: the forking thread may be one of these workers, inside a task, with its
    // record in use until the task returns (its thread then ends: orphaned below).
    (void)w.release();
  }
  workers_.clear();
  // (A hosted core's worker record is the host thread's while it drives: not orphaned.)
  if (!host_ && this_worker != nullptr && this_worker->pool == this) this_thread_orphaned = true;
  // Hand-overs and calls of the parent's other threads never finish here.
  in_transit_ = 0;
  clock_askers_ = 0;
  clock_ask_owed_ = false;
  calls_.store(0);
  parking_.reset_in_child();
  ::new (&terminated_cv_) std::condition_variable();
  ::new (&join_mtx_) std::mutex();
  awake_ = 0;
  threads_.store(0);
  live_.store(0);
}

// A hosted core (the one kind that restarts): it has no thread to forget or restart, and
// keeps its work, as its context's own pending operations do; the context's threads in
// the child drive it.
void pool_engine::restart_in_child() noexcept {
  std::lock_guard lk(mtx_);
  forget_threads_in_child();
}

// Any other pool of the parent: terminated in the child (its work is the parent's, and
// runs there). Submissions are refused as by a terminated pool; join(), await_termination()
// and the destructor return at once (they waited for workers that do not exist here).
void pool_engine::terminate_in_child() noexcept {
  std::lock_guard lk(mtx_);
  forget_threads_in_child();
  state_.forked_child = true;
  state_.advance_to(lifecycle::shutdown);
  state_.set_terminated();
}

// The destructor, in the child: what the parent's pool had queued is destroyed unrun
// (handles cancelled, waits aborted, executor work destroyed without a report), not
// left for ever.
void pool_engine::discard_left_in_child() noexcept {
  timed_node* delayed = nullptr;
  task_base* left = nullptr;
  {
    std::unique_lock lk(mtx_);
    delayed = drain_heap(lk); // its waits join the ready queue, aborted
    ready_queue::consumer_guard g(ready_);
    while (task_base* t = ready_.pop(g)) link_front(left, t);
  }
  discard_chain(delayed); // typed tasks only: cancelled
  while (left) {
    task_base* next = left->next_.load(std::memory_order_relaxed);
    discard_task(left, nullptr); // not reported: as Asio's destroyed io_context does
    left = next;
  }
}

} // namespace metronome::detail
