#include <metronome/detail/wheel_core.hpp>
#include <metronome/errors.hpp>
#include <metronome/manual_clock.hpp>

#include <boost/asio/post.hpp>

#include <bit>
#include <stdexcept>
#include <utility>

namespace metronome::detail {

namespace {
// The inbox's value once the wheel is stopped: pushes fail.
wheel_entry* const closed_inbox = reinterpret_cast<wheel_entry*>(alignof(wheel_entry));
} // namespace

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
    complete_(this, fire_action);
    state_.store(done, std::memory_order_release);
    drop();
  } else if (!run && claim(cancelled)) {
    drop(); // the executor discarded it
  }
  release();
}

bool wheel_entry::is_due() const noexcept {
  const auto s = state();
  if (s == pending) return wheel_ && when_ <= wheel_->elapsed();
  return s == firing || s == running || s == done;
}

bool wheel_entry::cancel() noexcept {
  if (state() == pending && wheel_ && wheel_->cancel(this)) return true;
  if (claim(cancelled)) { // queued on the executor, not started
    drop();
    return true;
  }
  return false;
}

wheel_core::wheel_core(wheel_options opts, boost::asio::any_io_executor ex, pool_core* pool)
    : opts_(opts), ex_(std::move(ex)), pool_(pool), manual_(opts.time_source) {
  const auto slots = opts_.slots_per_level;
  if (opts_.tick <= clock::duration::zero()) throw std::invalid_argument("metronome: wheel tick must be positive");
  if (slots < 2 || slots > 4096 || (slots & (slots - 1)) != 0)
    throw std::invalid_argument("metronome: slots_per_level must be a power of two from 2 to 4096");
  bits_ = static_cast<unsigned>(std::countr_zero(slots));
  if (opts_.levels < 1 || bits_ * opts_.levels > 60)
    throw std::invalid_argument("metronome: levels must be >= 1 with log2(slots_per_level) * levels <= 60");
  mask_ = slots - 1;
  slots_.assign(opts_.levels * slots, slot_list{});
  words_per_level_ = (slots + 63) / 64;
  occupied_.assign(opts_.levels * words_per_level_, 0);
  start_ = now();
  if (manual_)
    manual_->attach(this);
  else
    thread_ = std::thread([this] { run(); });
}

wheel_core::~wheel_core() {
  auto left = stop();
  for (auto* e : left) e->release();
  if (manual_) manual_->detach(this);
}

clock::time_point wheel_core::now() const noexcept { return manual_ ? manual_->now() : clock::now(); }

std::uint64_t wheel_core::tick_of(clock::time_point t) const noexcept {
  if (t <= start_) return 0;
  return static_cast<std::uint64_t>((t - start_) / opts_.tick);
}

std::uint64_t wheel_core::deadline_tick(clock::time_point current, clock::duration delay) const noexcept {
  // Never early: round the deadline up to the next tick boundary.
  if (delay < clock::duration::zero()) delay = clock::duration::zero();
  const clock::time_point due = saturating_add(current, delay);
  const auto since = due - start_;
  if (since <= clock::duration::zero()) return 0;
  const auto tick = static_cast<std::uint64_t>(opts_.tick.count());
  const auto ns = static_cast<std::uint64_t>(since.count());
  return ns / tick + (ns % tick != 0 ? 1 : 0); // one divide instruction gives both
}

void wheel_core::link_locked(wheel_entry* e) noexcept {
  const std::uint64_t range = std::uint64_t(1) << (bits_ * opts_.levels);
  const std::uint64_t top_slot_range = range >> bits_;
  // Deadlines past the covered range wait in the farthest top-level slot; they move
  // down when that slot comes up. That slot is never the current one.
  std::uint64_t when = e->when_;
  if (when - elapsed_ >= range) when = elapsed_ + range - top_slot_range;
  std::uint64_t masked = (elapsed_ ^ when) | mask_;
  const unsigned significant = 63u - static_cast<unsigned>(std::countl_zero(masked));
  std::size_t level = significant / bits_;
  if (level >= opts_.levels) level = opts_.levels - 1;
  const std::size_t slot = static_cast<std::size_t>((when >> (level * bits_)) & mask_);
  const std::size_t index = level * (mask_ + 1) + slot;
  slot_list& list = slots_[index];
  e->slot_index_ = static_cast<std::uint16_t>(index);
  e->prev_ = list.tail;
  e->next_.store(nullptr, std::memory_order_relaxed);
  if (list.tail)
    list.tail->next_.store(e, std::memory_order_relaxed);
  else
    list.head = e;
  list.tail = e;
  if (list.count++ == 0) set_occupied(index, true);
}

wheel_entry* wheel_core::next_in_slot(wheel_entry* e) noexcept {
  return static_cast<wheel_entry*>(e->next_.load(std::memory_order_relaxed));
}

void wheel_core::unlink_locked(wheel_entry* e) noexcept {
  const std::size_t index = e->slot_index_;
  slot_list& list = slots_[index];
  wheel_entry* next = next_in_slot(e);
  if (e->prev_)
    e->prev_->next_.store(next, std::memory_order_relaxed);
  else
    list.head = next;
  if (next)
    next->prev_ = e->prev_;
  else
    list.tail = e->prev_;
  if (--list.count == 0) set_occupied(index, false);
  e->prev_ = nullptr;
  e->next_.store(nullptr, std::memory_order_relaxed);
  e->slot_index_ = wheel_entry::no_slot;
}

void wheel_core::set_occupied(std::size_t index, bool on) noexcept {
  const std::size_t level = index >> bits_, slot = index & mask_;
  std::uint64_t& word = occupied_[level * words_per_level_ + slot / 64];
  const std::uint64_t bit = std::uint64_t(1) << (slot % 64);
  word = on ? (word | bit) : (word & ~bit);
}

// The first occupied slot of `level` at or after `from`, going round; slots if none.
std::size_t wheel_core::next_occupied(std::size_t level, std::size_t from) const noexcept {
  const std::uint64_t* words = occupied_.data() + level * words_per_level_;
  const std::size_t first = from / 64;
  const unsigned bit = static_cast<unsigned>(from % 64);
  if (const std::uint64_t w = words[first] & (~std::uint64_t(0) << bit))
    return first * 64 + static_cast<std::size_t>(std::countr_zero(w));
  for (std::size_t i = 1; i < words_per_level_; ++i) {
    const std::size_t k = (first + i) % words_per_level_;
    if (words[k]) return k * 64 + static_cast<std::size_t>(std::countr_zero(words[k]));
  }
  if (const std::uint64_t w = words[first] & ((std::uint64_t(1) << bit) - 1))
    return first * 64 + static_cast<std::size_t>(std::countr_zero(w));
  return mask_ + 1;
}

// The earliest occupied slot over all levels, by the tick its range starts at.
std::optional<wheel_core::expiration> wheel_core::next_expiration_locked() const noexcept {
  std::optional<expiration> best;
  for (std::size_t level = 0; level < opts_.levels; ++level) {
    const unsigned shift = static_cast<unsigned>(level * bits_);
    const std::size_t now_slot = static_cast<std::size_t>((elapsed_ >> shift) & mask_);
    const std::size_t slot = next_occupied(level, now_slot);
    if (slot > mask_) continue;
    const std::uint64_t slot_range = std::uint64_t(1) << shift;
    const std::uint64_t level_range = slot_range << bits_;
    const std::uint64_t level_start = elapsed_ & ~(level_range - 1);
    std::uint64_t deadline = level_start + slot * slot_range;
    if (slot < now_slot) deadline += level_range;
    if (!best || deadline < best->deadline) best = expiration{level, slot, deadline};
  }
  return best;
}

void wheel_core::chain::push(wheel_entry* e) noexcept {
  e->next_.store(nullptr, std::memory_order_relaxed);
  append(e, e, 1);
}

void wheel_core::chain::append(wheel_entry* first, wheel_entry* last, std::size_t n) noexcept {
  if (tail)
    tail->next_.store(first, std::memory_order_relaxed);
  else
    head = first;
  tail = last;
  count += n;
}

void wheel_core::fire_locked(wheel_entry* e, chain& fired) noexcept {
  e->slot_index_ = wheel_entry::no_slot;
  e->prev_ = nullptr;
  e->state_.store(wheel_entry::firing, std::memory_order_release);
  fired.push(e);
}

// Walks a list linked through next_: entries already due go to `fired`, the others
// into their slots. Returns the earliest deadline linked (never if none).
std::uint64_t wheel_core::place_locked(wheel_entry* e, chain& fired) noexcept {
  std::uint64_t earliest = never;
  std::size_t due = 0;
  while (e) {
    wheel_entry* next = next_in_slot(e);
    if (e->when_ <= elapsed_) {
      fire_locked(e, fired);
      ++due;
    } else {
      link_locked(e);
      if (e->when_ < earliest) earliest = e->when_;
    }
    e = next;
  }
  count_removed_locked(due);
  return earliest;
}

// Fired, cancelled or stopped entries leave pending(); only mutex holders write removed_.
void wheel_core::count_removed_locked(std::size_t n) noexcept {
  if (n) removed_.store(removed_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

void wheel_core::advance_locked(std::uint64_t now_tick, chain& fired) noexcept {
  std::size_t due = 0;
  for (;;) {
    auto exp = next_expiration_locked();
    if (!exp || exp->deadline > now_tick) break;
    if (exp->deadline > elapsed_) elapsed_ = exp->deadline;
    const std::size_t index = exp->level * (mask_ + 1) + exp->slot;
    slot_list list = std::exchange(slots_[index], slot_list{});
    set_occupied(index, false);
    if (exp->level == 0) {
      // Every entry of a level-0 slot is due at this very tick, and the slot's list is
      // linked through the ready queue's own field: hand the whole list over without
      // touching a single entry (they stay `pending`; from now on `when_ <= elapsed_`
      // tells cancel() that they left the wheel).
      fired.append(list.head, list.tail, list.count);
      due += list.count;
      continue;
    }
    place_locked(list.head, fired); // cascades to lower levels
  }
  if (now_tick > elapsed_) elapsed_ = now_tick;
  elapsed_published_.store(elapsed_, std::memory_order_release);
  count_removed_locked(due);
}

bool wheel_core::push_inbox(wheel_entry* e) noexcept {
  wheel_entry* head = inbox_.load(std::memory_order_relaxed);
  do {
    if (head == closed_inbox) return false;
    e->next_.store(head, std::memory_order_relaxed);
  } while (!inbox_.compare_exchange_weak(head, e, std::memory_order_seq_cst, std::memory_order_relaxed));
  return true;
}

// Moves what producers pushed into the slots (or to `fired` when already due); returns
// the earliest deadline linked (never if none).
std::uint64_t wheel_core::drain_inbox_locked(chain& fired) noexcept {
  wheel_entry* e = inbox_.load(std::memory_order_seq_cst);
  if (e == nullptr || e == closed_inbox) return never;
  return place_locked(inbox_.exchange(nullptr, std::memory_order_seq_cst), fired);
}

void wheel_core::dispatch(chain& fired) noexcept {
  if (!fired.head) return;
  if (pool_) {
    // Entries are task nodes: one chain, one push, no allocation.
    pool_->push_ready_chain(fired.head, fired.tail, fired.count);
  } else {
    for (wheel_entry* e = fired.head; e;) {
      wheel_entry* next = next_in_slot(e);
      try {
        boost::asio::post(ex_, [e] { e->complete(true); });
      } catch (...) {
        e->complete(false);
      }
      e = next;
    }
  }
  fired = chain{};
}

void wheel_core::wake() noexcept {
  { std::lock_guard lk(mtx_); }
  cv_.notify_one();
}

void wheel_core::insert(wheel_entry* e, clock::duration delay) {
  e->wheel_ = this;
  if (delay <= clock::duration::zero()) {
    // Due now: straight to the executor, never into the wheel.
    if (inbox_.load(std::memory_order_acquire) == closed_inbox)
      throw rejected_execution("metronome: wheel_timer is stopped");
    e->state_.store(wheel_entry::firing, std::memory_order_relaxed);
    chain fired;
    fired.push(e);
    dispatch(fired);
    return;
  }
  e->when_ = deadline_tick(now(), delay);
  const std::size_t before = inserted_.fetch_add(1, std::memory_order_relaxed);
  if (opts_.max_pending != 0 && before - removed_.load(std::memory_order_relaxed) >= opts_.max_pending) {
    inserted_.fetch_sub(1, std::memory_order_relaxed);
    throw rejected_execution("metronome: wheel_timer has max_pending timeouts pending");
  }
  // Uncontended: link it here, while the node is hot in this core's cache. Contended
  // (the timer thread is moving a tick's timeouts): never wait, leave it in the inbox.
  if (mtx_.try_lock()) {
    std::unique_lock lk(mtx_, std::adopt_lock);
    if (!stopped_ && e->when_ > elapsed_) {
      link_locked(e);
      const bool earlier = e->when_ < sleeping_until_.load(std::memory_order_relaxed);
      lk.unlock();
      if (earlier) cv_.notify_one(); // we held the mutex: the timer thread is waiting or will see the slot
      return;
    }
  }
  if (!push_inbox(e)) {
    inserted_.fetch_sub(1, std::memory_order_relaxed);
    throw rejected_execution("metronome: wheel_timer is stopped");
  }
  // Dekker pair with run(): it stores sleeping_until_ and then drains the inbox.
  if (e->when_ < sleeping_until_.load(std::memory_order_seq_cst)) wake();
}

bool wheel_core::cancel(wheel_entry* e) noexcept {
  chain fired;
  bool won = false;
  {
    std::lock_guard lk(mtx_);
    if (e->state() == wheel_entry::pending && e->slot_index_ == wheel_entry::no_slot)
      drain_inbox_locked(fired); // it is still in the inbox: link it first
    // Linked entries are never due yet; a pending entry with a passed deadline was
    // handed to the executor with its slot (see advance_locked).
    if (e->state() == wheel_entry::pending && e->slot_index_ != wheel_entry::no_slot && e->when_ > elapsed_) {
      unlink_locked(e);
      e->state_.store(wheel_entry::cancelled, std::memory_order_release);
      count_removed_locked(1);
      won = true;
    }
  }
  dispatch(fired);
  if (!won) return false;
  e->drop();    // frees the callable at once; wakes nobody
  e->release(); // the wheel's reference
  return true;
}

std::vector<wheel_entry*> wheel_core::stop() {
  std::vector<wheel_entry*> left;
  {
    std::lock_guard lk(mtx_);
    if (stopped_) return left;
    stopped_ = true;
    for (wheel_entry* e = inbox_.exchange(closed_inbox, std::memory_order_seq_cst); e;) {
      wheel_entry* next = next_in_slot(e);
      e->next_.store(nullptr, std::memory_order_relaxed);
      left.push_back(e);
      e = next;
    }
    for (auto& list : slots_) {
      for (wheel_entry* e = list.head; e;) {
        wheel_entry* next = next_in_slot(e);
        e->prev_ = nullptr;
        e->next_.store(nullptr, std::memory_order_relaxed);
        e->slot_index_ = wheel_entry::no_slot;
        left.push_back(e);
        e = next;
      }
      list = slot_list{};
    }
    for (auto* e : left) e->state_.store(wheel_entry::cancelled, std::memory_order_release);
    for (auto& o : occupied_) o = 0;
    count_removed_locked(left.size());
    cv_.notify_all();
  }
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id())
      thread_.detach();
    else
      thread_.join();
  }
  for (auto* e : left) e->drop();
  return left;
}

std::size_t wheel_core::pending() const noexcept {
  // Removals are counted under the mutex, insertions by producers: read the removals
  // first so that the difference never goes below zero.
  const std::size_t removed = removed_.load(std::memory_order_acquire);
  const std::size_t inserted = inserted_.load(std::memory_order_acquire);
  return inserted > removed ? inserted - removed : 0;
}

void wheel_core::on_time_advanced() {
  chain fired;
  {
    std::lock_guard lk(mtx_);
    if (stopped_) return;
    drain_inbox_locked(fired);
    advance_locked(tick_of(now()), fired);
  }
  dispatch(fired);
}

// The timer thread: moves timeouts, never runs user code. While timeouts keep
// arriving it wakes every tick to take them from the inbox; otherwise it sleeps until
// the next expiration, and a producer wakes it only for an earlier deadline.
void wheel_core::run() {
  chain fired;
  std::unique_lock lk(mtx_);
  while (!stopped_) {
    sleeping_until_.store(0, std::memory_order_relaxed);
    const bool arrived = drain_inbox_locked(fired) != never;
    advance_locked(tick_of(clock::now()), fired);
    if (fired.head) {
      lk.unlock();
      dispatch(fired);
      lk.lock();
      continue;
    }
    auto exp = next_expiration_locked();
    std::uint64_t until = exp ? exp->deadline : never;
    if (arrived && elapsed_ + 1 < until) until = elapsed_ + 1;
    sleeping_until_.store(until, std::memory_order_seq_cst);
    // Whatever a producer pushed before it could see `until` is in the inbox now.
    if (drain_inbox_locked(fired) < until || fired.head) continue;
    if (until == never)
      cv_.wait(lk);
    else
      cv_.wait_until(lk, start_ + opts_.tick * static_cast<clock::rep>(until));
  }
  sleeping_until_.store(0, std::memory_order_relaxed);
}

} // namespace metronome::detail
