// Stress, oversubscribed: eight and more threads on one CPU, so that a thread waiting for
// another's hand-over to end is nearly always running while that other thread is not.
// The hand-overs that used to wait in a yield loop block now (std::atomic::wait, a
// condition variable), so progress does not depend on the scheduler picking the right
// thread: a bound task's dispatchers and settling cancel (with its executor's copy
// lock), a serial executor's dispose() against its drains' posts, a wheel's destructor
// against its hand-overs. Every round must end within a generous bound, and account for
// every task (run or cancelled, exactly once). Seeds as in common/stress_rounds.hpp.

#include "common/io_churn.hpp"
#include "common/stress_rounds.hpp"

#include METRONOME_NET_HEADER(io_context.hpp)
#include METRONOME_NET_HEADER(strand.hpp)

#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

namespace {

constexpr int extra_threads = 6; // beside the pool's 2 workers and the test thread

// Bound tasks on a strand over the pool, cancelled by six threads while they run: the
// cancel()s wait for dispatchers and settle, the workers wait for settling cancels.
bool bound_round(std::uint64_t seed, errors& errs) {
  std::mt19937_64 rng(seed);
  const int tasks = 100 + static_cast<int>(rng() % 200);
  std::atomic<int> ran{0};
  int cancelled = 0;
  std::vector<metronome::scheduled_future<void>> handles;
  const bool ended = finishes_within(std::chrono::seconds(60), [&] {
    scheduled_thread_pool pool(2);
    auto strand = net::make_strand(pool.get_executor());
    handles.reserve(static_cast<std::size_t>(tasks));
    for (int i = 0; i < tasks; ++i)
      handles.push_back(pool.schedule(net::bind_executor(strand, [&ran] { ran.fetch_add(1); }),
                                      std::chrono::microseconds(rng() % 50))); // runs and cancels race
    std::atomic<int> cancels{0};
    std::vector<std::thread> cancellers;
    for (int c = 0; c < extra_threads; ++c)
      cancellers.emplace_back([&, c] {
        for (int i = c; i < tasks; i += extra_threads)
          if (handles[static_cast<std::size_t>(i)].cancel()) cancels.fetch_add(1);
      });
    for (auto& t : cancellers) t.join();
    for (auto& h : handles) h.wait();
    cancelled = cancels.load();
    pool.join();
  });
  if (!ended) {
    errs.add("bound tasks: the round did not end within 60 s on one CPU");
    return false; // threads are still inside: stop here
  }
  if (ran.load() + cancelled != tasks)
    errs.add(fmt("bound tasks: %d ran + %d cancelled of %d", ran.load(), cancelled, tasks));
  return true;
}

// A counted task: run, or destroyed unrun, exactly once.
struct counted_task {
  std::atomic<int>* ran;
  std::atomic<int>* dropped;
  bool live = true;
  counted_task(std::atomic<int>* r, std::atomic<int>* d) : ran(r), dropped(d) {}
  counted_task(counted_task&& o) noexcept : ran(o.ran), dropped(o.dropped), live(std::exchange(o.live, false)) {}
  counted_task& operator=(counted_task&&) = delete;
  ~counted_task() {
    if (live) dropped->fetch_add(1);
  }
  void operator()() {
    if (std::exchange(live, false)) ran->fetch_add(1);
  }
};

// Six producers post to a serial executor over an io_context run by two threads while
// the test thread disposes of it (its last copy goes): dispose() waits for the drains'
// posts under way.
bool serial_round(std::uint64_t seed, errors& errs) {
  std::mt19937_64 rng(seed);
  const int per = 200 + static_cast<int>(rng() % 400);
  std::atomic<int> ran{0}, dropped{0}, refused{0};
  const bool ended = finishes_within(std::chrono::seconds(60), [&] {
    {
      net::io_context io;
      auto guard = net::make_work_guard(io);
      std::thread r1([&] { io.run(); }), r2([&] { io.run(); });
      {
        auto serial = std::make_unique<metronome::serial_executor<net::io_context::executor_type>>(
            make_serial_executor(io.get_executor()));
        std::vector<std::thread> producers;
        for (int p = 0; p < extra_threads; ++p)
          producers.emplace_back([&, copy = *serial] {
            for (int i = 0; i < per; ++i) {
              try {
                net::post(copy, counted_task(&ran, &dropped));
              } catch (const rejected_execution&) {
                refused.fetch_add(1);
              }
            }
          });
        serial.reset(); // the last producer to finish disposes of it, racing the drains' posts
        for (auto& t : producers) t.join();
      }
      guard.reset();
      r1.join();
      r2.join();
    } // the io_context destroys what it still holds
  });
  if (!ended) {
    errs.add("serial executor: the round did not end within 60 s on one CPU");
    return false;
  }
  const int posted = per * extra_threads;
  if (ran.load() + dropped.load() != posted)
    errs.add(fmt("serial executor: %d ran + %d dropped of %d posted (%d refused)", ran.load(), dropped.load(), posted,
                 refused.load()));
  return true;
}

// A wheel over the pool destroyed while its tick hands due timeouts over: the destructor
// waits for the hand-overs in flight.
bool wheel_round(std::uint64_t seed, errors& errs) {
  std::mt19937_64 rng(seed);
  const int timeouts = 200 + static_cast<int>(rng() % 400);
  std::atomic<int> ran{0};
  const bool ended = finishes_within(std::chrono::seconds(60), [&] {
    scheduled_thread_pool pool(2);
    {
      metronome::wheel_options o;
      o.tick = std::chrono::microseconds(100);
      metronome::wheel_timer wheel(pool, o);
      std::vector<std::thread> producers;
      for (int p = 0; p < extra_threads; ++p)
        producers.emplace_back([&, p] {
          for (int i = p; i < timeouts; i += extra_threads)
            wheel.schedule([&ran] { ran.fetch_add(1); }, std::chrono::microseconds(i % 300));
        });
      for (auto& t : producers) t.join();
    } // destroyed with timeouts due and handed over right now
    pool.join();
  });
  if (!ended) {
    errs.add("wheel: the round did not end within 60 s on one CPU");
    return false;
  }
  if (ran.load() > timeouts) errs.add(fmt("wheel: %d ran of %d", ran.load(), timeouts));
  return true;
}

} // namespace

BOOST_AUTO_TEST_SUITE(stress_oversubscribed)

BOOST_AUTO_TEST_CASE(bound_tasks_cancelled_on_one_cpu) {
  metronome::test::on_one_cpu one_cpu;
  run_rounds("bound tasks on one CPU", 31, budget(ms(1500, 3000), 2, 1000), bound_round);
}

BOOST_AUTO_TEST_CASE(a_serial_executor_disposed_under_its_producers_on_one_cpu) {
  metronome::test::on_one_cpu one_cpu;
  run_rounds("serial dispose on one CPU", 32, budget(ms(1500, 3000), 2, 1000), serial_round);
}

BOOST_AUTO_TEST_CASE(a_wheel_destroyed_while_it_hands_over_on_one_cpu) {
  metronome::test::on_one_cpu one_cpu;
  run_rounds("wheel destroyed on one CPU", 33, budget(ms(1500, 3000), 2, 1000), wheel_round);
}

BOOST_AUTO_TEST_SUITE_END()
