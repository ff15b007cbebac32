#ifndef METRONOME_DETAIL_RANDOM_HPP
#define METRONOME_DETAIL_RANDOM_HPP

#include <atomic>
#include <cstdint>

namespace metronome::detail {

// SplitMix64: a tiny, seedable generator (one 64-bit word of state) for jitter. Not for
// anything security-related.
inline std::uint64_t splitmix64(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [0, 1).
inline double uniform01(std::uint64_t& state) noexcept {
  return static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
}

// A distinct seed per call (process-wide counter, mixed).
inline std::uint64_t fresh_seed() noexcept {
  static std::atomic<std::uint64_t> counter{0x853c49e6748fea9bULL};
  std::uint64_t s = counter.fetch_add(0x9e3779b97f4a7c15ULL, std::memory_order_relaxed);
  return splitmix64(s) | 1;
}

} // namespace metronome::detail

#endif
