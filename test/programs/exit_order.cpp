// A pool made before the process-wide timing pool is destroyed after it at exit. Its
// destructor cancels a task whose async_wait handler has no executor: that completion,
// which goes to the timing pool when it exists, must still run (here, on the thread
// running the destructors) and touch nothing destroyed. A plain program: static
// destruction is the test. Exit status 0 only when the handler ran.
#include <metronome/scheduled_thread_pool.hpp>
#include <metronome/serial_executor.hpp>

#include <metronome/detail/asio.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <unistd.h>

namespace {

std::atomic<bool> handler_ran{false};

// Made first, destroyed last: checks what happened in between.
struct verdict {
  ~verdict() {
    if (!handler_ran.load()) {
      std::fputs("exit_order: the wait of a task cancelled by a pool destroyed at exit never completed\n", stderr);
      ::_exit(1);
    }
    std::fputs("exit_order: ok\n", stderr);
  }
} the_verdict;

metronome::scheduled_thread_pool early_pool(1); // before the timing pool exists

} // namespace

int main() {
  // First use of the timing pool (a serial executor over an io_context times its delayed
  // work there): it is made now, so destroyed before early_pool.
  metronome::net::io_context io;
  auto serial = metronome::make_serial_executor(io.get_executor());
  serial.schedule([] {}, std::chrono::hours(1)).cancel();

  auto f = early_pool.schedule([] {}, std::chrono::hours(1));
  f.async_wait([](std::exception_ptr e) { handler_ran = e != nullptr; }); // cancelled_error
  return 0;
}
