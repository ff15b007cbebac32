// Stress with accounting, the wheel timer: stop() races schedule and cancel (every
// timeout fired, cancelled, returned by stop() or rejected, exactly once; then the pool
// destroyed before or after the stopped wheel), the last
// timeout's cancel races a schedule (the scheduled one fires), and wheel
// waits on a strand race their cancellation, the wheel's destruction and the pool's
// shutdown(). Bounded in time like every stress case; seeds as in
// common/stress_rounds.hpp.

#include "common/poll_until.hpp"
#include "common/wait_batch.hpp"

#include <metronome/detail/asio.hpp>

#include <random>
#include <thread>
#include <vector>

namespace {

// ======================================================================= wheel timer

struct wop {
  slot* s = nullptr;
  metronome::wheel_timer::timeout h;
  bool rejected = false;
  bool cancel_won = false;
};

// Returns false when a watchdog fired.
bool wheel_round(std::uint64_t seed, errors& errs, int per) {
  std::mt19937_64 rng(seed);
  struct state {
    std::unique_ptr<scheduled_thread_pool> pool;
    std::unique_ptr<metronome::wheel_timer> wheel;
    std::unique_ptr<slot[]> slots;
    std::vector<std::vector<wop>> ops;
    std::atomic<int> ops_done{0}, producers_done{0};
  };
  auto stp = std::make_shared<state>();
  state& st = *stp;
  const int producers = 2;
  st.pool = std::make_unique<scheduled_thread_pool>(2);
  st.wheel = std::make_unique<metronome::wheel_timer>(*st.pool);
  st.slots.reset(new slot[producers * per]);
  st.ops.resize(producers);
  for (auto& v : st.ops) v.reserve(per);
  std::vector<std::thread> ts;
  for (int p = 0; p < producers; ++p)
    ts.emplace_back([&st, &errs, p, per, s0 = rng()] {
      std::mt19937_64 r2(s0);
      auto& mine = st.ops[p];
      for (int i = 0; i < per; ++i) {
        wop& o = mine.emplace_back();
        o.s = &st.slots[p * per + i];
        slot* sl = o.s;
        try {
          o.h = st.wheel->schedule([l = life(sl), sl] { count_run(sl); },
                                   std::chrono::microseconds(r2() % 8 == 0 ? 0 : r2() % 5001));
        } catch (const rejected_execution&) {
          o.rejected = true;
        } catch (const std::exception& e) {
          errs.add(fmt("wheel schedule threw %s", e.what()));
        }
        if (r2() % 4 == 0) {
          wop& v = mine[r2() % mine.size()];
          if (v.h.cancel()) {
            if (v.cancel_won) errs.add("wheel: cancel() returned true twice");
            v.cancel_won = true;
          }
        }
        st.ops_done.fetch_add(1);
      }
      st.producers_done.fetch_add(1);
    });
  const int threshold = static_cast<int>(rng() % (producers * per + per / 4 + 1));
  while (st.ops_done.load() < threshold && st.producers_done.load() < producers) std::this_thread::yield();
  std::vector<metronome::wheel_timer::timeout> stopped = st.wheel->stop();
  for (auto& t : ts) t.join();
  for (auto& t : stopped)
    if (!t.is_cancelled()) errs.add("wheel: a timeout returned by stop() is not cancelled");
  // Half the rounds destroy the pool first: a stopped wheel touches its pool no more, and
  // stop() returned once the ticks' hand-overs begun before it were pushed (the sanitizer
  // builds watch the destroyed pool).
  const bool pool_first = rng() % 2 == 0;
  auto destroy_wheel = [&] {
    if (finishes_within(20s, [&st] { st.wheel.reset(); })) return true;
    errs.add("~wheel_timer() did not return within 20 s (hang)");
    return false;
  };
  if (!pool_first && !destroy_wheel()) {
    metronome::test::leak(stp);
    return false;
  }
  if (!finishes_within(20s, [&st] { st.pool.reset(); })) {
    errs.add("~scheduled_thread_pool() under a stopped wheel did not return within 20 s (hang)");
    metronome::test::leak(stp);
    return false;
  }
  if (pool_first && !destroy_wheel()) {
    metronome::test::leak(stp);
    return false;
  }
  // Wheel and pool are gone: every timeout fired, was cancelled, returned by stop(), or rejected.
  int in_stop = 0;
  for (auto& v : st.ops)
    for (auto& o : v) {
      const int ran = o.s->total();
      const bool cancelled = o.h.valid() && o.h.is_cancelled();
      const bool from_stop = cancelled && !o.cancel_won;
      in_stop += from_stop ? 1 : 0;
      if (ran > 1) errs.add(fmt("wheel: a timeout fired %d times", ran));
      if (o.cancel_won && ran) errs.add("wheel: cancel() returned true but the timeout fired");
      if (o.cancel_won && !cancelled) errs.add("wheel: cancel() returned true but is_cancelled() is false");
      if (ran + (o.cancel_won ? 1 : 0) + (from_stop ? 1 : 0) + (o.rejected ? 1 : 0) != 1)
        errs.add(fmt("wheel: outcomes fired=%d cancelled(true)=%d returned-by-stop=%d rejected=%d; want exactly one "
                     "(expired=%d)",
                     ran, o.cancel_won, from_stop, o.rejected, o.h.valid() && o.h.is_expired()));
      if (o.s->destroyed.load() != 1) errs.add(fmt("wheel: a callable was destroyed %d times (want 1)", o.s->destroyed.load()));
      if (o.h.valid() && o.h.cancel()) errs.add("wheel: cancel() returned true after wheel and pool are gone");
    }
  if (in_stop != static_cast<int>(stopped.size()))
    errs.add(fmt("wheel: stop() returned %zu timeouts, %d handles are cancelled without a winning cancel()",
                 stopped.size(), in_stop));
  return true;
}

// Wheel waits whose handlers run on an asio strand over the pool, cancelled through
// their slots (emitted on the strand at once, later from a pool timer, or never), and
// the wheel destroyed while waits are pending, falling due and being cancelled:
// every launched wait's handler runs exactly once, is destroyed exactly once, and
// nothing touches the destroyed wheel (the sanitizer builds watch). Launches call into
// the wheel, so they all return before it is destroyed; emissions may come after.
bool wheel_wait_round(std::uint64_t seed, errors& errs, int n) {
  std::mt19937_64 rng(seed);
  struct st_t {
    delay_batch batch;
    std::unique_ptr<scheduled_thread_pool> pool;
    std::unique_ptr<metronome::wheel_timer> wheel;
  };
  auto sp = std::make_shared<st_t>();
  sp->pool = std::make_unique<scheduled_thread_pool>(2);
  sp->wheel = std::make_unique<metronome::wheel_timer>(*sp->pool);
  {
    auto hex = net::make_strand(sp->pool->get_executor());
    metronome::wheel_timer* wheel = sp->wheel.get();
    auto start = [wheel](std::chrono::microseconds d, auto&& token) {
      wheel->async_wait(d, std::forward<decltype(token)>(token));
    };
    launch_batch(sp->batch, *sp->pool, hex, start, rng, n);
    auto& b = sp->batch;
    const auto limit = std::chrono::steady_clock::now() + 20s;
    while (b.launches_run.load() < n && std::chrono::steady_clock::now() < limit) std::this_thread::yield();
    if (b.launches_run.load() < n) {
      errs.add(fmt("only %d of %d wheel wait launches ran on the strand within 20 s", b.launches_run.load(), n));
      metronome::test::leak(sp);
      return false;
    }
    // Destroy the wheel at a random point of the firing: after 0..n handlers ran.
    const int threshold = static_cast<int>(rng() % (n + 1));
    while (b.done.value() < threshold && std::chrono::steady_clock::now() < limit) std::this_thread::yield();
    if (!finishes_within(20s, [sp] { sp->wheel.reset(); })) {
      errs.add("~wheel_timer() with wheel waits pending did not return within 20 s (hang)");
      metronome::test::leak(sp);
      return false;
    }
    if (!b.done.wait_for_at_least(n))
      errs.add(fmt("after the wheel was destroyed, only %d of %d wait handlers ran within 20 s", b.done.value(), n));
    // The emission timers post to the strand: let them finish.
    if (!finishes_within(20s, [sp] {
          sp->pool->shutdown();
          sp->pool->join();
        })) {
      errs.add("join() after the wheel's destruction did not return within 20 s (hang)");
      metronome::test::leak(sp);
      return false;
    }
    check_delay_batch(b, errs, true); // a destroyed wheel aborts waits nobody cancelled
  }
  sp->pool.reset();
  check_delay_lifetimes(sp->batch, errs);
  return true;
}

// The pool's shutdown() at a random launch, with wheel waits on a strand over the pool
// pending, falling due and being cancelled: shutdown() aborts the wheel's waits (and
// refuses later ones), so every launched wait's handler runs exactly once, is destroyed
// exactly once, and join() returns. Launches and emissions posted from outside after
// shutdown() may be dropped (they then never launch).
bool wheel_wait_shutdown_round(std::uint64_t seed, errors& errs, int n) {
  std::mt19937_64 rng(seed);
  struct st_t {
    delay_batch batch;
    std::unique_ptr<scheduled_thread_pool> pool;
    std::unique_ptr<metronome::wheel_timer> wheel;
  };
  auto sp = std::make_shared<st_t>();
  metronome::pool_options o;
  o.threads = 2;
  o.exception_handler = [](std::exception_ptr) {}; // dropped outside work is reported here
  sp->pool = std::make_unique<scheduled_thread_pool>(o);
  sp->wheel = std::make_unique<metronome::wheel_timer>(*sp->pool);
  {
    auto hex = net::make_strand(sp->pool->get_executor());
    metronome::wheel_timer* wheel = sp->wheel.get();
    auto start = [wheel](std::chrono::microseconds d, auto&& token) {
      wheel->async_wait(d, std::forward<decltype(token)>(token));
    };
    launch_batch(sp->batch, *sp->pool, hex, start, rng, n, static_cast<int>(rng() % n));
    if (!finishes_within(20s, [sp] { sp->pool->join(); })) {
      errs.add("join() after shutdown() with wheel waits pending did not return within 20 s (hang)");
      metronome::test::leak(sp);
      return false;
    }
    check_delay_batch(sp->batch, errs, true);
  }
  sp->wheel.reset();
  sp->pool.reset();
  check_delay_lifetimes(sp->batch, errs);
  return true;
}

// The wheel's only timeout cancelled while another thread schedules one due after it,
// the two started together with a random offset of a few hundred nanoseconds: the later
// timeout fires every time, and each of the two ran or was cancelled exactly once. (The cancel takes the last timeout and withdraws the tick;
// the producer, finding the mutex taken, pushes onto the inbox and reads the tick's old
// deadline: the cancel must look at the inbox after it stops the tick. The stop-here
// test is `a_timeout_pushed_while_a_cancel_withdraws_the_tick_fires`.)
bool wheel_last_cancel_round(std::uint64_t seed, errors& errs, int n) {
  std::mt19937_64 rng(seed);
  scheduled_thread_pool pool(1);
  metronome::wheel_options opts;
  opts.tick = 100us;
  metronome::wheel_timer wheel(pool, opts);
  struct runs {
    std::atomic<int> first{0}, later{0};
  };
  for (int i = 0; i < n; ++i) {
    auto count = std::make_shared<runs>(); // outlives a round that gives up
    auto first = wheel.schedule([count] { count->first.fetch_add(1); }, 2ms);
    std::atomic<int> ready{0};
    bool rejected = false;
    const unsigned producer_spin = static_cast<unsigned>(rng() % 400);
    const unsigned canceller_spin = static_cast<unsigned>(rng() % 400);
    auto spin = [](unsigned k) { // a few hundred ns at most, not optimised away
      std::atomic<unsigned> j{0};
      while (j.load(std::memory_order_relaxed) < k) j.store(j.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    };
    std::thread producer([&] {
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      spin(producer_spin);
      try {
        wheel.schedule([count] { count->later.fetch_add(1); }, 3ms);
      } catch (const std::exception& e) {
        errs.add(fmt("wheel schedule threw %s", e.what()));
        rejected = true;
      }
    });
    ready.fetch_add(1);
    while (ready.load() < 2) {
    }
    spin(canceller_spin);
    const int cancelled = first.cancel() ? 1 : 0;
    producer.join();
    // Accounting: each of the two ran, was cancelled or was rejected, exactly once.
    const int later_wanted = rejected ? 0 : 1;
    if (!metronome::test::poll_until(
            [&] { return count->first.load() + cancelled == 1 && count->later.load() == later_wanted; }, 10s)) {
      errs.add(fmt("wheel: the cancelled one ran %d (cancel() won %d), the one scheduled against it ran %d (want %d)",
                   count->first.load(), cancelled, count->later.load(), later_wanted));
      return true;
    }
  }
  if (!metronome::test::poll_until([&] { return wheel.pending() == 0; }, 10s))
    errs.add(fmt("wheel: %zu timeouts still pending after every one fired or was cancelled", wheel.pending()));
  return true;
}

} // namespace

BOOST_AUTO_TEST_SUITE(stress_suite)

// ---- wheel_timer

BOOST_AUTO_TEST_CASE(wheel_stop_races_schedule_and_cancel) {
  run_rounds("wheel stop() race", 9, budget(ms(3000, 4000), 3, 100000),
             [](std::uint64_t seed, errors& errs) { return wheel_round(seed, errs, scaled(1000, 200)); });
}

BOOST_AUTO_TEST_CASE(the_wheel_s_last_timeout_cancelled_while_another_is_scheduled_leaves_it_to_fire) {
  run_rounds("wheel: the last timeout cancelled against a schedule", 16, budget(ms(2000, 3000), 2, 100000),
             [](std::uint64_t seed, errors& errs) { return wheel_last_cancel_round(seed, errs, scaled(200, 50)); });
}

BOOST_AUTO_TEST_CASE(wheel_waits_on_a_strand_race_cancellation_and_the_wheels_destruction) {
  run_rounds("wheel waits on a strand vs cancellation and ~wheel_timer", 14, budget(ms(3000, 4000), 3, 100000),
             [](std::uint64_t seed, errors& errs) { return wheel_wait_round(seed, errs, scaled(300, 60)); });
}


BOOST_AUTO_TEST_CASE(wheel_waits_on_a_strand_race_the_pool_s_shutdown) {
  run_rounds("wheel waits on a strand vs the pool's shutdown()", 15, budget(ms(2000, 3000), 2, 100000),
             [](std::uint64_t seed, errors& errs) { return wheel_wait_shutdown_round(seed, errs, scaled(300, 60)); });
}

BOOST_AUTO_TEST_SUITE_END()
