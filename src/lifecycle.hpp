// A pool's lifecycle: its phase, how it is being ended, and the rules that follow from
// them - what a pool still accepts, whether a periodic task runs again, when the pool may
// terminate. The engine (pool_engine.hpp) counts what is outstanding; this part decides.
#ifndef METRONOME_SRC_LIFECYCLE_HPP
#define METRONOME_SRC_LIFECYCLE_HPP

#include <atomic>
#include <cassert>
#include <cstdint>

namespace metronome::detail {

// The phase lives in one atomic word, as Java's ThreadPoolExecutor keeps its run state in
// `ctl`: running -> shutdown -> stop, only forward, and whether the pool has terminated.
// Termination is a bit beside the phase, not a fourth phase: a pool terminates from any
// phase (join() without shutdown() ends a running pool once its work runs out; a failed
// start ends it at once), and terminate() takes a termination back when a producer pushed
// meanwhile. Each phase's bits contain the previous one's, so moving forward is one
// fetch_or and never moves back (close() after shutdown_now() asks for shutdown and stays
// stopped).
//
// The ending flags say who ends the pool and from where. None orders with another or
// with the phase (join() ends a pool that is not shut down), so each is a flag of its own.
//
// Who writes what: the phase, the termination and the ending flags change under the pool
// mutex, except forked_child (written in a forked child before it has other threads) and
// restart_after_fork (atomic: set before the pool is shared, read by the fork hooks).
// The phase and the termination are read without a lock (seq_cst unless the caller asks
// for less); the ending flags under the mutex.
class lifecycle {
public:
  enum phase : std::uint8_t { running = 0, shutdown = 1, stop = 3 };

  bool at_least(phase p, std::memory_order o = std::memory_order_seq_cst) const noexcept {
    return (word_.load(o) & p) == p;
  }
  bool terminated(std::memory_order o = std::memory_order_seq_cst) const noexcept {
    return (word_.load(o) & terminated_bit) != 0;
  }
  // running -> shutdown (shutdown(), close()), -> stop (shutdown_now(), close_hosted()).
  void advance_to(phase p) noexcept {
    assert(p != running && "metronome: the lifecycle never moves back to running");
    word_.fetch_or(p, std::memory_order_seq_cst);
  }
  // terminate(), a failed start, close_hosted(), a forked child.
  void set_terminated() noexcept { word_.fetch_or(terminated_bit, std::memory_order_seq_cst); }
  // terminate()'s back-off: work was pushed between its check and its store.
  void take_back_termination() noexcept {
    assert(terminated(std::memory_order_relaxed) && "metronome: no termination to take back");
    word_.fetch_and(static_cast<std::uint8_t>(~terminated_bit), std::memory_order_seq_cst);
  }

  // ---- The ending flags (the pool mutex).
  bool joining = false;        // join() waits: idle workers terminate the pool once its work runs out
  bool closing = false;        // close() (the destructor): tracked work no longer keeps the pool
  bool closer_in_pool = false; // ... and close() runs on one of our workers, which stays awake
  bool forked_child = false;   // a pool of the parent, in a forked child (terminate_in_child)
  std::atomic<bool> restart_after_fork{false}; // in a forked child, keep going (a hosted core)

  // ---- The rules.
  // Typed work and waits are refused (rejection policy, operation_aborted) once the pool
  // is shut down or has terminated.
  bool refuses_new_work() const noexcept { return at_least(shutdown) || terminated(); }
  // An executor's post: refused once stopped; after shutdown only from the pool's own
  // threads (`inside`) or on behalf of work already accepted (`internal`: a strand's
  // invoker), as Java accepts no new task after shutdown().
  bool refuses_post(bool inside, bool internal) const noexcept {
    return at_least(stop, std::memory_order_acquire) ||
           (!inside && !internal && at_least(shutdown, std::memory_order_acquire));
  }
  // A periodic task is not run again once stopped or being destroyed, nor after shutdown
  // unless the pool's options keep periodic work going (Java's
  // continueExistingPeriodicTasksAfterShutdown).
  bool ends_periodic(bool continue_periodic_after_shutdown) const noexcept {
    return at_least(stop) || closing || (at_least(shutdown) && !continue_periodic_after_shutdown);
  }
  // Idle workers look for the termination (park()) only once the pool is shut down or
  // joined; one that drops the last thing a termination waits for wakes them.
  bool seeks_termination() const noexcept { return at_least(shutdown) || joining; }

  // What may still keep the pool from terminating, as the engine counts it under the
  // pool mutex.
  struct outstanding {
    bool queued;       // ready, delayed (save wheels' ticks) or in transit
    bool wheel_waits;  // a wheel wait not delivered yet
    bool hand_overs;   // work handed to a strand over the pool, not run yet
    bool tracked_work; // Asio work the pool's executors track (work_started)
  };
  // The termination rule (with every worker but the caller parked, which the engine
  // checks): nothing queued, no wheel wait undelivered; no hand-over outstanding, unless
  // stopped (strand invokers are destroyed anyway) or closed from one of the pool's own
  // tasks; no tracked work, unless shut down or being destroyed - then only the pool's
  // own threads could finish it, and none is left to.
  bool may_terminate(const outstanding& o) const noexcept {
    return !o.queued && !o.wheel_waits && (!o.hand_overs || at_least(stop) || closer_in_pool) &&
           (!o.tracked_work || at_least(shutdown) || closing);
  }

private:
  static constexpr std::uint8_t terminated_bit = 4;
  std::atomic<std::uint8_t> word_{running};
};

} // namespace metronome::detail

#endif
