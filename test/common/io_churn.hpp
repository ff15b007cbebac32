#ifndef METRONOME_TEST_IO_CHURN_HPP
#define METRONOME_TEST_IO_CHURN_HPP

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <functional>
#include <future>
#include <memory>
#include <thread>

namespace metronome::test {

// Asio's rule for a handler completed on another executor: the operation's outstanding
// work travels with the handler and is released in the handler's context after it ran.
// Here each of `n` operations completes onto a fresh io_context run by its own thread,
// and the moment its handler has run, the io_context is stopped and destroyed: work
// released anywhere else, later, touches a destroyed io_context (on the heap, so that
// AddressSanitizer reports it; in a plain build it may hang or crash a later round).
// `start(io, ran)` starts one operation whose handler, bound to `io`, calls `ran()`.
template <class Start>
void complete_onto_dying_io_contexts(int n, Start start) {
  for (int i = 0; i < n; ++i) {
    auto io = std::make_unique<boost::asio::io_context>();
    auto guard = boost::asio::make_work_guard(*io);
    std::thread runner([&io] { io->run(); });
    std::promise<void> ran;
    start(*io, std::function<void()>([&ran] { ran.set_value(); }));
    ran.get_future().get();
    guard.reset();
    io->stop();
    runner.join();
    io.reset();
  }
}

} // namespace metronome::test

#endif
