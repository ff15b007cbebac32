// The operation states and the sender behind metronome/execution.hpp's schedulers.
#ifndef METRONOME_IMPL_EXECUTION_HPP
#define METRONOME_IMPL_EXECUTION_HPP

#include <metronome/detail/core_access.hpp>
#include <metronome/detail/pool_core.hpp>
#include <metronome/detail/task.hpp>
#include <metronome/detail/wheel_core.hpp>

#include <exec/timed_scheduler.hpp>
#include <stdexec/execution.hpp>

#include <exception>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

namespace metronome {
namespace detail {

// The receiver's stop token and the callback an operation keeps on it while it waits.
// disarm() returns only once a callback running on another thread has returned (the
// stop callback's own rule): after it, no stop request reaches the operation.
template <class Receiver, class Fn>
class stop_hook {
  using token_type = stdexec::stop_token_of_t<stdexec::env_of_t<Receiver>>;

public:
  static constexpr bool stoppable = !stdexec::unstoppable_token<token_type>;

  static bool requested(const Receiver& r) noexcept {
    if constexpr (stoppable)
      return stdexec::get_stop_token(stdexec::get_env(r)).stop_requested();
    else
      return false;
  }
  void arm(const Receiver& r, Fn fn) noexcept {
    if constexpr (stoppable) cb_.emplace(stdexec::get_stop_token(stdexec::get_env(r)), fn);
  }
  void disarm() noexcept {
    if constexpr (stoppable) cb_.reset();
  }

private:
  struct none {};
  std::conditional_t<stoppable, std::optional<stdexec::stop_callback_for_t<token_type, Fn>>, none> cb_;
};

// ---- the pool: one wait in its delay queue (pool_core::add_wait), as async_delay's.
//
// start(): the stop callback is armed before the wait is added, with wait_node::adding_
// set, so a stop request at any moment is seen: before add_wait(), it marks the node and
// add_wait() queues it aborted; after, cancel_wait() takes it out of the delay queue and
// queues it aborted. Either way a worker completes it: set_stopped(). The completing
// worker disarms the callback first (waiting out one that runs), then completes; nothing
// touches the operation after the completion, which may destroy it.
template <class Receiver>
class pool_operation final : public wait_node {
  struct on_stop {
    pool_operation* op;
    void operator()() const noexcept { pool_core::cancel_wait(op->anchor_, op->generation_, op); }
  };
  using hook = stop_hook<Receiver, on_stop>;

public:
  template <class R>
  pool_operation(pool_core& core, exec_due due, R&& r)
      : wait_node(&do_complete), core_(&core), anchor_(core.anchor()), generation_(core.anchor_generation()),
        due_(due), rcvr_(std::forward<R>(r)) {}
  pool_operation(const pool_operation&) = delete;
  pool_operation& operator=(const pool_operation&) = delete;

  void start() & noexcept {
    if (hook::requested(rcvr_)) {
      stdexec::set_stopped(std::move(rcvr_));
      return;
    }
    const clock::time_point current = core_->now();
    adding_ = hook::stoppable;
    stop_.arm(rcvr_, on_stop{this});
    bool queued = false;
    try {
      queued = core_->add_wait(this, due_.at(current), current);
    } catch (...) { // the delay queue could not grow: nothing queued
      stop_.disarm();
      stdexec::set_error(std::move(rcvr_), std::current_exception());
      return;
    }
    if (!queued) { // the pool has terminated
      stop_.disarm();
      stdexec::set_stopped(std::move(rcvr_));
    }
  }

private:
  // run: a worker runs the wait (due, or aborted by a stop request or the pool's
  // shutdown); discard: a stopped pool drops it.
  static void do_complete(task_base* b, unsigned action, void* /*io*/) {
    auto* op = static_cast<pool_operation*>(b);
    op->stop_.disarm();
    if (action == run_action && !op->aborted_ && !hook::requested(op->rcvr_))
      stdexec::set_value(std::move(op->rcvr_));
    else
      stdexec::set_stopped(std::move(op->rcvr_));
  }

  pool_core* core_;
  pool_anchor* anchor_;
  std::uint32_t generation_;
  exec_due due_;
  Receiver rcvr_;
  hook stop_;
};

// ---- a serial executor: the wait in the delay queue of the engine that times the
// executor's delayed work (its pool's, or its context's timing service), then a turn in
// its queue; set_value() runs in the executor's order, one at a time with its other work.
// A due time already passed at start() takes a turn at once (schedule()). While it waits
// in the delay queue the wait is registered with the serial executor (track_wait), whose
// dispose() stops it there as a stop request does; it is forgotten before it completes.
template <class Executor, class Receiver>
class serial_operation final : public wait_node {
  struct on_stop {
    serial_operation* op;
    void operator()() const noexcept { pool_core::cancel_wait(op->anchor_, op->generation_, op); }
  };
  using hook = stop_hook<Receiver, on_stop>;

  // The operation's turn in the serial queue.
  struct turn_node : task_base {
    explicit turn_node(serial_operation* o) noexcept : task_base(&run_turn), op(o) {}
    serial_operation* op;
  };

public:
  template <class R>
  serial_operation(const serial_executor<Executor>& ex, exec_due due, R&& r)
      : wait_node(&do_complete), serial_(ex), timers_(&core_access::serial_state(ex).timers()),
        anchor_(timers_->anchor()), generation_(timers_->anchor_generation()), due_(due), rcvr_(std::forward<R>(r)) {}
  serial_operation(const serial_operation&) = delete;
  serial_operation& operator=(const serial_operation&) = delete;

  void start() & noexcept {
    serial_core& s = core_access::serial_state(serial_);
    if (hook::requested(rcvr_) || s.is_disposed() || s.refuses_outside_work()) {
      stdexec::set_stopped(std::move(rcvr_));
      return;
    }
    const clock::time_point current = timers_->now();
    const clock::time_point due = due_.at(current);
    if (due <= current) {
      take_turn();
      return;
    }
    adding_ = true; // dispose() may cancel it too, before add_wait()
    link_.node = this;
    link_.anchor = anchor_;
    link_.generation = generation_;
    if (!s.track_wait(&link_)) { // disposed meanwhile
      stdexec::set_stopped(std::move(rcvr_));
      return;
    }
    stop_.arm(rcvr_, on_stop{this});
    bool queued = false;
    try {
      queued = timers_->add_wait(this, due, current);
    } catch (...) {
      s.forget_wait(&link_);
      stop_.disarm();
      stdexec::set_error(std::move(rcvr_), std::current_exception());
      return;
    }
    if (!queued) {
      s.forget_wait(&link_);
      finish(false);
    }
  }

private:
  // The wait ran out (run: due, or aborted) on a thread of the timing engine: due, it
  // takes its turn in the serial queue; aborted or dropped, it completes stopped here.
  static void do_complete(task_base* b, unsigned action, void* /*io*/) {
    auto* op = static_cast<serial_operation*>(b);
    core_access::serial_state(op->serial_).forget_wait(&op->link_);
    if (action == run_action && !op->aborted_)
      op->take_turn();
    else
      op->finish(false);
  }
  void take_turn() noexcept {
    if (!core_access::serial_state(serial_).try_enqueue(&turn_)) finish(false); // disposed
  }
  // run: the drain runs the turn; discard: dispose() or an abandoned drain drops it.
  static void run_turn(task_base* b, unsigned action, void* /*io*/) {
    static_cast<turn_node*>(b)->op->finish(action == run_action);
  }
  void finish(bool run) noexcept {
    stop_.disarm();
    if (run && !hook::requested(rcvr_))
      stdexec::set_value(std::move(rcvr_));
    else
      stdexec::set_stopped(std::move(rcvr_));
  }

  serial_executor<Executor> serial_;
  pool_core* timers_;
  pool_anchor* anchor_;
  std::uint32_t generation_;
  exec_due due_;
  Receiver rcvr_;
  hook stop_;
  turn_node turn_{this};
  serial_wait_link link_;
};

// ---- a wheel: one entry in its slots, as a wheel's async_wait (one reference: the
// wheel's, then the executor queue's). A stop request cancels the entry (O(1) unlink);
// every completion, fired or cancelled, is delivered by the executor running the entry
// (a pool worker; elsewhere a posted job) once the last reference goes, after the wheel
// and the executor are done with the node.
//
// The stop callback holds no reference: the completion (on_destroy, the last reference)
// disarms it first, which waits out a callback that runs, so the node outlives every
// callback. start() holds a reference of its own while it inserts the entry and then arms
// the callback (the entry has its wheel by then, and cannot complete meanwhile: the arm
// never races the disarm); a stop request before the arm runs the callback inside it.
// The last reference may go on another thread than the executor's (start()'s, or a
// canceller's that lets go of the wheel's reference after the executor settled the entry):
// the entry then goes to the executor once more (settled_on_ tells), so that the
// completion always runs on a thread that ran the entry.
template <class Receiver>
class wheel_operation final : public wheel_entry {
  struct on_stop {
    wheel_operation* op;
    void operator()() const noexcept { op->cancel(); }
  };
  using hook = stop_hook<Receiver, on_stop>;

  // A cancelled entry on its way to an executor that is not a metronome pool; settled
  // as discarded if the executor destroys it unrun.
  struct settle_job {
    explicit settle_job(wheel_entry* e) noexcept : e_(e) {}
    settle_job(settle_job&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
    settle_job& operator=(settle_job&&) = delete;
    ~settle_job() {
      if (e_) e_->complete(false);
    }
    void operator()() { std::exchange(e_, nullptr)->complete(true); }
    wheel_entry* e_;
  };

public:
  template <class R>
  wheel_operation(wheel_core& wheel, exec_due due, R&& r)
      : wheel_entry(&dispatch_action<wheel_operation>, 1, true), wheel_(&wheel), due_(due),
        rcvr_(std::forward<R>(r)) {
    no_handle_ = true;
  }
  wheel_operation(const wheel_operation&) = delete;
  wheel_operation& operator=(const wheel_operation&) = delete;

  void start() & noexcept {
    if (hook::requested(rcvr_)) {
      stdexec::set_stopped(std::move(rcvr_));
      return;
    }
    {
      // A stop() meanwhile waits for this use of the pool, until the wait is counted on it
      // (which then keeps the pool up until the operation completes). No completion runs
      // inside the use: the receiver's may stop the wheel and destroy the pool.
      const wheel_core::pool_use use(*wheel_);
      pool_ = use.pool();
      if (!pool_) ex_.emplace(wheel_->executor());
      if (pool_) pool_->wheel_wait_started();
    }
    add_ref(); // start()'s own: no completion before the release below
    try {
      wheel_->insert(this, due_.from(wheel_->now()));
    } catch (...) {
      // Refused (stopped wheel, shut-down pool): insert() cancelled and dropped it,
      // which delivers set_stopped through the executor.
    }
    stop_.arm(rcvr_, on_stop{this});
    release();
  }

private:
  friend class wheel_entry;
  static constexpr bool cancellers_hold_refs = false; // the stop callback holds none

  void on_fire() noexcept {
    fired_ = true;
    settled_here();
  }
  // Out of the wheel, never to fire: to the executor, whose run of it settles it.
  void on_drop() noexcept {
    if (fired_ || dropped_) return;
    dropped_ = true;
    add_ref();
    deliver_again();
  }
  // To the executor, with a reference of its own: its run settles the entry (fired or
  // cancelled: nothing more happens) and lets go, which completes the operation.
  void deliver_again() noexcept {
    if (pool_) {
      pool_->push_ready(this);
      return;
    }
    try {
      net::post(*ex_, settle_job(this));
    } catch (...) {
      no_executor_ = true; // out of memory: completes where the last reference goes
      release();
    }
  }
  // The executor runs (or discards) the entry on this thread.
  void settled_here() noexcept { settled_on_ = std::this_thread::get_id(); }
  void on_cancel_queued() noexcept {}
  void on_discarded() noexcept { settled_here(); }
  void on_settled_cancelled(bool) noexcept { settled_here(); }
  // The last reference: the engine is done with the node.
  void on_destroy() noexcept {
    if (settled_on_ != std::this_thread::get_id() && !no_executor_) {
      settled_on_ = std::thread::id();
      add_ref();
      deliver_again(); // its run settles nothing more, and lets go here again
      return;
    }
    stop_.disarm();
    if (pool_) pool_->wheel_wait_done();
    if (fired_ && !hook::requested(rcvr_))
      stdexec::set_value(std::move(rcvr_));
    else
      stdexec::set_stopped(std::move(rcvr_));
  }

  wheel_core* wheel_;
  exec_due due_;
  Receiver rcvr_;
  pool_core* pool_ = nullptr;
  std::optional<net::any_io_executor> ex_;
  hook stop_;
  std::thread::id settled_on_;
  bool fired_ = false;
  bool dropped_ = false;
  bool no_executor_ = false;
};

} // namespace detail

inline pool_scheduler scheduled_thread_pool::get_scheduler() noexcept { return pool_scheduler(*this); }
inline wheel_scheduler wheel_timer::get_scheduler() noexcept { return wheel_scheduler(*this); }
template <class Executor>
serial_scheduler<Executor> serial_executor<Executor>::get_scheduler() const noexcept {
  return serial_scheduler<Executor>(*this);
}

static_assert(exec::timed_scheduler<pool_scheduler>);
static_assert(exec::timed_scheduler<wheel_scheduler>);
static_assert(exec::timed_scheduler<serial_scheduler<scheduled_thread_pool::executor_type>>);

} // namespace metronome

#endif
