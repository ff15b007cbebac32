// schedule_after allocates nothing: the delay queue's node is the operation state.
#include <metronome/execution.hpp>
#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>
#include <metronome/serial_executor.hpp>
#include <metronome/wheel_timer.hpp>

#include "common/counting_new.hpp"
#include "common/manual_pool.hpp"
#include "execution/receiver.hpp"

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <memory>
#include <vector>

using namespace std::chrono_literals;
using metronome::scheduled_thread_pool;
using metronome::test::allocations;
using metronome::test::outcome;
using metronome::test::started;

namespace {

// Connects and starts `n` operations of `make(i)` into storage made beforehand; returns
// the calling thread's allocations during the connects and starts; calls `due()` (which
// makes them due) and waits for all.
template <class Make, class Due>
long allocations_of(int n, Make make, Due due) {
  using sender = decltype(make(0));
  using op = stdexec::connect_result_t<sender, metronome::test::test_receiver>;
  struct slot {
    outcome out;
    alignas(op) unsigned char storage[sizeof(op)];
    op* p = nullptr;
    ~slot() {
      if (p) p->~op();
    }
  };
  std::vector<std::unique_ptr<slot>> slots;
  for (int i = 0; i < n; ++i) slots.push_back(std::make_unique<slot>());
  stdexec::inplace_stop_source source; // a stoppable token: the stop callback is armed too
  const long before = allocations;
  for (int i = 0; i < n; ++i) {
    slot& s = *slots[static_cast<std::size_t>(i)];
    s.p = ::new (s.storage) op(stdexec::connect(make(i), metronome::test::test_receiver{&s.out, source.get_token()}));
    stdexec::start(*s.p);
  }
  const long counted = allocations - before;
  due();
  for (auto& s : slots) s->out.wait();
  for (auto& s : slots) BOOST_CHECK_EQUAL(s->out.values.load(), 1);
  return counted;
}

} // namespace

BOOST_AUTO_TEST_SUITE(execution_allocations)

BOOST_AUTO_TEST_CASE(schedule_after_allocates_nothing_on_the_pool_the_serial_executor_and_the_wheel) {
  // On a manual clock nothing falls due while the operations start, and every round
  // starts at the same phase of the delay queue's time grid (its units are powers of two
  // of nanoseconds; 2^32 ns is a multiple of each): each round puts its waits in the same
  // places, so the first grows the storage to what the second needs. (On the real clock
  // a preempted starter let some complete early, or the phase moved some from the due-
  // order run into the buckets, and the second round, holding more there, grew them.)
  metronome::manual_clock clock;
  scheduled_thread_pool pool(metronome::test::on_clock(clock, 2));
  const auto to_next_phase = [&clock](metronome::clock::duration after) {
    constexpr metronome::clock::rep grid = metronome::clock::rep(1) << 32;
    const metronome::clock::rep t = (clock.now() + after).time_since_epoch().count();
    clock.advance_to(metronome::clock::time_point(metronome::clock::duration((t / grid + 1) * grid)));
  };
  to_next_phase(0s);
  const auto due = [&] { to_next_phase(3s); };
  // One level: no walk hints (a multi-level wheel's level-0 slots keep one per 32
  // timeouts, in a list that grows now and then until it has room; checked below).
  metronome::wheel_options one_level;
  one_level.levels = 1;
  one_level.time_source = &clock;
  metronome::wheel_options five_levels;
  five_levels.time_source = &clock;
  metronome::wheel_timer wheel(pool, one_level);
  metronome::wheel_timer levelled(pool, five_levels);
  auto serial = metronome::make_serial_executor(pool.get_executor());
  auto delay = [](int i) { return std::chrono::microseconds(500 + (i * 37) % 2000); };
  // The delay queue keeps its storage once empty up to 256 entries per part, and its
  // buckets' chunks up to 64 (delay_heap.hpp min_kept, bucket_entries_kept); the wheels'
  // tick tasks share it: 200 and two ticks over a few units stay within that.
  constexpr int n = 200;
  for (int round = 0; round < 2; ++round) {
    const long p = allocations_of(n, [&](int i) { return exec::schedule_after(pool.get_scheduler(), delay(i)); }, due);
    const long s = allocations_of(n, [&](int i) { return exec::schedule_after(serial.get_scheduler(), delay(i)); }, due);
    const long w = allocations_of(n, [&](int i) { return exec::schedule_after(wheel.get_scheduler(), delay(i)); }, due);
    const long l = allocations_of(n, [&](int i) { return exec::schedule_after(levelled.get_scheduler(), delay(i)); }, due);
    const long now = allocations_of(n, [&](int) { return stdexec::schedule(pool.get_scheduler()); }, [] {});
    BOOST_TEST_MESSAGE("round " << round << ": pool " << p << ", serial " << s << ", wheel " << w
                                << ", five-level wheel " << l << ", schedule " << now);
    BOOST_CHECK_LE(l, n / 16); // at most a hint list's growth per 16 timeouts
    if (round == 1) {
      BOOST_CHECK_EQUAL(p, 0);
      BOOST_CHECK_EQUAL(s, 0);
      BOOST_CHECK_EQUAL(w, 0);
      BOOST_CHECK_EQUAL(now, 0);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
