#include <metronome/detail/report.hpp>
#include <metronome/detail/wheel_core.hpp>
#include <metronome/errors.hpp>
#include <metronome/manual_clock.hpp>

#include <boost/asio/post.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <pthread.h>
#include <stdexcept>
#include <time.h>
#include <type_traits>
#include <utility>

namespace metronome::detail {

namespace {
__extension__ using uint128 = unsigned __int128;
// The inbox's value once the wheel is stopped: pushes fail.
wheel_entry* const closed_inbox = reinterpret_cast<wheel_entry*>(alignof(wheel_entry));

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
      auto* reg = new anchor_registry; // never destroyed: handles may outlive everything
      ::pthread_atfork([] { get().m_.lock(); }, [] { get().m_.unlock(); }, [] { get().m_.unlock(); });
      return reg;
    }();
    return *r;
  }

  wheel_anchor& at(std::uint64_t id) noexcept {
    const auto [block, offset] = locate(id & index_mask);
    return blocks_[block].load(std::memory_order_acquire)[offset];
  }

  // Returns the new wheel's id.
  std::uint64_t enroll(wheel_core* w) {
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
  void operator()() { std::exchange(e_, nullptr)->complete(true); }

private:
  wheel_entry* e_;
};

} // namespace

wheel_core::enrollment::enrollment(wheel_core* w)
    : id(anchor_registry::get().enroll(w)), anchor(&anchor_registry::get().at(id)) {}

void wheel_core::enrollment::retire() noexcept {
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
  if (s == pending) return wheel_core::deadline_passed(this);
  return s == firing || s == running || s == done;
}

bool wheel_entry::cancel() noexcept {
  if (state() == pending && wheel_core::cancel(this)) return true;
  if (claim(cancelled)) { // queued on the executor, not started
    drop();
    return true;
  }
  return false;
}

wheel_core::wheel_core(wheel_options opts, boost::asio::any_io_executor ex, pool_core* pool)
    : enrolled_(this), mtx_(enrolled_.anchor->mtx), opts_(std::move(opts)), ex_(std::move(ex)), pool_(pool),
      manual_(opts_.time_source) {
  if (opts_.exception_handler)
    exception_handler_ =
        std::make_shared<const std::function<void(std::exception_ptr)>>(std::move(opts_.exception_handler));
  const auto slots = opts_.slots_per_level;
  if (opts_.tick <= clock::duration::zero()) throw std::invalid_argument("metronome: wheel tick must be positive");
  if (slots < 4 || slots > 4096 || (slots & (slots - 1)) != 0)
    throw std::invalid_argument("metronome: slots_per_level must be a power of two from 4 to 4096");
  const auto bits = static_cast<unsigned>(std::countr_zero(slots));
  span_bits_ = bits - 1;
  if (opts_.levels < 1 || bits + span_bits_ * (opts_.levels - 1) > 60)
    throw std::invalid_argument(
        "metronome: levels must be >= 1 with log2(slots_per_level) + log2(slots_per_level / 2) * (levels - 1) <= 60");
  mask_ = slots - 1;
  const auto tick_ns = static_cast<std::uint64_t>(opts_.tick.count());
  tick_magic_ = tick_ns == 1 ? ~std::uint64_t(0) : static_cast<std::uint64_t>((uint128(1) << 64) / tick_ns);
  slots_.assign(opts_.levels * slots, slot_list{});
  cascades_.assign(opts_.levels, cascade{});
  words_per_level_ = (slots + 63) / 64;
  occupied_.assign(opts_.levels * words_per_level_, 0);
  if (opts_.levels > 1) marks_.resize(slots); // a level-0 slot is then one tick
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
  // From here handles find the wheel gone: only entries handed to the executor are
  // still pending, and those need nothing of the wheel.
  enrolled_.retire();
}

// steady_clock::now() without the library call in between (it reads CLOCK_MONOTONIC too).
clock::time_point wheel_core::now() const noexcept {
  if (manual_) return manual_->now();
  if constexpr (std::is_same_v<clock, std::chrono::steady_clock>) {
    timespec ts;
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
  } else {
    return clock::now();
  }
}

// ns / tick and ns % tick without a divide instruction (~40 cycles, on every
// schedule): magic = floor(2^64 / tick) gives a quotient at most one too small.
inline std::uint64_t wheel_core::divide_by_tick(std::uint64_t ns, std::uint64_t& rest) const noexcept {
  const auto tick = static_cast<std::uint64_t>(opts_.tick.count());
  auto q = static_cast<std::uint64_t>((static_cast<uint128>(ns) * tick_magic_) >> 64);
  rest = ns - q * tick;
  if (rest >= tick) {
    ++q;
    rest -= tick;
  }
  return q;
}

std::uint64_t wheel_core::tick_of(clock::time_point t) const noexcept {
  if (t <= start_) return 0;
  std::uint64_t rest;
  return divide_by_tick(static_cast<std::uint64_t>((t - start_).count()), rest);
}

std::uint64_t wheel_core::deadline_tick(clock::time_point current, clock::duration delay) const noexcept {
  // Never early: round the deadline up to the next tick boundary.
  if (delay < clock::duration::zero()) delay = clock::duration::zero();
  const clock::time_point due = saturating_add(current, delay);
  const auto since = due - start_;
  if (since <= clock::duration::zero()) return 0;
  std::uint64_t rest;
  const std::uint64_t q = divide_by_tick(static_cast<std::uint64_t>(since.count()), rest);
  return q + (rest != 0 ? 1 : 0);
}

// The lowest level whose ring may hold `when`: the one below the first level whose
// current or next slot contains it. (Level L's next slot is moving down or empty, so a
// deadline there belongs one level lower; the level above keeps what is further.)
std::size_t wheel_core::level_for(std::uint64_t when) const noexcept {
  const std::size_t top = opts_.levels - 1;
  for (std::size_t level = 0; level < top; ++level) {
    const unsigned up = shift(level + 1);
    if ((when >> up) - (elapsed_ >> up) <= 1) return level;
  }
  return top;
}

// Links a future entry into its slot: at least one slot ahead at level 0, two above
// (a level's next slot is the one moving down). Except when its deadline is in the
// slot moving down from the level above: then it joins that slot's tail, behind the
// older ones with the same deadline (ties stay in scheduling order). Deadlines past the
// top level's ring wait in its farthest slot.
void wheel_core::link_locked(wheel_entry* e, std::size_t from_level) noexcept {
  const std::uint64_t when = e->when_;
  std::size_t level = level_for(when);
  const std::size_t up = level + 1;
  if (up < opts_.levels && up != from_level && (when >> shift(up)) == (elapsed_ >> shift(up)) + 1 &&
      slots_[cascading(up)].count != 0)
    level = up;
  const std::uint64_t current = elapsed_ >> shift(level);
  std::uint64_t number = when >> shift(level);
  if (number - current > mask_) number = current + mask_;
  append_locked(e, level * (mask_ + 1) + static_cast<std::size_t>(number & mask_));
}

void wheel_core::append_locked(wheel_entry* e, std::size_t index) noexcept {
  slot_list& list = slots_[index];
  e->slot_index_ = static_cast<std::uint16_t>(index);
  e->mark_ = wheel_entry::no_mark;
  if (index <= mask_ && !marks_.empty() && list.count % mark_every == 0) mark_locked(e, index);
  e->prev_ = list.tail;
  e->next_.store(nullptr, std::memory_order_relaxed);
  if (list.tail)
    list.tail->next_.store(e, std::memory_order_relaxed);
  else
    list.head = e;
  list.tail = e;
  if (list.count++ == 0) set_occupied(index, true);
}

void wheel_core::mark_locked(wheel_entry* e, std::size_t index) noexcept {
  auto& marks = marks_[index];
  if (marks.size() >= wheel_entry::no_mark) return;
  try {
    marks.push_back(e);
  } catch (...) {
    return; // entry points are only a hint
  }
  e->mark_ = static_cast<std::uint8_t>(marks.size() - 1);
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
  if (e->mark_ != wheel_entry::no_mark) { // the walk from the entry point before covers what follows
    marks_[index][e->mark_] = nullptr;
    e->mark_ = wheel_entry::no_mark;
  }
  e->prev_ = nullptr;
  e->next_.store(nullptr, std::memory_order_relaxed);
  e->slot_index_ = wheel_entry::no_slot;
}

void wheel_core::set_occupied(std::size_t index, bool on) noexcept {
  const std::size_t level = index / (mask_ + 1), slot = index & mask_;
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

// The next tick at which the wheel has something to do: a level-0 slot falls due, a
// level's next slot starts moving down, or a slot moving down owes its next batch.
std::uint64_t wheel_core::next_event_locked() const noexcept {
  const std::uint64_t soonest = elapsed_ + 1;
  std::uint64_t best = never;
  auto consider = [&](std::uint64_t t) { best = std::min(best, std::max(t, soonest)); };
  if (const std::size_t idx = next_occupied(0, static_cast<std::size_t>(soonest & mask_)); idx <= mask_) {
    const std::uint64_t distance = (idx - elapsed_) & mask_;
    consider(elapsed_ + (distance == 0 ? mask_ + 1 : distance));
  }
  for (std::size_t level = 1; level < opts_.levels; ++level) {
    if (const auto& list = slots_[cascading(level)]; list.count != 0 && cascades_[level].number != 0) {
      // The first tick by which progress_cascade_locked() owes another batch.
      const cascade& c = cascades_[level];
      const std::size_t batch = std::min<std::size_t>(list.count, cascade_batch);
      const double left = static_cast<double>(list.count - batch) / static_cast<double>(c.total);
      const double ahead = left * static_cast<double>(c.finish - c.start);
      consider(ahead >= static_cast<double>(c.finish) ? 0 : c.finish - static_cast<std::uint64_t>(ahead));
    }
    const std::uint64_t current = elapsed_ >> shift(level);
    const std::size_t idx = next_occupied(level, static_cast<std::size_t>((current + 2) & mask_));
    const std::uint64_t distance = (idx - current) & mask_;
    if (idx > mask_ || distance < 2) continue;          // found only the current or the moving slot
    consider((current + distance - 1) << shift(level)); // moves down once the slot before it is current
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
// are linked. Returns the earliest deadline linked (never if none).
std::uint64_t wheel_core::place_locked(wheel_entry* e, chain& fired, std::size_t from_level) noexcept {
  std::uint64_t earliest = never;
  std::size_t due = 0;
  while (e) {
    wheel_entry* next = next_in_slot(e);
    if (e->when_ <= elapsed_) {
      fire_locked(e, fired);
      ++due;
    } else {
      link_locked(e, from_level);
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

// Level L's next slot n (deadlines in [n, n + 1) * 2^shift(L)) is occupied and the
// slot before it just became current: it starts moving down, to be linked one level
// down bit by bit until one lower slot before its first deadline, when that lower slot
// must be complete to start moving down itself. The entries stay where they are.
void wheel_core::start_cascade_locked(std::size_t level, chain& fired) noexcept {
  const std::uint64_t number = (elapsed_ >> shift(level)) + 1;
  cascade& c = cascades_[level];
  if (c.number == number) return; // already moving
  // The one before is finished on schedule; after a clock jump it may not be.
  const std::size_t before = level * (mask_ + 1) + static_cast<std::size_t>((number - 1) & mask_);
  if (slots_[before].count != 0) {
    wheel_entry* left = std::exchange(slots_[before], slot_list{}).head;
    set_occupied(before, false);
    place_locked(left, fired, level);
  }
  const std::uint64_t first = number << shift(level);
  const std::uint64_t lower_span = std::uint64_t(1) << shift(level - 1);
  c = cascade{number, elapsed_, std::max(elapsed_, first - lower_span - 1), slots_[cascading(level)].count};
}

// Links as many of the level's moving entries one level down as its schedule owes by
// now: all of them at its finish tick, a proportional share before.
void wheel_core::progress_cascade_locked(std::size_t level, chain& fired) noexcept {
  slot_list& moving = slots_[cascading(level)];
  const cascade& c = cascades_[level];
  if (moving.count == 0 || c.number != (elapsed_ >> shift(level)) + 1) return;
  std::size_t keep = 0;
  if (elapsed_ < c.finish) {
    const double share = static_cast<double>(c.finish - elapsed_) / static_cast<double>(c.finish - c.start);
    keep = static_cast<std::size_t>(std::ceil(share * static_cast<double>(c.total)));
  }
  std::size_t due = 0;
  while (moving.count > keep) {
    wheel_entry* e = moving.head;
    if (wheel_entry* next = next_in_slot(e)) __builtin_prefetch(next);
    unlink_locked(e);
    if (e->when_ <= elapsed_) { // only when the clock jumped past the schedule
      fire_locked(e, fired);
      ++due;
    } else {
      link_locked(e, level);
    }
  }
  count_removed_locked(due);
}

// Moves the wheel to `tick`, which no event lies before: levels top-down finish or
// continue what they are moving down and start on their next slot, then level 0's slot
// for this tick goes to the executor.
void wheel_core::step_locked(std::uint64_t tick, chain& fired) noexcept {
  elapsed_ = tick;
  for (std::size_t level = opts_.levels - 1; level >= 1; --level) {
    if (slots_[cascading(level)].count != 0) start_cascade_locked(level, fired);
    progress_cascade_locked(level, fired);
  }
  const std::size_t index = static_cast<std::size_t>(tick & mask_);
  slot_list& list = slots_[index];
  if (list.count == 0) return;
  slot_list taken = std::exchange(list, slot_list{});
  set_occupied(index, false);
  if (!marks_.empty()) marks_[index].clear();
  if (opts_.levels == 1) { // one level: deadlines past the ring wait in it and go round again
    place_locked(taken.head, fired, no_level);
    return;
  }
  // Every entry of a level-0 slot is due at this very tick, and the slot's list is
  // linked through the ready queue's own field: hand the whole list over without
  // touching a single entry (they stay `pending`; from now on `when_ <= elapsed_`
  // tells cancel() that they left the wheel).
  fired.append(taken.head, taken.tail, taken.count);
  count_removed_locked(taken.count);
}

void wheel_core::advance_locked(std::uint64_t now_tick, chain& fired) noexcept {
  while (elapsed_ < now_tick) step_locked(std::min(now_tick, next_event_locked()), fired);
  enrolled_.anchor->elapsed.store(elapsed_, std::memory_order_release);
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
  // The stack holds the newest first: reverse it, so that ties keep scheduling order.
  wheel_entry* oldest = nullptr;
  for (e = inbox_.exchange(nullptr, std::memory_order_seq_cst); e;) {
    wheel_entry* next = next_in_slot(e);
    e->next_.store(oldest, std::memory_order_relaxed);
    oldest = e;
    e = next;
  }
  return place_locked(oldest, fired, no_level);
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
        boost::asio::post(ex_, fire_on_executor(e));
      } catch (...) {
        report_here(std::current_exception(), "wheel_timer"); // the timeout was cancelled
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
  e->wheel_id_ = enrolled_.id;
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
  // Bounded: count first (the bound is checked without the mutex). Unbounded: a
  // timeout linked here is counted under the mutex, with no atomic read-modify-write.
  const bool bounded = opts_.max_pending != 0;
  if (bounded) {
    const std::size_t before = inserted_.fetch_add(1, std::memory_order_relaxed);
    if (before + linked_.load(std::memory_order_relaxed) - removed_.load(std::memory_order_relaxed) >=
        opts_.max_pending) {
      inserted_.fetch_sub(1, std::memory_order_relaxed);
      throw rejected_execution("metronome: wheel_timer has max_pending timeouts pending");
    }
  }
  // Uncontended: link it here, while the node is hot in this core's cache. Contended
  // (the timer thread is moving a tick's timeouts): never wait, leave it in the inbox.
  if (mtx_.try_lock()) {
    std::unique_lock lk(mtx_, std::adopt_lock);
    if (!stopped_ && e->when_ > elapsed_) {
      if (!bounded) linked_.store(linked_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      chain fired;
      // Earlier timeouts still in the inbox go first: ties keep scheduling order.
      if (inbox_.load(std::memory_order_relaxed) != nullptr) drain_inbox_locked(fired);
      link_locked(e, no_level);
      const bool earlier = e->when_ < sleeping_until_.load(std::memory_order_relaxed);
      lk.unlock();
      dispatch(fired);
      if (earlier) cv_.notify_one(); // we held the mutex: the timer thread is waiting or will see the slot
      return;
    }
  }
  if (!bounded) inserted_.fetch_add(1, std::memory_order_relaxed);
  if (!push_inbox(e)) {
    inserted_.fetch_sub(1, std::memory_order_relaxed);
    throw rejected_execution("metronome: wheel_timer is stopped");
  }
  // Dekker pair with run(): it stores sleeping_until_ and then drains the inbox.
  if (e->when_ < sleeping_until_.load(std::memory_order_seq_cst)) wake();
}

bool wheel_core::cancel(wheel_entry* e) noexcept {
  {
    wheel_anchor& a = anchor_registry::get().at(e->wheel_id_);
    std::lock_guard lk(a.mtx);
    if (a.generation.load(std::memory_order_relaxed) != generation_of(e->wheel_id_)) return false; // gone
    chain fired;
    const bool won = a.core->cancel_locked(e, fired);
    // Under the mutex: once it is let go, the wheel (and what dispatch() reads) may go.
    a.core->dispatch(fired);
    if (!won) return false;
  }
  e->drop();    // frees the callable at once; wakes nobody
  e->release(); // the wheel's reference
  return true;
}

bool wheel_core::cancel_locked(wheel_entry* e, chain& fired) noexcept {
  if (e->state() == wheel_entry::pending && e->slot_index_ == wheel_entry::no_slot)
    drain_inbox_locked(fired); // it is still in the inbox: link it first
  // Linked entries are never due yet; a pending entry with a passed deadline was
  // handed to the executor with its slot (see advance_locked).
  if (e->state() != wheel_entry::pending || e->slot_index_ == wheel_entry::no_slot || e->when_ <= elapsed_)
    return false;
  unlink_locked(e);
  e->state_.store(wheel_entry::cancelled, std::memory_order_release);
  count_removed_locked(1);
  return true;
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
    report_here(std::move(x), "timeout");
}

bool wheel_core::deadline_passed(const wheel_entry* e) noexcept {
  const wheel_anchor& a = anchor_registry::get().at(e->wheel_id_);
  const std::uint64_t generation = generation_of(e->wheel_id_);
  if (a.generation.load(std::memory_order_acquire) == generation) {
    const std::uint64_t elapsed = a.elapsed.load(std::memory_order_acquire);
    // A later wheel's reading (the anchor reused meanwhile) comes with a new generation.
    if (a.generation.load(std::memory_order_acquire) == generation) return e->when_ <= elapsed;
  }
  // Gone, having cancelled what it still held first: pending now means handed over.
  return e->state() != wheel_entry::cancelled;
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
    for (auto& m : marks_) m.clear();
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
  const std::size_t inserted = inserted_.load(std::memory_order_acquire) + linked_.load(std::memory_order_acquire);
  return inserted > removed ? inserted - removed : 0;
}

std::size_t wheel_core::moving(std::size_t level) const {
  std::lock_guard lk(mtx_);
  if (level == 0 || level >= opts_.levels) return 0;
  return cascades_[level].number == (elapsed_ >> shift(level)) + 1 ? slots_[cascading(level)].count : 0;
}

std::size_t wheel_core::touched_ahead() const {
  std::lock_guard lk(mtx_);
  return touched_entries_;
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
  std::unique_lock lk(mtx_);
  if (!stopped_) touch_next_tick(lk); // as the timer thread does while it waits
}

// Brings the next tick's timeouts into this thread's cache while it waits for that tick,
// so that the workers find them one core away (~45 ns on this kind of VM) rather than
// in memory (~150 ns, paid one entry after another: each entry's link is in the one
// before). The slot's list is walked from all its entry points side by side, so the
// cache misses overlap. The mutex is let go between groups of entry points: a cancel()
// waits for one group at most. Returns whether it touched anything.
bool wheel_core::touch_next_tick(std::unique_lock<std::mutex>& lk) noexcept {
  const std::uint64_t tick = elapsed_ + 1;
  if (marks_.empty() || touched_ >= tick) return false;
  const std::size_t index = static_cast<std::size_t>(tick & mask_);
  if (slots_[index].count < touch_at_least) return false;
  touched_ = tick;
  touched_entries_ = 0;
  constexpr std::size_t group = 32;
  wheel_entry* cursor[group + 1];
  for (std::size_t first = 0; !stopped_ && elapsed_ < tick && first < marks_[index].size(); first += group) {
    const auto& marks = marks_[index];
    std::size_t n = std::min(group, marks.size() - first);
    std::copy_n(marks.begin() + static_cast<std::ptrdiff_t>(first), n, cursor);
    if (wheel_entry* head = slots_[index].head; first == 0 && head && head->mark_ == wheel_entry::no_mark)
      cursor[n++] = head; // the first entry point was unlinked: nobody walks from before it
    for (bool walking = true; walking;) {
      walking = false;
      for (std::size_t i = 0; i < n; ++i) {
        if (wheel_entry* e = cursor[i]) { // each step reads the next entry: n misses in flight
          ++touched_entries_;
          wheel_entry* next = next_in_slot(e);
          cursor[i] = next && next->mark_ == wheel_entry::no_mark ? next : nullptr;
          walking = true;
        }
      }
    }
    lk.unlock();
    lk.lock();
    if (tick_of(now()) >= tick) break; // due: hand it over rather than touch the rest
  }
  return true;
}

// The timer thread: moves timeouts, never runs user code. While timeouts keep
// arriving it wakes every tick to take them from the inbox; otherwise it sleeps until
// the next event (a slot due, a slot starting or continuing to move down), and a
// producer wakes it only for an earlier deadline.
void wheel_core::run() {
  init_library_thread("metronome-wheel");
  chain fired;
  std::unique_lock lk(mtx_);
  while (!stopped_) {
    sleeping_until_.store(0, std::memory_order_relaxed);
    const bool arrived = drain_inbox_locked(fired) != never;
    advance_locked(tick_of(now()), fired);
    if (fired.head) {
      lk.unlock();
      dispatch(fired);
      lk.lock();
      continue;
    }
    if (touch_next_tick(lk)) continue; // the lock was let go: look again
    std::uint64_t until = next_event_locked();
    if (arrived && elapsed_ + 1 < until) until = elapsed_ + 1;
    sleeping_until_.store(until, std::memory_order_seq_cst);
    // Whatever a producer pushed before it could see `until` is in the inbox now.
    const bool linked = drain_inbox_locked(fired) != never;
    if (fired.head || (linked && next_event_locked() < until)) continue;
    if (until == never)
      cv_.wait(lk);
    else
      cv_.wait_until(lk, start_ + opts_.tick * static_cast<clock::rep>(until));
  }
  sleeping_until_.store(0, std::memory_order_relaxed);
}

} // namespace metronome::detail
