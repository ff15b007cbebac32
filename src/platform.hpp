// The library's only system-specific calls (Linux), each with a portable fallback. The
// fallbacks are used off Linux, or everywhere when METRONOME_PORTABLE_FALLBACK is
// defined (CMake option of the same name), so that CI builds them once.
#ifndef METRONOME_SRC_PLATFORM_HPP
#define METRONOME_SRC_PLATFORM_HPP

#include <metronome/options.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#if defined(__linux__) && !defined(METRONOME_PORTABLE_FALLBACK)
#define METRONOME_PLATFORM_LINUX 1
#endif

namespace metronome::detail::platform {

// Names the calling thread (as far as the system allows: 15 characters on Linux).
void name_this_thread(const char* name) noexcept;
// Timed waits of the calling thread are deadlines: woken on time, without the system's
// default slack. Fallback: nothing.
void wake_on_time() noexcept;
// Runs the calling thread only on cores nobody else wants. Fallback: nothing.
void run_at_idle_priority() noexcept;

// `bytes` of fresh memory aligned to `bytes` (a power of two). Throws std::bad_alloc.
// Linux: mapped from the system (pages fault in on first use); fallback: operator new.
void* allocate_aligned_pages(std::size_t bytes);
// Gives back what allocate_aligned_pages returned, with the same size.
void free_aligned_pages(void* p, std::size_t bytes) noexcept;
// Faults in the pages of [p, p + bytes) in one system call where there is one
// (Linux 5.14+); otherwise they fault in one by one on first use.
void populate_pages(void* p, std::size_t bytes) noexcept;

// Blocks the calling thread while `word` holds `expected`, until wake_all(word) or
// `timeout` (a bound: a caller may have missed its wake-up; spurious returns too). Linux:
// a private futex; fallback: a sleep of at most 50 us (the caller looks again).
void wait_while_equal(const std::atomic<std::uint32_t>& word, std::uint32_t expected,
                      std::chrono::nanoseconds timeout) noexcept;
// Wakes every thread blocked in wait_while_equal(word, ...). Fallback: nothing.
void wake_all(const std::atomic<std::uint32_t>& word) noexcept;

} // namespace metronome::detail::platform

#endif
