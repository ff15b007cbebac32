#ifndef METRONOME_DETAIL_WHEEL_CORE_HPP
#define METRONOME_DETAIL_WHEEL_CORE_HPP

#include <metronome/detail/pool_core.hpp>
#include <metronome/detail/task.hpp>
#include <metronome/options.hpp>

#include <boost/asio/any_io_executor.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace metronome {

/// Options of a `wheel_timer`.
struct wheel_options {
  /// Resolution: a timeout fires on the first tick at or after its deadline. > 0.
  clock::duration tick = std::chrono::milliseconds(1);
  /// Slots per level: a power of two from 2 to 64.
  std::size_t slots_per_level = 64;
  /// Levels; slots_per_level^levels ticks are covered exactly, later deadlines wait at
  /// the top level and move down as time passes. log2(slots) * levels <= 60.
  std::size_t levels = 6;
  /// Most timeouts pending at once; 0 = unbounded. Beyond it schedule() throws
  /// rejected_execution (Netty's maxPendingTimeouts).
  std::size_t max_pending = 0;
  /// Time source: nullptr = the real clock (a timer thread); else a manual clock that
  /// moves the wheel synchronously in advance(). Must outlive the wheel.
  manual_clock* time_source = nullptr;
};

} // namespace metronome

namespace metronome::detail {

class wheel_core;

// One timeout: a node in a wheel slot (intrusive, doubly linked), then a task on the
// target executor. Reference counted: the wheel (or the executor's queue) holds one,
// each handle one.
class wheel_entry : public task_base {
public:
  static constexpr std::uint32_t pending = 0, firing = 1, running = 2, done = 3, cancelled = 4;

  wheel_entry() noexcept : task_base(&complete_thunk) {}

  void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) destroy();
  }
  std::uint32_t state() const noexcept { return state_.load(std::memory_order_acquire); }
  bool cancel() noexcept;

  // Runs the timeout's work (callable, or completes the handler).
  virtual void fire() noexcept = 0;
  // Never fires: destroys the callable (or completes the handler with operation_aborted).
  virtual void drop() noexcept = 0;
  // Frees the node.
  virtual void destroy() noexcept = 0;

  wheel_entry* prev_ = nullptr;
  wheel_entry* next_in_slot_ = nullptr;
  std::uint64_t when_ = 0; // deadline in ticks
  std::int16_t level_ = -1;
  std::int16_t slot_ = -1;
  wheel_core* wheel_ = nullptr;
  std::atomic<std::uint32_t> state_{pending};

protected:
  ~wheel_entry() = default;

private:
  static void complete_thunk(task_base* t, bool run);
  std::atomic<std::uint32_t> refs_{1};
};

class wheel_core final : public clock_listener {
public:
  wheel_core(wheel_options opts, boost::asio::any_io_executor ex, pool_core* pool);
  ~wheel_core();

  // Takes the wheel's reference on e. Throws rejected_execution (stopped, full).
  void insert(wheel_entry* e, clock::duration delay);
  bool cancel(wheel_entry* e) noexcept;
  // Stops the wheel; returns the entries that never fired (cancelled; the caller
  // takes the wheel's references).
  std::vector<wheel_entry*> stop();
  std::size_t pending() const;
  bool stopped() const;
  const boost::asio::any_io_executor& executor() const noexcept { return ex_; }
  clock::time_point now() const noexcept;

  void on_time_advanced() override;

private:
  struct expiration {
    std::size_t level;
    std::size_t slot;
    std::uint64_t deadline;
  };

  std::uint64_t tick_of(clock::time_point t) const noexcept;
  std::uint64_t deadline_tick(clock::time_point now, clock::duration delay) const noexcept;
  void link_locked(wheel_entry* e) noexcept;
  void unlink_locked(wheel_entry* e) noexcept;
  std::optional<expiration> next_expiration_locked() const noexcept;
  void advance_locked(std::uint64_t now_tick, std::vector<wheel_entry*>& out);
  void dispatch(std::vector<wheel_entry*>& fired) noexcept;
  void run();

  wheel_options opts_;
  boost::asio::any_io_executor ex_;
  pool_core* pool_;
  manual_clock* manual_;
  unsigned bits_;
  std::uint64_t mask_;
  clock::time_point start_;

  mutable std::mutex mtx_;
  std::condition_variable cv_;
  std::vector<wheel_entry*> slots_;     // levels * slots heads
  std::vector<std::uint64_t> occupied_; // one bit per slot, per level
  std::uint64_t elapsed_ = 0;
  std::uint64_t sleeping_until_ = ~std::uint64_t(0);
  std::size_t pending_ = 0;
  bool stopped_ = false;
  std::thread thread_;
};

} // namespace metronome::detail

#endif
