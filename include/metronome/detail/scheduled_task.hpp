// Scheduled task nodes: one-shot and periodic tasks with a handle, and their results.
#ifndef METRONOME_DETAIL_SCHEDULED_TASK_HPP
#define METRONOME_DETAIL_SCHEDULED_TASK_HPP

#include <metronome/detail/hand_over_hold.hpp>
#include <metronome/detail/node_cache.hpp>
#include <metronome/detail/pool_anchor.hpp>
#include <metronome/detail/task.hpp>
#include <metronome/detail/test_hooks.hpp>

#include <algorithm>
#include <cassert>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <utility>

namespace metronome::detail {

// Called once when a scheduled task reaches a terminal state (async_wait).
// `by_runner`: the thread that ran the task is ending it (its last run returned, threw,
// or saw a cancel); false for every other ending (cancel(), dispose(), shutdown_now(),
// the pool's destruction), whose completions never run inside the call that caused it.
// Listed, while it waits, in a bucket of the task's parking stripe, not in the task node
// (scheduled_task_base::add_hook(), src/scheduled_task.cpp).
struct completion_hook {
  completion_hook* next_ = nullptr;
  completion_hook** pprev_ = nullptr; // the link that points at it while listed, else null
  const void* waited_ = nullptr;      // the task it waits for while listed
  virtual void on_complete(bool by_runner) noexcept = 0;

protected:
  ~completion_hook() = default;
};

class scheduled_task_base;

// Where a due scheduled task goes instead of running on the pool that timed it: a
// serial executor's queue.
class task_sink {
public:
  // Queues t (taking over the pool's reference). Called under the timing pool's mutex,
  // in due order, so due tasks keep their order whatever the pool size. Returns true
  // when the caller owes this sink a drain: it calls post_owed_drain() once, after
  // releasing the mutex (posting may take the mutex again).
  virtual bool enqueue_due(scheduled_task_base* t) noexcept = 0;
  virtual void post_owed_drain() noexcept = 0;
  // An exception of one of its periodic tasks (the sink's handler hears of it).
  virtual void report(std::exception_ptr e) noexcept = 0;
  // The task is being destroyed: drop it from any registry.
  virtual void forget(scheduled_task_base* t) noexcept = 0;

  // Links sinks owed a drain while the pool's mutex is held (at most one list at a
  // time: a sink is owed a drain only by the producer that raised its count from 0).
  task_sink* owed_next_ = nullptr;

protected:
  ~task_sink() = default;
};

// Fields only periodic tasks and tasks of a serial executor need: carried inline by
// those node types only (same allocation), so that a plain one-shot task stays small.
struct task_extras {
  std::shared_ptr<task_sink> sink;         // set for tasks of a serial executor
  scheduled_task_base* reg_prev = nullptr; // the serial executor's registry (for dispose)
  scheduled_task_base* reg_next = nullptr;
  clock::duration period{0};
  bool fixed_delay = false;
  periodic_options periodic;
  // With jitter: the un-jittered due time of the current run (time_point{} before the
  // first reschedule) and the task's generator state.
  clock::time_point nominal{};
  std::uint64_t jitter_state = 0;
};

// The state shared by a scheduled task and its handles. One allocation holds the
// node, the callable and the result. Reference counted: one reference per handle
// and one while the pool holds it (queued or running).
//
// The state word's phases, and what each event does to them (one atomic word: every
// transition is one compare-exchange, so of two racing events exactly one wins). Who
// acts: R the runner (the worker that took the task, or the thread a bound task was
// handed to), H a handle (any thread), L a thread holding the pool's mutex, D whoever
// drops a task unrun (shutdown_now's pending_task destroyed, a terminated pool, an
// executor destroying a bound task's hand-over). "no" is a refusal: false, nothing
// changes. `finish()` is the runner's alone, from running; every other cell is walked
// by `every_transition_of_the_task_state_table` (test/unit/detail/task_states.cpp).
//
// | from \ event         | try_start (R) | try_rearm (R, periodic) | finish_cancelled (R, D) | begin_cancel (L) | cancel() (H)                          |
// |----------------------|---------------|-------------------------|-------------------------|------------------|---------------------------------------|
// | pending              | running       | no                      | cancelled               | cancelled        | cancelled (bound: settling until no dispatch of it is left) |
// | running              | no            | pending                 | cancelled               | no               | periodic: running + cancel_requested; one-shot: no |
// | running + cancel_req | no            | no                      | cancelled               | no               | no                                    |
// | done, cancelled      | no            | no                      | no                      | no               | no                                    |
//
// Flags beside the phase: has_waiters (kept through every transition: set by a wait()
// or an async_wait before it waits; the ending takes the waits only if it is set),
// cancel_requested (a cancel() during a periodic run: that run ends it), settling (a
// bound task's cancel() still destroying its callable: cancelled for the pool, not yet
// done for its handles), and how a task still pending left the ready
// queue, set once and never cleared (handed_back, returned, handed_over).
class scheduled_task_base : public timed_node {
public:
  // State word: low bits are the phase, high bits flags.
  static constexpr std::uint32_t pending = 0, running = 1, done = 2, cancelled = 3;
  static constexpr std::uint32_t phase_mask = 0x7;
  static constexpr std::uint32_t cancel_requested = 0x8; // periodic run in progress
  static constexpr std::uint32_t has_waiters = 0x10;
  // How a task pushed from outside left the ready queue of a pool that terminated
  // (pool_core::submit_scheduled): found pending by a producer clearing the queue (its
  // submission rejects it), or taken by shutdown_now() (returned as a pending_task).
  static constexpr std::uint32_t handed_back = 0x20;
  static constexpr std::uint32_t returned = 0x40;
  // Taken by a worker and handed to its executor: a bound task stays pending until it
  // starts there, yet it has left the ready queue (pool_engine::hand_off_bound).
  static constexpr std::uint32_t handed_over = 0x100;
  // A bound task cancelled by a handle's cancel() that has not finished it yet: cancelled
  // for the pool (nothing starts it), not yet done for its handles, until no thread is
  // inside a dispatch of it any more (cancel(), src/scheduled_task.cpp).
  static constexpr std::uint32_t settling = 0x80;
  // A move-only result was claimed by a reader (claim_value, take_value): set once the
  // task is done, when no transition rewrites the word any more.
  static constexpr std::uint32_t value_taken = 0x200;

  // The actions a node type's function (complete_, one per type: no vtable, eight bytes
  // less per node) takes beyond discard and run: what a virtual would otherwise do.
  // `io` points at each one's argument or result (the member that sends it says which).
  enum : unsigned {
    invoke_action = 2,
    destroy_callable_action,
    hand_off_action,
    hand_off_detached_action,
    bound_context_action,
    extras_action,
    dispatchers_action,
    keep_error_action,
    kept_error_action,
    delete_action
  };

  // `act`: the node type's function (scheduled_task::act).
  scheduled_task_base(pool_core* pool, complete_fn act) noexcept;

  // Nodes come from the node cache, only through make_scheduled_task (construct_node),
  // which knows the node's lifetime; the sized delete frees them there again (delete_action
  // deletes the node as its own type, which passes its size).
  static void* operator new(std::size_t size) = delete;
  static void operator delete(void* p, std::size_t size) noexcept { node_deallocate(p, size); }

  // The pool that times this task. Only for the pool's own paths (it is alive while
  // it runs or queues the task); handles go through the anchor.
  pool_core* pool() const noexcept { return anchor_id_.anchor()->pool(); }

  void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      if (task_sink* s = sink()) s->forget(this);
      act(delete_action, nullptr);
    }
  }
  // Adds a reference unless the task is already being destroyed.
  bool try_add_ref() noexcept {
    std::uint32_t n = refs_.load(std::memory_order_relaxed);
    while (n != 0)
      if (refs_.compare_exchange_weak(n, n + 1, std::memory_order_relaxed)) return true;
    return false;
  }

  std::uint32_t phase() const noexcept { return state_.load(std::memory_order_acquire) & phase_mask; }
  // What a handle sees: ended (done or cancelled), and not still settling.
  bool is_terminal() const noexcept { return ended(state_.load(std::memory_order_acquire)); }
  bool is_cancelled() const noexcept {
    const std::uint32_t s = state_.load(std::memory_order_acquire);
    return (s & phase_mask) == cancelled && ended(s);
  }
  bool is_periodic() const noexcept { return kind_ == task_kind::periodic; }
  // A cancel() came during this periodic task's run (it returned true).
  bool cancel_was_requested() const noexcept { return (state_.load(std::memory_order_acquire) & cancel_requested) != 0; }
  void mark_left_queue(std::uint32_t how) noexcept { state_.fetch_or(how, std::memory_order_acq_rel); }
  bool is_handed_back() const noexcept { return (state_.load(std::memory_order_acquire) & handed_back) != 0; }
  // Out of the ready queue for good: handed back, returned, handed over, run or cancelled.
  bool has_left_queue() const noexcept {
    const std::uint32_t s = state_.load(std::memory_order_acquire);
    return (s & (handed_back | returned | handed_over)) != 0 || (s & phase_mask) != pending;
  }

  // Handle-side operations (src/scheduled_task.cpp).
  bool cancel() noexcept;
  bool reset(clock::duration delay) noexcept; // re-key in the delay queue (see scheduled_future::reset)
  void wait() const;
  bool wait_until(clock::time_point real_deadline) const;
  clock::duration delay() const noexcept;
  // false when the task already ended (the caller delivers the result itself).
  // Runs `n` (the completion of a wait whose handler has no executor of its own, ended by
  // a call that must not run it inline) on this task's pool: queued there as any of its
  // work (after shutdown_now(), a worker discards it: `n` must deliver on discard too).
  // Never throws; when that pool is gone or terminated, no thread of it would run it:
  // `n` runs on the calling thread instead.
  void deliver_elsewhere(task_base* n) const noexcept;
  bool add_hook(completion_hook* h) noexcept;
  // Takes h out of the list if the task has not ended (then the caller completes it).
  bool remove_hook(completion_hook* h) noexcept;
  std::exception_ptr failure() const; // cancelled_error, the task's exception, or null
  void rethrow_if_failed() const;
  // A done task's move-only result may be moved out once: true for the first caller
  // (any handle, any thread), false after.
  bool take_value() const noexcept {
    return (state_.fetch_or(value_taken, std::memory_order_acq_rel) & value_taken) == 0;
  }

  // Pool-side operations.
  bool try_start() noexcept;        // pending -> running
  // running -> done, by its runner: destroys the callable, then keeps `e`, the run's
  // exception, in its storage (kept_error()), or null.
  void finish(std::exception_ptr e = nullptr) noexcept;
  // pending/running -> cancelled, destroys callable. `by_runner`: see completion_hook.
  bool finish_cancelled(bool by_runner = false) noexcept;
  bool try_rearm() noexcept;        // running -> pending unless cancel requested
  // pending -> cancelled, without the rest of finish_cancelled(): for a caller holding a
  // lock that notifications must not run under. complete_cancel(old) finishes it.
  bool begin_cancel(std::uint32_t& old) noexcept;
  void complete_cancel(std::uint32_t old) noexcept {
    destroy_callable();
    notify_terminal(old, false);
  }

  // Runs the callable: the exception it threw, or null.
  std::exception_ptr invoke() noexcept {
    std::exception_ptr e;
    act(invoke_action, &e);
    return e;
  }
  void destroy_callable() noexcept { act(destroy_callable_action, nullptr); }
  // A bound task (bound_): dispatches a bound_run owning the caller's reference to the
  // callable's associated executor (inline when that executor lets the calling thread run
  // it). `detached`: a run outside the pool (pending_task, caller_runs) - once, as
  // run_detached. Returns the exception of a failed dispatch (the task then ended
  // cancelled), else null. Unbound tasks return null at once.
  std::exception_ptr hand_off(bool detached) noexcept {
    std::exception_ptr e;
    act(detached ? hand_off_detached_action : hand_off_action, &e);
    return e;
  }
  // A bound task's executor's execution context (null: unbound, cancelled, or an
  // executor with no such context). shutdown_now() ends instead of returning a task
  // bound to the stopping pool itself (a strand over it), which could never run there.
  const net::execution_context* bound_context() const noexcept {
    const net::execution_context* c = nullptr;
    act(bound_context_action, &c);
    return c;
  }

  // Where a bound task's run on its executor finds its pool (src/pool_delay.cpp).
  pool_anchor* anchor() const noexcept { return anchor_id_.anchor(); }
  std::uint32_t generation() const noexcept { return anchor_id_.generation(); }

  // A thread inside a dispatch of this bound task to its executor (hand_off), linked per
  // thread. Between enter_dispatch() and leave_dispatch() it holds a reference and counts
  // in its dispatch count (dispatchers()): the task does not end (finish, cancel) until every other thread has
  // left its dispatch, so that once a handle says done, no pool thread still touches the
  // executor (its context may then be destroyed: a strand's, an io_context's).
  struct dispatch_frame {
    const scheduled_task_base* task;
    dispatch_frame* prev;
  };
  void enter_dispatch(dispatch_frame& f) noexcept;
  void leave_dispatch(dispatch_frame& f) noexcept;
  // Before letting go of a bound task that a handle's cancel() ended: waits until that
  // cancel() has settled (see cancel(), src/scheduled_task.cpp).
  void wait_for_settled_cancel() const noexcept;

  task_sink* sink() const noexcept { return has_extras_ ? extras_of()->sink.get() : nullptr; }
  // Only for node types made with extras (periodic, serial executor).
  task_extras& extras() noexcept { return *extras_of(); }

protected:
  // The node's own task_extras (has_extras_), or null. Asked of the node's type, not a
  // pointer field: eight bytes less per node (docs/benchmarks.md, "The node in 96 bytes"
  // and "The node in 80 bytes").
  task_extras* extras_of() const noexcept {
    task_extras* x = nullptr;
    act(extras_action, &x);
    return x;
  }
  // A bound task's count of threads inside a dispatch of it (enter_dispatch()), kept
  // beside its executor copy (bound_executor_of); null for an unbound task.
  std::atomic<std::uint32_t>* dispatchers() const noexcept {
    std::atomic<std::uint32_t>* n = nullptr;
    act(dispatchers_action, &n);
    return n;
  }
  // Stores a finished run's exception where the callable was (finish()).
  void keep_error(std::exception_ptr e) noexcept { act(keep_error_action, &e); }
  // The exception finish() kept, or null.
  std::exception_ptr kept_error() const noexcept {
    std::exception_ptr e;
    act(kept_error_action, &e);
    return e;
  }

  // Discard and run, for every node type (they do not depend on it).
  static void complete_common(task_base* t, unsigned action);

  ~scheduled_task_base() = default; // delete_action destroys the node as its own type

private:
  // One of the node type's actions (above); never throws for those.
  void act(unsigned action, void* io) const noexcept {
    complete_(const_cast<scheduled_task_base*>(this), action, io);
  }

  static bool ended(std::uint32_t s) noexcept { return (s & phase_mask) >= done && (s & settling) == 0; }
  void notify_terminal(std::uint32_t old_state, bool by_runner) noexcept;
  // Before a terminal transition of a bound task: waits until no other thread is inside
  // a dispatch of it (a thread that dispatches it runs it inline: it does not wait).
  void wait_for_dispatchers() const noexcept;
  bool take_out_of_queue(bool in_transit) noexcept;
  // A wait's first step (wait(), wait_until(), add_hook()), under the task's stripe
  // mutex: flags the task (has_waiters) and returns the word it replaced. ended() on it:
  // the ending has passed and will not look for this wait (notify_terminal()).
  std::uint32_t flag_waiting() const noexcept { return state_.fetch_or(has_waiters, std::memory_order_acq_rel); }

  pool_anchor_id anchor_id_; // the pool's anchor and its generation (see pool_anchor.hpp)
  mutable std::atomic<std::uint32_t> state_{pending};
  std::atomic<std::uint32_t> refs_{1};
  // Its async waits are listed by its stripe, not here (add_hook(), src/scheduled_task.cpp).
};

// The two ends of a bound task's hand-over to its executor (src/pool_delay.cpp): its run
// there, and the hand-over destroyed unrun (the task ends cancelled). See the invariant
// above pool_engine::run_bound.
void run_bound_task(scheduled_task_base* t, bool detached) noexcept;
void drop_bound_task(scheduled_task_base* t, bool detached) noexcept;

// The function object a bound task is dispatched as: it owns the pool's reference on the
// task until it runs or is destroyed unrun, so an executor that destroys it (its
// io_context destroyed, a terminated pool) ends the task cancelled instead of losing it.
// Handed by a worker to a strand over its own pool, it also keeps that pool from
// terminating until then (Hold: hand_over_hold), as the strand's queue hides it.
template <class Hold>
class bound_run {
public:
  bound_run(scheduled_task_base* t, bool detached) noexcept : t_(t), detached_(detached) {}
  bound_run(bound_run&& o) noexcept
      : t_(std::exchange(o.t_, nullptr)), detached_(o.detached_), hold_(std::move(o.hold_)) {}
  bound_run& operator=(bound_run&&) = delete;
  ~bound_run() {
    if (t_) drop_bound_task(t_, detached_);
  }
  template <class Executor>
  void hold_for(const Executor& ex) noexcept {
    hold_ = Hold::for_executor(ex);
  }
  void operator()() {
    hold_.release(); // on the pool's worker: the pool cannot terminate under the run
    run_bound_task(std::exchange(t_, nullptr), detached_);
  }

private:
  scheduled_task_base* t_;
  bool detached_;
  [[no_unique_address]] Hold hold_; // let go after the destructor's body dropped the task
};

// Whether a callable has an associated executor of its own (bind_executor): the one
// test behind a bound task, a bound wheel timeout and a handle's wait hook. The default
// is named: Asio 1.37 (Boost 1.90) changed associated_executor's own (system_executor to
// inline_executor).
template <class F>
inline constexpr bool has_own_executor =
    !std::is_same_v<net::associated_executor_t<F, net::system_executor>, net::system_executor>;

// The executor a bound task is handed to, kept without outstanding work: the task holds
// none on it while it waits in the pool (the callable's own copy is the user's choice).
template <class E>
auto without_outstanding_work(const E& ex) {
  if constexpr (net::can_prefer<const E&, net::execution::outstanding_work_t::untracked_t>::value)
    return net::prefer(ex, net::execution::outstanding_work.untracked);
  else
    return ex;
}

template <class F, bool Bound>
struct bound_executor_of {
  explicit bound_executor_of(const F& /*f*/) noexcept {}
};
// A copy of the callable's executor, destroyed with the callable (an executor, a strand's,
// must not outlive its context: neither may a handle's node hold one). The hand-over reads
// it while a cancel() may be destroying the callable: a lock of the node's own (one
// atomic flag that blocks with atomic::wait; bound tasks only) orders the two. Executors copy without throwing.
template <class F>
struct bound_executor_of<F, true> {
  using executor = decltype(without_outstanding_work(net::get_associated_executor(std::declval<const F&>())));
  explicit bound_executor_of(const F& f) : ex(without_outstanding_work(net::get_associated_executor(f))) {}

  // The executor's execution context, if it names one (null once reset).
  const net::execution_context* context() noexcept {
    const std::optional<executor> e = copy();
    if (!e) return nullptr;
    if constexpr (requires { net::query(*e, net::execution::context); }) {
      auto* c = &net::query(*e, net::execution::context);
      if constexpr (std::is_convertible_v<decltype(c), const net::execution_context*>) return c;
    }
    return nullptr;
  }

  std::optional<executor> copy() noexcept {
    lock();
    std::optional<executor> out = ex;
    unlock();
    return out;
  }
  void reset() noexcept {
    lock();
    ex.reset(); // (a strand's last copy locks its service: the other side blocks meanwhile)
    unlock();
  }

  // Threads inside a dispatch of the task (scheduled_task_base::enter_dispatch()).
  mutable std::atomic<std::uint32_t> dispatchers{0};

private:
  void lock() noexcept {
    while (busy.exchange(true, std::memory_order_acquire)) busy.wait(true, std::memory_order_relaxed);
  }
  void unlock() noexcept {
    busy.store(false, std::memory_order_release);
    busy.notify_one();
  }
  std::atomic<bool> busy{false};
  std::optional<executor> ex;
};

template <class R>
class scheduled_result : public scheduled_task_base {
public:
  using scheduled_task_base::scheduled_task_base;
  // A done task's value, for one reader (a handle's get(), a wait's completion): null
  // when it may read it (claimed_value() next); for a move-only R that another reader
  // took already, future_already_retrieved (what a second get() throws).
  std::exception_ptr claim_value() const {
    if constexpr (!std::is_copy_constructible_v<R>) {
      if (!take_value()) return std::make_exception_ptr(std::future_error(std::future_errc::future_already_retrieved));
    }
    return nullptr;
  }
  // The value after claim_value(): a copy, or a move-only R moved out.
  R claimed_value() {
    if constexpr (std::is_copy_constructible_v<R>)
      return *value_;
    else
      return std::move(*value_);
  }
  std::optional<R> value_;
};

template <>
class scheduled_result<void> : public scheduled_task_base {
public:
  using scheduled_task_base::scheduled_task_base;
};

struct no_extras {};

// Bound: the callable has an executor of its own (has_own_executor), copied out at
// construction (bound_executor_of).
template <class R, class F, bool Extras, bool Bound = false>
class scheduled_task final : public scheduled_result<R> {
public:
  template <class G>
  scheduled_task(pool_core* pool, G&& g)
      : scheduled_result<R>(pool, &act), bound_ex_(static_cast<const std::remove_reference_t<G>&>(g)) {
    ::new (static_cast<void*>(&storage_)) F(std::forward<G>(g));
    this->storage_holds_ = timed_node::holds_callable;
    this->bound_ = Bound;
    this->has_extras_ = Extras;
  }

private:
  using base = scheduled_task_base;

  // The node type's function: every action of scheduled_task_base's enum, and discard and
  // run. Only discard and run may throw (a run's own failure to reach its executor).
  static void act(task_base* b, unsigned action, void* io) {
    auto* self = static_cast<scheduled_task*>(b);
    switch (action) {
    case base::invoke_action: *static_cast<std::exception_ptr*>(io) = self->invoke(); return;
    case base::destroy_callable_action: self->destroy_callable(); return;
    case base::hand_off_action:
    case base::hand_off_detached_action:
      *static_cast<std::exception_ptr*>(io) = self->hand_off(action == base::hand_off_detached_action);
      return;
    case base::bound_context_action:
      *static_cast<const net::execution_context**>(io) = self->bound_context();
      return;
    case base::extras_action: *static_cast<task_extras**>(io) = self->extras_of(); return;
    case base::dispatchers_action: *static_cast<std::atomic<std::uint32_t>**>(io) = self->dispatchers(); return;
    case base::keep_error_action: self->keep_error(std::move(*static_cast<std::exception_ptr*>(io))); return;
    case base::kept_error_action: *static_cast<std::exception_ptr*>(io) = self->kept_error(); return;
    case base::delete_action: delete self; return;
    default: base::complete_common(b, action); return; // discard_action, run_action
    }
  }

  // What each action does for this type. They hide the base's members of the same
  // names, which reach them through act().
  std::exception_ptr hand_off(bool detached) noexcept {
    if constexpr (Bound) {
      typename scheduled_task_base::dispatch_frame frame{};
      this->enter_dispatch(frame);
      std::exception_ptr failed;
      {
        using executor = typename bound_executor_of<F, Bound>::executor;
        bound_run<hand_over_hold_for<executor>> job(this, detached);
        // None: a cancel() destroyed the callable, and the job drops the task.
        if (auto ex = bound_ex_.copy()) {
          job.hold_for(*ex); // a pool behind it exists: the executor would be dangling otherwise
          try {
            net::dispatch(*ex, std::move(job));
            METRONOME_TEST_HOOK(hook_point::bound_dispatch_returned);
          } catch (...) {
            failed = std::current_exception(); // the bound_run holding the task cancelled it
          }
        }
      } // every copy of the executor this thread made is gone
      this->leave_dispatch(frame);
      return failed;
    }
    return nullptr;
  }

  const net::execution_context* bound_context() const noexcept {
    if constexpr (Bound)
      return bound_ex_.context();
    else
      return nullptr;
  }

  std::exception_ptr invoke() noexcept {
    try {
      F& f = *std::launder(reinterpret_cast<F*>(&storage_));
      if constexpr (std::is_void_v<R>) {
        std::invoke(f);
      } else {
        this->value_.emplace(std::invoke(f));
      }
      return nullptr;
    } catch (...) {
      return std::current_exception();
    }
  }

  void destroy_callable() noexcept {
    if (this->storage_holds_ == timed_node::holds_callable) {
      this->storage_holds_ = timed_node::holds_nothing;
      std::launder(reinterpret_cast<F*>(&storage_))->~F();
      if constexpr (Bound) bound_ex_.reset();
    }
  }

  ~scheduled_task() {
    destroy_callable();
    if (this->storage_holds_ == timed_node::holds_error)
      std::launder(reinterpret_cast<std::exception_ptr*>(&storage_))->~exception_ptr();
  }

  std::atomic<std::uint32_t>* dispatchers() const noexcept {
    if constexpr (Bound)
      return &bound_ex_.dispatchers;
    else
      return nullptr;
  }

  // The callable is gone (finish() destroyed it first): its storage holds the exception
  // instead, so that a node needs no field of its own for it.
  void keep_error(std::exception_ptr e) noexcept {
    ::new (static_cast<void*>(&storage_)) std::exception_ptr(std::move(e));
    this->storage_holds_ = timed_node::holds_error;
  }
  std::exception_ptr kept_error() const noexcept {
    if (this->storage_holds_ != timed_node::holds_error) return nullptr;
    return *std::launder(reinterpret_cast<const std::exception_ptr*>(&storage_));
  }

  task_extras* extras_of() const noexcept {
    if constexpr (Extras)
      return &extras_storage_;
    else
      return nullptr;
  }

  // The callable, then (once it is destroyed, after the task's last run) the exception
  // that run threw: storage_holds_.
  alignas(F) alignas(std::exception_ptr) unsigned char storage_[std::max(sizeof(F), sizeof(std::exception_ptr))];
  [[no_unique_address]] mutable std::conditional_t<Extras, task_extras, no_extras> extras_storage_; // extras_of()
  [[no_unique_address]] mutable bound_executor_of<F, Bound> bound_ex_; // mutable: its lock
};

// A pool task whose callable captures two pointers is one node of the node cache's
// 64-byte class, one cache line (the million-timeout rows hold one per timeout:
// docs/benchmarks.md, "The node in 64 bytes"). Itanium C++ ABI layout, as g++ and clang
// use: the small fields sit in task_base's tail padding; the node type's operations go
// through complete_ (no vtable); the serial/periodic extras, a bound task's dispatch
// count and a run's exception are found through them (the exception in the callable's
// storage); the async waits are listed by the task's stripe; and the anchor is named by
// index and generation in one word.
struct two_pointer_task {
  void* p;
  void* q;
  void operator()() const {}
};
static_assert(sizeof(scheduled_task<void, two_pointer_task, false>) <= 64,
              "metronome: a task with a two-pointer callable is one 64-byte node");

// Extras: the node carries task_extras (periodic tasks, serial executors' tasks). Bound:
// the task runs on its callable's associated executor (the pool's typed API). `lifetime`:
// timed for a task that waits for a due time (node_allocate); freed by its own
// operator delete either way.
template <class R, bool Extras, bool Bound = false, class F>
scheduled_task_base* make_scheduled_task(pool_core* pool, F&& f, task_kind kind,
                                         node_lifetime lifetime = node_lifetime::brief) {
  static_assert(std::is_invocable_v<std::decay_t<F>&>, "metronome: the task must be callable with no arguments");
  if (is_empty_callable(f)) throw std::invalid_argument("metronome: empty function");
  using task = scheduled_task<R, std::decay_t<F>, Extras, Bound>;
  task* t = construct_node<task>(lifetime, pool, std::forward<F>(f));
  t->kind_ = kind;
  return t;
}

// A period or fixed delay: positive and at least the clock's resolution (1 ns); a
// floating-point period below that is refused like one <= 0, never rounded up.
template <class Rep, class Period>
clock::duration checked_period(std::chrono::duration<Rep, Period> period) {
  if (!(period > std::chrono::duration<Rep, Period>::zero()))
    throw std::invalid_argument("metronome: period must be positive");
  auto p = saturating_duration(period);
  if (p <= clock::duration::zero()) throw std::invalid_argument("metronome: period must be at least 1 ns");
  return p;
}

inline void check_jitter(const periodic_options& o) {
  if (!(o.jitter >= 0.0 && o.jitter < 1.0))
    throw std::invalid_argument("metronome: periodic_options::jitter must be in [0, 1)");
}

} // namespace metronome::detail

#endif
