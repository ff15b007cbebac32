// pool_core: what the library's templates call of the engine behind a scheduled_thread_pool.
// The engine itself - its queues, heap, workers and their hand-overs - is pool_engine
// (src/pool_engine.hpp), the one class derived from this. Each call is declared and
// documented here only, and defined in the engine's files (src/pool_*.cpp) on the
// engine's state. A user's translation unit parses this surface only.
#ifndef METRONOME_DETAIL_POOL_CORE_HPP
#define METRONOME_DETAIL_POOL_CORE_HPP

#include <metronome/detail/pool_anchor.hpp>
#include <metronome/options.hpp>

#include <metronome/detail/asio.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>

namespace metronome::detail {

struct task_base;
struct op_node;
struct wait_node;
class scheduled_task_base;

// Told by a pool's shutdown(), before the pool can terminate (a wheel_timer over the pool
// aborts its pending waits then, as the pool does its own async_delay waits).
class pool_shutdown_listener {
public:
  virtual void on_pool_shutdown() noexcept = 0;

protected:
  ~pool_shutdown_listener() = default;
};

// What a hosted core (a pool engine with no threads of its own, src/timing_service.cpp)
// has in place of workers: an Asio context whose threads run its work.
class core_host {
public:
  // Work was queued, or the heap's head is earlier than what the host times: the host
  // must call drive_hosted() soon on one of its threads. Any thread, under the pool
  // mutex or not; never throws, never runs the drive inside the call.
  virtual void request_drive() noexcept = 0;

protected:
  ~core_host() = default;
};

class pool_core {
public:
  virtual ~pool_core() = default;
  pool_core(const pool_core&) = delete;
  pool_core& operator=(const pool_core&) = delete;

  clock::time_point now() const noexcept;

  // The execution context (scheduled_thread_pool) that owns this core.
  const net::execution_context* context() const noexcept { return context_; }
  void set_context(const net::execution_context* c) noexcept { context_ = c; }
  pool_anchor* anchor() const noexcept { return anchor_; }
  std::uint32_t anchor_generation() const noexcept { return generation_; }

  // ---- Asio executor path: never throws.
  // continuation: relationship.continuation (defer) -> this thread's local queue.
  // internal: work another executor queues on behalf of work it already accepted (an
  // Asio strand's invoker): accepted after shutdown, from any thread, until the pool
  // terminates - dropping it would wedge everything queued behind it.
  void post(task_base* t, bool continuation, bool internal = false) noexcept;
  // The executor's own work (submit_op): as post(), and one in
  // pool_stats::post_sample_every of each thread's posts carries the time it was queued
  // (the others are not timed: a clock read costs about as much as the post itself).
  void post_op(op_node* t, bool continuation, bool internal) noexcept;
  bool running_in_this_thread() const noexcept;
  // The pool whose worker the calling thread is (nullptr on any other thread, and on a
  // worker whose pool was destroyed from inside the task it runs).
  static pool_core* current() noexcept;
  void work_started() noexcept { tracked_work_.fetch_add(1, std::memory_order_relaxed); }
  void work_finished() noexcept;

  // ---- Typed API. Takes the pool's reference on t. May throw rejected_execution
  // (abort policy) or std::bad_alloc (nothing changed: the task is dropped, cancelled).
  // Returns normally when the task was accepted, discarded or run.
  // `current`: the pool's time, read once by the caller (who computed `due` from it).
  void submit_scheduled(scheduled_task_base* t, clock::time_point due, clock::time_point current);
  void submit_scheduled(scheduled_task_base* t, clock::time_point due) { submit_scheduled(t, due, now()); }

  // Typed work due now queues behind every heap task already due at `current`: promotes
  // them first, so that due work keeps (due time, submission) order.
  void promote_due_before(clock::time_point current) noexcept;

  // A delay wait (async_delay, cancel_after). After shutdown() it is queued already
  // aborted. Returns false only when the pool has terminated (the caller completes the
  // wait with operation_aborted itself). @throws std::bad_alloc with nothing queued.
  // `current`: the pool's time as the caller last read it (saves a clock read).
  bool add_wait(wait_node* n, clock::time_point due, clock::time_point current);
  // Per-operation cancellation (a wait's cancellation slot): if the wait is still in the
  // delay queue, takes it out and queues it aborted; a wait that already fell due
  // completes normally. Reaches the pool through the anchor: a no-op once it is gone.
  static void cancel_wait(pool_anchor* anchor, std::uint32_t generation, wait_node* n) noexcept;
  // Takes a wait out of the delay queue without completing it, if the pool still exists
  // and the wait is still queued there. True when it did: the caller now owns the node.
  static bool withdraw_wait(pool_anchor* anchor, std::uint32_t generation, wait_node* n) noexcept;

  // Queues ready work on this pool (internal: also after shutdown). True when the push
  // met a terminated pool (pool_engine::push_ready_chain says what became of the work).
  bool push_ready(task_base* t) noexcept;
  // A serial executor's drain re-posting itself from the worker running it (no wake-up).
  void repost_from_worker(task_base* t) noexcept;

  // ---- Lifecycle and observation (scheduled_thread_pool's members).
  bool await_termination(clock::duration timeout);
  bool is_shutdown() const noexcept;
  bool is_terminated() const noexcept;
  pool_stats stats() const;
  std::size_t thread_count() const noexcept;
  // A wheel wait over this pool, from its creation until a worker has delivered its
  // completion: the pool does not terminate meanwhile.
  void wheel_wait_started() noexcept;
  void wheel_wait_done() noexcept;
  // Work the pool accepted, handed to an executor over it that is not its own (an Asio
  // strand over it): after shutdown() the pool does not terminate until that work has run
  // or been destroyed (hand_over_hold, detail/hand_over_hold.hpp). False, nothing
  // counted, when the pool has terminated.
  bool begin_hand_over() noexcept;
  // The work ran or was destroyed. `core` is only compared: the pool may be gone.
  static void end_hand_over(const pool_core* core, pool_anchor* anchor, std::uint32_t generation) noexcept;

  void report(const std::exception_ptr& e) noexcept;

protected:
  pool_core(pool_anchor* anchor, std::uint32_t generation) noexcept : anchor_(anchor), generation_(generation) {}

  // What the inline members read; the engine keeps the rest.
  const net::execution_context* context_ = nullptr;
  pool_anchor* anchor_;
  std::uint32_t generation_;
  std::atomic<long> tracked_work_{0};
};

} // namespace metronome::detail

#endif
