#include <metronome/cancel_after.hpp>

#include <metronome/async_delay.hpp>
#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include "common/hooks.hpp"
#include "common/manual_pool.hpp"
#include "common/poll_until.hpp"

#include <metronome/detail/asio.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <list>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

namespace net = metronome::net;
using metronome::detail::as_tuple; // net::experimental::as_tuple in Asio 1.22
using metronome::detail::deferred; // net::experimental::deferred in Asio 1.22
using namespace std::chrono_literals;
using metronome::error_code;
using metronome::async_delay;
using metronome::cancel_after;
using metronome::cancel_at;
using metronome::manual_clock;
using metronome::scheduled_thread_pool;
using metronome::test::on_clock;
using metronome::test::poll_until;

namespace {

// An operation that never completes by itself: it completes with operation_aborted when
// its slot is emitted, and records the cancellation type.
struct until_cancelled {
  std::atomic<int>* got_type;
  template <class Handler>
  void operator()(Handler h) const {
    auto slot = net::get_associated_cancellation_slot(h);
    BOOST_REQUIRE(slot.is_connected());
    auto* held = new Handler(std::move(h));
    slot.assign([got = got_type, held](net::cancellation_type_t t) {
      got->store(static_cast<int>(t));
      Handler h2(std::move(*held));
      delete held;
      net::get_associated_cancellation_slot(h2).clear();
      std::move(h2)(error_code(net::error::operation_aborted));
    });
  }
};

template <class Token>
auto async_until_cancelled(std::atomic<int>& got, Token&& token) {
  return net::async_initiate<Token, void(error_code)>(until_cancelled{&got}, token);
}

} // namespace

BOOST_AUTO_TEST_SUITE(cancel_after_suite)

BOOST_AUTO_TEST_CASE(an_operation_that_never_completes_is_aborted_when_time_is_up) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  std::promise<error_code> p;
  async_delay(pool.get_executor(), 1h, cancel_after(10ms, [&](error_code ec) { p.set_value(ec); }));
  auto f = p.get_future();
  BOOST_TEST(pool.stats().delayed_queued == 2u); // the wait and the timeout: one node each
  c.advance(9ms);
  BOOST_TEST((f.wait_for(20ms) == std::future_status::timeout));
  c.advance(1ms);
  BOOST_TEST((f.get() == net::error::operation_aborted));
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 0; }));
}

BOOST_AUTO_TEST_CASE(an_operation_that_completes_first_frees_the_timer_before_its_handler_runs) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  std::promise<std::pair<error_code, std::size_t>> p;
  async_delay(pool.get_executor(), 5ms, cancel_after(1h, [&](error_code ec) {
                p.set_value({ec, pool.stats().delayed_queued});
              }));
  c.advance(5ms);
  auto [ec, queued] = p.get_future().get();
  BOOST_TEST(!ec);
  BOOST_TEST(queued == 0u); // the timeout's node left the queue when the operation completed
  c.advance(2h);            // nothing fires later
  BOOST_TEST(pool.stats().delayed_queued == 0u);
}

BOOST_AUTO_TEST_CASE(with_use_awaitable_the_coroutine_sees_operation_aborted) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  std::promise<error_code> p;
  net::co_spawn(
      pool,
      [&]() -> net::awaitable<void> {
        try {
          co_await async_delay(pool.get_executor(), 1h, cancel_after(10ms, net::use_awaitable));
          p.set_value({});
        } catch (const metronome::system_error& e) {
          p.set_value(e.code());
        }
      },
      net::detached);
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 2; }));
  c.advance(10ms);
  BOOST_TEST((p.get_future().get() == net::error::operation_aborted));
}

BOOST_AUTO_TEST_CASE(with_as_tuple_inside_a_coroutine_and_a_second_wait_after_it) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  std::promise<std::pair<error_code, error_code>> p;
  net::co_spawn(
      pool,
      [&]() -> net::awaitable<void> {
        auto [ec1] = co_await async_delay(pool.get_executor(), 1h, cancel_after(10ms, as_tuple(net::use_awaitable)));
        auto [ec2] = co_await async_delay(pool.get_executor(), 1ms, cancel_after(1h, as_tuple(net::use_awaitable)));
        p.set_value({ec1, ec2});
      },
      net::detached);
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 2; }));
  c.advance(10ms);
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 2; }));
  c.advance(1ms);
  auto [ec1, ec2] = p.get_future().get();
  BOOST_TEST((ec1 == net::error::operation_aborted));
  BOOST_TEST(!ec2);
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 0; }));
}

BOOST_AUTO_TEST_CASE(with_deferred_the_timeout_counts_from_the_launch) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  auto op = async_delay(pool.get_executor(), 1h, cancel_after(10ms, deferred));
  c.advance(50ms); // not launched yet
  BOOST_TEST(pool.stats().delayed_queued == 0u);
  std::promise<error_code> p;
  std::move(op)([&](error_code ec) { p.set_value(ec); });
  auto f = p.get_future();
  c.advance(9ms);
  BOOST_TEST((f.wait_for(20ms) == std::future_status::timeout));
  c.advance(1ms);
  BOOST_TEST((f.get() == net::error::operation_aborted));
}

BOOST_AUTO_TEST_CASE(with_use_future) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  auto f = async_delay(pool.get_executor(), 1h, cancel_at(c.now() + 3ms, net::use_future));
  c.advance(3ms);
  try {
    f.get();
    BOOST_FAIL("expected operation_aborted");
  } catch (const metronome::system_error& e) {
    BOOST_TEST((e.code() == net::error::operation_aborted));
  }
}

BOOST_AUTO_TEST_CASE(the_handlers_own_slot_keeps_working_and_frees_the_timer) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  net::cancellation_signal sig;
  std::promise<error_code> p;
  async_delay(pool.get_executor(), 1h,
              cancel_after(1h, net::bind_cancellation_slot(sig.slot(), [&](error_code ec) { p.set_value(ec); })));
  BOOST_TEST(pool.stats().delayed_queued == 2u);
  sig.emit(net::cancellation_type::terminal); // forwarded to the operation
  BOOST_TEST((p.get_future().get() == net::error::operation_aborted));
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 0; }));
  BOOST_TEST(!sig.slot().has_handler()); // our forwarder left the user's slot
}

// Runs an operation that waits until cancelled, with the completion token that
// `make_token(handler)` builds; advances the clock past the timeout and returns the
// cancellation type the operation saw (its handler must get operation_aborted).
template <class MakeToken>
int emitted_type(manual_clock& c, MakeToken make_token) {
  std::atomic<int> got{-1};
  std::promise<error_code> p;
  async_until_cancelled(got, make_token([&](error_code ec) { p.set_value(ec); }));
  c.advance(5ms);
  BOOST_TEST((p.get_future().get() == net::error::operation_aborted));
  return got.load();
}

BOOST_AUTO_TEST_CASE(the_chosen_cancellation_type_is_emitted) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  using net::cancellation_type;
  BOOST_TEST(emitted_type(c, [&](auto h) { return cancel_after(pool, 5ms, cancellation_type::partial, h); }) ==
             static_cast<int>(cancellation_type::partial));
  BOOST_TEST(emitted_type(c, [&](auto h) { return cancel_after(pool, 5ms, h); }) ==
             static_cast<int>(cancellation_type::terminal)); // the default
  // cancel_at in Asio's order too: (deadline[, type], token), (timing, deadline[, type], token).
  BOOST_TEST(emitted_type(c, [&](auto h) { return cancel_at(pool, c.now() + 5ms, cancellation_type::partial, h); }) ==
             static_cast<int>(cancellation_type::partial));
  BOOST_TEST(emitted_type(c, [&](auto h) {
               return cancel_at(c.now() + 5ms, cancellation_type::total, net::bind_executor(pool.get_executor(), h));
             }) == static_cast<int>(cancellation_type::total));
}

// Asio's partial forms: no token; called with one, they adapt it as the full forms do.
BOOST_AUTO_TEST_CASE(the_partial_forms_adapt_the_token_they_are_called_with) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  using net::cancellation_type;
  BOOST_TEST(emitted_type(c, [&](auto h) { return cancel_after(pool, 5ms)(h); }) ==
             static_cast<int>(cancellation_type::terminal));
  BOOST_TEST(emitted_type(c, [&](auto h) { return cancel_after(pool, 5ms, cancellation_type::partial)(h); }) ==
             static_cast<int>(cancellation_type::partial));
  BOOST_TEST(emitted_type(c, [&](auto h) {
               return cancel_after(5ms, cancellation_type::total)(net::bind_executor(pool.get_executor(), h));
             }) == static_cast<int>(cancellation_type::total));
  BOOST_TEST(emitted_type(c, [&](auto h) { return cancel_at(pool, c.now() + 5ms)(h); }) ==
             static_cast<int>(cancellation_type::terminal));
  BOOST_TEST(emitted_type(c, [&](auto h) {
               return cancel_at(c.now() + 5ms, cancellation_type::partial)(net::bind_executor(pool.get_executor(), h));
             }) == static_cast<int>(cancellation_type::partial));
}

#if (defined(ASIO_VERSION) && ASIO_VERSION >= 103100) || (defined(BOOST_ASIO_VERSION) && BOOST_ASIO_VERSION >= 103100)
// Passed as the token itself, the partial form adapts the default token (deferred).
BOOST_AUTO_TEST_CASE(the_partial_form_as_a_token_adapts_the_default_token) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  std::atomic<int> got{-1};
  auto op = async_until_cancelled(got, cancel_after(pool, 5ms, net::cancellation_type::partial));
  std::promise<error_code> p;
  std::move(op)([&](error_code ec) { p.set_value(ec); });
  c.advance(5ms);
  BOOST_TEST((p.get_future().get() == net::error::operation_aborted));
  BOOST_TEST(got.load() == static_cast<int>(net::cancellation_type::partial));
}
#endif

BOOST_AUTO_TEST_CASE(a_steady_timer_on_an_io_context_timed_out_by_a_manual_clock_pool) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  net::io_context io;
  net::steady_timer t(io, 1h);
  error_code got;
  bool on_io = false;
  t.async_wait(cancel_after(pool.get_executor(), 10ms, [&](error_code ec) {
    got = ec;
    on_io = io.get_executor().running_in_this_thread();
  }));
  std::thread runner([&] { io.run(); }); // the wait keeps it running
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 1; }));
  c.advance(10ms); // emitted on io's thread; the timer completes aborted; io.run returns
  runner.join();
  BOOST_TEST((got == net::error::operation_aborted));
  BOOST_TEST(on_io);
}

BOOST_AUTO_TEST_CASE(an_operation_that_outlives_its_timing_pool_completes_safely) {
  net::io_context io;
  net::steady_timer t(io, 1h);
  error_code got;
  {
    manual_clock c;
    scheduled_thread_pool pool(on_clock(c));
    t.async_wait(cancel_after(pool, 1h, [&](error_code ec) { got = ec; }));
    BOOST_TEST(pool.stats().delayed_queued == 1u);
  } // the pool goes: the timeout is dropped, the operation stays
  t.cancel();
  io.run(); // the handler's side finds the pool gone and leaves it alone
  BOOST_TEST((got == net::error::operation_aborted));
}

namespace {
// An io_context whose hour-long timer waits, each timed out by a cancel_after, keep it
// running on a thread of its own (started with the first wait) until they end.
struct timed_io {
  net::io_context io;
  std::list<net::steady_timer> timers;
  std::thread runner;

  timed_io() = default;
  timed_io(const timed_io&) = delete;
  timed_io& operator=(const timed_io&) = delete;
  ~timed_io() { // a test that stopped early (a failed requirement) still ends its runner
    if (runner.joinable()) cancel_and_join();
  }

  // A wait on a new hour-long timer, timed out by cancel_after(ex, d); its error code goes to `got`.
  void start_wait(const scheduled_thread_pool::executor_type& ex, std::chrono::milliseconds d, error_code& got) {
    timers.emplace_back(io, 1h).async_wait(cancel_after(ex, d, [&got](error_code ec) { got = ec; }));
    if (!runner.joinable()) runner = std::thread([this] { io.run(); });
  }
  // Cancels the waits left, from io's own thread.
  void cancel() {
    net::post(io, [this] {
      for (net::steady_timer& t : timers) t.cancel();
    });
  }
  void join() { runner.join(); }
  void cancel_and_join() {
    cancel();
    join();
  }
  // Waits until every wait ended (io ran out of work): a wait the deadlines did not end
  // fails the test, and is cancelled rather than hanging it.
  void join_after_deadlines() {
    BOOST_TEST(poll_until([&] { return io.stopped(); }, 10s));
    cancel_and_join();
  }
};
} // namespace

// A graceful drain keeps its deadlines: after the timing pool's shutdown() a
// cancel_after's deadline is timed as a delayed one-shot task is (pool_options::
// run_delayed_after_shutdown, the default), one started after shutdown() too. Each
// still cancels its operation when time is up, and holds the pool up until then; the
// pool terminates after. (shutdown() used to drop them: the operations ran on with no
// timeout, and a drain waiting for them could hang.)
BOOST_AUTO_TEST_CASE(deadlines_outlive_their_timing_pool_s_shutdown_as_delayed_tasks_do) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  error_code got_before, got_after; // before io: written by its thread until it is joined
  timed_io io;
  io.start_wait(pool.get_executor(), 10ms, got_before);
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 1; }));
  pool.shutdown();
  BOOST_TEST(pool.stats().delayed_queued == 1u); // kept
  io.start_wait(pool.get_executor(), 20ms, got_after);
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 2; })); // timed, not aborted
  c.advance(10ms);
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 1; }));
  BOOST_TEST(!pool.is_terminated()); // the second deadline holds it
  c.advance(10ms);
  io.join_after_deadlines();
  BOOST_TEST((got_before == net::error::operation_aborted));
  BOOST_TEST((got_after == net::error::operation_aborted));
  BOOST_TEST(pool.await_termination(10s));
}

// With run_delayed_after_shutdown off, shutdown() drops the deadline as it drops delayed
// tasks: the pool terminates at once, and the operation runs on without a timeout.
BOOST_AUTO_TEST_CASE(a_pool_that_drops_delayed_tasks_at_shutdown_drops_deadlines_too) {
  manual_clock c;
  metronome::pool_options o = on_clock(c);
  o.run_delayed_after_shutdown = false;
  scheduled_thread_pool pool(o);
  error_code got;
  timed_io io;
  io.start_wait(pool.get_executor(), 10ms, got);
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 1; }));
  pool.shutdown();
  BOOST_TEST(pool.await_termination(10s));
  BOOST_TEST(pool.stats().delayed_queued == 0u);
  c.advance(10ms);
  BOOST_TEST(!io.io.stopped()); // the timer still waits: nothing cancelled it
  io.cancel_and_join();
  BOOST_TEST((got == net::error::operation_aborted)); // by the cancel
}

// An operation that completes after its timing pool's shutdown() takes its deadline
// out, and the pool, held up by it alone, terminates then - not at the deadline, an
// hour away on the real clock, which its worker waits for, parked as the leader.
// withdraw_wait() wakes the workers of a pool seeking termination. With the hooks, the
// worker is stopped exactly there: held on its way to park (worker_before_park) while
// shutdown() runs, so that none of shutdown()'s wake-ups is pending for it; then held as
// the leader with the mutex, about to wait (leader_before_wait), while io's thread ends
// the operation - whose withdraw_wait() can only take the mutex once the worker waits.
// (Without the wake-up the worker slept on for the hour: the pool never terminated.)
BOOST_AUTO_TEST_CASE(an_operation_completing_after_shutdown_lets_its_timing_pool_terminate) {
  scheduled_thread_pool pool(1);
  error_code got;
  timed_io io;
  io.start_wait(pool.get_executor(), 1h, got);
  BOOST_TEST(poll_until([&] { return pool.stats().delayed_queued == 1; }));
#if defined(METRONOME_TEST_HOOKS)
  using metronome::detail::hook_point;
  using metronome::test::hook_stops;
  hook_stops stops{{hook_point::worker_before_park},
                   hook_stops::same_thread_as(hook_point::leader_before_wait, hook_point::worker_before_park)};
  (void)pool.submit([] {}); // the worker runs it, then goes to park: held on the way
  BOOST_REQUIRE(stops.arrived(hook_point::worker_before_park));
#endif
  pool.shutdown();
  BOOST_TEST(!pool.is_terminated());
#if defined(METRONOME_TEST_HOOKS)
  stops.release(hook_point::worker_before_park);
  BOOST_REQUIRE(stops.arrived(hook_point::leader_before_wait)); // leads, the mutex held
  io.cancel(); // io's thread ends the operation: its withdraw_wait() waits for the mutex
  stops.release(hook_point::leader_before_wait); // the worker waits, then the deadline goes
#else
  io.cancel();
#endif
  io.join();
  BOOST_TEST((got == net::error::operation_aborted));
  BOOST_TEST(pool.await_termination(10s));
  BOOST_TEST(pool.stats().delayed_queued == 0u);
}

// A deadline that fires after its timing pool's shutdown(), for a handler bound to that
// same pool: its emission and the wait's aborted completion are the library's own work
// of a pool still running (the deadline held it up), so the shut-down pool takes both -
// they are not outside work it would refuse - and the handler runs there. The task the
// handler waited for still holds the pool (a delayed task, kept), until cancelled.
BOOST_AUTO_TEST_CASE(a_deadline_firing_after_shutdown_completes_a_handler_bound_to_the_same_pool) {
  manual_clock c;
  std::promise<std::pair<bool, bool>> got; // (operation_aborted, ran on the pool); outlives the pool
  scheduled_thread_pool pool(on_clock(c));
  auto f = pool.schedule([] { return 1; }, 1h);
  f.async_wait(cancel_after(pool.get_executor(), 10ms,
                            net::bind_executor(pool.get_executor(), [&](std::exception_ptr e, int) {
                              bool aborted = false;
                              try {
                                if (e) std::rethrow_exception(e);
                              } catch (const metronome::system_error& se) {
                                aborted = se.code() == net::error::operation_aborted;
                              }
                              got.set_value({aborted, pool.get_executor().running_in_this_thread()});
                            })));
  pool.shutdown();
  BOOST_TEST(pool.stats().delayed_queued == 2u); // the task and the deadline, both kept
  c.advance(10ms);
  auto result = got.get_future();
  BOOST_REQUIRE(result.wait_for(10s) == std::future_status::ready);
  BOOST_TEST((result.get() == std::pair<bool, bool>(true, true)));
  BOOST_TEST(!f.is_done()); // the wait ended, not the task
  BOOST_TEST(!pool.is_terminated());
  BOOST_TEST(f.cancel());
  BOOST_TEST(pool.await_termination(10s));
}

BOOST_AUTO_TEST_CASE(an_io_context_operation_with_the_shared_timing_pool) {
  net::io_context io;
  net::steady_timer t(io, 1h);
  error_code got;
  t.async_wait(cancel_after(1ms, [&](error_code ec) { got = ec; }));
  io.run(); // real time: completes when the shared timing pool's 1 ms is up
  BOOST_TEST((got == net::error::operation_aborted));
}

// A plain callback has no executor: the operation (a handle's async_wait, completed by
// the worker that ran the task) and the timeout's emission (another thread) raced, and
// the emission ran a slot handler the completion had just destroyed (ASan: use-after-
// free in cancellation_signal::emit; release builds crashed). The completion now waits
// for an emission in progress before it clears the slot (before_slot_clear). Mode 2
// nests cancel_after in cancel_after (the inner one emits through the outer one's
// signal; adversary pass 6). Every handler runs once, with the value or operation_aborted.
BOOST_AUTO_TEST_CASE(a_plain_callback_s_timeout_racing_the_operation_s_completion_is_safe) {
  for (int mode = 0; mode < 3; ++mode) {
    scheduled_thread_pool pool(2);
    constexpr int n = 3000;
    std::atomic<int> done{0}, aborted{0}, values{0}, wrong{0};
    for (int i = 0; i < n; ++i) {
      auto h = pool.schedule([i] { return i; }, std::chrono::microseconds(i % 100));
      auto cb = [&, i](std::exception_ptr e, int v) {
        if (e) {
          try {
            std::rethrow_exception(e);
          } catch (const metronome::system_error& se) {
            if (se.code() == metronome::net::error::operation_aborted) ++aborted;
            else ++wrong;
          } catch (...) {
            ++wrong;
          }
        } else if (v == i) {
          ++values;
        } else {
          ++wrong;
        }
        ++done;
      };
      const auto d = std::chrono::microseconds((i * 7) % 100);
      if (mode == 0)
        h.async_wait(metronome::cancel_after(pool, d, cb));
      else if (mode == 1)
        h.async_wait(metronome::cancel_after(d, cb));
      else
        h.async_wait(metronome::cancel_after(d, metronome::cancel_after(d, cb)));
      if (i % 64 == 0) poll_until([&] { return done.load() >= i - 200; }, 20s);
    }
    BOOST_TEST_CONTEXT("mode " << mode) {
      BOOST_CHECK(poll_until([&] { return done.load() == n; }, 30s));
      BOOST_CHECK_EQUAL(wrong.load(), 0);
      BOOST_CHECK_EQUAL(values.load() + aborted.load(), n);
    }
    pool.join();
    BOOST_CHECK_EQUAL(done.load(), n); // none twice
  }
}

// The same race on async_delay, on a two-thread pool: the delay completes on one worker
// (its handler has no executor: the pool's, dispatched inline) while the timeout's
// emission runs on the other.
BOOST_AUTO_TEST_CASE(a_delay_s_timeout_racing_its_completion_on_a_two_thread_pool_is_safe) {
  scheduled_thread_pool pool(2);
  constexpr int n = 3000;
  std::atomic<int> done{0}, ok{0}, aborted{0}, wrong{0};
  for (int i = 0; i < n; ++i) {
    async_delay(pool, std::chrono::microseconds(i % 100),
                cancel_after(pool, std::chrono::microseconds((i * 7) % 100), [&](error_code ec) {
                  if (!ec)
                    ++ok;
                  else if (ec == metronome::net::error::operation_aborted)
                    ++aborted;
                  else
                    ++wrong;
                  ++done;
                }));
    if (i % 64 == 0) poll_until([&] { return done.load() >= i - 200; }, 20s);
  }
  BOOST_CHECK(poll_until([&] { return done.load() == n; }, 30s));
  BOOST_CHECK_EQUAL(wrong.load(), 0);
  BOOST_CHECK_EQUAL(ok.load() + aborted.load(), n);
  pool.join();
  BOOST_CHECK_EQUAL(done.load(), n);
}

#if defined(METRONOME_TEST_HOOKS)
namespace {
// Stopped at the hand-over (docs/design.md, cancel_after): the timeout's emitter is held
// with its emission lock taken, about to emit, when the task ends and its runner
// completes the wait (a plain callback: inline, on the worker). The completion must not
// clear the slot - destroying the handler the emission is about to call - until the
// emission is over: the handler runs only after the emitter is released, once, with the
// value (the task ended first: the emission finds the wait gone). `wrap` builds the
// token around the callback; its 1 ms adapter is the one that fires.
template <class Wrap>
void completion_waits_for_a_held_emission(Wrap wrap) {
  scheduled_thread_pool pool(2);
  metronome::test::gate go;
  auto h = pool.submit([&] {
    go.wait();
    return 5;
  });
  metronome::test::hook_stop stop(metronome::detail::hook_point::cancel_after_emitting, true);
  std::atomic<int> calls{0}, values{0};
  h.async_wait(wrap(pool, [&](std::exception_ptr e, int v) {
    if (!e && v == 5) ++values;
    ++calls;
  }));
  BOOST_REQUIRE(stop.arrived()); // the timeout fired while the task still runs
  go.open();
  h.wait();
  BOOST_CHECK(!poll_until([&] { return calls.load() != 0; }, 300ms)); // its completion waits
  stop.release();
  BOOST_CHECK(poll_until([&] { return calls.load() == 1; }, 10s));
  pool.shutdown();
  pool.join();
  BOOST_CHECK_EQUAL(calls.load(), 1);
  BOOST_CHECK_EQUAL(values.load(), 1);
}
} // namespace

BOOST_AUTO_TEST_CASE(a_wait_completing_while_cancel_after_emits_waits_for_the_emission) {
  completion_waits_for_a_held_emission([](auto& pool, auto cb) { return cancel_after(pool, 1ms, std::move(cb)); });
}

// Nested in another cancel_after: the inner one's emission goes through the outer one's
// signal - the slot the completion clears. Only the outer one stopped emitting before the
// clear: the completion ran under the inner emission and freed what it was calling
// (adversary pass 6: SIGSEGV 8 runs in 10, ASan heap-use-after-free in
// cancellation_signal::emit).
BOOST_AUTO_TEST_CASE(a_wait_completing_while_a_nested_cancel_after_emits_waits_for_the_emission) {
  completion_waits_for_a_held_emission(
      [](auto& pool, auto cb) { return cancel_after(pool, 1h, cancel_after(pool, 1ms, std::move(cb))); });
}

// With an Asio binder between the two adapters: the completion looks through it.
BOOST_AUTO_TEST_CASE(a_wait_completing_while_a_cancel_after_inside_a_binder_emits_waits_for_the_emission) {
  completion_waits_for_a_held_emission([](auto& pool, auto cb) {
    return cancel_after(pool, 1h, net::bind_executor(pool.get_executor(), cancel_after(pool, 1ms, std::move(cb))));
  });
}
#endif

// The pool's stats (scheduled_thread_pool::stats()): the timeout's delivery counts as
// lateness; the wait it cancels, aborted, counts nothing.
BOOST_AUTO_TEST_CASE(a_cancel_after_timeout_counts_its_lateness) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  std::promise<error_code> p;
  async_delay(pool, 1h, cancel_after(10ms, [&](error_code ec) { p.set_value(ec); }));
  c.advance(12ms); // due at +10 ms, delivered at +12 ms
  BOOST_TEST((p.get_future().get() == net::error::operation_aborted));
  BOOST_TEST(poll_until([&] { return pool.stats().lateness.total() == 1u; }));
  using metronome::latency_histogram;
  BOOST_TEST(pool.stats().lateness.count(latency_histogram::bucket_of(2ms)) == 1u);
}

BOOST_AUTO_TEST_SUITE_END()
