// The pool's parking lot: who is idle and how to wake them. Workers out of work spin a
// little (spinning), then park (sleepers): at most one as the leader, which times the
// delay queue's head (Java's DelayedWorkQueue), the others as followers, each waiting for
// a wake token. The pool's engine decides who parks how (pool_core.cpp: park); this part
// keeps the counts and the condition variables.
#ifndef METRONOME_SRC_PARKING_LOT_HPP
#define METRONOME_SRC_PARKING_LOT_HPP

#include <metronome/detail/test_hooks.hpp>
#include <metronome/options.hpp>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <new>

namespace metronome::detail {

// Invariant:
//   (P) a worker parks (waits) only after raising sleepers and then seeing, under the pool
//       mutex, nothing to do; a producer that pushes and then sees sleepers > 0 (and
//       nobody spinning) wakes somebody under the mutex. Both sides are seq_cst, so one of
//       them sees the other: no push is left with every worker asleep.
//   (T) a wake token is a notification owed to one follower: tokens <= followers (a
//       follower leaving takes one if any is left), so followers > tokens means somebody
//       waits that no notification is meant for, and a wake-up goes there first.
//   (L) the leader, when any, waits on its own condition variable (or, as the reactor's
//       holder, in the reactor, which the engine interrupts instead).
// The counts and the leader are under the pool mutex, except spinning and sleepers,
// which producers read without it (written by the workers, seq_cst).
class parking_lot {
public:
  // ---- Without the mutex.
  void start_spinning() noexcept { spinning_.fetch_add(1, std::memory_order_seq_cst); }
  void stop_spinning() noexcept { spinning_.fetch_sub(1, std::memory_order_seq_cst); }
  bool someone_spinning() const noexcept { return spinning_.load(std::memory_order_seq_cst) != 0; }
  bool someone_parking() const noexcept { return sleepers_.load(std::memory_order_seq_cst) > 0; }

  // ---- Under the pool mutex.
  // A worker starts to park (before it looks for work again under the mutex), and stops.
  void enter() noexcept { sleepers_.fetch_add(1, std::memory_order_seq_cst); }
  void leave() noexcept { sleepers_.fetch_sub(1, std::memory_order_seq_cst); }

  // The leader: an identity only (a worker), never dereferenced.
  const void* leader() const noexcept { return leader_; }
  void lead(const void* w) noexcept { leader_ = w; }
  void stop_leading(const void* w) noexcept {
    if (leader_ == w) leader_ = nullptr;
  }
  bool has_unwoken_follower() const noexcept { return followers_ > wake_tokens_; } // (T)
  int followers() const noexcept { return followers_; }

  // Wakes one follower nobody has woken yet, with a token. False when there is none.
  bool wake_follower() noexcept {
    if (followers_ <= wake_tokens_) return false;
    ++wake_tokens_;
    follower_cv_.notify_one();
    return true;
  }
  void notify_leader() noexcept { leader_cv_.notify_one(); }
  // Wakes up to n workers: followers first, one token each, then the leader when it waits
  // on its condition variable (it is not `reactor_holder`). True when a wake-up is left
  // that only the reactor can take: the caller interrupts it.
  bool wake_some(std::size_t n, const void* reactor_holder) noexcept {
    while (n > 0 && wake_follower()) --n;
    if (n == 0) return false;
    if (leader_ == nullptr || leader_ == reactor_holder) return true;
    leader_cv_.notify_one();
    return false;
  }
  // Wakes every parked worker (the caller interrupts the reactor too).
  void wake_all() noexcept {
    wake_tokens_ = followers_;
    follower_cv_.notify_all();
    leader_cv_.notify_all();
  }

  // The leader `w` waits until `until` (max(): until woken), or a wake-up. lk holds the
  // pool mutex, released while it waits.
  void wait_as_leader(std::unique_lock<std::mutex>& lk, const void* w, clock::time_point until) {
    leader_ = w;
    METRONOME_TEST_HOOK(hook_point::leader_before_wait);
    if (until == clock::time_point::max())
      leader_cv_.wait(lk);
    else
      leader_cv_.wait_until(lk, until);
    leader_ = nullptr;
  }
  // A follower waits for a wake token, or until `until` (max(): no limit). True when it
  // ran out of time. Like any wait on a condition variable it may end early: the caller
  // looks for work and parks again.
  bool wait_as_follower(std::unique_lock<std::mutex>& lk, clock::time_point until) {
    ++followers_;
    METRONOME_TEST_HOOK(hook_point::follower_before_wait);
    bool timed_out = false;
    if (until == clock::time_point::max())
      follower_cv_.wait(lk);
    else
      timed_out = follower_cv_.wait_until(lk, until) == std::cv_status::timeout;
    --followers_;
    if (wake_tokens_ > 0) --wake_tokens_; // (T)
    return timed_out;
  }

  // In a forked child: none of the parent's waiters exist here, and the condition
  // variables may count them.
  void reset_in_child() noexcept {
    ::new (&follower_cv_) std::condition_variable();
    ::new (&leader_cv_) std::condition_variable();
    spinning_.store(0);
    sleepers_.store(0);
    leader_ = nullptr;
    followers_ = 0;
    wake_tokens_ = 0;
  }

private:
  // Read by producers on every push: a line of their own.
  alignas(64) std::atomic<int> spinning_{0};
  std::atomic<int> sleepers_{0};
  // Written by parking workers (the pool mutex).
  alignas(64) std::condition_variable follower_cv_;
  std::condition_variable leader_cv_;
  const void* leader_ = nullptr;
  int followers_ = 0;   // workers in follower_cv_'s wait
  int wake_tokens_ = 0; // notifications not yet taken (T)
};

} // namespace metronome::detail

#endif
