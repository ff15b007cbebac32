// A consumer of metronome::execution: the package made the target because the consumer
// has stdexec (STDEXEC::stdexec); a timed sender on the pool's scheduler completes on a
// pool thread, never early.
#include <metronome/execution.hpp>
#include <metronome/metronome.hpp>

#include <chrono>
#include <tuple>

int main() {
  metronome::scheduled_thread_pool pool(1);
  const auto t0 = pool.now();
  auto r = stdexec::sync_wait(exec::schedule_after(pool.get_scheduler(), std::chrono::milliseconds(2)) |
                              stdexec::then([&] { return pool.get_executor().running_in_this_thread(); }));
  const bool on_pool = r && std::get<0>(*r);
  const bool not_early = pool.now() - t0 >= std::chrono::milliseconds(2);
  pool.join();
  return on_pool && not_early ? 0 : 1;
}
