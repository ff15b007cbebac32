// latency_histogram: a fixed-size log-scale histogram of durations (the pool's queue-wait and
// lateness statistics).
#ifndef METRONOME_LATENCY_HISTOGRAM_HPP
#define METRONOME_LATENCY_HISTOGRAM_HPP

#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iosfwd>

namespace metronome {

/// A fixed-size histogram of durations in log-scale (power-of-two) buckets.
/**
 * 32 buckets of nanoseconds: bucket 0 holds [0, 256 ns), bucket b (1..30) holds
 * [2^(b+7), 2^(b+8)) ns, bucket 31 everything from 2^38 ns (about 275 s) up. Negative
 * durations count as 0. The memory is fixed (32 counters) whatever is recorded.
 *
 * Percentiles are read by bucket: `percentile(q)` is the upper bound of the bucket
 * that holds the q-quantile, so "p99 < 8.39 ms" means 99 % of the samples were shorter
 * than that bound (and may be as short as half of it).
 *
 * @par Thread Safety
 * A value type: distinct objects may be used concurrently; one object is not
 * synchronised. `scheduled_thread_pool::stats()` returns snapshots.
 */
class latency_histogram {
public:
  /// Number of buckets (log2 of nanoseconds).
  static constexpr std::size_t bucket_count = 32;
  /// The unit of recorded samples.
  using duration = std::chrono::nanoseconds;

  /// The bucket a duration falls into.
  static constexpr std::size_t bucket_of(duration d) noexcept {
    if (d.count() <= 0) return 0;
    const auto w = static_cast<std::size_t>(std::bit_width(static_cast<std::uint64_t>(d.count())));
    if (w <= 8) return 0;
    return w - 8 < bucket_count ? w - 8 : bucket_count - 1;
  }
  /// The smallest duration in bucket `b`.
  static constexpr duration lower_bound(std::size_t b) noexcept {
    return b == 0 ? duration::zero() : duration(std::int64_t{1} << (b + 7));
  }
  /// The exclusive upper bound of bucket `b` (`duration::max()` for the last one).
  static constexpr duration upper_bound(std::size_t b) noexcept {
    return b + 1 >= bucket_count ? duration::max() : duration(std::int64_t{1} << (b + 8));
  }

  /// Counts one sample (or `n`) in the bucket of `d`.
  void record(duration d, std::uint64_t n = 1) noexcept { counts_[bucket_of(d)] += n; }
  /// Adds `n` samples to bucket `b` directly.
  void add_to_bucket(std::size_t b, std::uint64_t n) noexcept { counts_[b] += n; }

  /// Samples in bucket `b`.
  std::uint64_t count(std::size_t b) const noexcept { return counts_[b]; }
  /// All samples.
  std::uint64_t total() const noexcept {
    std::uint64_t n = 0;
    for (auto c : counts_) n += c;
    return n;
  }
  /// Whether no sample was recorded.
  bool empty() const noexcept { return total() == 0; }

  /// The upper bound of the bucket holding the `q`-quantile (0 < q <= 1);
  /// `duration::zero()` when empty.
  duration percentile(double q) const noexcept;
  /// percentile(0.50).
  duration p50() const noexcept { return percentile(0.50); }
  /// percentile(0.99).
  duration p99() const noexcept { return percentile(0.99); }
  /// The upper bound of the highest non-empty bucket; zero when empty.
  duration max_bound() const noexcept;

  /// Adds the counts of `o` to this one.
  latency_histogram& operator+=(const latency_histogram& o) noexcept {
    for (std::size_t b = 0; b < bucket_count; ++b) counts_[b] += o.counts_[b];
    return *this;
  }
  /// Equal when every bucket holds the same count.
  friend bool operator==(const latency_histogram&, const latency_histogram&) = default;

private:
  std::array<std::uint64_t, bucket_count> counts_{};
};

/// One compact line: `n=1200 p50<512ns p99<4.19ms max<8.39ms` (`n=0` when empty).
std::ostream& operator<<(std::ostream& os, const latency_histogram& h);

} // namespace metronome

#endif
