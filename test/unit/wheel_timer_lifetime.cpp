// The wheel timer's lifetimes and failures: handles that outlive the wheel (with
// timeouts queued on the executor), timeouts and wait handlers that throw (to the wheel's
// or the pool's exception handler, the worker lives), and a wait's outstanding work on
// the handler's executor (held until the completion is handed over; a dying io_context
// left alone).
#include <metronome/wheel_timer.hpp>

#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include "common/counting_executor.hpp"
#include "common/exception_log.hpp"
#include "common/io_churn.hpp"
#include "common/latch_task.hpp"
#include "common/poll_until.hpp"
#include "common/stderr_capture.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <future>
#include <stdexcept>
#include <string>
#include <vector>

namespace asio = boost::asio;
using namespace std::chrono_literals;
using boost::system::error_code;
using metronome::manual_clock;
using metronome::scheduled_thread_pool;
using metronome::wheel_options;
using metronome::wheel_timer;

BOOST_AUTO_TEST_SUITE(wheel_timer_suite)

// Handles may outlive the wheel. Due timeouts (and a wait) already handed to the pool
// when the wheel goes never reach into the wheel again: their handles report them
// expired, a cancel still wins while they wait in the queue, and a wait can still be
// cancelled through its slot. A timeout that was still in the wheel is cancelled.
BOOST_AUTO_TEST_CASE(handles_outlive_the_wheel_with_timeouts_queued_on_the_executor) {
  manual_clock clock;
  metronome::test::gate busy;
  metronome::test::counter busy_started, ran;
  scheduled_thread_pool pool(1);
  wheel_options o;
  o.time_source = &clock;
  std::optional<wheel_timer> wheel(std::in_place, pool, o);
  BOOST_REQUIRE(metronome::test::occupy_worker(pool, busy, busy_started));
  std::atomic<int> cancelled_runs{0};
  auto cancelled = wheel->schedule([&] { cancelled_runs.fetch_add(1); }, 1ms);
  auto kept = wheel->schedule([&] { ran.add(); }, 1ms);
  auto linked = wheel->schedule([] {}, 1h);
  asio::cancellation_signal sig;
  std::promise<error_code> waited;
  wheel->async_wait(1ms, asio::bind_cancellation_slot(sig.slot(), [&](error_code ec) { waited.set_value(ec); }));
  clock.advance(1ms); // due: queued on the pool behind the busy task
  wheel.reset();
  BOOST_TEST(cancelled.is_expired());
  BOOST_TEST(!cancelled.is_cancelled());
  BOOST_TEST(cancelled.cancel());
  BOOST_TEST(cancelled.is_cancelled());
  BOOST_TEST(!cancelled.is_expired());
  BOOST_TEST(!cancelled.cancel());
  BOOST_TEST(kept.is_expired());
  BOOST_TEST(!kept.is_cancelled());
  BOOST_TEST(linked.is_cancelled()); // the destructor stopped the wheel
  BOOST_TEST(!linked.is_expired());
  BOOST_TEST(!linked.cancel());
  sig.emit(asio::cancellation_type::terminal);
  busy.open();
  BOOST_TEST(ran.wait_for_at_least(1));
  BOOST_TEST((waited.get_future().get() == asio::error::operation_aborted));
  pool.submit([] {}).get(); // one thread: everything queued before has run
  BOOST_TEST(kept.is_expired());
  BOOST_TEST(!kept.cancel());
  BOOST_TEST(cancelled_runs.load() == 0);
}

// A wait handler that throws runs like any other work on the pool: the pool's handler
// is told and its worker goes on.
BOOST_AUTO_TEST_CASE(a_throwing_wait_handler_goes_to_the_pool_handler_and_the_worker_lives) {
  manual_clock clock;
  metronome::test::exception_log log;
  metronome::pool_options po;
  po.exception_handler = log.handler();
  scheduled_thread_pool pool(po);
  wheel_options o;
  o.time_source = &clock;
  wheel_timer wheel(pool, o);
  wheel.async_wait(1ms, [](error_code) { throw std::runtime_error("wait handler"); });
  clock.advance(1ms);
  BOOST_TEST(pool.submit([] { return 7; }).get() == 7); // after the handler: one thread
  BOOST_TEST(log.messages() == std::vector<std::string>{"wait handler"}, boost::test_tools::per_element());
}

// Without a wheel handler, a timeout that throws goes to the handler of the pool it runs
// on, whether the wheel was given the pool or the pool's executor.
BOOST_AUTO_TEST_CASE(a_throwing_timeout_goes_to_the_pool_handler_by_default) {
  manual_clock clock;
  metronome::test::exception_log log;
  metronome::pool_options po;
  po.exception_handler = log.handler();
  scheduled_thread_pool pool(po);
  wheel_options o;
  o.time_source = &clock;
  wheel_timer on_pool(pool, o), on_executor(pool.get_executor(), o);
  on_pool.schedule([] { throw std::runtime_error("on pool"); }, 1ms);
  clock.advance(1ms);
  pool.submit([] {}).get();
  on_executor.schedule([] { throw std::runtime_error("on executor"); }, 1ms);
  clock.advance(1ms);
  pool.submit([] {}).get();
  BOOST_TEST(log.messages() == (std::vector<std::string>{"on pool", "on executor"}), boost::test_tools::per_element());
}

// A wheel's own handler receives what its timeouts throw (the pool's is not told);
// a timeout that runs after its wheel is gone goes to the pool's.
BOOST_AUTO_TEST_CASE(a_throwing_timeout_goes_to_the_wheel_handler) {
  manual_clock clock;
  metronome::test::exception_log pool_log, wheel_log;
  metronome::test::gate busy;
  metronome::test::counter busy_started;
  metronome::pool_options po;
  po.exception_handler = pool_log.handler();
  scheduled_thread_pool pool(po);
  wheel_options o;
  o.time_source = &clock;
  o.exception_handler = wheel_log.handler();
  std::optional<wheel_timer> wheel(std::in_place, pool, o);
  wheel->schedule([] { throw std::runtime_error("timeout"); }, 1ms);
  clock.advance(1ms);
  pool.submit([] {}).get(); // one thread: the timeout ran before
  BOOST_REQUIRE(metronome::test::occupy_worker(pool, busy, busy_started));
  wheel->schedule([] { throw std::runtime_error("after the wheel"); }, 1ms);
  clock.advance(1ms); // queued behind the busy task
  wheel.reset();
  busy.open();
  pool.submit([] {}).get();
  BOOST_TEST(wheel_log.messages() == std::vector<std::string>{"timeout"}, boost::test_tools::per_element());
  BOOST_TEST(pool_log.messages() == std::vector<std::string>{"after the wheel"}, boost::test_tools::per_element());
}

// A wheel handler that throws is not silenced: its exception is printed, one line each
// time, and the wheel and its handler go on.
BOOST_AUTO_TEST_CASE(a_throwing_wheel_handler_is_printed_and_the_wheel_goes_on) {
  manual_clock clock;
  scheduled_thread_pool pool(1);
  std::atomic<int> handled{0};
  wheel_options o;
  o.time_source = &clock;
  o.exception_handler = [&](std::exception_ptr e) {
    if (e) handled.fetch_add(1);
    throw std::runtime_error("the handler failed");
  };
  wheel_timer wheel(pool, o);
  std::atomic<bool> later_ran{false};
  metronome::test::stderr_capture err;
  wheel.schedule([] { throw std::runtime_error("first"); }, 1ms);
  wheel.schedule([] { throw std::runtime_error("second"); }, 2ms);
  wheel.schedule([&] { later_ran = true; }, 3ms);
  clock.advance(3ms);
  pool.submit([] {}).get();
  const std::string printed = err.take();
  BOOST_TEST(handled.load() == 2);
  BOOST_TEST(later_ran.load());
  BOOST_TEST(printed == "metronome: unhandled exception in wheel_timer exception handler: the handler failed\n"
                        "metronome: unhandled exception in wheel_timer exception handler: the handler failed\n");
}

// The wait holds outstanding work on its handler's executor until the completion has
// been handed to it, and lets go right after (the pool has one thread: once a later
// task ran, the completion was handed on).
BOOST_AUTO_TEST_CASE(a_wait_holds_work_on_the_handler_executor_until_the_completion_is_handed_over) {
  manual_clock clock;
  scheduled_thread_pool pool(1);
  wheel_options o;
  o.time_source = &clock;
  wheel_timer wheel(pool, o);
  asio::io_context io;
  metronome::test::counting_executor::counts work;
  int held_while_running = -1;
  wheel.async_wait(1ms, asio::bind_executor(metronome::test::counting_executor(io, work),
                                            [&](error_code) { held_while_running = work.held.load(); }));
  BOOST_TEST(work.held.load() == 1);
  clock.advance(1ms);
  pool.submit([] {}).get();
  BOOST_TEST(work.held_when_handed.load() == 1); // held while the completion was handed to io
  BOOST_TEST(work.held.load() == 0);             // and let go right after, on the pool thread
  BOOST_TEST(work.released_elsewhere.load() == 1);
  io.run(); // io's own count of the queued completion keeps it running
  BOOST_TEST(held_while_running == 0);
}

BOOST_AUTO_TEST_CASE(wait_handlers_completing_onto_a_dying_io_context_leave_it_alone) {
  metronome::test::on_one_cpu one_cpu; // first: the pool's threads too
  scheduled_thread_pool pool(1);
  wheel_timer wheel(pool); // a zero delay goes straight to the pool
  metronome::test::complete_onto_dying_io_contexts(2000, [&](asio::io_context& io, std::function<void()> ran) {
    wheel.async_wait(0ms, asio::bind_executor(io, [ran](error_code) { ran(); }));
  });
}

BOOST_AUTO_TEST_SUITE_END()
