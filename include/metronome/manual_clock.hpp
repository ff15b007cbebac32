// manual_clock: a clock whose time moves only when a test moves it.
#ifndef METRONOME_MANUAL_CLOCK_HPP
#define METRONOME_MANUAL_CLOCK_HPP

#include <metronome/options.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace metronome {

namespace detail {
class clock_listener;
}

/// A clock whose time moves only when told to: deterministic tests of timing logic.
/**
 * A `scheduled_thread_pool` built with `pool_options::time_source = &clock` reads
 * time only from it and never from the real clock. `advance()` moves time and,
 * before it returns, moves every task that fell due into its pool's ready queue
 * (in due order), where the pool's workers run it. Time points are
 * `metronome::clock::time_point`, so the same code runs on either clock.
 *
 * @par Thread Safety
 * All members are safe to call concurrently. The clock must outlive the pools and
 * timers built on it.
 */
class manual_clock {
public:
  /// metronome::clock's duration (nanoseconds).
  using duration = clock::duration;
  /// metronome::clock's time point.
  using time_point = clock::time_point;

  /// Starts at `start` (by default one hour after the clock's epoch).
  explicit manual_clock(time_point start = time_point(std::chrono::hours(1))) noexcept
      : now_(start.time_since_epoch().count()) {}
  manual_clock(const manual_clock&) = delete;
  manual_clock& operator=(const manual_clock&) = delete;

  /// The current time.
  time_point now() const noexcept { return time_point(duration(now_.load(std::memory_order_acquire))); }

  /// Moves time forward by `d` and releases what fell due.
  /**
   * Before it returns, every pool and wheel on the clock has been told, in the order they
   * were built: due tasks are in their pools' ready queues, a wheel's due timeouts handed
   * to their executors. It tells them without holding any lock of the clock, so code run
   * on this thread meanwhile - a wheel's timeout run or dropped by an inline executor, a
   * destructor - may use the clock: advance it again, hold it, build or destroy a wheel
   * on it (even the one being told), or destroy a pool on it unless one of that pool's
   * threads is this one or waits for this advance (its join would wait for the advance:
   * docs/semantics.md, "Code an advance runs"). Such an inner advance moves the time and
   * returns at once; the outer advance releases what fell due by then before it returns.
   * Advances from different threads take turns: one waits until the other has told
   * everyone. With auto-advance on, it may return with the clock past its target (the
   * jumps the pools asked for while it told them).
   * @throws std::invalid_argument if `d` is negative.
   */
  void advance(duration d);

  /// Moves time forward to `t` and releases what fell due (as advance()).
  /** @throws std::invalid_argument if `t` is earlier than now() (read when this advance's
   * turn comes: another thread's advance may have passed it). */
  void advance_to(time_point t);

  /// Tokio-style auto-advance: while on, when every pool thread bound to this clock is
  /// idle (parked, nothing ready) and some pool holds timed work, time jumps to the
  /// earliest due time. A retry loop that sleeps for minutes then runs in milliseconds.
  /**
   * Only the pools' own threads count: work that a thread outside the pools is about to
   * submit is not seen, so such a thread should hold() the clock while it sets up work.
   * Timing wheels on the clock neither block nor drive it. Turning it on checks at once.
   */
  void set_auto_advance(bool on);
  /// Whether auto-advance is on.
  bool auto_advance() const noexcept { return auto_.load(std::memory_order_acquire); }

  /// Blocks until every pool built on this clock is idle: no worker awake, nothing
  /// ready, nothing on its way to a queue (Kotlin's `runCurrent()`, for threads).
  /**
   * After `advance()`, it waits for the work that fell due and for all that this work sets
   * off on the pools - a serial executor's tasks, a coroutine's posts and continuations,
   * tasks it submits - to end, so a test can look at the results at once. Time does not
   * move; with auto-advance on, the clock jumps as usual and this returns once no pool
   * holds timed work either (never, then, while a periodic task is scheduled). Not seen:
   * work on its way from outside the pools (another thread, an `io_context`, a wheel's
   * timeouts over a non-pool executor), nor I/O completions run by a pool's reactor.
   * Returns at once when no pool is built on the clock.
   * @throws std::logic_error when called on a thread of a pool built on this clock, or
   * on a thread inside one of this clock's advances (a destructor it runs): it would wait
   * for itself.
   */
  void wait_idle();

  /// While alive, auto-advance waits (e.g. while a test thread submits work).
  class hold_guard {
  public:
    /// Holds `c`'s auto-advance until destroyed.
    explicit hold_guard(manual_clock& c) noexcept;
    hold_guard(const hold_guard&) = delete;
    hold_guard& operator=(const hold_guard&) = delete;
    ~hold_guard();

  private:
    manual_clock& c_;
  };
  /// Holds auto-advance while the returned guard lives.
  [[nodiscard]] hold_guard hold() noexcept { return hold_guard(*this); }

  /// @cond internal
  void attach(detail::clock_listener* l);
  void detach(detail::clock_listener* l) noexcept;
  // A pool thread is about to park with nothing ready: advance if everybody is idle.
  void idle_point();
  // Whether the pool's last awake worker must call idle_point() before it parks.
  bool wants_idle_points() const noexcept {
    return auto_.load(std::memory_order_acquire) || idle_waiters_.load(std::memory_order_seq_cst) > 0;
  }
  // Threads in wait_idle() now (tests).
  int idle_waiters() const noexcept { return idle_waiters_.load(std::memory_order_seq_cst); }
  // Threads in detach() waiting for an advance to finish telling their listener (tests).
  int detach_waiters() const noexcept { return detach_waiters_.load(std::memory_order_seq_cst); }
  /// @endcond

private:
  void wait_turn(std::unique_lock<std::mutex>& lk);
  void set(std::unique_lock<std::mutex>& lk, clock::rep t);
  void tell_listeners(std::unique_lock<std::mutex>& lk);
  void check_idle(std::unique_lock<std::mutex>& lk);
  bool decide(const std::unique_lock<std::mutex>& lk, clock::rep& jump_to);
  bool all_quiescent(const std::unique_lock<std::mutex>& lk, clock::time_point& earliest) const;

  std::atomic<clock::rep> now_;
  std::atomic<bool> auto_{false};
  int holds_ = 0;                    // guarded by mtx_
  std::atomic<int> idle_waiters_{0}; // threads in wait_idle()
  std::uint64_t idle_verdicts_ = 0;  // guarded by mtx_: checks that found every pool idle
  std::condition_variable idle_cv_;  // wait_idle()'s waiters, woken by such a check
  std::mutex mtx_;                   // guards the listener list, the telling state below, decisions
  std::vector<detail::clock_listener*> listeners_;
  // The telling (docs/design.md, "Telling the listeners"), all guarded by mtx_: one advance
  // at a time tells the listeners, each without mtx_.
  bool telling_ = false;                      // an advance is telling the listeners
  std::thread::id teller_;                    // ... on this thread
  std::size_t next_ = 0;                      // the index in listeners_ it tells next
  detail::clock_listener* calling_ = nullptr; // the listener it is calling now
  bool retell_ = false;                       // time moved again on the teller's thread: tell all again
  bool decision_owed_ = false;                // a decision was asked while telling: made at its end
  std::condition_variable turn_cv_;           // advances waiting for their turn, detaches for a call's end
  std::atomic<int> detach_waiters_{0};
};

} // namespace metronome

#endif
