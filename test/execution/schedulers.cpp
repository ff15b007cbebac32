// The P2300 schedulers (metronome/execution.hpp): when and where each operation completes,
// stop requests, shutdown, serial order, the wheel. docs/semantics.md, "std::execution".
#include <metronome/execution.hpp>
#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>
#include <metronome/serial_executor.hpp>
#include <metronome/wheel_timer.hpp>

#include "common/hooks.hpp"
#include "common/manual_pool.hpp"
#include "common/poll_until.hpp"
#include "execution/receiver.hpp"

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using metronome::manual_clock;
using metronome::scheduled_thread_pool;
using metronome::test::on_clock;
using metronome::test::outcome;
using metronome::test::poll_until;
using metronome::test::started;

namespace {

using pool_sender = metronome::pool_scheduler::sender;
using serial_type = metronome::serial_executor<scheduled_thread_pool::executor_type>;

std::thread::id pool_thread(scheduled_thread_pool& pool) {
  return pool.submit([] { return std::this_thread::get_id(); }).get();
}

} // namespace

BOOST_AUTO_TEST_SUITE(execution_schedulers)

BOOST_AUTO_TEST_CASE(the_three_schedulers_model_the_concepts) {
  static_assert(stdexec::scheduler<metronome::pool_scheduler>);
  static_assert(exec::timed_scheduler<metronome::pool_scheduler>);
  static_assert(stdexec::scheduler<metronome::wheel_scheduler>);
  static_assert(exec::timed_scheduler<metronome::wheel_scheduler>);
  static_assert(stdexec::scheduler<metronome::serial_scheduler<scheduled_thread_pool::executor_type>>);
  static_assert(exec::timed_scheduler<metronome::serial_scheduler<scheduled_thread_pool::executor_type>>);
  static_assert(exec::timed_scheduler<metronome::serial_scheduler<metronome::net::io_context::executor_type>>);
  static_assert(std::is_same_v<exec::time_point_of_t<metronome::pool_scheduler>, metronome::clock::time_point>);
  scheduled_thread_pool pool(1);
  metronome::wheel_timer wheel(pool);
  auto serial = metronome::make_serial_executor(pool.get_executor());
  // The completion scheduler of each sender is the scheduler it came from.
  BOOST_CHECK(stdexec::get_completion_scheduler<stdexec::set_value_t>(
                  stdexec::get_env(pool.get_scheduler().schedule())) == pool.get_scheduler());
  BOOST_CHECK(stdexec::get_completion_scheduler<stdexec::set_value_t>(stdexec::get_env(
                  exec::schedule_after(wheel.get_scheduler(), 1ms))) == wheel.get_scheduler());
  BOOST_CHECK(serial.get_scheduler() == metronome::serial_executor(serial).get_scheduler());
  BOOST_CHECK(!(serial.get_scheduler() == metronome::make_serial_executor(pool.get_executor()).get_scheduler()));
}

// On the pool's manual clock: not due one tick before, due at the time, on a pool thread.
BOOST_AUTO_TEST_CASE(schedule_after_completes_on_a_pool_thread_at_its_time_never_before) {
  manual_clock clock;
  scheduled_thread_pool pool(on_clock(clock));
  const auto worker = pool_thread(pool);
  auto sched = pool.get_scheduler();
  BOOST_CHECK(sched.now() == clock.now());
  outcome o;
  started op(exec::schedule_after(sched, 10ms), o);
  // A task due 1 ns earlier has run: the pool has looked at the delay queue at that time.
  auto marker = pool.schedule([] {}, 10ms - 1ns);
  clock.advance(10ms - 1ns);
  marker.wait();
  BOOST_CHECK_EQUAL(o.completions(), 0);
  clock.advance(1ns);
  o.wait();
  BOOST_CHECK_EQUAL(o.values.load(), 1);
  BOOST_CHECK_EQUAL(o.completions(), 1);
  BOOST_CHECK(o.thread == worker);
}

BOOST_AUTO_TEST_CASE(schedule_at_uses_the_pool_s_time_and_ties_complete_in_start_order) {
  manual_clock clock;
  scheduled_thread_pool pool(on_clock(clock));
  auto sched = pool.get_scheduler();
  std::mutex m;
  std::vector<int> order;
  std::vector<std::unique_ptr<outcome>> outs;
  using at_sender = decltype(exec::schedule_at(sched, sched.now()));
  std::vector<std::unique_ptr<started<at_sender>>> ops;
  const auto when = sched.now() + 5ms;
  for (int i = 0; i < 5; ++i) {
    outs.push_back(std::make_unique<outcome>());
    outs.back()->on_complete = [&m, &order, i] {
      std::lock_guard lk(m);
      order.push_back(i);
    };
    ops.push_back(std::make_unique<started<at_sender>>(exec::schedule_at(sched, when), *outs.back()));
  }
  clock.advance(5ms);
  for (auto& o : outs) o->wait();
  BOOST_CHECK((order == std::vector<int>{0, 1, 2, 3, 4}));
  // A time already passed: completes at once (the next turn of a worker).
  outcome late;
  started op(exec::schedule_at(sched, when - 1s), late);
  late.wait();
  BOOST_CHECK_EQUAL(late.values.load(), 1);
}

// A stop request takes the wait out of the delay queue at once: set_stopped, nothing left.
BOOST_AUTO_TEST_CASE(a_stop_request_removes_the_wait_and_completes_stopped) {
  scheduled_thread_pool pool(1);
  const auto worker = pool_thread(pool);
  stdexec::inplace_stop_source source;
  outcome o;
  started op(exec::schedule_after(pool.get_scheduler(), 1h), o, source.get_token());
  BOOST_CHECK_EQUAL(pool.stats().delayed_queued, 1u);
  source.request_stop();
  o.wait();
  BOOST_CHECK_EQUAL(o.stops.load(), 1);
  BOOST_CHECK_EQUAL(o.completions(), 1);
  BOOST_CHECK(o.thread == worker); // on the pool, not on the thread that asked
  BOOST_CHECK_EQUAL(pool.stats().delayed_queued, 0u);
}

BOOST_AUTO_TEST_CASE(a_stop_requested_before_start_completes_stopped_inline) {
  scheduled_thread_pool pool(1);
  stdexec::inplace_stop_source source;
  source.request_stop();
  outcome o;
  started op(exec::schedule_after(pool.get_scheduler(), 1h), o, source.get_token());
  BOOST_CHECK_EQUAL(o.stops.load(), 1); // inside start()
  BOOST_CHECK(o.thread == std::this_thread::get_id());
  BOOST_CHECK_EQUAL(pool.stats().delayed_queued, 0u);
}

// Due time against stop request, raced: every operation completes exactly once, on a
// thread that runs the scheduler's work (`on_scheduler()` inside the completion).
template <class Scheduler, class OnScheduler>
void race_stops_against_due_times(Scheduler sched, OnScheduler on_scheduler, int n) {
  using sender = decltype(exec::schedule_after(sched, 1us));
  struct one {
    stdexec::inplace_stop_source source;
    outcome out;
    std::unique_ptr<started<sender>> op;
  };
  std::vector<std::unique_ptr<one>> all;
  std::atomic<int> elsewhere{0};
  for (int i = 0; i < n; ++i) {
    all.push_back(std::make_unique<one>());
    all.back()->out.on_complete = [&] {
      if (!on_scheduler()) elsewhere.fetch_add(1);
    };
  }
  std::mt19937 rng(42);
  std::atomic<int> next{0};
  std::thread stopper([&] { // requests stops as the starts go on
    std::mt19937 r(7);
    for (int i = 0; i < n; ++i) {
      while (next.load() <= i) std::this_thread::yield();
      if (r() % 2) all[static_cast<std::size_t>(i)]->source.request_stop();
    }
  });
  for (int i = 0; i < n; ++i) {
    auto& x = *all[static_cast<std::size_t>(i)];
    x.op = std::make_unique<started<sender>>(exec::schedule_after(sched, std::chrono::microseconds(rng() % 300)),
                                             x.out, x.source.get_token());
    next.store(i + 1);
  }
  stopper.join();
  int values = 0, stops = 0;
  for (auto& x : all) {
    x->out.wait();
    BOOST_REQUIRE_EQUAL(x->out.completions(), 1);
    values += x->out.values.load();
    stops += x->out.stops.load();
  }
  BOOST_CHECK_EQUAL(values + stops, n);
  BOOST_CHECK_EQUAL(elsewhere.load(), 0);
  BOOST_TEST_MESSAGE("raced stops: " << values << " values, " << stops << " stopped");
}

BOOST_AUTO_TEST_CASE(a_stop_raced_with_the_due_time_ends_in_exactly_one_completion) {
  scheduled_thread_pool pool(2);
  auto on_pool = [&] { return pool.get_executor().running_in_this_thread(); };
  race_stops_against_due_times(pool.get_scheduler(), on_pool, 4000);
  BOOST_CHECK(poll_until([&] { return pool.stats().delayed_queued == 0; }));
  auto serial = metronome::make_serial_executor(pool.get_executor());
  race_stops_against_due_times(serial.get_scheduler(), on_pool, 2000);
  metronome::wheel_options fine;
  fine.tick = 50us;
  metronome::wheel_timer wheel(pool, fine);
  race_stops_against_due_times(wheel.get_scheduler(), on_pool, 2000);
  BOOST_CHECK(poll_until([&] { return wheel.pending() == 0; }));
}

// The same over an io_context's wheel: fired and stopped completions on its thread.
BOOST_AUTO_TEST_CASE(a_stop_raced_with_a_wheel_s_due_time_over_an_io_context_completes_on_its_thread) {
  metronome::net::io_context io;
  auto guard = metronome::net::make_work_guard(io);
  std::thread runner([&] { io.run(); });
  {
    metronome::wheel_options fine;
    fine.tick = 50us;
    metronome::wheel_timer wheel(io.get_executor(), fine);
    const auto id = runner.get_id();
    race_stops_against_due_times(wheel.get_scheduler(), [id] { return std::this_thread::get_id() == id; }, 2000);
  }
  guard.reset();
  runner.join();
}

BOOST_AUTO_TEST_CASE(shutdown_completes_pending_and_later_operations_stopped) {
  scheduled_thread_pool pool(1);
  auto sched = pool.get_scheduler();
  outcome pending;
  started op(exec::schedule_after(sched, 1h), pending);
  pool.shutdown();
  pending.wait();
  BOOST_CHECK_EQUAL(pending.stops.load(), 1);
  outcome later, now;
  started op2(exec::schedule_after(sched, 1h), later);
  started op3(stdexec::schedule(sched), now);
  later.wait();
  now.wait();
  BOOST_CHECK_EQUAL(later.stops.load(), 1);
  BOOST_CHECK_EQUAL(now.stops.load(), 1);
  pool.join();
  BOOST_CHECK(pool.is_terminated());
  outcome after; // a terminated pool: stopped inside start()
  started op4(exec::schedule_after(sched, 1ms), after);
  BOOST_CHECK_EQUAL(after.stops.load(), 1);
}

BOOST_AUTO_TEST_CASE(shutdown_now_completes_pending_operations_stopped) {
  scheduled_thread_pool pool(1);
  outcome o;
  started op(exec::schedule_after(pool.get_scheduler(), 1h), o);
  BOOST_CHECK(pool.shutdown_now().empty()); // an operation is not a task: never handed back
  o.wait();
  BOOST_CHECK_EQUAL(o.stops.load(), 1);
}

#if defined(METRONOME_TEST_HOOKS)
// The stop request arrives while start() is between arming its stop callback and putting
// the wait in the delay queue (held at wait_before_lock: the pool mutex not yet taken).
// The callback finds nothing to remove; the request must not be lost: add_wait() queues
// the wait aborted, and it completes stopped at once instead of in an hour.
BOOST_AUTO_TEST_CASE(a_stop_request_before_the_wait_is_queued_completes_it_stopped) {
  using metronome::test::hook_stop;
  scheduled_thread_pool pool(1);
  pool.submit([] {}).wait();
  hook_stop stop(metronome::detail::hook_point::wait_before_lock);
  stdexec::inplace_stop_source source;
  outcome o;
  std::unique_ptr<started<pool_sender>> op;
  std::thread starter([&] {
    hook_stop::arm_this_thread();
    op = std::make_unique<started<pool_sender>>(exec::schedule_after(pool.get_scheduler(), 1h), o,
                                                source.get_token());
  });
  BOOST_REQUIRE(stop.arrived());
  source.request_stop(); // the callback runs here, on this thread, before the wait is queued
  BOOST_CHECK_EQUAL(o.completions(), 0);
  stop.release();
  starter.join();
  BOOST_CHECK(poll_until([&] { return o.completions() == 1; }, 20s));
  BOOST_CHECK_EQUAL(o.stops.load(), 1);
  BOOST_CHECK_EQUAL(pool.stats().delayed_queued, 0u);
}

// A wheel operation's stop, held after it took the entry out of the wheel and sent it to
// the executor, before it lets go of the wheel's reference: the worker settles the entry
// meanwhile and lets go of its own, so the canceller's release is the last. The operation
// must still complete on the worker, never on the canceller's thread: that last reference
// sends the entry to the executor once more (docs/design.md "A P2300 operation's wheel
// entry").
BOOST_AUTO_TEST_CASE(a_wheel_operation_whose_stop_lets_go_last_completes_on_the_executor) {
  using metronome::test::hook_stop;
  scheduled_thread_pool pool(1);
  const auto worker = pool_thread(pool);
  metronome::wheel_timer wheel(pool);
  stdexec::inplace_stop_source source;
  outcome o;
  started op(exec::schedule_after(wheel.get_scheduler(), 1h), o, source.get_token());
  hook_stop stop(metronome::detail::hook_point::wheel_cancel_before_release);
  std::thread canceller([&] {
    hook_stop::arm_this_thread();
    source.request_stop(); // the stop callback runs on this thread
  });
  BOOST_REQUIRE(stop.arrived());
  pool.submit([] {}).wait(); // queued behind the entry: the worker has settled it
  BOOST_CHECK_EQUAL(o.completions(), 0); // the canceller still holds the wheel's reference
  stop.release();
  canceller.join();
  o.wait();
  BOOST_CHECK_EQUAL(o.stops.load(), 1);
  BOOST_CHECK_EQUAL(o.completions(), 1);
  BOOST_CHECK(o.thread == worker);
  BOOST_CHECK_EQUAL(wheel.pending(), 0u);
}
#endif

// Serial order: schedule() takes a turn behind the work already posted; completions run
// one at a time, inside the executor.
BOOST_AUTO_TEST_CASE(serial_completions_keep_the_executor_s_order) {
  scheduled_thread_pool pool(2);
  auto serial = metronome::make_serial_executor(pool.get_executor());
  auto sched = serial.get_scheduler();
  std::mutex m;
  std::vector<int> order;
  std::atomic<int> inside{0}, overlaps{0};
  auto record = [&](int i) {
    if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
    {
      std::lock_guard lk(m);
      order.push_back(i);
    }
    inside.fetch_sub(1);
  };
  constexpr int n = 200;
  using sender = decltype(stdexec::schedule(sched));
  std::vector<std::unique_ptr<outcome>> outs;
  std::vector<std::unique_ptr<started<sender>>> ops;
  std::atomic<int> not_inside{0};
  for (int i = 0; i < n; ++i) {
    if (i % 2 == 0) {
      metronome::net::post(serial, [&record, i] { record(i); });
    } else {
      outs.push_back(std::make_unique<outcome>());
      outs.back()->on_complete = [&, i] {
        if (!serial.running_in_this_thread()) not_inside.fetch_add(1);
        record(i);
      };
      ops.push_back(std::make_unique<started<sender>>(stdexec::schedule(sched), *outs.back()));
    }
  }
  for (auto& o : outs) o->wait();
  metronome::net::post(serial, [] {}); // and the posts before it: a last turn
  BOOST_CHECK(poll_until([&] {
    std::lock_guard lk(m);
    return order.size() == static_cast<std::size_t>(n);
  }));
  std::vector<int> expected(n);
  for (int i = 0; i < n; ++i) expected[static_cast<std::size_t>(i)] = i;
  std::lock_guard lk(m);
  BOOST_CHECK(order == expected);
  BOOST_CHECK_EQUAL(overlaps.load(), 0);
  BOOST_CHECK_EQUAL(not_inside.load(), 0);
}

BOOST_AUTO_TEST_CASE(serial_schedule_after_waits_then_takes_its_turn_and_dispose_stops_it) {
  manual_clock clock;
  scheduled_thread_pool pool(on_clock(clock, 2));
  auto serial = metronome::make_serial_executor(pool.get_executor());
  auto sched = serial.get_scheduler();
  BOOST_CHECK(sched.now() == clock.now());
  outcome o;
  o.on_complete = [&] { BOOST_CHECK(serial.running_in_this_thread()); };
  started op(exec::schedule_after(sched, 3ms), o);
  auto marker = pool.schedule([] {}, 3ms - 1ns);
  clock.advance(3ms - 1ns);
  marker.wait();
  BOOST_CHECK_EQUAL(o.completions(), 0);
  clock.advance(1ns);
  o.wait();
  BOOST_CHECK_EQUAL(o.values.load(), 1);
  // A stop request while it waits: stopped; a disposed executor: stopped at start.
  stdexec::inplace_stop_source source;
  outcome stopped;
  started op2(exec::schedule_after(sched, 1h), stopped, source.get_token());
  source.request_stop();
  stopped.wait();
  BOOST_CHECK_EQUAL(stopped.stops.load(), 1);
  serial.dispose();
  outcome refused;
  started op3(stdexec::schedule(sched), refused);
  BOOST_CHECK_EQUAL(refused.stops.load(), 1);
}

// dispose() stops what the executor holds, an operation waiting in the delay queue too:
// it leaves the queue at once and completes stopped (not when it would have been due).
BOOST_AUTO_TEST_CASE(dispose_stops_a_serial_operation_waiting_in_the_delay_queue) {
  scheduled_thread_pool pool(1);
  auto serial = metronome::make_serial_executor(pool.get_executor());
  outcome o;
  started op(exec::schedule_after(serial.get_scheduler(), 1h), o);
  BOOST_CHECK_EQUAL(pool.stats().delayed_queued, 1u);
  serial.dispose();
  o.wait();
  BOOST_CHECK_EQUAL(o.stops.load(), 1);
  BOOST_CHECK_EQUAL(o.completions(), 1);
  BOOST_CHECK_EQUAL(pool.stats().delayed_queued, 0u);
}

// A serial executor over an io_context: its time is the context's timing service, its
// completions run on the context's thread.
BOOST_AUTO_TEST_CASE(serial_scheduler_over_an_io_context) {
  metronome::net::io_context io;
  auto serial = metronome::make_serial_executor(io.get_executor());
  outcome o;
  const auto t0 = metronome::clock::now();
  started op(exec::schedule_after(serial.get_scheduler(), 5ms), o);
  std::thread runner([&] { io.run(); });
  const auto runner_id = runner.get_id();
  o.wait();
  runner.join(); // run() returned: nothing left once the operation completed
  BOOST_CHECK_EQUAL(o.values.load(), 1);
  BOOST_CHECK(o.thread == runner_id);
  BOOST_CHECK(metronome::clock::now() - t0 >= 5ms);
}

BOOST_AUTO_TEST_CASE(wheel_operations_fire_at_tick_resolution_and_stop_unlinks_them) {
  scheduled_thread_pool pool(1);
  const auto worker = pool_thread(pool);
  metronome::wheel_timer wheel(pool);
  auto sched = wheel.get_scheduler();
  outcome o;
  const auto t0 = metronome::clock::now();
  started op(exec::schedule_after(sched, 20ms), o);
  o.wait();
  BOOST_CHECK(metronome::clock::now() - t0 >= 20ms); // never early
  BOOST_CHECK_EQUAL(o.values.load(), 1);
  BOOST_CHECK(o.thread == worker);
  stdexec::inplace_stop_source source;
  outcome stopped;
  started op2(exec::schedule_after(sched, 1h), stopped, source.get_token());
  BOOST_CHECK_EQUAL(wheel.pending(), 1u);
  source.request_stop();
  stopped.wait();
  BOOST_CHECK_EQUAL(stopped.stops.load(), 1);
  BOOST_CHECK(stopped.thread == worker);
  BOOST_CHECK_EQUAL(wheel.pending(), 0u);
  outcome now;
  started op3(stdexec::schedule(sched), now);
  now.wait();
  BOOST_CHECK_EQUAL(now.values.load(), 1);
  // stop() and the pool's shutdown end pending operations stopped; later ones too.
  outcome at_stop;
  started op4(exec::schedule_after(sched, 1h), at_stop);
  BOOST_CHECK(wheel.stop().empty()); // an operation has no handle to hand back
  at_stop.wait();
  BOOST_CHECK_EQUAL(at_stop.stops.load(), 1);
  outcome after_stop;
  started op5(exec::schedule_after(sched, 1ms), after_stop);
  after_stop.wait();
  BOOST_CHECK_EQUAL(after_stop.stops.load(), 1);
}

BOOST_AUTO_TEST_CASE(wheel_operations_end_stopped_at_the_pool_s_shutdown) {
  scheduled_thread_pool pool(1);
  metronome::wheel_timer wheel(pool);
  outcome o;
  started op(exec::schedule_after(wheel.get_scheduler(), 1h), o);
  pool.shutdown();
  o.wait();
  BOOST_CHECK_EQUAL(o.stops.load(), 1);
  pool.join();
}

// Over an io_context: fired and stopped completions both run on the context's thread.
BOOST_AUTO_TEST_CASE(wheel_scheduler_over_an_io_context) {
  metronome::net::io_context io;
  auto guard = metronome::net::make_work_guard(io);
  std::thread runner([&] { io.run(); });
  {
    metronome::wheel_timer wheel(io.get_executor());
    outcome o;
    started op(exec::schedule_after(wheel.get_scheduler(), 5ms), o);
    o.wait();
    BOOST_CHECK_EQUAL(o.values.load(), 1);
    BOOST_CHECK(o.thread == runner.get_id());
    stdexec::inplace_stop_source source;
    outcome stopped;
    started op2(exec::schedule_after(wheel.get_scheduler(), 1h), stopped, source.get_token());
    source.request_stop();
    stopped.wait();
    BOOST_CHECK_EQUAL(stopped.stops.load(), 1);
    BOOST_CHECK(stopped.thread == runner.get_id());
  }
  guard.reset();
  runner.join();
}

BOOST_AUTO_TEST_SUITE_END()
