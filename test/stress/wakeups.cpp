// Stress, delayed work and the pool's wake-ups: delayed tasks submitted to an idle or
// busy pool (from outside and from its own threads, with random cancels) are never left
// waiting long after their due time - a lost wake-up would leave a task pending with
// nothing to wake a worker. Bounded in time like every stress case; seeds as in
// common/stress_rounds.hpp.

#include "common/stress_rounds.hpp"

#include <metronome/manual_clock.hpp>

#include <functional>
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

// The race of the two cases below: rounds of a few hundred delayed tasks on a one-thread
// pool at random due times (`due_after`, from `now` at submission), which two threads
// cancel or reset (to 0..`reset_max` on) at random while they fall due - by the real
// clock, or by `drive`, run on a thread of its own, and `flush` once it is done. Each
// runs once or is cancelled (cancel() true), never both; none runs before its due time on
// the pool's clock; and the tasks that kept their key and were queued with it (due after
// the last submission) run in (due, submission) order.
struct cancel_race {
  metronome::manual_clock* clock = nullptr; // null: the real clock
  std::function<std::chrono::microseconds(std::mt19937_64&)> due_after;
  std::chrono::microseconds reset_max{};
  std::function<void(metronome::clock::time_point base, std::uint64_t seed)> drive; // empty: the real clock drives
  std::function<void()> flush;
  bool sleepy = true; // the meddlers sleep now and then (they yield on a manual clock)
};

void race_cancels(const cancel_race& c, errors& errs, std::uint64_t seed, int& rounds) {
  using mclock = metronome::clock;
  std::mt19937_64 rng(seed);
  pool_options o;
  o.threads = 1;
  o.time_source = c.clock;
  scheduled_thread_pool pool(o);
  budget b(std::chrono::milliseconds(scaled(3000, 4000)), 5, 3000);
  const auto now = [&c] { return c.clock ? c.clock->now() : mclock::now(); };
  const auto ns_of = [](mclock::time_point t) { return static_cast<long long>(t.time_since_epoch().count()); };
  struct item {
    scheduled_future<void> h;
    long long due = 0;           // the pool's clock, ns
    long long not_before = 0;    // after a reset: its new due time is at least this
    std::atomic<int> runs{0};
    std::atomic<long long> started{0};
    bool cancelled = false, reset = false;
  };
  while (b.next()) {
    const int n = 200 + static_cast<int>(rng() % 400);
    std::vector<item> items(static_cast<std::size_t>(n));
    std::vector<int> order; // appended by the pool's one thread only
    order.reserve(static_cast<std::size_t>(n));
    const auto base = now();
    for (int i = 0; i < n; ++i) {
      const auto due = base + c.due_after(rng);
      item& it = items[static_cast<std::size_t>(i)];
      it.due = it.not_before = ns_of(due);
      it.h = pool.schedule_at(
          [&it, &order, &now, &ns_of, i] {
            it.started.store(ns_of(now()));
            it.runs.fetch_add(1);
            order.push_back(i);
          },
          due);
    }
    const long long submitted = ns_of(now());
    std::thread driver;
    if (c.drive) driver = std::thread(c.drive, base, rng());
    // Two threads on disjoint halves (even, odd) cancel or reset at random.
    auto meddle = [&](int parity, std::uint64_t s) {
      std::mt19937_64 r(s);
      for (int k = 0; k < n; ++k) {
        const int i = static_cast<int>(r() % static_cast<std::uint64_t>((n + 1 - parity) / 2)) * 2 + parity;
        if (i >= n) continue;
        item& it = items[static_cast<std::size_t>(i)];
        if (it.cancelled) continue;
        if (r() % 3 == 0) {
          const auto d = std::chrono::microseconds(r() % static_cast<std::uint64_t>(c.reset_max.count()));
          const long long before = ns_of(now() + d); // the pool's time at the reset is not earlier
          if (it.h.reset(d)) {
            it.reset = true;
            it.not_before = before;
          }
        } else if (r() % 2 == 0) {
          it.cancelled = it.h.cancel();
        }
        if (c.sleepy && r() % 8 == 0)
          std::this_thread::sleep_for(std::chrono::microseconds(r() % 300));
        else if (!c.sleepy && r() % 16 == 0)
          std::this_thread::yield();
      }
    };
    std::thread other(meddle, 1, rng());
    meddle(0, rng());
    other.join();
    if (driver.joinable()) driver.join();
    if (c.flush) c.flush();
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

// Near tasks: 0-40 ms ahead on the real clock, out of order, so they sit in the delay
// queue's buckets and near heap, not its run; resets to 0-20 ms.
// (Written for a timing-wheel delay queue that was measured and not kept - see the
// "Delay queue" card in docs/design.md - and kept as the delay queue's stress test.)
void delayed_tasks_race_cancels(errors& errs, std::uint64_t seed, int& rounds) {
  cancel_race c;
  c.due_after = [](std::mt19937_64& r) { return std::chrono::microseconds(r() % 40000); };
  c.reset_max = std::chrono::microseconds(20000);
  race_cancels(c, errs, seed, rounds);
}

// Far tasks: 1.1-1.6 s ahead, past the delay queue's window of about a second, so they
// wait in its beyond heap, on a manual clock that one thread advances in random steps of
// 1-40 ms: the window follows the time, and each task moves into a bucket and then the
// near heap (docs/design.md, "Delay queue") while the cancels and resets (to 0-600 ms)
// take it out of whichever part holds it then.
void far_tasks_race_cancels(errors& errs, std::uint64_t seed, int& rounds) {
  using namespace std::chrono_literals;
  metronome::manual_clock clock;
  cancel_race c;
  c.clock = &clock;
  c.due_after = [](std::mt19937_64& r) { return 1100ms + std::chrono::microseconds(r() % 500000); };
  c.reset_max = 600ms;
  c.drive = [&clock](metronome::clock::time_point base, std::uint64_t s) {
    std::mt19937_64 r(s);
    while (clock.now() < base + 1600ms) clock.advance(std::chrono::milliseconds(1 + r() % 40));
  };
  c.flush = [&clock] { clock.advance(700ms); }; // past every reset's due time
  c.sleepy = false;
  race_cancels(c, errs, seed, rounds);
}

// Runs one of the races above with the run's seed and reports its findings.
void report_race(const char* what, void (*race)(errors&, std::uint64_t, int&)) {
  errors errs;
  int rounds = 0;
  race(errs, run_seed, rounds);
  findings f;
  f.take(errs, fmt("seed %llu", static_cast<unsigned long long>(run_seed)));
  f.report(what, rounds + 1);
  BOOST_TEST_MESSAGE(what << ": " << rounds << " rounds, seed " << run_seed);
}

} // namespace

BOOST_AUTO_TEST_SUITE(stress_suite)

BOOST_AUTO_TEST_CASE(far_tasks_move_into_the_heap_while_other_threads_cancel_them) {
  report_race("far tasks against cancels", far_tasks_race_cancels);
}

BOOST_AUTO_TEST_CASE(delayed_tasks_race_cancels_and_resets_and_run_in_due_order) {
  report_race("delayed tasks against cancels", delayed_tasks_race_cancels);
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
