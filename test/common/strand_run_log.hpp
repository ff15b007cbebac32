#ifndef METRONOME_TEST_STRAND_RUN_LOG_HPP
#define METRONOME_TEST_STRAND_RUN_LOG_HPP

#include <metronome/detail/asio.hpp>
#include <metronome/manual_clock.hpp>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace metronome::test {

// A strand of an io_context run by two threads, and the log of a periodic task's runs
// bound to it: when each ran (manual clock time since the log was made), whether two runs
// overlapped, whether one ran off the strand. For the fixed-rate-on-a-strand tests of
// the pool and of a serial executor.
class strand_run_log {
public:
  explicit strand_run_log(manual_clock& clock) : clock_(clock), start_(clock.now()) {
    for (auto& t : threads_) t = std::thread([this] { io_.run(); });
  }
  ~strand_run_log() { stop(); }
  strand_run_log(const strand_run_log&) = delete;
  strand_run_log& operator=(const strand_run_log&) = delete;

  // The callable to schedule: bound to the strand, records its run; `pause` of real
  // time inside it makes a late run overlap the next if the strand did not exclude it.
  auto task(std::chrono::milliseconds pause = std::chrono::milliseconds(0)) {
    return net::bind_executor(strand_, [this, pause] {
      if (inside_.fetch_add(1) != 0) overlapped_ = true;
      if (!strand_.running_in_this_thread()) off_strand_ = true;
      if (pause.count() != 0) std::this_thread::sleep_for(pause);
      {
        std::lock_guard lk(m_);
        times_.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(clock_.now() - start_));
      }
      inside_.fetch_sub(1);
      ++runs_;
    });
  }

  // Lets the io_context's threads end once its work is done, and joins them.
  void stop() {
    guard_.reset();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

  int runs() const { return runs_.load(); }
  bool overlapped() const { return overlapped_.load(); }
  bool off_strand() const { return off_strand_.load(); }
  std::vector<std::chrono::milliseconds> times() {
    std::lock_guard lk(m_);
    return times_;
  }

private:
  manual_clock& clock_;
  const manual_clock::time_point start_;
  net::io_context io_;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> guard_{net::make_work_guard(io_)};
  net::strand<net::io_context::executor_type> strand_{net::make_strand(io_)};
  std::thread threads_[2];
  std::mutex m_;
  std::vector<std::chrono::milliseconds> times_;
  std::atomic<int> inside_{0}, runs_{0};
  std::atomic<bool> overlapped_{false}, off_strand_{false};
};

} // namespace metronome::test

#endif
