// The timing of an Asio context that is not a metronome pool: a service of that context
// owning a hosted pool_core (pool_hosted.cpp), driven by the context's own threads.
#include "pool_engine.hpp"
#include <metronome/detail/report.hpp>
#include <metronome/detail/test_hooks.hpp>
#include <metronome/detail/timing_service.hpp>

#include <metronome/detail/asio.hpp>

#include <cassert>
#include <memory>
#include <utility>

namespace metronome::detail {

namespace {

// Tasks a drive runs before it re-posts itself, so that other work of the context gets
// its turn (as a serial drain does after its batch).
constexpr std::size_t drive_budget = 256;

pool_options hosted_options() {
  pool_options o;
  o.threads = 0;
  return o;
}

// One per execution context that a wait, a cancel_after, an interval or a serial
// executor's delayed work was started on. Its host makes its Asio timer on first use, so
// the services that timer needs may be registered after this one and destroyed before it:
// the host cancels and destroys the timer in shutdown(), which the context calls on every
// service before it destroys any.
class timing_service final : public net::execution_context::service {
public:
  static inline net::execution_context::id id;

  timing_service(net::execution_context& ctx, std::unique_ptr<timing_host_base> host)
      : net::execution_context::service(ctx), host_(std::move(host)), core_(hosted_options(), host_.get()) {
    host_->attach(core_);
  }
  // Required by use_service; hosted_timing_core() never lets it make one.
  explicit timing_service(net::execution_context& ctx) : timing_service(ctx, nullptr) {}

  pool_core& core() noexcept { return core_; }

private:
  // Asio's rule for a context's shutdown: what its services hold is destroyed, not run.
  // The core refuses work from here on; the host's timer is cancelled.
  void shutdown() override {
    core_.close_hosted();
    host_->shutdown();
  }
  void notify_fork(net::execution_context::fork_event event) override {
    if (event == net::execution_context::fork_child) host_->restart_in_child();
  }

  std::unique_ptr<timing_host_base> host_;
  pool_engine core_;
};

} // namespace

pool_core& hosted_timing_core(net::execution_context& ctx, timing_host_factory make, const void* source) {
  if (!net::has_service<timing_service>(ctx)) {
    try {
      return net::make_service<timing_service>(ctx, make(source)).core();
    } catch (const net::service_already_exists&) {
      // Another thread registered one first: use that.
    }
  }
  return net::use_service<timing_service>(ctx).core();
}

// ---------------------------------------------------------------- the drive protocol

// The drive invariant: at most one drive runs at a time, and every request made after a
// drive began its last look at the core is followed by another look. state_:
//   idle    nothing posted or running;
//   posted  one drive operation is queued on the context (in drive_slot_);
//   running a thread is inside drive_loop();
//   rerun   ... and a request came meanwhile: it looks again before going idle.
// A request moves idle -> posted (and posts) or running -> rerun; the drive leaves
// running for idle only by a compare-exchange that fails on rerun. The timer's expiry
// starts a drive itself (idle -> running) or requests one. Stop-here test: hook
// hosted_drive_before_idle (test/unit/detail/timing_service.cpp).
void timing_host_base::request_drive() noexcept {
  int s = state_.load(std::memory_order_acquire);
  for (;;) {
    if (s == idle) {
      if (state_.compare_exchange_weak(s, posted, std::memory_order_acq_rel)) break;
    } else if (s == running) {
      if (state_.compare_exchange_weak(s, rerun, std::memory_order_acq_rel)) return;
    } else {
      return; // posted or rerun: that drive will look
    }
  }
  try {
    post_drive(); // allocates nothing: drive_slot_ holds the one operation
  } catch (...) {
    // A host whose executor allocates on its own (a type-erased one) and ran out of
    // memory: the work stays in the core until the next request.
    state_.store(idle, std::memory_order_release);
    report_here(std::current_exception(), "the timing service's drive");
  }
}

void timing_host_base::run_posted_drive() noexcept {
  state_.store(running, std::memory_order_release);
  drive_loop();
}

void timing_host_base::on_timer(bool expired) noexcept {
  if (!expired) return; // re-armed or cancelled
  fired_.store(true, std::memory_order_release);
  int s = idle;
  if (state_.compare_exchange_strong(s, running, std::memory_order_acq_rel))
    drive_loop(); // on this thread, no hop: the due work completes where the timer did
  else
    request_drive();
}

void timing_host_base::drive_loop() noexcept {
  for (;;) {
    const pool_engine::drive_result r = engine(core_)->drive_hosted(drive_budget);
    METRONOME_TEST_HOOK(hook_point::hosted_drive_before_arm);
    if (r.next_due != armed_ || fired_.exchange(false, std::memory_order_acq_rel)) {
      try {
        if (r.next_due == clock::time_point::max())
          disarm();
        else
          arm(r.next_due);
        armed_ = r.next_due;
      } catch (...) { // out of memory for the timer's wait: the next drive arms again
        armed_ = clock::time_point::min();
        report_here(std::current_exception(), "the timing service's timer");
      }
    }
    METRONOME_TEST_HOOK(hook_point::hosted_drive_before_idle);
    // A handler threw: the exception leaves this Asio handler (rethrow_scope), and the
    // rest - what the drive left, and a request that came meanwhile - runs in a drive
    // posted behind it, never here (a second exception would have nowhere to go). Test:
    // stress `throwing_handlers_over_an_io_context_lose_nothing`.
    const bool threw = rethrow_scope::pending();
    if (r.more || threw) {
      state_.store(posted, std::memory_order_release);
      try {
        post_drive();
        return;
      } catch (...) {
        if (threw) { // no memory to post: the next request drives
          state_.store(idle, std::memory_order_release);
          return;
        }
        state_.store(running, std::memory_order_release);
        continue; // no memory to post: keep driving here
      }
    }
    int s = running;
    if (state_.compare_exchange_strong(s, idle, std::memory_order_acq_rel)) return;
    state_.store(running, std::memory_order_release); // rerun: a request came meanwhile
  }
}

void timing_host_base::restart_in_child() noexcept {
  // A drive of the parent's never finishes here, and the timer must be set again.
  state_.store(idle, std::memory_order_relaxed);
  fired_.store(false, std::memory_order_relaxed);
  armed_ = clock::time_point::min();
  request_drive();
}

} // namespace metronome::detail
