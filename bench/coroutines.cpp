// The coroutine row: many coroutines each awaiting a chain of short delays
// (metronome::async_delay against a steady_timer per coroutine), then running the user
// task. Wall time from the first co_spawn to the last coroutine's end, and memory.
#include "harness.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace bench {
namespace {

constexpr int waits = 20;
constexpr auto delay = 1ms;

metrics coro_metrics(double wall, double base) {
  return {{"wall s", wall}, {"peak RSS MiB", peak_rss_mib()}, {"heap after MiB", heap_in_use_mib() - base}};
}

// `each`: the delay of every wait; 0 takes the path without the delay queue (a wait due
// at once goes straight to the ready queue), which tells what the rest of the path costs.
metrics coro_metronome(const options& o, int n, std::chrono::nanoseconds each) {
  results r(n);
  double base = heap_in_use_mib();
  double wall = 0;
  {
    metronome::scheduled_thread_pool pool(static_cast<std::size_t>(o.threads));
    auto start = clock::now();
    for (int i = 0; i < n; ++i)
      asio::co_spawn(
          pool,
          [&pool, each, t = user_task{&r, i}]() -> asio::awaitable<void> {
            for (int k = 0; k < waits; ++k)
              co_await metronome::async_delay(pool.get_executor(), each, asio::use_awaitable);
            t();
          },
          asio::detached);
    r.wait_all();
    wall = seconds_since(start);
  }
  return coro_metrics(wall, base);
}

// `timed` false: each step is `co_await asio::post` on the coroutine's own executor - no
// timer at all. Asio's round trip through its scheduler and its awaitable machinery
// alone, the floor under any timed row on that side (reported as a reference, not as
// Asio's best).
template <class Context>
metrics coro_asio(const options& o, int n, bool timed = true) {
  results r(n);
  double base = heap_in_use_mib();
  double wall = 0;
  {
    Context ctx(o.threads);
    auto start = clock::now();
    for (int i = 0; i < n; ++i)
      asio::co_spawn(
          ctx.get_executor(),
          [t = user_task{&r, i}, timed]() -> asio::awaitable<void> {
            auto ex = co_await asio::this_coro::executor;
            asio::steady_timer timer(ex);
            for (int k = 0; k < waits; ++k) {
              if (!timed) {
                co_await asio::post(ex, asio::use_awaitable);
                continue;
              }
              timer.expires_after(delay);
              co_await timer.async_wait(asio::use_awaitable);
            }
            t();
          },
          asio::detached);
    r.wait_all();
    wall = seconds_since(start);
    ctx.join();
  }
  return coro_metrics(wall, base);
}

} // namespace

void add_coroutine_cases(std::vector<bench_case>& out, const options& o) {
  const int n = o.quick ? 1000 : 10000;
  out.push_back(
      {"coroutines/" + count_label(n) + "x20x1ms",
       {{"metronome async_delay", false, [=] { return coro_metronome(o, n, delay); }},
        {"metronome async_delay, 0 ms (the path without the delay queue)", false,
         [=] { return coro_metronome(o, n, std::chrono::nanoseconds(0)); }},
        {std::string("reference: Asio with no timer (co_await asio::post) on ") + asio_io_threads::name, false,
         [=] { return coro_asio<asio_io_threads>(o, n, false); }},
        {std::string("steady_timer on ") + asio_io_threads::name, true,
         [=] { return coro_asio<asio_io_threads>(o, n); }},
        {std::string("steady_timer on ") + asio_pool::name, true, [=] { return coro_asio<asio_pool>(o, n); }}}});
}

} // namespace bench
