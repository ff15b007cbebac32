// Where a throwing handler's exception goes: Asio's rule off a metronome pool (it leaves
// the handler, so io_context::run() throws it, and the rest of the work waits for the
// next run()), the pool's exception handler on a pool. docs/semantics.md, "Exceptions".
#include <metronome/metronome.hpp>

#include "common/exception_log.hpp"
#include "common/poll_until.hpp"

#include METRONOME_NET_HEADER(bind_executor.hpp)
#include METRONOME_NET_HEADER(io_context.hpp)
#include METRONOME_NET_HEADER(post.hpp)
#include METRONOME_NET_HEADER(strand.hpp)
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace net = metronome::net;
using namespace std::chrono_literals;
using metronome::error_code;

namespace {

// Runs `io` until it returns; the message of what it threw, or "" when it returned.
std::string run_once(net::io_context& io) {
  try {
    io.run();
    return "";
  } catch (const std::runtime_error& e) {
    return e.what();
  }
}

} // namespace

BOOST_AUTO_TEST_SUITE(handler_exceptions)

// Two delays due together; the first handler throws. io.run() throws it, as for an Asio
// timer's handler, and the second handler runs on the next run(): none is lost.
BOOST_AUTO_TEST_CASE(an_async_delay_handler_over_an_io_context_throws_out_of_run) {
  net::io_context io;
  std::vector<std::string> ran;
  const auto due = metronome::clock::now() + 2ms;
  metronome::async_delay_until(io.get_executor(), due, [&](error_code) {
    ran.push_back("first");
    throw std::runtime_error("first handler");
  });
  metronome::async_delay_until(io.get_executor(), due, [&](error_code) { ran.push_back("second"); });
  BOOST_TEST(run_once(io) == "first handler");
  BOOST_TEST(ran == std::vector<std::string>{"first"}, boost::test_tools::per_element());
  io.restart();
  BOOST_TEST(run_once(io) == "");
  BOOST_TEST(ran == (std::vector<std::string>{"first", "second"}), boost::test_tools::per_element());
}

// The handler bound to a strand over the io_context: it runs inline inside the timing
// service's drive (dispatch through the strand), and still leaves io.run().
BOOST_AUTO_TEST_CASE(an_async_delay_handler_on_a_strand_over_an_io_context_throws_out_of_run) {
  net::io_context io;
  auto strand = net::make_strand(io);
  bool after = false;
  metronome::async_delay(io.get_executor(), 1ms,
                         net::bind_executor(strand, [](error_code) { throw std::runtime_error("on the strand"); }));
  metronome::async_delay(io.get_executor(), 3ms, net::bind_executor(strand, [&](error_code) { after = true; }));
  BOOST_TEST(run_once(io) == "on the strand");
  io.restart();
  BOOST_TEST(run_once(io) == "");
  BOOST_TEST(after);
}

// A serial executor over an io_context is a strand there: a task's exception leaves
// io.run(), and the tasks behind it run, in order, on the next run().
BOOST_AUTO_TEST_CASE(a_serial_task_over_an_io_context_throws_out_of_run_and_the_rest_keep_their_order) {
  net::io_context io;
  auto serial = metronome::make_serial_executor(io.get_executor());
  std::vector<int> order;
  for (int i = 0; i < 4; ++i)
    net::post(serial, [&order, i] {
      order.push_back(i);
      if (i == 1) throw std::runtime_error("task 1");
    });
  BOOST_TEST(run_once(io) == "task 1");
  BOOST_TEST(order == (std::vector<int>{0, 1}), boost::test_tools::per_element());
  io.restart();
  BOOST_TEST(run_once(io) == "");
  BOOST_TEST(order == (std::vector<int>{0, 1, 2, 3}), boost::test_tools::per_element());
}

// A serial executor's own exception handler still takes them: io.run() throws nothing.
BOOST_AUTO_TEST_CASE(a_serial_executor_s_exception_handler_takes_its_tasks_exceptions_over_an_io_context) {
  net::io_context io;
  metronome::test::exception_log log;
  metronome::serial_options o;
  o.exception_handler = log.handler();
  auto serial = metronome::make_serial_executor(io.get_executor(), o);
  net::post(serial, [] { throw std::runtime_error("handled"); });
  bool after = false;
  net::post(serial, [&] { after = true; });
  BOOST_TEST(run_once(io) == "");
  BOOST_TEST(after);
  BOOST_TEST(log.messages() == std::vector<std::string>{"handled"}, boost::test_tools::per_element());
}

// A wheel over an io_context: a throwing timeout leaves io.run(); the next one runs on
// the next run().
BOOST_AUTO_TEST_CASE(a_wheel_timeout_over_an_io_context_throws_out_of_run) {
  net::io_context io;
  bool second = false;
  {
    metronome::wheel_timer wheel(io.get_executor());
    wheel.schedule([] { throw std::runtime_error("timeout"); }, 1ms);
    wheel.schedule([&] { second = true; }, 1ms);
    BOOST_TEST(run_once(io) == "timeout");
    io.restart();
    while (!second && io.run_one() != 0) {
    }
  }
  BOOST_TEST(second);
}

// On a metronome pool the pool's rule stays: its exception handler, the worker goes on.
BOOST_AUTO_TEST_CASE(on_a_pool_a_throwing_handler_still_goes_to_the_pool_s_exception_handler) {
  metronome::test::exception_log log;
  metronome::pool_options o;
  o.exception_handler = log.handler();
  metronome::scheduled_thread_pool pool(o);
  metronome::async_delay(pool.get_executor(), 1ms, [](error_code) { throw std::runtime_error("on the pool"); });
  auto serial = metronome::make_serial_executor(pool);
  net::post(serial, [] { throw std::runtime_error("serial on the pool"); });
  BOOST_TEST(metronome::test::poll_until([&] { return log.count() == 2; }));
  BOOST_TEST(pool.submit([] { return 7; }).get() == 7);
}

BOOST_AUTO_TEST_SUITE_END()
