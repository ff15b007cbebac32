// serial_core: the surface of the queue drain behind serial_executor; its state and the
// drain itself are in src/serial_core.cpp.
#ifndef METRONOME_DETAIL_SERIAL_CORE_HPP
#define METRONOME_DETAIL_SERIAL_CORE_HPP

#include <metronome/detail/report.hpp>
#include <metronome/detail/scheduled_task.hpp>
#include <metronome/options.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>

namespace metronome::detail {

class pool_core;
struct wait_node;
struct pool_anchor;

// A P2300 operation's wait on a serial executor (metronome/execution.hpp), registered
// while it waits in the timing engine's delay queue, so that dispose() can stop it there.
struct serial_wait_link {
  serial_wait_link* prev = nullptr;
  serial_wait_link* next = nullptr;
  wait_node* node = nullptr;
  pool_anchor* anchor = nullptr;
  std::uint32_t generation = 0;
};

// `n` bytes rounded up to whole 64-byte cache lines.
constexpr std::size_t whole_cache_lines(std::size_t n) noexcept { return (n + 63) / 64 * 64; }

// The queue drain (seed 004): an MPSC queue plus a count of pending tasks. The thread
// that raises the count from 0 posts one drain to the underlying executor; the drain
// runs tasks one at a time and lowers the count as it goes, so at most one drain is
// active and each task happens-before the next (the count is read-modify-written with
// acq_rel, and drain turns are handed on through the executor's post). After `batch`
// tasks the drain re-posts itself instead of looping on. Invariant (docs/design.md):
// the count is the number of tasks pushed and not yet run; while it is non-zero exactly
// one drain is queued or running, owed by whoever raised it from 0 or re-posted.
class serial_core : public task_sink, public std::enable_shared_from_this<serial_core> {
public:
  serial_core(serial_options opts, pool_core& timers, pool_core* owner_pool);
  virtual ~serial_core();

  // False when disposed (the caller rejects the task). `may_run_here`: the caller allows
  // blocking.possibly (dispatch); if this push owes the drain and the calling thread is
  // in the underlying executor's context, the drain runs right here instead of being
  // posted - as an Asio strand's dispatch runs a free strand inline.
  bool try_enqueue(task_base* t, bool may_run_here = false) noexcept;
  void drain() noexcept;

  // How a drain is handed to the underlying executor.
  enum class drain_post {
    producer, // a producer raised the count from 0 (the executor path's rules apply)
    internal, // the timing pool hands over due tasks (accepted after shutdown, like them)
    repost,   // the drain itself, after a full batch, from the thread running it
  };
  // Cancels what this executor holds; returns when no library thread is inside a post to
  // the underlying executor, and none will post to it again.
  void dispose() noexcept;
  // The underlying executor destroyed a drain unrun: discard what is counted (this call
  // holds the one drain) and refuse later work.
  void abandon() noexcept;
  bool is_disposed() const noexcept;
  // Over a metronome pool that is shut down, work from outside the pool is refused as the
  // pool refuses it (its drains are internal work and are never refused).
  bool refuses_outside_work() const noexcept;
  void note_rejected() noexcept;
  // The pool underneath while it may be asked (none after a handed-back drain ran).
  pool_core* live_owner() const noexcept;
  bool running_in_this_thread() const noexcept;
  pool_core& timers() const noexcept { return timers_; }
  void report(std::exception_ptr e) noexcept override;
  // Work refused because the pool underneath was shut down: as pool_engine::report_dropped
  // (this executor's own handler, else the pool's installed one; never printed).
  void report_dropped(const std::exception_ptr& e) noexcept;
  // Executor-path work refused once disposed: reported after dispose(), dropped as its
  // context's shutdown drops work once abandon()ed (quiet by default).
  void report_refused() noexcept;
  void track(scheduled_task_base* t) noexcept;
  // A P2300 operation's wait: registered before it is added to the delay queue (false,
  // nothing registered, once disposed); forgotten when it leaves it. dispose() stops the
  // registered ones where they wait (pool_core::cancel_wait: queued aborted, or, not yet
  // added, marked so that add_wait() queues them aborted: wait_node::adding_).
  bool track_wait(serial_wait_link* l) noexcept;
  void forget_wait(serial_wait_link* l) noexcept;

  bool enqueue_due(scheduled_task_base* t) noexcept override;
  void post_owed_drain() noexcept override;
  void forget(scheduled_task_base* t) noexcept override;

protected:
  virtual void post_drain(drain_post how) noexcept = 0;
  // post_drain's path over a metronome pool: the drain is queued as the pool's own
  // internal work (its re-post without a wake-up: its worker takes it next).
  void post_drain_to_pool(pool_core& pool, drain_post how) noexcept;
  // Whether the calling thread runs work of the underlying executor (false when that
  // cannot be told).
  virtual bool inner_running_in_this_thread() const noexcept = 0;

private:
  void hand_drain(drain_post how) noexcept;
  void leave_posting() noexcept;
  void report_unhandled(std::exception_ptr e) noexcept;
  task_base* pop_one() noexcept;
  void run_one(task_base* t, bool handed) noexcept;
  bool handed_back() const noexcept;

  pool_core& timers_; // on the first line, with the vtable pointer and the weak count's pointer
  // The queue, its count, the disposal flags and the registry of delayed tasks
  // (src/serial_core.cpp): built in this storage, so that no user translation unit parses
  // the engine's queue, and reached at a fixed offset rather than through a pointer (the
  // drain and every producer touch it on each task). Whole cache lines: the queue's two,
  // the flags with the options, the registry of delayed tasks with its mutex - sized
  // from the standard types they hold (std::function and std::mutex differ between
  // standard libraries: 256 bytes with libstdc++, 320 with libc++). serial_core.cpp
  // checks that the state fills them exactly.
  struct state;
  state& st() const noexcept;
  static constexpr std::size_t state_bytes = std::size_t{2} * 64 +
                                             whole_cache_lines(8 + sizeof(void*) + sizeof(serial_options)) +
                                             whole_cache_lines(sizeof(std::mutex) + 2 * sizeof(void*));
  alignas(64) unsigned char state_[state_bytes];
};

// The drain handed to the underlying executor. If the executor destroys it unrun (an
// io_context stopped and destroyed, a terminated pool), the serial executor is
// abandoned: what it holds is cancelled and later work rejected - otherwise its queued
// tasks, which keep it alive, would never run nor be freed.
class drain_job {
public:
  explicit drain_job(std::shared_ptr<serial_core> s) noexcept : self_(std::move(s)) {}
  drain_job(drain_job&& o) noexcept = default;
  drain_job& operator=(drain_job&&) = delete;
  ~drain_job() {
    if (self_) self_->abandon();
  }
  // An Asio handler of the underlying executor: a task's exception leaves it (Asio's
  // rule, as from a strand's), after the drain has put the rest of its queue back.
  void operator()() {
    rethrow_scope scope;
    {
      std::shared_ptr<serial_core> s = std::move(self_);
      s->drain();
    }
    scope.rethrow_if_any();
  }

private:
  std::shared_ptr<serial_core> self_;
};

} // namespace metronome::detail

#endif
