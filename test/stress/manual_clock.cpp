// Stress, the manual clock: producers outside the pool submit delayed tasks, async_delay
// waits (handlers on a strand over the pool, cancelled at random through their slots) and
// fixed-rate periodic tasks while time moves - advanced in small steps by a thread of its
// own, or jumping by itself (auto-advance) whenever every worker is idle - and in some
// rounds shutdown() comes at a random moment. Every submission is accounted for: each
// one-shot ran once, was cancelled or was rejected (ran + cancelled + rejected =
// submitted); each wait's handler ran once; each periodic task ended cancelled; nothing
// ran before its due time on the clock; every callable was destroyed once. On the
// stepped clock, work due at or before the clock's time must run without another advance
// (nothing else moves time): a push that an advance overtook, left in the heap, is a lost
// wake-up (docs/design.md, "A push racing an advance"). Half the rounds that shut down
// call shutdown_now() instead, and destroy the tasks it returns unrun: a one-shot so
// dropped counts as its one outcome (its handle reads cancelled), and no more of them than
// were returned. Bounded in time like every stress case; seeds as in
// common/stress_rounds.hpp.
//
// A second case stresses how an advance tells the pools and wheels on the clock
// (docs/design.md, "Telling the listeners"): two threads advance at once while others
// build and destroy wheels on the clock and schedule on them and on a pool; some wheels
// fire onto an executor that refuses everything, so their timeouts are destroyed unrun
// inside an advance, and half of those advance the clock again from their destructor.

#include "common/latch_task.hpp"
#include "common/manual_pool.hpp"
#include "common/stress_rounds.hpp"

#include <metronome/detail/asio.hpp>
#include <metronome/manual_clock.hpp>
#include <metronome/wheel_timer.hpp>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

namespace {

using metronome::manual_clock;
using tp = metronome::clock::time_point;

enum class kind { one_shot, wait, periodic };

// One submission. Its outcome fields are atomic: a worker, the strand, the producer and
// the driver all look at them.
struct item {
  kind k = kind::one_shot;
  tp due{};                           // the one-shot's or wait's due time, the periodic's first
  std::chrono::microseconds period{}; // periodic only
  scheduled_future<void> h;           // one-shot and periodic (the producer's only)
  net::cancellation_signal sig;       // wait only; emitted on the strand
  slot s;                             // runs and destructions of the callable or handler
  std::atomic<bool> cancelled{false}; // cancel() returned true (one-shot, periodic)
  std::atomic<bool> rejected{false};  // the submission threw rejected_execution
  std::atomic<bool> completed{false}; // the wait's handler ran
  std::atomic<int> handler_calls{0};  // the wait's
  std::atomic<bool> aborted{false};   // the wait completed with operation_aborted
  std::atomic<int> early{0};          // runs before their due time on the clock
  std::atomic<bool> emitted{false};   // the emission ran (on the strand)

  // A wait initiated from outside once the pool has terminated completes aborted through
  // its strand over that pool, whose invoker the terminated pool refuses: its handler is
  // destroyed unrun, as a handler of a stopped io_context is (docs/semantics.md).
  const std::atomic<bool>* terminated = nullptr;
  bool dropped_ok() const { return terminated->load(); }

  bool settled() const {
    switch (k) {
    case kind::one_shot: // a cancel by shutdown_now()'s dropped task reads cancelled too
      return s.runs.load() > 0 || cancelled.load() || rejected.load() || h.is_cancelled();
    case kind::wait:
      return completed.load() || rejected.load() || dropped_ok();
    case kind::periodic:
      return true; // settled when the producer cancels it (checked at the end)
    }
    return true;
  }
};

struct round_state {
  manual_clock clock;
  std::mutex m;                             // guards `items` (the vector, not the items)
  std::vector<std::unique_ptr<item>> items; // outlive the pool: callables hold their slots
  std::unique_ptr<scheduled_thread_pool> pool;
  std::atomic<int> producers_left{0};
  std::atomic<bool> shut{false};
  std::atomic<bool> terminated{false}; // the pool had terminated when a check looked
  int returned_one_shots = -1;         // handed back by shutdown_now() (-1: not called)

  item* add(std::unique_ptr<item> it) {
    std::lock_guard lk(m);
    items.push_back(std::move(it));
    return items.back().get();
  }
  std::vector<item*> snapshot() {
    std::lock_guard lk(m);
    std::vector<item*> v;
    v.reserve(items.size());
    for (auto& i : items) v.push_back(i.get());
    return v;
  }
};

// One producer: `n` submissions of random kinds due 0-20 ms ahead of the clock, each
// registered once its submission has returned; a quarter of them cancelled right away
// (waits: an emission posted to their strand), and its periodic tasks cancelled at the end.
void produce(round_state& st, net::strand<scheduled_thread_pool::executor_type> strand, std::uint64_t seed, int n) {
  std::mt19937_64 r(seed);
  std::vector<item*> periodic;
  manual_clock& clock = st.clock;
  for (int i = 0; i < n; ++i) {
    auto owned = std::make_unique<item>();
    item* it = owned.get();
    it->terminated = &st.terminated;
    const auto d = std::chrono::microseconds(r() % 20001);
    it->due = clock.now() + d;
    const unsigned pick = r() % 10;
    it->k = pick < 5 ? kind::one_shot : pick < 9 ? kind::wait : kind::periodic;
    try {
      switch (it->k) {
      case kind::one_shot:
        it->h = st.pool->schedule_at(
            [l = life(&it->s), it, &clock] {
              if (clock.now() < it->due) it->early.fetch_add(1);
              count_run(&it->s);
            },
            it->due);
        break;
      case kind::wait:
        metronome::async_delay_until(
            st.pool->get_executor(), it->due,
            net::bind_cancellation_slot(it->sig.slot(),
                                        net::bind_executor(strand, [l = life(&it->s), it, &clock](error_code ec) {
                                          if (!ec && clock.now() < it->due) it->early.fetch_add(1);
                                          it->aborted.store(ec == net::error::operation_aborted);
                                          it->handler_calls.fetch_add(1);
                                          it->completed.store(true);
                                        })));
        break;
      case kind::periodic:
        it->period = std::chrono::microseconds(500 + r() % 4500);
        it->h = st.pool->schedule_at_fixed_rate(
            [l = life(&it->s), it, &clock] {
              // Run k (counted from 0) is due at first + k * period: never earlier.
              const int k = count_run(&it->s) - 1;
              if (clock.now() < it->due + k * it->period) it->early.fetch_add(1);
            },
            d, it->period);
        break;
      }
    } catch (const rejected_execution&) {
      it->rejected.store(true);
    }
    st.add(std::move(owned));
    if (it->k == kind::periodic && !it->rejected.load()) periodic.push_back(it);
    if (r() % 4 == 0 && !it->rejected.load()) {
      if (it->k == kind::wait) {
        net::post(strand, [it] {
          it->emitted.store(true);
          it->sig.emit(net::cancellation_type::terminal);
        });
      } else if (it->k == kind::one_shot && it->h.cancel()) {
        it->cancelled.store(true);
      }
    }
    if (r() % 8 == 0) std::this_thread::yield();
  }
  for (item* it : periodic)
    if (it->h.cancel()) it->cancelled.store(true);
  st.producers_left.fetch_sub(1);
}

// shutdown(), or shutdown_now() with every task it returns destroyed unrun (which cancels
// a one-shot's handle; whatever each callable holds goes with it).
void shut(round_state& st, bool now) {
  if (st.shut.exchange(true)) return;
  if (!now) {
    st.pool->shutdown();
    return;
  }
  auto returned = st.pool->shutdown_now();
  int one_shots = 0;
  for (auto& t : returned) one_shots += t.has_handle() && !t.is_periodic();
  returned.clear();
  st.returned_one_shots = one_shots;
}

void note_termination(round_state& st) {
  if (st.shut.load() && st.pool->is_terminated()) st.terminated.store(true);
}

std::string describe(const item& it) {
  if (it.k == kind::wait) return fmt("emitted %d, handler calls %d", int(it.emitted.load()), it.handler_calls.load());
  return fmt("future done %d, cancelled %d, runs %d", int(it.h.is_done()), int(it.h.is_cancelled()), it.s.runs.load());
}

// Waits (real time) until every registered item due at or before the clock's time has
// settled, with no advance meanwhile; false (and an error) when one has not within `limit`.
bool due_work_settles(round_state& st, errors& errs, std::chrono::milliseconds limit, const char* when) {
  const tp now = st.clock.now();
  const auto end = std::chrono::steady_clock::now() + limit;
  for (item* it : st.snapshot()) {
    if (it->due > now || it->k == kind::periodic) continue;
    while (!it->settled() && std::chrono::steady_clock::now() < end) {
      note_termination(st);
      std::this_thread::yield();
    }
    if (!it->settled()) {
      auto s = st.pool->stats();
      errs.add(fmt("%s: a %s due %lld us before the clock's time had not run after %lld ms with no advance "
                   "(stats: threads=%zu active=%zu ready=%zu delayed=%zu; %s; shut down %d): lost wake-up",
                   when, it->k == kind::one_shot ? "delayed task" : "wait",
                   static_cast<long long>(std::chrono::duration_cast<std::chrono::microseconds>(now - it->due).count()),
                   static_cast<long long>(limit.count()), s.threads, s.active, s.ready_queued, s.delayed_queued,
                   describe(*it).c_str(), int(st.shut.load())));
      return false;
    }
  }
  return true;
}

// Checks the whole account once the pool is gone.
void check_items(round_state& st, errors& errs) {
  int one_shots = 0, ran = 0, cancelled = 0, rejected = 0, dropped = 0, waits = 0, completed = 0, periodic = 0;
  for (auto& p : st.items) {
    item& it = *p;
    if (it.early.load() != 0)
      errs.add(fmt("a %s ran %d time(s) before its due time on the clock",
                   it.k == kind::one_shot ? "delayed task"
                   : it.k == kind::wait   ? "wait's handler"
                                          : "periodic task",
                   it.early.load()));
    if (it.s.destroyed.load() != 1)
      errs.add(fmt("a callable or handler was destroyed %d times (want 1)", it.s.destroyed.load()));
    switch (it.k) {
    case kind::one_shot: {
      ++one_shots;
      const int r = it.s.runs.load();
      // Cancelled, but not by the producer: shutdown_now() handed it back, dropped unrun.
      const int d = it.h.is_cancelled() && !it.cancelled.load();
      ran += r;
      cancelled += it.cancelled.load();
      rejected += it.rejected.load();
      dropped += d;
      if (r + it.cancelled.load() + it.rejected.load() + d != 1)
        errs.add(fmt("a delayed task ran %d time(s), cancelled %d, rejected %d, dropped by shutdown_now %d: want "
                     "exactly one outcome",
                     r, int(it.cancelled.load()), int(it.rejected.load()), d));
      break;
    }
    case kind::wait:
      ++waits;
      completed += it.handler_calls.load();
      if (it.rejected.load())
        errs.add("async_delay_until threw rejected_execution: a wait completes with an error instead");
      else if (it.handler_calls.load() > 1 || (it.handler_calls.load() == 0 && !st.terminated.load()))
        errs.add(
            fmt("a wait's handler ran %d times (want 1, or 0 once the pool had terminated)", it.handler_calls.load()));
      else if (it.aborted.load() && !it.emitted && !st.shut.load())
        errs.add("a wait completed with operation_aborted, neither cancelled nor shut down");
      break;
    case kind::periodic:
      ++periodic;
      if (!it.rejected.load() && !it.h.is_cancelled())
        errs.add(fmt("a periodic task ended not cancelled after %d runs", it.s.runs.load()));
      break;
    }
  }
  if (ran + cancelled + rejected + dropped != one_shots)
    errs.add(fmt("delayed tasks: ran %d + cancelled %d + rejected %d + dropped %d != submitted %d", ran, cancelled,
                 rejected, dropped, one_shots));
  // A returned one-shot may still be cancelled by its producer before it is dropped: at most.
  if (dropped > std::max(st.returned_one_shots, 0))
    errs.add(fmt("%d delayed tasks ended cancelled by nobody, %d handed back by shutdown_now()", dropped,
                 st.returned_one_shots));
  if (completed > waits || (completed != waits && !st.terminated.load()))
    errs.add(fmt("waits: %d handlers ran for %d waits", completed, waits));
  (void)periodic;
}

// One round. `stepped`: a driver thread advances the clock 0-3 ms at a time and, after
// each step, checks that everything due has settled without another; otherwise the
// clock auto-advances. In one round of three, shutdown() comes after a random number
// of steps (or, auto-advancing, of submissions).
bool clock_round(std::uint64_t seed, errors& errs, bool stepped) {
  std::mt19937_64 rng(seed);
  auto sp = std::make_shared<round_state>(); // leaked when the library hangs
  round_state& st = *sp;
  if (!stepped) st.clock.set_auto_advance(true);
  pool_options o = metronome::test::on_clock(st.clock, 1 + rng() % 3);
  o.exception_handler = [](std::exception_ptr) {}; // a periodic run dropped at shutdown
  st.pool = std::make_unique<scheduled_thread_pool>(o);
  auto strand = std::make_optional(net::make_strand(st.pool->get_executor())); // let go before the pool
  const int producers = 2 + static_cast<int>(rng() % 2);
  const int per = scaled(150, 40);
  const bool shut_down = rng() % 3 == 0;
  const bool shut_now = shut_down && rng() % 2 == 0;
  const int shut_at = static_cast<int>(rng() % (per * producers));
  st.producers_left = producers;
  std::vector<std::thread> ts;
  for (int p = 0; p < producers; ++p)
    ts.emplace_back([&st, str = *strand, s = rng(), per] { produce(st, str, s, per); });

  bool ok = true;
  const auto limit = std::chrono::milliseconds(scaled(5000, 10000));
  if (stepped) {
    int steps = 0;
    while (ok && st.producers_left.load() > 0) {
      st.clock.advance(std::chrono::microseconds(rng() % 3001));
      ok = due_work_settles(st, errs, limit, "while producing");
      if (shut_down && ++steps == shut_at / 8 + 1) shut(st, shut_now);
    }
  } else {
    while (shut_down && st.producers_left.load() > 0 && static_cast<int>(st.snapshot().size()) < shut_at)
      std::this_thread::yield();
    if (shut_down) shut(st, shut_now);
  }
  for (auto& t : ts) t.join();
  if (ok && stepped) {
    ok = due_work_settles(st, errs, limit, "after the producers");
    st.clock.advance(std::chrono::milliseconds(25)); // past every one-shot and wait
    ok = ok && due_work_settles(st, errs, limit, "after the last advance");
  } else if (ok) {
    const auto end = std::chrono::steady_clock::now() + limit;
    for (item* it : st.snapshot())
      while (!it->settled() && std::chrono::steady_clock::now() < end) {
        note_termination(st);
        std::this_thread::yield();
      }
    for (item* it : st.snapshot())
      if (!it->settled()) {
        auto s = st.pool->stats();
        errs.add(fmt(
            "auto-advancing clock: a %s due %lld us %s the clock's time was still pending %lld ms after the "
            "producers finished (stats: threads=%zu active=%zu ready=%zu delayed=%zu; %s; shut down %d): lost wake-up",
            it->k == kind::one_shot ? "delayed task" : "wait",
            static_cast<long long>(std::chrono::duration_cast<std::chrono::microseconds>(
                                       st.clock.now() > it->due ? st.clock.now() - it->due : it->due - st.clock.now())
                                       .count()),
            st.clock.now() > it->due ? "before" : "after", static_cast<long long>(limit.count()), s.threads, s.active,
            s.ready_queued, s.delayed_queued, describe(*it).c_str(), int(st.shut.load())));
        ok = false;
        break;
      }
  }
  if (!ok) { // a hang: keep what the library may still touch
    metronome::test::leak(sp);
    return false;
  }
  // Every one-shot and wait has settled and every periodic task is cancelled: the pool
  // terminates once shut down (the clock still jumps or is advanced for nothing).
  st.pool->shutdown();
  if (!finishes_within(limit, [sp] { sp->pool->join(); })) {
    errs.add("join() after every submission settled did not return");
    metronome::test::leak(sp);
    return false;
  }
  strand.reset();
  st.pool.reset();
  check_items(st, errs);
  return true;
}

// A wheel timeout's or a pool task's callable: counts its run (never before `due` on the
// clock) and its destruction; a dropped one (destroyed unrun) may advance the clock - from
// inside an advance (a wheel over the refusing executor), or from a wheel's destructor.
struct timed_fn {
  slot* s;
  manual_clock* clock;
  tp due;
  std::atomic<int>* early;
  bool advance_when_dropped;
  bool armed = true;
  timed_fn(slot* s_, manual_clock* c, tp d, std::atomic<int>* e, bool adv)
      : s(s_), clock(c), due(d), early(e), advance_when_dropped(adv) {}
  timed_fn(timed_fn&& o) noexcept
      : s(o.s), clock(o.clock), due(o.due), early(o.early), advance_when_dropped(o.advance_when_dropped) {
    o.armed = false;
  }
  timed_fn& operator=(timed_fn&&) = delete;
  ~timed_fn() {
    if (!armed) return;
    s->destroyed.fetch_add(1);
    if (advance_when_dropped && s->runs.load() == 0) clock->advance(std::chrono::microseconds(50));
  }
  void operator()() {
    if (clock->now() < due) early->fetch_add(1);
    count_run(s);
  }
};

struct telling_state {
  manual_clock clock;
  scheduled_thread_pool refusing{1}; // shut down: its executor drops what it is given
  std::unique_ptr<scheduled_thread_pool> pool;
  std::mutex m; // guards `slots` (the vector)
  std::vector<std::unique_ptr<slot>> slots;
  std::atomic<int> early{0};
  std::atomic<bool> stop{false};
  slot* add() {
    std::lock_guard lk(m);
    slots.push_back(std::make_unique<slot>());
    return slots.back().get();
  }
};

bool telling_round(std::uint64_t seed, errors& errs) {
  std::mt19937_64 rng(seed);
  auto sp = std::make_shared<telling_state>(); // leaked when the library hangs
  telling_state& st = *sp;
  st.refusing.shutdown();
  st.pool = std::make_unique<scheduled_thread_pool>(metronome::test::on_clock(st.clock, 1 + rng() % 2));
  const int wheels_per_churner = scaled(40, 10);
  std::atomic<int> churners_left{2};
  auto churn = [&st, &churners_left, wheels_per_churner](std::uint64_t s) {
    std::mt19937_64 r(s);
    for (int w = 0; w < wheels_per_churner; ++w) {
      metronome::wheel_options o;
      o.time_source = &st.clock;
      const bool refused = w % 3 == 0; // a third of the wheels, in every round
      // Another third over a pool of their own on the clock, stopped and then the pool
      // destroyed while the advancing threads hand its due timeouts over ("Hand-over and
      // the wheel's lifetime": stop() waits for them; a stopped wheel touches its pool no
      // more - the sanitizer builds watch).
      const bool own_pool = w % 3 == 1;
      std::unique_ptr<scheduled_thread_pool> own;
      if (own_pool) own = std::make_unique<scheduled_thread_pool>(metronome::test::on_clock(st.clock, 1));
      auto wheel = refused    ? std::make_unique<metronome::wheel_timer>(
                                 net::any_io_executor(st.refusing.get_executor()), o)
                   : own_pool ? std::make_unique<metronome::wheel_timer>(*own, o)
                              : std::make_unique<metronome::wheel_timer>(*st.pool, o);
      const int n = 1 + static_cast<int>(r() % 8);
      for (int k = 0; k < n; ++k) {
        const auto delay = std::chrono::microseconds(r() % 4000);
        const tp due = st.clock.now() + delay;
        wheel->schedule(timed_fn(st.add(), &st.clock, due, &st.early, r() % 2 == 0), delay);
        if (k == 0 || r() % 2 == 0) { // at least one pool task per wheel: every round runs some
          const tp pool_due = st.clock.now() + delay;
          st.pool->schedule(timed_fn(st.add(), &st.clock, pool_due, &st.early, false), delay);
        }
      }
      for (int y = static_cast<int>(r() % 200); y > 0; --y) std::this_thread::yield();
      if (own_pool) {
        (void)wheel->stop(); // what it returns is cancelled: destroyed unrun here (some advance the clock)
        own.reset();         // runs or drops what was handed over; the wheel is still alive
      }
      wheel.reset(); // its timeouts not yet handed over are destroyed unrun (some advance the clock)
    }
    churners_left.fetch_sub(1);
  };
  auto advance = [&st](std::uint64_t s) {
    std::mt19937_64 r(s);
    while (!st.stop.load()) st.clock.advance(std::chrono::microseconds(r() % 500));
  };
  std::vector<std::thread> ts;
  const auto limit = std::chrono::milliseconds(scaled(10000, 20000));
  const bool ended = finishes_within(limit, [&] {
    ts.emplace_back(churn, rng());
    ts.emplace_back(churn, rng());
    ts.emplace_back(advance, rng());
    ts.emplace_back(advance, rng());
    ts[0].join();
    ts[1].join();
    st.stop = true;
    ts[2].join();
    ts[3].join();
    st.clock.advance(std::chrono::milliseconds(10)); // past every pool task
    st.clock.wait_idle();
  });
  if (!ended) {
    errs.add(fmt("wheels and pools against two advancing threads: not done within %lld ms (churners left %d)",
                 static_cast<long long>(limit.count()), churners_left.load()));
    for (auto& t : ts)
      if (t.joinable()) t.detach();
    metronome::test::leak(sp);
    return false;
  }
  st.pool.reset();
  if (st.early.load() != 0) errs.add(fmt("%d runs before their due time on the clock", st.early.load()));
  int runs = 0, dropped = 0;
  for (auto& sl : st.slots) {
    if (sl->runs.load() > 1 || sl->destroyed.load() != 1)
      errs.add(fmt("a callable ran %d times and was destroyed %d times", sl->runs.load(), sl->destroyed.load()));
    (sl->runs.load() == 1 ? runs : dropped) += 1;
  }
  if (runs == 0 || dropped == 0) errs.add(fmt("a round with %d runs and %d dropped: nothing raced", runs, dropped));
  return true;
}

} // namespace

BOOST_AUTO_TEST_SUITE(stress_suite)

BOOST_AUTO_TEST_CASE(outside_producers_against_a_stepped_manual_clock_lose_nothing) {
  run_rounds("stepped manual clock", 1, budget(ms(3000, 4000), 3, 100000),
             [](std::uint64_t seed, errors& errs) { return clock_round(seed, errs, true); });
}

BOOST_AUTO_TEST_CASE(outside_producers_against_an_auto_advancing_clock_lose_nothing) {
  run_rounds("auto-advancing manual clock", 2, budget(ms(3000, 4000), 3, 100000),
             [](std::uint64_t seed, errors& errs) { return clock_round(seed, errs, false); });
}

// The telling's hand-overs (docs/design.md, "Telling the listeners") under load, and a
// wheel stopped and its pool destroyed while an advance hands its timeouts over ("Hand-over
// and the wheel's lifetime"): every callable runs at most once, never early, and is
// destroyed once; no advance deadlocks; nothing touches a destroyed pool.
BOOST_AUTO_TEST_CASE(wheels_made_and_destroyed_while_two_threads_advance_the_clock_lose_nothing) {
  run_rounds("wheels against two advancing threads", 3, budget(ms(3000, 4000), 3, 100000),
             [](std::uint64_t seed, errors& errs) { return telling_round(seed, errs); });
}

BOOST_AUTO_TEST_SUITE_END()
