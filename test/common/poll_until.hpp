#ifndef METRONOME_TEST_POLL_UNTIL_HPP
#define METRONOME_TEST_POLL_UNTIL_HPP

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace metronome::test {

// Waits until `pred()` holds, for at most `limit` of real time (generous: the
// machine may be busy). Returns the last value of `pred()`. For conditions that
// have no event to wait on (a counter in the pool, a thread exiting).
template <class Pred>
bool poll_until(Pred&& pred, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return pred();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// For a stop-here test whose held thread must keep a destruction waiting: destroys
// `owner` (`owner.reset()`) on another thread, calls `meanwhile`, and reports whether the
// destruction was still waiting 200 ms later. Then calls `release` (which lets the held
// thread go) and joins the destroying thread, so the destruction has ended on return.
template <class Owner, class Release, class Meanwhile>
bool destruction_waits(Owner& owner, Release&& release, Meanwhile&& meanwhile) {
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    owner.reset();
    destroyed = true;
  });
  meanwhile();
  const bool waited = !poll_until([&] { return destroyed.load(); }, std::chrono::milliseconds(200));
  release();
  destroyer.join();
  return waited;
}

template <class Owner, class Release>
bool destruction_waits(Owner& owner, Release&& release) {
  return destruction_waits(owner, release, [] {});
}

// A wait_for() that found the result ready.
inline bool ready(std::future_status s) { return s == std::future_status::ready; }

} // namespace metronome::test

#endif
