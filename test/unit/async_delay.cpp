#include <metronome/async_delay.hpp>

#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include "common/counting_executor.hpp"
#include "common/exception_log.hpp"
#include "common/io_churn.hpp"
#include "common/latch_task.hpp"
#include "common/manual_pool.hpp"
#include "common/poll_until.hpp"

#include <metronome/detail/asio.hpp>
#include METRONOME_ASIO_HEADER(experimental/awaitable_operators.hpp)
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

namespace net = metronome::net;
using metronome::detail::as_tuple; // net::experimental::as_tuple in Asio 1.22
using metronome::detail::deferred; // net::experimental::deferred in Asio 1.22
using namespace std::chrono_literals;
using metronome::error_code;
using metronome::async_delay;
using metronome::async_delay_until;
using metronome::manual_clock;
using metronome::scheduled_thread_pool;
using metronome::test::on_clock;

BOOST_AUTO_TEST_SUITE(async_delay_suite)

BOOST_AUTO_TEST_CASE(callback_completes_when_due_not_before) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  std::promise<error_code> p;
  async_delay(pool.get_executor(), 10ms, [&](error_code ec) { p.set_value(ec); });
  auto f = p.get_future();
  BOOST_TEST(pool.stats().delayed_queued == 1u); // one node in the pool's delay queue
  c.advance(9ms);
  BOOST_TEST((f.wait_for(20ms) == std::future_status::timeout));
  c.advance(1ms);
  BOOST_TEST(!f.get());
}

// A wait initiated after its due time has passed queues behind the waits already due:
// two waits with one due time complete in initiation order, also when nobody promoted the
// first before the second was initiated (the pool's only worker is held busy meanwhile).
BOOST_AUTO_TEST_CASE(a_wait_initiated_past_its_due_time_queues_behind_waits_already_due) {
  scheduled_thread_pool pool(1);
  metronome::test::gate release;
  metronome::test::counter started, done;
  BOOST_REQUIRE(metronome::test::occupy_worker(pool, release, started));
  std::vector<int> order; // written by the pool's one thread only
  const auto due = metronome::clock::now() + 1ms;
  async_delay_until(pool.get_executor(), due, [&](error_code) {
    order.push_back(1);
    done.add();
  });
  while (metronome::clock::now() <= due) std::this_thread::yield(); // its time passes; nobody promotes it
  async_delay_until(pool.get_executor(), due, [&](error_code) {
    order.push_back(2);
    done.add();
  });
  release.open();
  BOOST_REQUIRE(done.wait_for_at_least(2));
  BOOST_TEST(order == (std::vector<int>{1, 2}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(zero_delay_never_completes_inside_the_initiating_call) {
  scheduled_thread_pool pool(1);
  std::promise<void> done;
  std::atomic<bool> returned{false}, early{false};
  net::post(pool, [&] {
    async_delay(pool.get_executor(), 0ms, [&](error_code) {
      early = !returned.load();
      done.set_value();
    });
    returned = true;
  });
  done.get_future().get();
  BOOST_TEST(!early.load());
}

BOOST_AUTO_TEST_CASE(use_future_and_until) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  auto f = async_delay_until(pool.get_executor(), c.now() + 5ms, net::use_future);
  c.advance(5ms);
  f.get(); // no exception: success
}

BOOST_AUTO_TEST_CASE(use_awaitable_does_not_block_a_pool_thread) {
  scheduled_thread_pool pool(1);
  std::atomic<int> other_work{0};
  auto f = net::co_spawn(
      pool,
      [&]() -> net::awaitable<int> {
        for (int i = 0; i < 10; ++i) net::post(pool, [&] { ++other_work; });
        co_await async_delay(pool.get_executor(), 30ms, net::use_awaitable);
        co_return other_work.load(); // the only thread ran the others while we waited
      },
      net::use_future);
  BOOST_TEST(f.get() == 10);
}

BOOST_AUTO_TEST_CASE(deferred_counts_from_launch) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  auto op = async_delay(pool.get_executor(), 10ms, deferred);
  c.advance(50ms); // not launched yet: nothing to fire
  std::promise<error_code> p;
  std::move(op)([&](error_code ec) { p.set_value(ec); });
  auto f = p.get_future();
  BOOST_TEST((f.wait_for(20ms) == std::future_status::timeout));
  c.advance(10ms);
  BOOST_TEST(!f.get());
}

BOOST_AUTO_TEST_CASE(as_tuple_and_parallel_group) {
  scheduled_thread_pool pool(2);
  auto ex = pool.get_executor();
  auto f = net::co_spawn(
      pool,
      [ex]() -> net::awaitable<bool> {
        auto [ec] = co_await async_delay(ex, 1ms, as_tuple(net::use_awaitable));
        if (ec) co_return false;
        // Two delays race; the first to finish cancels the other.
        auto [order, ec1, ec2] = co_await net::experimental::make_parallel_group(async_delay(ex, 1ms, deferred),
                                                                                  async_delay(ex, 1h, deferred))
                                     .async_wait(net::experimental::wait_for_one(), net::use_awaitable);
        co_return order[0] == 0 && !ec1 && ec2 == net::error::operation_aborted;
      },
      net::use_future);
  BOOST_TEST(f.get());
  BOOST_TEST(pool.stats().delayed_queued == 0u); // the cancelled hour-long wait left the queue
}

BOOST_AUTO_TEST_CASE(handler_runs_on_its_associated_io_context) {
  net::io_context io;
  scheduled_thread_pool pool(1);
  std::thread::id ran_on;
  error_code result = net::error::would_block;
  async_delay(pool.get_executor(), 2ms, net::bind_executor(io, [&](error_code ec) {
                ran_on = std::this_thread::get_id();
                result = ec;
              }));
  io.run(); // returns after the handler ran: the wait kept the io_context busy
  BOOST_TEST((ran_on == std::this_thread::get_id()));
  BOOST_TEST(!result);
}

BOOST_AUTO_TEST_CASE(handler_runs_on_a_bound_strand) {
  scheduled_thread_pool pool(2);
  auto strand = net::make_strand(pool.get_executor());
  std::promise<bool> p;
  async_delay(pool.get_executor(), 1ms,
              net::bind_executor(strand, [&](error_code) { p.set_value(strand.running_in_this_thread()); }));
  BOOST_TEST(p.get_future().get());
}

BOOST_AUTO_TEST_CASE(cancellation_before_firing_aborts_and_leaves_the_queue) {
  for (auto type :
       {net::cancellation_type::terminal, net::cancellation_type::partial, net::cancellation_type::total}) {
    manual_clock c;
    scheduled_thread_pool pool(on_clock(c));
    net::cancellation_signal sig;
    std::promise<error_code> p;
    // Emit from the pool (the handler's executor), as Asio requires.
    net::post(pool, [&] {
      async_delay(pool.get_executor(), 1h,
                  net::bind_cancellation_slot(sig.slot(), [&](error_code ec) { p.set_value(ec); }));
    });
    BOOST_TEST(metronome::test::poll_until([&] { return pool.stats().delayed_queued == 1u; }));
    net::post(pool, [&] { sig.emit(type); });
    BOOST_TEST((p.get_future().get() == net::error::operation_aborted));
    BOOST_TEST(pool.stats().delayed_queued == 0u);
  }
}

BOOST_AUTO_TEST_CASE(cancellation_after_firing_is_a_no_op) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  net::cancellation_signal sig;
  std::promise<error_code> p;
  std::atomic<int> calls{0};
  net::post(pool, [&] {
    async_delay(pool.get_executor(), 1ms, net::bind_cancellation_slot(sig.slot(), [&](error_code ec) {
                  ++calls;
                  p.set_value(ec);
                }));
  });
  BOOST_TEST(metronome::test::poll_until([&] { return pool.stats().delayed_queued == 1u; }));
  c.advance(1ms);
  BOOST_TEST(!p.get_future().get());
  std::promise<void> emitted;
  net::post(pool, [&] {
    sig.emit(net::cancellation_type::terminal);
    emitted.set_value();
  });
  emitted.get_future().get();
  BOOST_TEST(calls.load() == 1);
}

// Firing and cancelling race on two threads: exactly one completion, either result.
BOOST_AUTO_TEST_CASE(cancellation_racing_the_firing_completes_exactly_once) {
  scheduled_thread_pool pool(2);
  auto strand = net::make_strand(pool.get_executor());
  std::atomic<int> completions{0}, aborted{0};
  metronome::test::counter done;
  constexpr int n = 2000;
  std::vector<std::unique_ptr<net::cancellation_signal>> sigs;
  for (int i = 0; i < n; ++i) sigs.push_back(std::make_unique<net::cancellation_signal>());
  for (int i = 0; i < n; ++i) {
    net::post(strand, [&, i] {
      async_delay(pool.get_executor(), std::chrono::microseconds(i % 50),
                  net::bind_cancellation_slot(sigs[i]->slot(), net::bind_executor(strand, [&](error_code ec) {
                                                 ++completions;
                                                 if (ec) ++aborted;
                                                 done.add();
                                               })));
      net::post(strand, [&, i] { sigs[i]->emit(net::cancellation_type::terminal); });
    });
  }
  BOOST_TEST(done.wait_for_at_least(n));
  BOOST_TEST(completions.load() == n);
  BOOST_TEST(pool.stats().delayed_queued == 0u);
}

BOOST_AUTO_TEST_CASE(a_chain_of_1000_delays_on_two_threads) {
  scheduled_thread_pool pool(2);
  auto start = metronome::clock::now();
  auto f = net::co_spawn(
      pool,
      [&]() -> net::awaitable<int> {
        int n = 0;
        for (int i = 0; i < 1000; ++i) {
          co_await async_delay(pool.get_executor(), 100us, net::use_awaitable);
          ++n;
        }
        co_return n;
      },
      net::use_future);
  BOOST_TEST(f.get() == 1000);
  BOOST_TEST((metronome::clock::now() - start >= 100ms)); // each delay really waited
}

BOOST_AUTO_TEST_CASE(shutdown_aborts_pending_and_later_waits) {
  scheduled_thread_pool pool(1);
  auto f = net::co_spawn(
      pool,
      [&]() -> net::awaitable<int> {
        auto [ec1] = co_await async_delay(pool.get_executor(), 1h, as_tuple(net::use_awaitable));
        auto [ec2] = co_await async_delay(pool.get_executor(), 1ms, as_tuple(net::use_awaitable));
        co_return (ec1 == net::error::operation_aborted) + (ec2 == net::error::operation_aborted);
      },
      net::use_future);
  BOOST_TEST(metronome::test::poll_until([&] { return pool.stats().delayed_queued == 1u; }));
  pool.shutdown();
  BOOST_TEST(f.get() == 2); // the coroutine unwound promptly
  pool.join();
}

// shutdown_now() with a wait pending whose handler's context is the pool itself, and a
// task on the pool (that context) emitting on the wait's slot after shutdown_now()
// returned: the wait's node must still be alive then (it was freed, on the caller's
// thread, by shutdown_now(): heap-use-after-free under ASan). Its handler is destroyed
// unrun, on a pool thread, and the pool terminates.
BOOST_AUTO_TEST_CASE(a_wait_dropped_by_shutdown_now_is_discarded_on_the_pool_not_under_an_emitter) {
  metronome::test::exception_log log; // the dropped completion is reported as rejected
  metronome::pool_options o = metronome::pool_options::single_thread();
  o.exception_handler = log.handler();
  scheduled_thread_pool pool(o);
  net::cancellation_signal sig;
  std::atomic<int> called{0};
  auto alive = std::make_shared<int>(0);
  std::weak_ptr<int> handler_state = alive;
  async_delay(pool, 1h, net::bind_cancellation_slot(sig.slot(), [&called, alive](metronome::error_code) {
                ++called;
              }));
  alive.reset();
  metronome::test::gate go;
  metronome::test::counter started;
  net::post(pool, [&] {
    started.add();
    go.wait();
    for (int i = 0; i < 3; ++i) sig.emit(net::cancellation_type::terminal); // the handler's context
  });
  BOOST_REQUIRE(started.wait_for_at_least(1));
  auto rest = pool.shutdown_now();
  BOOST_TEST(rest.empty()); // a wait is not a task
  BOOST_TEST(!handler_state.expired()); // not destroyed on this thread, under the emitter
  go.open();
  pool.join();
  BOOST_TEST(called.load() == 0);          // nothing more starts
  BOOST_TEST(handler_state.expired());     // destroyed unrun, on the pool
}

BOOST_AUTO_TEST_CASE(handles_are_awaitable) {
  scheduled_thread_pool pool(2);
  auto value = pool.schedule([] { return 21; }, 2ms);
  auto failing = pool.submit([]() -> int { throw std::runtime_error("bad"); });
  auto cancelled = pool.schedule([] {}, 1h);
  cancelled.cancel();
  auto f = net::co_spawn(
      pool,
      [&]() -> net::awaitable<int> {
        int v = co_await value.async_wait(net::use_awaitable);
        int caught = 0;
        try {
          co_await failing.async_wait(net::use_awaitable);
        } catch (const std::runtime_error&) {
          ++caught;
        }
        try {
          co_await cancelled.async_wait(net::use_awaitable);
        } catch (const metronome::cancelled_error&) {
          ++caught;
        }
        co_return v* caught;
      },
      net::use_future);
  BOOST_TEST(f.get() == 42);
}

BOOST_AUTO_TEST_CASE(async_wait_with_a_callback_on_an_io_context) {
  net::io_context io;
  scheduled_thread_pool pool(1);
  auto h = pool.schedule([] { return 5; }, 1ms);
  int got = 0;
  h.async_wait(net::bind_executor(io, [&](std::exception_ptr e, int v) { got = e ? -1 : v; }));
  io.run();
  BOOST_TEST(got == 5);
}

// A named handler is copied (an lvalue function object) as by every Asio operation.
BOOST_AUTO_TEST_CASE(a_named_handler_is_accepted_and_copied) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  std::promise<error_code> lambda_done;
  auto handler = [&](error_code ec) { lambda_done.set_value(ec); };
  async_delay(pool.get_executor(), 1ms, handler);

  struct recorder {
    std::shared_ptr<std::promise<error_code>> done;
    void operator()(error_code ec) const { done->set_value(ec); }
  };
  recorder named{std::make_shared<std::promise<error_code>>()};
  auto object_done = named.done->get_future();
  async_delay_until(pool.get_executor(), c.now() + 1ms, named);
  BOOST_TEST(named.done.use_count() == 2); // copied into the operation, not moved from

  c.advance(1ms);
  BOOST_TEST(!lambda_done.get_future().get());
  BOOST_TEST(!object_done.get());
  BOOST_TEST(metronome::test::poll_until([&] { return named.done.use_count() == 1; })); // the copy is gone
}

// The wait holds outstanding work on its handler's executor until the completion has
// been handed to it, and lets go right after (the pool has one thread: once a later
// task ran, the completion was handed on).
BOOST_AUTO_TEST_CASE(a_delay_holds_work_on_the_handler_executor_until_the_completion_is_handed_over) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  net::io_context io;
  metronome::test::counting_executor::counts work;
  int held_while_running = -1;
  async_delay(pool.get_executor(), 1ms,
              net::bind_executor(metronome::test::counting_executor(io, work),
                                  [&](error_code) { held_while_running = work.held.load(); }));
  BOOST_TEST(work.held.load() == 1);
  c.advance(1ms);
  pool.submit([] {}).get();
  BOOST_TEST(work.held_when_handed.load() == 1); // held while the completion was handed to io
  BOOST_TEST(work.held.load() == 0);             // and let go right after, on the pool thread
  BOOST_TEST(work.released_elsewhere.load() == 1);
  io.run(); // io's own count of the queued completion keeps it running
  BOOST_TEST(held_while_running == 0);
}

BOOST_AUTO_TEST_CASE(delays_completing_onto_a_dying_io_context_leave_it_alone) {
  metronome::test::on_one_cpu one_cpu; // first: the pool's threads too
  scheduled_thread_pool pool(1);
  metronome::test::complete_onto_dying_io_contexts(2000, [&](net::io_context& io, std::function<void()> ran) {
    async_delay(pool.get_executor(), 0ms, net::bind_executor(io, [ran](error_code) { ran(); }));
  });
}

// A completion handler that throws is reported to the pool it runs on, like any other
// work, and the worker goes on.
BOOST_AUTO_TEST_CASE(a_throwing_handler_goes_to_the_pool_handler_and_the_worker_lives) {
  manual_clock c;
  metronome::test::exception_log log;
  auto o = on_clock(c);
  o.exception_handler = log.handler();
  scheduled_thread_pool pool(o);
  async_delay(pool.get_executor(), 1ms, [](error_code) { throw std::runtime_error("delay handler"); });
  c.advance(1ms);
  BOOST_TEST(pool.submit([] { return 7; }).get() == 7);
  BOOST_TEST(log.messages() == std::vector<std::string>{"delay handler"}, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()

// Item: async_delay on any executor. Waits on executors with no metronome pool behind
// them live in the process-wide timing pool, which reads the real clock: these tests
// use short real delays and check only where and whether they complete, never when.
BOOST_AUTO_TEST_SUITE(async_delay_any_executor)

BOOST_AUTO_TEST_CASE(io_context_executor_completes_on_the_io_context_and_holds_work) {
  net::io_context io;
  error_code got = net::error::would_block;
  bool on_io = false;
  async_delay(io.get_executor(), 1ms, [&](error_code ec) {
    got = ec;
    on_io = io.get_executor().running_in_this_thread();
  });
  io.run(); // returns only after the handler: the wait held work on io
  BOOST_TEST(!got);
  BOOST_TEST(on_io);
}

BOOST_AUTO_TEST_CASE(io_context_object_and_strand_and_any_io_executor) {
  net::io_context io;
  auto strand = net::make_strand(io);
  net::any_io_executor any = io.get_executor();
  int done = 0;
  bool in_strand = false;
  async_delay(io, 1ms, [&](error_code ec) { done += !ec; });
  async_delay(strand, 1ms, [&](error_code ec) {
    done += !ec;
    in_strand = strand.running_in_this_thread();
  });
  async_delay_until(any, metronome::clock::now() + 1ms, [&](error_code ec) { done += !ec; });
  io.run();
  BOOST_TEST(done == 3);
  BOOST_TEST(in_strand);
}

BOOST_AUTO_TEST_CASE(coroutine_on_an_io_context) {
  net::io_context io;
  bool done = false;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        co_await async_delay(co_await net::this_coro::executor, 1ms, net::use_awaitable);
        done = io.get_executor().running_in_this_thread();
      },
      net::detached);
  io.run();
  BOOST_TEST(done);
}

BOOST_AUTO_TEST_CASE(cancelling_an_io_context_wait_aborts_it) {
  net::io_context io;
  net::cancellation_signal sig;
  error_code got;
  async_delay(io.get_executor(), 1h, net::bind_cancellation_slot(sig.slot(), [&](error_code ec) { got = ec; }));
  net::post(io, [&] { sig.emit(net::cancellation_type::terminal); });
  io.run(); // would block for an hour if the cancellation did not take the wait out
  BOOST_TEST((got == net::error::operation_aborted));
}

// With a metronome pool behind the executor, the wait is a node in that pool's delay
// queue, on its (manual) clock: the pool object itself, a strand over its executor, an
// any_io_executor wrapping it.
BOOST_AUTO_TEST_CASE(pool_object_strand_and_type_erased_pool_executor_use_the_pools_queue) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  auto strand = net::make_strand(pool.get_executor());
  net::any_io_executor any = pool.get_executor();
  std::atomic<int> done{0};
  std::promise<bool> in_strand;
  async_delay(pool, 10ms, [&](error_code ec) { done += !ec; });
  async_delay(strand, 10ms, [&](error_code ec) {
    done += !ec;
    in_strand.set_value(strand.running_in_this_thread());
  });
  async_delay(any, 10ms, [&](error_code ec) { done += !ec; });
  BOOST_TEST(pool.stats().delayed_queued == 3u);
  c.advance(9ms);
  BOOST_TEST(done.load() == 0);
  c.advance(1ms);
  BOOST_TEST(in_strand.get_future().get());
  BOOST_TEST(metronome::test::poll_until([&] { return done.load() == 3; }));
  BOOST_TEST(pool.stats().delayed_queued == 0u);
}

// A wait's cancellation slot emitted after its pool was destroyed: the destruction
// aborted the wait and posted its completion to an io_context that has not run it yet, so
// the slot is still connected (it is cleared in the handler's context). The emission must
// not reach the freed pool (an adversary saw a use-after-free under ASan, and a crash in
// release once another pool was built in between).
BOOST_AUTO_TEST_CASE(a_slot_emitted_after_the_pool_is_gone_touches_nothing) {
  net::io_context io;
  net::cancellation_signal sig;
  int calls = 0;
  error_code got;
  net::post(io, [&] { sig.emit(net::cancellation_type::terminal); }); // runs before the completion
  {
    scheduled_thread_pool pool(1);
    async_delay(pool, 1h, net::bind_cancellation_slot(sig.slot(), net::bind_executor(io, [&](error_code ec) {
                                                          got = ec;
                                                          ++calls;
                                                        })));
  }
  scheduled_thread_pool other(1); // may take the first pool's anchor (a new generation) and memory
  auto h = other.schedule([] {}, 1h);
  io.run();
  BOOST_CHECK_EQUAL(calls, 1);
  BOOST_CHECK(got == net::error::operation_aborted);
  BOOST_CHECK_EQUAL(other.stats().delayed_queued, 1u); // the emission left the other pool alone
  BOOST_CHECK(h.cancel());
}

BOOST_AUTO_TEST_SUITE_END()
