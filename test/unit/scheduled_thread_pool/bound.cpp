// The typed API with a callable bound to an executor of its own (bind_executor): the
// task waits in the pool and runs on that executor, as Asio runs a bound handler.
#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/manual_clock.hpp>
#include <metronome/serial_executor.hpp>

#include "common/exception_log.hpp"
#include "common/manual_pool.hpp"
#include "common/poll_until.hpp"
#include "common/strand_run_log.hpp"

#include <metronome/detail/asio.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
namespace net = metronome::net;
using metronome::manual_clock;
using metronome::scheduled_thread_pool;
using metronome::test::on_clock;
using metronome::test::poll_until;

namespace {

// An io_context run by one thread of its own until the fixture ends.
struct running_io {
  net::io_context io;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> guard{io.get_executor()};
  std::thread thread{[this] { io.run(); }};
  ~running_io() {
    guard.reset();
    thread.join();
  }
};

// The pool's workers have handed `n` tasks on (a bound task counts when handed over).
bool handed_over(scheduled_thread_pool& pool, std::size_t n) {
  return poll_until([&] { return pool.stats().completed >= n; }, 10s);
}

} // namespace

BOOST_AUTO_TEST_SUITE(pool_bound_suite)

BOOST_AUTO_TEST_CASE(a_task_bound_to_a_strand_runs_on_that_strand_when_due) {
  manual_clock clock;
  scheduled_thread_pool pool(on_clock(clock));
  running_io rio;
  auto strand = net::make_strand(rio.io);
  auto h = pool.schedule(net::bind_executor(strand,
                                            [&] {
                                              return strand.running_in_this_thread() &&
                                                     std::this_thread::get_id() == rio.thread.get_id();
                                            }),
                         10ms);
  auto at = pool.schedule_at(net::bind_executor(strand, [&] { return strand.running_in_this_thread(); }),
                             clock.now() + 20ms);
  auto now = pool.submit(net::bind_executor(rio.io.get_executor(), [&] {
    return rio.io.get_executor().running_in_this_thread();
  }));
  BOOST_CHECK(now.get());
  auto erased = pool.submit(net::bind_executor(net::any_io_executor(strand), [&] { return strand.running_in_this_thread(); }));
  BOOST_CHECK(erased.get());
  clock.advance(10ms);
  BOOST_CHECK(h.get());
  BOOST_CHECK(!at.is_done());
  clock.advance(10ms);
  BOOST_CHECK(at.get());
}

// A strand over the pool itself: the worker's dispatch runs the free strand right there.
BOOST_AUTO_TEST_CASE(a_task_bound_to_a_strand_over_the_pool_runs_on_that_strand_on_a_worker) {
  manual_clock clock;
  scheduled_thread_pool pool(on_clock(clock));
  auto strand = net::make_strand(pool.get_executor());
  auto h = pool.schedule(net::bind_executor(strand,
                                            [&] {
                                              return strand.running_in_this_thread() &&
                                                     pool.get_executor().running_in_this_thread();
                                            }),
                         5ms);
  clock.advance(5ms);
  BOOST_CHECK(h.get());
}

BOOST_AUTO_TEST_CASE(a_serial_executor_as_the_bound_executor_runs_the_task_in_its_order) {
  manual_clock clock;
  scheduled_thread_pool pool(on_clock(clock, 2));
  auto serial = metronome::make_serial_executor(pool);
  running_io rio;
  auto serial_io = metronome::make_serial_executor(rio.io.get_executor());
  auto on_pool = pool.schedule(net::bind_executor(serial, [&] { return serial.running_in_this_thread(); }), 10ms);
  auto on_io = pool.schedule(net::bind_executor(serial_io,
                                                [&] {
                                                  return serial_io.running_in_this_thread() &&
                                                         std::this_thread::get_id() == rio.thread.get_id();
                                                }),
                             10ms);
  clock.advance(10ms);
  BOOST_CHECK(on_pool.get());
  BOOST_CHECK(on_io.get());
}

// Handed to an io_context nobody runs yet: the task is queued there, not started. A
// cancel() then wins, and the run never happens when the io_context runs.
BOOST_AUTO_TEST_CASE(a_cancel_after_the_hand_over_and_before_the_start_wins_and_the_run_never_happens) {
  manual_clock clock;
  scheduled_thread_pool pool(on_clock(clock));
  net::io_context io;
  std::atomic<bool> ran{false};
  auto h = pool.schedule(net::bind_executor(io, [&] { ran = true; }), 10ms);
  clock.advance(10ms);
  BOOST_REQUIRE(handed_over(pool, 1));
  BOOST_CHECK(!h.is_done());
  BOOST_CHECK(h.cancel());
  BOOST_CHECK(h.is_cancelled());
  BOOST_CHECK_EQUAL(io.poll(), 1u); // the hand-over runs, and finds the task cancelled
  BOOST_CHECK(!ran.load());
  BOOST_CHECK_THROW(h.get(), metronome::cancelled_error);
}

// No outstanding work on the bound executor while the task waits in the pool (a task is
// not an operation of that context): io.run() returns at once; once due, the task is
// queued there and counts as its work until it runs.
BOOST_AUTO_TEST_CASE(a_bound_task_holds_no_work_on_its_executor_while_it_waits) {
  manual_clock clock;
  scheduled_thread_pool pool(on_clock(clock));
  net::io_context io;
  std::atomic<int> ran{0};
  auto h = pool.schedule(net::bind_executor(io, [&] { ++ran; }), 1h);
  BOOST_CHECK_EQUAL(io.run(), 0u);
  clock.advance(1h);
  BOOST_REQUIRE(handed_over(pool, 1));
  io.restart();
  BOOST_CHECK_EQUAL(io.run(), 1u);
  BOOST_CHECK_EQUAL(ran.load(), 1);
  BOOST_CHECK(h.is_done() && !h.is_cancelled());
}

// Fixed rate on a strand whose io_context has two threads, the pool two workers: the
// runs are on the strand, never overlap, and keep the grid (a late one bursts, as on the
// pool). The next run is scheduled when the run on the strand has ended.
BOOST_AUTO_TEST_CASE(a_periodic_task_on_a_strand_never_overlaps_and_keeps_its_grid) {
  manual_clock clock;
  metronome::test::strand_run_log on_strand(clock); // outlives the pool: a failed check ends cleanly
  scheduled_thread_pool pool(on_clock(clock, 2));
  auto h = pool.schedule_at_fixed_rate(on_strand.task(1ms), 10ms, 10ms);
  for (int i = 1; i <= 3; ++i) {
    clock.advance(10ms);
    BOOST_REQUIRE(poll_until([&] { return on_strand.runs() == i; }, 10s));
  }
  clock.advance(50ms); // now 80: 40, 50, 60, 70, 80 are due, one after the other
  BOOST_REQUIRE(poll_until([&] { return on_strand.runs() == 8; }, 10s));
  BOOST_CHECK(h.cancel());
  h.wait();
  on_strand.stop();
  BOOST_CHECK(!on_strand.overlapped());
  BOOST_CHECK(!on_strand.off_strand());
  const auto times = on_strand.times();
  BOOST_REQUIRE_EQUAL(times.size(), 8u);
  BOOST_CHECK(times[0] == 10ms && times[1] == 20ms && times[2] == 30ms);
  for (std::size_t i = 3; i < times.size(); ++i) BOOST_CHECK(times[i] == 80ms);
}

// Fixed delay: measured from the end of the run on the bound executor (the run moves the
// clock on by 3 ms itself).
BOOST_AUTO_TEST_CASE(a_fixed_delay_task_on_an_io_context_counts_its_delay_from_the_end_of_the_run_there) {
  manual_clock clock;
  scheduled_thread_pool pool(on_clock(clock));
  running_io rio;
  const auto start = clock.now();
  std::mutex m;
  std::vector<std::chrono::milliseconds> times;
  std::atomic<int> runs{0};
  std::atomic<bool> off_io{false};
  auto h = pool.schedule_with_fixed_delay(net::bind_executor(rio.io,
                                                             [&] {
                                                               if (std::this_thread::get_id() != rio.thread.get_id())
                                                                 off_io = true;
                                                               {
                                                                 std::lock_guard lk(m);
                                                                 times.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                     clock.now() - start));
                                                               }
                                                               clock.advance(3ms);
                                                               ++runs;
                                                             }),
                                          10ms, 10ms);
  clock.advance(10ms); // run at 10, ends at 13: next at 23
  BOOST_REQUIRE(poll_until([&] { return runs.load() == 1; }, 10s));
  BOOST_REQUIRE(poll_until([&] { return h.delay() > 0ns; }, 10s)); // rescheduled
  clock.advance(10ms); // 23
  BOOST_REQUIRE(poll_until([&] { return runs.load() == 2; }, 10s));
  BOOST_CHECK(h.cancel());
  h.wait();
  BOOST_CHECK(!off_io.load());
  std::lock_guard lk(m);
  BOOST_REQUIRE_EQUAL(times.size(), 2u);
  BOOST_CHECK(times[0] == 10ms);
  BOOST_CHECK(times[1] == 23ms);
}

// A periodic run that throws on its executor: reported to the pool's handler, and with
// on_exception::stop the task ends with the exception (its handle rethrows it).
BOOST_AUTO_TEST_CASE(a_periodic_task_throwing_on_its_executor_is_reported_and_stops) {
  manual_clock clock;
  metronome::test::exception_log log;
  auto o = on_clock(clock);
  o.exception_handler = log.handler();
  scheduled_thread_pool pool(o);
  running_io rio;
  std::atomic<int> runs{0};
  auto h = pool.schedule_at_fixed_rate(net::bind_executor(rio.io,
                                                          [&] {
                                                            ++runs;
                                                            throw std::runtime_error("on io");
                                                          }),
                                       10ms, 10ms);
  clock.advance(10ms);
  BOOST_CHECK_THROW(h.get(), std::runtime_error);
  clock.advance(10ms);
  BOOST_CHECK_EQUAL(runs.load(), 1);
  BOOST_REQUIRE_EQUAL(log.messages().size(), 1u);
  BOOST_CHECK_EQUAL(log.messages()[0], "on io");
}

// The io_context is destroyed with the hand-over queued in it: the task ends cancelled
// (its handle says so, its callable is destroyed), never lost. A periodic one lets go of
// the pool too: the pool terminates.
BOOST_AUTO_TEST_CASE(a_bound_executor_destroyed_with_the_task_queued_there_ends_it_cancelled) {
  manual_clock clock;
  scheduled_thread_pool pool(on_clock(clock));
  auto io = std::make_unique<net::io_context>();
  auto held = std::make_shared<int>(0);
  std::weak_ptr<int> watch = held;
  std::atomic<int> ran{0};
  auto one = pool.schedule(net::bind_executor(*io, [&ran, held] { ++ran; }), 10ms);
  auto every = pool.schedule_at_fixed_rate(net::bind_executor(*io, [&ran, held] { ++ran; }), 10ms, 10ms);
  held.reset();
  clock.advance(10ms);
  BOOST_REQUIRE(handed_over(pool, 2));
  BOOST_CHECK(!one.is_done() && !every.is_done());
  io.reset();
  BOOST_CHECK(one.is_cancelled());
  BOOST_CHECK(every.is_cancelled());
  BOOST_CHECK_THROW(one.get(), metronome::cancelled_error);
  BOOST_CHECK_THROW(every.get(), metronome::cancelled_error);
  BOOST_CHECK(watch.expired());
  BOOST_CHECK_EQUAL(ran.load(), 0);
  pool.shutdown();
  BOOST_CHECK(pool.await_termination(10s));
}

// shutdown_now() returns a bound task like any other; running the pending_task hands it
// to its executor, where it runs.
BOOST_AUTO_TEST_CASE(shutdown_now_returns_a_bound_task_and_running_it_runs_on_its_executor) {
  manual_clock clock;
  scheduled_thread_pool pool(on_clock(clock));
  running_io rio;
  auto h = pool.schedule(net::bind_executor(rio.io, [&] { return std::this_thread::get_id() == rio.thread.get_id(); }),
                         1h);
  auto pending = pool.shutdown_now();
  BOOST_REQUIRE_EQUAL(pending.size(), 1u);
  BOOST_CHECK(pending[0].has_handle());
  pending[0]();
  BOOST_CHECK(h.get());
}

// The pool's destructor cancels a bound task not yet due, as any other.
BOOST_AUTO_TEST_CASE(the_pool_s_destructor_cancels_a_bound_task_not_yet_due) {
  net::io_context io;
  metronome::scheduled_future<void> h;
  {
    scheduled_thread_pool pool(1);
    h = pool.schedule(net::bind_executor(io, [] {}), 1h);
  }
  BOOST_CHECK(h.is_cancelled());
  BOOST_CHECK_EQUAL(io.poll(), 0u);
}

// A strand over the pool left locked by shutdown_now() (its invoker's re-post was
// dropped) with a bound task's hand-over queued in it: only that task's callable keeps the
// strand. Cancelling the task destroys the callable, the strand with it, and so the
// hand-over queued there, on the cancelling thread: cancel() returns, the task ends
// cancelled, never run.
BOOST_AUTO_TEST_CASE(cancelling_the_last_task_queued_in_a_strand_left_locked_by_shutdown_now_frees_the_strand) {
  scheduled_thread_pool pool(2);
  std::optional strand = net::make_strand(pool.get_executor());
  std::promise<void> entered, go;
  std::shared_future<void> go_now = go.get_future().share();
  net::post(*strand, [&entered, go_now] {
    entered.set_value();
    go_now.wait();
  });
  entered.get_future().wait();
  auto held = std::make_shared<int>(0);
  std::weak_ptr<int> watch = held;
  std::atomic<bool> ran{false};
  auto h = pool.submit(net::bind_executor(*strand, [&ran, held] { ran = true; }));
  held.reset();
  BOOST_REQUIRE(handed_over(pool, 1)); // queued in the strand, behind the handler holding it
  BOOST_CHECK(pool.shutdown_now().empty());
  go.set_value();
  BOOST_REQUIRE(poll_until([&] { return pool.stats().rejected >= 1; }, 10s)); // the invoker's re-post
  strand.reset();
  BOOST_CHECK(!watch.expired());
  BOOST_CHECK(h.cancel());
  BOOST_CHECK(h.is_cancelled());
  BOOST_CHECK(watch.expired());
  BOOST_CHECK(!ran.load());
  pool.join();
}

BOOST_AUTO_TEST_CASE(an_empty_function_inside_a_binder_is_refused) {
  scheduled_thread_pool pool(1);
  net::io_context io;
  std::function<void()> empty;
  BOOST_CHECK_THROW(pool.schedule(net::bind_executor(io, empty), 1ms), std::invalid_argument);
}

// shutdown_now() does not hand back a task bound to the pool itself (a strand over it, its
// own executor): stopped, the pool could never run it there, and the callable's copies of
// the executor must go before the pool does. It ends cancelled at once, its callable
// destroyed while the pool exists. A task bound to an io_context is returned, and runs
// there after the pool is gone.
BOOST_AUTO_TEST_CASE(shutdown_now_cancels_a_task_bound_to_the_pool_itself_and_returns_one_bound_elsewhere) {
  auto pool = std::make_unique<scheduled_thread_pool>(1);
  net::io_context io;
  std::atomic<int> ran_here{0}, ran_io{0};
  auto alive = std::make_shared<int>(0); // copied into both callables bound to the pool
  std::optional strand = net::make_strand(pool->get_executor());
  auto on_strand = pool->schedule(net::bind_executor(*strand, [alive, &ran_here] { ++ran_here; }), 1h);
  auto on_pool = pool->schedule(net::bind_executor(pool->get_executor(), [alive, &ran_here] { ++ran_here; }), 1h);
  auto on_io = pool->schedule(net::bind_executor(io, [&ran_io] { ++ran_io; }), 1h);
  strand.reset();
  auto rest = pool->shutdown_now();
  BOOST_REQUIRE_EQUAL(rest.size(), 1u);
  BOOST_CHECK(on_strand.is_cancelled());
  BOOST_CHECK(on_pool.is_cancelled());
  BOOST_CHECK_EQUAL(alive.use_count(), 1); // both callables destroyed
  BOOST_CHECK(!on_io.is_done());
  pool.reset();
  rest.front()(); // handed to the io_context
  BOOST_CHECK_EQUAL(io.poll(), 1u);
  BOOST_CHECK_EQUAL(ran_io.load(), 1);
  BOOST_CHECK(on_io.is_done() && !on_io.is_cancelled());
  BOOST_CHECK_EQUAL(ran_here.load(), 0);
}

BOOST_AUTO_TEST_SUITE_END()
