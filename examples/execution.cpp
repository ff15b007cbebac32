// std::execution (P2300) over metronome: the pool, a serial executor and a wheel as
// timed schedulers for stdexec's algorithms and coroutines. Built where stdexec is found
// (metronome/execution.hpp; CMake target metronome::execution).
//
// A request fans out to three back-ends, each answering after its own delay on the pool;
// their answers are merged in one order on a serial executor (no lock); the whole request
// races a deadline on the wheel (when_any: the loser is stopped, its wait leaves the
// delay queue at once). A slow back-end makes the second request time out.
#include <metronome/execution.hpp>
#include <metronome/metronome.hpp>

#include <exec/task.hpp>
#include <exec/when_any.hpp>

#include <chrono>
#include <iostream>
#include <string>
#include <vector>

using namespace std::chrono_literals;

namespace {

// One back-end: answers `name` after `took`, on a pool thread.
auto backend(metronome::pool_scheduler pool, std::string name, std::chrono::milliseconds took) {
  return exec::schedule_after(pool, took) | stdexec::then([name] { return name; });
}

// The request: three answers, merged in order on the serial executor, or "timed out".
template <class Serial>
exec::task<std::string> request(metronome::pool_scheduler pool, Serial merge, metronome::wheel_scheduler deadline,
                                std::chrono::milliseconds slowest) {
  auto answers = stdexec::when_all(backend(pool, "users", 2ms), backend(pool, "orders", 3ms),
                                   backend(pool, "stock", slowest)) |
                 stdexec::continues_on(merge) | // one at a time, in the serial executor's order
                 stdexec::then([](std::string a, std::string b, std::string c) { return a + "+" + b + "+" + c; });
  auto timeout = exec::schedule_after(deadline, 50ms) | stdexec::then([] { return std::string("timed out"); });
  co_return co_await exec::when_any(std::move(answers), std::move(timeout));
}

} // namespace

int main() {
  metronome::scheduled_thread_pool pool(2);
  metronome::wheel_timer wheel(pool);
  auto serial = metronome::make_serial_executor(pool.get_executor());

  const auto t0 = pool.now();
  auto [fast] = stdexec::sync_wait(request(pool.get_scheduler(), serial.get_scheduler(), wheel.get_scheduler(), 4ms))
                    .value();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(pool.now() - t0);
  std::cout << "fast request: " << fast << " (" << took.count() << " ms)\n";

  const auto t1 = pool.now();
  auto [slow] = stdexec::sync_wait(request(pool.get_scheduler(), serial.get_scheduler(), wheel.get_scheduler(), 1h))
                    .value();
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(pool.now() - t1);
  std::cout << "slow request: " << slow << " (" << waited.count() << " ms; the hour-long back-end was stopped)\n";

  // The stopped back-end left the delay queue: nothing is pending.
  const bool ok = fast == "users+orders+stock" && slow == "timed out" && waited >= 50ms && waited < 10s &&
                  pool.stats().delayed_queued == 0;
  std::cout << (ok ? "ok" : "FAILED") << "\n";
  return ok ? 0 : 1;
}
