// Stress with accounting, an elastic pool (`pool_options::cached`): threads past the core
// start when work finds nobody idle and retire after `keep_alive` without work. Producers
// submit in bursts with gaps longer than `keep_alive` between them, so elastic threads
// retire while others start, and the hand-overs between a producer's wake-up and a
// retiring thread (pool_core.cpp `wake_one`, `grow`; docs/design.md "Worker loop") run at
// volume. Each round accounts for every task - run, cancelled, returned by
// shutdown_now() or rejected, exactly once - checks that the pool falls back to its core
// threads when idle, and that it grows to `max_threads` again for tasks that each wait
// for all the others to start (a pool that failed to grow would leave them waiting).
// Seeds as in common/stress_rounds.hpp.

#include "common/poll_until.hpp"
#include "common/stress_rounds.hpp"

#include METRONOME_NET_HEADER(post.hpp)

#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

namespace {

// Keeps a worker busy for `d` (load for the pool to grow under, not synchronisation).
void busy_for(std::chrono::microseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) {
  }
}

struct elastic_op {
  enum kind_t { post, submit, schedule } kind = post;
  slot s;
  scheduled_future<void> h;
  bool rejected = false; // submit / schedule threw rejected_execution
  bool submitted = true; // false: the round ended before this producer reached it
};

struct elastic_round_result {
  bool grew = false;         // the pool went past its core threads during the bursts
  std::size_t accounted = 0; // tasks whose fate the round checked
};

bool elastic_round(std::uint64_t seed, errors& errs, elastic_round_result& out) {
  out.accounted = 0;
  std::mt19937_64 rng(seed);
  const auto keep_alive = std::chrono::microseconds(200 + rng() % 1800);
  const std::size_t core = 1 + rng() % 2;
  const std::size_t max = core + 1 + rng() % 3;
  const int producers = 2 + static_cast<int>(rng() % 2);
  const int bursts = scaled(12, 5);
  const int per_burst = 24;
  const int end_kind = static_cast<int>(rng() % 3); // 0 shutdown, 1 shutdown_now, 2 the destructor
  const bool end_races_producers = rng() % 3 == 0;

  reports rep;
  pool_options o = pool_options::cached(core, max, keep_alive);
  o.exception_handler = rep.handler();
  auto pool = std::make_unique<scheduled_thread_pool>(o);

  const std::size_t total = static_cast<std::size_t>(producers) * static_cast<std::size_t>(bursts * per_burst);
  std::vector<std::unique_ptr<elastic_op>> ops(total);
  for (auto& p : ops) p = std::make_unique<elastic_op>();
  std::atomic<bool> stop_producing{false};

  auto produce = [&](int p) {
    std::mt19937_64 r(seed ^ (0x9e3779b97f4a7c15ULL * static_cast<std::uint64_t>(p + 1)));
    std::size_t i = static_cast<std::size_t>(p) * static_cast<std::size_t>(bursts * per_burst);
    for (int b = 0; b < bursts; ++b) {
      for (int k = 0; k < per_burst; ++k, ++i) {
        elastic_op& op = *ops[i];
        if (stop_producing.load(std::memory_order_relaxed)) { // the round has ended: never submitted
          op.submitted = false;
          continue;
        }
        const auto work = std::chrono::microseconds(r() % 150);
        auto fn = [t = life(&op.s), s = &op.s, work] {
          count_run(s);
          busy_for(work);
        };
        switch (r() % 3) {
        case 0:
          op.kind = elastic_op::post;
          net::post(pool->get_executor(), std::move(fn));
          break;
        case 1:
          op.kind = elastic_op::submit;
          try {
            op.h = pool->submit(std::move(fn));
          } catch (const rejected_execution&) {
            op.rejected = true;
          }
          break;
        default:
          op.kind = elastic_op::schedule;
          try {
            op.h = pool->schedule(std::move(fn), std::chrono::microseconds(r() % (2 * keep_alive.count())));
            if (r() % 4 == 0) op.h.cancel();
          } catch (const rejected_execution&) {
            op.rejected = true;
          }
          break;
        }
      }
      // A gap: sometimes longer than keep_alive, so elastic threads retire before the
      // next burst finds nobody idle and starts them again.
      std::this_thread::sleep_for(std::chrono::microseconds(r() % (3 * keep_alive.count())));
    }
  };

  // The round's watchdog, and the waits inside it: they add up to 50 s, under the
  // watchdog, so that a failing check reports itself before the watchdog gives up.
  constexpr std::chrono::seconds round_limit{60}, fall_back_limit{20}, all_running_limit{20};
  constexpr std::chrono::seconds task_wait_limit{15}, idle_limit{10};
  static_assert(fall_back_limit + all_running_limit + idle_limit < round_limit);
  std::vector<metronome::pending_task> returned;
  const bool ended = finishes_within(round_limit, [&] {
    std::vector<std::thread> ts;
    for (int p = 0; p < producers; ++p)
      ts.emplace_back([&produce, p] {
        tl_role = on_producer;
        produce(p);
      });
    if (end_races_producers) {
      // The ending meets the producers in mid-burst (submissions after it are rejected).
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % (bursts * 2 * keep_alive.count())));
    } else {
      for (auto& t : ts) t.join();
      ts.clear();
      out.grew = pool->stats().largest_pool_size > core;
      // Idle: the elastic threads retire, the core stays.
      const bool fell_back = metronome::test::poll_until(
          [&] {
            const auto s = pool->stats();
            return s.active == 0 && s.ready_queued == 0 && s.delayed_queued == 0 && s.threads == core;
          },
          fall_back_limit);
      if (!fell_back)
        errs.add(fmt("idle elastic pool (core %zu, max %zu): %zu threads after %lld s", core, max,
                     pool->stats().threads, static_cast<long long>(fall_back_limit.count())));
      // Grows back to max: `max` tasks, each waiting until all `max` run.
      std::atomic<std::size_t> started{0};
      std::atomic<bool> give_up{false};
      std::atomic<std::size_t> saw_all{0};
      for (std::size_t k = 0; k < max; ++k)
        net::post(pool->get_executor(), [&] {
          started.fetch_add(1);
          if (metronome::test::poll_until([&] { return started.load() == max || give_up.load(); },
                                          task_wait_limit) &&
              !give_up.load())
            saw_all.fetch_add(1);
        });
      if (!metronome::test::poll_until([&] { return saw_all.load() == max; }, all_running_limit)) {
        give_up = true;
        errs.add(
            fmt("elastic pool (core %zu, max %zu) grew to %zu of %zu waiting tasks", core, max, started.load(), max));
      }
      metronome::test::poll_until([&] { return pool->stats().active == 0; }, idle_limit);
      if (pool->stats().largest_pool_size < max)
        errs.add(fmt("largest_pool_size %zu below max %zu after the regrowth", pool->stats().largest_pool_size, max));
    }
    stop_producing.store(true, std::memory_order_relaxed);
    if (end_kind == 0) {
      pool->shutdown();
      pool->join();
    } else if (end_kind == 1) {
      returned = pool->shutdown_now();
      pool->join();
    }
    for (auto& t : ts) t.join();
    if (end_kind == 2) pool.reset();
  });
  if (!ended) {
    errs.add(fmt("elastic round (core %zu, max %zu, ending %d) did not end within %lld s", core, max, end_kind,
                 static_cast<long long>(round_limit.count())));
    metronome::test::leak(std::shared_ptr<void>(pool.release(), [](void*) {}));
    for (auto& p : ops) metronome::test::leak(std::shared_ptr<void>(p.release(), [](void*) {}));
    return false;
  }

  // Tasks returned by shutdown_now(): executor-path ones are dropped here, typed ones too
  // (their handles end cancelled).
  int returned_posts = 0;
  for (auto& t : returned)
    if (!t.has_handle()) ++returned_posts;
  returned.clear();
  const std::size_t live_largest = pool ? pool->stats().largest_pool_size : 0;
  if (pool && live_largest > 2 * max - core)
    errs.add(fmt("largest_pool_size %zu above 2 max - core = %zu", live_largest, 2 * max - core));
  pool.reset();

  int posts_unrun = 0;
  for (auto& p : ops) {
    elastic_op& op = *p;
    if (!op.submitted) continue;
    ++out.accounted;
    const int runs = op.s.runs.load();
    if (op.s.destroyed.load() != 1) errs.add(fmt("a task destroyed %d times", op.s.destroyed.load()));
    if (runs > 1) errs.add(fmt("a task ran %d times", runs));
    if (op.kind == elastic_op::post) {
      if (runs == 0) ++posts_unrun;
    } else {
      const int cancelled = !op.rejected && op.h.is_cancelled() ? 1 : 0;
      if (runs + cancelled + (op.rejected ? 1 : 0) != 1)
        errs.add(fmt("a %s task: ran %d, cancelled %d, rejected %d",
                     op.kind == elastic_op::submit ? "submitted" : "scheduled", runs, cancelled, op.rejected ? 1 : 0));
    }
  }
  // A post that never ran was refused (reported as rejected_execution) or returned by
  // shutdown_now() and dropped here: nothing else.
  if (posts_unrun != rep.rejected.load() + returned_posts)
    errs.add(
        fmt("posts: %d unrun, %d reported rejected + %d returned", posts_unrun, rep.rejected.load(), returned_posts));
  if (rep.other.load() + rep.nulls.load() != 0)
    errs.add(fmt("%d unexpected reports", rep.other.load() + rep.nulls.load()));
  return true;
}

} // namespace

BOOST_AUTO_TEST_SUITE(stress_elastic)

BOOST_AUTO_TEST_CASE(bursts_retire_and_regrow_elastic_threads_and_lose_no_task) {
  int grew = 0;
  std::size_t accounted = 0;
  run_rounds("elastic pool", 41, budget(ms(4000, 6000), 3, 200), [&](std::uint64_t seed, errors& errs) {
    elastic_round_result r;
    const bool ok = elastic_round(seed, errs, r);
    grew += r.grew ? 1 : 0;
    accounted += r.accounted;
    return ok;
  });
  BOOST_TEST(accounted > 0u);
  BOOST_TEST_MESSAGE("elastic pool: grew past its core during the bursts in " << grew << " rounds");
}

BOOST_AUTO_TEST_SUITE_END()
