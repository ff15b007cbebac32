#ifndef METRONOME_DETAIL_POOL_CORE_HPP
#define METRONOME_DETAIL_POOL_CORE_HPP

#include <metronome/detail/delay_heap.hpp>
#include <metronome/detail/ready_queue.hpp>
#include <metronome/detail/scheduled_task.hpp>
#include <metronome/options.hpp>

#include <boost/asio/execution_context.hpp>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace metronome {
class manual_clock;
class pending_task;
} // namespace metronome

namespace metronome::detail {

// Names the calling library thread (the last 15 characters) and sets its timer slack to
// 1 ns, so that its timed waits (ticks, heap deadlines) end on time.
void init_library_thread(std::string name) noexcept;

// Something told when a manual clock moves.
class clock_listener {
public:
  virtual void on_time_advanced() = 0;

protected:
  ~clock_listener() = default;
};

struct worker;

// The engine behind scheduled_thread_pool: a lock-free ready queue, a delay heap
// under one mutex with leader-follower waiting, and worker threads that spin briefly
// before parking. See docs/design.md for the protocol.
class pool_core final : public clock_listener {
public:
  explicit pool_core(pool_options opts);
  ~pool_core();
  pool_core(const pool_core&) = delete;
  pool_core& operator=(const pool_core&) = delete;

  clock::time_point now() const noexcept;

  // The execution context (scheduled_thread_pool) that owns this core.
  const boost::asio::execution_context* context() const noexcept { return context_; }
  void set_context(const boost::asio::execution_context* c) noexcept { context_ = c; }
  bool is_manual_clock() const noexcept { return manual_ != nullptr; }

  // ---- Asio executor path: never throws.
  // continuation: relationship.continuation (defer) -> this thread's local queue.
  void post(task_base* t, bool continuation) noexcept;
  bool running_in_this_thread() const noexcept;
  void work_started() noexcept { tracked_work_.fetch_add(1, std::memory_order_relaxed); }
  void work_finished() noexcept;

  // ---- Typed API. Takes the pool's reference on t. May throw rejected_execution
  // (abort policy). Returns normally when the task was accepted, discarded or run.
  void submit_scheduled(scheduled_task_base* t, clock::time_point due);

  // A delay wait (async_delay). After shutdown() it is queued already aborted.
  // Returns false only when the pool has terminated (the caller completes the wait
  // with operation_aborted itself).
  // `current`: the pool's time as the caller last read it (saves a clock read).
  bool add_wait(wait_node* n, clock::time_point due, clock::time_point current);
  // Per-operation cancellation: if the wait is still in the delay queue, takes it out
  // and queues it aborted. A wait that already fell due completes normally.
  void cancel_wait(wait_node* n) noexcept;

  // Cancel support: removes t from the heap if it is there (drops the heap's ref).
  void on_cancelled(scheduled_task_base* t) noexcept;

  // Runs a scheduled task once on the calling thread (caller_runs, pending_task).
  static void run_detached(scheduled_task_base* t) noexcept;
  // Runs a scheduled task here and then completes, reports or reschedules it, as a
  // worker does (serial executors drain their tasks through this).
  void run_scheduled(scheduled_task_base* t) noexcept;
  // Queues ready work on this pool (internal: also after shutdown).
  void push_ready(task_base* t) noexcept;
  // From one of this pool's workers: queues t without waking anybody, because the
  // caller goes back to the queue itself as soon as its task returns.
  void push_ready_quiet(task_base* t) noexcept;
  // Queues a linked chain (first..last through next_, count nodes) with one push.
  void push_ready_chain(task_base* first, task_base* last, std::size_t count) noexcept;

  // ---- Lifecycle.
  void shutdown();
  std::vector<pending_task> shutdown_now();
  void join();
  bool await_termination(clock::duration timeout);
  bool is_shutdown() const noexcept { return shutdown_.load(std::memory_order_acquire); }
  bool is_terminated() const noexcept { return terminated_.load(std::memory_order_acquire); }
  // The destructor's path: cancel what is not due, run what is ready, join.
  void close();

  pool_stats stats() const;
  std::size_t thread_count() const noexcept { return threads_.load(std::memory_order_relaxed); }

  void report(std::exception_ptr e) noexcept;

  void on_time_advanced() override;

private:
  friend struct worker;

  void start_worker(bool core);
  void worker_main(worker& w);
  task_base* next_task(worker& w);
  task_base* park(worker& w, std::unique_lock<std::mutex>& lk);
  void run_task(worker& w, task_base* t) noexcept;
  void reschedule(scheduled_task_base* t, clock::time_point started);
  void wake_one() noexcept;
  void wake_some_locked(std::size_t n) noexcept;
  void wake_all_locked() noexcept;
  void wake_for_new_head_locked() noexcept;
  void maybe_wake_after_push() noexcept;
  void join_threads();
  // Moves due heap nodes to the ready queue; caller holds mtx_. Returns the count.
  std::size_t promote_due_locked(clock::time_point now);
  void promote_due(clock::time_point current);
  void update_next_due_locked() noexcept;
  void heap_push_locked(timed_node* n);
  void cancel_task_by_pool(scheduled_task_base* t) noexcept;
  void reject_scheduled(scheduled_task_base* t);
  void drop_outside(task_base* t) noexcept;
  void discard_task(task_base* t) noexcept;
  void abort_timed(timed_node* n) noexcept;
  void drain_inbox_locked() noexcept;
  void push_delayed(timed_node* n, clock::time_point due);
  void sweep_for_shutdown_locked(std::vector<timed_node*>& gone);
  bool idle_for_termination_locked(int awake_expected) const noexcept;
  void terminate_locked() noexcept;

  pool_options opts_;
  manual_clock* manual_;
  const boost::asio::execution_context* context_ = nullptr;
  std::size_t core_threads_;
  std::size_t max_threads_;

  ready_queue ready_;

  alignas(64) std::atomic<int> spinning_{0};
  std::atomic<int> sleepers_{0};

  alignas(64) mutable std::mutex mtx_;
  std::condition_variable follower_cv_;
  std::condition_variable leader_cv_;
  std::condition_variable terminated_cv_;
  delay_heap heap_;
  ready_queue inbox_; // delayed tasks on their way into heap_ (consumer: mtx_ holder)
  std::uint64_t next_seq_ = 0;
  worker* leader_ = nullptr;
  int followers_ = 0;   // workers in follower_cv_ wait
  int wake_tokens_ = 0; // notifications not yet consumed
  int awake_ = 0;       // live workers not parked
  bool joining_ = false;
  bool closing_ = false;        // destructor: ignore tracked work
  bool closer_in_pool_ = false; // the destructor runs on one of our workers
  std::size_t next_worker_id_ = 1;
  std::vector<std::unique_ptr<worker>> workers_;
  std::mutex join_mtx_;
  std::atomic<clock::rep> next_due_;

  std::atomic<bool> shutdown_{false};
  std::atomic<bool> stopped_{false}; // shutdown_now: nothing more starts
  std::atomic<bool> terminated_{false};
  std::atomic<std::size_t> threads_{0};
  std::atomic<std::size_t> largest_{0};
  std::atomic<std::size_t> rejected_{0};
  std::atomic<std::size_t> retired_completed_{0};
  std::atomic<long> tracked_work_{0};
};

} // namespace metronome::detail

#endif
