// A receiver for the std::execution tests: counts each completion of its operation,
// records the completing thread, runs a hook at completion, and carries a stop token the
// test controls.
#ifndef METRONOME_TEST_EXECUTION_RECEIVER_HPP
#define METRONOME_TEST_EXECUTION_RECEIVER_HPP

#include <metronome/execution.hpp>

#include <atomic>
#include <exception>
#include <functional>
#include <thread>

namespace metronome::test {

struct outcome {
  std::atomic<int> values{0}, stops{0}, errors{0};
  std::thread::id thread;
  std::function<void()> on_complete; // runs inside the completion, before it is counted
  std::atomic<bool> done{false};

  int completions() const { return values.load() + stops.load() + errors.load(); }
  // Blocks until the operation completed (no timeout: ctest's is the bound).
  void wait() const { done.wait(false); }
};

struct test_receiver {
  using receiver_concept = stdexec::receiver_t;
  outcome* out;
  stdexec::inplace_stop_token token;

  struct env {
    stdexec::inplace_stop_token token;
    stdexec::inplace_stop_token query(stdexec::get_stop_token_t) const noexcept { return token; }
  };
  env get_env() const noexcept { return {token}; }

  void set_value() noexcept { finish(out->values); }
  void set_stopped() noexcept { finish(out->stops); }
  void set_error(std::exception_ptr) noexcept { finish(out->errors); }

private:
  void finish(std::atomic<int>& which) noexcept {
    outcome* o = out; // the operation (and this receiver) may be destroyed once done is set
    o->thread = std::this_thread::get_id();
    if (o->on_complete) o->on_complete();
    which.fetch_add(1);
    o->done.store(true);
    o->done.notify_all();
  }
};

// An operation state held in place (operation states do not move).
template <class Sender>
struct started {
  using op_type = stdexec::connect_result_t<Sender, test_receiver>;
  started(Sender s, outcome& o, stdexec::inplace_stop_token t = {})
      : op(stdexec::connect(std::move(s), test_receiver{&o, t})) {
    stdexec::start(op);
  }
  op_type op;
};

} // namespace metronome::test

#endif
