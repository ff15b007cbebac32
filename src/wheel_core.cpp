#include <metronome/detail/wheel_core.hpp>
#include <metronome/errors.hpp>
#include <metronome/manual_clock.hpp>

#include <boost/asio/post.hpp>

#include <bit>
#include <stdexcept>

namespace metronome::detail {

void wheel_entry::complete_thunk(task_base* t, bool run) {
  auto* e = static_cast<wheel_entry*>(t);
  std::uint32_t expected = firing;
  if (run && e->state_.compare_exchange_strong(expected, running, std::memory_order_acq_rel)) {
    e->fire();
    e->state_.store(done, std::memory_order_release);
    e->drop();
  } else if (!run && e->state_.compare_exchange_strong(expected, cancelled, std::memory_order_acq_rel)) {
    e->drop(); // the executor discarded it
  }
  e->release();
}

bool wheel_entry::cancel() noexcept {
  if (state() == pending && wheel_ && wheel_->cancel(this)) return true;
  std::uint32_t expected = firing; // queued on the executor, not started
  if (state_.compare_exchange_strong(expected, cancelled, std::memory_order_acq_rel)) {
    drop();
    return true;
  }
  return false;
}

wheel_core::wheel_core(wheel_options opts, boost::asio::any_io_executor ex, pool_core* pool)
    : opts_(opts), ex_(std::move(ex)), pool_(pool), manual_(opts.time_source) {
  const auto slots = opts_.slots_per_level;
  if (opts_.tick <= clock::duration::zero()) throw std::invalid_argument("metronome: wheel tick must be positive");
  if (slots < 2 || slots > 64 || (slots & (slots - 1)) != 0)
    throw std::invalid_argument("metronome: slots_per_level must be a power of two from 2 to 64");
  bits_ = static_cast<unsigned>(std::countr_zero(slots));
  if (opts_.levels < 1 || bits_ * opts_.levels > 60)
    throw std::invalid_argument("metronome: levels must be >= 1 with log2(slots_per_level) * levels <= 60");
  mask_ = slots - 1;
  slots_.assign(opts_.levels * slots, nullptr);
  occupied_.assign(opts_.levels, 0);
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
  const auto ticks = since / opts_.tick + ((since % opts_.tick) != clock::duration::zero() ? 1 : 0);
  return static_cast<std::uint64_t>(ticks < 0 ? 0 : ticks);
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
  wheel_entry*& head = slots_[level * (mask_ + 1) + slot];
  e->level_ = static_cast<std::int16_t>(level);
  e->slot_ = static_cast<std::int16_t>(slot);
  e->prev_ = nullptr;
  e->next_in_slot_ = head;
  if (head) head->prev_ = e;
  head = e;
  occupied_[level] |= std::uint64_t(1) << slot;
}

void wheel_core::unlink_locked(wheel_entry* e) noexcept {
  wheel_entry*& head = slots_[static_cast<std::size_t>(e->level_) * (mask_ + 1) + static_cast<std::size_t>(e->slot_)];
  if (e->prev_)
    e->prev_->next_in_slot_ = e->next_in_slot_;
  else
    head = e->next_in_slot_;
  if (e->next_in_slot_) e->next_in_slot_->prev_ = e->prev_;
  if (!head) occupied_[static_cast<std::size_t>(e->level_)] &= ~(std::uint64_t(1) << e->slot_);
  e->prev_ = e->next_in_slot_ = nullptr;
  e->level_ = e->slot_ = -1;
}

// The earliest occupied slot over all levels, by the tick its range starts at.
std::optional<wheel_core::expiration> wheel_core::next_expiration_locked() const noexcept {
  std::optional<expiration> best;
  const std::size_t slots = mask_ + 1;
  for (std::size_t level = 0; level < opts_.levels; ++level) {
    const std::uint64_t occ = occupied_[level];
    if (!occ) continue;
    const unsigned shift = static_cast<unsigned>(level * bits_);
    const std::uint64_t slot_range = std::uint64_t(1) << shift;
    const std::uint64_t level_range = slot_range << bits_;
    const std::size_t now_slot = static_cast<std::size_t>((elapsed_ >> shift) & mask_);
    // Rotate so that the current slot is bit 0.
    std::uint64_t rotated = now_slot == 0 ? occ : ((occ >> now_slot) | (occ << (slots - now_slot)));
    if (slots < 64) rotated &= (std::uint64_t(1) << slots) - 1;
    const std::size_t slot = (now_slot + static_cast<std::size_t>(std::countr_zero(rotated))) & mask_;
    const std::uint64_t level_start = elapsed_ & ~(level_range - 1);
    std::uint64_t deadline = level_start + slot * slot_range;
    if (slot < now_slot) deadline += level_range;
    if (!best || deadline < best->deadline) best = expiration{level, slot, deadline};
  }
  return best;
}

void wheel_core::advance_locked(std::uint64_t now_tick, std::vector<wheel_entry*>& out) {
  for (;;) {
    auto exp = next_expiration_locked();
    if (!exp || exp->deadline > now_tick) break;
    if (exp->deadline > elapsed_) elapsed_ = exp->deadline;
    wheel_entry*& head = slots_[exp->level * (mask_ + 1) + exp->slot];
    wheel_entry* e = head;
    head = nullptr;
    occupied_[exp->level] &= ~(std::uint64_t(1) << exp->slot);
    while (e) {
      wheel_entry* next = e->next_in_slot_;
      e->prev_ = e->next_in_slot_ = nullptr;
      if (e->when_ <= elapsed_) { // due: to the executor
        e->level_ = e->slot_ = -1;
        e->state_.store(wheel_entry::firing, std::memory_order_release);
        --pending_;
        out.push_back(e);
      } else {
        link_locked(e); // cascades to a lower level
      }
      e = next;
    }
  }
  if (now_tick > elapsed_) elapsed_ = now_tick;
}

void wheel_core::dispatch(std::vector<wheel_entry*>& fired) noexcept {
  if (pool_ && !fired.empty()) {
    // Entries are task nodes: one chain, one push, no allocation.
    for (std::size_t i = 0; i + 1 < fired.size(); ++i) fired[i]->next_.store(fired[i + 1], std::memory_order_relaxed);
    pool_->push_ready_chain(fired.front(), fired.back(), fired.size());
    fired.clear();
    return;
  }
  for (wheel_entry* e : fired) {
    try {
      boost::asio::post(ex_, [e] { e->complete(true); });
    } catch (...) {
      e->complete(false);
    }
  }
  fired.clear();
}

void wheel_core::insert(wheel_entry* e, clock::duration delay) {
  std::vector<wheel_entry*> fired;
  {
    std::lock_guard lk(mtx_);
    if (stopped_) throw rejected_execution("metronome: wheel_timer is stopped");
    if (opts_.max_pending != 0 && pending_ >= opts_.max_pending)
      throw rejected_execution("metronome: wheel_timer has max_pending timeouts pending");
    e->wheel_ = this;
    const clock::time_point current = now();
    e->when_ = deadline_tick(current, delay);
    ++pending_;
    if (e->when_ <= elapsed_) {
      // Due at the current tick already (delay <= 0): fire on the executor at once.
      --pending_;
      e->state_.store(wheel_entry::firing, std::memory_order_release);
      fired.push_back(e);
    } else {
      link_locked(e);
      if (!manual_ && e->when_ < sleeping_until_) cv_.notify_one(); // an earlier deadline
    }
  }
  dispatch(fired);
}

bool wheel_core::cancel(wheel_entry* e) noexcept {
  {
    std::lock_guard lk(mtx_);
    if (e->state() != wheel_entry::pending || e->level_ < 0) return false;
    unlink_locked(e);
    e->state_.store(wheel_entry::cancelled, std::memory_order_release);
    --pending_;
  }
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
    for (auto& head : slots_) {
      for (wheel_entry* e = head; e;) {
        wheel_entry* next = e->next_in_slot_;
        e->prev_ = e->next_in_slot_ = nullptr;
        e->level_ = e->slot_ = -1;
        e->state_.store(wheel_entry::cancelled, std::memory_order_release);
        left.push_back(e);
        e = next;
      }
      head = nullptr;
    }
    for (auto& o : occupied_) o = 0;
    pending_ = 0;
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

std::size_t wheel_core::pending() const {
  std::lock_guard lk(mtx_);
  return pending_;
}

bool wheel_core::stopped() const {
  std::lock_guard lk(mtx_);
  return stopped_;
}

void wheel_core::on_time_advanced() {
  std::vector<wheel_entry*> fired;
  {
    std::lock_guard lk(mtx_);
    if (stopped_) return;
    advance_locked(tick_of(now()), fired);
  }
  dispatch(fired);
}

// The timer thread: moves timeouts, never runs user code.
void wheel_core::run() {
  std::vector<wheel_entry*> fired;
  std::unique_lock lk(mtx_);
  while (!stopped_) {
    advance_locked(tick_of(clock::now()), fired);
    if (!fired.empty()) {
      lk.unlock();
      dispatch(fired);
      lk.lock();
      continue;
    }
    auto exp = next_expiration_locked();
    if (!exp) {
      sleeping_until_ = ~std::uint64_t(0);
      cv_.wait(lk);
    } else {
      sleeping_until_ = exp->deadline;
      cv_.wait_until(lk, start_ + opts_.tick * static_cast<clock::rep>(exp->deadline));
    }
    sleeping_until_ = ~std::uint64_t(0);
  }
}

} // namespace metronome::detail
