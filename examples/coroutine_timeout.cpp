// A deadline around a whole coroutine (Tokio's `timeout(d, future)`): async_timeout
// gives the coroutine's result, or cancels it when time is up, waits for it to finish
// its clean-up, and reports net::error::timed_out. On a manual clock with auto-advance:
// the slow query below takes 30 virtual seconds and the run a few real milliseconds.
#include <metronome/metronome.hpp>

#include <metronome/net.hpp> // the Asio metronome was built with (examples build with both); your code includes its own, e.g. <boost/asio.hpp>

#include <chrono>
#include <exception>
#include <future>
#include <iostream>
#include <string>

namespace net = metronome::net;
using namespace std::chrono_literals;
using executor = metronome::scheduled_thread_pool::executor_type;

// A query that takes `took`; cancelled, it rolls back (100 ms) before it gives up.
net::awaitable<std::string> query(executor ex, std::chrono::milliseconds took, bool& rolled_back) {
  std::exception_ptr cancelled;
  try {
    co_await metronome::async_delay(ex, took, net::use_awaitable);
  } catch (const metronome::system_error&) {
    cancelled = std::current_exception();
  }
  if (cancelled) {
    co_await net::this_coro::reset_cancellation_state(); // let the roll-back's own wait run
    co_await metronome::async_delay(ex, 100ms, net::use_awaitable);
    rolled_back = true;
    std::rethrow_exception(cancelled);
  }
  co_return "rows after " + std::to_string(took.count()) + " ms";
}

int main() {
  metronome::manual_clock clock;
  clock.set_auto_advance(true);
  metronome::pool_options o;
  o.threads = 1; // one thread: the coroutines' context is serialised, as cancellation wants
  o.time_source = &clock;
  metronome::scheduled_thread_pool pool(o);
  const auto t0 = clock.now();
  auto virt = [&] { return std::chrono::duration_cast<std::chrono::milliseconds>(clock.now() - t0).count(); };

  std::promise<bool> ok;
  net::co_spawn(
      pool,
      [&]() -> net::awaitable<void> {
        auto ex = pool.get_executor();
        bool rolled_back = false;
        const std::string fast =
            co_await metronome::async_timeout(ex, 1s, query(ex, 200ms, rolled_back), net::use_awaitable);
        std::cout << "[" << virt() << " ms] fast query: " << fast << "\n";
        try {
          co_await metronome::async_timeout(ex, 1s, query(ex, 30000ms, rolled_back), net::use_awaitable);
          std::cout << "slow query answered?\n";
          ok.set_value(false);
        } catch (const metronome::system_error& e) {
          // Completes after the roll-back: at 1 s + 100 ms after it started, not at 1 s.
          std::cout << "[" << virt() << " ms] slow query: " << e.code().message()
                    << (rolled_back ? " (rolled back)" : " (still running!)") << "\n";
          ok.set_value(e.code() == net::error::timed_out && rolled_back && virt() == 1300);
        }
      },
      net::detached);
  return ok.get_future().get() ? 0 : 1;
}
