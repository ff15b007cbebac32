// reactor_adapter alone, over a bare execution_context (no pool): Asio's scheduler
// installed with no thread of its own, run only by the role's holder
// (src/reactor_adapter.hpp).
#include "reactor_adapter.hpp"

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

using namespace metronome::detail;
using mclock = metronome::clock;
namespace net = metronome::net;

namespace {

// An executor of the context that runs what it is given at once, on the calling thread:
// a completion runs on the thread that runs the reactor.
class inline_executor {
public:
  explicit inline_executor(net::execution_context& ctx) noexcept : ctx_(&ctx) {}
  net::execution_context& query(net::execution::context_t) const noexcept { return *ctx_; }
  static constexpr net::execution::blocking_t query(net::execution::blocking_t) noexcept {
    return net::execution::blocking.possibly;
  }
  template <class F>
  void execute(F&& f) const {
    std::forward<F>(f)();
  }
  friend bool operator==(const inline_executor& a, const inline_executor& b) noexcept { return a.ctx_ == b.ctx_; }
  friend bool operator!=(const inline_executor& a, const inline_executor& b) noexcept { return a.ctx_ != b.ctx_; }

private:
  net::execution_context* ctx_;
};
using timer_type = net::basic_waitable_timer<mclock, net::wait_traits<mclock>, inline_executor>;

class test_timer final : public reactor_timer {
public:
  explicit test_timer(net::execution_context& ctx) : timer_(inline_executor(ctx)) {}
  void arm(mclock::time_point due) override {
    ++arms;
    if (due == mclock::time_point::max()) {
      timer_.cancel();
      return;
    }
    timer_.expires_at(due);
    timer_.async_wait([](const metronome::error_code&) {});
  }
  static inline int arms = 0;

private:
  timer_type timer_;
};

reactor_adapter* installed = nullptr; // the adapter the scheduler's get_task reaches
asio_internals::scheduler_task* get_task(net::execution_context& ctx) {
  asio_internals::scheduler_task& reactor = reactor_adapter::reactor_of(ctx);
  installed->attach(reactor);
  return &reactor;
}
std::unique_ptr<reactor_timer> make_timer(net::execution_context& ctx) { return std::make_unique<test_timer>(ctx); }

// A context with the adapter installed in it (the adapter goes first: its timer is the
// context's).
struct fixture {
  net::execution_context ctx;
  reactor_adapter adapter;
  int holder = 0; // an identity for the role
  int other = 0;
  fixture() {
    installed = &adapter;
    test_timer::arms = 0;
    adapter.install(ctx, 1, &get_task, &make_timer);
  }
  ~fixture() { adapter.release(); }
};

} // namespace

BOOST_FIXTURE_TEST_SUITE(reactor_adapter_suite, fixture)

// The reactor appears with the first I/O object made on the context, not before.
BOOST_AUTO_TEST_CASE(the_first_io_object_attaches_the_reactor) {
  BOOST_TEST(!adapter.exists());
  timer_type t(inline_executor{ctx});
  BOOST_TEST(adapter.exists());
}

// The role is one holder at a time, seen without the mutex through held().
BOOST_AUTO_TEST_CASE(the_role_has_one_holder) {
  BOOST_TEST(adapter.holder() == nullptr);
  BOOST_TEST(!adapter.held());
  adapter.take(&holder);
  BOOST_TEST(adapter.holder() == &holder);
  BOOST_TEST(adapter.held());
  adapter.leave();
  BOOST_TEST(adapter.holder() == nullptr);
  BOOST_TEST(!adapter.held());
}

// Like Asio's wait_one (and a condition variable), a wait may end early with nothing run
// (the reactor's own wake-ups); its callers wait again. The tests loop the same way.

// A wait with a due time ends by the adapter's timer, armed once for that due time
// however often the holder waits again; a wait for the same due time after it fired arms
// the timer again rather than waiting for ever.
BOOST_AUTO_TEST_CASE(a_wait_ends_at_its_due_time_and_the_timer_is_armed_again_after_it_fired) {
  timer_type io(inline_executor{ctx}); // the reactor exists
  adapter.take(&holder);
  const mclock::time_point due = mclock::now() + std::chrono::milliseconds(20);
  do adapter.wait(due);
  while (mclock::now() < due);
  BOOST_TEST(test_timer::arms == 1);
  adapter.wait(due); // already passed: returns (armed again)
  BOOST_TEST(test_timer::arms == 2);
  adapter.leave();
}

// An I/O completion ends a wait with nothing timed, and runs there, on the holder.
BOOST_AUTO_TEST_CASE(an_io_completion_ends_the_wait_and_runs_on_the_holder) {
  timer_type io(inline_executor{ctx});
  std::atomic<bool> ran{false};
  std::thread::id ran_on;
  io.expires_after(std::chrono::milliseconds(5));
  io.async_wait([&](const metronome::error_code& ec) {
    BOOST_TEST(!ec);
    ran_on = std::this_thread::get_id();
    ran = true;
  });
  adapter.take(&holder);
  while (!ran) adapter.wait(mclock::time_point::max());
  BOOST_TEST((ran_on == std::this_thread::get_id()));
  BOOST_TEST(test_timer::arms == 0); // nothing to time: no timer made
  adapter.leave();
}

// An interrupt by another thread ends the holder's wait with nothing timed, also one made
// before the wait began (edge-triggered): without it the holder would wait for ever (the
// test would time out). First an I/O completion is awaited, which uses up the reactor's
// own wake-ups, so that the holder's wait then has nothing else to end it.
BOOST_AUTO_TEST_CASE(an_interrupt_by_another_thread_ends_the_wait) {
  timer_type io(inline_executor{ctx});
  std::atomic<bool> ran{false};
  io.expires_after(std::chrono::milliseconds(1));
  io.async_wait([&](const metronome::error_code&) { ran = true; });
  adapter.take(&holder);
  while (!ran) adapter.wait(mclock::time_point::max());
  std::atomic<bool> waiting{false};
  std::atomic<int> waits{0};
  std::thread h([&] {
    waiting = true;
    waiting.notify_one();
    adapter.wait(mclock::time_point::max());
    waits = 1;
    waits.notify_one();
    adapter.wait(mclock::time_point::max());
    waits = 2;
  });
  waiting.wait(false);
  adapter.interrupt_unless(&other); // before or during the holder's first wait
  waits.wait(0);
  adapter.interrupt_unless(&other); // before or during its second
  h.join(); // (the check: it returns)
  BOOST_TEST(waits.load() == 2);
  adapter.leave();
}

// A completion handler's exception leaves wait(); the timer's state is unknown then, so
// the next wait arms it again.
BOOST_AUTO_TEST_CASE(a_handlers_exception_leaves_the_wait_and_the_next_wait_rearms) {
  timer_type io(inline_executor{ctx});
  io.expires_after(std::chrono::milliseconds(1));
  io.async_wait([](const metronome::error_code&) { throw std::runtime_error("handler"); });
  adapter.take(&holder);
  const mclock::time_point due = mclock::now() + std::chrono::milliseconds(40);
  bool threw = false;
  while (!threw && mclock::now() < due) {
    try {
      adapter.wait(due);
    } catch (const std::runtime_error&) {
      threw = true;
    }
  }
  BOOST_TEST(threw);
  const int arms = test_timer::arms;
  adapter.wait(due);
  BOOST_TEST(test_timer::arms == arms + 1);
  adapter.leave();
}

// poll() runs what is ready without blocking, and a busy worker's poll falls due
// poll_interval after the reactor last ran, and never while the role is held.
BOOST_AUTO_TEST_CASE(poll_runs_what_is_ready_and_falls_due_after_the_interval) {
  timer_type io(inline_executor{ctx});
  bool ran = false;
  io.expires_at(mclock::now() - std::chrono::seconds(1)); // expired
  io.async_wait([&](const metronome::error_code&) { ran = true; });
  BOOST_TEST(adapter.poll_due(mclock::now().time_since_epoch().count())); // never ran
  const mclock::rep before = mclock::now().time_since_epoch().count();
  adapter.take(&holder);
  BOOST_TEST(!adapter.poll_due(before + reactor_adapter::poll_interval)); // held
  for (int i = 0; i < 100 && !ran; ++i) adapter.poll(); // the reactor finds it (its first poll may only drain its wake-up)
  adapter.leave();
  BOOST_TEST(ran);
  const mclock::rep after = mclock::now().time_since_epoch().count();
  BOOST_TEST(!adapter.poll_due(before + reactor_adapter::poll_interval - 1));
  BOOST_TEST(adapter.poll_due(after + reactor_adapter::poll_interval));
}

BOOST_AUTO_TEST_SUITE_END()
