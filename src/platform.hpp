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
// Huge pages (2 MiB) for the library's large arrays and for the node cache's regions of
// timed nodes: the delay queue's run holds an entry per pending timeout, 24 MiB at a
// million, the nodes ~100 MiB, and on a virtual machine a 4 KiB page fault can cost
// microseconds (13 us measured on the CI machines). Below 2 MiB nothing changes.
inline constexpr std::size_t huge_page_bytes = std::size_t(2) << 20;
// Whether allocate_large maps its large arrays and asks for huge pages (Linux, unless
// the build turned it off: METRONOME_HUGE_PAGES=OFF).
constexpr bool huge_pages_asked() noexcept {
#if defined(METRONOME_PLATFORM_LINUX) && !defined(METRONOME_NO_HUGE_PAGES)
  return true;
#else
  return false;
#endif
}
// `bytes` (a multiple of 4 KiB) of fresh memory aligned to huge_page_bytes, the system
// asked to back its whole huge pages with huge pages (MADV_HUGEPAGE, which transparent
// huge pages honour unless set to "never"); zero-filled, faulting in as used. Given back
// with free_aligned_pages, whole or in pieces of whole 4 KiB pages. Only where
// huge_pages_asked() (elsewhere it throws). Throws std::bad_alloc.
void* allocate_huge_pages(std::size_t bytes);
// Storage for a large array, uninitialised: from huge_page_bytes up, where
// huge_pages_asked(), from allocate_huge_pages; otherwise operator new. Throws
// std::bad_alloc.
void* allocate_large(std::size_t bytes);
// Gives back what allocate_large returned, with the same size.
void free_large(void* p, std::size_t bytes) noexcept;
// Resizes what allocate_large returned for `old_bytes` to `new_bytes` in place or by
// moving its pages, keeping its first min(old_bytes, new_bytes), when both sizes are
// mapped: a shrink gives the tail's pages back to the system, a growth moves the page
// table entries (mremap) and copies nothing. Returns where the array is now, which
// free_large(.., new_bytes) frees from then on; nullptr, nothing changed, otherwise (the
// caller copies to a new array). A copy writes fresh pages, each zeroed by the kernel
// first: a delay queue of a million timeouts doubles its run up to 24 MiB, and halves it
// again and again as they are cancelled (docs/benchmarks.md, "The run resized in place").
void* resize_large(void* p, std::size_t old_bytes, std::size_t new_bytes) noexcept;
// Bytes allocate_large holds mapped now (not from operator new).
std::size_t large_mapped_bytes() noexcept;
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
