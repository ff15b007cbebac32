// pool_engine: the engine behind scheduled_thread_pool (its surface for the library's
// templates is detail/pool_core.hpp).
#ifndef METRONOME_SRC_POOL_ENGINE_HPP
#define METRONOME_SRC_POOL_ENGINE_HPP

#include <metronome/detail/clock_listener.hpp>
#include <metronome/detail/pool_anchor.hpp>
#include <metronome/detail/pool_core.hpp>
#include "ready_queue.hpp"
#include <metronome/detail/scheduled_task.hpp>
#include <metronome/options.hpp>

#include "delay_heap.hpp"
#include "held_lock.hpp"
#include "lifecycle.hpp"
#include "parking_lot.hpp"
#include "reactor_adapter.hpp"

#include <metronome/detail/asio.hpp>
#include <metronome/detail/asio_internals.hpp>

#include <atomic>
#include <cassert>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace metronome {
class manual_clock;
} // namespace metronome

namespace metronome::detail {

// Names the calling library thread (the last 15 characters) and sets its timer slack to
// 1 ns, so that its timed waits (ticks, heap deadlines) end on time.
void init_library_thread(const std::string& name) noexcept;

struct worker;

// The counters behind pool_stats::queue_wait and ::lateness.
struct latency_counters {
  std::atomic<std::uint64_t> queue_wait[latency_histogram::bucket_count] = {};
  std::atomic<std::uint64_t> lateness[latency_histogram::bucket_count] = {};

  // Only the owning thread writes (a worker's own counters). `n`: a sample's weight.
  static void bump_owned(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  void add_to(pool_stats& s) const noexcept {
    for (std::size_t b = 0; b < latency_histogram::bucket_count; ++b) {
      s.queue_wait.add_to_bucket(b, queue_wait[b].load(std::memory_order_relaxed));
      s.lateness.add_to_bucket(b, lateness[b].load(std::memory_order_relaxed));
    }
  }
  // Moves these counts into `into` (a retiring worker's into the pool's).
  void move_to(latency_counters& into) noexcept {
    for (std::size_t b = 0; b < latency_histogram::bucket_count; ++b) {
      into.queue_wait[b].fetch_add(queue_wait[b].exchange(0, std::memory_order_relaxed), std::memory_order_relaxed);
      into.lateness[b].fetch_add(lateness[b].exchange(0, std::memory_order_relaxed), std::memory_order_relaxed);
    }
  }
};

// The engine behind scheduled_thread_pool: it joins the pool's parts (docs/design.md,
// "The pool's parts": ready queue, parking lot, delay queue, lifecycle, reactor adapter)
// and runs the workers. The calls the library's templates make are pool_core's
// (detail/pool_core.hpp documents each, once); the engine defines them, beside its own,
// in files by concept: pool_core.cpp (threads, parking), pool_submit.cpp (the ready
// queue's producers), pool_delay.cpp (delay queue, promotion, periodic runs, waits),
// pool_lifecycle.cpp (shutdown, join, stats, fork), pool_reactor.cpp (I/O on the
// workers), pool_hosted.cpp (a core driven by another context's threads).
class pool_engine final : public pool_core, public clock_listener {
  friend class pool_core; // its calls are defined in the engine's files, on its state

public:
  // `host`: a hosted core (opts.threads is 0): its work runs on the host's threads,
  // through drive_hosted(); it starts no thread.
  explicit pool_engine(pool_options opts, core_host* host = nullptr);
  ~pool_engine() override;
  pool_engine(const pool_engine&) = delete;
  pool_engine& operator=(const pool_engine&) = delete;

  manual_clock* time_source() const noexcept { return manual_; }
  // A wheel's timeout fired onto a pool starts on one of its workers: its lateness, from
  // `due` (the tick it fired on), in that worker's pool. Nothing on any other thread.
  static void record_lateness_here(clock::time_point due) noexcept;


  // Queues a handle's completion on the pool `anchor`/`generation` name (pool_delay.cpp).
  // False when that pool is gone or terminated: the caller runs it.
  static bool post_completion(pool_anchor* anchor, std::uint32_t generation, task_base* n) noexcept;

  // Cancel support, under the anchor's mutex (mtx_): removes t from the heap if
  // it is there. Returns true when it did: the caller then drops the heap's reference.
  // `in_transit`: t's completions are still to come; the pool does not terminate until
  // cancel_delivered(). Else they came (the node kept the pool up meanwhile): a removal
  // that leaves a terminating pool idle wakes its workers to look again.
  bool on_cancelled(const held_lock& lk, scheduled_task_base* t, bool in_transit) noexcept;
  // The canceller of a task that on_cancelled() took out of the heap in transit has run
  // its completions: the pool, kept from terminating until now, may go idle.
  void cancel_delivered() noexcept;
  // reset() support: if t is pending in the heap, re-keys it to be due
  // `delay` from now and returns true.
  bool on_reset(const held_lock& lk, scheduled_task_base* t, clock::duration delay) noexcept;

  // Runs a scheduled task once on the calling thread (caller_runs, pending_task); a bound
  // one is handed to its executor instead, to run there once.
  static void run_detached(scheduled_task_base* t) noexcept;
  // A bound task's run on its executor, and its hand-over destroyed unrun (pool_delay.cpp).
  static void run_bound(scheduled_task_base* t, bool detached) noexcept;
  static void drop_bound(scheduled_task_base* t, bool detached) noexcept;
  // Runs a scheduled task here and then completes, reports or reschedules it, as a
  // worker does (serial executors drain their tasks through this).
  void run_scheduled(scheduled_task_base* t) noexcept;
  // Queues a linked chain (first..last through next_, count nodes) with one push. True
  // when it met a terminated pool: everything then in the ready queue is dropped and
  // reported, save a strand's invoker (run here) and a typed task still pending, marked
  // handed back and left untouched: such a task was pushed from outside by a submission
  // that finds the termination too and applies the rejection policy to it.
  bool push_ready_chain(task_base* first, task_base* last, std::size_t count) noexcept;
  // Whether the pool has terminated, read under the mutex (not a termination backing off).
  bool terminated_for_good() noexcept;
  // Empties the ready queue of a terminated pool (after a push that met the termination).
  void clear_after_termination() noexcept;

  // ---- Lifecycle.
  void shutdown();
  // What shutdown_now() took out of the pool, linked through next_: ready work first
  // (it became ready earlier), then delayed work in due order.
  struct taken_tasks {
    task_base* head = nullptr;
    std::size_t count = 0; // an upper bound on what next_taken() hands out
  };
  // Stops the pool at once and takes every task that never ran. The caller makes room
  // for them and passes each through next_taken(), or, out of memory, gives the whole
  // chain to discard_taken().
  taken_tasks shutdown_now();
  void discard_taken(task_base* head) noexcept;
  // Unlinks the first taken task: returns it when it is the caller's to keep, or settles
  // it here and returns nullptr (a wait completes with operation_aborted; a task
  // cancelled while it waited is released; a task bound to `pool` itself is cancelled).
  task_base* next_taken(taken_tasks& taken, const net::execution_context* pool) noexcept;
  void join();
  // The destructor's path: cancel what is not due, run what is ready, join.
  void close() noexcept;

  void note_rejected() noexcept { rejected_.fetch_add(1); } // work refused on the pool's behalf
  // A wheel_timer built over this pool, until it stops: told when the pool shuts down
  // (it aborts its pending waits); stopped or destroyed before the pool (debug builds
  // assert).
  void attach_wheel(pool_shutdown_listener* w);
  void detach_wheel(pool_shutdown_listener* w) noexcept;
  std::size_t max_thread_count() const noexcept { return max_threads_; }
  // A hand-over (pool_core::begin_hand_over) ends on a worker of this pool: no lock.
  void end_hand_over_here() noexcept { hand_overs_.fetch_sub(1, std::memory_order_relaxed); }

  // Work dropped because the user shut the pool down (shutdown(), shutdown_now(), the
  // destructor): to the exception handler the user installed, which sees every drop;
  // the default handler stays quiet, as Asio destroys unrun handlers without a word.
  void report_dropped(const std::exception_ptr& e) noexcept;

  void on_time_advanced() override;
  bool quiescent(clock::time_point& next_due) noexcept override;
  bool runs_this_thread() const noexcept override { return running_in_this_thread(); }

  // ---- I/O on the pool's threads. The pool registers Asio's scheduler in itself with no
  // thread of its own (scheduled_thread_pool.cpp): sockets, timers and streams made on
  // the pool reach their reactor through it, and the pool's idle workers run it. The
  // reactor appears (attach_reactor, from the scheduler's init_task) with the first I/O
  // object; from then on one parked worker waits in it (park_in_reactor).
  // The pool's constructor, once (reactor_adapter::install); may throw.
  void attach_io(net::execution_context& pool, int concurrency_hint);
  void attach_reactor(asio_internals::scheduler_task& reactor) noexcept;
  // After close(), before the pool's services shut down: lets go of what the pool holds
  // of them (its reactor timer).
  void release_io() noexcept;

  // ---- Hosted core (host != nullptr). Called on a host thread, never on two at once:
  // runs what is ready or due (at most `budget` tasks) and says what the host must time.
  struct drive_result {
    clock::time_point next_due; // the heap's head (time_point::max(): nothing to time)
    bool more;                  // the budget ran out with work left: drive again soon
  };
  drive_result drive_hosted(std::size_t budget) noexcept;
  // The host context shuts down: everything held is destroyed unrun (waits' handlers
  // completed with operation_aborted through their executors, typed tasks cancelled),
  // and later work is refused as by a terminated pool.
  void close_hosted() noexcept;
  bool is_hosted() const noexcept { return host_ != nullptr; }

  // fork(): the child has none of this pool's threads. Every live pool is enrolled; the
  // process's fork hooks (pool_lifecycle.cpp) lock each before the fork and, in the
  // child, keep this one going (a hosted core: restart_after_fork(); its context's
  // threads drive it) or leave it terminated (a pool: its work stays the parent's; it is
  // dropped unrun when the child destroys the pool).
  void restart_after_fork() noexcept { state_.restart_after_fork.store(true, std::memory_order_relaxed); }
  void lock_for_fork() noexcept;
  void unlock_after_fork() noexcept;
  void restart_in_child() noexcept;
  void terminate_in_child() noexcept;

private:
  friend struct worker;
  struct checked_options {};
  pool_engine(pool_options&& opts, core_host* host, checked_options);

  void start_worker(bool core);
  static void run_thread_hook(const std::function<void(std::size_t)>& hook, std::size_t id,
                              pool_engine* pool) noexcept;
  void worker_main(worker& w);
  task_base* next_task(worker& w);
  // park() and its roles (pool_core.cpp); each is called with mtx_ held.
  task_base* park(worker& w, std::unique_lock<std::mutex>& lk);
  void let_manual_clock_decide(std::unique_lock<std::mutex>& lk);
  void wait_as_leader(worker& w, std::unique_lock<std::mutex>& lk);
  bool wait_as_follower(worker& w, std::unique_lock<std::mutex>& lk);
  // The reactor role of park(): waits in Asio's reactor (and runs what it completes)
  // instead of on a condition variable. Caller holds mtx_, which is released meanwhile.
  void park_in_reactor(worker& w, std::unique_lock<std::mutex>& lk, bool times_heap);
  void interrupt_reactor(const held_lock& lk) noexcept;
  // The fairness of I/O under load (pool_reactor.cpp): a worker between two tasks
  // polls the reactor when nobody holds the reactor role and it has not run for
  // io_poll_interval.
  void poll_reactor_if_due(worker& w) noexcept;
  void poll_reactor(worker& w) noexcept;
  void run_task(worker& w, task_base* t) noexcept;
  void record_start(const timed_node* t, clock::time_point started) noexcept;
  void record_post_wait(worker& w, const op_node* t) noexcept;
  void record_wait_start(const wait_node* n) noexcept;
  void reschedule(scheduled_task_base* t, clock::time_point started) noexcept;
  // Bound tasks (pool_delay.cpp): the worker's hand-over; the pool a run on the bound
  // executor reaches through the anchor (in transit until cancel_delivered(), or null when
  // gone or terminated); the end of a periodic run there.
  void hand_off_bound(scheduled_task_base* t) noexcept;
  static pool_engine* enter_live(const scheduled_task_base* t) noexcept;
  void end_bound_run(scheduled_task_base* t, std::exception_ptr e, clock::time_point started) noexcept;
  static void run_once(scheduled_task_base* t) noexcept;
  void end_periodic(scheduled_task_base* t, std::exception_ptr e) noexcept;
  void wake_one() noexcept;
  void grow(const held_lock& lk) noexcept;
  void wake_some(const held_lock& lk, std::size_t n) noexcept;
  void wake_all(const held_lock& lk) noexcept;
  void wake_for_new_head(const held_lock& lk) noexcept;
  void maybe_wake_after_push() noexcept;
  void join_threads();
  // Moves due heap nodes to the ready queue (a serial executor's to its queue, in due
  // order); the caller, after releasing mtx_, posts the drains listed in
  // `owed` (post_owed_drains). Returns the count moved to the ready queue.
  std::size_t promote_due(const held_lock& lk, clock::time_point now, task_sink*& owed) noexcept;
  void post_owed_drains(task_sink* owed) noexcept;
  void leave_transit(const held_lock& lk) noexcept;
  void last_one_out(const held_lock& lk) noexcept;
  enum class promoter { by_worker, by_producer, by_clock }; // see promote() in pool_delay.cpp
  void promote(clock::time_point current, promoter who) noexcept;
  void update_next_due(const held_lock& lk) noexcept;
  void heap_push(const held_lock& lk, timed_node* n, clock::time_point current);
  void wake_if_due_on_manual_clock(const held_lock& lk, clock::time_point due) noexcept;
  void ask_clock_after_outside_push(std::unique_lock<std::mutex>& lk) noexcept;
  // Takes n out of the heap if it is there
  // (keeping next_due_ and the heap's storage in step). True when it did.
  bool heap_remove(const held_lock& lk, timed_node* n) noexcept;
  // lk holds anchor->mtx: the live pool `anchor`/`generation` name, once it has taken
  // n out of its heap; nullptr when the pool is gone or n is not in the heap.
  static pool_engine* take_wait_out(const held_lock& lk, pool_anchor* anchor, std::uint32_t generation,
                                    wait_node* n) noexcept;
  // The end of a hand-over off the pool's workers, through the anchor (the pool may be gone).
  static void end_hand_over_through(pool_anchor* anchor, std::uint32_t generation) noexcept;
  void heap_changed(const held_lock& lk) noexcept;
  void reject_scheduled(scheduled_task_base* t, bool timed);
  void drop_outside(task_base* t) noexcept;
  // Destroys t unrun (a typed task: cancelled); executor work is reported as
  // rejected_execution(why), unless why is null.
  void discard_task(task_base* t, const char* why) noexcept;
  bool discard_oldest_user_task() noexcept;
  timed_node* queue_aborted_waits(const held_lock& lk, timed_node* gone) noexcept;
  timed_node* drain_heap(const held_lock& lk) noexcept;
  void discard_chain(timed_node* first) noexcept;
  void sweep_for_shutdown(const held_lock& lk, timed_node*& gone) noexcept;
  // A cancel_after's deadline (wait_node::deadline_) stays timed after shutdown() as a
  // delayed one-shot task does: per run_delayed_after_shutdown (opts_ never changes).
  bool keeps_deadline(const wait_node* n) const noexcept { return n->deadline_ && opts_.run_delayed_after_shutdown; }
  bool idle_for_termination(const held_lock& lk, int awake_expected) const noexcept;
  void terminate(const held_lock& lk) noexcept;
  // fork() (pool_lifecycle.cpp): the registry of live pools and the child's side.
  friend struct fork_registry;
  void enroll_for_fork() noexcept;
  void leave_fork_registry() noexcept;
  void forget_threads_in_child() noexcept;
  void discard_left_in_child() noexcept;

  pool_options opts_;
  core_host* host_;
  // Hosted: the worker record host threads run under while they drive (one at a time),
  // and the due time the host times (mtx_): a new head before it asks for a drive.
  std::unique_ptr<worker> host_worker_;
  clock::rep host_timed_ = std::numeric_limits<clock::rep>::max();
  manual_clock* manual_;
  std::size_t core_threads_;
  std::size_t max_threads_;

  ready_queue ready_;

  // Idle workers: spinning, parked as leader or followers (parking_lot.hpp).
  parking_lot parking_;

  // The pool mutex lives in the anchor, so handles that outlive the pool can lock it.
  std::mutex& mtx_;
  // What the mutex guards starts on its own line.
  alignas(64) std::condition_variable terminated_cv_;
  delay_heap heap_;
  std::uint64_t next_seq_ = 0;
  // I/O on the workers (attach_io, attach_reactor): Asio's scheduler, its reactor once an
  // I/O object exists, and who holds the reactor role (reactor_adapter.hpp).
  reactor_adapter reactor_;
  int awake_ = 0;       // live workers not parked
  int in_transit_ = 0;  // promotions whose serial drains, and cancels whose completions, are not delivered yet
  int clock_askers_ = 0; // outside pushes asking the auto-advancing clock (ask_clock_after_outside_push)
  bool clock_ask_owed_ = false; // the last transit ended with every worker parked since the last ask began (leave_transit)
  std::size_t ticks_in_heap_ = 0; // untracked waits (wheels' ticks) in heap_: not work that keeps the pool busy
  pool_engine* fork_prev_ = nullptr; // the fork registry's list (pool_lifecycle.cpp)
  pool_engine* fork_next_ = nullptr;
  std::size_t next_worker_id_ = 1;
  std::vector<std::unique_ptr<worker>> workers_;
  std::mutex join_mtx_;
  // The heap's earliest due time (no_due when empty): written under mtx_ whenever the
  // head changes, read without it by workers deciding whether to promote.
  std::atomic<clock::rep> next_due_;

  lifecycle state_; // its phase, its ending flags and their rules (lifecycle.hpp)
  // Threads counted against max_threads (Java's worker count): a retiring elastic thread
  // leaves it in park(), in the hold in which it leaves the parking lot (wake_one).
  std::atomic<std::size_t> threads_{0};
  // Threads alive (stats().threads, Java's getPoolSize()): a retiring one until it ends.
  std::atomic<std::size_t> live_{0};
  std::atomic<std::size_t> largest_{0}; // most alive at once
  std::atomic<std::size_t> rejected_{0};
  std::atomic<std::size_t> retired_completed_{0};
  // Start-time histograms recorded off the pool's workers (a serial executor's drain on
  // another executor) and those of retired workers; workers keep their own.
  latency_counters shared_latency_;
  std::atomic<int> calls_{0}; // debug builds: threads inside post/submit/add_wait (see close())
  // wheel_timers firing onto this pool (they must go first); the mutex is held while
  // shutdown() tells them, so that none is destroyed meanwhile.
  std::mutex wheels_mtx_;
  std::vector<pool_shutdown_listener*> wheels_;
  std::atomic<std::size_t> wheel_waits_{0}; // see wheel_wait_started()
  // See begin_hand_over(). Its own line: workers count it up and down without the mutex.
  alignas(64) std::atomic<int> hand_overs_{0};
};

// The engine behind a pool's surface (pool_engine is the only class derived from it).
inline pool_engine& engine(pool_core& c) noexcept { return static_cast<pool_engine&>(c); }
inline const pool_engine& engine(const pool_core& c) noexcept { return static_cast<const pool_engine&>(c); }
inline pool_engine* engine(pool_core* c) noexcept { return static_cast<pool_engine*>(c); }

} // namespace metronome::detail

#endif
