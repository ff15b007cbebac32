// The interface through which a manual_clock tells what is built on it (pools, wheels)
// that its time moved.
#ifndef METRONOME_DETAIL_CLOCK_LISTENER_HPP
#define METRONOME_DETAIL_CLOCK_LISTENER_HPP

#include <metronome/options.hpp>

namespace metronome::detail {

// Something told when a manual clock moves.
class clock_listener {
public:
  // The time moved: release what fell due. Called by one advance at a time, without the
  // clock's mutex (docs/design.md, "Telling the listeners"); may run program code that
  // uses the clock, even destroys this listener.
  virtual void on_time_advanced() = 0;
  // Auto-advance: false while any of this listener's threads is awake or work is ready;
  // else true, with `next_due` lowered to its earliest timed work (if any). Called
  // under the clock's mutex; takes the listener's own.
  virtual bool quiescent(clock::time_point& next_due) noexcept {
    (void)next_due;
    return true;
  }
  // Whether the calling thread is one of this listener's (manual_clock::wait_idle()
  // refuses to wait for itself).
  virtual bool runs_this_thread() const noexcept { return false; }

protected:
  ~clock_listener() = default;
};

} // namespace metronome::detail

#endif
