// The schedulers among stdexec's algorithms, Asio operations as senders, and coroutines.
#include <metronome/async_delay.hpp>
#include <metronome/execution.hpp>
#include <metronome/scheduled_thread_pool.hpp>
#include <metronome/serial_executor.hpp>
#include <metronome/wheel_timer.hpp>

#include <exec/task.hpp>
#include <exec/when_any.hpp>
#if defined(METRONOME_TEST_USE_SENDER)
#include <exec/asio/use_sender.hpp>
#endif

#include "common/poll_until.hpp"

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <optional>
#include <thread>

using namespace std::chrono_literals;
using metronome::scheduled_thread_pool;

namespace {

exec::task<int> wait_then_add(metronome::pool_scheduler sched, int a, int b) {
  const auto t0 = sched.now();
  co_await exec::schedule_after(sched, 2ms);
  if (sched.now() - t0 < 2ms) co_return -1; // early
  co_return a + b;
}

} // namespace

BOOST_AUTO_TEST_SUITE(execution_interop)

BOOST_AUTO_TEST_CASE(sync_wait_when_all_and_let_value_over_the_three_schedulers) {
  scheduled_thread_pool pool(2);
  metronome::wheel_timer wheel(pool);
  auto serial = metronome::make_serial_executor(pool.get_executor());
  auto pool_s = pool.get_scheduler();
  auto wheel_s = wheel.get_scheduler();
  auto serial_s = serial.get_scheduler();
  const auto t0 = metronome::clock::now();
  auto [a, b, c] = stdexec::sync_wait(stdexec::when_all(
                                          exec::schedule_after(pool_s, 3ms) | stdexec::then([] { return 1; }),
                                          exec::schedule_after(wheel_s, 4ms) | stdexec::then([] { return 2; }),
                                          exec::schedule_after(serial_s, 5ms) | stdexec::then([&] {
                                            return serial.running_in_this_thread() ? 3 : -3;
                                          })))
                       .value();
  BOOST_CHECK_EQUAL(a + b + c, 6);
  BOOST_CHECK(metronome::clock::now() - t0 >= 5ms);
  // let_value: from the pool onto the serial executor, by way of the wheel.
  auto chained = exec::schedule_after(pool_s, 1ms) | stdexec::let_value([&] {
                   return exec::schedule_after(wheel_s, 1ms) |
                          stdexec::let_value([&] { return stdexec::schedule(serial_s); });
                 }) |
                 stdexec::then([&] { return serial.running_in_this_thread(); });
  auto [inside] = stdexec::sync_wait(std::move(chained)).value();
  BOOST_CHECK(inside);
  // continues_on: onto the pool.
  auto [on_pool] = stdexec::sync_wait(stdexec::just() | stdexec::continues_on(pool_s) | stdexec::then([&] {
                                        return pool.get_executor().running_in_this_thread();
                                      }))
                       .value();
  BOOST_CHECK(on_pool);
}

// A stop request from the environment ends an hour's wait at once: stopped_as_optional
// turns it into an empty optional; when_all stops its other children when one stops; and
// when_any stops the waits that lost.
BOOST_AUTO_TEST_CASE(stop_requests_from_stdexec_algorithms_end_the_waits) {
  scheduled_thread_pool pool(1);
  metronome::wheel_timer wheel(pool);
  auto serial = metronome::make_serial_executor(pool.get_executor());
  const auto t0 = metronome::clock::now();
  auto stopped_wait = [&](auto sched, auto pending) {
    stdexec::inplace_stop_source source;
    std::thread stopper([&] {
      metronome::test::poll_until([&] { return pending() == 1; });
      source.request_stop();
    });
    auto r = stdexec::sync_wait(stdexec::write_env(
        stdexec::stopped_as_optional(exec::schedule_after(sched, 1h) | stdexec::then([] { return 1; })),
        stdexec::prop{stdexec::get_stop_token, source.get_token()}));
    stopper.join();
    return r && !std::get<0>(*r).has_value();
  };
  BOOST_CHECK(stopped_wait(pool.get_scheduler(), [&] { return pool.stats().delayed_queued; }));
  BOOST_CHECK(stopped_wait(wheel.get_scheduler(), [&] { return wheel.pending(); }));
  BOOST_CHECK(stopped_wait(serial.get_scheduler(), [&] { return pool.stats().delayed_queued; }));
  // when_all: a child that fails stops the others; sync_wait rethrows its error.
  auto fail_soon = exec::schedule_after(pool.get_scheduler(), 1ms) | stdexec::then([] { throw 7; });
  BOOST_CHECK_THROW(stdexec::sync_wait(stdexec::when_all(exec::schedule_after(pool.get_scheduler(), 1h),
                                                         exec::schedule_after(wheel.get_scheduler(), 1h),
                                                         exec::schedule_after(serial.get_scheduler(), 1h), fail_soon)),
                    int);
  // when_any: the first to complete wins, the others are stopped.
  auto [first] = stdexec::sync_wait(exec::when_any(exec::schedule_after(pool.get_scheduler(), 1h) |
                                                       stdexec::then([] { return 1; }),
                                                   exec::schedule_after(wheel.get_scheduler(), 1ms) |
                                                       stdexec::then([] { return 2; })))
                     .value();
  BOOST_CHECK_EQUAL(first, 2);
  BOOST_CHECK(metronome::clock::now() - t0 < 1min);
  BOOST_CHECK(metronome::test::poll_until([&] { return pool.stats().delayed_queued == 0 && wheel.pending() == 0; }));
  // A value when the wait wins. (stopped_as_optional wants one value: then() makes it.)
  auto r4 = stdexec::sync_wait(
      stdexec::stopped_as_optional(exec::schedule_after(pool.get_scheduler(), 1ms) | stdexec::then([] { return 1; })));
  BOOST_REQUIRE(r4);
  BOOST_CHECK(std::get<0>(*r4).has_value());
}

BOOST_AUTO_TEST_CASE(an_exec_task_awaits_schedule_after_on_the_pool) {
  scheduled_thread_pool pool(2);
  auto [sum] = stdexec::sync_wait(wait_then_add(pool.get_scheduler(), 2, 5)).value();
  BOOST_CHECK_EQUAL(sum, 7);
}

#if defined(METRONOME_TEST_USE_SENDER)
// An Asio operation as a sender: async_delay with exec::asio::use_sender.
BOOST_AUTO_TEST_CASE(use_sender_turns_async_delay_into_a_sender) {
  scheduled_thread_pool pool(1);
  const auto t0 = metronome::clock::now();
  auto r = stdexec::sync_wait(metronome::async_delay(pool.get_executor(), 3ms, exec::asio::use_sender));
  BOOST_CHECK(r.has_value());
  BOOST_CHECK(metronome::clock::now() - t0 >= 3ms);
  // And a stop request (when_all's, when its other child fails) cancels it through its
  // cancellation slot: out of the delay queue at once.
  BOOST_CHECK_THROW(stdexec::sync_wait(stdexec::when_all(
                        metronome::async_delay(pool.get_executor(), 1h, exec::asio::use_sender),
                        exec::schedule_after(pool.get_scheduler(), 1ms) | stdexec::then([] { throw 7; }))),
                    int);
  BOOST_CHECK(metronome::test::poll_until([&] { return pool.stats().delayed_queued == 0; }));
}
#endif

BOOST_AUTO_TEST_SUITE_END()
