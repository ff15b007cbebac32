// metronome benchmarks: every workload runs for metronome and for the plain-Asio way
// in this one program run, each in its own forked child (so peak RSS is per
// workload), and prints a table (figures and ratios) plus JSON lines.
//
//   metronome_bench                    all workloads, median of 3 runs each
//   metronome_bench post serial ...    a subset (name prefixes)
//   metronome_bench --reps=5           more repetitions
#include <metronome/detail/node_cache.hpp>
#include <metronome/metronome.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <malloc.h>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace asio = boost::asio;
using namespace std::chrono_literals;
using mclock = metronome::clock;
using metrics = std::map<std::string, double>;

namespace {

double seconds_since(mclock::time_point t) { return std::chrono::duration<double>(mclock::now() - t).count(); }
double peak_mib() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}
// Heap in use plus the node cache's mapped chunks (task nodes live there, not in malloc).
double heap_mib() {
  return static_cast<double>(mallinfo2().uordblks + metronome::detail::node_cache_mapped_bytes()) / (1024.0 * 1024.0);
}

void wait_for_count(const std::atomic<long>& c, long n) {
  while (c.load(std::memory_order_acquire) < n) std::this_thread::yield();
}

struct lateness {
  double p50, p99, max;
};
lateness summarize(std::vector<double>& ms) {
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) { return ms[std::min(ms.size() - 1, static_cast<std::size_t>(q * ms.size()))]; };
  return {at(0.50), at(0.99), ms.back()};
}

// ---------------------------------------------------------------- post
// `producers` threads post 2,000,000 tiny tasks in total onto a 2-thread pool.
template <class Pool>
metrics measure_post(int producers) {
  constexpr long total = 2000000;
  Pool pool(2);
  std::atomic<long> done{0};
  auto start = mclock::now();
  std::vector<std::thread> ps;
  for (int p = 0; p < producers; ++p)
    ps.emplace_back([&] {
      for (long i = 0; i < total / producers; ++i)
        asio::post(pool, [&] { done.fetch_add(1, std::memory_order_relaxed); });
    });
  for (auto& t : ps) t.join();
  wait_for_count(done, total);
  double s = seconds_since(start);
  return {{"Mtasks/s", total / s / 1e6}, {"peak MiB", peak_mib()}};
}
metrics post_metronome(int producers) { return measure_post<metronome::scheduled_thread_pool>(producers); }
metrics post_asio(int producers) { return measure_post<asio::thread_pool>(producers); }

// ---------------------------------------------------------------- serial
template <class Serial, class Make>
metrics run_serial(int nserial, Make make) {
  constexpr long total = 2000000;
  std::vector<Serial> serials;
  for (int i = 0; i < nserial; ++i) serials.push_back(make());
  std::vector<long> last(nserial, -1);
  std::atomic<long> done{0}, bad{0};
  auto start = mclock::now();
  for (long i = 0; i < total; ++i) {
    int s = static_cast<int>(i % nserial);
    long seq = i / nserial;
    asio::post(serials[s], [&, s, seq] {
      if (last[s] + 1 != seq) bad.fetch_add(1, std::memory_order_relaxed);
      last[s] = seq;
      done.fetch_add(1, std::memory_order_relaxed);
    });
  }
  wait_for_count(done, total);
  double s = seconds_since(start);
  return {{"Mtasks/s", total / s / 1e6}, {"order errors", static_cast<double>(bad.load())}, {"peak MiB", peak_mib()}};
}
metrics serial_metronome(int n) {
  metronome::scheduled_thread_pool pool(2);
  using S = metronome::serial_executor<metronome::scheduled_thread_pool::executor_type>;
  return run_serial<S>(n, [&] { return metronome::make_serial_executor(pool); });
}
metrics serial_asio(int n) {
  asio::thread_pool pool(2);
  using S = asio::strand<asio::thread_pool::executor_type>;
  auto m = run_serial<S>(n, [&] { return asio::make_strand(pool.get_executor()); });
  pool.join();
  return m;
}

// ---------------------------------------------------------------- timers-fire
constexpr long fire_n = 1000000;
std::vector<long long> fire_delays_us() {
  std::mt19937_64 rng(12345);
  std::uniform_int_distribution<long long> d(0, 200000);
  std::vector<long long> v(fire_n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Where the timers-fire callbacks put what they measured. Each thread that runs a callback
// appends the lateness to its own buffer and bumps its own counter (one writer, no locked
// instruction), so the callback costs tens of nanoseconds whichever timer runs it; a shared
// array indexed by timer and a shared counter cost ~190 ns per callback on this VM (cold
// store, contended line) and made the harness, not the timer, the bottleneck. The main
// thread sleeps while it waits, so it takes no core from the workers either.
class fire_record {
public:
  fire_record() {
    for (auto& s : slots_) s.late.reserve(fire_n); // address space only; pages are touched as used
  }
  void add(double late_ms) {
    thread_local fire_record* owner = nullptr;
    thread_local slot* mine = nullptr;
    if (owner != this) {
      owner = this;
      mine = &slots_.at(static_cast<std::size_t>(next_.fetch_add(1)));
    }
    mine->late.push_back(static_cast<float>(late_ms));
    mine->count.store(mine->count.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  // Sleeps until `n` callbacks have run; returns every lateness recorded.
  std::vector<double> wait_for(long n) {
    for (;;) {
      long sum = 0;
      for (auto& s : slots_) sum += s.count.load(std::memory_order_acquire);
      if (sum >= n) break;
      std::this_thread::sleep_for(1ms);
    }
    std::vector<double> all;
    all.reserve(static_cast<std::size_t>(n));
    for (auto& s : slots_) all.insert(all.end(), s.late.begin(), s.late.end());
    return all;
  }

private:
  struct alignas(64) slot {
    std::vector<float> late;
    std::atomic<long> count{0};
  };
  std::array<slot, 8> slots_;
  std::atomic<int> next_{0};
};

metrics fire_metrics(double submit_s, std::vector<double> late) {
  auto l = summarize(late);
  return {{"submit Mops/s", fire_n / submit_s / 1e6},
          {"p50 late ms", l.p50},
          {"p99 late ms", l.p99},
          {"max late ms", l.max},
          {"peak MiB", peak_mib()}};
}
// Schedules fire_n one-shot timers with `schedule(delay, fn)` on a pool of 2 and
// measures the submit rate and each timer's lateness against its own scheduling time.
template <class Schedule>
metrics measure_fire(Schedule schedule) {
  auto delays = fire_delays_us();
  fire_record record;
  auto start = mclock::now();
  for (long i = 0; i < fire_n; ++i) {
    auto delay = std::chrono::microseconds(delays[i]);
    auto due = mclock::now() + delay; // due = scheduled at + delay
    schedule(delay,
             [&record, due] { record.add(std::chrono::duration<double, std::milli>(mclock::now() - due).count()); });
  }
  double submit_s = seconds_since(start);
  return fire_metrics(submit_s, record.wait_for(fire_n));
}
metrics fire_metronome() {
  metronome::scheduled_thread_pool pool(2);
  return measure_fire([&](auto delay, auto fn) { pool.schedule(std::move(fn), delay); });
}
metrics fire_wheel() {
  metronome::scheduled_thread_pool pool(2);
  metronome::wheel_timer wheel(pool); // 1 ms tick
  return measure_fire([&](auto delay, auto fn) { wheel.schedule(std::move(fn), delay); });
}
metrics fire_asio() {
  auto delays = fire_delays_us();
  fire_record record;
  asio::io_context io;
  auto guard = asio::make_work_guard(io);
  std::thread t1([&] { io.run(); }), t2([&] { io.run(); });
  std::vector<std::unique_ptr<asio::steady_timer>> timers(fire_n);
  auto start = mclock::now();
  for (long i = 0; i < fire_n; ++i) {
    auto due = mclock::now() + std::chrono::microseconds(delays[i]); // due = scheduled at + delay
    timers[i] = std::make_unique<asio::steady_timer>(io, due);
    timers[i]->async_wait([&record, due](boost::system::error_code) {
      record.add(std::chrono::duration<double, std::milli>(mclock::now() - due).count());
    });
  }
  double submit_s = seconds_since(start);
  auto late = record.wait_for(fire_n);
  guard.reset();
  t1.join();
  t2.join();
  return fire_metrics(submit_s, std::move(late));
}

// ---------------------------------------------------------------- timeout-cancel
constexpr long cancel_n = 1000000;
// Schedules cancel_n timers at 60 s with `schedule()` (returning a handle), then cancels
// them all; measures both rates, peak RSS, and the heap left in use afterwards.
template <class Handle, class Schedule>
metrics measure_cancel(Schedule schedule) {
  double heap0 = heap_mib();
  // Value-initialised before timing, as the Asio side's vector of timers is: neither
  // side's rate includes faulting in the array that holds the handles.
  std::vector<Handle> hs(cancel_n);
  auto start = mclock::now();
  for (long i = 0; i < cancel_n; ++i) hs[i] = schedule();
  double sched_s = seconds_since(start);
  start = mclock::now();
  long won = 0;
  for (auto& h : hs) won += h.cancel();
  double cancel_s = seconds_since(start);
  double peak = peak_mib();
  hs.clear();
  hs.shrink_to_fit();
  return {{"schedule Mops/s", cancel_n / sched_s / 1e6},
          {"cancel Mops/s", cancel_n / cancel_s / 1e6},
          {"peak MiB", peak},
          {"heap after MiB", heap_mib() - heap0},
          {"cancelled", static_cast<double>(won)}};
}
metrics cancel_metronome() {
  metronome::scheduled_thread_pool pool(2);
  return measure_cancel<metronome::scheduled_future<void>>([&] { return pool.schedule([] {}, 60s); });
}
metrics cancel_wheel() {
  metronome::scheduled_thread_pool pool(2);
  metronome::wheel_timer wheel(pool);
  return measure_cancel<metronome::wheel_timer::timeout>([&] { return wheel.schedule([] {}, 60s); });
}
metrics cancel_asio() {
  double heap0 = heap_mib();
  asio::io_context io;
  auto guard = asio::make_work_guard(io);
  std::thread t1([&] { io.run(); }), t2([&] { io.run(); });
  std::vector<std::unique_ptr<asio::steady_timer>> timers(cancel_n);
  std::atomic<long> aborted{0};
  auto start = mclock::now();
  for (long i = 0; i < cancel_n; ++i) {
    timers[i] = std::make_unique<asio::steady_timer>(io, 60s);
    timers[i]->async_wait([&](boost::system::error_code ec) {
      if (ec) aborted.fetch_add(1, std::memory_order_relaxed);
    });
  }
  double sched_s = seconds_since(start);
  start = mclock::now();
  for (auto& t : timers) t->cancel();
  double cancel_s = seconds_since(start);
  wait_for_count(aborted, cancel_n);
  double peak = peak_mib();
  timers.clear();
  timers.shrink_to_fit();
  guard.reset();
  t1.join();
  t2.join();
  double heap_after = heap_mib() - heap0;
  return {{"schedule Mops/s", cancel_n / sched_s / 1e6},
          {"cancel Mops/s", cancel_n / cancel_s / 1e6},
          {"peak MiB", peak},
          {"heap after MiB", heap_after},
          {"cancelled", static_cast<double>(aborted.load())}};
}

// ---------------------------------------------------------------- accuracy
std::vector<long long> accuracy_delays_us() {
  std::mt19937_64 rng(777);
  std::uniform_int_distribution<long long> d(1000, 50000);
  std::vector<long long> v(2000);
  for (auto& x : v) x = d(rng);
  return v;
}
metrics accuracy_metronome() {
  auto delays = accuracy_delays_us();
  std::vector<double> late(delays.size());
  std::atomic<long> done{0};
  metronome::scheduled_thread_pool pool(2);
  auto start = mclock::now();
  for (std::size_t i = 0; i < delays.size(); ++i) {
    auto due = start + std::chrono::microseconds(delays[i]);
    pool.schedule_at(
        [&, i, due] {
          late[i] = std::chrono::duration<double, std::milli>(mclock::now() - due).count();
          done.fetch_add(1);
        },
        due);
  }
  wait_for_count(done, static_cast<long>(delays.size()));
  auto l = summarize(late);
  return {{"p50 late ms", l.p50}, {"p99 late ms", l.p99}, {"max late ms", l.max}};
}
metrics accuracy_asio() {
  auto delays = accuracy_delays_us();
  std::vector<double> late(delays.size());
  std::atomic<long> done{0};
  asio::io_context io;
  auto guard = asio::make_work_guard(io);
  std::thread t1([&] { io.run(); }), t2([&] { io.run(); });
  std::vector<std::unique_ptr<asio::steady_timer>> timers(delays.size());
  auto start = mclock::now();
  for (std::size_t i = 0; i < delays.size(); ++i) {
    auto due = start + std::chrono::microseconds(delays[i]);
    timers[i] = std::make_unique<asio::steady_timer>(io, due);
    timers[i]->async_wait([&, i, due](boost::system::error_code) {
      late[i] = std::chrono::duration<double, std::milli>(mclock::now() - due).count();
      done.fetch_add(1);
    });
  }
  wait_for_count(done, static_cast<long>(delays.size()));
  guard.reset();
  t1.join();
  t2.join();
  auto l = summarize(late);
  return {{"p50 late ms", l.p50}, {"p99 late ms", l.p99}, {"max late ms", l.max}};
}

// ---------------------------------------------------------------- periodic
constexpr auto period = 5ms;
constexpr auto periodic_span = 2s;
metrics periodic_metronome() {
  metronome::scheduled_thread_pool pool(2);
  std::vector<mclock::time_point> runs;
  runs.reserve(1000);
  std::mutex m;
  auto first = mclock::now() + period;
  auto h = pool.schedule_at_fixed_rate(
      [&] {
        std::lock_guard lk(m);
        runs.push_back(mclock::now());
      },
      period, period);
  std::this_thread::sleep_for(periodic_span);
  h.cancel();
  h.wait();
  double max_drift = 0, end_drift = 0;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    double d = std::chrono::duration<double, std::milli>(runs[i] - (first + period * i)).count();
    max_drift = std::max(max_drift, d);
    end_drift = d;
  }
  // Fixed delay 5 ms with a 1 ms body.
  std::atomic<long> fd_runs{0};
  auto fd = pool.schedule_with_fixed_delay(
      [&] {
        std::this_thread::sleep_for(1ms);
        ++fd_runs;
      },
      0ms, period);
  std::this_thread::sleep_for(periodic_span);
  fd.cancel();
  fd.wait();
  return {{"end drift ms", end_drift},
          {"max drift ms", max_drift},
          {"runs", static_cast<double>(runs.size())},
          {"fixed-delay runs", static_cast<double>(fd_runs.load())}};
}
metrics periodic_asio() {
  asio::io_context io;
  asio::steady_timer timer(io);
  std::vector<mclock::time_point> runs;
  auto first = mclock::now() + period;
  auto stop_at = mclock::now() + periodic_span;
  timer.expires_at(first);
  std::function<void(boost::system::error_code)> tick = [&](boost::system::error_code ec) {
    if (ec) return;
    runs.push_back(mclock::now());
    if (mclock::now() >= stop_at) return;
    timer.expires_at(timer.expiry() + period);
    timer.async_wait(tick);
  };
  timer.async_wait(tick);
  io.run();
  double max_drift = 0, end_drift = 0;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    double d = std::chrono::duration<double, std::milli>(runs[i] - (first + period * i)).count();
    max_drift = std::max(max_drift, d);
    end_drift = d;
  }
  // Fixed delay: re-armed from the end of a 1 ms body.
  io.restart();
  long fd_runs = 0;
  auto fd_stop = mclock::now() + periodic_span;
  timer.expires_after(0ms);
  std::function<void(boost::system::error_code)> fd_tick = [&](boost::system::error_code ec) {
    if (ec || mclock::now() >= fd_stop) return;
    std::this_thread::sleep_for(1ms);
    ++fd_runs;
    timer.expires_after(period);
    timer.async_wait(fd_tick);
  };
  timer.async_wait(fd_tick);
  io.run();
  return {{"end drift ms", end_drift},
          {"max drift ms", max_drift},
          {"runs", static_cast<double>(runs.size())},
          {"fixed-delay runs", static_cast<double>(fd_runs)}};
}

// ---------------------------------------------------------------- coroutines
constexpr int coro_n = 10000;
constexpr int coro_waits = 20;
metrics coro_metronome() {
  metronome::scheduled_thread_pool pool(2);
  std::atomic<long> done{0};
  auto start = mclock::now();
  for (int i = 0; i < coro_n; ++i)
    asio::co_spawn(
        pool,
        [&]() -> asio::awaitable<void> {
          for (int k = 0; k < coro_waits; ++k)
            co_await metronome::async_delay(pool.get_executor(), 1ms, asio::use_awaitable);
          done.fetch_add(1);
        },
        asio::detached);
  wait_for_count(done, coro_n);
  return {{"wall s", seconds_since(start)}, {"peak MiB", peak_mib()}};
}
metrics coro_asio() {
  asio::io_context io;
  auto guard = asio::make_work_guard(io);
  std::thread t1([&] { io.run(); }), t2([&] { io.run(); });
  std::atomic<long> done{0};
  auto start = mclock::now();
  for (int i = 0; i < coro_n; ++i)
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          asio::steady_timer t(co_await asio::this_coro::executor);
          for (int k = 0; k < coro_waits; ++k) {
            t.expires_after(1ms);
            co_await t.async_wait(asio::use_awaitable);
          }
          done.fetch_add(1);
        },
        asio::detached);
  wait_for_count(done, coro_n);
  double s = seconds_since(start);
  guard.reset();
  t1.join();
  t2.join();
  return {{"wall s", s}, {"peak MiB", peak_mib()}};
}

// ---------------------------------------------------------------- harness
// Runs f in a forked child; the child sends its metrics back through a pipe.
metrics isolated(const std::function<metrics()>& f) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    metrics m = f();
    std::string out;
    for (auto& [k, v] : m) out += k + "\t" + std::to_string(v) + "\n";
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string in;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) in.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  metrics m;
  std::size_t pos = 0;
  while (pos < in.size()) {
    auto nl = in.find('\n', pos);
    auto line = in.substr(pos, nl - pos);
    auto tab = line.find('\t');
    m[line.substr(0, tab)] = std::stod(line.substr(tab + 1));
    pos = nl + 1;
  }
  return m;
}

struct workload {
  std::string name;
  std::string asio_name;
  std::function<metrics()> ours, theirs;
};

void report(const workload& w, const metrics& a, const metrics& b) {
  for (auto& [key, ours] : a) {
    auto it = b.find(key);
    double theirs = it == b.end() ? 0 : it->second;
    const bool higher_better = key.find("/s") != std::string::npos || key.find("runs") != std::string::npos;
    double ratio = higher_better ? (theirs != 0 ? ours / theirs : 0) : (theirs != 0 ? ours / theirs : 0);
    std::printf("| %-22s | %-16s | %12.3f | %12.3f | %7.2fx |\n", w.name.c_str(), key.c_str(), ours, theirs, ratio);
    std::fprintf(stderr, "{\"workload\":\"%s\",\"metric\":\"%s\",\"metronome\":%.6f,\"asio\":%.6f,\"ratio\":%.4f}\n",
                 w.name.c_str(), key.c_str(), ours, theirs, ratio);
  }
}

} // namespace

// Median of each metric over repeated runs (this kind of shared VM is noisy).
metrics median_of(const std::vector<metrics>& runs) {
  metrics out;
  if (runs.empty()) return out;
  for (auto& [key, _] : runs.front()) {
    std::vector<double> v;
    for (auto& r : runs)
      if (auto it = r.find(key); it != r.end()) v.push_back(it->second);
    std::sort(v.begin(), v.end());
    out[key] = v[v.size() / 2];
  }
  return out;
}

int main(int argc, char** argv) {
  std::vector<workload> all = {
      {"post 1 producer", "asio::thread_pool", [] { return post_metronome(1); }, [] { return post_asio(1); }},
      {"post 2 producers", "asio::thread_pool", [] { return post_metronome(2); }, [] { return post_asio(2); }},
      {"serial x1", "asio::strand", [] { return serial_metronome(1); }, [] { return serial_asio(1); }},
      {"serial x64", "asio::strand", [] { return serial_metronome(64); }, [] { return serial_asio(64); }},
      {"timers-fire", "steady_timer", fire_metronome, fire_asio},
      {"timers-fire wheel", "steady_timer", fire_wheel, fire_asio},
      {"timeout-cancel", "steady_timer", cancel_metronome, cancel_asio},
      {"timeout-cancel wheel", "steady_timer", cancel_wheel, cancel_asio},
      {"accuracy", "steady_timer", accuracy_metronome, accuracy_asio},
      {"periodic", "steady_timer", periodic_metronome, periodic_asio},
      {"coroutines", "steady_timer", coro_metronome, coro_asio},
  };
  std::printf("metronome benchmark: 2 worker threads, fixed seeds, median of --reps runs (default 3);\n"
              "ratio = metronome / plain Asio\n");
  std::printf("(higher is better for rates and run counts; lower is better for ms, MiB and seconds)\n\n");
  std::printf("| %-22s | %-16s | %12s | %12s | %8s |\n", "workload", "metric", "metronome", "plain Asio", "ratio");
  std::printf("|%s|%s|%s|%s|%s|\n", std::string(24, '-').c_str(), std::string(18, '-').c_str(),
              std::string(14, '-').c_str(), std::string(14, '-').c_str(), std::string(10, '-').c_str());
  int reps = 3;
  std::vector<std::string> wanted;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--reps=", 0) == 0)
      reps = std::max(1, std::stoi(arg.substr(7)));
    else
      wanted.push_back(arg);
  }
  for (auto& w : all) {
    if (!wanted.empty()) {
      bool match = false;
      for (auto& name : wanted) match |= w.name.rfind(name, 0) == 0;
      if (!match) continue;
    }
    std::vector<metrics> ours, theirs;
    for (int r = 0; r < reps; ++r) { // alternate, so drifts in machine load hit both
      ours.push_back(isolated(w.ours));
      theirs.push_back(isolated(w.theirs));
    }
    report(w, median_of(ours), median_of(theirs));
    std::fflush(stdout);
  }
}
