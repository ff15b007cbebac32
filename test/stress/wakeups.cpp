// Stress, delayed work and the pool's wake-ups: delayed tasks submitted to an idle or
// busy pool (from outside and from its own threads, with random cancels) are never left
// waiting long after their due time - a lost wake-up would leave a task pending with
// nothing to wake a worker. Bounded in time like every stress case; seeds as in
// common/stress_rounds.hpp.

#include "common/manual_pool.hpp"
#include "common/stress_rounds.hpp"

#include <random>
#include <thread>
#include <vector>

namespace {

// Rounds of delayed tasks (0-5 ms) from 1-3 threads onto a pool that is often idle
// (every worker parked) when they arrive, plus tasks that schedule a follow-up from a
// pool thread and random cancels. A lost wake-up leaves a task pending long after its
// due time with nothing else to wake a worker: each must be done within a generous
// slack of real time.
void delayed_wakeups(errors& errs, std::uint64_t seed, int& rounds, long long& worst_late_us) {
  std::mt19937_64 rng(seed);
  auto pool = std::make_unique<scheduled_thread_pool>(2 + rng() % 2);
  const auto slack = std::chrono::milliseconds(scaled(2000, 5000));
  budget b(std::chrono::milliseconds(scaled(3000, 4000)), 5, 3000);
  struct item {
    scheduled_future<void> h;
    long long due_ns = 0;
    bool cancelled = false;
  };
  while (b.next()) {
    const int threads = 1 + static_cast<int>(rng() % 3);
    const int per = 1 + static_cast<int>(rng() % 12);
    std::vector<std::vector<item>> items(threads);
    auto followups = std::make_shared<metronome::test::counter>();
    auto followups_scheduled = std::make_shared<std::atomic<int>>(0);
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t, s = rng()] {
        std::mt19937_64 r2(s);
        for (int i = 0; i < per; ++i) {
          item it;
          auto d = std::chrono::microseconds(r2() % 8 == 0 ? 0 : r2() % 5001);
          it.due_ns = real_ns() + std::chrono::nanoseconds(d).count();
          const bool follow = r2() % 4 == 0;
          auto fd = std::chrono::microseconds(r2() % 3001);
          scheduled_thread_pool* p = pool.get();
          it.h = p->schedule(
              [p, follow, fd, followups, followups_scheduled] {
                if (!follow) return;
                followups_scheduled->fetch_add(1);
                p->schedule([followups] { followups->add(); }, fd); // from a pool thread
              },
              d);
          items[t].push_back(std::move(it));
          if (r2() % 5 == 0) {
            auto& v = items[t][r2() % items[t].size()];
            if (v.h.cancel()) v.cancelled = true;
          }
          if (r2() % 3 == 0) std::this_thread::yield();
        }
      });
    }
    for (auto& t : ts) t.join();
    for (auto& v : items)
      for (auto& it : v) {
        if (it.cancelled) continue;
        const auto deadline = metronome::clock::time_point(std::chrono::nanoseconds(it.due_ns)) + slack;
        if (it.h.wait_until(deadline) != std::future_status::ready) {
          auto st = pool->stats();
          const bool eventually = it.h.wait_for(5s) == std::future_status::ready;
          errs.add(fmt("round %d: a task due %lld ms ago was still pending after %lld ms of slack (stats: "
                       "threads=%zu active=%zu ready=%zu delayed=%zu): %s",
                       b.rounds(), (real_ns() - it.due_ns) / 1000000, static_cast<long long>(slack.count()),
                       st.threads, st.active, st.ready_queued, st.delayed_queued,
                       eventually ? "it ran later (late wake-up)" : "it never ran within 5 s more (lost wake-up)"));
          return;
        }
        worst_late_us = std::max(worst_late_us, (real_ns() - it.due_ns) / 1000);
      }
    // Follow-ups were scheduled from pool threads at most 3 ms ahead.
    const int want = followups_scheduled->load();
    const auto limit = std::chrono::steady_clock::now() + 3ms + slack;
    while (followups->value() < want && std::chrono::steady_clock::now() < limit) std::this_thread::yield();
    if (followups->value() < want) {
      auto st = pool->stats();
      errs.add(fmt("round %d: %d of %d follow-ups (scheduled from pool threads, <= 3 ms ahead) still pending after "
                   "%lld ms of slack (stats: active=%zu ready=%zu delayed=%zu) (lost wake-up)",
                   b.rounds(), want - followups->value(), want, static_cast<long long>(slack.count()), st.active,
                   st.ready_queued, st.delayed_queued));
      return;
    }
    ++rounds;
    // Now and then let every worker park before the next round arrives.
    if (rng() % 2 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
  }
}

// A few hundred delayed tasks at random due times (0-40 ms ahead, out of order, so they
// sit in the delay queue's heap, not its run) while two threads cancel and reset them as
// they fall due. Each runs once or is cancelled (cancel() true), never both; none runs
// before its due time; and on a one-thread pool the tasks that kept their key and were
// queued with it (due after the last submission) run in (due, submission) order.
// (Written for a timing-wheel delay queue that was measured and not kept - see the
// "Delay queue" card in docs/design.md - and kept as the delay queue's stress test.)
void delayed_tasks_race_cancels(errors& errs, std::uint64_t seed, int& rounds) {
  std::mt19937_64 rng(seed);
  scheduled_thread_pool pool(1);
  budget b(std::chrono::milliseconds(scaled(3000, 4000)), 5, 3000);
  struct item {
    scheduled_future<void> h;
    long long due = 0;           // metronome::clock, ns
    long long not_before = 0;    // after a reset: its new due time is at least this
    std::atomic<int> runs{0};
    std::atomic<long long> started{0};
    bool cancelled = false, reset = false;
  };
  using mclock = metronome::clock;
  auto ns_of = [](mclock::time_point t) { return static_cast<long long>(t.time_since_epoch().count()); };
  while (b.next()) {
    const int n = 200 + static_cast<int>(rng() % 300);
    std::vector<item> items(static_cast<std::size_t>(n));
    std::vector<int> order; // appended by the pool's one thread only
    order.reserve(static_cast<std::size_t>(n));
    const auto base = mclock::now();
    for (int i = 0; i < n; ++i) {
      const auto due = base + std::chrono::microseconds(rng() % 40000);
      item& it = items[static_cast<std::size_t>(i)];
      it.due = it.not_before = ns_of(due);
      it.h = pool.schedule_at(
          [&it, &order, i, ns_of] {
            it.started.store(ns_of(mclock::now()));
            it.runs.fetch_add(1);
            order.push_back(i);
          },
          due);
    }
    const long long submitted = ns_of(mclock::now());
    // Two threads on disjoint halves (even, odd) cancel or reset at random while the
    // tasks fall due and run.
    auto meddle = [&](int parity, std::uint64_t s) {
      std::mt19937_64 r(s);
      for (int k = 0; k < n; ++k) {
        const int i = static_cast<int>(r() % static_cast<std::uint64_t>((n + 1 - parity) / 2)) * 2 + parity;
        if (i >= n) continue;
        item& it = items[static_cast<std::size_t>(i)];
        if (it.cancelled) continue;
        if (r() % 3 == 0) {
          const auto d = std::chrono::microseconds(r() % 20000);
          const long long before = ns_of(mclock::now()) + std::chrono::nanoseconds(d).count();
          if (it.h.reset(d)) {
            it.reset = true;
            it.not_before = before;
          }
        } else if (r() % 2 == 0) {
          it.cancelled = it.h.cancel();
        }
        if (r() % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(r() % 300));
      }
    };
    std::thread other(meddle, 1, rng());
    meddle(0, rng());
    other.join();
    for (int i = 0; i < n; ++i) {
      item& it = items[static_cast<std::size_t>(i)];
      if (it.cancelled) continue;
      if (it.h.wait_for(std::chrono::seconds(scaled(10, 30))) != std::future_status::ready) {
        errs.add(fmt("round %d: task %d (not cancelled) never ran", b.rounds(), i));
        pool.shutdown_now();
        return;
      }
    }
    // Every run is over (each handle is ready, and cancelled ones never start): the pool's
    // thread wrote `order` before it completed them.
    for (int i = 0; i < n; ++i) {
      const item& it = items[static_cast<std::size_t>(i)];
      const int runs = it.runs.load();
      if (runs != (it.cancelled ? 0 : 1))
        errs.add(fmt("round %d: task %d ran %d times (cancel() said %s)", b.rounds(), i, runs,
                     it.cancelled ? "true" : "false"));
      else if (runs == 1 && it.started.load() < it.not_before)
        errs.add(fmt("round %d: task %d ran %lld us early", b.rounds(), i, (it.not_before - it.started.load()) / 1000));
    }
    const item* prev = nullptr;
    int prev_i = -1;
    for (int i : order) {
      const item& it = items[static_cast<std::size_t>(i)];
      if (it.reset || it.due <= submitted) continue;
      if (prev && (it.due < prev->due || (it.due == prev->due && i < prev_i)))
        errs.add(fmt("round %d: task %d (due +%lld us) ran after task %d (due +%lld us)", b.rounds(), i,
                     (it.due - ns_of(base)) / 1000, prev_i, (prev->due - ns_of(base)) / 1000));
      prev = &it;
      prev_i = i;
    }
    ++rounds;
  }
}

// Far tasks (due 1.1-1.6 s on: past the delay queue's window of about a second, so they
// wait in its beyond heap) on a one-thread pool on a manual clock, which one thread
// advances in random steps of 1-40 ms: the window follows the time, and each task moves
// into a bucket and then the near heap (docs/design.md, "Delay queue") while two threads
// cancel or reset tasks at random - a cancel takes each out of whichever part holds it
// then. Each runs once or is cancelled, never before its due time on the clock, and the
// tasks that kept their key run in (due, submission) order.
void far_tasks_race_cancels(errors& errs, std::uint64_t seed, int& rounds) {
  using namespace std::chrono_literals;
  using mclock = metronome::clock;
  std::mt19937_64 rng(seed);
  metronome::manual_clock clock;
  scheduled_thread_pool pool(metronome::test::on_clock(clock, 1));
  budget b(std::chrono::milliseconds(scaled(3000, 4000)), 5, 3000);
  struct item {
    scheduled_future<void> h;
    mclock::time_point due{};
    mclock::time_point not_before{}; // after a reset: its new due time is at least this
    std::atomic<int> runs{0};
    std::atomic<mclock::rep> started{0};
    bool cancelled = false, reset = false;
  };
  while (b.next()) {
    const int n = 300 + static_cast<int>(rng() % 300);
    std::vector<item> items(static_cast<std::size_t>(n));
    std::vector<int> order; // appended by the pool's one thread only
    order.reserve(static_cast<std::size_t>(n));
    const auto base = clock.now();
    for (int i = 0; i < n; ++i) {
      item& it = items[static_cast<std::size_t>(i)];
      it.due = it.not_before = base + 1100ms + std::chrono::microseconds(rng() % 500000);
      it.h = pool.schedule_at(
          [&it, &order, &clock, i] {
            it.started.store(clock.now().time_since_epoch().count());
            it.runs.fetch_add(1);
            order.push_back(i);
          },
          it.due);
    }
    const auto last_due = base + 1600ms;
    std::thread mover([&clock, last_due, s = rng()] {
      std::mt19937_64 r(s);
      while (clock.now() < last_due) clock.advance(std::chrono::milliseconds(1 + r() % 40));
    });
    // Two threads on disjoint halves (even, odd), as in the test above.
    auto meddle = [&](int parity, std::uint64_t s) {
      std::mt19937_64 r(s);
      for (int k = 0; k < n; ++k) {
        const int i = static_cast<int>(r() % static_cast<std::uint64_t>((n + 1 - parity) / 2)) * 2 + parity;
        if (i >= n) continue;
        item& it = items[static_cast<std::size_t>(i)];
        if (it.cancelled) continue;
        if (r() % 3 == 0) {
          const auto d = std::chrono::milliseconds(r() % 600);
          const auto before = clock.now() + d; // the pool's time at the reset is not earlier
          if (it.h.reset(d)) {
            it.reset = true;
            it.not_before = before;
          }
        } else if (r() % 2 == 0) {
          it.cancelled = it.h.cancel();
        }
        if (r() % 16 == 0) std::this_thread::yield();
      }
    };
    std::thread other(meddle, 1, rng());
    meddle(0, rng());
    other.join();
    mover.join();
    clock.advance(700ms); // past every reset's due time
    for (int i = 0; i < n; ++i) {
      item& it = items[static_cast<std::size_t>(i)];
      if (it.cancelled) continue;
      if (it.h.wait_for(std::chrono::seconds(scaled(10, 30))) != std::future_status::ready) {
        errs.add(fmt("round %d: far task %d (not cancelled) never ran", b.rounds(), i));
        pool.shutdown_now();
        return;
      }
    }
    for (int i = 0; i < n; ++i) {
      const item& it = items[static_cast<std::size_t>(i)];
      const int runs = it.runs.load();
      if (runs != (it.cancelled ? 0 : 1))
        errs.add(fmt("round %d: far task %d ran %d times (cancel() said %s)", b.rounds(), i, runs,
                     it.cancelled ? "true" : "false"));
      else if (runs == 1 && it.started.load() < it.not_before.time_since_epoch().count())
        errs.add(fmt("round %d: far task %d ran %lld us early on the clock", b.rounds(), i,
                     static_cast<long long>((it.not_before.time_since_epoch().count() - it.started.load()) / 1000)));
    }
    const item* prev = nullptr;
    int prev_i = -1;
    for (int i : order) {
      const item& it = items[static_cast<std::size_t>(i)];
      if (it.reset) continue;
      if (prev && (it.due < prev->due || (it.due == prev->due && i < prev_i)))
        errs.add(fmt("round %d: far task %d ran after far task %d, due before it", b.rounds(), i, prev_i));
      prev = &it;
      prev_i = i;
    }
    ++rounds;
  }
}

} // namespace

BOOST_AUTO_TEST_SUITE(stress_suite)

BOOST_AUTO_TEST_CASE(far_tasks_move_into_the_heap_while_other_threads_cancel_them) {
  errors errs;
  int rounds = 0;
  far_tasks_race_cancels(errs, run_seed, rounds);
  findings f;
  f.take(errs, fmt("seed %llu", static_cast<unsigned long long>(run_seed)));
  f.report("far tasks against cancels", rounds + 1);
  BOOST_TEST_MESSAGE("far tasks against cancels: " << rounds << " rounds, seed " << run_seed);
}

BOOST_AUTO_TEST_CASE(delayed_tasks_race_cancels_and_resets_and_run_in_due_order) {
  errors errs;
  int rounds = 0;
  delayed_tasks_race_cancels(errs, run_seed, rounds);
  findings f;
  f.take(errs, fmt("seed %llu", static_cast<unsigned long long>(run_seed)));
  f.report("delayed tasks against cancels", rounds + 1);
  BOOST_TEST_MESSAGE("delayed tasks against cancels: " << rounds << " rounds, seed " << run_seed);
}

BOOST_AUTO_TEST_CASE(delayed_wakeups_are_not_lost) {
  errors errs;
  int rounds = 0;
  long long worst = 0;
  delayed_wakeups(errs, run_seed, rounds, worst);
  findings f;
  f.take(errs, fmt("seed %llu", static_cast<unsigned long long>(run_seed)));
  f.report("delayed wake-ups", rounds + 1);
  BOOST_TEST_MESSAGE("delayed wake-ups: " << rounds << " rounds, worst lateness " << worst << " us, seed " << run_seed);
}

// The pattern the test above hits at random, made likely: an idle pool, a delayed
// task cancelled while it may still wait in the submission inbox, then a later task.
// The later task must run (a few ms late at most); a stale "earliest due" left by the
// cancelled one must not stop its wake-up. The short sleeps only let the workers
// park (the condition under test); no result depends on them.
BOOST_AUTO_TEST_CASE(delayed_task_after_a_cancel_in_the_inbox_still_runs) {
  scheduled_thread_pool pool(2);
  int stuck = 0;
  const int n = scaled(60, 30);
  for (int i = 0; i < n && stuck == 0; ++i) {
    std::this_thread::sleep_for(3ms);
    auto a = pool.schedule([] {}, 1ms);
    a.cancel();
    if (i % 2) std::this_thread::sleep_for(300us);
    auto b = pool.schedule([] {}, 2ms);
    if (b.wait_for(2s) != std::future_status::ready) {
      ++stuck;
      auto st = pool.stats();
      BOOST_ERROR("iteration " << i << ": a task due 2 ms after submission has not run after 2 s (stats: active="
                               << st.active << " ready=" << st.ready_queued << " delayed=" << st.delayed_queued
                               << "): lost wake-up after cancelling a task still in the inbox");
      b.cancel();
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
