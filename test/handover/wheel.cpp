// Hand-overs of the wheel timer, with one thread stopped exactly at the hand-over point
// (the library's test hooks): producers and the wheel's tick choosing its sleep, and a cancel
// racing the executor's settlement of a due timeout. docs/design.md states each invariant.
#include <metronome/detail/test_hooks.hpp>
#include "wheel_engine.hpp"

#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>
#include <metronome/wheel_timer.hpp>

#include "common/accounting.hpp"
#include "common/hooks.hpp"
#include "common/latch_task.hpp"
#include "common/manual_pool.hpp"
#include "common/poll_until.hpp"

#include <metronome/detail/asio.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

using namespace std::chrono_literals;
using metronome::detail::hook_point;
using metronome::manual_clock;
using metronome::scheduled_thread_pool;
using metronome::test::counter;
using metronome::test::gate;
using metronome::test::hook_stop;
using metronome::test::poll_until;

BOOST_AUTO_TEST_SUITE(handover_suite)

// A manual clock has no timer thread. A producer computed its deadline and is held before
// the wheel's mutex while another thread moves the clock past that deadline: the
// timeout's tick has come when it arrives, so it fires at once (it went to the inbox,
// which nobody drains until the clock moves again: it never fired).
BOOST_AUTO_TEST_CASE(a_timeout_whose_deadline_the_manual_clock_passes_before_it_is_linked_fires_without_another_advance) {
  manual_clock clock;
  scheduled_thread_pool pool(1);
  metronome::wheel_options o;
  o.time_source = &clock;
  metronome::wheel_timer wheel(pool, o);
  hook_stop stop(hook_point::wheel_producer_before_lock);
  std::atomic<int> fired{0};
  std::thread producer([&] {
    hook_stop::arm_this_thread();
    wheel.schedule([&] { ++fired; }, 5ms);
  });
  BOOST_REQUIRE(stop.arrived());
  clock.advance(10ms);
  stop.release();
  producer.join();
  BOOST_CHECK(poll_until([&] { return fired.load() == 1; }, 10s));
  BOOST_CHECK_EQUAL(wheel.pending(), 0u);
}

// An advance tells its listeners with the clock's mutex let go around each call. Here it
// is held just before it calls the first of two wheels while another thread destroys that
// wheel: the destructor must wait for the call (else the advance calls a destroyed wheel),
// and the wheel's leaving the list must not make the advance skip the second one.
BOOST_AUTO_TEST_CASE(a_wheel_destroyed_while_an_advance_is_about_to_tell_it_waits_and_the_next_is_told) {
  manual_clock clock;
  scheduled_thread_pool pool(1);
  metronome::wheel_options o;
  o.time_source = &clock;
  auto first = std::make_unique<metronome::wheel_timer>(pool, o);
  metronome::wheel_timer second(pool, o);
  std::atomic<int> first_ran{0}, second_ran{0};
  first->schedule([&] { ++first_ran; }, 5ms);
  second.schedule([&] { ++second_ran; }, 5ms);
  hook_stop stop(hook_point::clock_before_tell);
  std::thread advancer([&] {
    hook_stop::arm_this_thread();
    clock.advance(10ms);
  });
  BOOST_REQUIRE(stop.arrived()); // about to call `first`, the clock's mutex free
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    first.reset();
    destroyed = true;
  });
  BOOST_REQUIRE(poll_until([&] { return clock.detach_waiters() == 1; }, 10s)); // waits for the call
  BOOST_CHECK(!destroyed.load());
  stop.release();
  advancer.join();
  destroyer.join();
  BOOST_CHECK(destroyed.load());
  BOOST_CHECK(poll_until([&] { return second_ran.load() == 1; }, 10s)); // told after `first` left
  BOOST_CHECK_EQUAL(first_ran.load(), 0); // stopped before the call: its timeout went with it
  BOOST_CHECK_EQUAL(clock.detach_waiters(), 0);
}

// A manual clock's advance hands a wheel's due timeouts to its pool with the wheel's
// mutex let go (counted, as a tick's hand-over). Here it is held there, and the wheel is
// stopped on another thread: stop() must wait for the hand-over, because once it returns
// the pool may be destroyed (docs/semantics.md: "A stopped wheel touches its pool no
// more"), and the advance would push into a freed pool. (Found by a reviewer of the
// clock's telling, which no longer holds the clock's mutex that kept the pool's
// destructor waiting.)
BOOST_AUTO_TEST_CASE(a_wheel_stopped_while_an_advance_hands_its_timeouts_over_waits_for_it) {
  manual_clock clock;
  metronome::pool_options po;
  po.time_source = &clock;
  auto pool = std::make_unique<scheduled_thread_pool>(po);
  metronome::wheel_options o;
  o.time_source = &clock;
  metronome::wheel_timer wheel(*pool, o);
  std::atomic<int> ran{0};
  wheel.schedule([&] { ++ran; }, 5ms);
  hook_stop stop(hook_point::wheel_tick_after_unlock);
  std::thread advancer([&] {
    hook_stop::arm_this_thread();
    clock.advance(10ms);
  });
  BOOST_REQUIRE(stop.arrived()); // the due timeout taken out of the wheel, not handed over yet
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    (void)wheel.stop();
    stopped = true;
  });
  BOOST_CHECK(!poll_until([&] { return stopped.load(); }, 50ms)); // waits for the hand-over
  stop.release();
  advancer.join();
  stopper.join();
  pool.reset(); // the pool may go once stop() returned: the timeout was pushed before
  BOOST_CHECK_EQUAL(ran.load(), 1);
}

// Concurrent stops ("All members are safe to call concurrently"; wheel_core::stop()'s
// invariant): the stop() that stopped the wheel is held after delivering what it took and
// before it detaches the wheel from its pool. A second stop() on another thread must not
// return meanwhile: its caller may destroy the pool once it has (it returned at once, and
// the first then used the destroyed pool).
BOOST_AUTO_TEST_CASE(a_second_stop_waits_until_the_first_has_let_go_of_the_pool) {
  auto pool = std::make_unique<scheduled_thread_pool>(1);
  auto wheel = std::make_unique<metronome::wheel_timer>(*pool);
  auto pending = wheel->schedule([] {}, 10s);
  hook_stop stop(hook_point::wheel_stop_before_detach);
  std::vector<metronome::wheel_timer::timeout> taken;
  std::thread first([&] {
    hook_stop::arm_this_thread();
    taken = wheel->stop();
  });
  BOOST_REQUIRE(stop.arrived()); // stopped, what it took delivered; still attached to the pool
  std::atomic<bool> returned{false};
  std::atomic<std::size_t> second_took{99};
  std::thread second([&] {
    second_took = wheel->stop().size(); // idempotent: the first took everything
    returned = true;
  });
  BOOST_CHECK(!poll_until([&] { return returned.load(); }, 50ms)); // waits for the first
  stop.release();
  first.join();
  second.join();
  BOOST_CHECK(returned.load());
  BOOST_CHECK_EQUAL(second_took.load(), 0u);
  BOOST_CHECK_EQUAL(taken.size(), 1u);
  BOOST_CHECK(pending.is_cancelled());
  pool.reset(); // the pool may go once any stop() returned
  wheel.reset();
}

// Two threads each inside a hand-over of the same wheel, each dropping a timeout whose
// destructor stops the wheel (their executor refuses them: a shut-down pool's). A stop()
// from inside one of its wheel's hand-overs does not wait for the other threads' (its own
// push is still in flight, so its caller cannot let the pool go yet anyway): here each
// would wait for the other's, for good. The first returns while the second thread is held
// inside its hand-over; the second, released, returns too. A later stop() on the first
// thread, outside any hand-over, is no re-entry: it waits for the other thread's hand-over
// (it returned at once, seeing its own thread as the stopper).
BOOST_AUTO_TEST_CASE(two_timeouts_dropped_in_two_hand_overs_may_each_stop_their_wheel) {
  struct stops_on_destroy {
    metronome::wheel_timer* w;
    std::atomic<int>* stops;
    bool armed = true;
    stops_on_destroy(metronome::wheel_timer* x, std::atomic<int>* n) : w(x), stops(n) {}
    stops_on_destroy(stops_on_destroy&& o) noexcept : w(o.w), stops(o.stops) { o.armed = false; }
    stops_on_destroy& operator=(stops_on_destroy&&) = delete;
    ~stops_on_destroy() {
      if (!armed) return;
      (void)w->stop();
      stops->fetch_add(1);
    }
    void operator()() const {}
  };
  struct state {
    manual_clock clock;
    scheduled_thread_pool refusing{1};
    std::unique_ptr<metronome::wheel_timer> wheel;
    metronome::wheel_timer::timeout second; // reset(0) hands it over
    std::atomic<int> stops{0}, ended{0};
    std::atomic<bool> advanced{false}, again{false};
  };
  auto sp = std::make_shared<state>(); // leaked if the two stops wait for each other
  state& st = *sp;
  st.refusing.shutdown(); // its executor drops what it is given, on the posting thread
  metronome::wheel_options o;
  o.time_source = &st.clock;
  st.wheel = std::make_unique<metronome::wheel_timer>(metronome::net::any_io_executor(st.refusing.get_executor()), o);
  st.wheel->schedule(stops_on_destroy(st.wheel.get(), &st.stops), 5ms);              // due on the advance
  st.second = st.wheel->schedule(stops_on_destroy(st.wheel.get(), &st.stops), 1h);
  hook_stop stop(hook_point::wheel_handover_after_unlock);
  std::thread b([&st] {
    hook_stop::arm_this_thread();
    (void)st.second.reset(0ms);
    st.ended.fetch_add(1);
  });
  BOOST_REQUIRE(stop.arrived()); // inside its hand-over; the timeout not handed over yet
  std::thread a([&st] {
    st.clock.advance(10ms); // its hand-over drops the first timeout
    st.advanced = true;
    (void)st.wheel->stop(); // outside any hand-over now
    st.again = true;
    st.ended.fetch_add(1);
  });
  BOOST_CHECK(poll_until([&] { return st.stops.load() == 1; }, 10s)); // returned, the other still inside
  BOOST_CHECK(poll_until([&] { return st.advanced.load(); }, 10s));
  BOOST_CHECK(!poll_until([&] { return st.again.load(); }, 50ms)); // waits for the other's hand-over
  stop.release();
  if (!poll_until([&] { return st.ended.load() == 2; }, 20s)) {
    BOOST_ERROR("the two stop() calls wait for each other");
    a.detach();
    b.detach();
    metronome::test::leak(sp);
    return;
  }
  a.join();
  b.join();
  BOOST_CHECK_EQUAL(st.stops.load(), 2);
  st.wheel.reset();
}

// A timeout due now goes straight from schedule() to the pool, a hand-over without the
// wheel's mutex (wheel_engine::enter). It is counted: a stop() on another thread while the
// producer is held inside the pool's push waits for it, so that the pool may go once
// stop() returned (it returned at once, and the producer then used the destroyed pool:
// ASan, found by an outside reviewer).
BOOST_AUTO_TEST_CASE(a_stop_waits_for_a_timeout_due_now_being_pushed) {
  auto pool = std::make_unique<scheduled_thread_pool>(1);
  auto wheel = std::make_unique<metronome::wheel_timer>(*pool);
  std::atomic<int> ran{0};
  hook_stop stop(hook_point::producer_after_push);
  std::thread producer([&] {
    hook_stop::arm_this_thread();
    wheel->schedule([&] { ran.fetch_add(1); }, 0ms);
  });
  BOOST_REQUIRE(stop.arrived()); // in the pool's queue; the push not finished
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    (void)wheel->stop();
    stopped = true;
  });
  BOOST_CHECK(!poll_until([&] { return stopped.load(); }, 50ms)); // waits for the push
  stop.release();
  producer.join();
  stopper.join();
  pool.reset(); // runs what is ready: the timeout
  BOOST_CHECK_EQUAL(ran.load(), 1);
  wheel.reset();
}

// async_wait reads the wheel's pool, counts the wait on it and inserts it (refused by a
// stopped wheel: pushed to that pool, aborted). A stop() on another thread while the
// waiting thread holds the pool it read waits for that use to end (wheel_core::pool_use),
// so that the pool may go once stop() returned.
BOOST_AUTO_TEST_CASE(a_stop_waits_for_an_async_wait_that_read_the_pool) {
  auto pool = std::make_unique<scheduled_thread_pool>(1);
  auto wheel = std::make_unique<metronome::wheel_timer>(*pool);
  std::atomic<int> completions{0};
  metronome::error_code result;
  hook_stop stop(hook_point::wheel_wait_read_pool);
  std::thread waiter([&] {
    hook_stop::arm_this_thread();
    wheel->async_wait(1h, [&](metronome::error_code ec) {
      result = ec;
      completions.fetch_add(1);
    });
  });
  BOOST_REQUIRE(stop.arrived()); // read the pool; the wait not yet counted on it nor inserted
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    (void)wheel->stop();
    stopped = true;
  });
  BOOST_CHECK(!poll_until([&] { return stopped.load(); }, 50ms)); // waits for the wait's use of the pool
  stop.release();
  waiter.join();
  stopper.join();
  pool.reset(); // the aborted wait completes on the pool
  BOOST_CHECK_EQUAL(completions.load(), 1);
  BOOST_CHECK(result == metronome::net::error::operation_aborted);
  wheel.reset();
}

// Wheel inbox and the tick's sleep, tick second: the pool worker turning the wheel (its
// tick, which a first timeout brought) is held (with the
// wheel's mutex) just before it publishes how long it will sleep; a producer, finding
// the mutex taken, pushes its timeout onto the inbox and sees no sleeper to wake. The
// timer must drain the inbox after publishing, so the timeout fires on time — long
// before a far timeout that would otherwise be the timer's next wake-up.
BOOST_AUTO_TEST_CASE(a_timeout_pushed_while_the_timer_thread_prepares_to_sleep_fires_on_time) {
  scheduled_thread_pool pool(1);
  metronome::wheel_timer wheel(pool);
  hook_stop stop(hook_point::wheel_timer_before_sleep, true);
  std::atomic<bool> far_fired{false};
  auto kick = wheel.schedule([] {}, 1ms); // its tick: the pool's worker turns the wheel soon
  auto far = wheel.schedule([&] { far_fired = true; }, 30s);
  BOOST_REQUIRE(stop.arrived()); // the worker turning the wheel holds the mutex
  std::atomic<bool> near_fired{false};
  std::atomic<bool> far_was_pending{false};
  auto near = wheel.schedule(
      [&] {
        far_was_pending = !far.is_expired();
        near_fired = true;
      },
      10ms); // the mutex is taken: into the inbox, nobody woken
  stop.release();
  BOOST_CHECK(poll_until([&] { return near_fired.load(); }, 10s));
  BOOST_CHECK(far_was_pending.load());
  BOOST_CHECK(far.cancel());
}

// The same hand-over, producer second: the producer found the mutex taken and is held
// before its push while the timer publishes its sleep and drains an empty inbox; then the
// producer pushes, reads the published deadline and wakes the timer.
BOOST_AUTO_TEST_CASE(a_producer_that_pushes_after_the_timer_went_to_sleep_wakes_it) {
  scheduled_thread_pool pool(1);
  metronome::wheel_timer wheel(pool);
  metronome::test::hook_stops stops{{hook_point::wheel_timer_before_sleep, true},
                                    {hook_point::wheel_producer_before_push, false}};
  auto kick = wheel.schedule([] {}, 1ms); // its tick: the pool's worker turns the wheel soon
  auto far = wheel.schedule([] {}, 30s);
  BOOST_REQUIRE(stops.arrived(hook_point::wheel_timer_before_sleep));
  std::atomic<bool> near_fired{false};
  std::atomic<bool> far_was_pending{false};
  std::thread producer([&] {
    hook_stop::arm_this_thread();
    wheel.schedule(
        [&] {
          far_was_pending = !far.is_expired();
          near_fired = true;
        },
        10ms);
  });
  BOOST_REQUIRE(stops.arrived(hook_point::wheel_producer_before_push));
  stops.release(hook_point::wheel_timer_before_sleep); // the timer publishes 30 s, drains nothing, sleeps
  BOOST_CHECK(!poll_until([&] { return near_fired.load(); }, 50ms)); // not pushed yet
  stops.release(hook_point::wheel_producer_before_push);
  producer.join();
  BOOST_CHECK(poll_until([&] { return near_fired.load(); }, 10s));
  BOOST_CHECK(far_was_pending.load());
  BOOST_CHECK(far.cancel());
}

// Producer stopped after its push (before it reads the timer's deadline) while the
// timer drains the inbox and sleeps: the timer, second, linked it; it fires while the
// producer is still held.
BOOST_AUTO_TEST_CASE(a_producer_held_after_its_push_does_not_hold_up_its_timeout) {
  scheduled_thread_pool pool(1);
  metronome::wheel_timer wheel(pool);
  metronome::test::hook_stops stops{{hook_point::wheel_timer_before_sleep, true},
                                    {hook_point::wheel_producer_after_push, false}};
  auto kick = wheel.schedule([] {}, 1ms); // its tick: the pool's worker turns the wheel soon
  auto far = wheel.schedule([] {}, 30s);
  BOOST_REQUIRE(stops.arrived(hook_point::wheel_timer_before_sleep));
  std::atomic<bool> near_fired{false};
  std::thread producer([&] {
    hook_stop::arm_this_thread();
    wheel.schedule([&] { near_fired = true; }, 10ms);
  });
  BOOST_REQUIRE(stops.arrived(hook_point::wheel_producer_after_push));
  stops.release(hook_point::wheel_timer_before_sleep);
  BOOST_CHECK(poll_until([&] { return near_fired.load(); }, 10s));
  stops.release(hook_point::wheel_producer_after_push);
  producer.join();
  BOOST_CHECK(far.cancel());
}

// The wheel's last timeout is cancelled while a producer that found the wheel's mutex
// taken pushes a later one onto the inbox. The canceller is stopped after it saw the
// wheel empty and withdrew the tick, before it resets sleeping_until_ (holding the mutex);
// the producer, released then, fails its try_lock, pushes, reads the tick's old deadline -
// not after its own, so it does not re-arm - and returns. The canceller must see the push
// and re-arm the tick: the later timeout fires (it waited in the inbox for ever: a raced
// P2300 stop over an io_context's wheel hung in CI on this).
BOOST_AUTO_TEST_CASE(a_timeout_pushed_while_a_cancel_withdraws_the_tick_fires) {
  scheduled_thread_pool pool(1);
  metronome::wheel_timer wheel(pool);
  auto first = wheel.schedule([] {}, 2s); // the tick armed for it
  metronome::test::hook_stops stops{{hook_point::wheel_cancel_after_withdraw, false},
                                    {hook_point::wheel_producer_before_lock, false}};
  std::atomic<bool> later_fired{false};
  std::thread producer([&] {
    hook_stop::arm_this_thread();
    wheel.schedule([&] { later_fired = true; }, 2200ms);
  });
  BOOST_REQUIRE(stops.arrived(hook_point::wheel_producer_before_lock));
  bool cancelled = false;
  std::thread canceller([&] {
    hook_stop::arm_this_thread();
    cancelled = first.cancel();
  });
  BOOST_REQUIRE(stops.arrived(hook_point::wheel_cancel_after_withdraw));
  stops.release(hook_point::wheel_producer_before_lock);
  producer.join(); // pushed onto the inbox; saw the tick armed for 2 s
  stops.release(hook_point::wheel_cancel_after_withdraw);
  canceller.join();
  BOOST_REQUIRE(cancelled);
  BOOST_CHECK_EQUAL(wheel.pending(), 1u);
  BOOST_CHECK(poll_until([&] { return later_fired.load(); }, 30s));
}

// A wheel wait due and queued on the pool (its only worker busy) is cancelled through its
// slot; the canceller is stopped right after it claimed the wait, before it delivers
// operation_aborted. Meanwhile the worker settles the queued node (its claim fails) and
// lets go of the queue's reference. The node must outlive that: the handler is neither
// destroyed unrun nor lost, and runs once with operation_aborted.
BOOST_AUTO_TEST_CASE(a_wheel_wait_cancelled_while_queued_outlives_the_worker_settling_it) {
  scheduled_thread_pool pool(1);
  manual_clock clk;
  metronome::wheel_options o;
  o.time_source = &clk;
  metronome::wheel_timer wheel(pool, o);
  metronome::net::io_context handler_ctx; // the handler runs here, after the canceller is done
  metronome::net::cancellation_signal sig;
  metronome::test::slot s;
  std::atomic<int> calls{0};
  metronome::error_code result;
  wheel.async_wait(10ms, metronome::net::bind_cancellation_slot(
                             sig.slot(), metronome::net::bind_executor(handler_ctx, [&, l = metronome::test::life(&s)](
                                                                                   metronome::error_code ec) {
                               result = ec;
                               calls.fetch_add(1);
                             })));
  gate release;
  counter started;
  BOOST_REQUIRE(metronome::test::occupy_worker(pool, release, started));
  clk.advance(10ms); // due: queued on the pool behind the busy worker
  hook_stop stop(hook_point::wheel_cancel_after_claim);
  std::thread canceller([&] {
    hook_stop::arm_this_thread();
    sig.emit(metronome::net::cancellation_type::terminal);
  });
  BOOST_REQUIRE(stop.arrived());
  release.open();
  // A task posted behind the wait runs after the worker settled it.
  counter behind;
  metronome::net::post(pool, [&] { behind.add(); });
  BOOST_REQUIRE(behind.wait_for_at_least(1));
  BOOST_CHECK_EQUAL(s.destroyed.load(), 0); // still owned by the operation
  BOOST_CHECK_EQUAL(calls.load(), 0);
  stop.release();
  canceller.join();
  handler_ctx.run();
  BOOST_CHECK_EQUAL(calls.load(), 1);
  BOOST_CHECK(result == metronome::net::error::operation_aborted);
  BOOST_CHECK_EQUAL(s.destroyed.load(), 1);
}

// The same race through a timeout's handle: the handle's cancel() wins and the timeout
// never runs, however the worker's settlement interleaves.
BOOST_AUTO_TEST_CASE(a_timeout_cancelled_while_queued_never_runs_when_the_worker_settles_it_first) {
  scheduled_thread_pool pool(1);
  manual_clock clk;
  metronome::wheel_options o;
  o.time_source = &clk;
  metronome::wheel_timer wheel(pool, o);
  metronome::test::slot s;
  auto t = wheel.schedule([&s, l = metronome::test::life(&s)] { s.ran.fetch_add(1); }, 10ms);
  gate release;
  counter started;
  BOOST_REQUIRE(metronome::test::occupy_worker(pool, release, started));
  clk.advance(10ms);
  BOOST_REQUIRE(t.is_expired());
  hook_stop stop(hook_point::wheel_cancel_after_claim);
  std::atomic<bool> won{false};
  std::thread canceller([&] {
    hook_stop::arm_this_thread();
    won = t.cancel();
  });
  BOOST_REQUIRE(stop.arrived());
  release.open();
  counter behind;
  metronome::net::post(pool, [&] { behind.add(); });
  BOOST_REQUIRE(behind.wait_for_at_least(1));
  stop.release();
  canceller.join();
  BOOST_CHECK(won.load());
  BOOST_CHECK(t.is_cancelled());
  BOOST_CHECK_EQUAL(s.ran.load(), 0);
  BOOST_CHECK_EQUAL(s.destroyed.load(), 1);
}


// A handle's hand-over, held between letting go of the wheel's mutex and handing its due
// timeout to the pool, while the wheel and then the pool are destroyed: the wheel's
// destructor waits for the hand-over (the pool must outlive the wheel, and the hand-over
// uses the pool), so the pool is still there when it is handed over, and the timeout runs
// once. Without the wait the hand-over reached into the destroyed pool.
BOOST_AUTO_TEST_CASE(a_hand_over_held_after_unlocking_keeps_the_wheel_s_destruction_waiting) {
  auto pool = std::make_unique<scheduled_thread_pool>(1);
  auto wheel = std::make_unique<metronome::wheel_timer>(*pool);
  metronome::test::slot s;
  auto t = wheel->schedule([&s, l = metronome::test::life(&s)] { s.ran.fetch_add(1); }, 1h);
  hook_stop stop(hook_point::wheel_handover_after_unlock);
  std::atomic<bool> reset{false};
  std::thread resetter([&] {
    hook_stop::arm_this_thread();
    reset = t.reset(0ms); // due at once: handed over with the mutex let go
  });
  BOOST_REQUIRE(stop.arrived());
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    wheel.reset();
    destroyed = true;
  });
  BOOST_CHECK(!poll_until([&] { return destroyed.load(); }, 100ms)); // waits for the hand-over
  stop.release();
  resetter.join();
  destroyer.join();
  pool.reset(); // runs what is ready
  BOOST_CHECK(reset.load());
  BOOST_CHECK_EQUAL(s.ran.load(), 1);
  BOOST_CHECK_EQUAL(s.destroyed.load(), 1);
}

// The wheel's pool shutting down against a wait's producer: the producer found the
// wheel's mutex taken (the worker running its tick holds it) and is held before its push while the
// pool's shutdown() aborts the wheel's waits (none pushed yet) and the wheel refuses
// waits from then on. The producer then pushes: it must see that the pool shut down and
// cancel its own wait, which completes with operation_aborted - not an hour later.
BOOST_AUTO_TEST_CASE(a_wait_pushed_after_the_pool_s_shutdown_aborted_the_wheel_s_waits_is_aborted) {
  scheduled_thread_pool pool(1);
  metronome::wheel_timer wheel(pool);
  metronome::test::hook_stops stops{{hook_point::wheel_timer_before_sleep, true},
                                    {hook_point::wheel_producer_before_push, false}};
  auto kick = wheel.schedule([] {}, 1ms); // its tick: the pool's worker turns the wheel soon
  auto far = wheel.schedule([] {}, 30s);
  BOOST_REQUIRE(stops.arrived(hook_point::wheel_timer_before_sleep)); // the tick holds the mutex
  std::atomic<int> calls{0};
  metronome::error_code result;
  std::thread producer([&] {
    hook_stop::arm_this_thread();
    wheel.async_wait(1h, [&](metronome::error_code ec) {
      result = ec;
      calls.fetch_add(1);
    });
  });
  BOOST_REQUIRE(stops.arrived(hook_point::wheel_producer_before_push));
  stops.release(hook_point::wheel_timer_before_sleep); // the timer sleeps, the mutex is free
  pool.shutdown(); // aborts the wheel's waits: none is in it yet
  stops.release(hook_point::wheel_producer_before_push);
  producer.join();
  BOOST_CHECK(poll_until([&] { return calls.load() == 1; }, 10s));
  BOOST_CHECK(result == metronome::net::error::operation_aborted);
  BOOST_CHECK(far.cancel());
  pool.join();
  BOOST_CHECK_EQUAL(calls.load(), 1);
}

// The tick hands due timeouts over with the wheel's mutex let go, and the wheel is
// destroyed on another thread meanwhile: the destructor waits for the hand-over (which
// reads nothing of the wheel), and the tick, back, finds the wheel gone and frees itself.
// (The tick read the wheel's executor there: a use after free, seen by ThreadSanitizer.)
BOOST_AUTO_TEST_CASE(a_wheel_destroyed_while_its_tick_hands_timeouts_over_waits_for_it) {
  scheduled_thread_pool pool(2);
  auto wheel = std::make_unique<metronome::wheel_timer>(pool);
  hook_stop stop(hook_point::wheel_tick_after_unlock, true);
  std::atomic<int> ran{0};
  wheel->schedule([&] { ran.fetch_add(1); }, 1ms);
  BOOST_REQUIRE(stop.arrived()); // a worker holds the due timeout, the wheel's mutex free
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    wheel.reset();
    destroyed = true;
  });
  BOOST_CHECK(!poll_until([&] { return destroyed.load(); }, 50ms)); // waits for the hand-over
  stop.release();
  destroyer.join();
  BOOST_CHECK(destroyed.load());
  BOOST_CHECK(poll_until([&] { return ran.load() == 1; }, 10s));
}

// The tick node is freed exactly once (wheel_tick.cpp). The destructor looks at the tick
// while it runs (its mutex let go, handing a timeout over): it lets go of the node
// without freeing it. The tick, taking the mutex again, finds the wheel stopped and no
// longer its own: it frees itself - before the wheel is even retired. Freed by the
// destructor too, the count of live ticks would drop while the tick still runs; freed by
// neither, it would never come back.
BOOST_AUTO_TEST_CASE(a_tick_running_when_its_wheel_is_destroyed_frees_itself_once) {
  const long before = metronome::detail::wheel_ticks_alive();
  scheduled_thread_pool pool(2);
  auto wheel = std::make_unique<metronome::wheel_timer>(pool);
  BOOST_CHECK_EQUAL(metronome::detail::wheel_ticks_alive(), before + 1);
  metronome::test::hook_stops stops{{hook_point::wheel_tick_after_unlock}, {hook_point::wheel_destroy_after_tick_look}};
  std::atomic<int> ran{0};
  wheel->schedule([&] { ran.fetch_add(1); }, 1ms);
  BOOST_REQUIRE(stops.arrived(hook_point::wheel_tick_after_unlock)); // the tick runs, the mutex free
  std::thread destroyer([&] { wheel.reset(); });
  BOOST_REQUIRE(stops.arrived(hook_point::wheel_destroy_after_tick_look)); // let go of the running tick
  BOOST_CHECK_EQUAL(metronome::detail::wheel_ticks_alive(), before + 1);
  stops.release(hook_point::wheel_tick_after_unlock);
  BOOST_CHECK(poll_until([&] { return metronome::detail::wheel_ticks_alive() == before; }, 10s));
  stops.release(hook_point::wheel_destroy_after_tick_look);
  destroyer.join();
  BOOST_CHECK_EQUAL(metronome::detail::wheel_ticks_alive(), before);
  BOOST_CHECK(poll_until([&] { return ran.load() == 1; }, 10s));
}

// A wheel destroyed while its tick walks the next tick's timeouts ahead (touch_next_tick,
// over 256 of them in one slot), held where the walk let go of the wheel's mutex between
// two groups. The destructor does not wait for the walk; the walk, taking the anchor's
// mutex again, finds the wheel retired and reads nothing more of it (it read the freed
// wheel: ASan, found by an outside reviewer); the tick frees itself once.
BOOST_AUTO_TEST_CASE(a_wheel_destroyed_while_its_tick_walks_ahead_is_not_read_again) {
  const long before = metronome::detail::wheel_ticks_alive();
  scheduled_thread_pool pool(1);
  auto wheel = std::make_unique<metronome::wheel_timer>(pool);
  auto token = std::make_shared<int>(0); // every callable holds a copy: all destroyed when unique
  hook_stop stop(hook_point::wheel_touch_after_unlock, true); // the pool's worker, turning the wheel
  for (int group = 0; group < 4; ++group) // adjacent ticks: the turn that fires one walks the next
    for (int k = 0; k < 1000; ++k) wheel->schedule([t = token] {}, 20ms + group * 1ms);
  BOOST_REQUIRE(stop.arrived());
  BOOST_REQUIRE(metronome::test::finishes_within(10s, [&] { wheel.reset(); })); // waits for no walk
  stop.release();
  BOOST_CHECK(poll_until([&] { return metronome::detail::wheel_ticks_alive() == before; }, 10s));
  BOOST_CHECK(poll_until([&] { return token.use_count() == 1; }, 10s)); // fired or destroyed unrun, each once
}

// A tick re-armed while its pool's last worker terminates. A timeout's reset() after
// shutdown() re-arms the tick (withdrawn from the heap, added again); the add passed the
// pool's termination check and is held before the pool's mutex while the last worker
// terminates (the withdrawn tick holds nothing). Refused under the mutex, the tick goes
// idle: the wheel fires nothing more, its timeout is destroyed unrun with it, and the
// tick is freed once.
BOOST_AUTO_TEST_CASE(a_tick_re_armed_while_its_pool_terminates_is_refused_and_freed_with_the_wheel) {
  const long ticks_before = metronome::detail::wheel_ticks_alive();
  {
    scheduled_thread_pool pool(1);
    auto wheel = std::make_unique<metronome::wheel_timer>(pool);
    std::atomic<int> runs{0};
    auto token = std::make_shared<int>(0);
    const std::weak_ptr<int> alive = token;
    auto timeout = wheel->schedule([&runs, t = std::move(token)] { runs.fetch_add(1); }, 1h);
    gate hold;
    metronome::net::post(pool, [&] { hold.wait(); }); // the only worker busy: no termination yet
    pool.shutdown();                               // the wheel keeps its timeout, the tick its place
    hook_stop stop(hook_point::wait_before_lock);
    std::thread resetter([&] {
      hook_stop::arm_this_thread();
      timeout.reset(1ms);
    });
    BOOST_REQUIRE(stop.arrived()); // the tick's add passed the check; the pool's mutex not taken
    hold.open();
    BOOST_REQUIRE(pool.await_termination(10s)); // the re-arm withdrew the tick: nothing holds the pool
    stop.release();
    resetter.join();
    BOOST_CHECK(!poll_until([&] { return runs.load() > 0; }, 50ms));
    BOOST_CHECK_EQUAL(wheel->pending(), 1u);
    BOOST_CHECK_EQUAL(pool.stats().delayed_queued, 0u);
    wheel.reset();
    BOOST_CHECK(alive.expired());
    BOOST_CHECK_EQUAL(runs.load(), 0);
    BOOST_CHECK(timeout.is_cancelled());
  }
  BOOST_CHECK_EQUAL(metronome::detail::wheel_ticks_alive(), ticks_before);
}

// A timeout's lateness is computed, as it starts on the pool, from its wheel's time base
// (start, tick) read without a lock, the anchor's generation checked before and after.
// The worker is held between reading the tick and the start while the wheel is destroyed
// and a new wheel, with another tick and a later start, takes over the anchor: the sample
// is dropped (the old tick with the new start would count a wrong lateness).
BOOST_AUTO_TEST_CASE(a_lateness_read_across_its_wheel_s_replacement_is_dropped) {
  manual_clock clk;
  scheduled_thread_pool pool(metronome::test::on_clock(clk));
  auto wheel_with_tick = [&](std::chrono::milliseconds tick) {
    metronome::wheel_options o;
    o.tick = tick;
    o.time_source = &clk;
    return std::make_unique<metronome::wheel_timer>(pool, o);
  };
  auto first = wheel_with_tick(1ms);
  pool.submit([] { hook_stop::arm_this_thread(); }).wait(); // its one worker stops
  counter fired;
  hook_stop stop(hook_point::wheel_lateness_between_reads);
  auto t = first->schedule([&] { fired.add(); }, 10ms);
  clk.advance(15ms);
  BOOST_REQUIRE(stop.arrived()); // generation checked, tick (1 ms) read
  first.reset();
  clk.advance(1s);
  auto second = wheel_with_tick(7ms); // the freed anchor, its start 1 s later
  stop.release();
  BOOST_REQUIRE(fired.wait_for_at_least(1));
  BOOST_CHECK(t.is_expired());
  BOOST_CHECK_EQUAL(pool.stats().lateness.total(), 0u);
}

BOOST_AUTO_TEST_SUITE_END()
