// Exceptions from periodic tasks (stop, continue_, the default handler, over a serial
// executor) and from the pool's exception handler itself (one that throws, one that posts
// to its shut-down pool). One-shot tasks and the basic periodic rules are in basics.cpp.
#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/manual_clock.hpp>
#include <metronome/serial_executor.hpp>

#include "common/exception_log.hpp"
#include "common/manual_pool.hpp"
#include "common/poll_until.hpp"

#include <metronome/detail/asio.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <unistd.h>

using namespace std::chrono_literals;
using metronome::manual_clock;
using metronome::on_exception;
using metronome::periodic_options;
using metronome::pool_options;
using metronome::scheduled_thread_pool;
using metronome::test::on_clock;
using metronome::test::poll_until;
using metronome::test::ready;
using reported = metronome::test::exception_log;

BOOST_AUTO_TEST_SUITE(pool_exceptions_suite)

BOOST_AUTO_TEST_CASE(a_throwing_periodic_task_stops_and_the_handler_receives_its_exception) {
  reported r;
  pool_options o;
  o.exception_handler = r.handler();
  scheduled_thread_pool pool(o);
  auto h = pool.schedule_at_fixed_rate([] { throw std::runtime_error("x"); }, 0ms, 10ms);
  BOOST_REQUIRE(ready(h.wait_for(20s)));
  BOOST_CHECK_THROW(h.get(), std::runtime_error);
  BOOST_CHECK(!h.is_cancelled());
  pool.submit([] {}).wait(); // the worker lives on
  BOOST_CHECK_EQUAL(r.count(), 1u);
  BOOST_CHECK(r.all_are("x"));
}

BOOST_AUTO_TEST_CASE(a_throwing_periodic_task_under_continue_reports_every_run) {
  reported r;
  manual_clock clk;
  pool_options o = on_clock(clk);
  o.exception_handler = r.handler();
  scheduled_thread_pool pool(o);
  std::atomic<int> runs{0};
  auto h = pool.schedule_at_fixed_rate(
      [&] {
        ++runs;
        throw std::runtime_error("y");
      },
      0ms, 10ms, periodic_options{metronome::missed_tick::burst, on_exception::continue_});
  for (int i = 1; i <= 3; ++i) {
    BOOST_REQUIRE(poll_until([&] { return runs.load() == i && r.count() == std::size_t(i); }));
    clk.advance(10ms);
  }
  BOOST_CHECK(h.cancel());
  BOOST_CHECK(r.all_are("y"));
}

BOOST_AUTO_TEST_CASE(a_throwing_periodic_task_with_the_default_handler_does_not_crash) {
  scheduled_thread_pool pool(1);
  auto h = pool.schedule_with_fixed_delay([] { throw std::runtime_error("printed, not fatal"); }, 0ms, 1ms);
  BOOST_REQUIRE(ready(h.wait_for(20s)));
  BOOST_CHECK_THROW(h.get(), std::runtime_error);
  BOOST_CHECK_EQUAL(pool.submit([] { return 7; }).get(), 7);
}

BOOST_AUTO_TEST_CASE(a_throwing_periodic_serial_task_reaches_the_pool_handler) {
  reported r;
  pool_options o;
  o.threads = 2;
  o.exception_handler = r.handler();
  scheduled_thread_pool pool(o);
  auto serial = metronome::make_serial_executor(pool);
  auto h = serial.schedule_at_fixed_rate([] { throw std::runtime_error("z"); }, 0ms, 5ms);
  BOOST_REQUIRE(ready(h.wait_for(20s)));
  BOOST_CHECK_THROW(h.get(), std::runtime_error);
  BOOST_CHECK_EQUAL(r.count(), 1u);
  BOOST_CHECK(r.all_are("z"));
}

BOOST_AUTO_TEST_CASE(an_exception_handler_that_throws_is_reported_on_stderr_and_the_worker_lives) {
  pool_options o;
  o.exception_handler = [](std::exception_ptr) { throw std::logic_error("handler broke"); };
  scheduled_thread_pool pool(o);
  // stderr to a file for the duration.
  std::FILE* tmp = std::tmpfile();
  BOOST_REQUIRE(tmp);
  std::fflush(stderr);
  const int saved = ::dup(2);
  ::dup2(::fileno(tmp), 2);
  metronome::net::post(pool, [] { throw std::runtime_error("task broke"); });
  pool.submit([] {}).wait();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::rewind(tmp);
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, tmp);
  std::fclose(tmp);
  const std::string text(buf, n);
  BOOST_TEST_INFO("stderr: " << text);
  BOOST_CHECK(text.find("handler broke") != std::string::npos);
  BOOST_CHECK_EQUAL(pool.submit([] { return 1; }).get(), 1);
}

// An exception handler that logs by posting to its own pool: after shutdown that post is
// dropped and reported - to the handler, which posts again... The stack overflowed
// (adversary pass 7: SIGSEGV every run). Eight handlers deep on one thread, a report goes
// to stderr instead.
BOOST_AUTO_TEST_CASE(an_exception_handler_that_posts_to_its_shut_down_pool_does_not_recurse_for_ever) {
  std::atomic<int> reports{0};
  scheduled_thread_pool* self = nullptr;
  metronome::pool_options o;
  o.threads = 1;
  o.exception_handler = [&](std::exception_ptr) {
    ++reports;
    metronome::net::post(*self, [] {}); // "log on the pool"
  };
  scheduled_thread_pool pool(o);
  self = &pool;
  pool.shutdown();
  metronome::net::post(pool, [] {});
  BOOST_CHECK_EQUAL(reports.load(), 8);
  BOOST_CHECK_EQUAL(pool.stats().rejected, 9u); // every drop counted, the last one printed
  metronome::net::post(pool, [] {}); // and again: the depth went back to 0
  BOOST_CHECK_EQUAL(reports.load(), 16);
}

BOOST_AUTO_TEST_SUITE_END()
