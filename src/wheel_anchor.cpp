// Where handles find a wheel: the process-wide registry of wheel anchors, a wheel's
// enrollment in it, and what a handle does through it (cancel, reset, report, is_due).
#include <metronome/detail/report.hpp>
#include <metronome/detail/test_hooks.hpp>
#include "wheel_engine.hpp"

#include "fork_hooks.hpp"
#include "pool_engine.hpp"

#include <atomic>
#include <bit>
#include <mutex>
#include <optional>
#include <thread>
#include <stdexcept>
#include <utility>

namespace metronome::detail {

namespace {

// A wheel id: the anchor's index in the low bits, its generation above (wrapping).
constexpr unsigned index_bits = 24;
constexpr std::uint64_t index_mask = (std::uint64_t(1) << index_bits) - 1;
constexpr std::uint64_t generation_mask = ~std::uint64_t(0) >> index_bits;

std::uint64_t generation_of(std::uint64_t id) noexcept { return id >> index_bits; }

// Every wheel_anchor: blocks of 64 << k anchors for k = 0, 1, ..., published once and
// never freed, so that a handle finds its entry's anchor without a lock. Wheels take
// and give back anchors under one mutex (construction and destruction only).
class anchor_registry {
public:
  static anchor_registry& get() {
    static anchor_registry* r = [] {
      ensure_fork_hooks();
      return new anchor_registry; // never destroyed: handles may outlive everything
    }();
    return *r;
  }

  // fork(): the registry's mutex, then every anchor's (the wheels' mutexes), are held
  // across it; in the child each live wheel refuses new timeouts (wheel_engine).
  void prepare_fork() noexcept {
    m_.lock();
    for (std::uint64_t i = 0; i < used_; ++i) at(i).mtx.lock();
  }
  void parent_after_fork() noexcept {
    for (std::uint64_t i = 0; i < used_; ++i) at(i).mtx.unlock();
    m_.unlock();
  }
  void child_after_fork() noexcept {
    for (std::uint64_t i = 0; i < used_; ++i) {
      wheel_anchor& a = at(i);
      if (a.core) a.core->terminate_in_child(a);
      a.mtx.unlock();
    }
    m_.unlock();
  }

  wheel_anchor& at(std::uint64_t id) noexcept {
    const auto [block, offset] = locate(id & index_mask);
    return blocks_[block].load(std::memory_order_acquire)[offset];
  }

  // Returns the new wheel's id.
  std::uint64_t enroll(wheel_engine* w) {
    std::lock_guard lk(m_);
    std::uint64_t index;
    if (free_ != 0) {
      index = free_ - 1;
      free_ = at(index).next_free;
    } else {
      index = used_;
      const auto [block, offset] = locate(index);
      if (block >= blocks) throw std::length_error("metronome: too many wheel_timers at once");
      if (!blocks_[block].load(std::memory_order_relaxed))
        blocks_[block].store(new wheel_anchor[first_block << block], std::memory_order_release);
      ++used_;
    }
    wheel_anchor& a = at(index);
    std::lock_guard al(a.mtx);
    a.core = w;
    a.elapsed.store(0, std::memory_order_release);
    return a.generation.load(std::memory_order_relaxed) << index_bits | index;
  }

  void retire(std::uint64_t id) noexcept {
    wheel_anchor& a = at(id);
    {
      std::lock_guard al(a.mtx);
      a.core = nullptr;
      a.generation.store((generation_of(id) + 1) & generation_mask, std::memory_order_release);
    }
    std::lock_guard lk(m_);
    a.next_free = free_;
    free_ = static_cast<std::uint32_t>((id & index_mask) + 1);
  }

private:
  static constexpr std::uint64_t first_block = 64;
  static constexpr std::size_t blocks = 18; // 64 * (2^18 - 1) anchors: just under 2^24

  static std::pair<std::size_t, std::size_t> locate(std::uint64_t index) noexcept {
    const std::uint64_t n = index + first_block;
    const auto block = static_cast<std::size_t>(std::bit_width(n) - 7); // 64 = 2^6
    return {block, static_cast<std::size_t>(n - (first_block << block))};
  }

  std::mutex m_;
  std::uint32_t free_ = 0; // index + 1 of the first free anchor
  std::uint64_t used_ = 0; // anchors handed out so far
  std::atomic<wheel_anchor*> blocks_[blocks] = {};
};

} // namespace

void wheels_prepare_fork() noexcept { anchor_registry::get().prepare_fork(); }
void wheels_parent_after_fork() noexcept { anchor_registry::get().parent_after_fork(); }
void wheels_child_after_fork() noexcept { anchor_registry::get().child_after_fork(); }

wheel_engine::enrollment::enrollment(wheel_engine* w)
    : id(anchor_registry::get().enroll(w)), anchor(&anchor_registry::get().at(id)) {}

void wheel_engine::enrollment::retire() noexcept {
  if (!anchor) return;
  anchor_registry::get().retire(id);
  anchor = nullptr;
}

// A due entry reaches the executor `firing` (moved one by one) or still `pending`
// (handed over with its whole level-0 slot).
bool wheel_entry::claim(std::uint32_t to) noexcept {
  std::uint32_t expected = state_.load(std::memory_order_acquire);
  while (expected == pending || expected == firing)
    if (state_.compare_exchange_weak(expected, to, std::memory_order_acq_rel, std::memory_order_acquire)) return true;
  return false;
}

void wheel_entry::settle(bool run) noexcept {
  if (run && claim(running)) {
    complete_(this, fire_action, nullptr);
    state_.store(done, std::memory_order_release);
    drop();
  } else if (!run && claim(cancelled)) {
    complete_(this, discarded_action, nullptr);
  } else { // a cancel claimed it first
    complete_(this, run ? cancelled_run_action : cancelled_discard_action, nullptr);
  }
  release();
}

void wheel_entry::note_start() const noexcept {
  const wheel_anchor& a = anchor_registry::get().at(wheel_id_);
  const std::uint64_t generation = generation_of(wheel_id_);
  if (a.generation.load(std::memory_order_acquire) != generation) return; // gone
  const clock::rep tick = a.tick_ns.load(std::memory_order_acquire);
  METRONOME_TEST_HOOK(hook_point::wheel_lateness_between_reads);
  const clock::rep start = a.start_ns.load(std::memory_order_acquire);
  // A later wheel's time base (the anchor reused meanwhile) comes with a new generation:
  // a sample read across a replacement is dropped, never mixed from two wheels. Tested by
  // `a_lateness_read_across_its_wheel_s_replacement_is_dropped` (test/handover/wheel.cpp).
  std::atomic_thread_fence(std::memory_order_acquire);
  if (tick == 0 || a.generation.load(std::memory_order_relaxed) != generation) return;
  // Its deadline's tick; 0: handed to the executor when scheduled (a delay <= 0).
  const std::uint64_t when =
      relaxed_load(when_);
  if (when == 0 || when > static_cast<std::uint64_t>((clock::duration::max().count() - start) / tick)) return;
  pool_engine::record_lateness_here(clock::time_point(clock::duration(start + tick * static_cast<clock::rep>(when))));
}

bool wheel_entry::is_due() const noexcept {
  const auto s = state();
  if (s == pending) return wheel_engine::deadline_passed(this);
  return s == firing || s == running || s == done;
}

bool wheel_entry::cancel() noexcept {
  if (state() == pending && wheel_engine::cancel(this)) return true;
  if (claim(cancelled)) { // queued on the executor, not started
    // The caller holds a reference (a handle's, or the one a wait's slot takes): the
    // executor's settle() may let go of the queue's reference meanwhile.
    METRONOME_TEST_HOOK(hook_point::wheel_cancel_after_claim);
    complete_(this, cancel_queued_action, nullptr);
    return true;
  }
  return false;
}

// The hand-overs in flight on this thread, innermost first (hand_over_frame).
thread_local hand_over_frame* hand_overs = nullptr;

namespace {
// The calling thread's own hand-overs in flight on `a` (it may be inside one).
std::uint32_t own_hand_overs(const wheel_anchor& a) noexcept {
  std::uint32_t own = 0;
  for (const hand_over_frame* f = hand_overs; f; f = f->outer) own += f->anchor == &a ? 1 : 0;
  return own;
}
} // namespace

// In the child (the wheel's mutex held): refuse new timeouts, as a stopped wheel does
// (its tick, if it runs here, finds forked_child_ and stops); the destructor stops it as
// usual. Hand-overs of the parent's other threads never finish here.
void wheel_engine::terminate_in_child(wheel_anchor& a) noexcept {
  forked_child_.store(true, std::memory_order_relaxed);
  a.handing_over.store(own_hand_overs(a), std::memory_order_relaxed);
  // A stop() the parent's other thread was finishing never finishes here either.
  if (stopped_) stop_done_.store(true, std::memory_order_relaxed);
}

void wheel_engine::hand_over_unlocked(wheel_anchor& a, std::unique_lock<std::mutex>& lk, chain& fired,
                                    bool handle) noexcept {
  if (!fired.head) {
    lk.unlock();
    return;
  }
  // Copied under the mutex: once it is let go, the wheel may go (its pool may not, until
  // this hand-over is done: the wheel's destructor waits for it).
  pool_core* pool = pool_;
  std::optional<net::any_io_executor> ex;
  if (!pool) ex.emplace(ex_);
  a.handing_over.fetch_add(1, std::memory_order_relaxed);
  lk.unlock();
  if (handle) METRONOME_TEST_HOOK(hook_point::wheel_handover_after_unlock);
  if (!handle) METRONOME_TEST_HOOK(hook_point::wheel_tick_after_unlock);
  dispatch_counted(a, pool, ex ? &*ex : nullptr, fired);
}

void wheel_engine::dispatch_counted(wheel_anchor& a, pool_core* pool, const net::any_io_executor* ex,
                                    chain& fired) noexcept {
  hand_over_frame frame{&a, hand_overs};
  hand_overs = &frame;
  dispatch_to(pool, ex, fired);
  hand_overs = frame.outer;
  a.handing_over.fetch_sub(1, std::memory_order_release);
  a.handing_over.notify_all(); // a destructor may wait for it (anchors are never freed)
}

// Blocks (never spins) until only this thread's own hand-overs are left.
void wheel_engine::wait_for_hand_overs(wheel_anchor& a) noexcept {
  const std::uint32_t own = own_hand_overs(a);
  // seq_cst: the first load is the second half of a Dekker pair with a producer's due-now
  // hand-over (wheel_engine::enter: its count raised, then its look at the inbox; stop():
  // the inbox closed, then this load).
  for (std::uint32_t n = a.handing_over.load(std::memory_order_seq_cst); n > own;
       n = a.handing_over.load(std::memory_order_seq_cst))
    a.handing_over.wait(n, std::memory_order_acquire);
}

wheel_core::pool_use::pool_use(const wheel_core& c) noexcept : frame_{nullptr, hand_overs} {
  const wheel_engine& w = engine(c);
  wheel_anchor& a = *w.enrolled_.anchor;
  frame_.anchor = &a;
  hand_overs = &frame_;
  a.handing_over.fetch_add(1, std::memory_order_seq_cst);
  if (!w.detached_.load(std::memory_order_seq_cst)) pool_ = w.pool_;
  METRONOME_TEST_HOOK(hook_point::wheel_wait_read_pool);
}

wheel_core::pool_use::~pool_use() {
  hand_overs = frame_.outer;
  auto& count = const_cast<wheel_anchor*>(frame_.anchor)->handing_over;
  count.fetch_sub(1, std::memory_order_release);
  count.notify_all();
}

void wheel_engine::wait_for_hand_overs_to_stop(wheel_anchor& a) noexcept {
  if (own_hand_overs(a) == 0) wait_for_hand_overs(a);
}

bool wheel_engine::enrolled(const wheel_anchor& a, std::uint64_t id) noexcept {
  return a.generation.load(std::memory_order_acquire) == generation_of(id);
}

bool wheel_engine::cancel(wheel_entry* e) noexcept {
  {
    wheel_anchor& a = anchor_registry::get().at(e->wheel_id_);
    std::unique_lock lk(a.mtx);
    if (a.generation.load(std::memory_order_relaxed) != generation_of(e->wheel_id_)) return false; // gone
    chain fired;
    const bool won = a.core->cancel(lk, e, fired);
    // Due timeouts the cancel found in the inbox: to the executor, the mutex let go.
    a.core->hand_over_unlocked(a, lk, fired);
    if (!won) return false;
  }
  e->drop(); // frees the callable at once; wakes nobody (a P2300 operation's goes to its executor)
  METRONOME_TEST_HOOK(hook_point::wheel_cancel_before_release);
  e->release(); // the wheel's reference
  return true;
}

bool wheel_entry::reset(clock::duration delay) noexcept {
  return state() == pending && wheel_engine::reset(this, delay);
}

bool wheel_engine::reset(wheel_entry* e, clock::duration delay) noexcept {
  wheel_anchor& a = anchor_registry::get().at(e->wheel_id_);
  std::unique_lock lk(a.mtx);
  if (a.generation.load(std::memory_order_relaxed) != generation_of(e->wheel_id_)) return false; // gone
  chain fired;
  const bool moved = a.core->reset(lk, e, delay, fired);
  a.core->hand_over_unlocked(a, lk, fired); // as in cancel()
  return moved;
}

void wheel_core::report(const wheel_entry* e, std::exception_ptr x) noexcept {
  std::shared_ptr<const std::function<void(std::exception_ptr)>> handler;
  {
    wheel_anchor& a = anchor_registry::get().at(e->wheel_id_);
    std::lock_guard lk(a.mtx);
    if (a.generation.load(std::memory_order_relaxed) == generation_of(e->wheel_id_))
      handler = a.core->exception_handler_;
  }
  if (handler)
    call_exception_handler(*handler, std::move(x), "wheel_timer exception handler");
  else
    report_here(x, "timeout");
}

bool wheel_engine::deadline_passed(const wheel_entry* e) noexcept {
  const wheel_anchor& a = anchor_registry::get().at(e->wheel_id_);
  const std::uint64_t generation = generation_of(e->wheel_id_);
  if (a.generation.load(std::memory_order_acquire) == generation) {
    const std::uint64_t elapsed = a.elapsed.load(std::memory_order_acquire);
    // when_ moves under the mutex after the entry is published (reset()): read it as an atomic.
    const std::uint64_t when =
        relaxed_load(e->when_);
    // A later wheel's reading (the anchor reused meanwhile) comes with a new generation.
    if (a.generation.load(std::memory_order_acquire) == generation) return when <= elapsed;
  }
  // Gone, having cancelled what it still held first: pending now means handed over.
  return e->state() != wheel_entry::cancelled;
}

} // namespace metronome::detail
