// The std::execution rows (built where stdexec is found): n schedule_after operations,
// each due at a random 0-200 ms after its start (as timers-fire), through metronome's
// timed schedulers, stdexec's own exec::timed_thread_scheduler, and plain Asio's
// steady_timer per task. Submit rate (connect + start: what the starting thread pays),
// done rate (n over the time from the first start to the last completion: what the whole
// side delivers; at best n / 200 ms), lateness of each from its due time, memory. Every side keeps its n operation states (or timers) in storage faulted in
// before timing: P2300 gives the operation state to the caller.
#include "harness.hpp"

#include <metronome/execution.hpp>

#include <exec/timed_thread_scheduler.hpp>

#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>
#include <random>

namespace bench {
namespace {

std::vector<std::int64_t> delays_ns(long n) {
  std::mt19937_64 rng(12345);
  std::uniform_int_distribution<std::int64_t> d(0, 200000);
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(rng) * 1000;
  return v;
}

// Every side's completion figures, from the slots: lateness of each (slot - due), and
// n over the time from the first start to the last completion (the latest slot).
void add_completion_metrics(metrics& m, const results& r, const std::vector<std::int64_t>& due,
                            std::int64_t start_ns) {
  add_lateness(m, r, due);
  std::int64_t last = start_ns;
  for (long i = 0; i < r.size(); ++i) last = std::max(last, r.slot(i));
  m["done Mops/s"] = static_cast<double>(r.size()) / (static_cast<double>(last - start_ns) / 1e9) / 1e6;
}

// Runs the user task when due; a stop or an error fails the run.
struct bench_receiver {
  using receiver_concept = stdexec::receiver_t;
  user_task task;
  void set_value() noexcept { task(); }
  void set_stopped() noexcept { fail("schedule_after: an operation was stopped"); }
  void set_error(std::exception_ptr) noexcept { fail("schedule_after: an operation failed"); }
};

// n operations of `scheduler`'s schedule_after in caller storage; the metrics.
template <class Scheduler>
metrics run_senders(long n, Scheduler scheduler) {
  using sender = decltype(exec::schedule_after(scheduler, std::chrono::nanoseconds(0)));
  using op = stdexec::connect_result_t<sender, bench_receiver>;
  const auto delays = delays_ns(n);
  std::vector<std::int64_t> due(static_cast<std::size_t>(n));
  results r(n);
  const double base = heap_in_use_mib();
  const std::size_t bytes = sizeof(op) * static_cast<std::size_t>(n);
  auto* storage = static_cast<unsigned char*>(::operator new(bytes, std::align_val_t(alignof(op))));
  std::memset(storage, 0, bytes); // faulted in before timing
  metrics m;
  const auto start = clock::now();
  const std::int64_t start_ns = now_ns();
  for (long i = 0; i < n; ++i) {
    due[static_cast<std::size_t>(i)] = now_ns() + delays[static_cast<std::size_t>(i)];
    auto* o = ::new (storage + sizeof(op) * static_cast<std::size_t>(i)) op(stdexec::connect(
        exec::schedule_after(scheduler, std::chrono::nanoseconds(delays[static_cast<std::size_t>(i)])),
        bench_receiver{user_task{&r, i}}));
    stdexec::start(*o);
  }
  m["submit Mops/s"] = static_cast<double>(n) / seconds_since(start) / 1e6;
  r.wait_all();
  add_completion_metrics(m, r, due, start_ns);
  m["peak RSS MiB"] = peak_rss_mib();
  for (long i = 0; i < n; ++i) reinterpret_cast<op*>(storage + sizeof(op) * static_cast<std::size_t>(i))->~op();
  ::operator delete(storage, std::align_val_t(alignof(op)));
  m["heap after MiB"] = heap_in_use_mib() - base;
  return m;
}

metrics pool_side(const options& o, long n) {
  metronome::scheduled_thread_pool pool(static_cast<std::size_t>(o.threads));
  return run_senders(n, pool.get_scheduler());
}

metrics wheel_side(const options& o, long n) {
  metronome::scheduled_thread_pool pool(static_cast<std::size_t>(o.threads));
  metronome::wheel_timer wheel(pool); // 1 ms tick
  return run_senders(n, wheel.get_scheduler());
}

metrics stdexec_side(long n) {
  exec::timed_thread_context ctx; // its one thread times and completes every operation
  return run_senders(n, ctx.get_scheduler());
}

// Plain Asio: a steady_timer per task on an io_context run by o.threads threads.
metrics asio_side(const options& o, long n) {
  const auto delays = delays_ns(n);
  std::vector<std::int64_t> due(static_cast<std::size_t>(n));
  results r(n);
  const double base = heap_in_use_mib();
  metrics m;
  std::int64_t start_ns = 0;
  {
    asio_io_threads ctx(o.threads);
    std::vector<std::optional<asio::steady_timer>> timers(static_cast<std::size_t>(n));
    const auto start = clock::now();
    start_ns = now_ns();
    for (long i = 0; i < n; ++i) {
      due[static_cast<std::size_t>(i)] = now_ns() + delays[static_cast<std::size_t>(i)];
      auto& t = timers[static_cast<std::size_t>(i)].emplace(ctx.get_executor(),
                                                            std::chrono::nanoseconds(delays[static_cast<std::size_t>(i)]));
      t.async_wait([task = user_task{&r, i}](boost::system::error_code ec) {
        if (!ec) task();
      });
    }
    m["submit Mops/s"] = static_cast<double>(n) / seconds_since(start) / 1e6;
    r.wait_all();
    ctx.join();
  }
  add_completion_metrics(m, r, due, start_ns);
  m["peak RSS MiB"] = peak_rss_mib();
  m["heap after MiB"] = heap_in_use_mib() - base;
  return m;
}

} // namespace

void add_execution_cases(std::vector<bench_case>& out, const options& o) {
  const std::vector<long> sizes = o.quick ? std::vector<long>{10000} : std::vector<long>{100000, 1000000};
  for (long n : sizes)
    out.push_back({"schedule_after/" + count_label(n),
                   {{"metronome pool", false, [=] { return pool_side(o, n); }},
                    {"metronome wheel", false, [=] { return wheel_side(o, n); }},
                    {"stdexec timed_thread_scheduler", true, [=] { return stdexec_side(n); }},
                    {asio_io_threads::name, true, [=] { return asio_side(o, n); }}}});
}

} // namespace bench
