// The wheel timer's lifetimes and failures: handles that outlive the wheel (with
// timeouts queued on the executor), timeouts and wait handlers that throw (to the wheel's
// or the pool's exception handler, the worker lives), and a wait's outstanding work on
// the handler's executor (held until the completion is handed over; a dying io_context
// left alone).
#include <metronome/wheel_timer.hpp>

#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include "common/accounting.hpp"
#include "common/counting_executor.hpp"
#include "common/death.hpp"
#include "common/exception_log.hpp"
#include "common/io_churn.hpp"
#include "common/latch_task.hpp"
#include "common/poll_until.hpp"
#include "common/stderr_capture.hpp"

#include <metronome/detail/asio.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/sanitizers.hpp"

namespace net = metronome::net;
using namespace std::chrono_literals;
using metronome::error_code;
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
  net::cancellation_signal sig;
  std::promise<error_code> waited;
  wheel->async_wait(1ms, net::bind_cancellation_slot(sig.slot(), [&](error_code ec) { waited.set_value(ec); }));
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
  sig.emit(net::cancellation_type::terminal);
  busy.open();
  BOOST_TEST(ran.wait_for_at_least(1));
  BOOST_TEST((waited.get_future().get() == net::error::operation_aborted));
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
  net::io_context io;
  metronome::test::counting_executor::counts work;
  int held_while_running = -1;
  wheel.async_wait(1ms, net::bind_executor(metronome::test::counting_executor(io, work),
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
  metronome::test::complete_onto_dying_io_contexts(2000, [&](net::io_context& io, std::function<void()> ran) {
    wheel.async_wait(0ms, net::bind_executor(io, [ran](error_code) { ran(); }));
  });
}



// A pool's shutdown() aborts the pending waits of a wheel over it, as it does its own
// async_delay waits: they complete with operation_aborted on the pool before it
// terminates, and join() returns after that. (They were dropped unrun once the pool had
// terminated: a coroutine awaiting one was destroyed, never resumed.) A wait started
// after shutdown() completes with operation_aborted too; timeouts are not touched. A
// wheel built from the pool's own executor is the pool's wheel as well.
BOOST_AUTO_TEST_CASE(the_pool_s_shutdown_aborts_the_waits_of_a_wheel_over_it) {
  for (const bool from_executor : {false, true}) {
    BOOST_TEST_CONTEXT("built from the pool's executor: " << from_executor) {
      scheduled_thread_pool pool(1);
      std::optional<wheel_timer> made;
      if (from_executor)
        made.emplace(pool.get_executor());
      else
        made.emplace(pool);
      wheel_timer& wheel = *made;
      std::atomic<int> calls{0}, aborted{0};
      auto handler = [&](error_code ec) {
        if (ec == net::error::operation_aborted) aborted.fetch_add(1);
        calls.fetch_add(1);
      };
      wheel.async_wait(1h, handler);
      wheel.async_wait(10min, handler);
      std::atomic<int> timeout_runs{0};
      auto timeout = wheel.schedule([&] { timeout_runs.fetch_add(1); }, 1h);
      metronome::test::gate busy;
      metronome::test::counter busy_started;
      BOOST_REQUIRE(metronome::test::occupy_worker(pool, busy, busy_started));
      pool.shutdown();
      wheel.async_wait(1h, handler); // after shutdown
      BOOST_CHECK_EQUAL(wheel.pending(), 1u); // the timeout
      busy.open();
      pool.join();
      BOOST_CHECK_EQUAL(calls.load(), 3);
      BOOST_CHECK_EQUAL(aborted.load(), 3);
      BOOST_CHECK(timeout.cancel());
      BOOST_CHECK_EQUAL(timeout_runs.load(), 0);
    }
  }
}


// shutdown_now(): the waits of a wheel over the pool - pending in the wheel, or due and
// queued on the pool - are neither returned nor run: their handlers are destroyed
// unrun, and the pool terminates (a wait left in the wheel kept join() waiting for ever;
// one queued on the pool came back as a pending_task that held the pool until run).
BOOST_AUTO_TEST_CASE(shutdown_now_discards_the_waits_of_a_wheel_over_it_and_the_pool_terminates) {
  metronome::manual_clock clock;
  metronome::pool_options o = metronome::pool_options::single_thread();
  o.time_source = &clock;
  o.exception_handler = [](std::exception_ptr) {};
  scheduled_thread_pool pool(o);
  metronome::wheel_options wo;
  wo.time_source = &clock;
  wheel_timer wheel(pool, wo);
  std::atomic<int> calls{0};
  auto state = std::make_shared<int>(0);
  std::weak_ptr<int> handlers_alive = state;
  auto handler = [&calls, &state] { return [&calls, s = state](error_code) { calls.fetch_add(1); }; };
  metronome::test::gate busy;
  metronome::test::counter busy_started;
  BOOST_REQUIRE(metronome::test::occupy_worker(pool, busy, busy_started));
  wheel.async_wait(1h, handler());  // stays in the wheel
  wheel.async_wait(1ms, handler()); // due: queued on the pool behind the busy task
  state.reset();
  std::atomic<int> timeout_runs{0};
  wheel.schedule([&] { timeout_runs.fetch_add(1); }, 1ms); // a due timeout: a task, returned
  clock.advance(1ms);
  BOOST_REQUIRE(metronome::test::poll_until([&] { return pool.stats().ready_queued >= 2u; }));
  auto rest = pool.shutdown_now();
  BOOST_CHECK_EQUAL(rest.size(), 1u); // the timeout; no wait
  busy.open();
  BOOST_CHECK(pool.await_termination(10s)); // while `rest` is alive
  BOOST_CHECK_EQUAL(calls.load(), 0);
  BOOST_CHECK(handlers_alive.expired());
  for (auto& t : rest) t();
  BOOST_CHECK_EQUAL(timeout_runs.load(), 1);
}

// The pool must outlive a running wheel over it; a stopped one hands it nothing more,
// so the pool may go first (its handles, and the wheel's destructor, stay safe).
BOOST_AUTO_TEST_CASE(a_stopped_wheel_may_outlive_its_pool) {
  auto pool = std::make_unique<scheduled_thread_pool>(1);
  auto wheel = std::make_unique<wheel_timer>(*pool);
  auto t = wheel->schedule([] {}, 1h);
  std::atomic<int> aborted{0};
  wheel->async_wait(1h, [&](error_code ec) {
    if (ec == net::error::operation_aborted) aborted.fetch_add(1);
  });
  const auto left = wheel->stop();
  BOOST_CHECK_EQUAL(left.size(), 2u);
  pool->shutdown();
  pool->join(); // the aborted wait has run on the pool
  BOOST_CHECK_EQUAL(aborted.load(), 1);
  pool.reset();
  BOOST_CHECK(t.is_cancelled());
  BOOST_CHECK(!t.cancel());
  BOOST_CHECK(!t.reset(1ms));
  BOOST_CHECK_EQUAL(wheel->pending(), 0u);
  // A wait started on the stopped wheel completes on its own executor, pool or no pool.
  net::io_context io;
  error_code late;
  int late_calls = 0;
  wheel->async_wait(1ms, net::bind_executor(io, [&](error_code ec) {
                      late = ec;
                      ++late_calls;
                    }));
  io.run();
  BOOST_CHECK_EQUAL(late_calls, 1);
  BOOST_CHECK(late == net::error::operation_aborted);
  wheel.reset(); // touches nothing of the pool (AddressSanitizer watches)
}

// A timeout whose callable stops its wheel when destroyed, destroyed by stop() itself: the
// inner stop() runs on the thread of the stop() that stopped the wheel, before that one
// has let go of the pool. It returns at once with nothing (a stop() on another thread
// would wait for the first to finish: it would wait for itself here).
BOOST_AUTO_TEST_CASE(a_timeout_destroyed_by_stop_may_stop_its_wheel_again) {
  scheduled_thread_pool pool(1);
  auto wheel = std::make_unique<wheel_timer>(pool);
  struct stops_on_destroy {
    wheel_timer* w;
    std::size_t* inner;
    bool armed = true;
    stops_on_destroy(wheel_timer* x, std::size_t* n) : w(x), inner(n) {}
    stops_on_destroy(stops_on_destroy&& o) noexcept : w(o.w), inner(o.inner) { o.armed = false; }
    stops_on_destroy& operator=(stops_on_destroy&&) = delete;
    ~stops_on_destroy() {
      if (armed) *inner = w->stop().size() + 100; // 100: it ran, and returned that many
    }
    void operator()() const {}
  };
  std::size_t inner = 0, outer = 0;
  wheel->schedule(stops_on_destroy(wheel.get(), &inner), 1h);
  BOOST_REQUIRE(metronome::test::finishes_within(20s, [&] { outer = wheel->stop().size(); }));
  BOOST_CHECK_EQUAL(outer, 1u);
  BOOST_CHECK_EQUAL(inner, 100u); // the inner stop() ran and returned nothing
  wheel.reset();
}

// A callable that cancels another timeout of the same wheel when it is destroyed (an
// RAII session's timers, say).
struct cancels_on_destroy {
  wheel_timer::timeout* other;
  std::atomic<int>* cancels;
  bool armed = true;
  cancels_on_destroy(wheel_timer::timeout* o, std::atomic<int>* c) : other(o), cancels(c) {}
  cancels_on_destroy(cancels_on_destroy&& x) noexcept : other(x.other), cancels(x.cancels) { x.armed = false; }
  cancels_on_destroy& operator=(cancels_on_destroy&&) = delete;
  ~cancels_on_destroy() {
    if (armed && other->cancel()) cancels->fetch_add(1);
  }
  void operator()() const {}
};

// reset(0) hands a timeout to the executor at once. When the executor refuses it there
// and then (a terminated pool; the executor of a shut-down pool), the callable is
// destroyed on the calling thread - which must not hold the wheel's mutex then: the
// callable's destructor cancels another timeout of the same wheel. (It deadlocked.)
BOOST_AUTO_TEST_CASE(a_timeout_refused_by_its_executor_may_cancel_another_of_its_wheel) {
  for (const bool over_the_pool_object : {true, false}) {
    struct state {
      scheduled_thread_pool pool{1};
      std::optional<wheel_timer> wheel;
      wheel_timer::timeout other, t;
      std::atomic<int> cancels{0};
    };
    auto st = std::make_shared<state>();
    if (over_the_pool_object) {
      st->wheel.emplace(st->pool);
      st->pool.shutdown();
      st->pool.join(); // terminated: pushes are dropped
    } else {
      // Another executor of the pool (not its own, which makes the pool's wheel).
      st->wheel.emplace(metronome::net::any_io_executor(st->pool.get_executor()));
      st->pool.shutdown(); // posts from outside are dropped
    }
    st->other = st->wheel->schedule([] {}, 1h);
    st->t = st->wheel->schedule(cancels_on_destroy(&st->other, &st->cancels), 1h);
    bool reset = false;
    const bool returned = metronome::test::finishes_within(std::chrono::seconds(20), [st, &reset] {
      reset = st->t.reset(0ms);
    });
    BOOST_REQUIRE_MESSAGE(returned, "reset() deadlocked (over the pool object: " << over_the_pool_object << ")");
    BOOST_CHECK(reset);
    BOOST_CHECK_EQUAL(st->cancels.load(), 1); // the other timeout was cancelled from the destructor
    BOOST_CHECK(st->other.is_cancelled());
    BOOST_CHECK_GE(st->pool.stats().rejected, 1u);
  }
}

// An advance tells each wheel and pool on the clock without holding the clock's mutex,
// so what it runs on its thread may use the clock. Here a wheel's due timeout is refused
// by its executor (another executor of a shut-down pool) and destroyed unrun inside the
// advance; its callable's destructor advances the clock again, destroys its own wheel and
// asks wait_idle(). The advance returns (it deadlocked: the clock's mutex was held), the
// inner advance's time is told to the pool after the wheel (its task due then runs), and
// wait_idle() refuses with std::logic_error (it would wait for the advance it is in).
BOOST_AUTO_TEST_CASE(a_timeout_dropped_inside_an_advance_may_advance_the_clock_and_destroy_its_wheel) {
  struct state {
    manual_clock clock;
    scheduled_thread_pool refusing{1};
    std::unique_ptr<wheel_timer> wheel;
    std::unique_ptr<scheduled_thread_pool> timed;
    std::atomic<bool> ran{false}, refused{false}, wheel_gone{false};
  };
  struct uses_the_clock_when_dropped {
    state* st;
    bool armed = true;
    explicit uses_the_clock_when_dropped(state* s) : st(s) {}
    uses_the_clock_when_dropped(uses_the_clock_when_dropped&& x) noexcept : st(x.st) { x.armed = false; }
    uses_the_clock_when_dropped& operator=(uses_the_clock_when_dropped&&) = delete;
    ~uses_the_clock_when_dropped() {
      if (!armed) return;
      st->clock.advance(1ms); // inside the advance: moves the time, returns at once
      st->wheel.reset();      // its own wheel, from inside the call that tells it
      st->wheel_gone = true;
      try {
        st->clock.wait_idle();
      } catch (const std::logic_error&) {
        st->refused = true;
      }
    }
    void operator()() const { st->ran = true; }
  };
  auto st = std::make_shared<state>();
  wheel_options wo;
  wo.time_source = &st->clock;
  st->wheel = std::make_unique<wheel_timer>(net::any_io_executor(st->refusing.get_executor()), wo);
  metronome::pool_options po;
  po.time_source = &st->clock;
  st->timed = std::make_unique<scheduled_thread_pool>(po); // told after the wheel (built after it)
  const auto t0 = st->clock.now();
  st->wheel->schedule(uses_the_clock_when_dropped(st.get()), 1ms);
  auto later = st->timed->schedule([c = &st->clock] { return c->now(); }, 2ms);
  st->refusing.shutdown(); // posts from outside are dropped
  const bool returned = metronome::test::finishes_within(std::chrono::seconds(20), [st] { st->clock.advance(1ms); });
  BOOST_REQUIRE_MESSAGE(returned, "the advance deadlocked on code it ran");
  BOOST_CHECK(st->wheel_gone.load());
  BOOST_CHECK(!st->ran.load());
  BOOST_CHECK(st->refused.load());
  BOOST_TEST((st->clock.now() == t0 + 2ms));
  // Released by the outer advance before it returned (the inner one only moved the time).
  BOOST_REQUIRE((later.wait_for(10s) == std::future_status::ready));
  BOOST_TEST((later.get() == t0 + 2ms));
}

// A shut-down pool still turns its wheels until it terminates (a second worker, held in
// a task, keeps it from terminating): a timeout falling due then runs, and here destroys
// its wheel from the pool's thread while the wheel's tick may still be turning. Neither
// may touch the destroyed wheel.
BOOST_AUTO_TEST_CASE(a_timeout_run_by_a_shut_down_pool_may_destroy_its_wheel) {
  scheduled_thread_pool pool(2);
  metronome::test::gate release;
  metronome::test::counter entered;
  BOOST_REQUIRE(metronome::test::occupy_worker(pool, release, entered));
  auto wheel = std::make_shared<std::unique_ptr<wheel_timer>>(std::make_unique<wheel_timer>(pool));
  pool.shutdown();
  std::atomic<bool> done{false};
  (*wheel)->schedule(
      [wheel, &done] {
        wheel->reset();
        done = true;
      },
      2ms);
  BOOST_CHECK(metronome::test::poll_until([&] { return done.load(); }, std::chrono::seconds(10)));
  BOOST_CHECK(!*wheel);
  BOOST_CHECK_EQUAL(pool.stats().rejected, 0u);
  release.open();
  pool.join();
}

// Once its pool has terminated a wheel no longer ticks (it has no thread of its own): a
// timeout it holds then, or is given after, never runs and is destroyed unrun with the
// wheel; its handle says cancelled. Nothing is handed to the terminated pool.
BOOST_AUTO_TEST_CASE(a_wheel_over_a_terminated_pool_fires_nothing_and_destroys_what_it_holds) {
  scheduled_thread_pool pool(1);
  auto wheel = std::make_unique<wheel_timer>(pool);
  auto before = wheel->schedule([] {}, 1h);
  pool.shutdown();
  pool.join();
  std::atomic<int> runs{0};
  auto destroyed = std::make_shared<int>(0);
  std::weak_ptr<int> alive = destroyed;
  auto after = wheel->schedule([&runs, d = std::move(destroyed)] { ++runs; }, 1ms);
  BOOST_CHECK(!metronome::test::poll_until([&] { return runs.load() > 0 || alive.expired(); }, 50ms));
  BOOST_CHECK_EQUAL(wheel->pending(), 2u);
  wheel.reset();
  BOOST_CHECK(alive.expired());
  BOOST_CHECK_EQUAL(runs.load(), 0);
  BOOST_CHECK(before.is_cancelled());
  BOOST_CHECK(after.is_cancelled());
  BOOST_CHECK_EQUAL(pool.stats().rejected, 0u);
}


#if !defined(NDEBUG) && !METRONOME_TEST_SANITIZED
// A wheel fires onto its pool, so the pool must outlive it: debug builds assert it when
// the pool goes first (the child process must die of the assertion instead of firing a
// timeout into the freed pool).
BOOST_AUTO_TEST_CASE(destroying_a_pool_before_its_wheel_is_caught_in_debug_builds) {
  BOOST_CHECK(metronome::test::child_aborts([] {
    auto* pool = new scheduled_thread_pool(1);
    auto* wheel = new wheel_timer(*pool);
    wheel->schedule([] {}, 1h);
    delete pool;
    delete wheel; // not reached when the rule is checked
  }));
}
#endif

BOOST_AUTO_TEST_SUITE_END()
