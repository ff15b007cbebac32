// parking_lot alone: idle workers' counts, wake tokens and the leader, with plain threads
// and a mutex of the test's own (src/parking_lot.hpp).
#include "parking_lot.hpp"

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

using namespace metronome::detail;
using mclock = metronome::clock;

namespace {

struct fixture {
  std::mutex mtx;
  parking_lot lot;
  int a = 0, b = 0; // worker identities

  // Until `pred()` holds under the mutex (a follower or the leader got into its wait:
  // the lot counts it under the mutex, which its wait then releases).
  template <class Pred>
  void until_locked(Pred pred) {
    for (;;) {
      {
        std::lock_guard lk(mtx);
        if (pred()) return;
      }
      std::this_thread::yield();
    }
  }
  // A follower on its own thread waiting without a limit; `woken` set when it returns.
  std::thread follower(std::atomic<int>& woken) {
    return std::thread([this, &woken] {
      std::unique_lock lk(mtx);
      const bool timed_out = lot.wait_as_follower(lk, mclock::time_point::max());
      if (!timed_out) woken.fetch_add(1);
      woken.notify_all();
    });
  }
};

} // namespace

BOOST_FIXTURE_TEST_SUITE(parking_lot_suite, fixture)

// Producers' view without the mutex: spinning and parking workers are counted.
BOOST_AUTO_TEST_CASE(spinners_and_sleepers_are_counted) {
  BOOST_TEST(!lot.someone_spinning());
  BOOST_TEST(!lot.someone_parking());
  lot.start_spinning();
  lot.start_spinning();
  lot.stop_spinning();
  BOOST_TEST(lot.someone_spinning());
  lot.stop_spinning();
  BOOST_TEST(!lot.someone_spinning());
  lot.enter();
  BOOST_TEST(lot.someone_parking());
  lot.leave();
  BOOST_TEST(!lot.someone_parking());
}

// With nobody parked, every wake-up is left over for the reactor; none asked, none left.
BOOST_AUTO_TEST_CASE(a_wake_up_nobody_takes_is_left_for_the_reactor) {
  std::lock_guard lk(mtx);
  BOOST_TEST(lot.wake_some(1, nullptr));
  BOOST_TEST(!lot.wake_some(0, nullptr));
  BOOST_TEST(!lot.wake_follower());
}

// (T): a wake-up goes to a follower nobody has woken yet, one token each; two followers
// and one wake-up: one returns, the other still waits unwoken; the next wake-up takes
// it, and one more finds nobody.
BOOST_AUTO_TEST_CASE(each_wake_up_takes_one_follower_with_a_token) {
  std::atomic<int> woken{0};
  std::thread f1 = follower(woken);
  std::thread f2 = follower(woken);
  until_locked([&] { return lot.followers() == 2; });
  {
    std::lock_guard lk(mtx);
    BOOST_TEST(!lot.wake_some(1, nullptr)); // taken by a follower
    BOOST_TEST(lot.has_unwoken_follower()); // the other: 2 followers, 1 token
  }
  woken.wait(0);
  {
    std::lock_guard lk(mtx);
    BOOST_TEST(woken.load() == 1);
    BOOST_TEST(lot.followers() == 1);
    BOOST_TEST(lot.has_unwoken_follower()); // its token went with the one that left
    BOOST_TEST(!lot.wake_some(1, nullptr));  // to the other
    BOOST_TEST(!lot.has_unwoken_follower());
    BOOST_TEST(lot.wake_some(1, nullptr)); // both have theirs: this one is for the reactor
  }
  f1.join();
  f2.join();
  BOOST_TEST(woken.load() == 2);
  std::lock_guard lk(mtx);
  BOOST_TEST(lot.followers() == 0);
  BOOST_TEST(!lot.has_unwoken_follower());
  BOOST_TEST(lot.wake_some(1, nullptr)); // nobody left: for the reactor
}

// wake_all wakes every follower and the leader (shutdown, termination), leaving no
// follower unwoken.
BOOST_AUTO_TEST_CASE(wake_all_wakes_the_followers_and_the_leader) {
  std::atomic<int> woken{0};
  std::thread f1 = follower(woken);
  std::thread f2 = follower(woken);
  std::thread leader([&] {
    std::unique_lock lk(mtx);
    lot.wait_as_leader(lk, &a, mclock::now() + std::chrono::hours(1));
  });
  until_locked([&] { return lot.followers() == 2 && lot.leader() == &a; });
  {
    std::lock_guard lk(mtx);
    lot.wake_all();
    BOOST_TEST(!lot.has_unwoken_follower());
  }
  f1.join();
  f2.join();
  leader.join(); // (the check: each returns)
  BOOST_TEST(woken.load() == 2);
  std::lock_guard lk(mtx);
  BOOST_TEST(lot.followers() == 0);
  BOOST_TEST(lot.leader() == nullptr);
}

// A follower with a limit returns true once it has passed, and is no longer counted.
BOOST_AUTO_TEST_CASE(a_follower_s_limit_runs_out) {
  std::unique_lock lk(mtx);
  const mclock::time_point until = mclock::now() + std::chrono::milliseconds(10);
  bool timed_out = false;
  while (!timed_out) timed_out = lot.wait_as_follower(lk, until); // (an early end waits again)
  BOOST_TEST((mclock::now() >= until));
  BOOST_TEST(!lot.has_unwoken_follower());
}

// (L): the leader waits until its due time, and is the lot's leader meanwhile; with no
// follower, a wake-up goes to it - unless it is the reactor's holder, when the wake-up is
// left over for the reactor.
BOOST_AUTO_TEST_CASE(the_leader_waits_for_its_due_time_or_a_wake_up) {
  {
    std::unique_lock lk(mtx);
    const mclock::time_point due = mclock::now() + std::chrono::milliseconds(10);
    while (mclock::now() < due) lot.wait_as_leader(lk, &a, due);
    BOOST_TEST(lot.leader() == nullptr);
  }
  std::atomic<bool> back{false};
  std::thread leader([&] {
    std::unique_lock lk(mtx);
    lot.wait_as_leader(lk, &a, mclock::now() + std::chrono::hours(1));
    back = true;
  });
  until_locked([&] { return lot.leader() == &a; });
  {
    std::lock_guard lk(mtx);
    BOOST_TEST(lot.wake_some(1, &a)); // the leader is the reactor's holder: not on the condition variable
    BOOST_TEST(!lot.wake_some(1, &b)); // it is not: notified
  }
  leader.join(); // (the check: it returns well before its hour)
  BOOST_TEST(back.load());
  std::lock_guard lk(mtx);
  BOOST_TEST(lot.leader() == nullptr);
}

// The reactor's holder leads without the condition variable: lead and stop_leading, and
// only the leader itself can stop leading.
BOOST_AUTO_TEST_CASE(a_leader_in_the_reactor_is_named_and_released) {
  std::lock_guard lk(mtx);
  lot.lead(&a);
  lot.stop_leading(&b);
  BOOST_TEST(lot.leader() == &a);
  lot.stop_leading(&a);
  BOOST_TEST(lot.leader() == nullptr);
}

BOOST_AUTO_TEST_SUITE_END()
