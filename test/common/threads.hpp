#ifndef METRONOME_TEST_THREADS_HPP
#define METRONOME_TEST_THREADS_HPP

#include <atomic>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <sys/syscall.h>
#include <unistd.h>

namespace metronome::test {

// Threads of this process (Linux: /proc/self/task). A joined thread can still be listed
// for a moment (the kernel reaps it after join() returns). A listed thread that is exiting
// (PF_EXITING in its stat's flags, set as do_exit() begins, before join() can return) or
// gone by the time its stat is read is not counted (thread_is_live); settled_threads()
// waits for a count that depends on threads still ending. ThreadSanitizer starts a thread
// of its own with the first thread a program makes: one is made (and waited out of the
// list) first, so that every reading counts it.
inline bool thread_is_live(const std::filesystem::path& entry) {
  std::ifstream in(entry / "stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  const auto close = line.rfind(')'); // the name may hold spaces and parentheses
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  for (int i = 0; i < 7; ++i) // state ppid pgrp session tty_nr tpgid flags
    if (!(rest >> field)) return false;
  constexpr unsigned long pf_exiting = 0x4;
  return (std::stoul(field) & pf_exiting) == 0;
}

inline std::size_t count_task_entries() {
  std::size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
    if (thread_is_live(e.path())) ++n;
  return n;
}

inline std::size_t process_threads() {
  static const bool sanitizer_thread_started = [] {
    std::atomic<long> tid{0};
    std::thread([&] { tid = ::syscall(SYS_gettid); }).join();
    const std::filesystem::path entry = "/proc/self/task/" + std::to_string(tid.load());
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::filesystem::exists(entry) && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
    return true;
  }();
  (void)sanitizer_thread_started;
  return count_task_entries();
}

// The thread count once it has come down to `expected` (threads that ended are reaped),
// or what it is after 5 s.
inline std::size_t settled_threads(std::size_t expected) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::size_t n = process_threads();
  while (n != expected && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::yield();
    n = process_threads();
  }
  return n;
}

} // namespace metronome::test

#endif
