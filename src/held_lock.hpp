// held_lock: how the engine's functions that need a mutex held say so. They take the
// caller's lock as their first parameter, as Asio's scheduler::do_run_one takes its
// scoped_lock and folly's ...WithLock functions take their guard: the signature says who
// must hold what, and debug builds check that the lock is held and is on the right mutex.
// Release builds check nothing; the lock is passed by reference.
#ifndef METRONOME_SRC_HELD_LOCK_HPP
#define METRONOME_SRC_HELD_LOCK_HPP

#include <cassert>
#include <mutex>

namespace metronome::detail {

using held_lock = std::unique_lock<std::mutex>;

// Debug builds: lk holds m.
inline void assert_held([[maybe_unused]] const held_lock& lk, [[maybe_unused]] const std::mutex& m) noexcept {
  assert(lk.owns_lock() && lk.mutex() == &m && "metronome: called without the mutex it needs");
}

} // namespace metronome::detail

#endif
