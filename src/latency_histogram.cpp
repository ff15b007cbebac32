// latency_histogram's percentiles and the one-line printing of histograms and pool stats.
#include <metronome/latency_histogram.hpp>
#include <metronome/options.hpp>

#include <cstdio>
#include <ostream>

namespace metronome {

namespace {

// "256ns", "4.19ms", "275s", "inf": three significant digits at most.
void print_bound(std::ostream& os, latency_histogram::duration d) {
  if (d == latency_histogram::duration::max()) {
    os << "inf";
    return;
  }
  const auto ns = static_cast<double>(d.count());
  char buf[32];
  if (ns < 1e3)
    std::snprintf(buf, sizeof buf, "%.0fns", ns);
  else if (ns < 1e6)
    std::snprintf(buf, sizeof buf, "%.3gus", ns / 1e3);
  else if (ns < 1e9)
    std::snprintf(buf, sizeof buf, "%.3gms", ns / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.3gs", ns / 1e9);
  os << buf;
}

} // namespace

latency_histogram::duration latency_histogram::percentile(double q) const noexcept {
  const std::uint64_t n = total();
  if (n == 0) return duration::zero();
  if (!(q > 0.0)) q = 0.0;
  if (q > 1.0) q = 1.0;
  // The rank of the q-quantile, 1-based: at least the first sample.
  auto rank = static_cast<std::uint64_t>(q * static_cast<double>(n) + 0.999999);
  if (rank == 0) rank = 1;
  if (rank > n) rank = n;
  std::uint64_t seen = 0;
  for (std::size_t b = 0; b < bucket_count; ++b) {
    seen += counts_[b];
    if (seen >= rank) return upper_bound(b);
  }
  return upper_bound(bucket_count - 1);
}

latency_histogram::duration latency_histogram::max_bound() const noexcept {
  for (std::size_t b = bucket_count; b-- > 0;)
    if (counts_[b] != 0) return upper_bound(b);
  return duration::zero();
}

std::ostream& operator<<(std::ostream& os, const latency_histogram& h) {
  os << "n=" << h.total();
  if (h.empty()) return os;
  os << " p50<";
  print_bound(os, h.p50());
  os << " p99<";
  print_bound(os, h.p99());
  os << " max<";
  print_bound(os, h.max_bound());
  return os;
}

std::ostream& operator<<(std::ostream& os, const pool_stats& s) {
  os << "threads=" << s.threads << " active=" << s.active << " ready=" << s.ready_queued
     << " delayed=" << s.delayed_queued << " completed=" << s.completed << " rejected=" << s.rejected
     << " largest=" << s.largest_pool_size << " | queue_wait " << s.queue_wait << " | lateness " << s.lateness;
  return os;
}

} // namespace metronome
