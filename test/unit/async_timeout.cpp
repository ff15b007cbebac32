#include <metronome/async_timeout.hpp>

#include <metronome/async_delay.hpp>
#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include "common/latch_task.hpp"
#include "common/manual_pool.hpp"
#include "common/poll_until.hpp"

#include <metronome/detail/asio.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <future>
#include <stdexcept>
#include <string>

namespace net = metronome::net;
using metronome::detail::as_tuple; // net::experimental::as_tuple in Asio 1.22
using metronome::detail::deferred; // net::experimental::deferred in Asio 1.22
using namespace std::chrono_literals;
using metronome::error_code;
using metronome::async_delay;
using metronome::async_timeout;
using metronome::manual_clock;
using metronome::scheduled_thread_pool;
using metronome::test::on_clock;
using metronome::test::poll_until;

namespace {

struct fixture {
  manual_clock c;
  scheduled_thread_pool pool{on_clock(c)}; // one thread: the coroutines' context is serialised
  scheduled_thread_pool::executor_type ex = pool.get_executor();
  std::atomic<bool> cleaning{false};
  std::atomic<bool> cleaned_up{false};

  // Works for `took`, then returns `value`. Cancelled, it cleans up for 3 ms first.
  net::awaitable<int> work(metronome::clock::duration took, int value) {
    std::exception_ptr failed;
    try {
      co_await async_delay(ex, took, net::use_awaitable);
    } catch (const metronome::system_error&) {
      failed = std::current_exception();
    }
    if (failed) { // no co_await inside a handler
      co_await net::this_coro::reset_cancellation_state();
      cleaning = true; // its own wait was cancelled and left the queue
      co_await async_delay(ex, 3ms, net::use_awaitable);
      cleaned_up = true;
      std::rethrow_exception(failed);
    }
    co_return value;
  }
  net::awaitable<void> work_void(metronome::clock::duration took) { co_await work(took, 0); }

  // What the exception is: "timed_out", "aborted", or its what().
  static std::string what(const std::exception_ptr& e) {
    if (!e) return "none";
    try {
      std::rethrow_exception(e);
    } catch (const metronome::system_error& x) {
      if (x.code() == net::error::timed_out) return "timed_out";
      if (x.code() == net::error::operation_aborted) return "aborted";
      return x.what();
    } catch (const std::exception& x) {
      return x.what();
    }
  }
  template <class F>
  static bool not_ready(F& f) {
    return f.wait_for(20ms) == std::future_status::timeout;
  }
};

} // namespace

BOOST_FIXTURE_TEST_SUITE(async_timeout_suite, fixture)

BOOST_AUTO_TEST_CASE(the_coroutines_value_when_it_finishes_first) {
  auto f = async_timeout(ex, 10ms, work(5ms, 7), net::use_future);
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 2; })); // its wait, the deadline
  c.advance(5ms);
  // At once: not at the deadline (which the clock never reaches here).
  BOOST_TEST_REQUIRE(poll_until([&] { return f.wait_for(0s) == std::future_status::ready; }, 5s));
  BOOST_TEST(f.get() == 7);
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 0; })); // the deadline left at once
  BOOST_TEST(!cleaned_up.load());
}

// On time-out the coroutine is cancelled and the operation completes only after it
// has finished (its 3 ms clean-up included), with timed_out.
BOOST_AUTO_TEST_CASE(the_deadline_cancels_the_coroutine_and_waits_for_it_to_finish) {
  std::promise<std::pair<std::string, bool>> p;
  async_timeout(pool, 10ms, work(1h, 7), [&](const std::exception_ptr& e, int v) {
    p.set_value({what(e) + (v == 0 ? "" : " with a value"), cleaned_up.load()});
  });
  auto f = p.get_future();
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 2; }));
  c.advance(10ms);
  BOOST_TEST(poll_until([&] { return cleaning && pool.stats().delayed_queued == 1; })); // the clean-up's wait
  BOOST_TEST(not_ready(f));
  c.advance(3ms);
  auto [outcome, was_clean] = f.get();
  BOOST_TEST(outcome == "timed_out");
  BOOST_TEST(was_clean); // the coroutine finished before the handler ran
}

// Its exception propagates at once, without waiting for the deadline.
BOOST_AUTO_TEST_CASE(the_coroutines_exception_propagates_at_once) {
  auto f = async_timeout(
      ex, 1h,
      [](scheduled_thread_pool::executor_type e) -> net::awaitable<int> {
        co_await async_delay(e, 1ms, net::use_awaitable);
        throw std::runtime_error("broken");
      }(ex),
      net::use_future);
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 2; }));
  c.advance(1ms);
  BOOST_TEST_REQUIRE(poll_until([&] { return f.wait_for(0s) == std::future_status::ready; }, 5s));
  try {
    f.get();
    BOOST_FAIL("expected the coroutine's exception");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()) == "broken");
  }
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 0; }));
}

BOOST_AUTO_TEST_CASE(an_awaitable_void_in_time_and_timed_out) {
  std::promise<std::string> in_time;
  async_timeout(ex, 10ms, work_void(5ms), [&](const std::exception_ptr& e) { in_time.set_value(what(e)); });
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 2; }));
  c.advance(5ms);
  BOOST_TEST(in_time.get_future().get() == "none");

  std::promise<std::string> late;
  async_timeout(ex, 10ms, work_void(20ms), [&](const std::exception_ptr& e) { late.set_value(what(e)); });
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 2; }));
  c.advance(10ms);
  BOOST_TEST(poll_until([&] { return cleaning && pool.stats().delayed_queued == 1; }));
  c.advance(3ms);
  BOOST_TEST(late.get_future().get() == "timed_out");
}

BOOST_AUTO_TEST_CASE(in_a_coroutine_with_use_awaitable_and_as_tuple) {
  c.set_auto_advance(true);
  std::promise<std::string> p;
  net::co_spawn(
      pool,
      [&]() -> net::awaitable<void> {
        std::string out = std::to_string(co_await async_timeout(ex, 1s, work(10ms, 7), net::use_awaitable));
        try {
          co_await async_timeout(ex, 1s, work(1min, 8), net::use_awaitable);
        } catch (const metronome::system_error& e) {
          out += e.code() == net::error::timed_out ? " timed_out" : " other";
        }
        auto [e, v] = co_await async_timeout(ex, 1s, work(2s, 9), as_tuple(net::use_awaitable));
        out += " " + what(e) + " " + std::to_string(v);
        p.set_value(out);
      },
      net::detached);
  BOOST_TEST(p.get_future().get() == "7 timed_out timed_out 0");
}

// With no token the target's executor's default is used, as async_delay does: here an
// executor whose default is use_awaitable.
BOOST_AUTO_TEST_CASE(the_token_defaults_to_the_target_executor_s) {
  c.set_auto_advance(true);
  const net::use_awaitable_t<>::executor_with_default<scheduled_thread_pool::executor_type> awaiting(ex);
  std::promise<std::string> p;
  net::co_spawn(
      pool,
      [&]() -> net::awaitable<void> {
        std::string out = std::to_string(co_await async_timeout(awaiting, 1s, work(10ms, 7)));
        try {
          co_await async_timeout(awaiting, 1s, work(1min, 8));
        } catch (const metronome::system_error& e) {
          out += e.code() == net::error::timed_out ? " timed_out" : " other";
        }
        p.set_value(out);
      },
      net::detached);
  BOOST_TEST(p.get_future().get() == "7 timed_out");
}

// With deferred the deadline counts from the launch.
BOOST_AUTO_TEST_CASE(with_deferred_the_deadline_counts_from_the_launch) {
  auto op = async_timeout(ex, 10ms, work(15ms, 7), deferred);
  c.advance(1h);
  BOOST_TEST(pool.stats().delayed_queued == 0u);
  std::promise<int> p;
  std::move(op)([&](const std::exception_ptr& e, int v) { p.set_value(e ? -1 : v); });
  auto f = p.get_future();
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 2; }));
  c.advance(9ms);
  BOOST_TEST(not_ready(f));
  c.advance(1ms);
  BOOST_TEST(poll_until([&] { return cleaning && pool.stats().delayed_queued == 1; }));
  c.advance(3ms);
  BOOST_TEST(f.get() == -1);
}

// Cancelling the whole operation cancels the coroutine (not a time-out): its outcome.
BOOST_AUTO_TEST_CASE(per_operation_cancellation_delivers_the_coroutines_outcome) {
  net::cancellation_signal sig;
  std::promise<std::string> p;
  async_timeout(ex, 1h, work(1h, 7), net::bind_cancellation_slot(sig.slot(), [&](const std::exception_ptr& e, int) {
                  p.set_value(what(e));
                }));
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 2; }));
  net::post(pool, [&] { sig.emit(net::cancellation_type::terminal); });
  BOOST_TEST(
      poll_until([&] { return cleaning && pool.stats().delayed_queued == 1; })); // the clean-up; the deadline left
  c.advance(3ms);
  BOOST_TEST(p.get_future().get() == "aborted");
  BOOST_TEST(cleaned_up.load());
}

BOOST_AUTO_TEST_CASE(a_deadline_of_zero_times_out_work_that_suspends) {
  c.set_auto_advance(true);
  for (auto timeout : {-1s, 0s}) {
    std::promise<std::pair<std::string, int>> p;
    async_timeout(ex, timeout, work(1min, 7), [&](const std::exception_ptr& e, int v) { p.set_value({what(e), v}); });
    auto [e, v] = p.get_future().get();
    BOOST_TEST(e == "timed_out");
    BOOST_TEST(v == 0);
  }
}

// Tokio's timeout(Duration::ZERO, f) polls f first: work that finishes without suspending
// is not timed out, whichever of the two completions the executor runs first (on the
// fixture's one-thread pool the deadline's ran first, and the value was lost). Its
// exception still comes through.
BOOST_AUTO_TEST_CASE(a_deadline_of_zero_delivers_the_value_of_work_that_never_suspends) {
  c.set_auto_advance(true);
  auto immediate = [](int v) -> net::awaitable<int> { co_return v; };
  auto throws = []() -> net::awaitable<int> {
    throw std::runtime_error("boom");
    co_return 0;
  };
  // Started on the pool's thread, as an operation cancelled from within must be (Asio's
  // parallel_group emits from the thread that launches it when an operation completes
  // during the launch).
  auto rounds = [&]() -> net::awaitable<std::pair<int, std::string>> {
    int delivered = 0;
    for (int round = 0; round < 200; ++round) {
      const auto timeout = round % 2 ? metronome::clock::duration(0s) : metronome::clock::duration(-5ms);
      delivered += co_await async_timeout(ex, timeout, immediate(round), net::use_awaitable) == round;
    }
    std::string thrown;
    try {
      co_await async_timeout(ex, 0s, throws(), net::use_awaitable);
    } catch (const std::runtime_error& e) {
      thrown = e.what();
    }
    co_return std::make_pair(delivered, thrown);
  };
  auto [delivered, thrown] = net::co_spawn(ex, rounds(), net::use_future).get();
  BOOST_TEST(delivered == 200);
  BOOST_TEST(thrown == "boom");

  // Started from outside while the pool's thread is busy (so nothing completes during
  // the launch): both completions queue, and the deadline's ran first (the value was lost).
  for (int round = 0; round < 20; ++round) {
    metronome::test::gate release;
    metronome::test::counter entered;
    BOOST_REQUIRE(metronome::test::occupy_worker(pool, release, entered));
    auto f = async_timeout(ex, 0s, immediate(round), net::use_future);
    release.open();
    BOOST_REQUIRE_EQUAL(f.get(), round);
  }
}

BOOST_AUTO_TEST_CASE(an_empty_awaitable_is_refused_at_the_call) {
  BOOST_CHECK_THROW(async_timeout(ex, 1s, net::awaitable<int>(), net::detached), std::invalid_argument);
  auto moved = work(1ms, 1);
  auto kept = std::move(moved);
  BOOST_CHECK_THROW(async_timeout(ex, 1s, std::move(moved), net::detached), std::invalid_argument); // NOLINT
  BOOST_TEST(pool.stats().delayed_queued == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
