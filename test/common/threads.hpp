#ifndef METRONOME_TEST_THREADS_HPP
#define METRONOME_TEST_THREADS_HPP

#include <cstddef>
#include <filesystem>
#include <thread>

namespace metronome::test {

// Threads of this process (Linux: /proc/self/task). ThreadSanitizer starts a thread of
// its own with the first thread a program makes: one is made first, so that every
// reading counts it.
inline std::size_t process_threads() {
  static const bool sanitizer_thread_started = [] {
    std::thread([] {}).join();
    return true;
  }();
  (void)sanitizer_thread_started;
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

} // namespace metronome::test

#endif
