// The benchmark harness shared by every workload file: the callable every task runs
// (the same on both sides), the plain-Asio contexts, memory readings, and the case
// table that main.cpp runs and reports.
#ifndef METRONOME_BENCH_HARNESS_HPP
#define METRONOME_BENCH_HARNESS_HPP

#include <metronome/detail/node_cache.hpp>
#include <metronome/metronome.hpp>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace bench {

namespace asio = boost::asio;
using clock = metronome::clock;
using metrics = std::map<std::string, double>;
using namespace std::chrono_literals;

struct options {
  int threads = 2;    // worker threads of every pool, and threads running each io_context
  int reps = 5;       // repetitions of each side of each case
  bool quick = false; // smallest sizes only, one repetition: the smoke test
};

inline std::int64_t now_ns() noexcept { return clock::now().time_since_epoch().count(); }
inline double seconds_since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }

// A count that every task bumps once; the waiting thread sleeps in a futex until the
// target is reached (only the last bump wakes it), so it takes no core from the workers.
class counter {
public:
  explicit counter(long target) : target_(static_cast<int>(target)) {}
  void bump() noexcept {
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == target_) count_.notify_all();
  }
  void wait() const noexcept {
    for (int v; (v = count_.load(std::memory_order_acquire)) < target_;) count_.wait(v, std::memory_order_acquire);
  }
  long value() const noexcept { return count_.load(std::memory_order_acquire); }

private:
  std::atomic<int> count_{0};
  const int target_;
};

// The shared state a user's callbacks touch: one slot per task, and one counter.
// The slots are zeroed (faulted in) before anything is timed.
class results {
public:
  explicit results(long n) : slots_(new std::int64_t[static_cast<std::size_t>(n)]()), size_(n), done_(n) {}
  std::int64_t slot(long i) const noexcept { return slots_[i]; }
  long size() const noexcept { return size_; }
  void wait_all() const noexcept { done_.wait(); }
  long done() const noexcept { return done_.value(); }

private:
  friend struct user_task;
  std::unique_ptr<std::int64_t[]> slots_;
  long size_;
  counter done_;
};

// What every task does, on both sides: writes its result (the time it ran, in ns of
// metronome::clock) into its own slot of the shared array and bumps the shared counter.
// Lateness is read from the slot.
struct user_task {
  results* r;
  long i;
  void operator()() const noexcept {
    r->slots_[i] = now_ns();
    r->done_.bump();
  }
};

// Plain Asio, the first way: an io_context run by `n` threads.
class asio_io_threads {
public:
  static constexpr const char* name = "io_context";
  explicit asio_io_threads(int n) : guard_(io_.get_executor()) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { io_.run(); });
  }
  asio_io_threads(const asio_io_threads&) = delete;
  asio_io_threads& operator=(const asio_io_threads&) = delete;
  ~asio_io_threads() { join(); }
  asio::io_context::executor_type get_executor() noexcept { return io_.get_executor(); }
  // Returns once every handler has run.
  void join() {
    guard_.reset();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  std::vector<std::thread> threads_;
};

// Plain Asio, the second way: asio::thread_pool(n).
class asio_pool {
public:
  static constexpr const char* name = "thread_pool";
  explicit asio_pool(int n) : pool_(static_cast<std::size_t>(n)) {}
  asio::thread_pool::executor_type get_executor() noexcept { return pool_.get_executor(); }
  void join() { pool_.join(); }

private:
  asio::thread_pool pool_;
};

// Heap in use (malloc's small and mmapped blocks) plus the node cache's mapped chunks.
double heap_in_use_mib();
// Peak resident set of this process (each side of each case runs in its own child).
double peak_rss_mib();

// p50 / p99 / max of `v` (reordered), with the given prefix: "p50 late ms" ...
void add_percentiles(metrics& m, std::vector<double>& v, const std::string& unit);
// Lateness of each task in `r` (the time it wrote into its slot minus when it was due,
// `due_ns`): "p50 late ms", "p99 late ms", "max late ms".
void add_lateness(metrics& m, const results& r, const std::vector<std::int64_t>& due_ns);

// A failed check in a child: prints why and exits non-zero; the run is reported failed.
[[noreturn]] void fail(const std::string& what);
inline void check(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

// One side of a case: metronome (one or more ways, e.g. pool and wheel) or plain Asio.
struct side {
  std::string name;
  bool asio;
  std::function<metrics()> run;
};
struct bench_case {
  std::string name;
  std::vector<side> sides;
};

// Each workload file adds its cases (full or quick sizes).
void add_throughput_cases(std::vector<bench_case>& out, const options& o);
void add_timer_cases(std::vector<bench_case>& out, const options& o);
void add_coroutine_cases(std::vector<bench_case>& out, const options& o);
// std::execution rows (bench/execution.cpp): where stdexec is found.
void add_execution_cases(std::vector<bench_case>& out, const options& o);

// "1k", "10k", "1M" for case names.
std::string count_label(long n);

} // namespace bench

#endif
