// The reactor adapter's runs of Asio's scheduler (reactor_adapter.hpp).
#include "reactor_adapter.hpp"

namespace metronome::detail {

void reactor_adapter::wait(clock::time_point due) {
  try {
    if (due != timer_due_) {
      if (!timer_) timer_ = make_timer_(*ctx_);
      timer_->arm(due);
      timer_due_ = due;
    }
    // One completion (the timer's, or I/O), on this thread; then every other one already
    // ready, in one go (no blocking), before the pool's queues are looked at again.
    asio_internals::run_ready(*io_);
  } catch (...) {
    after_run(true);
    throw;
  }
  after_run(false);
}

void reactor_adapter::poll() {
  try {
    asio_internals::poll_ready(*io_);
  } catch (...) {
    after_run(true);
    throw;
  }
  after_run(false);
}

// What every run leaves behind: when it ran (for poll_due), and a timer that expired
// meanwhile (its completion may have run in a poll) to be armed again for a head due at
// the same time; a throw leaves the timer's state unknown, so it is armed again too.
void reactor_adapter::after_run(bool threw) noexcept {
  const clock::time_point now = clock::now();
  ran_at_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  if (threw || (timer_due_ != clock::time_point::max() && now >= timer_due_)) timer_due_ = clock::time_point::min();
}

} // namespace metronome::detail
