// wheel_engine: the engine behind wheel_timer (its surface for the templates, and the
// timeout node, are detail/wheel_core.hpp).
#ifndef METRONOME_SRC_WHEEL_ENGINE_HPP
#define METRONOME_SRC_WHEEL_ENGINE_HPP

#include <metronome/detail/clock_listener.hpp>
#include <metronome/detail/pool_core.hpp>
#include <metronome/detail/task.hpp>
#include <metronome/detail/wheel_core.hpp>
#include <metronome/options.hpp>

#include "held_lock.hpp"

#include <metronome/detail/asio.hpp>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace metronome::detail {

// A plain word read or written as an atomic where other accesses hold the wheel's mutex
// (an entry's when_). std::atomic_ref where the standard library has it; libc++ before 19
// does not, and the compilers' builtins are what atomic_ref is made of.
inline std::uint64_t relaxed_load(const std::uint64_t& w) noexcept {
#if defined(__cpp_lib_atomic_ref)
  return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(w)).load(std::memory_order_relaxed);
#else
  return __atomic_load_n(&w, __ATOMIC_RELAXED);
#endif
}
inline void relaxed_store(std::uint64_t& w, std::uint64_t v) noexcept {
#if defined(__cpp_lib_atomic_ref)
  std::atomic_ref<std::uint64_t>(w).store(v, std::memory_order_relaxed);
#else
  __atomic_store_n(&w, v, __ATOMIC_RELAXED);
#endif
}

class wheel_engine;

// What handles reach of a wheel: it outlives the wheel. Anchors are never freed, only
// reused by later wheels under a new generation, and an entry names its wheel by anchor
// and generation (wheel_entry::wheel_id_). The wheel's mutex lives here, and the wheel
// moves the generation on under it, after stop() and before anything else of the wheel
// goes: whoever holds the mutex and finds the generation unchanged holds a live wheel.
struct alignas(64) wheel_anchor {
  std::mutex mtx;
  wheel_engine* core = nullptr;             // under mtx
  std::atomic<std::uint64_t> generation{0}; // written under mtx
  std::atomic<std::uint64_t> elapsed{0};    // the wheel's elapsed ticks, for handles (no mtx)
  // Handles' hand-overs in flight: timeouts a cancel() or reset() took out of the wheel
  // under the mutex and hands to the executor after letting it go. Raised under mtx while
  // the generation matches; the wheel's destructor waits for it to fall (but for the
  // destroying thread's own), so that what they hand to (the wheel's pool) is still there.
  std::atomic<std::uint32_t> handing_over{0};
  std::uint32_t next_free = 0; // the registry's free list (index + 1)
  // The wheel's time base, for its timeouts' lateness on its pool (note_start): its start
  // and its tick in nanoseconds, tick 0 when not timed (a wheel over another executor,
  // or on another clock than its pool's). Written by the wheel's constructor, before any
  // timeout exists; on their own line, away from the mutex.
  alignas(64) std::atomic<clock::rep> start_ns{0};
  std::atomic<clock::rep> tick_ns{0};
};

struct wheel_tick;
wheel_tick* make_wheel_tick(wheel_anchor& a, std::uint64_t id);
void free_wheel_tick(wheel_tick* t) noexcept;
wait_node* wheel_tick_node(wheel_tick* t) noexcept;
long wheel_ticks_alive() noexcept; // tick nodes not yet freed, process-wide (for tests)

// The calls wheel_timer's templates make are wheel_core's (detail/wheel_core.hpp
// documents each, once); they are defined in the engine's files, on its state.
class wheel_engine final : public wheel_core, public clock_listener, public pool_shutdown_listener {
  friend class wheel_core;

public:
  // pool: the metronome pool `ex` runs on, if any. host: else, the hosted timing core of
  // ex's context (timing_service.hpp): the wheel's ticks are then a wait in it, driven by
  // that context's threads, and the wheel has no thread of its own (wheel_tick.cpp).
  wheel_engine(wheel_options opts, net::any_io_executor ex, pool_core* pool, pool_core* host = nullptr);
  ~wheel_engine() override;

  // From a handle: unlinks e if its wheel still holds it. The wheel may be gone.
  static bool cancel(wheel_entry* e) noexcept;
  // From a handle: moves e to deadline now + delay if its wheel still holds it (an
  // unlink and a link; delay <= 0: handed to the executor now). The wheel may be gone.
  static bool reset(wheel_entry* e, clock::duration delay) noexcept;
  // From a handle, for a pending e: whether its deadline has passed on its wheel. Once
  // the wheel is gone: unless e was cancelled (the wheel cancels all it still holds
  // before it goes, so a pending e is on the executor).
  static bool deadline_passed(const wheel_entry* e) noexcept;
  // Diagnostics (tests): timeouts of `level`'s slot that is moving down, not yet moved.
  std::size_t moving(std::size_t level) const;
  // Diagnostics (tests): timeouts the last touch_next_tick() walked.
  std::size_t touched_ahead() const;

  void on_time_advanced() override;
  // The pool shut down: pending waits complete with operation_aborted (on the pool,
  // before it can terminate), as do waits started later.
  void on_pool_shutdown() noexcept override;

private:
  // A level's slot moving down: started when the slot before it became current,
  // finished before anything in it can be needed one level down.
  struct cascade {
    std::uint64_t number = 0; // the slot's number (deadline >> shift); 0: none yet
    std::uint64_t start = 0, finish = 0;
    std::size_t total = 0;
  };
  // Due entries on their way to the executor: linked through task_base::next_.
  struct chain {
    wheel_entry* head = nullptr;
    wheel_entry* tail = nullptr;
    std::size_t count = 0;
    void push(wheel_entry* e) noexcept;
    void append(wheel_entry* first, wheel_entry* last, std::size_t n) noexcept;
  };
  // One slot: entries in the order they were linked, through task_base::next_ / prev_.
  struct slot_list {
    wheel_entry* head = nullptr;
    wheel_entry* tail = nullptr;
    std::size_t count = 0;
  };
  static constexpr std::uint64_t never = ~std::uint64_t(0);

  // This wheel's anchor, taken before anything else is built and given back by the
  // destructor (or here, if the constructor throws).
  struct enrollment {
    explicit enrollment(wheel_engine* w);
    ~enrollment() { retire(); }
    enrollment(const enrollment&) = delete;
    enrollment& operator=(const enrollment&) = delete;
    void retire() noexcept;
    std::uint64_t id;
    wheel_anchor* anchor; // nullptr once retired
  };

  std::uint64_t divide_by_tick(std::uint64_t ns, std::uint64_t& rest) const noexcept;
  std::uint64_t tick_of(clock::time_point t) const noexcept;
  clock::time_point time_of_tick(std::uint64_t n) const noexcept; // saturating
  std::uint64_t deadline_tick(clock::time_point now, clock::duration delay) const noexcept;
  void enter(wheel_entry* e, clock::duration delay);
  bool push_inbox(wheel_entry* e) noexcept;
  std::uint64_t drain_inbox(const held_lock& lk, chain& fired) noexcept;
  static constexpr std::size_t no_level = ~std::size_t(0);
  static constexpr std::size_t cascade_batch = 256; // fewest entries a cascade moves per wake-up
  std::uint64_t place(const held_lock& lk, wheel_entry* first, chain& fired, std::size_t from_level) noexcept;
  void count_removed(const held_lock& lk, std::size_t n) noexcept;
  unsigned shift(std::size_t level) const noexcept { return static_cast<unsigned>(level * span_bits_); }
  // Level L's next slot: never linked into by the ring rule, it is the one moving down.
  std::size_t cascading(std::size_t level) const noexcept {
    return level * (mask_ + 1) + static_cast<std::size_t>(((elapsed_ >> shift(level)) + 1) & mask_);
  }
  std::size_t level_for(std::uint64_t when) const noexcept;
  void link(const held_lock& lk, wheel_entry* e, std::size_t from_level) noexcept;
  void append(const held_lock& lk, wheel_entry* e, std::size_t index) noexcept;
  void unlink(const held_lock& lk, wheel_entry* e) noexcept;
  static wheel_entry* next_in_slot(wheel_entry* e) noexcept;
  void set_occupied(std::size_t index, bool on) noexcept;
  std::size_t next_occupied(std::size_t level, std::size_t from) const noexcept;
  std::uint64_t next_event(const held_lock& lk) const noexcept;
  void mark(const held_lock& lk, wheel_entry* e, std::size_t index) noexcept;
  bool touch_next_tick(std::unique_lock<std::mutex>& lk) noexcept;
  void start_cascade(const held_lock& lk, std::size_t level, chain& fired) noexcept;
  void progress_cascade(const held_lock& lk, std::size_t level, chain& fired) noexcept;
  void step(const held_lock& lk, std::uint64_t tick, chain& fired) noexcept;
  void advance(const held_lock& lk, std::uint64_t now_tick, chain& fired) noexcept;
  std::uint64_t skip_rotations(const held_lock& lk, std::uint64_t now_tick) noexcept;
  void fire(const held_lock& lk, wheel_entry* e, chain& fired) noexcept;
  bool cancel(const held_lock& lk, wheel_entry* e, chain& fired) noexcept;
  bool reset(const held_lock& lk, wheel_entry* e, clock::duration delay, chain& fired) noexcept;
  // Hands due entries to the executor. Never called with the mutex held: what the
  // executor does with an entry it refuses (a pool shut down or terminated drops it, a
  // strand over a terminated pool runs it) happens right here, user code included.
  void dispatch(chain& fired) noexcept { dispatch_to(pool_, &ex_, fired); }
  // Reads nothing of the wheel, which the user code it may run can destroy.
  static void dispatch_to(pool_core* pool, const net::any_io_executor* ex, chain& fired) noexcept;
  // For handles and the tick: lets go of the mutex (held by lk, the wheel live) and then
  // hands `fired` over, counted in the anchor's handing_over (the wheel's destructor, on
  // another thread, waits for it). `handle`: a handle's (the test hook's point).
  void hand_over_unlocked(wheel_anchor& a, std::unique_lock<std::mutex>& lk, chain& fired,
                          bool handle = true) noexcept;
  // After the wheel retired its anchor: waits for handles' hand-overs in flight, save
  // those of the calling thread (it may be destroying the wheel from inside one).
  static void wait_for_hand_overs(wheel_anchor& a) noexcept;
  // The rest of a hand-over counted in a.handing_over (the mutex let go): hands `fired` to
  // the pool or executor (read before), then lets the count fall.
  static void dispatch_counted(wheel_anchor& a, pool_core* pool, const net::any_io_executor* ex,
                               chain& fired) noexcept;
  // stop()'s wait: as above, but none on a thread inside one of this wheel's hand-overs
  // (a timeout's destructor, or its run by an executor that runs it inline): that thread's
  // own push is still in flight, so it cannot let the pool go on return anyway, and two
  // such stops on two threads would each wait for the other's hand-over.
  static void wait_for_hand_overs_to_stop(wheel_anchor& a) noexcept;

public:
  // fork(): in the child, this wheel of the parent refuses new timeouts (wheel_anchor.cpp).
  void terminate_in_child(wheel_anchor& a) noexcept;

private:
  // Whether the wheel enrolled as `id` is still there (its generation unchanged).
  static bool enrolled(const wheel_anchor& a, std::uint64_t id) noexcept;
  // Hosted ticks (wheel_tick.cpp), all under mtx_: the tick must run no later than tick
  // `when`; the wheel's turns on a host thread (false: the wheel is gone).
  void rearm_tick(const held_lock& lk, std::uint64_t when) noexcept;
  bool withdraw_tick(const held_lock& lk) noexcept;
  bool tick_once(std::unique_lock<std::mutex>& lk) noexcept;
  enum class turn { again, sleep, wheel_gone }; // see take_turn() (wheel_clock.cpp)
  turn take_turn(std::unique_lock<std::mutex>& lk, chain& fired, bool touch_ahead, std::uint64_t& until) noexcept;
  friend struct wheel_tick;
  // In the host engine: idle (nowhere: no deadline), armed (in its heap at tick_at_),
  // running (taken out of the heap: queued on the host, or inside tick_once()).
  enum class tick_state : std::uint8_t { idle, armed, running };

  enrollment enrolled_;
  std::mutex& mtx_; // the anchor's
  wheel_anchor& home_; // that anchor, still known after retire() cleared enrolled_.anchor (never freed)
  wheel_options opts_;
  // opts_.exception_handler, shared so that a worker calls it without holding mtx_.
  std::shared_ptr<const std::function<void(std::exception_ptr)>> exception_handler_;
  net::any_io_executor ex_;
  pool_core* pool_;
  manual_clock* manual_;
  unsigned span_bits_; // log2(slots_per_level / 2): a level-L slot spans 2^(L * span_bits_) ticks
  std::uint64_t mask_;
  clock::time_point start_;

  // Producers' line: new timeouts go onto a lock-free stack that the mutex holder
  // (a tick, cancel, advance) moves into the slots; `closed_inbox` once stopped.
  alignas(64) std::atomic<wheel_entry*> inbox_{nullptr};
  std::atomic<std::size_t> inserted_{0};
  // The tick the wheel sleeps until (a producer with an earlier deadline re-arms
  // it); 0 while a tick runs, on a manual clock, and once the host refused the tick.
  alignas(64) std::atomic<std::uint64_t> sleeping_until_{0};
  std::atomic<std::size_t> removed_{0}; // fired, cancelled or stopped (written under mtx_)
  std::atomic<std::size_t> linked_{0};  // inserted by a producer holding mtx_ (written under it)

  std::vector<slot_list> slots_;        // levels * slots
  std::vector<cascade> cascades_;       // per level (level 0 never cascades)
  std::vector<std::uint64_t> occupied_; // one bit per slot, words_per_level_ words per level
  // Entry points of each level-0 slot's list (the entry linked whenever the slot's
  // count is a multiple of mark_every, at most 255; nullptr where one was unlinked):
  // a tick walks them side by side to bring the next tick's timeouts into
  // cache before the workers need them (touch_next_tick).
  static constexpr std::size_t mark_every = 32, touch_at_least = 256;
  std::vector<std::vector<wheel_entry*>> marks_;
  std::uint64_t touched_ = 0;       // the last tick whose slot was touched ahead
  std::size_t touched_entries_ = 0; // and how many timeouts that walk visited
  std::size_t words_per_level_ = 1;
  std::uint64_t elapsed_ = 0;
  bool stopped_ = false;
  // The thread whose stop() stopped the wheel (under mtx_), and whether that stop() has
  // delivered what it took and let go of the pool: a concurrent stop() waits for it (see
  // wheel_core::stop()).
  std::thread::id stopper_;
  std::atomic<bool> stop_done_{false};
  std::atomic<bool> forked_child_{false}; // a wheel of the parent, in a forked child: refuses timeouts
  // The pool shut down: waits are refused (written under mtx_, read by producers too).
  std::atomic<bool> pool_shut_down_{false};
  std::atomic<bool> detached_{false}; // stopped: detached from its pool
  pool_core* host_ = nullptr;   // hosted ticks: the engine that times them
  wheel_tick* tick_ = nullptr;  // ... and their node (wheel_tick.cpp says who frees it)
  tick_state tick_state_ = tick_state::idle;
  std::uint64_t tick_at_ = never;
};

inline wheel_engine& engine(wheel_core& w) noexcept { return static_cast<wheel_engine&>(w); }
inline const wheel_engine& engine(const wheel_core& w) noexcept { return static_cast<const wheel_engine&>(w); }

} // namespace metronome::detail

#endif
