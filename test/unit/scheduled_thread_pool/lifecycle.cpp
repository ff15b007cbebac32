#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/async_delay.hpp>

#include <metronome/detail/node_cache.hpp>
#include <metronome/manual_clock.hpp>
#include <metronome/serial_executor.hpp>

#include "common/exception_log.hpp"
#include "common/held_pool.hpp"
#include "common/latch_task.hpp"
#include "common/manual_pool.hpp"
#include "common/poll_until.hpp"
#include "common/stderr_capture.hpp"

#include <metronome/detail/asio.hpp>
#include <boost/test/unit_test.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <dirent.h>
#include <fstream>
#include <malloc.h>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using metronome::manual_clock;
using metronome::pool_options;
using metronome::rejection_policy;
using metronome::scheduled_thread_pool;
using metronome::test::counter;
using metronome::test::gate;
using metronome::test::held_pool;
using metronome::test::on_clock;
using metronome::test::poll_until;

namespace {

[[maybe_unused]] std::set<std::string> thread_names() {
  std::set<std::string> names;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream in(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string n;
      std::getline(in, n);
      names.insert(n);
    }
    ::closedir(d);
  }
  return names;
}
} // namespace

BOOST_AUTO_TEST_SUITE(pool_lifecycle_suite)

BOOST_AUTO_TEST_CASE(shutdown_rejects_new_work_and_runs_queued_work) {
  scheduled_thread_pool pool(1);
  metronome::test::gate g;
  pool.submit([&] { g.wait(); });
  std::atomic<int> ran{0};
  std::vector<metronome::scheduled_future<void>> hs;
  for (int i = 0; i < 100; ++i) hs.push_back(pool.submit([&] { ++ran; }));
  pool.shutdown();
  BOOST_TEST(pool.is_shutdown());
  BOOST_CHECK_THROW(pool.submit([] {}), metronome::rejected_execution);
  BOOST_CHECK_THROW(pool.schedule([] {}, 1s), metronome::rejected_execution);
  BOOST_TEST(pool.stats().rejected == 2u);
  g.open();
  pool.join();
  BOOST_TEST(ran.load() == 100);
  BOOST_TEST(pool.is_terminated());
}

BOOST_AUTO_TEST_CASE(delayed_one_shots_run_after_shutdown_by_default) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  auto f = pool.schedule([] { return 4; }, 50ms);
  auto p = pool.schedule_at_fixed_rate([] {}, 10ms, 10ms);
  pool.shutdown();
  BOOST_TEST(p.is_cancelled()); // periodic stops at shutdown by default
  BOOST_TEST(!pool.is_terminated());
  BOOST_TEST(!pool.await_termination(20ms)); // still waiting for the delayed task
  c.advance(50ms);
  BOOST_TEST(f.get() == 4);
  pool.join();
  BOOST_TEST(pool.is_terminated());
}

BOOST_AUTO_TEST_CASE(delayed_one_shots_can_be_dropped_at_shutdown) {
  manual_clock c;
  auto o = on_clock(c);
  o.run_delayed_after_shutdown = false;
  scheduled_thread_pool pool(o);
  auto f = pool.schedule([] { return 4; }, 50ms);
  pool.shutdown();
  BOOST_TEST(f.is_cancelled());
  pool.join();
  BOOST_TEST(pool.stats().delayed_queued == 0u);
}

BOOST_AUTO_TEST_CASE(periodic_tasks_can_continue_after_shutdown) {
  manual_clock c;
  auto o = on_clock(c);
  o.continue_periodic_after_shutdown = true;
  scheduled_thread_pool pool(o);
  metronome::test::counter runs;
  auto p = pool.schedule_at_fixed_rate([&] { runs.add(); }, 10ms, 10ms);
  pool.shutdown();
  for (int i = 1; i <= 3; ++i) {
    c.advance(10ms);
    BOOST_REQUIRE(runs.wait_for_at_least(i));
  }
  BOOST_TEST(!pool.is_terminated());
  BOOST_TEST(p.cancel());
  pool.join();
  BOOST_TEST(pool.is_terminated());
}

BOOST_AUTO_TEST_CASE(shutdown_now_returns_every_task_that_never_ran) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c));
  metronome::test::gate started, release;
  auto blocker = pool.submit([&] {
    started.open();
    release.wait();
  });
  started.wait();
  std::vector<metronome::scheduled_future<int>> ready, delayed;
  for (int i = 0; i < 5; ++i) ready.push_back(pool.submit([i] { return i; }));
  for (int i = 0; i < 10; ++i) delayed.push_back(pool.schedule([i] { return 100 + i; }, std::chrono::seconds(1 + i)));
  auto periodic = pool.schedule_at_fixed_rate([] {}, 1s, 1s);
  std::atomic<int> posted{0};
  metronome::net::post(pool, [&] { ++posted; });
  auto cancelled = pool.schedule([] { return -1; }, 1s);
  cancelled.cancel();

  auto pending = pool.shutdown_now();
  release.open();
  BOOST_TEST(pending.size() == 5u + 10u + 1u + 1u);
  BOOST_TEST(pool.stats().delayed_queued == 0u);
  BOOST_CHECK_THROW(pool.submit([] { return 0; }), metronome::rejected_execution);
  pool.join();
  BOOST_TEST(blocker.is_done());
  // Nothing ran: the handles are still pending until we decide.
  for (auto& f : ready) BOOST_TEST(!f.is_done());
  // Run the first (a ready one), drop the rest: they become cancelled.
  BOOST_TEST(pending.front().has_handle());
  pending.front()();
  BOOST_TEST(ready[0].get() == 0);
  BOOST_CHECK_THROW(pending.front()(), std::logic_error);
  std::size_t plain = 0;
  for (auto& p : pending) plain += p && !p.has_handle();
  BOOST_TEST(plain == 1u); // the posted function
  pending.clear();
  for (std::size_t i = 1; i < ready.size(); ++i) BOOST_TEST(ready[i].is_cancelled());
  for (auto& f : delayed) BOOST_TEST(f.is_cancelled());
  BOOST_TEST(periodic.is_cancelled());
  BOOST_TEST(posted.load() == 0);
}

BOOST_AUTO_TEST_CASE(executor_path_drops_outside_work_after_shutdown_and_reports_it) {
  std::atomic<int> rejected_reports{0};
  pool_options o;
  o.exception_handler = [&](std::exception_ptr e) {
    try {
      std::rethrow_exception(e);
    } catch (const metronome::rejected_execution&) {
      ++rejected_reports;
    } catch (...) {
    }
  };
  scheduled_thread_pool pool(o);
  pool.shutdown();
  std::atomic<int> ran{0};
  metronome::net::post(pool, [&] { ++ran; }); // does not throw
  pool.join();
  BOOST_TEST(ran.load() == 0);
  BOOST_TEST(rejected_reports.load() == 1);
  BOOST_TEST(pool.stats().rejected == 1u);
}

// A normal shutdown is quiet (issue 29): Asio destroys unrun handlers without a word, so
// the default handler prints nothing for work a shutdown the user asked for dropped -
// after shutdown_now(), after shutdown(), on a serial executor over such a pool - while
// stats() still counts each drop and a task that throws is still printed.
BOOST_AUTO_TEST_CASE(the_default_handler_does_not_print_work_dropped_by_a_requested_shutdown) {
  metronome::test::stderr_capture err;
  {
    scheduled_thread_pool now_pool(1);
    auto serial = metronome::make_serial_executor(now_pool);
    std::atomic<int> ran{0};
    metronome::net::post(now_pool, [] { throw std::runtime_error("a real failure"); });
    metronome::test::gate g;
    metronome::test::gate busy;
    metronome::net::post(now_pool, [&] {
      busy.open();
      g.wait();
    });
    busy.wait();
    metronome::net::post(now_pool, [&] { ++ran; }); // queued: shutdown_now() hands it back
    auto back = now_pool.shutdown_now();
    g.open();
    metronome::net::post(now_pool, [&] { ++ran; }); // after shutdown_now(): dropped
    metronome::net::post(serial, [&] { ++ran; });   // likewise, through a serial executor
    now_pool.join();
    BOOST_TEST(back.size() == 1u);
    BOOST_TEST(ran.load() == 0);
    BOOST_TEST(now_pool.stats().rejected == 2u);

    scheduled_thread_pool pool(1);
    pool.shutdown();
    metronome::net::post(pool, [&] { ++ran; }); // after shutdown(): dropped
    pool.join();
    metronome::net::post(pool, [&] { ++ran; }); // after termination: dropped
    BOOST_TEST(ran.load() == 0);
    BOOST_TEST(pool.stats().rejected == 2u);
  }
  const std::string printed = err.take();
  BOOST_TEST(printed.find("a real failure") != std::string::npos, printed); // still printed
  BOOST_TEST(printed.find("work dropped") == std::string::npos, printed);
  BOOST_TEST(printed.find("rejected") == std::string::npos, printed);
}

// ...but a handler the user installed sees every one of those drops.
BOOST_AUTO_TEST_CASE(an_installed_handler_sees_every_drop_of_a_requested_shutdown) {
  metronome::test::exception_log log;
  pool_options o;
  o.threads = 1;
  o.exception_handler = log.handler();
  metronome::test::stderr_capture err;
  {
    scheduled_thread_pool pool(o);
    auto serial = metronome::make_serial_executor(pool);
    (void)pool.shutdown_now();
    metronome::net::post(pool, [] {});
    metronome::net::post(serial, [] {});
    pool.join();
    metronome::net::post(pool, [] {});
    BOOST_TEST(pool.stats().rejected == 3u);
  }
  BOOST_TEST(err.take().empty());
  const auto seen = log.messages();
  BOOST_TEST_REQUIRE(seen.size() == 3u);
  BOOST_TEST(seen[0] == "metronome: work dropped: the pool was shut down now");
  BOOST_TEST(seen[1] == "metronome: work dropped: the pool under this serial_executor is shut down");
  BOOST_TEST(seen[2] == "metronome: work dropped: the pool was shut down now"); // terminated since
}

BOOST_AUTO_TEST_CASE(work_from_pool_threads_is_accepted_while_shutting_down) {
  scheduled_thread_pool pool(2);
  std::atomic<int> chain{0};
  metronome::test::gate g;
  std::function<void()> step = [&] {
    if (++chain < 100) metronome::net::post(pool, step);
  };
  metronome::net::post(pool, [&] {
    g.wait();
    step();
  });
  pool.shutdown();
  g.open();
  pool.join();
  BOOST_TEST(chain.load() == 100);
}

// A periodic task handed back by shutdown_now() runs once more, its last run, when its
// pending_task is run. A cancel() during that run returns true (as during a run on the
// pool) and the task ends cancelled, as there: cancel() true means is_cancelled().
BOOST_AUTO_TEST_CASE(a_cancel_during_a_handed_back_periodic_run_ends_it_cancelled) {
  scheduled_thread_pool pool(1);
  metronome::test::gate in_run;
  metronome::test::counter runs;
  auto h = pool.schedule_at_fixed_rate(
      [&] {
        runs.add();
        in_run.wait();
      },
      1h, 1h);
  auto pending = pool.shutdown_now();
  BOOST_REQUIRE_EQUAL(pending.size(), 1u);
  std::thread runner([&] { pending.front()(); });
  BOOST_REQUIRE(runs.wait_for_at_least(1));
  BOOST_TEST(h.cancel()); // during the run
  in_run.open();
  runner.join();
  BOOST_TEST(h.is_done());
  BOOST_TEST(h.is_cancelled());
  BOOST_CHECK_THROW(h.get(), metronome::cancelled_error);
  BOOST_TEST(runs.value() == 1);
}

// shutdown_now() from one of the pool's tasks returns that thread's continuations too
// (defer: they would have run right after the task), first, then the ready queue. They
// were dropped and reported when the thread exited (adversary pass 7).
BOOST_AUTO_TEST_CASE(shutdown_now_from_a_task_returns_its_deferred_continuations_first) {
  std::atomic<int> reports{0};
  metronome::pool_options o;
  o.threads = 1;
  o.exception_handler = [&](std::exception_ptr) { ++reports; };
  scheduled_thread_pool pool(o);
  std::vector<int> order;
  std::vector<metronome::pending_task> back;
  metronome::test::gate done;
  metronome::net::post(pool, [&] {
    for (int i = 0; i < 3; ++i) metronome::net::post(pool.get_executor(), [&order, i] { order.push_back(10 + i); });
    for (int i = 0; i < 3; ++i) metronome::net::defer(pool.get_executor(), [&order, i] { order.push_back(i); });
    back = pool.shutdown_now();
    done.open();
  });
  done.wait();
  pool.join();
  BOOST_TEST(back.size() == 6u);
  for (auto& t : back) t();
  BOOST_TEST(order == (std::vector<int>{0, 1, 2, 10, 11, 12}), boost::test_tools::per_element());
  BOOST_TEST(reports.load() == 0);
}

// Submitters race shutdown_now: every task ran, was returned, or was rejected.
BOOST_AUTO_TEST_CASE(shutdown_now_races_lose_nothing) {
  for (int round = 0; round < 5; ++round) {
    scheduled_thread_pool pool(2);
    std::atomic<int> ran{0}, rejected{0};
    std::atomic<bool> go{false};
    std::vector<std::vector<metronome::scheduled_future<void>>> handles(3);
    std::vector<std::thread> submitters;
    for (int t = 0; t < 3; ++t) {
      submitters.emplace_back([&, t] {
        while (!go) std::this_thread::yield();
        for (int i = 0; i < 20000; ++i) {
          try {
            auto delay = std::chrono::microseconds(i % 3 == 0 ? 500 : 0);
            handles[t].push_back(pool.schedule([&] { ++ran; }, delay));
          } catch (const metronome::rejected_execution&) {
            ++rejected;
          }
        }
      });
    }
    go = true;
    while (pool.stats().completed < 2000) std::this_thread::yield();
    auto pending = pool.shutdown_now();
    for (auto& s : submitters) s.join();
    pool.join();
    const int returned = static_cast<int>(pending.size());
    pending.clear(); // cancels their handles
    int done_ran = 0, cancelled = 0, lost = 0;
    for (auto& hs : handles)
      for (auto& h : hs) {
        if (!h.is_done())
          ++lost;
        else if (h.is_cancelled())
          ++cancelled;
        else
          ++done_ran;
      }
    BOOST_TEST(lost == 0);
    BOOST_TEST(done_ran == ran.load());
    BOOST_TEST(ran.load() + returned + rejected.load() + (cancelled - returned) == 60000);
    BOOST_TEST(cancelled >= returned);
  }
}

BOOST_AUTO_TEST_CASE(join_without_shutdown_waits_for_outstanding_work) {
  scheduled_thread_pool pool(2);
  std::atomic<int> ran{0};
  pool.schedule([&] { ++ran; }, 30ms);
  for (int i = 0; i < 100; ++i) metronome::net::post(pool, [&] { ++ran; });
  pool.join();
  BOOST_TEST(ran.load() == 101);
  BOOST_TEST(pool.is_terminated());
}

BOOST_AUTO_TEST_CASE(await_termination_before_shutdown_times_out) {
  scheduled_thread_pool pool(1);
  auto start = std::chrono::steady_clock::now();
  BOOST_TEST(!pool.await_termination(30ms));
  BOOST_TEST((std::chrono::steady_clock::now() - start >= 30ms));
  pool.shutdown();
  BOOST_TEST(pool.await_termination(20s));
}

BOOST_AUTO_TEST_CASE(join_from_a_pool_thread_is_a_logic_error) {
  scheduled_thread_pool pool(1);
  auto f = pool.submit([&] { pool.join(); });
  BOOST_CHECK_THROW(f.get(), std::logic_error);
}

BOOST_AUTO_TEST_CASE(destructor_cancels_far_future_work_and_runs_ready_work) {
  std::vector<metronome::scheduled_future<int>> far;
  std::atomic<int> ran{0};
  metronome::scheduled_future<void> periodic;
  auto start = std::chrono::steady_clock::now();
  {
    scheduled_thread_pool pool(1);
    metronome::test::gate g;
    pool.submit([&] { g.wait(); });
    for (int i = 0; i < 50; ++i) metronome::net::post(pool, [&] { ++ran; });
    for (int i = 0; i < 10; ++i) far.push_back(pool.schedule([] { return 1; }, 1h));
    periodic = pool.schedule_at_fixed_rate([] {}, 1h, 1h);
    g.open();
  }
  BOOST_TEST((std::chrono::steady_clock::now() - start < 30s)); // never waits for the hour
  BOOST_TEST(ran.load() == 50);
  for (auto& f : far) BOOST_TEST(f.is_cancelled());
  BOOST_TEST(periodic.is_cancelled());
}

BOOST_AUTO_TEST_CASE(destroying_the_pool_from_its_own_thread_detaches_it) {
  auto pool = std::make_unique<scheduled_thread_pool>(2);
  std::promise<void> destroyed;
  metronome::test::gate posted;
  std::atomic<int> ready_ran{0};
  auto* raw = pool.release();
  metronome::net::post(*raw, [raw, &destroyed, &posted] {
    posted.wait(); // the main thread is done touching the pool
    delete raw;
    destroyed.set_value();
  });
  for (int i = 0; i < 10; ++i) metronome::net::post(*raw, [&] { ++ready_ran; });
  posted.open();
  BOOST_TEST((destroyed.get_future().wait_for(20s) == std::future_status::ready));
  BOOST_TEST(ready_ran.load() == 10); // ready work ran before the pool went away
}

// Thread names are a Linux call; the portable fallback (METRONOME_PORTABLE_FALLBACK) names
// nothing.
#if defined(__linux__) && !defined(METRONOME_PORTABLE_FALLBACK)
BOOST_AUTO_TEST_CASE(threads_are_named_with_the_prefix) {
  pool_options o = pool_options::fixed(2);
  o.thread_name_prefix = "mtrtest";
  scheduled_thread_pool pool(o);
  BOOST_TEST(poll_until([] {
    auto n = thread_names();
    return n.count("mtrtest-1") && n.count("mtrtest-2");
  }));
}

// Over the OS's 15 characters the start of the prefix stays, and the whole "-<n>": the
// first characters were cut instead (adversary pass 8: "worker_pool_ab" -> "orker_pool_ab-1").
BOOST_AUTO_TEST_CASE(a_long_prefix_keeps_its_start_and_the_worker_number) {
  pool_options o = pool_options::fixed(2);
  o.thread_name_prefix = "mtr_long_prefix_pool";
  scheduled_thread_pool pool(o);
  BOOST_TEST(poll_until([] {
    auto n = thread_names();
    return n.count("mtr_long_pref-1") && n.count("mtr_long_pref-2");
  }));
}
#endif

BOOST_AUTO_TEST_CASE(elastic_pool_grows_under_load_and_shrinks_when_idle) {
  scheduled_thread_pool pool(pool_options::cached(1, 4, 50ms));
  metronome::test::gate release;
  metronome::test::counter started;
  std::vector<metronome::scheduled_future<void>> hs;
  for (int i = 0; i < 4; ++i) {
    hs.push_back(pool.submit([&] {
      started.add();
      release.wait();
    }));
  }
  BOOST_TEST(started.wait_for_at_least(4)); // four tasks run at once: the pool grew
  BOOST_TEST(pool.stats().threads == 4u);
  BOOST_TEST(pool.stats().active == 4u);
  BOOST_TEST(pool.stats().largest_pool_size == 4u);
  release.open();
  for (auto& h : hs) h.get();
  BOOST_TEST(poll_until([&] { return pool.stats().threads == 1u; }));
  BOOST_TEST(pool.submit([] { return 1; }).get() == 1);
}

// An elastic pool whose core thread is busy and whose elastic threads have retired:
// delayed work (a scheduled task, an async_delay) started no thread - nobody timed the
// heap until the core thread was free (adversary pass 7: stuck for the whole 1 s). Like
// ready work nobody is free to take, it starts a thread, which times it.
BOOST_AUTO_TEST_CASE(delayed_work_on_a_busy_elastic_pool_starts_a_thread_to_time_it) {
  scheduled_thread_pool pool(pool_options::cached(1, 8, 20ms));
  metronome::test::gate release;
  metronome::test::counter started;
  // Every live thread busy and none idle: a blocker per thread until the idle ones (an
  // elastic thread a submission started) have retired. Which thread takes a blocker is
  // the pool's business.
  int blockers = 0;
  for (;;) {
    BOOST_REQUIRE(blockers < 4);
    pool.submit([&] {
      started.add();
      release.wait();
    });
    BOOST_REQUIRE(started.wait_for_at_least(++blockers));
    if (poll_until([&] {
          const auto st = pool.stats();
          return st.threads == st.active;
        }, 2s))
      break;
  }
  std::atomic<int> ran{0};
  auto h = pool.schedule([&] { ++ran; }, 1ms);
  metronome::async_delay(pool, 1ms, [&](metronome::error_code ec) {
    if (!ec) ++ran;
  });
  BOOST_CHECK(poll_until([&] { return ran.load() == 2; }, 10s)); // while every other thread is still busy
  BOOST_CHECK_EQUAL(started.value(), blockers);
  release.open();
  h.wait();
}

// keep_alive = nanoseconds::max() ("never retire"): the idle elastic thread's timed wait
// added it to now and overflowed (UBSan: signed integer overflow in wait_for), so the
// threads retired at once (adversary pass 6). They stay; the pool still shuts down.
BOOST_AUTO_TEST_CASE(an_elastic_thread_with_the_largest_keep_alive_stays) {
  for (auto keep : {std::chrono::nanoseconds::max(), std::chrono::nanoseconds::max() / 2 + std::chrono::nanoseconds(1)}) {
    scheduled_thread_pool pool(pool_options::cached(1, 3, keep));
    metronome::test::gate release;
    metronome::test::counter started;
    std::vector<metronome::scheduled_future<void>> hs;
    for (int i = 0; i < 3; ++i) {
      hs.push_back(pool.submit([&] {
        started.add();
        release.wait();
      }));
    }
    BOOST_REQUIRE(started.wait_for_at_least(3));
    release.open();
    for (auto& h : hs) h.get();
    BOOST_CHECK(!poll_until([&] { return pool.stats().threads < 3u; }, 300ms)); // none retires
    pool.shutdown();
    BOOST_CHECK(pool.await_termination(std::chrono::seconds(20)));
  }
}

// Workers in a burst keep task nodes beyond the node cache instead of calling free(),
// and free them once idle: after 300,000 tasks the heap is back near where it was.
BOOST_AUTO_TEST_CASE(a_burst_s_task_nodes_are_freed_once_the_pool_is_idle) {
  scheduled_thread_pool pool(2);
  const auto heap0 = mallinfo2().uordblks;
  const auto mapped0 = metronome::detail::node_cache_mapped_bytes(); // task nodes live there
  constexpr long n = 300000;
  std::atomic<long> done{0};
  metronome::test::gate hold;
  metronome::test::counter held;
  for (int w = 0; w < 2; ++w) // both workers wait: the whole burst is queued before any runs
    metronome::net::post(pool, [&] {
      held.add();
      hold.wait();
    });
  BOOST_REQUIRE(held.wait_for_at_least(2));
  for (long i = 0; i < n; ++i)
    metronome::net::post(pool, [&done, i, pad = std::array<long, 5>{}] {
      done.fetch_add(i >= 0 && pad[0] == 0 ? 1 : 0); // a 96-byte node
    });
  hold.open();
  BOOST_TEST(poll_until([&] { return done.load() == n; }));
  // 300,000 nodes are ~28 MiB of chunks: the cache may keep a few, the workers unmap
  // the rest once idle.
  BOOST_TEST(poll_until([&] { return metronome::detail::node_cache_mapped_bytes() < mapped0 + (6u << 20); }));
  BOOST_TEST(mallinfo2().uordblks < heap0 + (4u << 20));
}

BOOST_AUTO_TEST_CASE(stats_count_completed_and_queues) {
  manual_clock c;
  scheduled_thread_pool pool(on_clock(c, 2));
  std::vector<metronome::scheduled_future<void>> hs;
  for (int i = 0; i < 10; ++i) hs.push_back(pool.submit([] {}));
  for (auto& h : hs) h.get();
  BOOST_TEST(poll_until([&] { return pool.stats().completed == 10u; }));
  pool.schedule([] {}, 1s);
  auto s = pool.stats();
  BOOST_TEST(s.delayed_queued == 1u);
  BOOST_TEST(s.threads == 2u);
  BOOST_TEST(s.largest_pool_size == 2u);
  BOOST_TEST(s.rejected == 0u);
}

// A strand over a pool that has terminated: Asio's rule holds, `post` never runs the
// handler inside it. The strand's invoker is refused as any late work is (dropped,
// counted, reported as rejected_execution); the strand stays locked, and its handlers
// are destroyed unrun with its last copy. (Nothing the pool accepted can be queued behind
// it: the pool does not terminate while such work waits in a strand over it, test/handover.)
BOOST_AUTO_TEST_CASE(a_strand_invoker_reaching_a_terminated_pool_is_refused_never_run_inside_post) {
  metronome::test::exception_log log;
  pool_options o = pool_options::fixed(1);
  o.exception_handler = log.handler();
  scheduled_thread_pool pool(o);
  auto strand = std::optional(metronome::net::make_strand(pool.get_executor()));
  pool.shutdown();
  pool.join();
  const auto before = pool.stats().rejected;
  int ran = 0;
  auto alive = std::make_shared<int>(0);
  metronome::net::post(*strand, [&ran, alive] { ++ran; });
  metronome::net::post(*strand, [&ran, alive] { ++ran; });
  BOOST_CHECK_EQUAL(ran, 0);
  BOOST_CHECK_EQUAL(pool.stats().rejected, before + 1); // one invoker: the strand's first post
  const auto seen = log.messages();
  BOOST_REQUIRE_EQUAL(seen.size(), 1u);
  BOOST_CHECK(seen[0].find("terminated") != std::string::npos);
  BOOST_CHECK(alive.use_count() > 1); // queued in the locked strand
  strand.reset();
  BOOST_CHECK_EQUAL(alive.use_count(), 1); // destroyed unrun with the strand
  BOOST_CHECK_EQUAL(ran, 0);
}

// shutdown_now() destroys a strand's invoker rather than hand it out: a pending_task
// holding one outlived the pool and crashed when run or dropped (ASan: use-after-free in
// the pool executor's destructor). The strand's handlers are destroyed unrun with the
// strand, as at an io_context's destruction; other executor-path work comes back.
BOOST_AUTO_TEST_CASE(shutdown_now_destroys_a_strand_s_invoker_instead_of_returning_it) {
  std::vector<metronome::pending_task> handed;
  auto alive = std::make_shared<int>(0);
  int ran = 0;
  {
    scheduled_thread_pool pool(1);
    metronome::test::gate release;
    metronome::test::counter started;
    BOOST_REQUIRE(metronome::test::occupy_worker(pool, release, started));
    auto strand = metronome::net::make_strand(pool.get_executor());
    metronome::net::post(strand, [&ran, alive] { ++ran; });
    metronome::net::post(pool, [&ran] { ++ran; });
    handed = pool.shutdown_now();
    release.open();
    BOOST_TEST(alive.use_count() > 1); // queued in the locked strand
  } // the strand goes before the pool, its handler with it
  BOOST_TEST(alive.use_count() == 1);
  BOOST_REQUIRE_EQUAL(handed.size(), 1u); // the plain post only
  handed[0]();
  BOOST_TEST(ran == 1);
}

BOOST_AUTO_TEST_CASE(join_returns_after_shutdown_even_with_tracked_work_outstanding) {
  scheduled_thread_pool pool(1);
  // Tracked work that only outside work could finish, and outside work is dropped now.
  auto guard = metronome::net::make_work_guard(pool.get_executor());
  pool.shutdown();
  BOOST_CHECK_MESSAGE(pool.await_termination(10s), "tracked work kept a shut-down, idle pool alive");
  pool.join();
  BOOST_CHECK(pool.is_terminated());
}

BOOST_AUTO_TEST_CASE(a_strand_over_a_shut_down_pool_runs_what_it_accepted) {
  pool_options o;
  o.exception_handler = [](std::exception_ptr) {};
  held_pool hp(o);
  auto strand = metronome::net::make_strand(hp.pool.get_executor());
  std::atomic<int> ran{0};
  // Queued before shutdown: it reaches the strand from a pool thread (as a completion does).
  metronome::net::post(hp.pool.get_executor(), [&] { metronome::net::post(strand, [&] { ++ran; }); });
  hp.pool.shutdown();
  // Outside, after shutdown: the strand's invoker is the pool's internal work (dropping it
  // would leave the strand locked and lose every handler queued behind it).
  metronome::net::post(strand, [&] { ++ran; });
  hp.release();
  BOOST_CHECK(poll_until([&] { return ran.load() == 2; }, 10s));
  BOOST_CHECK(hp.pool.await_termination(10s));
}

BOOST_AUTO_TEST_CASE(a_completion_reaching_a_shut_down_pool_from_outside_still_runs) {
  scheduled_thread_pool pool(1);
  auto h = pool.schedule([] {}, 1h);
  std::atomic<int> ran{0};
  h.async_wait(metronome::net::bind_executor(pool.get_executor(), [&](std::exception_ptr e) {
    if (e) ++ran;
  }));
  pool.shutdown(); // the delayed task still runs when due (run_delayed_after_shutdown)
  BOOST_REQUIRE(h.cancel()); // from outside: its completion goes to the pool from here
  BOOST_CHECK_MESSAGE(poll_until([&] { return ran.load() == 1; }, 10s),
                      "the completion was dropped as outside work");
  BOOST_CHECK(pool.await_termination(10s));
}

BOOST_AUTO_TEST_CASE(a_pool_destroyed_from_its_own_task_runs_the_continuations_that_task_deferred) {
  auto* pool = new scheduled_thread_pool(2);
  counter done;
  gate posted; // the rule: no other thread is inside a call on the pool when it goes
  std::atomic<int> continuation_ran{0};
  metronome::net::post(*pool, [&, pool] {
    metronome::net::defer(pool->get_executor(), [&] { ++continuation_ran; });
    posted.wait();
    delete pool;
    done.add();
  });
  posted.open();
  BOOST_REQUIRE(done.wait_for_at_least(1));
  BOOST_CHECK_EQUAL(continuation_ran.load(), 1);
}

BOOST_AUTO_TEST_SUITE_END()
