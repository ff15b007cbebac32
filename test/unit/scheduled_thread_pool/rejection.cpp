// The rejection policies (abort, discard, discard_oldest, caller_runs) when the pool is
// shut down or its ready queue is full (pool_options::max_queued).
#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/serial_executor.hpp>

#include "common/held_pool.hpp"
#include "common/latch_task.hpp"
#include "common/poll_until.hpp"

#include <metronome/detail/asio.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using metronome::pool_options;
using metronome::rejection_policy;
using metronome::scheduled_thread_pool;
using metronome::test::held_pool;
using metronome::test::poll_until;

BOOST_AUTO_TEST_SUITE(pool_rejection_suite)

BOOST_AUTO_TEST_CASE(caller_runs_runs_on_the_submitting_thread_after_shutdown) {
  pool_options o;
  o.rejection = rejection_policy::caller_runs;
  scheduled_thread_pool pool(o);
  pool.shutdown();
  auto f = pool.submit([] { return std::this_thread::get_id(); });
  BOOST_TEST(f.is_done()); // ran before submit returned
  BOOST_TEST((f.get() == std::this_thread::get_id()));
  BOOST_TEST(pool.stats().rejected == 1u);
}

// A task bound to a strand over the pool itself, refused under caller_runs, is handed to
// that strand: it runs there, on the pool, while the shut-down pool has not terminated
// (the pool waits for it); once the pool has terminated nothing could run it there, so
// it is refused as under abort.
BOOST_AUTO_TEST_CASE(caller_runs_hands_a_task_bound_to_a_strand_over_the_pool_to_it_until_the_pool_terminates) {
  pool_options o = pool_options::fixed(1);
  o.rejection = rejection_policy::caller_runs;
  held_pool hp(o);
  auto strand = metronome::net::make_strand(hp.pool.get_executor());
  hp.pool.shutdown();
  std::atomic<bool> on_pool{false};
  auto f = hp.pool.submit(metronome::net::bind_executor(strand, [&] {
    on_pool = hp.pool.get_executor().running_in_this_thread();
    return 7;
  }));
  BOOST_TEST(!f.is_done()); // handed to the strand, behind the held worker
  hp.release();
  BOOST_TEST(hp.pool.await_termination(20s));
  BOOST_TEST(f.is_done());
  BOOST_TEST(f.get() == 7);
  BOOST_TEST(on_pool.load());
  BOOST_CHECK_THROW(hp.pool.submit(metronome::net::bind_executor(strand, [] { return 1; })),
                    metronome::rejected_execution);
  BOOST_TEST(hp.pool.stats().rejected == 2u);
}

BOOST_AUTO_TEST_CASE(discard_cancels_the_handle) {
  pool_options o;
  o.rejection = rejection_policy::discard;
  scheduled_thread_pool pool(o);
  pool.shutdown();
  auto f = pool.schedule([] { return 1; }, 1ms);
  BOOST_TEST(f.is_cancelled());
  BOOST_TEST(pool.stats().rejected == 1u);
}

BOOST_AUTO_TEST_CASE(max_queued_with_abort_throws) {
  pool_options o;
  o.max_queued = 2;
  scheduled_thread_pool pool(o);
  metronome::test::gate started, release;
  pool.submit([&] {
    started.open();
    release.wait();
  });
  started.wait();
  auto a = pool.submit([] { return 1; });
  auto b = pool.submit([] { return 2; });
  BOOST_CHECK_THROW(pool.submit([] { return 3; }), metronome::rejected_execution);
  release.open();
  BOOST_TEST(a.get() + b.get() == 3);
  BOOST_TEST(pool.stats().rejected == 1u);
}

BOOST_AUTO_TEST_CASE(discard_oldest_makes_room) {
  pool_options o;
  o.max_queued = 2;
  o.rejection = rejection_policy::discard_oldest;
  scheduled_thread_pool pool(o);
  metronome::test::gate started, release;
  pool.submit([&] {
    started.open();
    release.wait();
  });
  started.wait();
  auto a = pool.submit([] { return 1; });
  auto b = pool.submit([] { return 2; });
  auto c = pool.submit([] { return 3; });
  release.open();
  BOOST_TEST(b.get() + c.get() == 5);
  BOOST_TEST(a.is_cancelled());
  BOOST_TEST(pool.stats().rejected == 1u);
}

BOOST_AUTO_TEST_CASE(caller_runs_after_shutdown_never_runs_delayed_or_periodic_work_early) {
  pool_options o;
  o.rejection = rejection_policy::caller_runs;
  scheduled_thread_pool pool(o);
  pool.shutdown();
  std::atomic<int> ran{0};
  BOOST_CHECK_THROW(pool.schedule([&] { ++ran; }, 1h), metronome::rejected_execution);
  BOOST_CHECK_THROW(pool.schedule_at_fixed_rate([&] { ++ran; }, 1h, 1h), metronome::rejected_execution);
  BOOST_CHECK_THROW(pool.schedule_with_fixed_delay([&] { ++ran; }, 0ms, 1h), metronome::rejected_execution);
  BOOST_CHECK_EQUAL(ran.load(), 0);
  auto now = pool.submit([&] { return ++ran; }); // due now: runs on the caller
  BOOST_CHECK_EQUAL(now.get(), 1);
  BOOST_CHECK_EQUAL(pool.stats().rejected, 4u);
}

BOOST_AUTO_TEST_CASE(discard_oldest_never_evicts_a_serial_executor_s_drain) {
  pool_options o;
  o.max_queued = 2;
  o.rejection = rejection_policy::discard_oldest;
  held_pool hp(o);
  auto serial = metronome::make_serial_executor(hp.pool);
  std::atomic<bool> serial_ran{false};
  metronome::net::post(serial, [&] { serial_ran = true; }); // its drain: internal work in the ready queue
  auto a = hp.pool.submit([] { return 1; });
  auto b = hp.pool.submit([] { return 2; }); // full: evicts a, the oldest user task
  BOOST_CHECK(a.is_cancelled());
  hp.release();
  BOOST_CHECK_EQUAL(b.get(), 2);
  BOOST_CHECK(poll_until([&] { return serial_ran.load(); }));
  BOOST_CHECK_GE(hp.pool.stats().rejected, 1u);
}

BOOST_AUTO_TEST_CASE(discard_oldest_keeps_the_ready_queue_bounded) {
  pool_options o;
  o.max_queued = 4;
  o.rejection = rejection_policy::discard_oldest;
  held_pool hp(o);
  std::vector<metronome::scheduled_future<int>> hs;
  for (int i = 0; i < 200; ++i) {
    hs.push_back(hp.pool.submit([i] { return i; }));
    BOOST_REQUIRE_LE(hp.pool.stats().ready_queued, 5u); // the bound, plus at most one cancelled in place
  }
  hp.release();
  for (int i = 0; i < 200; ++i) {
    if (i < 196)
      BOOST_CHECK(hs[i].is_cancelled()); // evicted, oldest first
    else
      BOOST_CHECK_EQUAL(hs[i].get(), i); // the newest ones run
  }
  BOOST_CHECK_EQUAL(hp.pool.stats().rejected, 196u);
}

BOOST_AUTO_TEST_CASE(discard_oldest_with_only_internal_work_queued_discards_the_new_task) {
  pool_options o;
  o.max_queued = 1;
  o.rejection = rejection_policy::discard_oldest;
  held_pool hp(o);
  std::atomic<bool> posted_ran{false};
  metronome::net::post(hp.pool, [&] { posted_ran = true; });
  auto late = hp.pool.submit([] {});
  BOOST_CHECK(late.is_cancelled());
  BOOST_CHECK_EQUAL(hp.pool.stats().rejected, 1u);
  hp.release();
  BOOST_CHECK(poll_until([&] { return posted_ran.load(); }));
}

BOOST_AUTO_TEST_SUITE_END()
