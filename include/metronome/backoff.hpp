#ifndef METRONOME_BACKOFF_HPP
#define METRONOME_BACKOFF_HPP

#include <metronome/detail/random.hpp>
#include <metronome/options.hpp>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>

namespace metronome {

/// Parameters of a `backoff`.
struct backoff_options {
  /// Ceiling of the first delay. > 0.
  clock::duration initial = std::chrono::milliseconds(100);
  /// Each attempt multiplies the ceiling by this. >= 1.
  double multiplier = 2.0;
  /// Largest ceiling. >= initial.
  clock::duration cap = std::chrono::seconds(30);
  /// Full jitter (AWS's "exponential backoff and jitter"): each delay is uniform in
  /// [0, ceiling]. Off: the delay is the ceiling itself.
  bool full_jitter = true;
  /// Delays handed out before `next()` says stop, so the retries `async_retry` makes
  /// (N retries: N + 1 attempts); 0 = no limit.
  std::size_t max_retries = 0;
  /// Seed of the generator; 0 = a fresh one per object. Same seed, same delays.
  std::uint64_t seed = 0;
};

/// Delays for a retry loop: exponential, capped, with full jitter by default.
/**
 * @code
 * metronome::backoff b({.initial = 100ms, .cap = 10s, .max_retries = 8});
 * while (auto d = b.next()) {
 *   if (co_await try_once()) break;
 *   co_await metronome::async_delay(ex, *d, asio::use_awaitable);
 * }
 * @endcode
 * The ceiling of attempt n (from 0) is min(cap, initial x multiplier^n); the delay is
 * that ceiling, or uniform in [0, ceiling] with `full_jitter`.
 *
 * @par Thread Safety
 * A plain value: one object per retry loop, used from one thread at a time.
 */
class backoff {
public:
  /// @throws std::invalid_argument if initial <= 0, multiplier < 1 (or NaN) or cap < initial.
  explicit backoff(backoff_options o = {}) : o_(o) {
    if (o_.initial <= clock::duration::zero()) throw std::invalid_argument("metronome: backoff initial must be positive");
    if (!(o_.multiplier >= 1.0)) throw std::invalid_argument("metronome: backoff multiplier must be at least 1");
    if (o_.cap < o_.initial) throw std::invalid_argument("metronome: backoff cap is below initial");
    state_ = o_.seed ? o_.seed : detail::fresh_seed();
    seed_ = state_;
    reset();
  }

  /// The delay before the next attempt, or nothing once `max_retries` delays were handed out.
  std::optional<clock::duration> next() noexcept {
    if (o_.max_retries != 0 && attempts_ >= o_.max_retries) return std::nullopt;
    ++attempts_;
    // The ceiling grows unrounded (1 ns x 1.5 must reach 2 ns, not stay truncated at 1).
    const clock::duration ceiling =
        ceiling_ns_ >= static_cast<double>(o_.cap.count()) ? o_.cap : clock::duration(static_cast<clock::rep>(ceiling_ns_));
    if (ceiling < o_.cap) ceiling_ns_ *= o_.multiplier;
    if (!o_.full_jitter) return ceiling;
    // uniform in [0, ceiling]: floor(u x (ceiling + 1)), u in [0, 1)
    const double u = detail::uniform01(state_);
    const auto d = clock::duration(static_cast<clock::rep>(u * (static_cast<double>(ceiling.count()) + 1.0)));
    return d < ceiling ? d : ceiling; // rounding near u = 1
  }

  /// Starts over (after a success): the next delay is the first again. The generator
  /// starts over too when it was seeded explicitly.
  void reset() noexcept {
    attempts_ = 0;
    ceiling_ns_ = static_cast<double>(o_.initial.count());
    if (o_.seed) state_ = seed_;
  }

  /// Delays handed out since construction or reset().
  std::size_t attempts() const noexcept { return attempts_; }
  /// The options it was made with.
  const backoff_options& options() const noexcept { return o_; }

private:
  backoff_options o_;
  std::uint64_t state_ = 0;
  std::uint64_t seed_ = 0;
  std::size_t attempts_ = 0;
  double ceiling_ns_ = 0; // initial x multiplier^attempts, in nanoseconds, unrounded
};

} // namespace metronome

#endif
