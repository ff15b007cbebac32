#ifndef METRONOME_DETAIL_RANDOM_HPP
#define METRONOME_DETAIL_RANDOM_HPP

#include <atomic>
#include <chrono>
#include <cstdint>

#include <unistd.h>

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

// A distinct seed per call, and per process: a process-wide counter mixed with the
// time, the process id (forked children differ) and an address (ASLR). Unseeded
// backoffs and jitter in different processes must not retry in lockstep.
inline std::uint64_t fresh_seed() noexcept {
  static std::atomic<std::uint64_t> counter{0x853c49e6748fea9bULL};
  std::uint64_t s = counter.fetch_add(0x9e3779b97f4a7c15ULL, std::memory_order_relaxed);
  std::uint64_t entropy =
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
      (static_cast<std::uint64_t>(::getpid()) << 32) ^ static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(&counter));
  s ^= splitmix64(entropy);
  return splitmix64(s) | 1;
}

} // namespace metronome::detail

#endif
