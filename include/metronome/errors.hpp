// The exceptions metronome throws: rejected_execution and cancelled_error.
#ifndef METRONOME_ERRORS_HPP
#define METRONOME_ERRORS_HPP

#include <stdexcept>
#include <string>

namespace metronome {

/// Thrown (or reported) when a pool, serial executor or wheel timer refuses work.
/**
 * Raised by the typed API (`submit`, `schedule…`) under `rejection_policy::abort`,
 * after `shutdown()` or when `pool_options::max_queued` is reached; by a disposed
 * `serial_executor`; by a stopped or full `wheel_timer`. On the Asio executor path,
 * which never throws, an instance is passed to the pool's exception handler instead.
 */
class rejected_execution : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Thrown by `scheduled_future::get()` when the task was cancelled before it ran.
class cancelled_error : public std::runtime_error {
public:
  cancelled_error() : std::runtime_error("metronome: task was cancelled") {}
};

} // namespace metronome

#endif
