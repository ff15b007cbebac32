// Retry with backoff as one operation: async_retry runs an attempt again after each
// failure, waiting an exponential, capped, fully jittered delay; each attempt is a
// coroutine bounded by async_timeout. It runs on a manual clock with auto-advance, so
// minutes of timeouts and back-off take milliseconds — the way to test such code. Swap
// the pool options for a real pool and the same code runs for real.
#include <metronome/metronome.hpp>

#include <metronome/net.hpp> // the Asio metronome was built with (examples build with both); your code includes its own, e.g. <boost/asio.hpp>

#include <chrono>
#include <exception>
#include <future>
#include <iostream>

namespace net = metronome::net;
using namespace std::chrono_literals;

// A flaky service: it hangs on the first three calls and answers on the fourth.
net::awaitable<int> call_service(metronome::scheduled_thread_pool::executor_type ex, int attempt) {
  co_await metronome::async_delay(ex, attempt < 4 ? 24h : 150ms, net::use_awaitable);
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
  net::co_spawn(
      pool,
      [&]() -> net::awaitable<void> {
        auto ex = pool.get_executor();
        int attempt = 0;
        // One attempt: the call, bounded by 2 s. Signature void(std::exception_ptr, int).
        auto call_once = [&](auto&& token) {
          ++attempt;
          std::cout << "[" << virt() << " ms] attempt " << attempt << "\n";
          return metronome::async_timeout(ex, 2s, call_service(ex, attempt), std::forward<decltype(token)>(token));
        };
        // Up to 5 retries, 1 s, 2 s, 4 s... (jittered); only timeouts are worth another try.
        auto timed_out = [](const std::exception_ptr& e) {
          try {
            std::rethrow_exception(e);
          } catch (const metronome::system_error& x) {
            return x.code() == net::error::timed_out;
          } catch (...) {
            return false;
          }
        };
        try {
          const int value = co_await metronome::async_retry(
              ex, metronome::backoff({.initial = 1s, .multiplier = 2.0, .cap = 1min, .max_retries = 5, .seed = 2024}),
              call_once, timed_out, net::use_awaitable);
          std::cout << "[" << virt() << " ms] attempt " << attempt << " answered " << value << "\n";
          result.set_value(value);
        } catch (const std::exception& e) { // the last attempt's error, once the retries ran out
          std::cout << "[" << virt() << " ms] gave up: " << e.what() << "\n";
          result.set_value(-1);
        }
      },
      net::detached);

  const int v = result.get_future().get();
  const auto wall = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - wall0);
  std::cout << "result " << v << " after " << virt() << " ms of virtual time, " << wall.count() << " ms of real time\n";
  return v == 42 ? 0 : 1;
}
