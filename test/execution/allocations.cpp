// schedule_after allocates nothing: the delay queue's node is the operation state.
#include <metronome/execution.hpp>
#include <metronome/scheduled_thread_pool.hpp>
#include <metronome/serial_executor.hpp>
#include <metronome/wheel_timer.hpp>

#include "common/counting_new.hpp"
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
// the calling thread's allocations during the connects and starts; waits for all.
template <class Make>
long allocations_of(int n, Make make) {
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
  for (auto& s : slots) s->out.wait();
  for (auto& s : slots) BOOST_CHECK_EQUAL(s->out.values.load(), 1);
  return counted;
}

} // namespace

BOOST_AUTO_TEST_SUITE(execution_allocations)

BOOST_AUTO_TEST_CASE(schedule_after_allocates_nothing_on_the_pool_the_serial_executor_and_the_wheel) {
  scheduled_thread_pool pool(2);
  // One level: no walk hints (a multi-level wheel's level-0 slots keep one per 32
  // timeouts, in a list that grows now and then until it has room; checked below).
  metronome::wheel_options one_level;
  one_level.levels = 1;
  metronome::wheel_timer wheel(pool, one_level);
  metronome::wheel_timer levelled(pool);
  auto serial = metronome::make_serial_executor(pool.get_executor());
  auto delay = [](int i) { return std::chrono::microseconds(500 + (i * 37) % 2000); };
  // A first round grows the delay queue and the wheel's slots to what the second needs.
  for (int round = 0; round < 2; ++round) {
    const long p = allocations_of(256, [&](int i) { return exec::schedule_after(pool.get_scheduler(), delay(i)); });
    const long s = allocations_of(256, [&](int i) { return exec::schedule_after(serial.get_scheduler(), delay(i)); });
    const long w = allocations_of(256, [&](int i) { return exec::schedule_after(wheel.get_scheduler(), delay(i)); });
    const long l = allocations_of(256, [&](int i) { return exec::schedule_after(levelled.get_scheduler(), delay(i)); });
    const long now = allocations_of(256, [&](int) { return stdexec::schedule(pool.get_scheduler()); });
    BOOST_TEST_MESSAGE("round " << round << ": pool " << p << ", serial " << s << ", wheel " << w
                                << ", five-level wheel " << l << ", schedule " << now);
    BOOST_CHECK_LE(l, 256 / 16); // at most a hint list's growth per 16 timeouts
    if (round == 1) {
      BOOST_CHECK_EQUAL(p, 0);
      BOOST_CHECK_EQUAL(s, 0);
      BOOST_CHECK_EQUAL(w, 0);
      BOOST_CHECK_EQUAL(now, 0);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
