// The test executables that count or fail allocations replace the global operator new
// and delete with these (include this header in exactly one translation unit of the
// executable). Counters are per thread: a test reads its own thread's allocations only.
#ifndef METRONOME_TEST_COMMON_COUNTING_NEW_HPP
#define METRONOME_TEST_COMMON_COUNTING_NEW_HPP

#include <cstddef>
#include <cstdlib>
#include <new>

namespace metronome::test {
inline thread_local long allocations = 0;    // operator new calls on this thread
inline thread_local long frees = 0;          // operator delete calls of a non-null pointer
inline thread_local long fail_countdown = -1; // -1: never fail; else allocations left before one throws

inline void* counted_allocate(std::size_t n, std::size_t align) {
  ++allocations;
  if (fail_countdown >= 0 && fail_countdown-- == 0) throw std::bad_alloc();
  if (n == 0) n = 1;
  void* p = align > alignof(std::max_align_t) ? std::aligned_alloc(align, (n + align - 1) / align * align)
                                              : std::malloc(n);
  if (!p) throw std::bad_alloc();
  return p;
}
inline void counted_release(void* p) noexcept {
  if (p) ++frees;
  std::free(p);
}
} // namespace metronome::test

// NOLINTBEGIN: the replaceable global allocation functions, defined once per executable.
void* operator new(std::size_t n) { return metronome::test::counted_allocate(n, 0); }
void* operator new[](std::size_t n) { return metronome::test::counted_allocate(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) {
  return metronome::test::counted_allocate(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return metronome::test::counted_allocate(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { metronome::test::counted_release(p); }
void operator delete[](void* p) noexcept { metronome::test::counted_release(p); }
void operator delete(void* p, std::size_t) noexcept { metronome::test::counted_release(p); }
void operator delete[](void* p, std::size_t) noexcept { metronome::test::counted_release(p); }
void operator delete(void* p, std::align_val_t) noexcept { metronome::test::counted_release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { metronome::test::counted_release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { metronome::test::counted_release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { metronome::test::counted_release(p); }
// NOLINTEND

#endif
