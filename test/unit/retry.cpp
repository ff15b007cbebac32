#include <metronome/retry.hpp>

#include <metronome/async_delay.hpp>
#include <metronome/backoff.hpp>
#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include "common/exception_log.hpp"
#include "common/manual_pool.hpp"
#include "common/poll_until.hpp"

#include <metronome/detail/asio.hpp>
#if !defined(METRONOME_ASIO_NO_ANY_COMPLETION_HANDLER)
#include METRONOME_ASIO_HEADER(any_completion_handler.hpp)
#endif
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

namespace net = metronome::net;
using metronome::detail::as_tuple; // net::experimental::as_tuple in Asio 1.22
using metronome::detail::deferred; // net::experimental::deferred in Asio 1.22
using namespace std::chrono_literals;
using metronome::error_code;
using metronome::async_retry;
using metronome::backoff;
using metronome::manual_clock;
using metronome::scheduled_thread_pool;
using metronome::test::on_clock;
using metronome::test::poll_until;
using time_point = metronome::clock::time_point;

namespace {

// Exact pauses: 100 ms, 200 ms, 400 ms... (no jitter), at most `retries` of them.
backoff exact(std::size_t retries) {
  return backoff({.initial = 100ms, .multiplier = 2.0, .cap = 10s, .full_jitter = false, .max_retries = retries});
}

// A scripted operation: attempt n (from 0) takes `took` of the pool's time, then
// completes with outcome(n) and n. It is cancellable (its wait sees the slot).
struct scripted {
  scripted(scheduled_thread_pool::executor_type e, manual_clock* c) : ex(std::move(e)), clock(c) {}
  scheduled_thread_pool::executor_type ex;
  manual_clock* clock;
  std::function<error_code(int)> outcome;
  metronome::clock::duration took = 10ms;
  std::mutex m;
  std::vector<time_point> starts;
  int finished = 0;

  template <class Token>
  auto operator()(Token&& token) {
    int n = 0;
    {
      std::lock_guard lk(m);
      n = static_cast<int>(starts.size());
      starts.push_back(clock->now());
    }
    return net::async_compose<Token, void(error_code, int)>(
        [this, n, waiting = false](auto& self, error_code ec = {}) mutable {
          if (!waiting) {
            waiting = true;
            metronome::async_delay(ex, took, std::move(self));
            return;
          }
          {
            std::lock_guard lk(m);
            ++finished;
          }
          if (ec) return self.complete(ec, n);
          self.complete(outcome(n), n);
        },
        token, ex);
  }
  // The callable handed to async_retry (the script stays here, at one address).
  auto op() {
    return [this](auto&& token) { return (*this)(std::forward<decltype(token)>(token)); };
  }
  std::vector<time_point> started() {
    std::lock_guard lk(m);
    return starts;
  }
  int done() {
    std::lock_guard lk(m);
    return finished;
  }
};

const error_code refused(net::error::connection_refused);
const error_code unreachable(net::error::host_unreachable);

struct fixture {
  manual_clock c;
  scheduled_thread_pool pool{on_clock(c)};
  time_point t0 = c.now();
  scripted s{pool.get_executor(), &c};
};

// Counts what it allocates, and what is still allocated.
template <class T>
struct counting_alloc {
  using value_type = T;
  std::atomic<int>* made;
  std::atomic<int>* live;
  counting_alloc(std::atomic<int>* m, std::atomic<int>* l) noexcept : made(m), live(l) {}
  template <class U>
  counting_alloc(const counting_alloc<U>& o) noexcept : made(o.made), live(o.live) {}
  T* allocate(std::size_t k) {
    ++*made;
    ++*live;
    return std::allocator<T>().allocate(k);
  }
  void deallocate(T* q, std::size_t k) noexcept {
    --*live;
    std::allocator<T>().deallocate(q, k);
  }
  template <class U>
  bool operator==(const counting_alloc<U>& o) const noexcept {
    return live == o.live;
  }
};

struct result {
  error_code ec;
  int n = -1;
};

} // namespace

BOOST_FIXTURE_TEST_SUITE(retry_suite, fixture)

// The first attempt at once; after each failure the backoff's pause, on the pool's clock.
BOOST_AUTO_TEST_CASE(retries_after_each_backoff_pause_until_an_attempt_succeeds) {
  s.outcome = [](int n) { return n < 2 ? refused : error_code(); };
  c.set_auto_advance(true);
  std::promise<result> p;
  async_retry(pool, exact(5), s.op(), [&](error_code ec, int n) { p.set_value({ec, n}); });
  const result r = p.get_future().get();
  BOOST_TEST(!r.ec);
  BOOST_TEST(r.n == 2);
  // attempt 0 at t0, fails at +10; pause 100; attempt 1 at +110, fails at +120; pause 200.
  BOOST_TEST((s.started() == std::vector<time_point>{t0, t0 + 110ms, t0 + 320ms}));
  BOOST_TEST(pool.stats().delayed_queued == 0u);
}

// With no token the target's executor's default is used, as async_delay does: here an
// executor whose default is use_awaitable (an error throws, the value is returned).
BOOST_AUTO_TEST_CASE(the_token_defaults_to_the_target_executor_s) {
  s.outcome = [](int n) { return n < 1 ? refused : error_code(); };
  c.set_auto_advance(true);
  const net::use_awaitable_t<>::executor_with_default<scheduled_thread_pool::executor_type> awaiting(
      pool.get_executor());
  auto f = net::co_spawn(
      pool, [&]() -> net::awaitable<int> { co_return co_await async_retry(awaiting, exact(5), s.op()); },
      net::use_future);
  BOOST_TEST(f.get() == 1); // the second attempt's
  BOOST_TEST(s.started().size() == 2u);
}

BOOST_AUTO_TEST_CASE(attempts_run_out_with_the_last_attempts_error_and_values) {
  s.outcome = [](int n) { return n < 2 ? refused : unreachable; };
  c.set_auto_advance(true);
  std::promise<result> p;
  async_retry(pool.get_executor(), exact(2), s.op(), [&](error_code ec, int n) { p.set_value({ec, n}); });
  const result r = p.get_future().get();
  BOOST_TEST((r.ec == unreachable)); // the third attempt's: 2 retries, 3 attempts
  BOOST_TEST(r.n == 2);
  BOOST_TEST(s.started().size() == 3u);
  BOOST_TEST((s.started().back() == t0 + 320ms));
}

BOOST_AUTO_TEST_CASE(the_predicate_stops_at_an_error_not_worth_retrying) {
  s.outcome = [](int n) { return n < 2 ? refused : unreachable; };
  c.set_auto_advance(true);
  std::promise<result> p;
  std::vector<error_code> asked;
  async_retry(
      pool, exact(10), s.op(),
      [&](const error_code& e) {
        asked.push_back(e);
        return e == refused;
      },
      [&](error_code ec, int n) {
        p.set_value({ec, n});
      });
  const result r = p.get_future().get();
  BOOST_TEST((r.ec == unreachable));
  BOOST_TEST(r.n == 2);
  BOOST_TEST((asked == std::vector<error_code>{refused, refused, unreachable}));
  BOOST_TEST(pool.stats().delayed_queued == 0u);
}

// A plain function as the predicate (g++ once warned inside the library, -Wnonnull-compare,
// comparing it with nullptr; this file is built with that warning as an error on g++).
bool only_refused(const error_code& e) { return e == refused; }

BOOST_AUTO_TEST_CASE(a_plain_function_is_a_predicate) {
  s.outcome = [](int n) { return n < 2 ? refused : unreachable; };
  c.set_auto_advance(true);
  std::promise<result> p;
  async_retry(pool, exact(10), s.op(), only_refused, [&](error_code ec, int n) { p.set_value({ec, n}); });
  const result r = p.get_future().get();
  BOOST_TEST((r.ec == unreachable));
  BOOST_TEST(r.n == 2);
  BOOST_TEST(s.started().size() == 3u);
}

BOOST_AUTO_TEST_CASE(no_pause_is_asked_for_after_a_success) {
  s.outcome = [](int) { return error_code(); };
  c.set_auto_advance(true);
  auto f = async_retry(pool, exact(3), s.op(), net::use_future);
  BOOST_TEST(f.get() == 0);
  BOOST_TEST(s.started().size() == 1u);
}

// Per-operation cancellation during an attempt reaches the attempt's own operation; its
// result is delivered and nothing is retried, though the predicate would retry it.
BOOST_AUTO_TEST_CASE(cancellation_reaches_the_running_attempt) {
  s.outcome = [](int) { return refused; };
  s.took = 1h;
  net::cancellation_signal sig;
  std::promise<result> p;
  async_retry(pool, exact(5), s.op(), net::bind_cancellation_slot(sig.slot(), [&](error_code ec, int n) {
                p.set_value({ec, n});
              }));
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 1; })); // the attempt's wait
  net::post(pool, [&] { sig.emit(net::cancellation_type::terminal); });   // from the handler's executor
  auto f = p.get_future();
  // Not retried: no pause queued (a retry would wait 100 ms and never complete here).
  BOOST_TEST_REQUIRE(poll_until([&] { return f.wait_for(0s) == std::future_status::ready; }, 5s));
  const result r = f.get();
  BOOST_TEST((r.ec == net::error::operation_aborted));
  BOOST_TEST(r.n == 0);
  BOOST_TEST(s.started().size() == 1u);
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 0; }));
}

// ...and during a pause it ends the pause: operation_aborted, with the values of the
// attempt before it, and no further attempt.
BOOST_AUTO_TEST_CASE(cancellation_reaches_the_pause) {
  s.outcome = [](int) { return refused; };
  net::cancellation_signal sig;
  std::promise<result> p;
  async_retry(pool, exact(5), s.op(), net::bind_cancellation_slot(sig.slot(), [&](error_code ec, int n) {
                p.set_value({ec, n});
              }));
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 1; }));
  c.advance(10ms); // the attempt fails; the 100 ms pause starts
  BOOST_TEST(poll_until([&] { return s.done() == 1 && pool.stats().delayed_queued == 1; }));
  c.advance(50ms);
  net::post(pool, [&] { sig.emit(net::cancellation_type::terminal); });
  const result r = p.get_future().get();
  BOOST_TEST((r.ec == net::error::operation_aborted));
  BOOST_TEST(r.n == 0);
  c.advance(1h);
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 0; }));
  BOOST_TEST(s.started().size() == 1u);
}

// A pause its timing pool aborts at shutdown ends the retry the same way.
BOOST_AUTO_TEST_CASE(a_pause_aborted_by_the_pools_shutdown_ends_the_retry) {
  s.outcome = [](int) { return refused; };
  std::promise<result> p;
  async_retry(pool, exact(5), s.op(), [&](error_code ec, int n) { p.set_value({ec, n}); });
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 1; }));
  c.advance(10ms);
  BOOST_TEST(poll_until([&] { return s.done() == 1 && pool.stats().delayed_queued == 1; }));
  pool.shutdown();
  const result r = p.get_future().get();
  BOOST_TEST((r.ec == net::error::operation_aborted));
  BOOST_TEST(s.started().size() == 1u);
}

BOOST_AUTO_TEST_CASE(with_use_awaitable_and_as_tuple_in_a_coroutine) {
  s.outcome = [](int n) { return n < 1 ? refused : error_code(); };
  c.set_auto_advance(true);
  std::promise<std::pair<int, error_code>> p;
  net::co_spawn(
      pool,
      [&]() -> net::awaitable<void> {
        const int n = co_await async_retry(pool, exact(3), s.op(), net::use_awaitable);
        auto [ec, m] = co_await async_retry(pool, exact(0), s.op(), as_tuple(net::use_awaitable));
        p.set_value({n * 10 + m, ec});
      },
      net::detached);
  auto [nm, ec] = p.get_future().get();
  BOOST_TEST(nm == 12); // the first retry succeeded at attempt 1; the second at once (attempt 2)
  BOOST_TEST(!ec);
}

// use_awaitable rethrows the last error (as system_error) when attempts run out.
BOOST_AUTO_TEST_CASE(with_use_awaitable_the_last_error_is_thrown) {
  s.outcome = [](int) { return refused; };
  c.set_auto_advance(true);
  std::promise<error_code> p;
  net::co_spawn(
      pool,
      [&]() -> net::awaitable<void> {
        try {
          co_await async_retry(pool, exact(1), s.op(), net::use_awaitable);
          p.set_value({});
        } catch (const metronome::system_error& e) {
          p.set_value(e.code());
        }
      },
      net::detached);
  BOOST_TEST((p.get_future().get() == refused));
  BOOST_TEST(s.started().size() == 2u);
}

// With deferred, nothing starts until the launch; the pauses count from there.
BOOST_AUTO_TEST_CASE(with_deferred_the_first_attempt_starts_at_the_launch) {
  s.outcome = [](int n) { return n < 1 ? refused : error_code(); };
  auto op = async_retry(pool, exact(3), s.op(), deferred);
  c.advance(1s);
  BOOST_TEST(s.started().empty());
  const time_point launched = c.now();
  c.set_auto_advance(true);
  std::promise<result> p;
  std::move(op)([&](error_code ec, int n) { p.set_value({ec, n}); });
  const result r = p.get_future().get();
  BOOST_TEST(!r.ec);
  BOOST_TEST((s.started() == std::vector<time_point>{launched, launched + 110ms}));
}

// A coroutine as the operation: its exception is the error; the last one is delivered.
BOOST_AUTO_TEST_CASE(a_coroutine_attempt_retried_on_its_exceptions) {
  c.set_auto_advance(true);
  std::atomic<int> calls{0};
  auto ex = pool.get_executor();
  auto attempt = [&, ex](auto&& token) {
    return net::co_spawn(
        ex,
        [&, ex]() -> net::awaitable<int> {
          const int n = calls++;
          co_await metronome::async_delay(ex, 5ms, net::use_awaitable);
          if (n < 2) throw std::runtime_error("flaky " + std::to_string(n));
          co_return 42;
        },
        std::forward<decltype(token)>(token));
  };
  BOOST_TEST(async_retry(pool, exact(5), attempt, net::use_future).get() == 42);
  BOOST_TEST(calls.load() == 3);

  calls = 0;
  std::promise<std::string> p;
  async_retry(pool, exact(1), attempt, [&](const std::exception_ptr& e, int) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      p.set_value(x.what());
    }
  });
  BOOST_TEST(p.get_future().get() == "flaky 1"); // two attempts, the last one's exception
}

// An operation that takes a std::size_t before its token gets the attempt's number, 1
// for the first; its signature is probed as for the one-argument form.
BOOST_AUTO_TEST_CASE(an_operation_that_takes_the_attempt_number_gets_it) {
  s.outcome = [](int n) { return n < 2 ? refused : error_code(); };
  c.set_auto_advance(true);
  std::vector<std::size_t> numbers; // (attempts run one at a time)
  auto numbered = [&, plain = s.op()](std::size_t attempt, auto&& token) mutable {
    numbers.push_back(attempt);
    return plain(std::forward<decltype(token)>(token));
  };
  std::promise<result> p;
  async_retry(pool, exact(5), numbered, [&](error_code ec, int n) { p.set_value({ec, n}); });
  const result r = p.get_future().get();
  BOOST_TEST(!r.ec);
  BOOST_TEST((numbers == std::vector<std::size_t>{1, 2, 3}));

  // A coroutine attempt, the signature probed through co_spawn.
  auto ex = pool.get_executor();
  auto coro = [ex](std::size_t attempt, auto&& token) {
    return net::co_spawn(
        ex,
        [ex, attempt]() -> net::awaitable<std::size_t> {
          co_await metronome::async_delay(ex, 5ms, net::use_awaitable);
          if (attempt < 3) throw std::runtime_error("flaky");
          co_return attempt;
        },
        std::forward<decltype(token)>(token));
  };
  BOOST_TEST(async_retry(pool, exact(5), coro, net::use_future).get() == 3u);
}

// An attempt after the first that throws before it starts ends the retry: with that
// exception, when the signature's error is an exception_ptr (it used to hang: the
// exception left the pause's completion and the retry's handler was lost).
BOOST_AUTO_TEST_CASE(a_later_attempt_that_throws_ends_the_retry_with_its_exception) {
  c.set_auto_advance(true);
  std::atomic<int> calls{0};
  auto ex = pool.get_executor();
  auto attempt = [&, ex](auto&& token) {
    if (calls++ == 1) throw std::runtime_error("attempt 2 cannot start");
    return net::co_spawn(
        ex, []() -> net::awaitable<int> { throw std::runtime_error("flaky"); co_return 0; },
        std::forward<decltype(token)>(token));
  };
  auto f = async_retry(pool, exact(5), attempt, net::use_future);
  BOOST_REQUIRE(f.wait_for(20s) == std::future_status::ready);
  BOOST_CHECK_EXCEPTION(f.get(), std::runtime_error,
                        [](const std::runtime_error& e) { return std::string(e.what()) == "attempt 2 cannot start"; });
  BOOST_TEST(calls.load() == 2);
}

// With an error_code signature the exception cannot be delivered: it leaves the pause's
// completion as any handler's exception does (here: to the pool's exception handler),
// and the retry's handler is destroyed unrun - nothing hangs on to it.
BOOST_AUTO_TEST_CASE(a_later_attempt_that_throws_with_an_error_code_signature_leaves_its_handler) {
  metronome::test::exception_log log;
  metronome::pool_options o;
  o.exception_handler = log.handler();
  scheduled_thread_pool own(o);
  auto ex = own.get_executor();
  std::atomic<int> calls{0};
  auto attempt = [&, ex](auto&& token) {
    if (calls++ == 1) throw std::runtime_error("attempt 2 cannot start");
    return net::async_compose<decltype(token), void(error_code)>(
        [](auto& self) { self.complete(error_code(net::error::connection_refused)); }, token, ex);
  };
  auto token = std::make_shared<int>(0);
  std::atomic<bool> called{false};
  async_retry(own, backoff({.initial = 1ms, .full_jitter = false, .max_retries = 5}), attempt,
              [&called, token](error_code) { called = true; });
  // The handler is destroyed while the exception unwinds out of the pause's completion;
  // the pool's exception handler is told after that: wait for both.
  BOOST_TEST(poll_until([&] { return token.use_count() == 1 && log.count() >= 1; }, 20s));
  BOOST_TEST(!called.load());
  BOOST_TEST(calls.load() == 2);
  const auto seen = log.messages();
  BOOST_REQUIRE_EQUAL(seen.size(), 1u);
  BOOST_TEST(seen[0] == "attempt 2 cannot start");
}

// The final handler runs on its associated executor; the state is allocated with its
// associated allocator and freed before the handler runs (Asio's rule for memory).
BOOST_AUTO_TEST_CASE(the_handlers_associated_executor_and_allocator_are_used) {
  s.outcome = [](int n) { return n < 1 ? refused : error_code(); };
  c.set_auto_advance(true);
  auto strand = net::make_strand(pool.get_executor());
  std::promise<bool> on_strand;
  async_retry(pool, exact(3), s.op(), net::bind_executor(strand, [&](error_code, int) {
                on_strand.set_value(strand.running_in_this_thread());
              }));
  BOOST_TEST(on_strand.get_future().get());

  std::atomic<int> made{0};
  std::atomic<int> live{0};
  std::promise<int> live_in_handler;
  async_retry(pool, exact(3), s.op(), net::bind_allocator(counting_alloc<void>(&made, &live), [&](error_code, int) {
                live_in_handler.set_value(live.load());
              }));
  BOOST_TEST(live_in_handler.get_future().get() == 0);
  BOOST_TEST(made.load() == 2); // the state and the (single, successful) attempt's wait
  BOOST_TEST(poll_until([&] { return live.load() == 0; }));
}

#if defined(METRONOME_ASIO_NO_ANY_COMPLETION_HANDLER)
// Empty as a null std::function is (no any_completion_handler to type-erase the handler).
struct empty_operation {
  template <class Handler>
  void operator()(Handler&&) const {}
  bool operator==(std::nullptr_t) const { return true; }
};
#endif

BOOST_AUTO_TEST_CASE(bad_input_is_refused_at_the_call) {
  std::function<bool(const error_code&)> no_predicate;
  s.outcome = [](int) { return error_code(); };
  BOOST_CHECK_THROW(async_retry(pool, exact(1), s.op(), no_predicate, net::detached), std::invalid_argument);
#if defined(METRONOME_ASIO_NO_ANY_COMPLETION_HANDLER)
  empty_operation no_operation;
#else
  std::function<void(net::any_completion_handler<void(error_code)>)> no_operation;
#endif
  BOOST_CHECK_THROW(async_retry<void(error_code)>(pool, exact(1), no_operation, net::detached), std::invalid_argument);
  BOOST_TEST(s.started().empty());
  BOOST_CHECK_THROW(backoff({.initial = 0ms}), std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()
