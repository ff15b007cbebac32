// wheel_core: what wheel_timer's templates call of the engine behind a wheel, and the
// timeout node they build. The engine - slots, levels, inbox, tick and hand-overs - is
// wheel_engine (src/wheel_engine.hpp), the one class derived from wheel_core; each call
// is declared and documented here only, and defined in the engine's files (src/wheel_*.cpp).
#ifndef METRONOME_DETAIL_WHEEL_CORE_HPP
#define METRONOME_DETAIL_WHEEL_CORE_HPP

#include <metronome/detail/pool_core.hpp>
#include <metronome/detail/task.hpp>
#include <metronome/options.hpp>

#include <metronome/detail/asio.hpp>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

namespace metronome::detail {

// One timeout: a node in a wheel slot (intrusive, doubly linked through task_base::next_
// and prev_), then a task on the target executor. Reference counted: the wheel (or the
// executor's queue) holds one, each handle one.
//
// No vtable: the node type's actions (fire, drop, destroy) go through task_base's one
// function pointer, and the small fields sit in task_base's tail padding, so that a
// timeout whose callable captures up to 8 bytes is a 64-byte node.
class wheel_entry : public task_base {
public:
  static constexpr std::uint32_t pending = 0, firing = 1, running = 2, done = 3, cancelled = 4;
  // Node-private actions of complete_ (after task_base's discard/run).
  static constexpr unsigned fire_action = 2, drop_action = 3, destroy_action = 4, cancel_queued_action = 5,
                            discarded_action = 6, cancelled_run_action = 7, cancelled_discard_action = 8;
  static constexpr std::uint16_t no_slot = 0xffff;

  // refs: 1 for the wheel, plus one per handle created with the node. `wait`: an
  // async_wait, aborted when the wheel's pool shuts down.
  wheel_entry(complete_fn fn, std::uint32_t refs, bool wait = false) noexcept
      : task_base(fn), refs_(refs), wait_(wait) {
    if (wait) kind_ = task_kind::completion;
  }

  void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) complete_(this, destroy_action, nullptr);
  }
  std::uint32_t state() const noexcept { return state_.load(std::memory_order_acquire); }
  bool cancel() noexcept;
  // Moves a pending, linked entry to a new deadline (see wheel_timer::timeout::reset).
  bool reset(clock::duration delay) noexcept;
  // Never fires, and is in no queue (cancelled out of the wheel, stopped, refused):
  // destroys the callable (a wait: its operation_aborted goes to the executor).
  void drop() noexcept { complete_(this, drop_action, nullptr); }
  // The executor ran (run) or discarded (!run) the due entry: fires it if nobody
  // cancelled it first, else lets the node type finish the unrun entry; drops the
  // queue's reference.
  void settle(bool run) noexcept;
  // Its deadline passed on the wheel: queued on the executor, running or done.
  bool is_due() const noexcept;
  bool is_wait() const noexcept { return wait_; }
  // Its callable (or a wait's completion) starts: on a pool worker, when its wheel
  // times its timeouts there (wheel_anchor::tick_ns), its lateness from its deadline's
  // tick counts in that pool's stats. Reads nothing of a wheel that is gone.
  void note_start() const noexcept;

  // In a level-0 slot: its place among that slot's entry points (wheel_core::marks_),
  // or no_mark. Only the mutex holder reads or writes it; stale once handed over. One
  // byte, so that it fits beside task_base::kind_ and a small timeout stays 64 bytes.
  std::uint8_t mark_ = no_mark;
  static constexpr std::uint8_t no_mark = 0xff;
  // level * slots_per_level + slot, no_slot when unlinked. Fits: the option limits
  // allow at most 20,480 slots.
  std::uint16_t slot_index_ = no_slot;
  std::atomic<std::uint32_t> state_{pending};
  wheel_entry* prev_ = nullptr;
  std::uint64_t when_ = 0; // deadline in ticks
  // Its wheel, by anchor and generation (wheel_anchor): never a pointer into the wheel,
  // which may be gone while handles and the executor still hold the entry.
  std::uint64_t wheel_id_ = 0;

protected:
  ~wheel_entry() = default;

  // The whole complete_ of a node type: discard/run go through settle(), the private
  // actions to the type's on_fire(), on_drop(), on_cancel_queued() (a cancel claimed it
  // while it is queued on the executor), on_discarded() (the executor discarded it,
  // nobody cancelled it first), on_settled_cancelled(run) (the executor ran or discarded
  // an entry a cancel had claimed) and on_destroy().
  template <class Node>
  static void dispatch_action(task_base* t, unsigned action, void* /*io*/) noexcept {
    auto* n = static_cast<Node*>(t);
    switch (action) {
    case run_action:
      // Node types whose only cancellers hold a reference: with the queue's reference
      // the last one, nobody else can see the node, so it runs (unless a handle
      // cancelled it before letting go) and is destroyed without a read-modify-write.
      if constexpr (Node::cancellers_hold_refs) {
        if (n->refs_.load(std::memory_order_acquire) == 1) {
          if (const auto s = n->state_.load(std::memory_order_relaxed); s == pending || s == firing) {
            n->note_start();
            n->on_fire();
          }
          n->on_destroy();
          break;
        }
      }
      n->settle(true);
      break;
    case discard_action:
      n->settle(false);
      break;
    case fire_action:
      n->note_start();
      n->on_fire();
      break;
    case drop_action:
      n->on_drop();
      break;
    case cancel_queued_action:
      n->on_cancel_queued();
      break;
    case discarded_action:
      n->on_discarded();
      break;
    case cancelled_run_action:
    case cancelled_discard_action:
      n->on_settled_cancelled(action == cancelled_run_action);
      break;
    default:
      n->on_destroy();
      break;
    }
  }

private:
  bool claim(std::uint32_t to) noexcept;
  std::atomic<std::uint32_t> refs_;
  bool wait_; // after refs_: in the tail padding, so that a small timeout stays 64 bytes

public:
  // A P2300 operation's entry (metronome/execution.hpp): it lives in the operation state,
  // so wheel_timer::stop() hands out no handle to it (one would outlive the operation).
  bool no_handle_ = false;
};

struct wheel_anchor;

// A hand-over in flight on this thread (see wheel_anchor::handing_over): a thread-local
// stack of them tells stop() and the destructor which are the waiting thread's own.
struct hand_over_frame {
  const wheel_anchor* anchor;
  hand_over_frame* outer;
};

class wheel_core {
public:
  // pool: the metronome pool `ex` runs on, if any. host: else, the hosted timing core of
  // ex's context (timing_service.hpp): the wheel's ticks are then a wait in it, driven by
  // that context's threads, and the wheel has no thread of its own.
  static std::unique_ptr<wheel_core> make(wheel_options opts, net::any_io_executor ex, pool_core* pool,
                                          pool_core* host = nullptr);
  virtual ~wheel_core() = default;
  wheel_core(const wheel_core&) = delete;
  wheel_core& operator=(const wheel_core&) = delete;

  // Takes the wheel's reference on e. Throws rejected_execution (stopped, full) after
  // cancelling e (it never fires) and letting that reference go.
  void insert(wheel_entry* e, clock::duration delay);
  // A timeout threw: to its wheel's exception handler, or (none, or the wheel is gone)
  // to the pool running it, else stderr.
  static void report(const wheel_entry* e, std::exception_ptr x) noexcept;
  // Stops the wheel; returns the entries that never fired (cancelled; the caller takes
  // the wheel's references) - or, with `unlisted` null (the destructor) or no memory for
  // the list (*unlisted set), none: their references are let go here. Then, unless told
  // not to (the destructor, which waits later), waits for the hand-overs other threads
  // began before it (the pool may go then). Allocates nothing before the wheel is stopped.
  std::vector<wheel_entry*> stop(bool wait_for_hand_overs, bool* unlisted) noexcept;
  std::size_t pending() const noexcept;
  const net::any_io_executor& executor() const noexcept;
  // The metronome pool the wheel fires onto, or nullptr (another executor, or the wheel
  // is stopped: the pool may be gone).
  pool_core* pool() const noexcept;
  // A wait's use of the wheel's pool (async_wait, a P2300 operation's start(): the pool
  // read and the wait counted on it - wheel_wait_started(), after which the pool stays up
  // until the wait completes), counted as a hand-over for its lifetime, so that a stop()
  // on another thread waits for it before the pool may go. No user completion may run
  // inside one (a stop() there does not wait for other threads' hand-overs). Its count raised, then the wheel's `detached_` read,
  // against stop()'s store of `detached_`, then its look at the count (all seq_cst):
  // either pool() is nullptr here, or stop() waits. Stop-here test:
  // `a_stop_waits_for_an_async_wait_that_read_the_pool` (hook wheel_wait_read_pool).
  class pool_use {
  public:
    explicit pool_use(const wheel_core& c) noexcept;
    ~pool_use();
    pool_use(const pool_use&) = delete;
    pool_use& operator=(const pool_use&) = delete;
    pool_core* pool() const noexcept { return pool_; }

  private:
    hand_over_frame frame_;
    pool_core* pool_ = nullptr;
  };
  clock::time_point now() const noexcept;

protected:
  wheel_core() = default;
};

} // namespace metronome::detail

#endif
