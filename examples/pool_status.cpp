// A live one-line status of a busy pool: stats() carries the counters and two
// histograms, printable with operator<<: queue wait (typed tasks, and Asio posts - one in
// 64 of each thread's timed, weighing 64) and lateness (delayed and periodic tasks,
// async_delay waits, wheel timeouts on the pool).
// A status task on the pool itself prints a line every 40 ms, five times, then the
// program shuts the pool down (about 200 ms in all).
#include <metronome/metronome.hpp>

#include <metronome/net.hpp> // the Asio metronome was built with (examples build with both); your code includes its own, e.g. <boost/asio.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <iostream>
#include <vector>

using namespace std::chrono_literals;

int main() {
  metronome::scheduled_thread_pool pool(metronome::pool_options::fixed(2));

  // The load: a stream of short tasks and Asio posts, a few periodic tasks, many small
  // delays and async_delay waits.
  std::atomic<long> work{0};
  auto busy = [&work] {
    for (int i = 0; i < 2000; ++i) work.fetch_add(1, std::memory_order_relaxed);
  };
  std::vector<metronome::scheduled_future<void>> periodic;
  for (int i = 0; i < 4; ++i) periodic.push_back(pool.schedule_at_fixed_rate(busy, 0ms, 5ms));
  auto feeder = pool.schedule_with_fixed_delay(
      [&] {
        for (int i = 0; i < 200; ++i) pool.submit(busy);
        for (int i = 0; i < 128; ++i) metronome::net::post(pool, busy);
        for (int i = 0; i < 50; ++i) pool.schedule(busy, std::chrono::microseconds(100 * i));
        metronome::async_delay(pool.get_executor(), 1ms, [busy](metronome::error_code) { busy(); });
      },
      0ms, 2ms);

  // The status line, printed from the pool by a fixed-rate task.
  std::promise<void> done;
  int lines = 0;
  auto status = pool.schedule_at_fixed_rate(
      [&] {
        std::cout << "status: " << pool.stats() << '\n';
        if (++lines == 5) done.set_value();
      },
      40ms, 40ms);
  done.get_future().wait();

  status.cancel();
  feeder.cancel();
  for (auto& p : periodic) p.cancel();
  pool.shutdown();
  pool.join();
  const auto s = pool.stats();
  std::cout << "final:  " << s << '\n';
  return s.queue_wait.total() > 0 && s.lateness.total() > 0 ? 0 : 1;
}
