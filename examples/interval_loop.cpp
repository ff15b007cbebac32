// An interval loop in a coroutine: a fixed 20 ms grid (no drift), missed ticks skipped
// after a slow iteration, and a clean stop through cancel().
#include <metronome/metronome.hpp>

#include <metronome/net.hpp> // the Asio metronome was built with (examples build with both); your code includes its own, e.g. <boost/asio.hpp>

#include <chrono>
#include <future>
#include <iostream>
#include <thread>

namespace net = metronome::net;
using namespace std::chrono_literals;

int main() {
  metronome::scheduled_thread_pool pool(1);
  std::promise<int> done;
  net::co_spawn(
      pool,
      [&]() -> net::awaitable<void> {
        metronome::interval it(pool.get_executor(), 20ms, metronome::missed_tick::skip);
        const auto start = it.next_tick();
        int ticks = 0;
        for (; ticks < 6; ++ticks) {
          const auto due = co_await it.async_tick(net::use_awaitable);
          std::cout << "tick " << ticks << " due at +"
                    << std::chrono::duration_cast<std::chrono::milliseconds>(due - start).count() << " ms\n";
          if (ticks == 2) std::this_thread::sleep_for(50ms); // a slow iteration: the missed ticks are skipped
        }
        done.set_value(ticks);
      },
      net::detached);
  const int n = done.get_future().get();
  std::cout << n << " ticks\n";
  return n == 6 ? 0 : 1;
}
