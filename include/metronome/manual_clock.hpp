// manual_clock: a clock whose time moves only when a test moves it.
#ifndef METRONOME_MANUAL_CLOCK_HPP
#define METRONOME_MANUAL_CLOCK_HPP

#include <metronome/options.hpp>

#include <atomic>
#include <mutex>
#include <vector>

namespace metronome {

namespace detail {
class clock_listener;
}

/// A clock whose time moves only when told to: deterministic tests of timing logic.
/**
 * A `scheduled_thread_pool` built with `pool_options::time_source = &clock` reads
 * time only from it and never from the real clock. `advance()` moves time and,
 * before it returns, moves every task that fell due into its pool's ready queue
 * (in due order), where the pool's workers run it. Time points are
 * `metronome::clock::time_point`, so the same code runs on either clock.
 *
 * @par Thread Safety
 * All members are safe to call concurrently. The clock must outlive the pools and
 * timers built on it.
 */
class manual_clock {
public:
  using duration = clock::duration;
  using time_point = clock::time_point;

  /// Starts at `start` (by default one hour after the clock's epoch).
  explicit manual_clock(time_point start = time_point(std::chrono::hours(1))) noexcept
      : now_(start.time_since_epoch().count()) {}
  manual_clock(const manual_clock&) = delete;
  manual_clock& operator=(const manual_clock&) = delete;

  /// The current time.
  time_point now() const noexcept { return time_point(duration(now_.load(std::memory_order_acquire))); }

  /// Moves time forward by `d` and releases what fell due.
  /** @throws std::invalid_argument if `d` is negative. */
  void advance(duration d);

  /// Moves time forward to `t` and releases what fell due.
  /** @throws std::invalid_argument if `t` is earlier than now(). */
  void advance_to(time_point t);

  /// @cond internal
  void attach(detail::clock_listener* l);
  void detach(detail::clock_listener* l) noexcept;
  /// @endcond

private:
  std::atomic<clock::rep> now_;
  std::mutex mtx_; // serialises advances and the listener list
  std::vector<detail::clock_listener*> listeners_;
};

} // namespace metronome

#endif
