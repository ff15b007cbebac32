// Allocation failure: this executable replaces operator new so that the Nth allocation
// of the calling thread fails. Every public call either throws std::bad_alloc with
// nothing changed (nothing queued, the callable destroyed once, the pool still working)
// or succeeds; no library thread dies or terminates.
#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/manual_clock.hpp>
#include <metronome/serial_executor.hpp>
#include <metronome/wheel_timer.hpp>
#include <metronome/async_delay.hpp>
#include <metronome/detail/node_cache.hpp>
#include "wheel_engine.hpp" // wheel_ticks_alive()

#include "common/accounting.hpp"
#include "common/poll_until.hpp"

#include <metronome/detail/asio.hpp>
#include <boost/test/unit_test.hpp>

#include "common/counting_new.hpp"


#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <new>
#include <thread>
#include <vector>

using metronome::test::fail_countdown;

using namespace std::chrono_literals;
using metronome::manual_clock;
using metronome::scheduled_thread_pool;

namespace {

// A callable that counts its live copies.
struct tracked {
  static inline std::atomic<long> live{0};
  std::atomic<int>* runs;
  explicit tracked(std::atomic<int>* r) : runs(r) { ++live; }
  tracked(const tracked& o) : runs(o.runs) { ++live; }
  tracked(tracked&& o) noexcept : runs(o.runs) { ++live; }
  ~tracked() { --live; }
  void operator()() const { ++*runs; }
};

// Runs `op` with the Nth allocation failing, for N = 0, 1, ... until it goes through;
// it must throw bad_alloc while the failure is met, and `check_unchanged` runs after
// each throw.
template <class Op, class Check>
int for_each_failure(Op&& op, Check&& check_unchanged) {
  for (long n = 0; n < 64; ++n) {
    bool threw = false;
    fail_countdown = n;
    try {
      op();
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    const bool reached = fail_countdown < 0;
    fail_countdown = -1;
    if (threw) {
      check_unchanged();
      continue;
    }
    // It went through: the injected failure must not have been met and swallowed (a
    // completion, a timeout or a hint lost on the way).
    BOOST_CHECK_MESSAGE(!reached, "allocation " << n << " failed and the call went through anyway");
    return static_cast<int>(n);
  }
  BOOST_FAIL("the call never succeeded");
  return -1;
}

} // namespace

BOOST_AUTO_TEST_SUITE(fault_injection_suite)

// First in the suite: before anything else here posts a plain callback's completion.
// async_wait on a handle whose task has already ended: the handler runs once, never
// inside the call, and out of memory the call throws with the handler destroyed unrun.
// It posted the completion from inside the library (a plain callback: to Asio's system
// executor, made on first use): the failure was reported and the handler lost - a
// coroutine awaiting it hung (adversary pass 6).
BOOST_AUTO_TEST_CASE(async_wait_on_an_ended_task_throws_bad_alloc_or_completes_once) {
  scheduled_thread_pool pool(1);
  auto h = pool.submit([] { return 7; });
  h.wait();
  metronome::net::io_context io;
  for (int mode = 0; mode < 2; ++mode) {
    BOOST_TEST_CONTEXT((mode == 0 ? "a plain callback" : "a callback bound to an io_context")) {
      std::atomic<int> calls{0}, runs{0};
      const long live_before = tracked::live.load();
      for_each_failure(
          [&] {
            auto cb = [&, t = tracked(&runs)](std::exception_ptr e, int v) {
              if (!e && v == 7) ++calls;
            };
            if (mode == 0)
              h.async_wait(std::move(cb));
            else
              h.async_wait(metronome::net::bind_executor(io, std::move(cb)));
          },
          [&] {
            io.poll();
            io.restart();
            BOOST_CHECK_EQUAL(calls.load(), 0);
            BOOST_CHECK_EQUAL(tracked::live.load(), live_before);
          });
      if (mode == 1) {
        io.run();
        io.restart();
      }
      BOOST_CHECK(metronome::test::poll_until([&] { return calls.load() == 1; }, std::chrono::seconds(10)));
      BOOST_CHECK(metronome::test::poll_until([&] { return tracked::live.load() == live_before; }, std::chrono::seconds(10)));
      BOOST_CHECK_EQUAL(calls.load(), 1);
    }
  }
}

BOOST_AUTO_TEST_CASE(schedule_throws_bad_alloc_with_nothing_queued) {
  scheduled_thread_pool pool(1);
  std::atomic<int> runs{0};
  const long live_before = tracked::live.load();
  int failures = for_each_failure(
      [&] {
        auto h = pool.schedule(tracked(&runs), 1h);
        BOOST_CHECK(!h.is_done());
        BOOST_CHECK(h.cancel());
      },
      [&] {
        BOOST_CHECK_EQUAL(pool.stats().delayed_queued, 0u);
        BOOST_CHECK_EQUAL(tracked::live.load(), live_before);
      });
  BOOST_TEST_MESSAGE("schedule met " << failures << " injected failures");
  // The heap's storage fails at least once; the node too when it comes from operator
  // new (the node cache off), not from the node cache's mapped chunks.
  const bool nodes_from_operator_new = metronome::detail::node_cache_mapped_bytes() == 0;
  BOOST_CHECK_GE(failures, nodes_from_operator_new ? 2 : 1);
  BOOST_CHECK_EQUAL(tracked::live.load(), live_before);
  BOOST_CHECK_EQUAL(runs.load(), 0);
  BOOST_CHECK_EQUAL(pool.submit([] { return 3; }).get(), 3);
}

BOOST_AUTO_TEST_CASE(submit_and_periodic_calls_throw_bad_alloc_with_nothing_queued) {
  scheduled_thread_pool pool(1);
  std::atomic<int> runs{0};
  const long live_before = tracked::live.load();
  auto unchanged = [&] {
    BOOST_CHECK_EQUAL(pool.stats().delayed_queued, 0u);
    BOOST_CHECK_EQUAL(tracked::live.load(), live_before);
  };
  for_each_failure([&] { pool.submit(tracked(&runs)).wait(); }, unchanged);
  for_each_failure([&] { pool.schedule_at_fixed_rate(tracked(&runs), 1h, 1h).cancel(); }, unchanged);
  for_each_failure([&] { pool.schedule_with_fixed_delay(tracked(&runs), 1h, 1h).cancel(); }, unchanged);
  BOOST_CHECK_EQUAL(tracked::live.load(), live_before);
}

BOOST_AUTO_TEST_CASE(serial_schedule_throws_bad_alloc_with_nothing_queued) {
  scheduled_thread_pool pool(1);
  auto serial = metronome::make_serial_executor(pool);
  std::atomic<int> runs{0};
  const long live_before = tracked::live.load();
  for_each_failure([&] { serial.schedule(tracked(&runs), 1h).cancel(); },
                   [&] {
                     BOOST_CHECK_EQUAL(pool.stats().delayed_queued, 0u);
                     BOOST_CHECK_EQUAL(tracked::live.load(), live_before);
                   });
  auto h = serial.submit([] { return 5; });
  BOOST_CHECK_EQUAL(h.get(), 5);
  BOOST_CHECK_EQUAL(tracked::live.load(), live_before);
}

BOOST_AUTO_TEST_CASE(a_pool_that_cannot_be_built_throws_and_leaves_nothing_running) {
  for_each_failure(
      [] {
        scheduled_thread_pool pool(2);
        pool.submit([] {}).wait();
      },
      [] {});
}

// A wheel whose construction fails leaves nothing attached to its pool or clock, and no
// tick: the pool's shutdown and the clock's advances after the failures touch no freed
// wheel (AddressSanitizer watches; a constructor that attached the wheel to its pool first
// and then failed to make its tick or to attach to the clock left the pool a dangling
// wheel - found by an outside reviewer).
BOOST_AUTO_TEST_CASE(a_wheel_that_cannot_be_built_leaves_nothing_attached) {
  const long ticks_before = metronome::detail::wheel_ticks_alive();
  manual_clock clk;
  metronome::pool_options po;
  po.threads = 1;
  po.time_source = &clk;
  scheduled_thread_pool on_clock(po);
  scheduled_thread_pool real(1);
  metronome::wheel_options o;
  o.time_source = &clk;
  const int real_allocations = for_each_failure([&] { metronome::wheel_timer wheel(real); },
                                                [&] { BOOST_CHECK_EQUAL(metronome::detail::wheel_ticks_alive(), ticks_before); });
  const int clock_allocations = for_each_failure([&] { metronome::wheel_timer wheel(on_clock, o); }, [] {});
  BOOST_TEST_MESSAGE("a wheel's construction met " << real_allocations << " / " << clock_allocations
                                                   << " injected failures");
  BOOST_CHECK_EQUAL(metronome::detail::wheel_ticks_alive(), ticks_before);
  clk.advance(10ms); // tells the listeners: none may be a freed wheel
  real.shutdown();   // tells its wheels: none may be a freed one
  on_clock.shutdown();
  real.join();
  on_clock.join();
}

// stop() with no memory for the list it returns: it throws bad_alloc with the wheel
// stopped all the same - every timeout cancelled and its callable destroyed, none lost or
// fired - and a later stop() on another thread returns (nothing allocates before the
// wheel is stopped: one that threw half-way left the next waiting for it for good).
BOOST_AUTO_TEST_CASE(a_stop_without_memory_for_its_list_stops_the_wheel_all_the_same) {
  scheduled_thread_pool pool(1);
  std::atomic<int> runs{0};
  const long live_before = tracked::live.load();
  for (long n = 0; n < 2; ++n) { // the core's list, then the handles' list
    metronome::wheel_timer wheel(pool);
    std::vector<metronome::wheel_timer::timeout> handles;
    for (int k = 0; k < 3; ++k) handles.push_back(wheel.schedule(tracked(&runs), 1h));
    bool threw = false;
    fail_countdown = n;
    try {
      (void)wheel.stop();
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    fail_countdown = -1;
    BOOST_CHECK_MESSAGE(threw, "allocation " << n << " failed and stop() went through");
    for (auto& h : handles) BOOST_CHECK(h.is_cancelled());
    BOOST_CHECK_EQUAL(wheel.pending(), 0u);
    BOOST_CHECK_EQUAL(tracked::live.load(), live_before);
    std::size_t again = 99;
    BOOST_CHECK(metronome::test::finishes_within(10s, [&] {
      std::thread other([&] { again = wheel.stop().size(); });
      other.join();
    }));
    BOOST_CHECK_EQUAL(again, 0u);
  }
  BOOST_CHECK_EQUAL(runs.load(), 0);
}

BOOST_AUTO_TEST_CASE(wheel_schedule_throws_bad_alloc_with_nothing_queued) {
  manual_clock clk;
  scheduled_thread_pool pool(1);
  metronome::wheel_options o;
  o.time_source = &clk;
  metronome::wheel_timer wheel(pool, o);
  std::atomic<int> runs{0};
  const long live_before = tracked::live.load();
  for_each_failure(
      [&] {
        auto t = wheel.schedule(tracked(&runs), 1h);
        BOOST_CHECK(t.cancel());
      },
      [&] {
        BOOST_CHECK_EQUAL(wheel.pending(), 0u);
        BOOST_CHECK_EQUAL(tracked::live.load(), live_before);
      });
  // The wheel still works after the failures.
  auto t = wheel.schedule(tracked(&runs), 5ms);
  clk.advance(10ms);
  BOOST_CHECK(t.is_expired());
  pool.join();
  BOOST_CHECK_EQUAL(runs.load(), 1);
  BOOST_CHECK_EQUAL(tracked::live.load(), live_before);
}

// A wheel wait whose set-up fails throws bad_alloc with the handler destroyed and never
// called; one that goes through completes once, and its cancellation allocates nothing
// on the cancelling thread (the pool's worker delivers operation_aborted with the wait's
// own node). (Each wait gets its own cancellation signal, kept until its completion has
// run, as Asio requires.)
BOOST_AUTO_TEST_CASE(wheel_async_wait_throws_bad_alloc_with_nothing_queued) {
  manual_clock clk;
  scheduled_thread_pool pool(1);
  metronome::wheel_options o;
  o.time_source = &clk;
  metronome::wheel_timer wheel(pool, o);
  std::atomic<int> calls{0};
  std::atomic<int> aborted{0};
  std::atomic<int> runs{0};
  const long live_before = tracked::live.load();
  std::deque<metronome::net::cancellation_signal> signals;
  auto drain = [&] { pool.submit([] {}).wait(); }; // one worker: what was posted before has run
  for_each_failure(
      [&] {
        auto& sig = signals.emplace_back();
        wheel.async_wait(1h, metronome::net::bind_cancellation_slot(
                                 sig.slot(), [&, t = tracked(&runs)](metronome::error_code ec) {
                                   ++calls;
                                   if (ec == metronome::net::error::operation_aborted) ++aborted;
                                 }));
        sig.emit(metronome::net::cancellation_type::terminal);
      },
      [&] {
        drain();
        BOOST_CHECK_EQUAL(calls.load(), 0);
        BOOST_CHECK_EQUAL(wheel.pending(), 0u);
        BOOST_CHECK_EQUAL(tracked::live.load(), live_before);
      });
  drain();
  BOOST_CHECK_EQUAL(calls.load(), 1); // the call that went through, cancelled
  BOOST_CHECK_EQUAL(aborted.load(), 1);
  BOOST_CHECK_EQUAL(runs.load(), 0);
  BOOST_CHECK_EQUAL(tracked::live.load(), live_before);
}

BOOST_AUTO_TEST_CASE(async_delay_throws_bad_alloc_with_nothing_queued) {
  manual_clock clk;
  metronome::pool_options po;
  po.time_source = &clk;
  scheduled_thread_pool pool(po);
  std::atomic<int> calls{0};
  std::atomic<int> runs{0};
  const long live_before = tracked::live.load();
  for_each_failure(
      [&] {
        metronome::async_delay(pool.get_executor(), 1h,
                               [&, t = tracked(&runs)](metronome::error_code) { ++calls; });
      },
      [&] {
        BOOST_CHECK_EQUAL(pool.stats().delayed_queued, 0u);
        BOOST_CHECK_EQUAL(tracked::live.load(), live_before);
      });
  BOOST_CHECK_EQUAL(pool.stats().delayed_queued, 1u);
  clk.advance(1h);
  pool.submit([] {}).wait(); // the completion, dispatched by the worker, has run
  BOOST_CHECK_EQUAL(calls.load(), 1);
  BOOST_CHECK_EQUAL(tracked::live.load(), live_before);
}

// An allocator that goes through the (failing) operator new: Asio allocates the
// operations it queues through the handler's, where its default allocator calls malloc.
template <class T>
struct new_allocator {
  using value_type = T;
  new_allocator() = default;
  template <class U>
  new_allocator(const new_allocator<U>&) noexcept {} // NOLINT(google-explicit-constructor)
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T))); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p); }
  friend bool operator==(const new_allocator&, const new_allocator&) noexcept { return true; }
};

// async_delay on a terminated pool completes with operation_aborted on the handler's
// executor; out of memory for that post it threw nothing and lost the handler.
BOOST_AUTO_TEST_CASE(async_delay_on_a_terminated_pool_throws_bad_alloc_or_completes_once) {
  scheduled_thread_pool pool(1);
  pool.shutdown();
  pool.join();
  metronome::net::io_context io;
  std::atomic<int> calls{0}, runs{0};
  const long live_before = tracked::live.load();
  for_each_failure(
      [&] {
        metronome::async_delay(
            pool, 1ms,
            metronome::net::bind_executor(
                io, metronome::net::bind_allocator(new_allocator<int>(),
                                                [&, t = tracked(&runs)](metronome::error_code ec) {
                                                  if (ec == metronome::net::error::operation_aborted) ++calls;
                                                })));
      },
      [&] {
        io.poll();
        io.restart();
        BOOST_CHECK_EQUAL(calls.load(), 0);
        BOOST_CHECK_EQUAL(tracked::live.load(), live_before);
      });
  io.run();
  BOOST_CHECK_EQUAL(calls.load(), 1);
  BOOST_CHECK_EQUAL(tracked::live.load(), live_before);
}

BOOST_AUTO_TEST_SUITE_END()
