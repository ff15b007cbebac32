// A wheel's life and its producers: construction, the inbox that producers push onto,
// insert, cancel under the mutex, handing due entries to the executor, stop.
#include <metronome/detail/report.hpp>
#include <metronome/detail/test_hooks.hpp>
#include "wheel_engine.hpp"
#include <metronome/errors.hpp>
#include <metronome/manual_clock.hpp>

#include <metronome/detail/asio.hpp>

#include "pool_engine.hpp"
#include "wheel_slots.hpp"

#include <atomic>
#include <bit>
#include <cassert>
#include <stdexcept>
#include <thread>
#include <utility>

namespace metronome::detail {

namespace {

// The inbox's value once the wheel is stopped: pushes fail.
wheel_entry* const closed_inbox = reinterpret_cast<wheel_entry*>(alignof(wheel_entry));

// A due entry on its way to an executor other than a metronome pool: if the executor
// destroys it unrun (shut down), the entry is settled as cancelled, not left pending.
class fire_on_executor {
public:
  explicit fire_on_executor(wheel_entry* e) noexcept : e_(e) {}
  fire_on_executor(fire_on_executor&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  fire_on_executor& operator=(fire_on_executor&&) = delete;
  ~fire_on_executor() {
    if (e_) e_->complete(false);
  }
  void operator()() { // an Asio handler: a timeout's exception leaves it (Asio's rule)
    rethrow_scope scope;
    std::exchange(e_, nullptr)->complete(true);
    scope.rethrow_if_any();
  }

private:
  wheel_entry* e_;
};

} // namespace

wheel_engine::wheel_engine(wheel_options opts, net::any_io_executor ex, pool_core* pool, pool_core* host)
    : enrolled_(this), mtx_(enrolled_.anchor->mtx), home_(*enrolled_.anchor), opts_(std::move(opts)), ex_(std::move(ex)), pool_(pool),
      manual_(opts_.time_source) {
  if (opts_.exception_handler)
    exception_handler_ =
        std::make_shared<const std::function<void(std::exception_ptr)>>(std::move(opts_.exception_handler));
  const auto slots = opts_.slots_per_level;
  if (opts_.tick <= clock::duration::zero()) throw std::invalid_argument("metronome: wheel tick must be positive");
  // Netty's bound: a ring of level-0 slots must span a time the clock can count (a tick
  // near nanoseconds::max() left the clock no second tick: every deadline was "now").
  if (slots >= 1 && opts_.tick > clock::duration::max() / static_cast<clock::rep>(slots))
    throw std::invalid_argument("metronome: wheel tick x slots_per_level must fit in nanoseconds");
  if (slots < 4 || slots > 4096 || (slots & (slots - 1)) != 0)
    throw std::invalid_argument("metronome: slots_per_level must be a power of two from 4 to 4096");
  const auto bits = static_cast<unsigned>(std::countr_zero(slots));
  span_bits_ = bits - 1;
  if (opts_.levels < 1 || bits + span_bits_ * (opts_.levels - 1) > 60)
    throw std::invalid_argument(
        "metronome: levels must be >= 1 with log2(slots_per_level) + log2(slots_per_level / 2) * (levels - 1) <= 60");
  mask_ = slots - 1;
  slots_.assign(opts_.levels * slots, slot_list{});
  cascades_.assign(opts_.levels, cascade{});
  words_per_level_ = (slots + 63) / 64;
  occupied_.assign(opts_.levels * words_per_level_, 0);
  if (opts_.levels > 1) marks_.resize(slots); // a level-0 slot is then one tick
  start_ = now();
  // Its timeouts' lateness counts in its pool's stats when both read the same clock.
  const bool timed_on_pool = pool_ != nullptr && engine(pool_)->time_source() == manual_;
  enrolled_.anchor->start_ns.store(start_.time_since_epoch().count(), std::memory_order_release);
  enrolled_.anchor->tick_ns.store(timed_on_pool ? opts_.tick.count() : 0, std::memory_order_release);
  // Attached to its clock and pool last, and undone if an attachment throws (bad_alloc): a
  // constructor that throws runs no destructor, and a pool or clock left holding the wheel
  // would call into freed memory (its shutdown, an advance). Tested by
  // `a_wheel_that_cannot_be_built_leaves_nothing_attached`.
  if (!manual_) {
    assert(host != nullptr); // the engine of the executor's context (wheel_timer.hpp)
    tick_ = make_wheel_tick(*enrolled_.anchor, enrolled_.id);
    host_ = host;
    sleeping_until_.store(never, std::memory_order_relaxed); // nothing timed: any deadline asks
  }
  try {
    if (manual_) manual_->attach(this);
    if (pool_) engine(pool_)->attach_wheel(this);
  } catch (...) {
    if (manual_) manual_->detach(this); // finds nothing if it was the attach that threw
    if (tick_) free_wheel_tick(tick_);
    throw;
  }
}

wheel_engine::~wheel_engine() {
  (void)stop(false, nullptr); // lets go of what it took; waits for the hand-overs below, once the tick is settled
  if (tick_) {
    std::lock_guard lk(mtx_);
    // Idle (stop() took it out of the heap, or it never went in): ours to free. Queued
    // on the host or running: it frees itself, finding tick_ no longer itself or the
    // wheel gone (wheel_tick.cpp) - both read under this mutex.
    if (tick_state_ == tick_state::idle) free_wheel_tick(tick_);
    tick_ = nullptr;
  }
  METRONOME_TEST_HOOK(hook_point::wheel_destroy_after_tick_look);
  if (manual_) manual_->detach(this);
  // From here handles find the wheel gone: only entries handed to the executor are
  // still pending, and those need nothing of the wheel.
  wheel_anchor& a = *enrolled_.anchor;
  enrolled_.retire();
  wait_for_hand_overs(a);
}

bool wheel_engine::push_inbox(wheel_entry* e) noexcept {
  wheel_entry* head = inbox_.load(std::memory_order_relaxed);
  do {
    if (head == closed_inbox) return false;
    e->next_.store(head, std::memory_order_relaxed);
  } while (!inbox_.compare_exchange_weak(head, e, std::memory_order_seq_cst, std::memory_order_relaxed));
  return true;
}

// Moves what producers pushed into the slots (or to `fired` when already due); returns
// the earliest deadline linked (never if none).
std::uint64_t wheel_engine::drain_inbox(const held_lock& lk, chain& fired) noexcept {
  assert_held(lk, mtx_);
  wheel_entry* e = inbox_.load(std::memory_order_seq_cst);
  if (e == nullptr || e == closed_inbox) return never;
  // The stack holds the newest first: reverse it, so that ties keep scheduling order.
  wheel_entry* oldest = nullptr;
  for (e = inbox_.exchange(nullptr, std::memory_order_seq_cst); e;) {
    wheel_entry* next = next_in_slot(e);
    e->next_.store(oldest, std::memory_order_relaxed);
    oldest = e;
    e = next;
  }
  return place(lk, oldest, fired, no_level);
}

void wheel_engine::dispatch_to(pool_core* pool, const net::any_io_executor* ex, chain& fired) noexcept {
  if (!fired.head) return;
  const chain taken = std::exchange(fired, chain{});
  if (pool) {
    // Entries are task nodes: one chain, one push, no allocation.
    engine(pool)->push_ready_chain(taken.head, taken.tail, taken.count);
  } else {
    const net::any_io_executor target = *ex; // read before any timeout runs
    for (wheel_entry* e = taken.head; e;) {
      wheel_entry* next = next_in_slot(e);
      try {
        net::post(target, fire_on_executor(e));
      } catch (...) {
        report_here(std::current_exception(), "wheel_timer"); // the timeout was cancelled
      }
      e = next;
    }
  }
}

std::unique_ptr<wheel_core> wheel_core::make(wheel_options opts, net::any_io_executor ex, pool_core* pool,
                                             pool_core* host) {
  return std::make_unique<wheel_engine>(std::move(opts), std::move(ex), pool, host);
}

void wheel_core::insert(wheel_entry* e, clock::duration delay) {
  try {
    engine(*this).enter(e, delay);
  } catch (...) {
    e->state_.store(wheel_entry::cancelled, std::memory_order_release);
    e->drop(); // never fires: the callable goes, a wait completes with operation_aborted
    e->release();
    throw;
  }
}

namespace {
[[noreturn]] void refuse_wait_of_shut_down_pool() {
  throw rejected_execution("metronome: the wheel_timer's pool is shut down");
}
} // namespace

void wheel_engine::enter(wheel_entry* e, clock::duration delay) {
  e->wheel_id_ = enrolled_.id;
  if (forked_child_.load(std::memory_order_relaxed))
    throw rejected_execution("metronome: a wheel_timer of the parent process, in a forked child");
  if (e->is_wait() && pool_shut_down_.load(std::memory_order_seq_cst)) refuse_wait_of_shut_down_pool();
  if (delay <= clock::duration::zero()) {
    // Due now: straight to the executor, never into the wheel - a hand-over, counted
    // without the mutex: its count raised, then its look at the inbox, against stop()'s
    // inbox closed, then its look at the count (all seq_cst). Either the producer sees the
    // wheel stopped, or stop() waits for this push (the pool may go once it returned).
    // Stop-here test: `a_stop_waits_for_a_timeout_due_now_being_pushed` (producer_after_push).
    wheel_anchor& a = *enrolled_.anchor;
    a.handing_over.fetch_add(1, std::memory_order_seq_cst);
    if (inbox_.load(std::memory_order_seq_cst) == closed_inbox) {
      a.handing_over.fetch_sub(1, std::memory_order_release);
      a.handing_over.notify_all();
      throw rejected_execution("metronome: wheel_timer is stopped");
    }
    e->state_.store(wheel_entry::firing, std::memory_order_relaxed);
    chain fired;
    fired.push(e);
    dispatch_counted(a, pool_, &ex_, fired);
    return;
  }
  e->when_ = deadline_tick(now(), delay);
  // Bounded: count first (the bound is checked without the mutex). Unbounded: a
  // timeout linked here is counted under the mutex, with no atomic read-modify-write.
  const bool bounded = opts_.max_pending != 0;
  if (bounded) {
    // Counted only if under the bound (a compare-and-swap, not add-then-undo: pending()
    // read one over max_pending while a refused schedule took its count back).
    std::size_t before = inserted_.load(std::memory_order_relaxed);
    do {
      if (before + linked_.load(std::memory_order_relaxed) - removed_.load(std::memory_order_relaxed) >=
          opts_.max_pending)
        throw rejected_execution("metronome: wheel_timer has max_pending timeouts pending");
    } while (!inserted_.compare_exchange_weak(before, before + 1, std::memory_order_relaxed));
  }
  // Uncontended: link it here, while the node is hot in this core's cache. Contended
  // (a tick is moving timeouts): never wait, leave it in the inbox.
  // On a manual clock always here: no tick drains the inbox, and a deadline the
  // clock passed meanwhile (or the clock's last tick, when it stands at its end) would
  // wait there for the next advance.
  METRONOME_TEST_HOOK(hook_point::wheel_producer_before_lock);
  if (manual_ ? (mtx_.lock(), true) : mtx_.try_lock()) {
    std::unique_lock lk(mtx_, std::adopt_lock);
    if (e->is_wait() && pool_shut_down_.load(std::memory_order_relaxed)) {
      if (bounded) inserted_.fetch_sub(1, std::memory_order_relaxed);
      refuse_wait_of_shut_down_pool(); // lk unlocks
    }
    if (!stopped_) {
      chain fired;
      // Earlier timeouts still in the inbox go first: ties keep scheduling order.
      if (inbox_.load(std::memory_order_relaxed) != nullptr) drain_inbox(lk, fired);
      if (!bounded) linked_.store(linked_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      // Linked, or fired when its tick has come already (counted removed), as a drained
      // inbox entry is.
      e->next_.store(nullptr, std::memory_order_relaxed);
      const std::uint64_t linked = place(lk, e, fired, no_level);
      const bool earlier = linked < sleeping_until_.load(std::memory_order_relaxed);
      if (earlier && tick_) rearm_tick(lk, linked);
      // Fired at once (its tick has come): counted under the mutex, as a handle's is.
      hand_over_unlocked(*enrolled_.anchor, lk, fired);
      return;
    }
  }
  if (!bounded) inserted_.fetch_add(1, std::memory_order_relaxed);
  // Read before the push: once published, the entry may fire, complete and be freed.
  const std::uint64_t when = e->when_;
  const bool wait = e->is_wait();
  if (wait) e->add_ref(); // for the check below
  METRONOME_TEST_HOOK(hook_point::wheel_producer_before_push);
  if (!push_inbox(e)) {
    if (wait) e->release();
    inserted_.fetch_sub(1, std::memory_order_relaxed);
    throw rejected_execution("metronome: wheel_timer is stopped");
  }
  METRONOME_TEST_HOOK(hook_point::wheel_producer_after_push);
  if (wait) {
    // Dekker pair with on_pool_shutdown(): it sets pool_shut_down_ and then drains the
    // inbox; a wait pushed after that drain sees the flag and cancels itself.
    if (pool_shut_down_.load(std::memory_order_seq_cst)) e->cancel();
    e->release();
  }
  // Dekker pair with take_turn(): it stores sleeping_until_ and then drains the inbox.
  if (when < sleeping_until_.load(std::memory_order_seq_cst)) {
    std::unique_lock lk(mtx_);
    rearm_tick(lk, when);
  }
}

bool wheel_engine::cancel(const held_lock& lk, wheel_entry* e, chain& fired) noexcept {
  assert_held(lk, mtx_);
  if (e->state() == wheel_entry::pending && e->slot_index_ == wheel_entry::no_slot)
    drain_inbox(lk, fired); // it is still in the inbox: link it first
  // Linked entries are never due yet; a pending entry with a passed deadline was
  // handed to the executor with its slot (see advance).
  if (e->state() != wheel_entry::pending || e->slot_index_ == wheel_entry::no_slot || e->when_ <= elapsed_)
    return false;
  unlink(lk, e);
  e->state_.store(wheel_entry::cancelled, std::memory_order_release);
  count_removed(lk, 1);
  // Hosted ticks run only while the wheel holds timeouts: the last one cancelled, the
  // tick leaves the host (whose context may then run out of work, as with a timer).
  if (pending() == 0 && withdraw_tick(lk)) {
    METRONOME_TEST_HOOK(hook_point::wheel_cancel_after_withdraw);
    // Dekker pair with enter()'s push, as take_turn() is: a producer that found the
    // mutex taken pushed onto the inbox after pending() read 0, and read sleeping_until_
    // before this store (the old, armed deadline: it did not re-arm). Either its push is
    // seen here, or it reads `never` and takes the mutex to re-arm. Without this look the
    // entry waited in the inbox with no tick to drain it (found in CI: a raced P2300
    // stop hung). Tested by `a_timeout_pushed_while_a_cancel_withdraws_the_tick_fires`
    // (test/handover/wheel.cpp).
    sleeping_until_.store(never, std::memory_order_seq_cst);
    if (inbox_.load(std::memory_order_seq_cst) != nullptr) {
      const std::uint64_t earliest = drain_inbox(lk, fired); // due ones go to `fired`
      if (earliest != never) rearm_tick(lk, earliest);
    }
  }
  return true;
}

// The same tests as cancel(): only a linked entry whose deadline is still ahead
// can move. Unlinked and linked again (at the tail of its new slot: a reset counts as a
// new scheduling among equal deadlines), the node and its slot lists allocate nothing.
bool wheel_engine::reset(const held_lock& lk, wheel_entry* e, clock::duration delay, chain& fired) noexcept {
  assert_held(lk, mtx_);
  if (e->state() == wheel_entry::pending && e->slot_index_ == wheel_entry::no_slot)
    drain_inbox(lk, fired); // it is still in the inbox: link it first
  if (e->state() != wheel_entry::pending || e->slot_index_ == wheel_entry::no_slot || e->when_ <= elapsed_)
    return false;
  unlink(lk, e);
  // An atomic store: handles read when_ without the mutex (deadline_passed).
  relaxed_store(e->when_, delay <= clock::duration::zero() ? elapsed_ : deadline_tick(now(), delay));
  if (e->when_ <= elapsed_) { // due now: to the executor, as insert() does
    fire(lk, e, fired);
    count_removed(lk, 1);
    return true;
  }
  link(lk, e, no_level);
  // An earlier deadline than the tick sleeps until: re-arm it.
  if (e->when_ < sleeping_until_.load(std::memory_order_relaxed)) rearm_tick(lk, e->when_);
  return true;
}

std::vector<wheel_entry*> wheel_core::stop(bool wait_for_hand_overs, bool* unlisted) noexcept {
  wheel_engine& w = engine(*this);
  std::vector<wheel_entry*> left;
  wheel_entry* taken = nullptr; // the entries taken, linked through next_ (nothing allocated)
  std::size_t n = 0;
  {
    std::unique_lock lk(w.mtx_);
    if (w.stopped_) {
      // Another stop() won (see the invariant below). Its own thread's again while it is
      // still inside that stop() - from a dropped timeout's destructor - returns at once;
      // any other waits until the winner has let go of the pool, then for the hand-overs,
      // as the winner does. The anchor is the one the engine kept (home_: never freed,
      // while enrolled_.anchor is cleared by retire()), and a wheel its destructor retired
      // meanwhile is left alone.
      wheel_anchor& a = w.home_;
      const bool reentered =
          w.stopper_ == std::this_thread::get_id() && !w.stop_done_.load(std::memory_order_acquire);
      const bool retired = !wheel_engine::enrolled(a, w.enrolled_.id);
      lk.unlock();
      if (reentered || retired) return left;
      w.stop_done_.wait(false, std::memory_order_acquire);
      if (wait_for_hand_overs) wheel_engine::wait_for_hand_overs_to_stop(a);
      return left;
    }
    w.stopped_ = true;
    w.stopper_ = std::this_thread::get_id();
    auto take = [&](wheel_entry* e) {
      e->state_.store(wheel_entry::cancelled, std::memory_order_release);
      e->next_.store(taken, std::memory_order_relaxed);
      taken = e;
      ++n;
    };
    for (wheel_entry* e = w.inbox_.exchange(closed_inbox, std::memory_order_seq_cst); e;) {
      wheel_entry* next = wheel_engine::next_in_slot(e);
      take(e);
      e = next;
    }
    for (auto& list : w.slots_) {
      for (wheel_entry* e = list.head; e;) {
        wheel_entry* next = wheel_engine::next_in_slot(e);
        e->prev_ = nullptr;
        e->slot_index_ = wheel_entry::no_slot;
        take(e);
        e = next;
      }
      list = wheel_engine::slot_list{};
    }
    for (auto& o : w.occupied_) o = 0;
    for (auto& m : w.marks_) m.clear();
    w.count_removed(lk, n);
    w.withdraw_tick(lk); // (if it is queued on the host already, it finds the wheel stopped)
  }
  // Nothing above allocates: a stop() that failed half-way would leave later ones waiting
  // for it. The list is made here; without memory for it, the entries are stopped all the
  // same and the wheel's references let go (`unlisted` tells the caller).
  bool keep = unlisted != nullptr; // the caller takes the wheel's references
  if (keep && n != 0) {
    try {
      left.reserve(n);
    } catch (...) {
      keep = false;
      *unlisted = true;
    }
  }
  while (taken) {
    wheel_entry* e = taken;
    taken = wheel_engine::next_in_slot(e);
    e->next_.store(nullptr, std::memory_order_relaxed); // a dropped wait may be queued with it
    e->drop();
    if (keep)
      left.push_back(e); // reserved: does not throw
    else
      e->release();
  }
  // Stopped, the wheel hands nothing more to the pool: the pool may go first from here
  // (waits started later do not count on it either: pool() says none) - once the
  // hand-overs other threads started before the stop (a tick, an advance, a handle's
  // cancel or reset) have pushed what they took: they were counted under the mutex.
  //
  // Invariant (concurrent stops): every stop() returns after the one that stopped the
  // wheel has delivered what it took (the drops above may post a P2300 operation's
  // completion to the pool) and detached the wheel from its pool, so that the pool may go
  // when any stop() returned ("All members are safe to call concurrently"). The winner
  // sets stop_done_ after both; a later stop() blocks on it (atomic wait). Stop-here test:
  // `a_second_stop_waits_until_the_first_has_let_go_of_the_pool` (hook
  // wheel_stop_before_detach).
  w.detached_.store(true, std::memory_order_seq_cst); // seq_cst: see wheel_core::pool_use
  METRONOME_TEST_HOOK(hook_point::wheel_stop_before_detach);
  if (w.pool_) engine(w.pool_)->detach_wheel(&w);
  w.stop_done_.store(true, std::memory_order_release);
  w.stop_done_.notify_all();
  if (wait_for_hand_overs) wheel_engine::wait_for_hand_overs_to_stop(*w.enrolled_.anchor);
  return left;
}

void wheel_engine::on_pool_shutdown() noexcept {
  chain fired;
  wheel_entry* aborted = nullptr;
  {
    std::unique_lock lk(mtx_);
    if (stopped_) return;
    pool_shut_down_.store(true, std::memory_order_seq_cst);
    drain_inbox(lk, fired);
    std::size_t n = 0;
    for (const slot_list& list : slots_) {
      for (wheel_entry* e = list.head; e;) {
        wheel_entry* next = next_in_slot(e);
        if (e->is_wait()) {
          unlink(lk, e);
          e->state_.store(wheel_entry::cancelled, std::memory_order_release);
          e->next_.store(aborted, std::memory_order_relaxed);
          aborted = e;
          ++n;
        }
        e = next;
      }
    }
    count_removed(lk, n);
  }
  dispatch(fired);
  while (aborted) {
    wheel_entry* e = aborted;
    aborted = next_in_slot(e);
    e->drop();    // to the pool's queue: a worker delivers operation_aborted
    e->release(); // the wheel's reference
  }
}

std::size_t wheel_core::pending() const noexcept {
  // Removals are counted under the mutex, insertions by producers: read the removals
  // first so that the difference never goes below zero.
  const wheel_engine& e = engine(*this);
  const std::size_t removed = e.removed_.load(std::memory_order_acquire);
  const std::size_t inserted = e.inserted_.load(std::memory_order_acquire) + e.linked_.load(std::memory_order_acquire);
  return inserted > removed ? inserted - removed : 0;
}

const net::any_io_executor& wheel_core::executor() const noexcept { return engine(*this).ex_; }

pool_core* wheel_core::pool() const noexcept {
  const wheel_engine& e = engine(*this);
  return e.detached_.load(std::memory_order_acquire) ? nullptr : e.pool_;
}

std::size_t wheel_engine::moving(std::size_t level) const {
  std::lock_guard lk(mtx_);
  if (level == 0 || level >= opts_.levels) return 0;
  return cascades_[level].number == (elapsed_ >> shift(level)) + 1 ? slots_[cascading(level)].count : 0;
}

std::size_t wheel_engine::touched_ahead() const {
  std::lock_guard lk(mtx_);
  return touched_entries_;
}

} // namespace metronome::detail
