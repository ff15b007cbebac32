// The interface through which a manual_clock tells what is built on it (pools, wheels)
// that its time moved.
#ifndef METRONOME_DETAIL_CLOCK_LISTENER_HPP
#define METRONOME_DETAIL_CLOCK_LISTENER_HPP

namespace metronome::detail {

// Something told when a manual clock moves.
class clock_listener {
public:
  virtual void on_time_advanced() = 0;

protected:
  ~clock_listener() = default;
};

} // namespace metronome::detail

#endif
