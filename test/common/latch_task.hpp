// Test fixtures that block and count: a gate, a counter, and a worker held busy.
#ifndef METRONOME_TEST_LATCH_TASK_HPP
#define METRONOME_TEST_LATCH_TASK_HPP

#include <condition_variable>
#include <mutex>

namespace metronome::test {

// A gate a task can block on until the test opens it, and a signal that the task
// got there: deterministic "worker is busy" set-ups without sleeps.
class gate {
public:
  void open() {
    std::lock_guard lk(m_); // notify under the lock: the waiter may destroy us next
    open_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lk(m_);
    cv_.wait(lk, [&] { return open_; });
  }

private:
  std::mutex m_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Counts events and lets a test wait for a number of them.
class counter {
public:
  void add(int n = 1) {
    std::lock_guard lk(m_);
    value_ += n;
    cv_.notify_all();
  }
  int value() {
    std::lock_guard lk(m_);
    return value_;
  }
  // Waits (up to 20 s of real time) until the count reaches n.
  bool wait_for_at_least(int n) {
    std::unique_lock lk(m_);
    return cv_.wait_for(lk, std::chrono::seconds(20), [&] { return value_ >= n; });
  }

private:
  std::mutex m_;
  std::condition_variable cv_;
  int value_ = 0;
};

// Blocks one of the pool's workers (in a pool of one: the only one) inside a task until
// `release` opens; returns once the task is running (false if it did not start within
// 20 s). `started` counts the task's start.
template <class Pool>
bool occupy_worker(Pool& pool, gate& release, counter& started) {
  pool.submit([&release, &started] {
    started.add();
    release.wait();
  });
  return started.wait_for_at_least(1);
}

} // namespace metronome::test

#endif
