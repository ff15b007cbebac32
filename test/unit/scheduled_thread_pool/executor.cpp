#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/serial_executor.hpp>

#include "common/latch_task.hpp"
#include "common/poll_until.hpp"

#include <metronome/detail/asio.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <thread>
#include <vector>

namespace net = metronome::net;
using metronome::scheduled_thread_pool;
using executor = scheduled_thread_pool::executor_type;

static_assert(net::execution::is_executor<executor>::value);
static_assert(net::execution::executor<executor>);
static_assert(net::is_executor<executor>::value); // Networking TS
static_assert(std::is_convertible_v<executor, net::any_io_executor>);
static_assert(std::is_nothrow_copy_constructible_v<executor>);
static_assert(net::can_require<executor, net::execution::blocking_t::never_t>::value);
static_assert(net::can_prefer<executor, net::execution::blocking_t::possibly_t>::value);
static_assert(net::can_require<executor, net::execution::outstanding_work_t::tracked_t>::value);
static_assert(net::can_prefer<executor, net::execution::relationship_t::continuation_t>::value);
static_assert(net::can_query<executor, net::execution::context_t>::value);

BOOST_AUTO_TEST_SUITE(pool_executor_suite)

BOOST_AUTO_TEST_CASE(queries_and_requires_report_properties) {
  scheduled_thread_pool pool(2);
  auto ex = pool.get_executor();
  BOOST_TEST(&net::query(ex, net::execution::context) == &pool);
  BOOST_TEST((net::query(ex, net::execution::blocking) == net::execution::blocking.possibly));
  auto never = net::require(ex, net::execution::blocking.never);
  BOOST_TEST((net::query(never, net::execution::blocking) == net::execution::blocking.never));
  auto cont = net::prefer(ex, net::execution::relationship.continuation);
  BOOST_TEST((net::query(cont, net::execution::relationship) == net::execution::relationship.continuation));
  auto tracked = net::require(ex, net::execution::outstanding_work.tracked);
  BOOST_TEST((net::query(tracked, net::execution::outstanding_work) == net::execution::outstanding_work.tracked));
  BOOST_TEST(net::query(ex, net::execution::occupancy) == 2u);
  BOOST_TEST((ex == pool.get_executor()));
  scheduled_thread_pool other(1);
  BOOST_TEST((ex != other.get_executor()));
  BOOST_TEST(!ex.running_in_this_thread());
}

BOOST_AUTO_TEST_CASE(post_runs_on_a_pool_thread) {
  scheduled_thread_pool pool(2);
  std::promise<bool> p;
  net::post(pool, [&] { p.set_value(pool.get_executor().running_in_this_thread()); });
  BOOST_TEST(p.get_future().get());
}

BOOST_AUTO_TEST_CASE(dispatch_is_inline_on_a_pool_thread_and_post_is_not) {
  scheduled_thread_pool pool(1);
  std::mutex m;
  std::vector<int> order;
  auto add = [&](int v) {
    std::lock_guard lk(m);
    order.push_back(v);
  };
  std::promise<void> p;
  net::post(pool, [&] {
    add(0);
    net::dispatch(pool, [&] { add(1); }); // inline: before 2
    net::post(pool, [&] {
      add(3);
      p.set_value();
    }); // queued: after 2
    add(2);
  });
  p.get_future().get();
  std::lock_guard lk(m);
  BOOST_TEST((order == std::vector<int>{0, 1, 2, 3}));
}

BOOST_AUTO_TEST_CASE(defer_runs_on_the_same_thread_after_the_current_task) {
  scheduled_thread_pool pool(2);
  std::promise<bool> p;
  std::atomic<int> step{0};
  net::post(pool, [&] {
    auto me = std::this_thread::get_id();
    net::defer(pool, [&, me] { p.set_value(std::this_thread::get_id() == me && step.load() == 1); });
    step = 1; // the deferred function has not run yet
  });
  BOOST_TEST(p.get_future().get());
}

BOOST_AUTO_TEST_CASE(defer_chains_make_progress_with_other_work) {
  scheduled_thread_pool pool(1);
  std::atomic<int> chain{0};
  std::atomic<bool> other{false};
  std::promise<int> done;
  std::function<void()> step = [&] {
    if (++chain < 10000 && !other)
      net::defer(pool, step);
    else
      done.set_value(chain.load());
  };
  net::post(pool, step);
  net::post(pool, [&] { other = true; }); // must run although the chain never ends by itself
  BOOST_TEST(done.get_future().get() < 10000);
}

// A delayed task falls due on a pool whose only worker never runs out of ready work: a
// chain of handlers that each post (or defer) the next, so the worker never parks and
// nothing submitted due now promotes the heap for it. The worker's picks promote it (a
// pick does once the head is 10 us late, pick_promotion_lag_ns in src/pool_core.cpp; a
// worker running its own deferred continuations looks every 61st pick): it runs while
// the chain still runs. A deferring chain starved it for as long as the chain ran.
// Bounds generous: a busy 2-core machine, sanitizers.
void a_due_task_runs_under_a_chain(bool defer) {
  scheduled_thread_pool pool(1);
  std::atomic<bool> stop{false};
  std::atomic<long> steps{0};
  std::function<void()> step = [&] {
    ++steps;
    if (stop) return;
    if (defer)
      net::defer(pool, step);
    else
      net::post(pool, step);
  };
  net::post(pool, step);
  BOOST_REQUIRE(metronome::test::poll_until([&] { return steps.load() > 1000; }));
  const auto start = std::chrono::steady_clock::now();
  auto ran = pool.schedule([&] { return !stop.exchange(true); }, std::chrono::milliseconds(5));
  const bool in_time = ran.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  const auto after = std::chrono::steady_clock::now() - start;
  stop = true; // ends the chain either way
  BOOST_REQUIRE(in_time);
  BOOST_TEST(ran.get()); // the chain still ran when it did
  BOOST_TEST((after >= std::chrono::milliseconds(5)));
  BOOST_TEST((after < std::chrono::seconds(2)));
}

BOOST_AUTO_TEST_CASE(a_due_task_runs_while_the_only_worker_never_runs_out_of_posted_work) {
  a_due_task_runs_under_a_chain(false);
}

BOOST_AUTO_TEST_CASE(a_due_task_runs_while_the_only_worker_keeps_deferring) { a_due_task_runs_under_a_chain(true); }

// The look a deferring worker takes every 61st pick promotes whatever is due, without the
// 10 us lag of a busy worker's pick: a task that fell due just before that pick runs
// there. With the lag it was skipped and waited 61 picks more (found by an adversary
// pass). One worker runs a chain of short deferred runs; each round, s runs after the
// last delayed task ran (s = 0, 1, ... 63), a run schedules one due 20 us on and spins
// until it is due. The task notes how many runs of the chain came after its due time. In
// one round at least the pick after that run is a look: its task runs before the chain's
// next run. In every round the task waits at most for the next look.
BOOST_AUTO_TEST_CASE(a_deferring_worker_s_look_at_the_heap_promotes_what_is_due_at_once) {
  scheduled_thread_pool pool(1);
  constexpr int rounds = 64;
  // Touched by the pool's one thread only: the chain's runs and the delayed tasks.
  long runs = 0;
  long since = 0;
  long due_run = 0;
  bool waiting = false;
  std::vector<long> late_by; // runs of the chain between a task's due time and its run
  std::promise<void> done;
  std::function<void()> step = [&] {
    ++runs;
    if (!waiting && since++ == static_cast<long>(late_by.size())) {
      waiting = true;
      due_run = runs;
      pool.schedule(
          [&] {
            late_by.push_back(runs - due_run);
            waiting = false;
            since = 0;
          },
          std::chrono::microseconds(20));
      const auto due_by = std::chrono::steady_clock::now() + std::chrono::microseconds(21);
      while (std::chrono::steady_clock::now() < due_by) {
      }
    }
    if (late_by.size() < static_cast<std::size_t>(rounds) && runs < 1'000'000)
      net::defer(pool, step);
    else
      done.set_value();
  };
  net::post(pool, step);
  BOOST_REQUIRE((done.get_future().wait_for(std::chrono::seconds(60)) == std::future_status::ready));
  pool.join(); // the pool's thread is done with the counters
  BOOST_REQUIRE(late_by.size() == static_cast<std::size_t>(rounds));
  BOOST_TEST(*std::min_element(late_by.begin(), late_by.end()) == 0);
  BOOST_TEST(*std::max_element(late_by.begin(), late_by.end()) <= 61);
}

BOOST_AUTO_TEST_CASE(converts_to_any_io_executor) {
  scheduled_thread_pool pool(1);
  net::any_io_executor any = pool.get_executor();
  std::promise<void> p;
  net::post(any, [&] { p.set_value(); });
  p.get_future().get();
}

BOOST_AUTO_TEST_CASE(co_spawn_with_detached_use_future_and_callback) {
  scheduled_thread_pool pool(2);
  auto body = []() -> net::awaitable<int> { co_return 7; };
  auto fut = net::co_spawn(pool, body(), net::use_future);
  BOOST_TEST(fut.get() == 7);
  std::promise<int> p;
  net::co_spawn(pool, body(), [&](std::exception_ptr, int v) { p.set_value(v); });
  BOOST_TEST(p.get_future().get() == 7);
  std::promise<void> d;
  net::co_spawn(
      pool,
      [&]() -> net::awaitable<void> {
        d.set_value();
        co_return;
      },
      net::detached);
  d.get_future().get();
}

BOOST_AUTO_TEST_CASE(tracked_work_keeps_join_waiting) {
  scheduled_thread_pool pool(1);
  auto guard = net::make_work_guard(pool.get_executor());
  std::atomic<bool> joined{false};
  std::thread t([&] {
    pool.join();
    joined = true;
  });
  BOOST_TEST(!pool.await_termination(std::chrono::milliseconds(50)));
  BOOST_TEST(!joined.load());
  std::atomic<bool> ran{false};
  net::post(pool, [&] { ran = true; }); // still accepted: the pool is not shut down
  guard.reset();
  t.join();
  BOOST_TEST(ran.load());
  BOOST_TEST(pool.is_terminated());
}

BOOST_AUTO_TEST_CASE(bind_executor_completes_on_a_strand_of_the_pool) {
  scheduled_thread_pool pool(2);
  auto strand = net::make_strand(pool.get_executor());
  std::atomic<int> inside{0}, overlap{0};
  metronome::test::counter done;
  for (int i = 0; i < 200; ++i)
    net::post(pool, net::bind_executor(strand, [&] {
                 if (++inside > 1) ++overlap;
                 --inside;
                 done.add();
               }));
  BOOST_TEST(done.wait_for_at_least(200));
  BOOST_TEST(overlap.load() == 0);
}

BOOST_AUTO_TEST_CASE(empty_function_on_the_executor_path_is_reported) {
  std::atomic<int> invalid{0};
  metronome::pool_options o;
  o.exception_handler = [&](std::exception_ptr e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::invalid_argument&) {
      ++invalid;
    } catch (...) {
    }
  };
  scheduled_thread_pool pool(o);
  std::function<void()> empty;
  pool.get_executor().execute(empty);
  BOOST_TEST(invalid.load() == 1);
}

// net::post/dispatch/defer wrap the handler before execute() sees it: a null function
// pointer or an empty std::function inside is still reported as invalid_argument (a null
// pointer used to crash the worker), on the pool and on a serial executor over it.
BOOST_AUTO_TEST_CASE(empty_handlers_through_post_dispatch_and_defer_are_reported) {
  std::atomic<int> invalid{0}, other{0};
  metronome::pool_options o;
  o.exception_handler = [&](std::exception_ptr e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::invalid_argument&) {
      ++invalid;
    } catch (...) {
      ++other;
    }
  };
  {
    scheduled_thread_pool pool(o);
    auto serial = metronome::make_serial_executor(pool);
    void (*null_fn)() = nullptr;
    std::function<void()> empty;
    net::post(pool, null_fn);
    net::post(pool, empty);
    net::dispatch(pool.get_executor(), empty);
    net::defer(pool.get_executor(), null_fn);
    net::post(serial, null_fn);
    net::post(serial, empty);
    pool.shutdown();
    BOOST_TEST(pool.await_termination(std::chrono::seconds(10)));
  }
  BOOST_TEST(invalid.load() == 6);
  BOOST_TEST(other.load() == 0);
}

BOOST_AUTO_TEST_CASE(io_context_handlers_post_onto_the_pool_and_back) {
  net::io_context io;
  scheduled_thread_pool pool(2);
  std::atomic<bool> on_pool{false}, back_on_io{false};
  auto io_thread = std::this_thread::get_id();
  net::post(io, [&] {
    net::post(pool, [&] {
      on_pool = pool.get_executor().running_in_this_thread();
      net::post(io, [&] { back_on_io = std::this_thread::get_id() == io_thread; });
    });
  });
  auto guard = net::make_work_guard(io);
  std::thread stopper([&] {
    metronome::test::poll_until([&] { return back_on_io.load(); });
    guard.reset();
  });
  io.run();
  stopper.join();
  BOOST_TEST(on_pool.load());
  BOOST_TEST(back_on_io.load());
}

BOOST_AUTO_TEST_SUITE_END()
