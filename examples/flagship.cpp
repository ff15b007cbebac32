// The flagship example: one-shot, fixed-rate and fixed-delay tasks, a cancel, and
// Asio posting on a metronome pool.
#include <metronome/metronome.hpp>

#include <metronome/net.hpp> // the Asio metronome was built with (examples build with both); your code includes its own, e.g. <boost/asio.hpp>

#include <atomic>
#include <chrono>
#include <iostream>

using namespace std::chrono_literals;

int main() {
  metronome::scheduled_thread_pool pool(2);
  const auto start = metronome::clock::now();
  auto ms = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(metronome::clock::now() - start).count();
  };

  // A one-shot task with a result.
  auto answer = pool.schedule([] { return 42; }, 50ms);

  // A fixed-rate task: every 20 ms on a fixed grid.
  std::atomic<int> ticks{0};
  auto rate = pool.schedule_at_fixed_rate([&] { ++ticks; }, 0ms, 20ms);

  // A fixed-delay task: 30 ms after the end of each run.
  std::atomic<int> polls{0};
  auto poll = pool.schedule_with_fixed_delay([&] { ++polls; }, 10ms, 30ms);

  // A task cancelled before it runs: cancel() says it won.
  auto never = pool.schedule([] { std::cout << "never printed\n"; }, 1h);
  std::cout << "[" << ms() << " ms] cancel far-future task: " << std::boolalpha << never.cancel() << "\n";

  // Plain Asio posting onto the pool.
  std::atomic<bool> posted{false};
  metronome::net::post(pool, [&] { posted = true; });

  const int result = answer.get();
  std::cout << "[" << ms() << " ms] one-shot result: " << result << "\n";
  auto stop = pool.schedule(
      [&] {
        rate.cancel();
        poll.cancel();
      },
      200ms);
  stop.get();
  std::cout << "[" << ms() << " ms] fixed-rate ran " << ticks << " times, fixed-delay ran " << polls
            << " times, post ran: " << posted << "\n";
  std::cout << "cancelled handle: is_cancelled=" << never.is_cancelled() << "\n";
  pool.shutdown();
  pool.join();
  auto s = pool.stats();
  std::cout << "completed=" << s.completed << " delayed_queued=" << s.delayed_queued << "\n";
  return ticks > 0 && polls > 0 && posted ? 0 : 1;
}
