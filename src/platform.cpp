// The system-specific calls of src/platform.hpp: Linux, and the portable fallbacks.
#include "platform.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <new>
#include <thread>
#include <type_traits>

#ifdef METRONOME_PLATFORM_LINUX
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <unistd.h>
#include <climits>
#include <cstring>
#include <ctime>
#endif

namespace metronome::detail::platform {

#ifdef METRONOME_PLATFORM_LINUX

void name_this_thread(const char* name) noexcept {
  // Over the OS limit of 15 characters: the start of the prefix and the whole "-<n>"
  // ("my-service-pool-12" -> "my-service-p-12"), so that threads of one pool stay apart.
  char shortened[16] = {};
  const std::size_t n = std::strlen(name);
  const char* dash = std::strrchr(name, '-');
  const std::size_t suffix = dash != nullptr ? n - static_cast<std::size_t>(dash - name) : 0;
  if (n <= 15 || suffix == 0 || suffix >= 15) {
    std::memcpy(shortened, name, n < 15 ? n : 15);
  } else {
    std::memcpy(shortened, name, 15 - suffix);
    std::memcpy(shortened + (15 - suffix), dash, suffix);
  }
  ::pthread_setname_np(::pthread_self(), shortened);
}

void wake_on_time() noexcept { ::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL); }

void run_at_idle_priority() noexcept {
  sched_param none{};
  (void)::sched_setscheduler(0, SCHED_IDLE, &none);
}


namespace {
// `bytes` (a multiple of 4 KiB) aligned to `align` (a power of two): over-map by `align`,
// keep the aligned part. Throws std::bad_alloc.
void* map_aligned(std::size_t bytes, std::size_t align) {
  void* p = ::mmap(nullptr, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t aligned = (base + align - 1) & ~std::uintptr_t(align - 1);
  if (aligned != base) ::munmap(p, aligned - base);
  if (const std::size_t tail = align - (aligned - base)) ::munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  return reinterpret_cast<void*>(aligned);
}
} // namespace

void* allocate_aligned_pages(std::size_t bytes) { return map_aligned(bytes, bytes); }

void free_aligned_pages(void* p, std::size_t bytes) noexcept { ::munmap(p, bytes); }

namespace {
std::atomic<std::size_t> large_mapped{0};
// Whole 4 KiB pages: no more is mapped (so none of it is counted, or resident, for
// nothing); the array's whole huge pages may be huge, the rest stays in small pages.
std::size_t page_rounded(std::size_t bytes) noexcept { return (bytes + 4095) & ~std::size_t(4095); }
bool large_is_mapped(std::size_t bytes) noexcept { return huge_pages_asked() && bytes >= huge_page_bytes; }
} // namespace

void* allocate_huge_pages(std::size_t bytes) {
  if (!huge_pages_asked()) throw std::bad_alloc();
  void* p = map_aligned(bytes, huge_page_bytes);
  (void)::madvise(p, bytes, MADV_HUGEPAGE); // a hint: may fail (no transparent huge pages)
  return p;
}

void* allocate_large(std::size_t bytes) {
  if (!large_is_mapped(bytes)) return ::operator new(bytes);
  const std::size_t mapped = page_rounded(bytes);
  void* p = allocate_huge_pages(mapped);
  large_mapped.fetch_add(mapped, std::memory_order_relaxed);
  return p;
}

void free_large(void* p, std::size_t bytes) noexcept {
  if (large_is_mapped(bytes)) {
    const std::size_t mapped = page_rounded(bytes);
    ::munmap(p, mapped);
    large_mapped.fetch_sub(mapped, std::memory_order_relaxed);
  } else {
    ::operator delete(p);
  }
}

void* resize_large(void* p, std::size_t old_bytes, std::size_t new_bytes) noexcept {
  if (!large_is_mapped(old_bytes) || !large_is_mapped(new_bytes)) return nullptr;
  const std::size_t mapped = page_rounded(old_bytes);
  const std::size_t wanted = page_rounded(new_bytes);
  if (wanted < mapped) {
    // Unmapping a mapping's tail fails only when the kernel cannot split the mapping (a
    // neighbour merged with it, and the process at its limit of mappings): then nothing
    // changed, and the caller copies instead.
    if (::munmap(static_cast<unsigned char*>(p) + wanted, mapped - wanted) != 0) return nullptr;
    large_mapped.fetch_sub(mapped - wanted, std::memory_order_relaxed);
  } else if (wanted > mapped) {
    // To a fresh place reserved as allocate_large reserves one: the old pages move there
    // (whole huge pages as such), the rest of it faults in as used. A failed mremap leaves
    // the old mapping as it was; the reserved place goes back either way. The mapping that
    // replaces the reservation is the old one grown, with the old one's flags; the hint is
    // given again for the grown part, as allocate_huge_pages gives it.
    void* to = nullptr;
    try {
      to = allocate_huge_pages(wanted);
    } catch (const std::bad_alloc&) {
      return nullptr;
    }
    void* moved = ::mremap(p, mapped, wanted, MREMAP_MAYMOVE | MREMAP_FIXED, to);
    if (moved == MAP_FAILED) {
      ::munmap(to, wanted);
      return nullptr;
    }
    (void)::madvise(moved, wanted, MADV_HUGEPAGE); // a hint, as in allocate_huge_pages
    large_mapped.fetch_add(wanted - mapped, std::memory_order_relaxed);
    return moved;
  }
  return p;
}

std::size_t large_mapped_bytes() noexcept { return large_mapped.load(std::memory_order_relaxed); }

void populate_pages(void* p, std::size_t bytes) noexcept {
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;
#endif
  (void)::madvise(p, bytes, MADV_POPULATE_WRITE);
}

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
              std::atomic<std::uint32_t>::is_always_lock_free);

void wait_while_equal(const std::atomic<std::uint32_t>& word, std::uint32_t expected,
                      std::chrono::nanoseconds timeout) noexcept {
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(timeout);
  timespec ts{static_cast<time_t>(s.count()), static_cast<long>((timeout - s).count())};
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast): the kernel only reads the word
  (void)::syscall(SYS_futex, const_cast<std::atomic<std::uint32_t>*>(&word), FUTEX_WAIT_PRIVATE, expected, &ts,
                  nullptr, 0);
}

void wake_all(const std::atomic<std::uint32_t>& word) noexcept {
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast): as above
  (void)::syscall(SYS_futex, const_cast<std::atomic<std::uint32_t>*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
                  nullptr, 0);
}

#else

void wait_while_equal(const std::atomic<std::uint32_t>& word, std::uint32_t expected,
                      std::chrono::nanoseconds timeout) noexcept {
  if (word.load(std::memory_order_acquire) == expected)
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(timeout, std::chrono::microseconds(50)));
}
void wake_all(const std::atomic<std::uint32_t>&) noexcept {}

void name_this_thread(const char*) noexcept {}
void wake_on_time() noexcept {}
void run_at_idle_priority() noexcept {}

void* allocate_aligned_pages(std::size_t bytes) { return ::operator new(bytes, std::align_val_t(bytes)); }

void free_aligned_pages(void* p, std::size_t bytes) noexcept {
  ::operator delete(p, std::align_val_t(bytes)); // unsized: clang 14 has no sized deallocation by default
}

void populate_pages(void*, std::size_t) noexcept {}

void* allocate_huge_pages(std::size_t) { throw std::bad_alloc(); } // huge_pages_asked() is false
void* allocate_large(std::size_t bytes) { return ::operator new(bytes); }
void free_large(void* p, std::size_t) noexcept { ::operator delete(p); }
void* resize_large(void*, std::size_t, std::size_t) noexcept { return nullptr; }
std::size_t large_mapped_bytes() noexcept { return 0; }

#endif

} // namespace metronome::detail::platform
