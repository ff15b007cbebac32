// Debounce and throttle of a stream of events, each on a serial executor: its tasks run
// one at a time, so the state below needs no lock. Time is a manual clock, so the run is
// deterministic (and instant): the program steps it 10 ms at a time, delivers the events
// due at each step, prints what each shaper emitted and when, and checks the result.
//
// debounce(200 ms): emit the latest event once the stream has been quiet for 200 ms.
//   Each event pushes the pending emission back with scheduled_future::reset() - the
//   delayed task is re-keyed in place, nothing allocated - and schedules a new one only
//   when the old one has already fallen due.
// throttle(100 ms): emit the first event at once, then at most one per 100 ms window:
//   the latest event seen during a window is emitted when it closes (leading + trailing).
#include <metronome/metronome.hpp>

#include <metronome/net.hpp> // the Asio metronome was built with (examples build with both); your code includes its own, e.g. <boost/asio.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <optional>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using serial_type = metronome::serial_executor<metronome::scheduled_thread_pool::executor_type>;

struct emission {
  long at_ms;
  int value;
  friend bool operator==(const emission&, const emission&) = default;
};

class debouncer {
public:
  debouncer(serial_type ex, metronome::clock::duration quiet, std::function<void(int)> emit)
      : ex_(std::move(ex)), quiet_(quiet), emit_(std::move(emit)) {}

  // On the serial executor.
  void on_event(int v) {
    latest_ = v;
    if (timer_.reset(quiet_)) return; // still waiting: pushed back, in place
    // Fired already (or never armed): arm a new one. A task of the old timer that is
    // due but has not run yet sees a newer generation and does nothing.
    timer_ = ex_.schedule(
        [this, gen = ++generation_] {
          if (gen == generation_) emit_(latest_);
        },
        quiet_);
  }

private:
  serial_type ex_;
  metronome::clock::duration quiet_;
  std::function<void(int)> emit_;
  metronome::scheduled_future<void> timer_;
  int latest_ = 0;
  std::uint64_t generation_ = 0;
};

class throttler {
public:
  throttler(serial_type ex, metronome::clock::duration window, std::function<void(int)> emit)
      : ex_(std::move(ex)), window_(window), emit_(std::move(emit)) {}

  // On the serial executor.
  void on_event(int v) {
    if (!window_open_) {
      emit_(v);
      open_window();
    } else {
      pending_ = v;
    }
  }

private:
  void open_window() {
    window_open_ = true;
    ex_.schedule([this] { close_window(); }, window_);
  }
  void close_window() {
    if (pending_) {
      emit_(*std::exchange(pending_, std::nullopt));
      open_window();
    } else {
      window_open_ = false;
    }
  }

  serial_type ex_;
  metronome::clock::duration window_;
  std::function<void(int)> emit_;
  bool window_open_ = false;
  std::optional<int> pending_;
};

int main() {
  metronome::manual_clock clock;
  metronome::pool_options o;
  o.time_source = &clock;
  metronome::scheduled_thread_pool pool(o);
  auto serial = metronome::make_serial_executor(pool.get_executor());
  const auto start = clock.now();
  auto now_ms = [&] { return static_cast<long>((clock.now() - start) / 1ms); };

  std::vector<emission> debounced, throttled;
  debouncer debounce(serial, 200ms, [&](int v) { debounced.push_back({now_ms(), v}); });
  throttler throttle(serial, 100ms, [&](int v) { throttled.push_back({now_ms(), v}); });

  // Event times in ms: a burst, a pair, a lone event, then a steady stream.
  const std::vector<long> events = {0, 40, 80, 120, 160, 500, 520, 900, 1200, 1250, 1300, 1350,
                                    1400, 1450, 1500, 1550, 1600};
  std::size_t next = 0;
  for (long t = 0; t <= 2000; t += 10) {
    if (t > 0) clock.advance(10ms); // due timers join the serial queue before the events
    for (; next < events.size() && events[next] == t; ++next) {
      const int value = static_cast<int>(next) + 1;
      metronome::net::post(serial, [&, value] {
        debounce.on_event(value);
        throttle.on_event(value);
      });
    }
    serial.submit([] {}).get(); // everything of this step has run
  }

  auto print = [](const char* name, const std::vector<emission>& v) {
    std::cout << name << ':';
    for (auto& e : v) std::cout << ' ' << e.value << "@" << e.at_ms << "ms";
    std::cout << '\n';
  };
  std::cout << "events:  ";
  for (std::size_t i = 0; i < events.size(); ++i) std::cout << ' ' << i + 1 << "@" << events[i] << "ms";
  std::cout << '\n';
  print("debounce(200ms)", debounced);
  print("throttle(100ms)", throttled);

  const std::vector<emission> want_debounced = {{360, 5}, {720, 7}, {1100, 8}, {1800, 17}};
  const std::vector<emission> want_throttled = {{0, 1},    {100, 3},   {200, 5},   {500, 6},
                                                {600, 7},  {900, 8},   {1200, 9},  {1300, 10},
                                                {1400, 12}, {1500, 14}, {1600, 16}, {1700, 17}};
  serial.dispose();
  pool.shutdown();
  pool.join();
  const bool ok = debounced == want_debounced && throttled == want_throttled;
  std::cout << (ok ? "as expected\n" : "UNEXPECTED\n");
  return ok ? 0 : 1;
}
