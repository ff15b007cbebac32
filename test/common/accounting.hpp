#ifndef METRONOME_TEST_ACCOUNTING_HPP
#define METRONOME_TEST_ACCOUNTING_HPP

// Helpers for the stress and model tests: a per-callable accounting slot with a
// move-only token whose destructor counts, a thread-safe error collector (Boost.Test
// assertions are for the main thread only), a watchdog that turns a hang into a
// failure, and time budgets scaled for sanitizer builds.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/sanitizers.hpp"

namespace metronome::test {

// Scales a release-build amount of work down for sanitizer builds.
constexpr int scaled(int release, int sanitizer) { return sanitized ? sanitizer : release; }

inline long long real_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What happened to one callable. Every counter is atomic: the library's threads,
// the producers and the test thread all touch it.
struct slot {
  std::atomic<int> ran{0};       // invoked on a library / executor thread
  std::atomic<int> ran_me{0};    // invoked by the test thread (a pending_task)
  std::atomic<int> on_caller{0}; // invoked on the submitting thread (caller_runs)
  std::atomic<int> runs{0};      // every invocation, whoever ran it
  std::atomic<int> destroyed{0}; // tokens destroyed (must end at exactly 1)
  std::atomic<int> throws{0};    // invocations that threw on a library thread
  std::atomic<int> reported{0};  // exceptions of this callable the handler received
  std::atomic<int> posted{0};    // for callables created inside other tasks
  std::atomic<long long> first_run_ns{0};
  int total() const { return ran.load() + ran_me.load() + on_caller.load(); }
};

// A move-only token carried by a callable: calls `OnDestroy{}(slot)` once, when the
// token that was not moved from is destroyed.
template <class OnDestroy>
class slot_token {
public:
  explicit slot_token(slot* s) noexcept : s_(s) {}
  slot_token(slot_token&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  slot_token(const slot_token&) = delete;
  slot_token& operator=(const slot_token&) = delete;
  slot_token& operator=(slot_token&&) = delete;
  ~slot_token() {
    if (s_) OnDestroy{}(s_);
  }

private:
  slot* s_;
};

struct count_destroyed {
  void operator()(slot* s) const noexcept { s->destroyed.fetch_add(1); }
};

// Carried by each callable: counts its destruction once.
using life = slot_token<count_destroyed>;

// Errors found on any thread, reported by the test thread afterwards.
class errors {
public:
  void add(std::string e) {
    std::lock_guard lk(m_);
    ++count_;
    if (list_.size() < 40) list_.push_back(std::move(e));
  }
  std::size_t count() {
    std::lock_guard lk(m_);
    return count_;
  }
  std::vector<std::string> take() {
    std::lock_guard lk(m_);
    return std::move(list_);
  }

private:
  std::mutex m_;
  std::size_t count_ = 0;
  std::vector<std::string> list_;
};

template <class... A>
std::string fmt(const char* f, A... a) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, a...);
  return buf;
}

// Runs f on a helper thread and waits at most `limit` for it: a failure detector for
// calls that hang because of a defect (join, a destructor). On timeout the helper is
// detached and false is returned; the caller must then leak whatever f touches.
template <class F>
bool finishes_within(std::chrono::milliseconds limit, F f) {
  auto done = std::make_shared<std::promise<void>>();
  auto fut = done->get_future();
  std::thread t([f = std::move(f), done]() mutable {
    f();
    done->set_value();
  });
  if (fut.wait_for(limit) == std::future_status::ready) {
    t.join();
    return true;
  }
  t.detach();
  return false;
}

// A per-case time budget: at least `min_rounds`, at most `max_rounds`, and no new
// round once `limit` has passed.
class budget {
public:
  budget(std::chrono::milliseconds limit, int min_rounds, int max_rounds)
      : end_(std::chrono::steady_clock::now() + limit), min_(min_rounds), max_(max_rounds) {}
  bool next() {
    if (done_ >= max_) return false;
    if (done_ >= min_ && std::chrono::steady_clock::now() >= end_) return false;
    ++done_;
    return true;
  }
  int rounds() const { return done_; }

private:
  std::chrono::steady_clock::time_point end_;
  int min_, max_, done_ = 0;
};

// The base seed of a randomized test: METRONOME_STRESS_SEED or a fresh one.
inline std::uint64_t base_seed(const char* env_name) {
  if (const char* s = std::getenv(env_name)) return std::strtoull(s, nullptr, 10);
  return (static_cast<std::uint64_t>(std::random_device{}()) << 20) ^ static_cast<std::uint64_t>(real_ns());
}

// Things a hung library still touches: kept alive forever once a watchdog fired.
inline void leak(std::shared_ptr<void> p) {
  static std::mutex m;
  static auto* kept = new std::vector<std::shared_ptr<void>>; // never destroyed
  std::lock_guard lk(m);
  kept->push_back(std::move(p));
}

} // namespace metronome::test

#endif
