#include <metronome/scheduled_future.hpp>

#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>
#include <metronome/serial_executor.hpp>
#include <metronome/async_delay.hpp>
#include <metronome/cancel_after.hpp>

#include "common/counting_executor.hpp"
#include "common/exception_log.hpp"
#include "common/held_pool.hpp"
#include "common/io_churn.hpp"
#include "common/latch_task.hpp"
#include "common/poll_until.hpp"
#include "common/threads.hpp"

#include <metronome/detail/pool_anchor.hpp>

#include <metronome/detail/asio.hpp>
#include METRONOME_ASIO_HEADER(experimental/awaitable_operators.hpp)

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using metronome::pool_options;
using metronome::scheduled_future;
using metronome::scheduled_thread_pool;
using metronome::test::held_pool;

namespace {
struct manual_pool {
  metronome::manual_clock clock;
  metronome::scheduled_thread_pool pool{[this] {
    metronome::pool_options o;
    o.threads = 1;
    o.time_source = &clock;
    return o;
  }()};
};
} // namespace

BOOST_AUTO_TEST_SUITE(scheduled_future_suite)

BOOST_AUTO_TEST_CASE(empty_handle_is_invalid_and_throws_on_get) {
  scheduled_future<int> f;
  BOOST_TEST(!f.valid());
  BOOST_TEST(!f.cancel());
  BOOST_TEST(!f.is_done());
  BOOST_CHECK_THROW(f.get(), std::logic_error);
}

BOOST_AUTO_TEST_CASE(get_returns_value_to_every_copy) {
  metronome::scheduled_thread_pool pool(1);
  auto f = pool.submit([] { return std::string("hello"); });
  auto g = f;
  BOOST_TEST(f.get() == "hello");
  BOOST_TEST(g.get() == "hello");
  BOOST_TEST(f.is_done());
  BOOST_TEST(!f.is_cancelled());
  BOOST_TEST((f == g));
}

BOOST_AUTO_TEST_CASE(get_rethrows_the_task_exception) {
  metronome::scheduled_thread_pool pool(1);
  auto f = pool.submit([]() -> int { throw std::runtime_error("boom"); });
  BOOST_CHECK_EXCEPTION(f.get(), std::runtime_error, [](const auto& e) { return std::string(e.what()) == "boom"; });
  BOOST_TEST(f.is_done());
}

// A finished task keeps its exception where its callable was (the node has no field for
// it): whatever the callable's size - none, smaller than the exception's pointer, or
// larger - every handle rethrows that very exception, a periodic task's too, and it is
// freed with the task's last handle.
namespace {
std::atomic<int> counted_errors{0};
struct counted_error : std::runtime_error {
  explicit counted_error(int v) : std::runtime_error("counted"), value(v) { ++counted_errors; }
  counted_error(const counted_error& o) : std::runtime_error(o), value(o.value) { ++counted_errors; }
  ~counted_error() override { --counted_errors; }
  int value;
};
} // namespace

BOOST_AUTO_TEST_CASE(a_task_s_exception_outlives_its_callable_and_is_freed_with_its_last_handle) {
  BOOST_REQUIRE_EQUAL(counted_errors.load(), 0);
  {
    metronome::scheduled_thread_pool pool(2);
    char small = 3;
    std::array<long, 6> large{};
    large[5] = 4;
    auto none = pool.submit([] { throw counted_error(1); });
    auto tiny = pool.schedule([small]() -> int { throw counted_error(small); }, 1ms);
    auto big = pool.submit([large]() -> std::string { throw counted_error(int(large[5])); });
    metronome::periodic_options stop;
    stop.on_error = metronome::on_exception::stop;
    std::atomic<int> runs{0};
    auto periodic = pool.schedule_at_fixed_rate(
        [&runs, large] {
          if (++runs == 3) throw counted_error(int(large[5]) + 1);
        },
        0ms, 1ms, stop);
    auto value_of = [](auto& h) {
      try {
        h.get();
      } catch (const counted_error& e) {
        return e.value;
      }
      return -1;
    };
    BOOST_TEST(value_of(none) == 1);
    BOOST_TEST(value_of(tiny) == 3);
    BOOST_TEST(value_of(big) == 4);
    BOOST_TEST(value_of(periodic) == 5);
    BOOST_TEST(runs.load() == 3);
    auto copy = big;
    BOOST_TEST(value_of(copy) == 4); // every handle: the same exception, still there
    BOOST_TEST(counted_errors.load() >= 4);
  } // the handles and the pool are gone
  BOOST_TEST(counted_errors.load() == 0);
}

// A move-only result is moved out once for all the handles of its task: a second get()
// (through any copy) throws future_already_retrieved, as std::future's does, and so does
// an async_wait that comes after (its R{} beside the error) - never a moved-from value.
namespace {
// What taking a move-only result gave: 1 the value `i`, 2 future_already_retrieved, 3
// anything else.
template <class Take>
int outcome_of(Take&& take, int i) {
  try {
    auto v = take();
    return v && *v == i ? 1 : 3;
  } catch (const std::future_error& e) {
    return e.code() == std::future_errc::future_already_retrieved ? 2 : 3;
  } catch (...) {
    return 3;
  }
}
} // namespace

BOOST_AUTO_TEST_CASE(move_only_results_are_moved_out_once) {
  metronome::scheduled_thread_pool pool(1);
  auto f = pool.submit([] { return std::make_unique<int>(5); });
  auto copy = f;
  auto p = f.get();
  BOOST_TEST(*p == 5);
  try {
    (void)copy.get();
    BOOST_FAIL("a second get() returned");
  } catch (const std::future_error& e) {
    BOOST_TEST((e.code() == std::future_errc::future_already_retrieved));
  }
  std::promise<std::pair<int, bool>> waited; // (the outcome, a null value)
  f.async_wait([&](std::exception_ptr e, std::unique_ptr<int> v) {
    const bool null_value = v == nullptr;
    waited.set_value({outcome_of([&] {
                        if (e) std::rethrow_exception(e);
                        return std::move(v);
                      }, 5),
                      null_value});
  });
  BOOST_TEST((waited.get_future().get() == std::pair<int, bool>(2, true)));

  // The first taker may be a completion: then get() throws.
  auto g = pool.submit([] { return std::make_unique<int>(6); });
  std::promise<int> first;
  g.async_wait([&](std::exception_ptr e, std::unique_ptr<int> v) { first.set_value(e || !v ? -1 : *v); });
  BOOST_TEST(first.get_future().get() == 6);
  BOOST_CHECK_THROW((void)g.get(), std::future_error);
}

// Two handles' get() at once, on two threads, over a done task with a move-only
// result: the claim (scheduled_result::claim_value) is one atomic fetch_or, so exactly
// one of them gets the value and the other future_already_retrieved - never both the
// value (a double move), never neither. Even rounds: two get()s released together (a
// two-party spin at the start line, for overlap). Odd rounds: a get() against an
// async_wait's completion, both waiting on the running task - its runner completes the
// wait on the worker as the task ends, while get() returns from its wait.
BOOST_AUTO_TEST_CASE(two_threads_taking_a_move_only_result_at_once_get_it_once) {
  metronome::scheduled_thread_pool pool(1);
  constexpr int rounds = 400;
  int values = 0, retrieved = 0, other = 0;
  for (int i = 0; i < rounds; ++i) {
    std::array<int, 2> got{};
    if (i % 2 == 0) {
      auto f = pool.submit([i] { return std::make_unique<int>(i); });
      f.wait();
      std::atomic<int> ready{0};
      auto take = [&](metronome::scheduled_future<std::unique_ptr<int>> h) {
        ready.fetch_add(1);
        while (ready.load() < 2) { // the start line: both claim at once
        }
        return outcome_of([&] { return h.get(); }, i);
      };
      std::thread other_side([&, copy = f] { got[1] = take(copy); });
      got[0] = take(f);
      other_side.join();
    } else {
      metronome::test::gate go;
      auto f = pool.submit([i, &go] {
        go.wait();
        return std::make_unique<int>(i);
      });
      auto waited = std::make_shared<std::promise<int>>(); // outlives a failed round
      f.async_wait([waited, i](std::exception_ptr e, std::unique_ptr<int> v) {
        waited->set_value(outcome_of([&] {
          if (e) std::rethrow_exception(e);
          return std::move(v);
        }, i));
      });
      go.open();
      got[0] = outcome_of([&] { return f.get(); }, i);
      auto w = waited->get_future();
      BOOST_REQUIRE(w.wait_for(10s) == std::future_status::ready);
      got[1] = w.get();
    }
    for (int g : got) (g == 1 ? values : g == 2 ? retrieved : other) += 1;
  }
  BOOST_TEST(values == rounds);
  BOOST_TEST(retrieved == rounds);
  BOOST_TEST(other == 0);
}

BOOST_AUTO_TEST_CASE(cancel_wins_only_before_start) {
  manual_pool mp;
  auto f = mp.pool.schedule([] { return 1; }, 10ms);
  BOOST_TEST(f.cancel());
  BOOST_TEST(!f.cancel()); // a second cancel does not claim a win
  BOOST_TEST(f.is_cancelled());
  BOOST_TEST(f.is_done());
  BOOST_CHECK_THROW(f.get(), metronome::cancelled_error);
  BOOST_TEST(mp.pool.stats().delayed_queued == 0u);
}

BOOST_AUTO_TEST_CASE(cancel_of_a_running_or_finished_task_returns_false) {
  metronome::scheduled_thread_pool pool(1);
  metronome::test::gate started, release;
  auto f = pool.submit([&] {
    started.open();
    release.wait();
    return 3;
  });
  started.wait();
  BOOST_TEST(!f.cancel()); // already running: the cancel must not claim it stopped it
  release.open();
  BOOST_TEST(f.get() == 3);
  BOOST_TEST(!f.cancel());
  BOOST_TEST(!f.is_cancelled());
}

BOOST_AUTO_TEST_CASE(cancel_destroys_the_callable_at_once) {
  manual_pool mp;
  auto token = std::make_shared<int>(1);
  auto f = mp.pool.schedule([token] { return *token; }, 1h);
  BOOST_TEST(token.use_count() == 2);
  BOOST_TEST(f.cancel());
  BOOST_TEST(token.use_count() == 1);
}

BOOST_AUTO_TEST_CASE(finished_task_releases_its_callable) {
  metronome::scheduled_thread_pool pool(1);
  auto token = std::make_shared<int>(1);
  auto f = pool.submit([token] { return *token; });
  BOOST_TEST(f.get() == 1);
  BOOST_TEST(token.use_count() == 1); // the handle keeps only the result
}

BOOST_AUTO_TEST_CASE(dropping_the_handle_never_cancels) {
  manual_pool mp;
  metronome::test::counter ran;
  {
    auto f = mp.pool.schedule([&] { ran.add(); }, 5ms);
  }
  mp.clock.advance(5ms);
  BOOST_TEST(ran.wait_for_at_least(1));
}

BOOST_AUTO_TEST_CASE(wait_for_times_out_then_succeeds) {
  manual_pool mp;
  auto f = mp.pool.schedule([] { return 2; }, 1s);
  BOOST_TEST((f.wait_for(10ms) == std::future_status::timeout));
  mp.clock.advance(1s);
  BOOST_TEST((f.wait_for(20s) == std::future_status::ready));
  BOOST_TEST(f.get() == 2);
}

// Timeouts beyond the clock's range saturate; NaN counts as zero (no overflow, no UB:
// now + max overflowed before).
BOOST_AUTO_TEST_CASE(wait_for_takes_any_timeout) {
  metronome::scheduled_thread_pool pool(1);
  auto f = pool.submit([] { return 1; });
  BOOST_TEST((f.wait_for(std::chrono::nanoseconds::max()) == std::future_status::ready));
  BOOST_TEST((f.wait_for(std::chrono::hours::max()) == std::future_status::ready));
  manual_pool mp;
  auto g = mp.pool.schedule([] { return 1; }, 1h);
  BOOST_TEST((g.wait_for(std::chrono::duration<double>(std::nan(""))) == std::future_status::timeout));
  BOOST_TEST((g.wait_until(metronome::clock::time_point::min()) == std::future_status::timeout));
  BOOST_TEST(g.cancel());
}

BOOST_AUTO_TEST_CASE(delay_reports_time_left_on_the_pool_clock) {
  manual_pool mp;
  auto f = mp.pool.schedule([] {}, 100ms);
  BOOST_TEST((f.delay() == std::chrono::nanoseconds(100ms)));
  mp.clock.advance(40ms);
  BOOST_TEST((f.delay() == std::chrono::nanoseconds(60ms)));
  f.cancel();
}

BOOST_AUTO_TEST_CASE(waiters_on_other_threads_are_all_woken) {
  manual_pool mp;
  auto f = mp.pool.schedule([] { return 9; }, 1s);
  std::atomic<int> sum{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i) waiters.emplace_back([f, &sum] { sum += f.get(); });
  mp.clock.advance(1s);
  for (auto& t : waiters) t.join();
  BOOST_TEST(sum.load() == 36);
}

// A handler with no executor of its own runs inline on the pool thread that completes
// the task; when it throws, that pool's handler is told, as for any other work, and the
// worker goes on. A handler bound to the pool's executor likewise.
BOOST_AUTO_TEST_CASE(a_throwing_async_wait_handler_goes_to_the_pool_handler_and_the_worker_lives) {
  metronome::manual_clock clock;
  metronome::test::exception_log log;
  metronome::pool_options o;
  o.time_source = &clock;
  o.exception_handler = log.handler();
  metronome::scheduled_thread_pool pool(o);
  auto f = pool.schedule([] { return 1; }, 1ms);
  f.async_wait([](std::exception_ptr, int) { throw std::runtime_error("inline handler"); });
  f.async_wait(
      metronome::net::bind_executor(pool, [](std::exception_ptr, int) { throw std::runtime_error("bound handler"); }));
  clock.advance(1ms);
  BOOST_TEST(f.get() == 1);
  BOOST_TEST(pool.submit([] { return 7; }).get() == 7);
  auto seen = log.messages();
  std::sort(seen.begin(), seen.end());
  BOOST_TEST(seen == (std::vector<std::string>{"bound handler", "inline handler"}), boost::test_tools::per_element());
}

// The wait holds outstanding work on its handler's executor until the completion has
// been handed to it, and lets go right after (the pool has one thread: once a later
// task ran, the completion was handed on).
BOOST_AUTO_TEST_CASE(async_wait_holds_work_on_the_handler_executor_until_the_completion_is_handed_over) {
  manual_pool mp;
  metronome::net::io_context io;
  metronome::test::counting_executor::counts work;
  int held_while_running = -1;
  auto f = mp.pool.schedule([] { return 1; }, 1ms);
  f.async_wait(metronome::net::bind_executor(metronome::test::counting_executor(io, work),
                                          [&](std::exception_ptr, int) { held_while_running = work.held.load(); }));
  BOOST_TEST(work.held.load() == 1);
  mp.clock.advance(1ms);
  mp.pool.submit([] {}).get();
  BOOST_TEST(work.held_when_handed.load() == 1); // held while the completion was handed to io
  BOOST_TEST(work.held.load() == 0);             // and let go right after, on the pool thread
  BOOST_TEST(work.released_elsewhere.load() == 1);
  io.run(); // io's own count of the queued completion keeps it running
  BOOST_TEST(held_while_running == 0);
}

BOOST_AUTO_TEST_CASE(async_waits_completing_onto_a_dying_io_context_leave_it_alone) {
  metronome::test::on_one_cpu one_cpu; // first: the pool's threads too
  manual_pool mp;
  metronome::test::complete_onto_dying_io_contexts(2000, [&](metronome::net::io_context& io, std::function<void()> ran) {
    auto f = mp.pool.schedule([] { return 1; }, 1ms);
    f.async_wait(metronome::net::bind_executor(io, [ran](std::exception_ptr, int) { ran(); }));
    mp.clock.advance(1ms);
  });
}

// A wait ended by anything but the thread that ran the task never runs inside the call
// that ended it: a caller may hold a lock its handler takes. With no executor of its own
// the handler is queued on the task's pool (as Asio posts to an I/O object's executor);
// with one, it is posted there.
namespace {
struct ended_elsewhere {
  std::atomic<bool> inside{false}; // the ending call is under way
  // (ran inside the call: on its thread while it was under way; got cancelled_error)
  std::promise<std::pair<bool, bool>> seen;
  std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> same_thread{false};

  auto handler() {
    return [this](std::exception_ptr e) {
      bool cancelled = false;
      try {
        if (e) std::rethrow_exception(e);
      } catch (const metronome::cancelled_error&) {
        cancelled = true;
      } catch (...) {
      }
      same_thread = std::this_thread::get_id() == caller;
      seen.set_value({inside.load() && same_thread.load(), cancelled});
    };
  }
  template <class F>
  void end_with(F&& call) {
    inside = true;
    call();
    inside = false;
  }
  void check() {
    auto f = seen.get_future();
    BOOST_REQUIRE(f.wait_for(10s) == std::future_status::ready);
    auto [ran_inside, cancelled] = f.get();
    BOOST_TEST(!ran_inside);
    BOOST_TEST(cancelled);
    BOOST_TEST(!same_thread.load());
  }
};
} // namespace

BOOST_AUTO_TEST_CASE(a_wait_with_no_executor_never_runs_inside_cancel) {
  manual_pool mp;
  ended_elsewhere e;
  auto f = mp.pool.schedule([] {}, 1h);
  f.async_wait(e.handler());
  e.end_with([&] { BOOST_TEST(f.cancel()); });
  e.check();
  // Queued to run (out of the delay queue) when cancelled: the same.
  metronome::test::gate g;
  metronome::test::counter started;
  BOOST_REQUIRE(metronome::test::occupy_worker(mp.pool, g, started));
  auto q = mp.pool.schedule([] {}, 0ms);
  ended_elsewhere e2;
  q.async_wait(e2.handler());
  e2.end_with([&] { BOOST_TEST(q.cancel()); });
  g.open();
  e2.check();
}

// A wait started on a task that has already ended never runs inside async_wait: bound
// to an io_context it is posted there (nothing until the context runs); a plain callback
// is queued on the task's pool and runs on one of its workers; both with the value.
BOOST_AUTO_TEST_CASE(a_wait_on_a_task_already_ended_never_runs_inside_async_wait) {
  scheduled_thread_pool pool(1);
  auto f = pool.submit([] { return 7; });
  BOOST_REQUIRE(f.get() == 7);
  metronome::net::io_context io;
  std::atomic<int> bound_value{0};
  f.async_wait(metronome::net::bind_executor(io, [&](std::exception_ptr e, int v) { bound_value = e ? -1 : v; }));
  BOOST_TEST(bound_value.load() == 0); // not inside the initiation
  io.run();
  BOOST_TEST(bound_value.load() == 7);
  std::atomic<bool> inside{true};
  std::promise<std::pair<bool, int>> seen; // (ran inside async_wait, value)
  const auto caller = std::this_thread::get_id();
  f.async_wait([&](std::exception_ptr e, int v) {
    seen.set_value({inside.load() && std::this_thread::get_id() == caller, e ? -1 : v});
  });
  inside = false;
  auto done = seen.get_future();
  BOOST_REQUIRE(done.wait_for(10s) == std::future_status::ready);
  auto [ran_inside, value] = done.get();
  BOOST_TEST(!ran_inside);
  BOOST_TEST(value == 7);
}

// No thread of the library's own: a plain callback's wait, ended by a cancel() from
// outside, runs on one of the task's pool's workers, and the process has the pool's
// threads and this one only (the handler used to go through a process-wide timing
// thread).
BOOST_AUTO_TEST_CASE(a_wait_with_no_executor_ended_elsewhere_runs_on_the_task_s_pool_and_starts_no_thread) {
  const std::size_t before = metronome::test::process_threads();
  scheduled_thread_pool pool(2);
  auto f = pool.schedule([] {}, 1h);
  std::promise<bool> on_pool;
  f.async_wait([&](std::exception_ptr) { on_pool.set_value(pool.get_executor().running_in_this_thread()); });
  BOOST_TEST(f.cancel());
  auto ran = on_pool.get_future();
  BOOST_REQUIRE(ran.wait_for(10s) == std::future_status::ready);
  BOOST_TEST(ran.get());
  BOOST_TEST(metronome::test::process_threads() == before + 2);
}

// The same for a plain callback abandoned through its cancellation slot (the task goes
// on): its operation_aborted runs on the task's pool, not on a thread of Asio's
// system_context.
BOOST_AUTO_TEST_CASE(a_wait_with_no_executor_cancelled_through_its_slot_runs_on_the_task_s_pool_and_starts_no_thread) {
  const std::size_t before = metronome::test::process_threads();
  scheduled_thread_pool pool(2);
  auto f = pool.schedule([] {}, 1h);
  std::promise<std::pair<bool, bool>> seen; // {aborted, on the pool}
  metronome::net::cancellation_signal sig;
  f.async_wait(metronome::net::bind_cancellation_slot(sig.slot(), [&](std::exception_ptr e) {
    bool aborted = false;
    try {
      if (e) std::rethrow_exception(e);
    } catch (const metronome::system_error& se) {
      aborted = se.code() == metronome::net::error::operation_aborted;
    } catch (...) {
    }
    seen.set_value({aborted, pool.get_executor().running_in_this_thread()});
  }));
  sig.emit(metronome::net::cancellation_type::terminal);
  auto ran = seen.get_future();
  BOOST_REQUIRE(ran.wait_for(10s) == std::future_status::ready);
  const auto [aborted, on_pool] = ran.get();
  BOOST_TEST(aborted);
  BOOST_TEST(on_pool);
  BOOST_TEST(!f.is_done()); // abandoning the wait did nothing to the task
  BOOST_TEST(metronome::test::process_threads() == before + 2);
}

// With no thread of the task's pool left (terminated), such a handler runs on the
// calling thread - even inside async_wait: nothing else would ever run it.
BOOST_AUTO_TEST_CASE(a_wait_with_no_executor_on_a_terminated_pool_runs_on_the_calling_thread) {
  scheduled_thread_pool pool(1);
  auto f = pool.schedule([] {}, 1h);
  BOOST_TEST(f.cancel());
  pool.shutdown();
  pool.join();
  bool ran = false;
  std::thread::id where;
  f.async_wait([&](std::exception_ptr e) {
    ran = e != nullptr;
    where = std::this_thread::get_id();
  });
  BOOST_TEST(ran);
  BOOST_TEST((where == std::this_thread::get_id()));
}

BOOST_AUTO_TEST_CASE(a_wait_ended_by_shutdown_now_or_the_pool_destructor_never_runs_inside_it) {
  ended_elsewhere by_shutdown, by_destructor;
  {
    manual_pool mp;
    // A worker busy meanwhile: the pool still has a thread when the returned task is
    // dropped (with none left, the rule is the calling thread).
    metronome::test::gate release;
    metronome::test::counter started;
    BOOST_REQUIRE(metronome::test::occupy_worker(mp.pool, release, started));
    auto f = mp.pool.schedule([] {}, 1h);
    f.async_wait(by_shutdown.handler());
    by_shutdown.end_with([&] { mp.pool.shutdown_now(); }); // the returned task dropped
    release.open();
  }
  by_shutdown.check();
  auto mp = std::make_unique<manual_pool>();
  auto f = mp->pool.schedule([] {}, 1h);
  f.async_wait(by_destructor.handler());
  by_destructor.end_with([&] { mp.reset(); });
  by_destructor.check();
}

BOOST_AUTO_TEST_CASE(a_wait_ended_by_dispose_never_runs_inside_it) {
  manual_pool mp;
  ended_elsewhere e;
  auto serial = metronome::make_serial_executor(mp.pool);
  auto f = serial.schedule([] {}, 1h);
  f.async_wait(e.handler());
  e.end_with([&] { serial.dispose(); });
  e.check();
}

// With an executor of its own, a cancel from inside that executor posts the completion
// rather than dispatching it into the cancelling handler.
BOOST_AUTO_TEST_CASE(a_wait_bound_to_an_io_context_is_posted_when_cancelled_from_that_io_context) {
  manual_pool mp;
  metronome::net::io_context io;
  auto f = mp.pool.schedule([] { return 1; }, 1h);
  std::vector<std::string> order;
  f.async_wait(metronome::net::bind_executor(io, [&](std::exception_ptr e, int) {
    order.push_back(e ? "completion" : "completion without error");
  }));
  metronome::net::post(io, [&] {
    order.push_back("cancel");
    BOOST_TEST(f.cancel());
    order.push_back("after cancel");
  });
  io.run();
  BOOST_TEST(order == (std::vector<std::string>{"cancel", "after cancel", "completion"}), boost::test_tools::per_element());
}

// Per-operation cancellation abandons the wait, never the task: the handler completes
// with operation_aborted (posted), the task runs, other waits still get its value.
namespace {
bool is_aborted(const std::exception_ptr& e) {
  try {
    if (e) std::rethrow_exception(e);
  } catch (const metronome::system_error& se) {
    return se.code() == metronome::net::error::operation_aborted;
  } catch (...) {
  }
  return false;
}
} // namespace

BOOST_AUTO_TEST_CASE(per_operation_cancellation_abandons_the_wait_not_the_task) {
  manual_pool mp;
  metronome::net::io_context io;
  auto f = mp.pool.schedule([] { return 5; }, 1s);
  metronome::net::cancellation_signal sig;
  std::vector<std::string> order;
  int other = 0;
  f.async_wait(metronome::net::bind_cancellation_slot(
      sig.slot(), metronome::net::bind_executor(io, [&](std::exception_ptr e, int v) {
        order.push_back(is_aborted(e) && v == 0 ? "aborted" : "not aborted");
      })));
  f.async_wait(metronome::net::bind_executor(io, [&](std::exception_ptr e, int v) { other = e ? -1 : v; }));
  metronome::net::post(io, [&] {
    order.push_back("emit");
    sig.emit(metronome::net::cancellation_type::terminal);
    order.push_back("after emit"); // posted, never inside the emission
  });
  while (order.size() < 3) io.run_one(); // the other wait holds work on io: run() would not return
  BOOST_TEST(order == (std::vector<std::string>{"emit", "after emit", "aborted"}), boost::test_tools::per_element());
  BOOST_TEST(!f.is_done()); // the task goes on
  sig.emit(metronome::net::cancellation_type::terminal); // a second emission: nothing left to do
  mp.clock.advance(1s);
  BOOST_TEST(f.get() == 5);
  io.run();
  BOOST_TEST(other == 5);
}

BOOST_AUTO_TEST_CASE(a_wait_races_its_cancellation_and_completes_exactly_once) {
  metronome::scheduled_thread_pool pool(2);
  metronome::net::io_context io;
  constexpr int rounds = 3000;
  int completions = 0, aborted = 0, valued = 0;
  for (int i = 0; i < rounds; ++i) {
    auto sig = std::make_shared<metronome::net::cancellation_signal>();
    auto f = pool.submit([i] { return i; });
    f.async_wait(metronome::net::bind_cancellation_slot(
        sig->slot(), metronome::net::bind_executor(io, [&, i](std::exception_ptr e, int v) {
          ++completions;
          if (is_aborted(e))
            ++aborted;
          else if (!e && v == i)
            ++valued;
        })));
    metronome::net::post(io, [sig] { sig->emit(metronome::net::cancellation_type::terminal); });
    io.run();
    io.restart();
    BOOST_REQUIRE(completions == i + 1);
  }
  BOOST_TEST(aborted + valued == rounds);
  BOOST_TEST_MESSAGE("aborted " << aborted << ", completed with the value " << valued);
}

// The waits are listed in the buckets of the tasks' parking stripes, not in the task
// nodes (scheduled_task_base::add_hook()): 4,096 tasks in 1,024 buckets, so every bucket
// holds the waits of several tasks. Abandoning waits through their slots, cancelling
// tasks, and tasks running at two times each complete exactly the waits they end, once,
// with their own task's outcome; the others stay pending until their own task ends.
namespace {
// -1: operation_aborted; -3: cancelled_error; -4: another exception; else the value.
int outcome_code(const std::exception_ptr& e, int v) {
  if (!e) return v;
  if (is_aborted(e)) return -1;
  try {
    std::rethrow_exception(e);
  } catch (const metronome::cancelled_error&) {
    return -3;
  } catch (...) {
  }
  return -4;
}
} // namespace

BOOST_AUTO_TEST_CASE(waits_on_tasks_sharing_a_bucket_complete_with_their_own_task) {
  manual_pool mp;
  metronome::net::io_context io;
  constexpr int n = 4096;
  std::vector<scheduled_future<int>> fs;
  std::vector<int> got(2 * n, -2), calls(2 * n, 0);
  std::vector<metronome::net::cancellation_signal> sigs(n);
  int completed = 0;
  auto handler = [&](int k) {
    return metronome::net::bind_executor(io, [&, k](std::exception_ptr e, int v) {
      ++calls[k];
      got[k] = outcome_code(e, v);
      ++completed;
    });
  };
  for (int i = 0; i < n; ++i) {
    fs.push_back(mp.pool.schedule([i] { return i; }, i % 3 == 0 ? 1s : 2s));
    fs[i].async_wait(metronome::net::bind_cancellation_slot(sigs[i].slot(), handler(2 * i)));
    fs[i].async_wait(handler(2 * i + 1));
  }
  auto cancelled = [](int i) { return i % 3 == 2 && i % 5 == 0; };
  int expected = 0;
  for (int i = 0; i < n; ++i) {
    if (i % 3 == 1) {
      sigs[i].emit(metronome::net::cancellation_type::terminal);
      expected += 1;
    } else if (cancelled(i)) {
      BOOST_REQUIRE(fs[i].cancel());
      expected += 2;
    }
  }
  while (completed < expected) io.run_one(); // pending waits hold work on io: run() would not return
  mp.clock.advance(1s);                       // the tasks i % 3 == 0 run
  for (int i = 0; i < n; i += 3) fs[i].wait();
  expected += 2 * ((n + 2) / 3);
  while (completed < expected) io.run_one();
  for (int i = 0; i < n; ++i) { // every wait of a task due at 2 s that nothing ended is pending
    if (i % 3 != 0 && !cancelled(i)) BOOST_REQUIRE(calls[2 * i + 1] == 0);
  }
  mp.clock.advance(1s);
  io.run(); // the rest complete, and then no work is left
  for (int i = 0; i < n; ++i) {
    BOOST_REQUIRE(calls[2 * i] == 1);
    BOOST_REQUIRE(calls[2 * i + 1] == 1);
    const int value = cancelled(i) ? -3 : i;
    BOOST_REQUIRE(got[2 * i] == (i % 3 == 1 ? -1 : value));
    BOOST_REQUIRE(got[2 * i + 1] == value);
  }
  BOOST_TEST(completed == 2 * n);
}

BOOST_AUTO_TEST_CASE(a_wait_in_an_awaitable_or_and_under_cancel_after_ends_on_time) {
  using namespace metronome::net::experimental::awaitable_operators;
  manual_pool mp;
  auto f = mp.pool.schedule([] { return 3; }, 1h);
  auto raced = metronome::net::co_spawn(
      mp.pool,
      [&]() -> metronome::net::awaitable<std::size_t> {
        auto r = co_await (f.async_wait(metronome::net::use_awaitable) ||
                           metronome::async_delay(mp.pool, 10ms, metronome::net::use_awaitable));
        co_return r.index();
      },
      metronome::net::use_future);
  auto timed = metronome::net::co_spawn(
      mp.pool,
      [&]() -> metronome::net::awaitable<bool> {
        try {
          co_await f.async_wait(metronome::cancel_after(20ms, metronome::net::use_awaitable));
        } catch (const metronome::system_error& e) {
          co_return e.code() == metronome::net::error::operation_aborted;
        }
        co_return false;
      },
      metronome::net::use_future);
  // Both coroutines waiting: the task, the delay and cancel_after's timer in the queue.
  BOOST_REQUIRE(metronome::test::poll_until([&] { return mp.pool.stats().delayed_queued == 3u; }));
  mp.clock.advance(10ms);
  BOOST_TEST(raced.get() == 1u); // the delay won; the abandoned wait let the || end
  BOOST_TEST((timed.wait_for(20ms) == std::future_status::timeout));
  mp.clock.advance(10ms);
  BOOST_TEST(timed.get());
  BOOST_TEST(!f.is_done()); // neither touched the task
  BOOST_TEST(f.cancel());
}

// ---- handles after the pool

BOOST_AUTO_TEST_CASE(a_pending_task_and_its_handle_outlive_the_pool) {
  std::vector<metronome::pending_task> left;
  metronome::scheduled_future<int> delayed, ready;
  std::atomic<int> ran{0};
  {
    held_pool hp(pool_options::fixed(1));
    ready = hp.pool.submit([&] { return ++ran; });
    delayed = hp.pool.schedule([&] { return ++ran; }, 1h);
    left = hp.pool.shutdown_now();
    BOOST_CHECK_EQUAL(left.size(), 2u);
    hp.release();
  } // the pool is gone
  BOOST_CHECK(!delayed.is_done());
  BOOST_CHECK(delayed.delay() <= 0ns);
  BOOST_CHECK(delayed.cancel());
  BOOST_CHECK(delayed.is_cancelled());
  BOOST_CHECK(!delayed.cancel());
  for (auto& t : left) t(); // the cancelled one does not run
  BOOST_CHECK_EQUAL(ran.load(), 1);
  BOOST_CHECK_EQUAL(ready.get(), 1);
  BOOST_CHECK(!ready.cancel());
}

BOOST_AUTO_TEST_CASE(handles_of_work_the_destructor_cancelled_stay_usable) {
  metronome::scheduled_future<void> h, p;
  {
    scheduled_thread_pool pool(1);
    h = pool.schedule([] {}, 1h);
    p = pool.schedule_at_fixed_rate([] {}, 1h, 1h);
  }
  BOOST_CHECK(h.is_cancelled());
  BOOST_CHECK(p.is_cancelled());
  BOOST_CHECK(!h.cancel());
  BOOST_CHECK(!p.cancel());
  BOOST_CHECK(h.delay() == 0ns);
  BOOST_CHECK_THROW(h.get(), metronome::cancelled_error);
}

// A task names its pool's anchor by index and generation (pool_anchor_id): with pools
// alive across several blocks of the anchor table, and anchors recycled as pools go,
// each handle still finds its own pool, or learns that it is gone.
BOOST_AUTO_TEST_CASE(handles_find_their_own_pool_among_many_and_learn_when_it_is_gone) {
  constexpr int pools = 3 * int(metronome::detail::anchor_block_size) + 5;
  std::vector<std::unique_ptr<scheduled_thread_pool>> live;
  std::vector<metronome::scheduled_future<void>> handles;
  std::vector<metronome::pending_task> left; // keeps the gone pools' tasks pending
  for (int i = 0; i < pools; ++i) {
    live.push_back(std::make_unique<scheduled_thread_pool>(pool_options::fixed(1)));
    handles.push_back(live.back()->schedule([] {}, 1h + i * 1s));
  }
  for (int i = 0; i < pools; i += 2) { // every other pool gone, its task still pending
    for (auto& t : live[i]->shutdown_now()) left.push_back(std::move(t));
    live[i].reset();
  }
  BOOST_REQUIRE_EQUAL(left.size(), std::size_t(pools + 1) / 2);
  // New pools take the recycled anchors (a new generation each).
  std::vector<std::unique_ptr<scheduled_thread_pool>> fresh;
  std::vector<metronome::scheduled_future<void>> fresh_handles;
  for (int i = 0; i < pools; ++i) {
    fresh.push_back(std::make_unique<scheduled_thread_pool>(pool_options::fixed(1)));
    fresh_handles.push_back(fresh.back()->schedule([] {}, 2h));
  }
  for (int i = 0; i < pools; ++i) {
    if (i % 2 == 0) { // its pool is gone: it learns so, and touches the anchor's new pool not
      BOOST_TEST(!handles[i].is_done());
      BOOST_CHECK(handles[i].delay() == 0ns); // (BOOST_CHECK: libc++ 16 cannot print a duration)
      BOOST_TEST(!handles[i].reset(1s));
      BOOST_TEST(handles[i].cancel());
      BOOST_TEST(handles[i].is_cancelled());
    } else { // its own pool: the delay it was given, and a cancel that takes it out
      BOOST_CHECK(handles[i].delay() > 1h + i * 1s - 1min);
      BOOST_CHECK(handles[i].delay() <= 1h + i * 1s);
      BOOST_TEST(handles[i].cancel());
      BOOST_TEST(live[i]->stats().delayed_queued == 0u);
    }
  }
  for (std::size_t i = 0; i < fresh.size(); ++i) {
    BOOST_TEST(fresh[i]->stats().delayed_queued == 1u); // no old handle reached it
    BOOST_CHECK(fresh_handles[i].delay() > 1h);
    BOOST_TEST(fresh_handles[i].cancel());
    BOOST_TEST(fresh[i]->stats().delayed_queued == 0u);
  }
}

BOOST_AUTO_TEST_CASE(cancels_racing_the_pool_s_destruction_are_safe) {
  for (int round = 0; round < 20; ++round) {
    std::vector<metronome::scheduled_future<void>> handles;
    auto pool = std::make_unique<scheduled_thread_pool>(2);
    for (int i = 0; i < 200; ++i) handles.push_back(pool->schedule([] {}, 1h + i * 1ms));
    std::atomic<bool> go{false};
    std::thread canceller([&] {
      while (!go.load()) {
      }
      for (auto& h : handles) {
        h.cancel();
        (void)h.delay();
      }
    });
    go = true;
    pool.reset();
    canceller.join();
    for (auto& h : handles) BOOST_CHECK(h.is_cancelled());
  }
}

BOOST_AUTO_TEST_SUITE_END()
