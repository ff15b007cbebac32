// Timing inside an Asio context that is not a metronome pool: the context's own
// timing service (detail/timing_service.hpp), driven by the context's threads.
#include <metronome/detail/timing_service.hpp>

#include <metronome/async_delay.hpp>
#include <metronome/cancel_after.hpp>
#include <metronome/interval.hpp>
#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>
#include <metronome/serial_executor.hpp>
#include <metronome/wheel_timer.hpp>

#include "common/hooks.hpp"
#include "common/threads.hpp"
#include "common/poll_until.hpp"

#include <metronome/detail/asio.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace net = metronome::net;
using metronome::test::process_threads;
using namespace std::chrono_literals;
using metronome::error_code;
using metronome::async_delay;
using steady = metronome::clock;

BOOST_AUTO_TEST_SUITE(timing_service)

BOOST_AUTO_TEST_CASE(waits_on_an_io_context_complete_in_due_order_on_its_thread_and_start_no_thread) {
  net::io_context io;
  const std::size_t before = process_threads();
  const auto start = steady::now();
  std::vector<int> order;
  std::set<std::thread::id> where;
  // Each wait's due time lies between the clock read before its call and the one after
  // (plus its delay): a thread preempted between two calls moves them, so the order is
  // checked against these bounds, not against i.
  steady::time_point earliest[6], latest[6];
  for (int i = 5; i >= 1; --i) {
    earliest[i] = steady::now() + i * 3ms;
    async_delay(io, i * 3ms, [&, i](error_code ec) {
      BOOST_TEST(!ec);
      order.push_back(i);
      where.insert(std::this_thread::get_id());
    });
    latest[i] = steady::now() + i * 3ms;
  }
  BOOST_TEST(metronome::test::settled_threads(before) == before);
  io.run(); // returns once every wait completed: nothing else keeps it going
  BOOST_TEST((steady::now() - start >= 15ms));
  BOOST_REQUIRE(order.size() == 5u);
  BOOST_TEST((std::set<int>(order.begin(), order.end()) == std::set<int>{1, 2, 3, 4, 5}));
  for (std::size_t k = 1; k < order.size(); ++k) // never one completed before a wait surely due earlier
    BOOST_TEST(!(latest[order[k]] < earliest[order[k - 1]]), "wait " << order[k] << " after " << order[k - 1]);
  BOOST_TEST((where == std::set<std::thread::id>{std::this_thread::get_id()}));
  BOOST_TEST(metronome::test::settled_threads(before) == before);
}

namespace {

// An executor of a bare execution_context (neither an io_context nor a thread_pool) that
// queues what it is given, for the test to run.
struct queued_work {
  virtual ~queued_work() = default;
  virtual void run() = 0;
};
template <class F>
struct queued_function final : queued_work {
  F f;
  explicit queued_function(F x) : f(std::move(x)) {}
  void run() override { f(); }
};
class queue_executor {
public:
  queue_executor(net::execution_context& ctx, std::vector<std::unique_ptr<queued_work>>& q) noexcept
      : ctx_(&ctx), q_(&q) {}
  net::execution_context& query(net::execution::context_t) const noexcept { return *ctx_; }
  static constexpr net::execution::blocking_t query(net::execution::blocking_t) noexcept {
    return net::execution::blocking.never;
  }
  template <class F>
  void execute(F&& f) const {
    q_->push_back(std::make_unique<queued_function<std::decay_t<F>>>(std::forward<F>(f)));
  }
  friend bool operator==(const queue_executor& a, const queue_executor& b) noexcept { return a.q_ == b.q_; }
  friend bool operator!=(const queue_executor& a, const queue_executor& b) noexcept { return a.q_ != b.q_; }

private:
  net::execution_context* ctx_;
  std::vector<std::unique_ptr<queued_work>>* q_;
};

} // namespace

// The context's timing host makes its Asio timer for the first timed work only. On a bare
// execution_context, Asio gives a timer's reactor a scheduler with a thread of its own;
// a wheel on a manual clock never arms the host's timer, so it must start no thread (it
// started one as the wheel was built, when the host made its timer at once).
BOOST_AUTO_TEST_CASE(a_wheel_on_a_manual_clock_over_a_bare_context_starts_no_thread) {
  net::execution_context ctx;
  std::vector<std::unique_ptr<queued_work>> queue;
  const std::size_t before = process_threads();
  metronome::manual_clock clock;
  metronome::wheel_options o;
  o.time_source = &clock;
  {
    metronome::wheel_timer wheel(queue_executor(ctx, queue), o);
    int ran = 0;
    wheel.schedule([&ran] { ++ran; }, 5ms);
    BOOST_TEST(metronome::test::settled_threads(before) == before);
    clock.advance(5ms);
    BOOST_REQUIRE(queue.size() == 1u); // handed to the executor by the advance
    auto work = std::move(queue);
    for (auto& w : work) w->run();
    BOOST_TEST(ran == 1);
  }
  BOOST_TEST(metronome::test::settled_threads(before) == before);
}

BOOST_AUTO_TEST_CASE(a_strand_and_an_any_io_executor_over_an_io_context_time_on_its_thread) {
  net::io_context io;
  const std::size_t before = process_threads();
  auto strand = net::make_strand(io);
  net::any_io_executor any = strand;
  int done = 0;
  async_delay(strand, 1ms, [&](error_code ec) {
    BOOST_TEST(!ec);
    BOOST_TEST(strand.running_in_this_thread());
    ++done;
  });
  async_delay(any, 2ms, [&](error_code ec) {
    BOOST_TEST(!ec);
    BOOST_TEST(strand.running_in_this_thread());
    ++done;
  });
  io.run();
  BOOST_TEST(done == 2);
  BOOST_TEST(metronome::test::settled_threads(before) == before);
}

BOOST_AUTO_TEST_CASE(a_cancelled_wait_lets_run_return_at_once) {
  net::io_context io;
  net::cancellation_signal sig;
  std::optional<error_code> got;
  async_delay(io, 1h, net::bind_cancellation_slot(sig.slot(), [&](error_code ec) { got = ec; }));
  net::post(io, [&] { sig.emit(net::cancellation_type::terminal); });
  const auto start = steady::now();
  io.run(); // the hour-long timer is disarmed with the heap empty
  BOOST_TEST((steady::now() - start < 10s));
  BOOST_REQUIRE(got.has_value());
  BOOST_TEST((*got == net::error::operation_aborted));
}

BOOST_AUTO_TEST_CASE(cancel_after_and_interval_over_an_io_context_run_on_its_thread) {
  net::io_context io;
  const std::size_t before = process_threads();
  std::optional<error_code> timed_out;
  async_delay(io, 1h, metronome::cancel_after(2ms, [&](error_code ec) { timed_out = ec; }));
  metronome::interval ticks(io.get_executor(), 2ms);
  int ticked = 0;
  std::function<void(error_code, steady::time_point)> on_tick = [&](error_code ec, steady::time_point) {
    BOOST_TEST(!ec);
    if (++ticked < 3) ticks.async_tick(on_tick);
  };
  ticks.async_tick(on_tick);
  io.run();
  BOOST_REQUIRE(timed_out.has_value());
  BOOST_TEST((*timed_out == net::error::operation_aborted));
  BOOST_TEST(ticked == 3);
  BOOST_TEST(metronome::test::settled_threads(before) == before);
}

// Asio's rule for a context's shutdown: what its services hold is destroyed unrun.
BOOST_AUTO_TEST_CASE(destroying_the_context_destroys_its_pending_waits_unrun) {
  auto token = std::make_shared<int>(0);
  bool called = false;
  {
    net::io_context io;
    async_delay(io, 1h, [&called, token](error_code) { called = true; });
    async_delay(io, 0ms, [&called, token](error_code) { called = true; }); // ready, never run
    BOOST_TEST(token.use_count() == 3);
  }
  BOOST_TEST(!called);
  BOOST_TEST(token.use_count() == 1);
}

// Without dispose(): the context's shutdown cancels the serial executor's delayed work
// (its handles report it), and the serial executor outlives the context safely.
BOOST_AUTO_TEST_CASE(a_thread_pool_destroyed_under_a_serial_executor_with_delayed_work_is_safe) {
  std::optional<net::thread_pool> tp(std::in_place, 1);
  auto serial = metronome::make_serial_executor(tp->get_executor());
  auto far = serial.schedule([] {}, 1h);
  std::atomic<int> ran{0};
  auto soon = serial.schedule([&] { ran.fetch_add(1); }, 1ms);
  BOOST_TEST(metronome::test::poll_until([&] { return ran.load() == 1; }));
  tp.reset();
  BOOST_TEST(far.is_cancelled());
  BOOST_TEST(soon.is_done());
  BOOST_TEST(!soon.is_cancelled());
}

BOOST_AUTO_TEST_CASE(a_thread_pool_times_its_waits_on_its_own_threads_and_accounts_for_each) {
  const std::size_t before = process_threads();
  constexpr int n = 4000;
  std::atomic<int> ok{0}, aborted{0};
  std::mutex m;
  std::set<std::thread::id> where;
  {
    net::thread_pool tp(2);
    auto ex = tp.get_executor();
    std::vector<std::thread> producers;
    for (int p = 0; p < 2; ++p)
      producers.emplace_back([&, p] {
        std::minstd_rand rng(p + 1);
        for (int i = 0; i < n / 2; ++i) {
          const auto d = std::chrono::microseconds(rng() % 3000);
          auto h = [&](error_code ec) {
            (ec ? aborted : ok).fetch_add(1);
            std::lock_guard lk(m);
            where.insert(std::this_thread::get_id());
          };
          if (i % 3 == 0)
            async_delay(ex, 1h, metronome::cancel_after(d, h)); // ends aborted
          else
            async_delay(ex, d, h);
        }
      });
    for (auto& t : producers) t.join();
    BOOST_TEST(process_threads() == before + 2); // the pool's two threads, nothing else
    tp.wait();
  }
  BOOST_TEST(ok.load() + aborted.load() == n);
  BOOST_TEST(aborted.load() == (n / 2 + 2) / 3 * 2);
  BOOST_TEST(where.size() <= 2u);
}

BOOST_AUTO_TEST_CASE(a_wheel_over_an_io_context_ticks_on_its_thread_and_starts_no_thread) {
  net::io_context io;
  const std::size_t before = process_threads();
  metronome::wheel_options o;
  o.tick = 1ms;
  metronome::wheel_timer wheel(io.get_executor(), o);
  BOOST_TEST(metronome::test::settled_threads(before) == before); // no wheel thread
  std::vector<int> order;
  std::set<std::thread::id> where;
  const auto start = steady::now();
  auto far = wheel.schedule([&] { order.push_back(9); }, 1h);
  for (int i = 3; i >= 1; --i)
    wheel.schedule([&, i] {
      order.push_back(i);
      where.insert(std::this_thread::get_id());
      if (i == 3) far.cancel(); // then nothing is left: run() returns
    }, i * 4ms);
  io.run();
  BOOST_TEST((steady::now() - start >= 12ms));
  BOOST_TEST((order == std::vector<int>{1, 2, 3}));
  BOOST_TEST((where == std::set<std::thread::id>{std::this_thread::get_id()}));
  BOOST_TEST(wheel.pending() == 0u);
  BOOST_TEST(metronome::test::settled_threads(before) == before);
}

#if defined(METRONOME_TEST_HOOKS)

using metronome::detail::hook_point;
using metronome::test::hook_stop;

// A serial executor over an io_context schedules a periodic task bound to a strand over a
// metronome pool; its run on the pool's worker is cancelled while it runs. The worker
// ends the task (its handle is done) and is held before it lets go of the io_context's
// timing engine (in transit). The io_context's destruction, which the handle being done
// permits, must wait for that worker: else it frees the engine under it (ASan).
BOOST_AUTO_TEST_CASE(the_host_s_shutdown_waits_for_a_bound_periodic_run_still_leaving_the_engine) {
  metronome::scheduled_thread_pool pool(1);
  auto io = std::make_unique<net::io_context>();
  std::optional guard = net::make_work_guard(*io);
  std::thread runner([&] { io->run(); });
  std::optional serial = metronome::make_serial_executor(io->get_executor());
  std::optional strand = net::make_strand(pool.get_executor());
  metronome::test::gate in_run;
  metronome::test::counter runs;
  hook_stop stop(hook_point::bound_run_before_leaving, true);
  auto h = serial->schedule_at_fixed_rate(net::bind_executor(*strand,
                                                             [&] {
                                                               runs.add();
                                                               in_run.wait();
                                                             }),
                                          0ms, 1h);
  BOOST_REQUIRE(runs.wait_for_at_least(1)); // the first run, on the pool's worker
  BOOST_TEST(h.cancel());                   // during the run: no run after it
  in_run.open();
  BOOST_REQUIRE(stop.arrived()); // ended, still in transit in the io_context's engine
  BOOST_TEST((h.wait_for(10s) == std::future_status::ready));
  BOOST_TEST(h.is_cancelled());
  strand.reset();
  serial.reset();
  guard.reset();
  runner.join();
  BOOST_TEST(metronome::test::destruction_waits(io, [&] { stop.release(); }));
  BOOST_TEST(runs.value() == 1);
}

// The drive protocol: a request made while a drive is past its look at the core (state
// running) sets rerun, and the drive looks again before it goes idle.
BOOST_AUTO_TEST_CASE(work_pushed_while_a_drive_is_about_to_go_idle_is_driven) {
  net::io_context io;
  auto guard = net::make_work_guard(io);
  hook_stop stop(hook_point::hosted_drive_before_idle);
  std::atomic<int> done{0};
  std::thread runner([&] {
    hook_stop::arm_this_thread();
    io.run();
    hook_stop::disarm_this_thread();
  });
  async_delay(io, 0ms, [&](error_code) { done.fetch_add(1); });
  BOOST_REQUIRE(stop.arrived()); // the drive ran the first wait and is about to go idle
  BOOST_TEST(done.load() == 1);
  async_delay(io, 0ms, [&](error_code) { done.fetch_add(1); }); // its request finds the drive running
  stop.release();
  BOOST_TEST(metronome::test::poll_until([&] { return done.load() == 2; }, 10s));
  guard.reset();
  runner.join();
}

// The hosted invariant: a head earlier than what the host times asks for a drive, even
// while a drive has read the old head and not yet armed the timer for it.
BOOST_AUTO_TEST_CASE(an_earlier_head_pushed_before_the_timer_is_armed_is_timed) {
  net::io_context io;
  std::optional<error_code> far_result;
  net::cancellation_signal far_cancel;
  async_delay(io, 1h, net::bind_cancellation_slot(far_cancel.slot(), [&](error_code ec) { far_result = ec; }));
  hook_stop stop(hook_point::hosted_drive_before_arm);
  std::atomic<bool> near_done{false};
  std::thread runner([&] {
    hook_stop::arm_this_thread();
    io.run();
    hook_stop::disarm_this_thread();
  });
  BOOST_REQUIRE(stop.arrived()); // the drive read the hour-long head, the timer not yet armed
  const auto pushed = steady::now();
  steady::time_point fired;
  error_code near_result = net::error::operation_aborted;
  async_delay(io, 20ms, [&](error_code ec) { // on the runner: no Boost.Test check here
    near_result = ec;
    fired = steady::now();
    near_done.store(true);
    far_cancel.emit(net::cancellation_type::terminal); // on io's thread, as Asio asks
  });
  stop.release();
  BOOST_TEST(metronome::test::poll_until([&] { return near_done.load(); }, 10s));
  runner.join(); // the far wait cancelled: run() returns
  BOOST_TEST(!near_result);
  BOOST_TEST((fired - pushed >= 20ms));
  BOOST_REQUIRE(far_result.has_value());
  BOOST_TEST((*far_result == net::error::operation_aborted));
}

// The hosted tick invariant: a timeout pushed into the inbox (the tick holds the wheel's
// mutex) while the tick chooses its deadline is seen by the tick's last look, and the
// tick is armed for it - not for the hour-long timeout.
namespace {
struct tick_stop {
  metronome::wheel_timer* wheel = nullptr;
  std::atomic<bool> done{false};
  metronome::test::gate gate;
  metronome::test::counter stopped;
};
std::atomic<tick_stop*> current_tick_stop{nullptr};
void stop_when_only_the_far_timeout_is_left(hook_point p) {
  tick_stop* s = current_tick_stop.load();
  // (pending() reads counters only: safe while the wheel's mutex is held)
  if (s && p == hook_point::wheel_timer_before_sleep && s->wheel->pending() == 1 && !s->done.exchange(true)) {
    s->stopped.add();
    s->gate.wait();
  }
}
} // namespace

BOOST_AUTO_TEST_CASE(a_timeout_pushed_while_the_hosted_tick_chooses_its_deadline_fires_on_time) {
  net::io_context io;
  metronome::wheel_options o;
  o.tick = 1ms;
  metronome::wheel_timer wheel(io.get_executor(), o);
  tick_stop stop;
  stop.wheel = &wheel;
  auto far = wheel.schedule([] {}, 1h);
  wheel.schedule([] {}, 1ms); // the tick runs for it, then chooses its next deadline: far
  current_tick_stop.store(&stop);
  metronome::detail::test_hook.store(&stop_when_only_the_far_timeout_is_left);
  std::thread runner([&] { io.run(); });
  BOOST_REQUIRE(stop.stopped.wait_for_at_least(1)); // holding the mutex, `until` chosen, not published
  const auto pushed = steady::now();
  std::atomic<bool> near_fired{false};
  steady::time_point fired;
  wheel.schedule([&] {
    fired = steady::now();
    near_fired.store(true);
    far.cancel(); // nothing left: run() returns
  }, 5ms); // the mutex is held: into the inbox
  stop.gate.open();
  BOOST_TEST(metronome::test::poll_until([&] { return near_fired.load(); }, 10s));
  runner.join();
  metronome::detail::test_hook.store(nullptr);
  current_tick_stop.store(nullptr);
  BOOST_TEST((fired - pushed >= 5ms));
}

#endif

BOOST_AUTO_TEST_SUITE_END()
