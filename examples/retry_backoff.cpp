// Retry with backoff in a coroutine: each attempt is bounded by cancel_after, failed
// attempts wait an exponential, capped, fully jittered delay. It runs on a manual clock
// with auto-advance, so minutes of timeouts and back-off take milliseconds — the way to
// test such code. Swap the pool options for a real pool and the same code runs for real.
#include <metronome/metronome.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <future>
#include <iostream>

namespace asio = boost::asio;
using namespace std::chrono_literals;

// A flaky service: it hangs on the first three calls and answers on the fourth.
asio::awaitable<int> call_service(metronome::scheduled_thread_pool::executor_type ex, int attempt) {
  co_await metronome::async_delay(ex, attempt < 4 ? 24h : 150ms, asio::use_awaitable);
  co_return 42;
}

int main() {
  metronome::manual_clock clock;
  clock.set_auto_advance(true);
  metronome::pool_options o;
  o.time_source = &clock;
  metronome::scheduled_thread_pool pool(o);
  const auto t0 = clock.now();
  const auto wall0 = std::chrono::steady_clock::now();
  auto virt = [&] { return std::chrono::duration_cast<std::chrono::milliseconds>(clock.now() - t0).count(); };

  std::promise<int> result;
  asio::co_spawn(
      pool,
      [&]() -> asio::awaitable<void> {
        auto ex = pool.get_executor();
        metronome::backoff retry({.initial = 1s, .multiplier = 2.0, .cap = 1min, .max_attempts = 5, .seed = 2024});
        for (int attempt = 1;; ++attempt) {
          // The attempt, bounded by 2 s: co_spawn's own completion goes through cancel_after.
          auto [e, value] = co_await asio::co_spawn(ex, call_service(ex, attempt),
                                                    metronome::cancel_after(2s, asio::as_tuple(asio::use_awaitable)));
          if (!e) {
            std::cout << "[" << virt() << " ms] attempt " << attempt << " answered " << value << "\n";
            result.set_value(value);
            co_return;
          }
          auto wait = retry.next();
          if (!wait) break;
          std::cout << "[" << virt() << " ms] attempt " << attempt << " timed out; retry in "
                    << std::chrono::duration_cast<std::chrono::milliseconds>(*wait).count() << " ms\n";
          co_await metronome::async_delay(ex, *wait, asio::use_awaitable);
        }
        result.set_value(-1);
      },
      asio::detached);

  const int v = result.get_future().get();
  const auto wall = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - wall0);
  std::cout << "result " << v << " after " << virt() << " ms of virtual time, " << wall.count() << " ms of real time\n";
  return v == 42 ? 0 : 1;
}
