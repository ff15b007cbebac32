// Which sanitizer this test build runs under (GCC defines __SANITIZE_*__, clang answers
// __has_feature), once for every test: METRONOME_TEST_TSAN, METRONOME_TEST_ASAN and
// METRONOME_TEST_SANITIZED are 0 or 1, usable in #if.
#ifndef METRONOME_TEST_COMMON_SANITIZERS_HPP
#define METRONOME_TEST_COMMON_SANITIZERS_HPP

#if defined(__has_feature)
#define METRONOME_TEST_HAS_FEATURE(x) __has_feature(x)
#else
#define METRONOME_TEST_HAS_FEATURE(x) 0
#endif

#if defined(__SANITIZE_THREAD__) || METRONOME_TEST_HAS_FEATURE(thread_sanitizer)
#define METRONOME_TEST_TSAN 1
#else
#define METRONOME_TEST_TSAN 0
#endif
#if defined(__SANITIZE_ADDRESS__) || METRONOME_TEST_HAS_FEATURE(address_sanitizer)
#define METRONOME_TEST_ASAN 1
#else
#define METRONOME_TEST_ASAN 0
#endif
#define METRONOME_TEST_SANITIZED (METRONOME_TEST_TSAN || METRONOME_TEST_ASAN)

namespace metronome::test {
inline constexpr bool under_thread_sanitizer = METRONOME_TEST_TSAN != 0;
inline constexpr bool sanitized = METRONOME_TEST_SANITIZED != 0;
} // namespace metronome::test

#endif
