#ifndef METRONOME_TEST_POLL_UNTIL_HPP
#define METRONOME_TEST_POLL_UNTIL_HPP

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

// A wait_for() that found the result ready.
inline bool ready(std::future_status s) { return s == std::future_status::ready; }

} // namespace metronome::test

#endif
