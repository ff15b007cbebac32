// A periodic reporter with a clean shutdown: workers post jobs to a pool while a
// fixed-rate task reports progress; at the end the reporter is cancelled, the pool shut
// down and joined, and one last report prints the final count.
#include <metronome/metronome.hpp>

#include <metronome/net.hpp> // the Asio metronome was built with (examples build with both); your code includes its own, e.g. <boost/asio.hpp>

#include <atomic>
#include <chrono>
#include <iostream>

using namespace std::chrono_literals;

int main() {
  metronome::scheduled_thread_pool pool(2);
  std::atomic<long> done{0};
  std::atomic<int> reports{0};

  auto report = [&] {
    const auto s = pool.stats();
    std::cout << "report " << ++reports << ": jobs done " << done.load() << ", ready " << s.ready_queued
              << ", delayed " << s.delayed_queued << "\n";
  };
  metronome::periodic_options spread;
  spread.jitter = 0.1; // several reporters on one pool would not all fire on the same tick
  auto reporter = pool.schedule_at_fixed_rate(report, 20ms, 20ms, spread);

  for (int i = 0; i < 200; ++i) {
    auto job = pool.schedule([&] { done.fetch_add(1); }, std::chrono::microseconds(500 * i));
    (void)job; // dropping a handle never cancels its task
  }

  while (done.load() < 200) std::this_thread::sleep_for(5ms);

  // Clean shutdown: stop the reporter (a run in progress completes), then the pool.
  reporter.cancel();
  reporter.wait();
  pool.shutdown();
  pool.join();
  report();
  std::cout << "terminated: " << std::boolalpha << pool.is_terminated() << "\n";
  return done.load() == 200 && reports.load() >= 2 && reporter.is_cancelled() ? 0 : 1;
}
