// Stress with accounting, async_delay: per-operation cancellation races completion
// (handlers on a serial executor, on an io_context strand), shutdown() races both, and
// coroutines looping on async_delay on strands meet shutdown() and join(). Every
// launched wait's handler runs exactly once and is destroyed exactly once. Bounded in
// time like every stress case; seeds as in common/stress_rounds.hpp.

#include "common/poll_until.hpp"
#include "common/wait_batch.hpp"

#include <metronome/detail/asio.hpp>

#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace {

using metronome::test::poll_until;

// Coroutines co_spawned on asio strands over the pool loop on async_delay; a producer
// posts plain work to the same strands from outside; shutdown() comes at a random
// moment. Waits complete with operation_aborted at shutdown "so coroutines unwind":
// every coroutine must finish, and join() must return (co_spawn holds tracked work on
// the strand's executor until its coroutine finishes).
struct coro_state {
  std::unique_ptr<scheduled_thread_pool> pool;
  std::vector<net::strand<scheduled_thread_pool::executor_type>> strands;
  std::atomic<int> finished{0}, aborted{0}, steps{0}, posted_ran{0};
  std::atomic<bool> producing{true};
};

net::awaitable<void> delay_loop(coro_state* st, unsigned seed) {
  auto pex = st->pool->get_executor();
  for (int i = 0; i < 50; ++i) {
    seed = seed * 1103515245u + 12345u;
    try {
      co_await metronome::async_delay(pex, std::chrono::microseconds(seed % 1500), net::use_awaitable);
    } catch (const metronome::system_error& e) {
      if (e.code() == net::error::operation_aborted) st->aborted.fetch_add(1);
      co_return;
    }
    st->steps.fetch_add(1);
  }
}

bool coroutine_join_round(std::uint64_t seed, errors& errs) {
  std::mt19937_64 rng(seed);
  auto sp = std::make_shared<coro_state>();
  coro_state& st = *sp;
  pool_options o;
  o.threads = 2;
  o.exception_handler = [](std::exception_ptr) {}; // dropped outside work is reported here
  st.pool = std::make_unique<scheduled_thread_pool>(o);
  for (int i = 0; i < 3; ++i) st.strands.push_back(net::make_strand(st.pool->get_executor()));
  const int n = scaled(24, 8);
  for (int i = 0; i < n; ++i)
    net::co_spawn(st.strands[i % 3], delay_loop(&st, static_cast<unsigned>(rng())),
                   [p = &st](std::exception_ptr) { p->finished.fetch_add(1); });
  std::thread producer([&st, s0 = rng()] {
    std::mt19937_64 r2(s0);
    while (st.producing.load()) {
      net::post(st.strands[r2() % 3], [p = &st] { p->posted_ran.fetch_add(1); });
      std::this_thread::yield();
    }
  });
  // A random moment: after a random number of coroutine steps.
  const int threshold = static_cast<int>(rng() % (n * 10 + 1));
  const auto limit = std::chrono::steady_clock::now() + 5s;
  while (st.steps.load() < threshold && st.finished.load() < n && std::chrono::steady_clock::now() < limit)
    std::this_thread::yield();
  st.pool->shutdown();
  std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500)); // outside posts keep coming a little
  st.producing.store(false);
  producer.join();
  if (!finishes_within(10s, [sp] { sp->pool->join(); })) {
    errs.add(fmt("join() after shutdown() did not return within 10 s: %d of %d coroutines finished (%d aborted "
                 "waits), stats: active=%zu ready=%zu delayed=%zu",
                 st.finished.load(), n, st.aborted.load(), st.pool->stats().active, st.pool->stats().ready_queued,
                 st.pool->stats().delayed_queued));
    metronome::test::leak(sp);
    return false;
  }
  if (st.finished.load() != n)
    errs.add(fmt("join() returned but only %d of %d coroutines finished (the others never resumed)", st.finished.load(), n));
  st.strands.clear();
  st.pool.reset();
  return true;
}

// cancel_after's deadlines on a timing pool that is shut down while operations (timers
// of an io_context on a thread of its own) are being started. Each operation ends once:
// completed (its timer expired first), fired (its deadline cancelled it) or dropped (the
// test cancelled it at the end: its deadline was dropped at shutdown). Some operations,
// started before shutdown(), never end by themselves (hour-long timers). With
// run_delayed_after_shutdown (the default) shutdown() keeps deadlines as delayed tasks:
// none is dropped, every one of those ends fired, and the pool terminates once the last
// deadline is done. Without it shutdown() drops them: those operations (given hour-long
// deadlines in that mode) are all dropped, and the pool terminates without them.
bool deadline_shutdown_round(std::uint64_t seed, errors& errs, bool keep_deadlines) {
  std::mt19937_64 rng(seed);
  pool_options o;
  o.threads = 2;
  o.run_delayed_after_shutdown = keep_deadlines;
  scheduled_thread_pool pool(o);
  net::io_context io;
  auto guard = net::make_work_guard(io);
  std::thread runner([&io] { io.run(); });
  enum outcome : int { none, completed, fired, dropped, twice };
  const int n = scaled(300, 60);
  std::vector<std::unique_ptr<net::steady_timer>> timers;
  std::vector<std::atomic<int>> outcomes(n);
  std::atomic<int> ended{0}, hour_long{0};
  std::atomic<bool> test_cancels{false};
  const int shutdown_at = static_cast<int>(rng() % n);
  for (int i = 0; i < n; ++i) {
    if (i == shutdown_at) pool.shutdown();
    const bool forever = i < shutdown_at && rng() % 4 == 0; // only before shutdown(): see above
    hour_long += forever ? 1 : 0;
    timers.push_back(std::make_unique<net::steady_timer>(
        io, forever ? std::chrono::steady_clock::duration(1h) : std::chrono::microseconds(rng() % 2000)));
    auto handler = [&, i](error_code ec) {
      const int how = !ec ? completed : test_cancels.load() ? dropped : fired;
      int expected = none;
      if (!outcomes[i].compare_exchange_strong(expected, how)) outcomes[i].store(twice);
      ended.fetch_add(1);
    };
    const auto deadline = forever && !keep_deadlines ? std::chrono::steady_clock::duration(1h)
                                                     : std::chrono::microseconds(rng() % 2000);
    timers.back()->async_wait(metronome::cancel_after(pool.get_executor(), deadline, std::move(handler)));
  }
  if (!pool.await_termination(20s))
    errs.add(fmt("the timing pool did not terminate within 20 s of shutdown() (keep deadlines: %d, %d of %d ended)",
                 keep_deadlines, ended.load(), n));
  // Terminated: no deadline fires any more. With deadlines kept every operation ends by
  // itself (a fired one's emission runs on io's thread, after the termination maybe);
  // without, all but the hour-long ones do, and the test ends those from io's thread.
  const int by_themselves = keep_deadlines ? n : n - hour_long.load();
  if (!poll_until([&] { return ended.load() >= by_themselves; }, 20s))
    errs.add(fmt("only %d of %d operations ended by themselves within 20 s", ended.load(), by_themselves));
  test_cancels.store(true);
  net::post(io, [&timers] {
    for (auto& t : timers) t->cancel();
  });
  guard.reset();
  runner.join();
  int count[5] = {};
  for (auto& x : outcomes) ++count[x.load()];
  if (count[none] != 0 || count[twice] != 0)
    errs.add(fmt("%d handlers never ran, %d ran twice, of %d", count[none], count[twice], n));
  if (count[completed] + count[fired] + count[dropped] != n)
    errs.add(fmt("completed %d + fired %d + dropped %d != started %d", count[completed], count[fired],
                 count[dropped], n));
  if (keep_deadlines && count[dropped] != 0)
    errs.add(fmt("%d deadlines lost to shutdown() though run_delayed_after_shutdown keeps them", count[dropped]));
  if (keep_deadlines && count[fired] < hour_long.load())
    errs.add(fmt("only %d fired of %d operations that never end by themselves", count[fired], hour_long.load()));
  if (!keep_deadlines && count[dropped] != hour_long.load())
    errs.add(fmt("%d dropped, but %d hour-long deadlines were pending at shutdown()", count[dropped], hour_long.load()));
  return true;
}

} // namespace

BOOST_AUTO_TEST_SUITE(stress_suite)

// ---- async_delay: per-operation cancellation racing completion

BOOST_AUTO_TEST_CASE(async_delay_cancellation_races_completion_on_a_serial_executor) {
  run_rounds("async_delay, handler on a serial executor", 1, budget(ms(3000, 4000), 2, 100000),
             [](std::uint64_t seed, errors& errs) {
               std::mt19937_64 rng(seed);
               delay_batch batch;
               {
                 scheduled_thread_pool pool(2);
                 auto hex = make_serial_executor(pool);
                 launch_batch(batch, pool, hex, delay_on(pool), rng, scaled(300, 60));
                 if (!batch.done.wait_for_at_least(static_cast<int>(batch.states.size())))
                   errs.add(fmt("only %d of %zu async_delay handlers ran within 20 s", batch.done.value(),
                                batch.states.size()));
                 pool.join();
                 check_delay_batch(batch, errs, false);
               }
               check_delay_lifetimes(batch, errs);
               return true;
             });
}

BOOST_AUTO_TEST_CASE(async_delay_cancellation_races_completion_on_an_io_context_strand) {
  run_rounds("async_delay, handler on an io_context strand", 2, budget(ms(3000, 4000), 2, 100000),
             [](std::uint64_t seed, errors& errs) {
               std::mt19937_64 rng(seed);
               delay_batch batch;
               {
                 scheduled_thread_pool pool(2);
                 net::io_context ioc;
                 auto guard = net::make_work_guard(ioc);
                 std::thread t1([&] { ioc.run(); }), t2([&] { ioc.run(); });
                 auto hex = net::make_strand(ioc);
                 launch_batch(batch, pool, hex, delay_on(pool), rng, scaled(300, 60));
                 if (!batch.done.wait_for_at_least(static_cast<int>(batch.states.size())))
                   errs.add(fmt("only %d of %zu async_delay handlers ran within 20 s", batch.done.value(),
                                batch.states.size()));
                 // The pool's emission timers post to the strand: let them finish first.
                 pool.shutdown();
                 pool.join();
                 guard.reset();
                 ioc.stop();
                 t1.join();
                 t2.join();
                 check_delay_batch(batch, errs, false);
               }
               check_delay_lifetimes(batch, errs);
               return true;
             });
}

// shutdown() completes pending waits with operation_aborted: every launched wait's
// handler still runs exactly once, and join() returns. The handler's executor is a
// serial executor or an asio strand over the same pool; launches and emissions posted
// from outside after shutdown() may be dropped (they then never launch).
template <class MakeHex>
bool delay_shutdown_round(std::uint64_t seed, errors& errs, MakeHex make_hex) {
  std::mt19937_64 rng(seed);
  struct st_t {
    delay_batch batch;
    std::unique_ptr<scheduled_thread_pool> pool;
  };
  auto sp = std::make_shared<st_t>();
  pool_options o;
  o.threads = 2;
  o.exception_handler = [](std::exception_ptr) {}; // dropped outside work is reported here
  sp->pool = std::make_unique<scheduled_thread_pool>(o);
  {
    auto hex = make_hex(*sp->pool);
    const int n = scaled(300, 60);
    launch_batch(sp->batch, *sp->pool, hex, delay_on(*sp->pool), rng, n, static_cast<int>(rng() % n));
    if (!finishes_within(20s, [sp] { sp->pool->join(); })) {
      errs.add("join() after shutdown() with pending async_delay waits did not return within 20 s");
      metronome::test::leak(sp);
      return false;
    }
    check_delay_batch(sp->batch, errs, true);
  }
  sp->pool.reset();
  check_delay_lifetimes(sp->batch, errs);
  return true;
}

BOOST_AUTO_TEST_CASE(async_delay_cancellation_races_shutdown_serial_handler) {
  run_rounds("async_delay racing shutdown(), handler on a serial executor", 3, budget(ms(2000, 3000), 2, 100000),
             [](std::uint64_t seed, errors& errs) {
               return delay_shutdown_round(seed, errs, [](scheduled_thread_pool& p) { return make_serial_executor(p); });
             });
}

BOOST_AUTO_TEST_CASE(async_delay_cancellation_races_shutdown_strand_handler) {
  run_rounds("async_delay racing shutdown(), handler on an asio strand", 12, budget(ms(2000, 3000), 2, 100000),
             [](std::uint64_t seed, errors& errs) {
               return delay_shutdown_round(seed, errs,
                                           [](scheduled_thread_pool& p) { return net::make_strand(p.get_executor()); });
             });
}

// ---- cancel_after deadlines, their timing pool shut down mid-way

BOOST_AUTO_TEST_CASE(cancel_after_deadlines_race_their_timing_pool_s_shutdown) {
  run_rounds("cancel_after deadlines racing shutdown(), kept", 14, budget(ms(1500, 2500), 2, 100000),
             [](std::uint64_t seed, errors& errs) { return deadline_shutdown_round(seed, errs, true); });
  run_rounds("cancel_after deadlines racing shutdown(), dropped", 15, budget(ms(1500, 2500), 2, 100000),
             [](std::uint64_t seed, errors& errs) { return deadline_shutdown_round(seed, errs, false); });
}

// ---- coroutines on strands, shutdown() and join()

BOOST_AUTO_TEST_CASE(join_after_shutdown_with_coroutines_on_strands) {
  run_rounds("join() after shutdown() with coroutines on strands", 13, budget(ms(2500, 4000), 3, 100000),
             [](std::uint64_t seed, errors& errs) { return coroutine_join_round(seed, errs); });
}

BOOST_AUTO_TEST_SUITE_END()
