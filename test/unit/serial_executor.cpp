#include <metronome/serial_executor.hpp>

#include <metronome/async_delay.hpp>
#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include "common/exception_log.hpp"
#include "common/held_pool.hpp"
#include "common/latch_task.hpp"
#include "common/manual_pool.hpp"
#include "common/poll_until.hpp"
#include "common/sanitizers.hpp"
#include "common/stderr_capture.hpp"
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
#include <type_traits>
#include <utility>
#include <vector>

namespace net = metronome::net;
using namespace std::chrono_literals;
using metronome::make_serial_executor;
using metronome::manual_clock;
using metronome::pool_options;
using metronome::scheduled_thread_pool;
using metronome::test::counter;
using metronome::test::gate;
using metronome::test::held_pool;
using metronome::test::on_clock;
using metronome::test::poll_until;
using metronome::test::ready;
using reported = metronome::test::exception_log;

#if METRONOME_TEST_SANITIZED
constexpr int big = 100000; // sanitizers are ~10x slower; the property is the same
#else
constexpr int big = 1000000;
#endif

using pool_serial = metronome::serial_executor<scheduled_thread_pool::executor_type>;
// The type the README names for a pool's serial executor (a class member's type).
static_assert(std::is_same_v<decltype(make_serial_executor(std::declval<scheduled_thread_pool&>())), pool_serial>);
static_assert(std::is_same_v<decltype(make_serial_executor(std::declval<scheduled_thread_pool::executor_type>())),
                             pool_serial>);
static_assert(net::execution::executor<pool_serial>);
static_assert(net::is_executor<pool_serial>::value);
static_assert(std::is_convertible_v<pool_serial, net::any_io_executor>);

namespace {

// Two producers post `per_producer` tasks each; checks per-producer FIFO and that no
// two tasks ever overlap. Plain (non-atomic) state touched only inside tasks: TSan
// verifies each task happens-before the next.
template <class Serial>
void check_order_and_exclusion(Serial serial, int per_producer) {
  struct shared_state {
    int last[2] = {-1, -1};
    long long count = 0;
    bool order_ok = true;
    std::atomic<int> inside{0};
    std::atomic<bool> overlap{false};
  };
  auto st = std::make_shared<shared_state>();
  std::promise<void> done;
  auto producer = [&, st](int p) {
    for (int i = 0; i < per_producer; ++i) {
      net::post(serial, [st, p, i, &done, per_producer] {
        if (st->inside.fetch_add(1) != 0) st->overlap = true;
        if (i != st->last[p] + 1) st->order_ok = false;
        st->last[p] = i;
        if (++st->count == 2LL * per_producer) done.set_value();
        st->inside.fetch_sub(1);
      });
    }
  };
  std::thread a(producer, 0), b(producer, 1);
  a.join();
  b.join();
  BOOST_TEST((done.get_future().wait_for(120s) == std::future_status::ready));
  BOOST_TEST(st->order_ok);
  BOOST_TEST(!st->overlap.load());
}

} // namespace

BOOST_AUTO_TEST_SUITE(serial_executor_suite)

BOOST_AUTO_TEST_CASE(order_and_exclusion_over_our_pool) {
  scheduled_thread_pool pool(2);
  check_order_and_exclusion(make_serial_executor(pool), big);
}

BOOST_AUTO_TEST_CASE(order_and_exclusion_over_asio_thread_pool) {
  net::thread_pool pool(2);
  check_order_and_exclusion(make_serial_executor(pool.get_executor()), big / 10);
  pool.join();
}

BOOST_AUTO_TEST_CASE(order_and_exclusion_over_an_io_context) {
  net::io_context io;
  auto guard = net::make_work_guard(io);
  std::thread t1([&] { io.run(); }), t2([&] { io.run(); });
  check_order_and_exclusion(make_serial_executor(io.get_executor()), big / 10);
  guard.reset();
  t1.join();
  t2.join();
}

// Without the bounded batch, a flooded serial executor's drain never returns and
// holds its thread. Two are flooded here, as many as the pool has threads, so the
// other 62 progress only if the drains re-post themselves.
BOOST_AUTO_TEST_CASE(flooded_serial_executors_do_not_starve_the_others) {
  scheduled_thread_pool pool(2);
  metronome::serial_options o;
  o.batch = 64;
  std::vector<pool_serial> serials;
  for (int i = 0; i < 64; ++i) serials.push_back(make_serial_executor(pool, o));
  std::atomic<bool> stop{false};
  std::atomic<long> flood_ran{0};
  std::function<void(int)> flood = [&](int s) {
    ++flood_ran;
    if (!stop) net::post(serials[s], [&, s] { flood(s); }); // refills forever
  };
  for (int s = 0; s < 2; ++s)
    for (int i = 0; i < 100; ++i) net::post(serials[s], [&, s] { flood(s); });
  metronome::test::counter others;
  for (int s = 2; s < 64; ++s)
    for (int i = 0; i < 100; ++i) net::post(serials[s], [&] { others.add(); });
  BOOST_TEST(others.wait_for_at_least(62 * 100)); // all of them finished...
  const long at_finish = flood_ran.load();
  BOOST_TEST(
      metronome::test::poll_until([&] { return flood_ran.load() > at_finish + 1000; })); // ...while the floods ran on
  stop = true;
  pool.shutdown(); // the floods stop refilling; what is queued drains
  pool.join();
  BOOST_TEST(pool.is_terminated());
}

BOOST_AUTO_TEST_CASE(dispatch_is_inline_only_inside_the_serial_executor) {
  scheduled_thread_pool pool(2);
  auto serial = make_serial_executor(pool);
  BOOST_TEST(!serial.running_in_this_thread());
  std::promise<std::vector<int>> p;
  net::post(serial, [&] {
    std::vector<int> order;
    bool inside = serial.running_in_this_thread();
    net::dispatch(serial, [&] { order.push_back(1); }); // inline
    order.push_back(2);
    net::post(serial, [&p, order, inside]() mutable {
      order.push_back(inside ? 3 : -3);
      p.set_value(order);
    });
  });
  auto v = p.get_future().get();
  BOOST_TEST((v == std::vector<int>{1, 2, 3}));
}

BOOST_AUTO_TEST_CASE(exceptions_are_reported_and_the_stream_goes_on) {
  std::atomic<int> reported{0};
  metronome::pool_options po;
  po.threads = 2;
  po.exception_handler = [&](std::exception_ptr) { ++reported; };
  scheduled_thread_pool pool(po);
  auto serial = make_serial_executor(pool);
  std::vector<int> order;
  std::promise<void> done;
  for (int i = 0; i < 10; ++i) {
    net::post(serial, [&, i] {
      order.push_back(i);
      if (i == 9) done.set_value();
      if (i % 3 == 0) throw std::runtime_error("bad task");
    });
  }
  done.get_future().get();
  BOOST_TEST(order.size() == 10u);
  // Tasks 0, 3, 6 and 9 threw; each was reported and the drain went on.
  BOOST_TEST(metronome::test::poll_until([&] { return reported.load() == 4; }));
}

BOOST_AUTO_TEST_CASE(delayed_and_immediate_work_interleave_in_order) {
  metronome::manual_clock clock;
  metronome::pool_options po;
  po.threads = 2;
  po.time_source = &clock;
  scheduled_thread_pool pool(po);
  auto serial = make_serial_executor(pool);
  std::vector<std::string> order; // only touched by serial tasks
  auto a = serial.schedule([&] { order.push_back("delayed 10"); }, 10ms);
  auto b = serial.schedule([&] { order.push_back("delayed 5"); }, 5ms);
  auto c = serial.submit([&] {
    order.push_back("now");
    return 1;
  });
  BOOST_TEST(c.get() == 1);
  clock.advance(5ms);
  b.get();
  auto d = serial.submit([&] { order.push_back("after 5"); });
  d.get();
  clock.advance(5ms);
  a.get();
  BOOST_TEST((order == std::vector<std::string>{"now", "delayed 5", "after 5", "delayed 10"}));
}

BOOST_AUTO_TEST_CASE(delayed_work_runs_inside_the_serial_executor) {
  scheduled_thread_pool pool(2);
  auto serial = make_serial_executor(pool);
  auto f = serial.schedule([&] { return serial.running_in_this_thread(); }, 1ms);
  BOOST_TEST(f.get());
  metronome::test::counter runs;
  std::atomic<int> inside{0}, overlap{0};
  auto p = serial.schedule_at_fixed_rate(
      [&] {
        if (++inside > 1) ++overlap;
        runs.add();
        --inside;
      },
      0ms, 1ms);
  for (int i = 0; i < 200; ++i)
    net::post(serial, [&] {
      if (++inside > 1) ++overlap;
      --inside;
    });
  BOOST_TEST(runs.wait_for_at_least(10));
  BOOST_TEST(p.cancel());
  p.wait();
  BOOST_TEST(overlap.load() == 0);
}

BOOST_AUTO_TEST_CASE(delayed_work_over_a_non_metronome_executor_uses_the_default_timer) {
  // The shared timer thread posts into this io_context when the task falls due, and
  // Asio may still be signalling inside that post after the task ran: the context
  // must outlive that process-wide thread, so here it is never destroyed.
  static net::io_context* const io_ptr = new net::io_context;
  net::io_context& io = *io_ptr;
  auto serial = make_serial_executor(io.get_executor());
  auto f = serial.schedule([&] { return serial.running_in_this_thread(); }, 2ms);
  auto guard = net::make_work_guard(io);
  std::thread t([&] { io.run(); });
  BOOST_TEST(f.get());
  guard.reset();
  t.join();
}

BOOST_AUTO_TEST_CASE(dispose_cancels_everything_it_holds) {
  metronome::manual_clock clock;
  metronome::pool_options po;
  po.threads = 1;
  po.time_source = &clock;
  scheduled_thread_pool pool(po);
  auto serial = make_serial_executor(pool);
  auto other = make_serial_executor(pool);
  metronome::test::gate started, release;
  std::atomic<int> ran{0};
  net::post(serial, [&] {
    started.open();
    release.wait();
  });
  started.wait(); // the drain is busy: what follows stays queued
  std::vector<metronome::scheduled_future<void>> queued;
  for (int i = 0; i < 10; ++i) queued.push_back(serial.submit([&] { ++ran; }));
  for (int i = 0; i < 10; ++i) net::post(serial, [&] { ++ran; });
  auto delayed = serial.schedule([&] { ++ran; }, 1h);
  auto periodic = serial.schedule_at_fixed_rate([&] { ++ran; }, 1h, 1h);
  auto unrelated = other.schedule([] { return 5; }, 1h);
  BOOST_TEST(pool.stats().delayed_queued == 3u);

  serial.dispose();
  BOOST_TEST(serial.is_disposed());
  BOOST_TEST(delayed.is_cancelled());
  BOOST_TEST(periodic.is_cancelled());
  BOOST_TEST(pool.stats().delayed_queued == 1u); // only the other executor's task
  BOOST_CHECK_THROW(serial.submit([] {}), metronome::rejected_execution);
  BOOST_CHECK_THROW(serial.schedule([] {}, 1ms), metronome::rejected_execution);
  for (auto& q : queued) BOOST_TEST(!q.is_done()); // queued: cancelled by the drain, when it runs next
  release.open();
  for (auto& q : queued) {
    q.wait();
    BOOST_TEST(q.is_cancelled());
  }
  BOOST_TEST(metronome::test::poll_until([&] { return pool.stats().ready_queued == 0 && pool.stats().active == 0; }));
  BOOST_TEST(ran.load() == 0);
  clock.advance(1h);
  BOOST_TEST(unrelated.get() == 5); // other serial executors are untouched
  BOOST_TEST(!other.is_disposed());
}

BOOST_AUTO_TEST_CASE(dispose_during_a_drain) {
  scheduled_thread_pool pool(2);
  auto serial = make_serial_executor(pool);
  std::atomic<int> ran{0};
  std::promise<void> disposed;
  auto disposed_f = disposed.get_future().share();
  for (int i = 0; i < 1000; ++i) {
    net::post(serial, [&, i] {
      if (i == 10) {
        serial.dispose(); // from inside the drain
        disposed.set_value();
      }
      ++ran;
    });
  }
  disposed_f.wait();
  BOOST_TEST(metronome::test::poll_until([&] { return pool.stats().ready_queued == 0 && pool.stats().active == 0; }));
  BOOST_TEST(ran.load() == 11); // tasks 0..10 ran, the rest were discarded
}

BOOST_AUTO_TEST_CASE(co_spawn_and_async_delay_on_a_serial_executor) {
  scheduled_thread_pool pool(2);
  auto serial = make_serial_executor(pool);
  int shared = 0; // touched only by the coroutines, which are serialised
  auto worker = [&]() -> net::awaitable<void> {
    for (int i = 0; i < 100; ++i) {
      co_await metronome::async_delay(serial, 50us, net::use_awaitable);
      ++shared; // a data race (TSan) if the two coroutines ever ran at once
    }
  };
  auto a = net::co_spawn(serial, worker(), net::use_future);
  auto b = net::co_spawn(serial, worker(), net::use_future);
  a.get();
  b.get();
  BOOST_TEST(shared == 200);
}

// Over a type-erased executor (what `co_await this_coro::executor` gives a coroutine) a
// serial executor is still an executor and converts back to any_io_executor, so co_spawn
// and bind_executor take it, as they take asio::strand<any_io_executor>. (Its converting
// constructor once made copying it ask whether it was an executor while that very question
// was being answered: it did not compile.)
using erased_serial = metronome::serial_executor<net::any_io_executor>;
static_assert(net::execution::is_executor<erased_serial>::value);
static_assert(std::is_convertible_v<erased_serial, net::any_io_executor>);
static_assert(std::is_nothrow_copy_constructible_v<erased_serial>);

BOOST_AUTO_TEST_CASE(a_serial_executor_over_any_io_executor_hosts_coroutines) {
  net::io_context io;
  auto serial = make_serial_executor(net::any_io_executor(io.get_executor()));
  const net::any_io_executor erased = serial;
  BOOST_TEST((erased == net::any_io_executor(serial)));
  BOOST_TEST(erased.target<erased_serial>() != nullptr);
  int shared = 0; // touched only by the coroutines, which are serialised
  std::atomic<int> off_serial{0};
  auto worker = [&]() -> net::awaitable<void> {
    for (int i = 0; i < 50; ++i) {
      const auto ex = co_await net::this_coro::executor;
      const auto* s = ex.target<erased_serial>();
      if (!s || !s->running_in_this_thread()) off_serial.fetch_add(1);
      co_await metronome::async_delay(ex, 20us, net::use_awaitable);
      ++shared; // a data race (TSan) if the two coroutines ever ran at once
    }
  };
  net::co_spawn(serial, worker(), net::detached);
  net::co_spawn(erased, worker(), net::detached);
  std::thread second([&] { io.run(); }); // two threads run the io_context
  io.run();
  second.join();
  BOOST_TEST(shared == 100);
  BOOST_TEST(off_serial.load() == 0);
}

// An io_context destroyed under a coroutine on a serial executor, suspended in a
// metronome wait: the context's shutdown destroys the serial executor's queued drain (it
// is abandoned) and the wait's handler, and Asio, destroying the coroutine, posts the end
// of its frame to the serial executor. That post is dropped quietly, as the context's own
// shutdown is (as with an asio::strand): nothing on stderr; a handler you installed hears
// of it as rejected_execution. A dispose() of yours still reports such work.
BOOST_AUTO_TEST_CASE(an_io_context_destroyed_under_a_suspended_coroutine_on_a_serial_executor_is_quiet) {
  for (const bool with_handler : {false, true}) {
    std::atomic<int> frames_ended{0}, reports{0}, rejected{0};
    metronome::test::stderr_capture err;
    {
      auto io = std::make_unique<net::io_context>();
      metronome::serial_options o;
      if (with_handler)
        o.exception_handler = [&](std::exception_ptr e) {
          ++reports;
          try {
            std::rethrow_exception(e);
          } catch (const metronome::rejected_execution&) {
            ++rejected;
          } catch (...) {
          }
        };
      auto serial = make_serial_executor(io->get_executor(), o);
      std::atomic<bool> suspended{false};
      net::co_spawn(
          serial,
          [&]() -> net::awaitable<void> {
            struct on_end {
              std::atomic<int>& n;
              ~on_end() { n.fetch_add(1); }
            } end{frames_ended};
            const auto ex = co_await net::this_coro::executor;
            suspended = true;
            co_await metronome::async_delay(ex, 1h, net::use_awaitable);
          },
          net::detached);
      while (!suspended.load()) io->poll_one();
      io->poll(); // whatever its suspension queued
      io.reset();
    }
    const std::string out = err.take();
    BOOST_TEST(frames_ended.load() == 1);
    BOOST_TEST(out.empty(), "stderr: " << out);
    BOOST_TEST(reports.load() == rejected.load()); // rejected_execution, and nothing else
    BOOST_TEST(rejected.load() == (with_handler ? 1 : 0));
  }
}

BOOST_AUTO_TEST_CASE(bind_executor_runs_handlers_in_order) {
  scheduled_thread_pool pool(2);
  auto serial = make_serial_executor(pool);
  std::vector<int> order;
  std::promise<void> done;
  for (int i = 0; i < 100; ++i)
    net::post(pool, net::bind_executor(serial, [&, i] {
                 order.push_back(i);
                 if (order.size() == 100) done.set_value();
               }));
  done.get_future().get();
  BOOST_TEST(order.size() == 100u); // no lost or concurrent push_back (TSan checks)
}

// shutdown_now() hands back a serial executor's queued drain as a pending_task; the
// README promises a pending_task can still be run after the pool is destroyed. The drain
// ran its typed tasks through the pool (a null pointer: SIGSEGV), re-posted itself to
// the destroyed pool after a batch, and reported exceptions to it (adversary pass 6).
// Run by its caller it runs everything it holds, in order, typed tasks once.
BOOST_AUTO_TEST_CASE(a_serial_drain_handed_back_by_shutdown_now_runs_after_the_pool_is_gone) {
  std::vector<metronome::pending_task> handed;
  std::vector<int> order;
  std::vector<metronome::scheduled_future<int>> typed;
  metronome::scheduled_future<void> periodic;
  {
    scheduled_thread_pool pool(1);
    metronome::test::gate release;
    metronome::test::counter started;
    BOOST_REQUIRE(metronome::test::occupy_worker(pool, release, started));
    auto serial = make_serial_executor(pool); // batch 64: 150 tasks need the drain to go on past it
    for (int i = 0; i < 150; ++i) {
      if (i % 3 == 0) {
        typed.push_back(serial.submit([&order, i] {
          order.push_back(i);
          return i;
        }));
      } else if (i == 100) {
        net::post(serial, [&order, i] {
          order.push_back(i);
          throw std::runtime_error("a task of a handed-back drain throws"); // reported, the drain goes on
        });
      } else {
        net::post(serial, [&order, i] { order.push_back(i); });
      }
    }
    periodic = serial.schedule_at_fixed_rate([&order] { order.push_back(-1); }, 0ms, 1h); // due now: queued
    handed = pool.shutdown_now();
    release.open();
  } // the pool is destroyed with the drain handed back
  BOOST_REQUIRE(!handed.empty());
  for (auto& p : handed) p();
  std::vector<int> expected(150);
  for (int i = 0; i < 150; ++i) expected[static_cast<std::size_t>(i)] = i;
  BOOST_REQUIRE(order.size() >= 150u);
  BOOST_TEST(std::vector<int>(order.begin(), order.begin() + 150) == expected, boost::test_tools::per_element());
  for (std::size_t k = 0; k < typed.size(); ++k) {
    BOOST_TEST(typed[k].is_done());
    BOOST_TEST(typed[k].get() == static_cast<int>(3 * k));
  }
  // The periodic task: queued when the pool went, it runs once (as a handed-back
  // periodic task of the pool itself does) and ends.
  BOOST_TEST(order.size() == 151u);
  BOOST_TEST(periodic.is_done());
}

// A handed-back drain runs after its pool is gone; a task in it that posts to the same
// serial executor (every coroutine resumption does) or submits to it is refused as
// outside work of a shut-down pool: the post dropped and reported as rejected_execution
// to the serial executor's handler, the submit throws it. It read the destroyed pool
// (ASan: heap-use-after-free in refuses_outside_work).
BOOST_AUTO_TEST_CASE(a_handed_back_drain_run_after_its_pool_is_gone_refuses_posts_to_its_executor) {
  metronome::test::exception_log log;
  metronome::serial_options so;
  so.exception_handler = log.handler();
  std::vector<metronome::pending_task> handed;
  std::atomic<int> ran{0};
  std::atomic<int> refused_submits{0};
  std::optional<metronome::serial_executor<scheduled_thread_pool::executor_type>> serial;
  {
    scheduled_thread_pool pool(1);
    metronome::test::gate release;
    metronome::test::counter started;
    BOOST_REQUIRE(metronome::test::occupy_worker(pool, release, started));
    serial.emplace(make_serial_executor(pool, so));
    net::post(*serial, [&] {
      ++ran;
      net::post(*serial, [&] { ++ran; }); // refused: dropped and reported
      try {
        (void)serial->submit([] {});
      } catch (const metronome::rejected_execution&) {
        ++refused_submits;
      }
    });
    handed = pool.shutdown_now();
    release.open();
  } // the pool is destroyed with the drain handed back
  BOOST_REQUIRE_EQUAL(handed.size(), 1u);
  handed[0]();
  BOOST_TEST(ran.load() == 1);
  BOOST_TEST(refused_submits.load() == 1);
  const auto seen = log.messages();
  BOOST_REQUIRE_EQUAL(seen.size(), 1u);
  BOOST_TEST(seen[0].find("shut down") != std::string::npos);
}

// A handle's async_wait whose handler is bound to a serial executor over the pool: a
// task ended after shutdown() by another thread (cancel(), or already done when the wait
// starts) completes the wait through the serial executor - the library's completion of
// accepted work, taken by the pool and by a strand. The serial executor refused it as
// outside work: the handler was destroyed unrun and "work dropped" reported (adversary
// pass 7; a coroutine on the serial executor awaiting the handle vanished).
BOOST_AUTO_TEST_CASE(a_wait_bound_to_a_serial_executor_completes_after_the_pool_is_shut_down) {
  scheduled_thread_pool pool(1);
  auto serial = make_serial_executor(pool);
  auto far = pool.schedule([] { return 1; }, 1h);
  auto done = pool.submit([] { return 5; });
  done.wait();
  std::atomic<int> cancelled{0}, values{0}, on_serial{0};
  far.async_wait(net::bind_executor(serial, [&](std::exception_ptr e, int) {
    if (serial.running_in_this_thread()) ++on_serial;
    try {
      if (e) std::rethrow_exception(e);
    } catch (const metronome::cancelled_error&) {
      ++cancelled;
    }
  }));
  pool.shutdown(); // delayed work still runs after shutdown by default: the pool stays up
  done.async_wait(net::bind_executor(serial, [&](std::exception_ptr e, int v) {
    if (serial.running_in_this_thread()) ++on_serial;
    if (!e && v == 5) ++values;
  }));
  far.cancel();
  pool.join();
  BOOST_CHECK_EQUAL(cancelled.load(), 1);
  BOOST_CHECK_EQUAL(values.load(), 1);
  BOOST_CHECK_EQUAL(on_serial.load(), 2);
  BOOST_CHECK_EQUAL(pool.stats().rejected, 0u);
}

// A serial executor over a type-erased executor of a metronome pool (it cannot see the
// pool there, so the shared timing pool times its delayed work): a delayed task accepted
// before the pool's shutdown() falls due after it, while a task still runs, and the
// timing pool's thread posts the drain - the library's delivery of accepted work. It was
// posted as outside work: dropped ("work dropped" reported), the task never ran and its
// handle never completed.
BOOST_AUTO_TEST_CASE(a_delayed_task_over_an_erased_pool_executor_runs_after_shutdown) {
  std::atomic<int> reports{0};
  metronome::pool_options o;
  o.threads = 1;
  o.exception_handler = [&](std::exception_ptr) { ++reports; };
  scheduled_thread_pool pool(o);
  metronome::test::gate release;
  std::promise<void> started;
  net::post(pool, [&] {
    started.set_value();
    release.wait();
  });
  started.get_future().wait();
  auto serial = make_serial_executor(net::any_io_executor(pool.get_executor()));
  auto h = serial.schedule([] { return 7; }, 1ms);
  pool.shutdown(); // not terminated: a task still runs (it was dropped once due)
  release.open();
  BOOST_TEST_REQUIRE((h.wait_for(10s) == std::future_status::ready));
  BOOST_TEST(h.get() == 7);
  pool.join();
  BOOST_TEST(reports.load() == 0);
  BOOST_TEST(pool.stats().rejected == 0u);
}

BOOST_AUTO_TEST_CASE(zero_batch_is_invalid) {
  scheduled_thread_pool pool(1);
  metronome::serial_options o;
  o.batch = 0;
  BOOST_CHECK_THROW(make_serial_executor(pool, o), std::invalid_argument);
}

// As an Asio strand's dispatch: a free serial executor runs dispatched work inline on a
// thread of its underlying executor; busy, or posted, or from another thread, it queues.
BOOST_AUTO_TEST_CASE(dispatch_runs_a_free_serial_executor_inline_on_its_underlying_executors_thread) {
  metronome::net::io_context io;
  auto serial = make_serial_executor(io.get_executor());
  std::vector<int> order;
  metronome::net::dispatch(serial, [&] { order.push_back(0); }); // not on io's thread: queued
  BOOST_TEST(order.empty());
  io.run();
  BOOST_TEST((order == std::vector<int>{0}));
  io.restart();
  order.clear();
  metronome::net::post(io, [&] {
    metronome::net::post(serial, [&] { order.push_back(1); });
    metronome::net::dispatch(serial, [&] { order.push_back(2); }); // busy (1 is queued): behind it
    order.push_back(0);
  });
  io.run();
  BOOST_TEST((order == std::vector<int>{0, 1, 2}));
  io.restart();
  order.clear();
  metronome::net::post(io, [&] {
    metronome::net::dispatch(serial, [&] {
      BOOST_TEST(serial.running_in_this_thread());
      order.push_back(1);
    });
    order.push_back(2); // the free serial executor ran it before dispatch returned
    metronome::net::post(serial, [&] { order.push_back(4); }); // post: never inline
    order.push_back(3);
  });
  io.run();
  BOOST_TEST((order == std::vector<int>{1, 2, 3, 4}));
}

// ---- delayed work, and over a shut-down pool

BOOST_AUTO_TEST_CASE(delayed_serial_work_over_io_context_survives_a_cancel) {
  metronome::net::io_context io;
  auto guard = metronome::net::make_work_guard(io);
  std::thread runner([&] { io.run(); });
  auto serial = metronome::make_serial_executor(io.get_executor());
  auto first = serial.schedule([] {}, 100ms);
  BOOST_CHECK(first.cancel());
  std::this_thread::sleep_for(20ms);
  auto second = serial.schedule([] {}, 100ms); // due after the cancelled one
  BOOST_CHECK_MESSAGE(ready(second.wait_for(10s)), "delayed serial work lost on the shared timing pool");
  serial.dispose(); // the timing pool's thread is out of io's post() (it may still be when the task ran)
  guard.reset();
  runner.join();
}

BOOST_AUTO_TEST_CASE(a_pool_task_waiting_for_a_serial_task_over_the_same_pool_is_not_stranded) {
  scheduled_thread_pool pool(2);
  auto serial = metronome::make_serial_executor(pool);
  for (int round = 0; round < 5; ++round) {
    pool.submit([] {}).wait();
    std::this_thread::sleep_for(20ms); // the scenario: the other worker has gone to sleep
    auto waited = pool.submit([&] { return ready(serial.submit([] {}).wait_for(10s)); });
    BOOST_CHECK_MESSAGE(waited.get(), "the serial drain was queued without waking the idle worker");
  }
}

BOOST_AUTO_TEST_CASE(a_serial_executor_over_a_shut_down_pool_refuses_outside_work_and_runs_inside_work) {
  reported r;
  pool_options o;
  o.exception_handler = r.handler();
  held_pool hp(o);
  auto serial = metronome::make_serial_executor(hp.pool);
  std::atomic<int> ran{0};
  // Queued before shutdown: it posts to the serial executor from a pool thread.
  metronome::net::post(hp.pool.get_executor(), [&] { metronome::net::post(serial, [&] { ++ran; }); });
  hp.pool.shutdown();
  metronome::net::post(serial, [&] { ran += 100; });                           // outside: dropped, reported
  BOOST_CHECK_THROW(serial.submit([] {}), metronome::rejected_execution); // outside, typed: refused
  hp.release();
  BOOST_CHECK(poll_until([&] { return ran.load() == 1; }, 10s));
  BOOST_CHECK(hp.pool.await_termination(10s));
  BOOST_CHECK_EQUAL(ran.load(), 1);
  BOOST_CHECK_EQUAL(r.count(), 1u);
  BOOST_CHECK_EQUAL(hp.pool.stats().rejected, 2u);
}

// ---- due order

// The same on a serial executor: a serial task due now joins behind serial tasks already due.
BOOST_AUTO_TEST_CASE(a_due_now_serial_task_queues_behind_a_delayed_serial_task_already_due) {
  scheduled_thread_pool pool(pool_options::single_thread());
  auto serial = metronome::make_serial_executor(pool);
  gate hold;
  counter held;
  pool.submit([&] {
    held.add();
    hold.wait();
  });
  BOOST_REQUIRE(held.wait_for_at_least(1));
  std::mutex m;
  std::vector<int> order;
  auto record = [&](int id) {
    return [&, id] {
      std::lock_guard lk(m);
      order.push_back(id);
    };
  };
  auto a = serial.schedule(record(1), 1ms);
  BOOST_REQUIRE(poll_until([&] { return a.delay() <= std::chrono::nanoseconds::zero(); }, 10s));
  auto c = serial.submit(record(2)); // went straight to the serial queue, ahead of 1 (adversary pass 6)
  auto b = serial.schedule(record(3), 0ms);
  auto d = serial.schedule_at_fixed_rate(record(4), 0ms, 1h);
  hold.open();
  c.wait();
  b.wait();
  a.wait();
  BOOST_CHECK(poll_until([&] {
    std::lock_guard lk(m);
    return order.size() == 4u;
  }));
  d.cancel();
  std::lock_guard lk(m);
  BOOST_CHECK((order == std::vector<int>{1, 2, 3, 4}));
}

BOOST_AUTO_TEST_CASE(delayed_serial_tasks_run_in_due_order_on_four_threads) {
  scheduled_thread_pool pool(4);
  for (int round = 0; round < 5; ++round) {
    auto serial = metronome::make_serial_executor(pool);
    std::mutex m;
    std::vector<int> order;
    std::vector<metronome::scheduled_future<void>> hs;
    for (int i = 0; i < 30; ++i) {
      const auto d = std::chrono::milliseconds(20 * (i % 3)); // 0, 20, 40, 0, 20, 40...
      hs.push_back(serial.schedule(
          [&, i] {
            std::lock_guard lk(m);
            order.push_back(i);
          },
          d));
    }
    for (auto& h : hs) BOOST_REQUIRE(ready(h.wait_for(20s)));
    std::vector<int> expected;
    for (int r = 0; r < 3; ++r)
      for (int i = r; i < 30; i += 3) expected.push_back(i);
    BOOST_CHECK_EQUAL_COLLECTIONS(order.begin(), order.end(), expected.begin(), expected.end());
  }
}

BOOST_AUTO_TEST_CASE(delayed_serial_tasks_falling_due_together_run_in_due_order_on_four_threads) {
  manual_clock clk;
  scheduled_thread_pool pool(on_clock(clk, 4));
  for (int round = 0; round < 20; ++round) {
    auto serial = metronome::make_serial_executor(pool);
    std::mutex m;
    std::vector<int> order;
    std::vector<metronome::scheduled_future<void>> hs;
    for (int i = 0; i < 30; ++i) {
      const auto d = std::chrono::milliseconds(1 + (i % 3)); // 1, 2, 3, 1, 2, 3...
      hs.push_back(serial.schedule(
          [&, i] {
            std::lock_guard lk(m);
            order.push_back(i);
          },
          d));
    }
    clk.advance(3ms); // all due at once
    for (auto& h : hs) BOOST_REQUIRE(ready(h.wait_for(20s)));
    std::vector<int> expected;
    for (int r = 0; r < 3; ++r)
      for (int i = r; i < 30; i += 3) expected.push_back(i);
    BOOST_CHECK_EQUAL_COLLECTIONS(order.begin(), order.end(), expected.begin(), expected.end());
  }
}

BOOST_AUTO_TEST_SUITE_END()

// The schedule family with a callable bound to an executor of its own (bind_executor):
// the task takes its turn in the serial executor's order, is handed to that executor
// there, and runs there - as on the pool (docs/semantics.md, "Callables bound to an
// executor").
namespace {

// An io_context run by one thread of its own until the fixture ends.
struct io_thread {
  net::io_context io;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> guard{io.get_executor()};
  std::thread thread{[this] { io.run(); }};
  ~io_thread() {
    guard.reset();
    thread.join();
  }
  bool here() const { return std::this_thread::get_id() == thread.get_id(); }
};

} // namespace

BOOST_AUTO_TEST_SUITE(serial_bound_suite)

BOOST_AUTO_TEST_CASE(a_serial_executor_s_bound_task_runs_on_its_executor_when_due) {
  manual_clock clock;
  scheduled_thread_pool pool(on_clock(clock));
  auto serial = make_serial_executor(pool);
  io_thread rio;
  auto strand = net::make_strand(rio.io);
  auto later = serial.schedule(net::bind_executor(strand,
                                                  [&] {
                                                    return strand.running_in_this_thread() && rio.here() &&
                                                           !serial.running_in_this_thread();
                                                  }),
                               10ms);
  auto now = serial.submit(net::bind_executor(rio.io, [&] { return rio.here(); }));
  BOOST_CHECK(now.get());
  BOOST_CHECK(!later.is_done());
  clock.advance(10ms);
  BOOST_CHECK(later.get());
  // Unbound, the same call runs in the serial executor, as before.
  auto plain = serial.schedule([&] { return serial.running_in_this_thread(); }, 5ms);
  clock.advance(5ms);
  BOOST_CHECK(plain.get());
}

// Over an io_context (the context's own timing): the hand-over comes from the drain on
// the io_context's thread, the run is on the bound strand of another io_context.
BOOST_AUTO_TEST_CASE(a_bound_task_of_a_serial_executor_over_an_io_context_runs_on_its_executor) {
  io_thread host;
  auto serial = make_serial_executor(host.io.get_executor());
  io_thread other;
  auto strand = net::make_strand(other.io);
  auto h = serial.schedule(net::bind_executor(strand, [&] { return strand.running_in_this_thread() && other.here(); }),
                           1ms);
  BOOST_CHECK(h.get());
  serial.dispose();
}

// Fixed rate on a strand of a two-thread io_context: never overlapping, on the strand,
// on the grid; the next run is scheduled when the run there has ended.
BOOST_AUTO_TEST_CASE(a_serial_executor_s_bound_periodic_task_keeps_its_grid_on_a_strand) {
  manual_clock clock;
  metronome::test::strand_run_log on_strand(clock); // outlives the pool: a failed check ends cleanly
  scheduled_thread_pool pool(on_clock(clock, 2));
  auto serial = make_serial_executor(pool);
  auto h = serial.schedule_at_fixed_rate(on_strand.task(), 10ms, 10ms);
  for (int i = 1; i <= 3; ++i) {
    clock.advance(10ms);
    BOOST_REQUIRE(poll_until([&] { return on_strand.runs() == i; }, 10s));
  }
  BOOST_CHECK(h.cancel());
  h.wait();
  clock.advance(50ms);
  on_strand.stop();
  BOOST_CHECK_EQUAL(on_strand.runs(), 3);
  BOOST_CHECK(!on_strand.overlapped());
  BOOST_CHECK(!on_strand.off_strand());
  const auto times = on_strand.times();
  BOOST_REQUIRE_EQUAL(times.size(), 3u);
  BOOST_CHECK(times[0] == 10ms && times[1] == 20ms && times[2] == 30ms);
}

// Handed to an io_context nobody runs: dispose() then cancels it like any delayed task
// of the executor, and the run never happens when the io_context runs.
BOOST_AUTO_TEST_CASE(dispose_cancels_a_bound_task_handed_over_and_not_started) {
  manual_clock clock;
  scheduled_thread_pool pool(on_clock(clock));
  auto serial = make_serial_executor(pool);
  net::io_context io;
  std::atomic<bool> ran{false};
  auto h = serial.schedule(net::bind_executor(io, [&] { ran = true; }), 10ms);
  auto marker = serial.schedule([] {}, 10ms); // after it in the executor's order
  clock.advance(10ms);
  marker.wait(); // the drain has taken both: the bound one is handed over
  BOOST_CHECK(!h.is_done());
  serial.dispose();
  BOOST_CHECK(h.is_cancelled());
  BOOST_CHECK_EQUAL(io.poll(), 1u); // the hand-over runs and finds the task cancelled
  BOOST_CHECK(!ran.load());
  BOOST_CHECK_THROW(h.get(), metronome::cancelled_error);
}

// A serial executor holds the underlying context's work as an Asio strand does: its
// outstanding_work.tracked copy (what a pending operation's handler holds) keeps
// io_context::run() from returning. A coroutine on make_serial_executor(io) that awaits
// a pool handle finishes; before, io.run() returned at once and left it suspended.
BOOST_AUTO_TEST_CASE(a_serial_executor_holds_the_underlying_context_s_work_as_a_strand_does) {
  scheduled_thread_pool pool(1);
  for (int kind = 0; kind < 2; ++kind) { // a serial executor, then a strand: the same outcome
    net::io_context io;
    auto f = pool.schedule([] { return 7; }, 20ms);
    int got = 0;
    auto body = [&]() -> net::awaitable<void> { got = co_await f.async_wait(net::use_awaitable); };
    if (kind == 0)
      net::co_spawn(make_serial_executor(io.get_executor()), body, net::detached);
    else
      net::co_spawn(net::make_strand(io.get_executor()), body, net::detached);
    io.run();
    BOOST_TEST(got == 7, "kind " << kind);
  }

  net::io_context io;
  auto serial = make_serial_executor(io.get_executor());
  using ow = net::execution::outstanding_work_t;
  BOOST_TEST((net::query(serial, net::execution::outstanding_work) == ow::untracked));
  {
    auto tracked = net::prefer(serial, net::execution::outstanding_work.tracked);
    BOOST_TEST((net::query(tracked, net::execution::outstanding_work) == ow::tracked));
    BOOST_TEST((tracked == serial)); // one queue
    auto copy = tracked;           // copies hold work too; moves carry it
    auto moved = std::move(copy);
    auto untracked = net::prefer(moved, net::execution::outstanding_work.untracked);
    BOOST_TEST((net::query(untracked, net::execution::outstanding_work) == ow::untracked));
    BOOST_TEST(io.run_for(5ms) == 0u); // work is held: run_for returns on time only
    BOOST_TEST(!io.stopped());
  }
  io.restart();
  BOOST_TEST(io.run() == 0u); // every tracked copy gone: run() returns at once
  BOOST_TEST(io.stopped());
}

BOOST_AUTO_TEST_SUITE_END()
