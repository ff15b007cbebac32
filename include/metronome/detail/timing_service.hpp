// timing_service: the timing of an Asio context that is not a metronome pool (an
// io_context, an asio::thread_pool...), driven by that context's own threads.
#ifndef METRONOME_DETAIL_TIMING_SERVICE_HPP
#define METRONOME_DETAIL_TIMING_SERVICE_HPP

#include <metronome/detail/pool_core.hpp>

#include <metronome/detail/asio.hpp>
#include <metronome/detail/report.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <new>
#include <optional>

namespace metronome::detail {

// Memory for one Asio operation at a time, owned by the host: its handlers are posted
// from paths that must not fail (a cancel, a push), so they allocate nothing. A second
// operation while the first is alive (a timer re-armed before its cancelled wait ran)
// gets plain operator new.
class handler_slot {
public:
  void* allocate(std::size_t n) {
    if (n <= sizeof(buf_) && !used_.exchange(true, std::memory_order_acquire)) return buf_;
    return ::operator new(n);
  }
  void deallocate(void* p) noexcept {
    if (p == buf_)
      used_.store(false, std::memory_order_release);
    else
      ::operator delete(p);
  }

private:
  alignas(std::max_align_t) unsigned char buf_[512];
  std::atomic<bool> used_{false};
};

template <class T>
struct slot_allocator {
  using value_type = T;
  handler_slot* slot;
  explicit slot_allocator(handler_slot* s) noexcept : slot(s) {}
  template <class U>
  slot_allocator(const slot_allocator<U>& o) noexcept : slot(o.slot) {}
  T* allocate(std::size_t n) { return static_cast<T*>(slot->allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t) noexcept { slot->deallocate(p); }
  template <class U>
  bool operator==(const slot_allocator<U>& o) const noexcept { return slot == o.slot; }
};

// Drives a hosted pool_core from an Asio context: one drive at a time (a drive is an
// operation posted to the context, or the context's timer expiring), and one timer of
// the context armed at the core's earliest due time. The drive protocol is in
// src/timing_service.cpp; what depends on the host executor's type is timing_host.
class timing_host_base : public core_host {
public:
  timing_host_base() = default;
  timing_host_base(const timing_host_base&) = delete;
  timing_host_base& operator=(const timing_host_base&) = delete;
  virtual ~timing_host_base() = default;

  void attach(pool_core& core) noexcept { core_ = &core; }
  void request_drive() noexcept override;
  void run_posted_drive() noexcept; // the posted drive operation's body
  void on_timer(bool expired) noexcept;
  // The context shuts down (after the core closed): no drive or timer from here on.
  virtual void shutdown() noexcept = 0;
  // fork(): in the child, no drive runs and the timer must be armed again.
  void restart_in_child() noexcept;

protected:
  virtual void post_drive() = 0;                 // one drive operation, from drive_slot_
  virtual void arm(clock::time_point due) = 0;  // on a drive only
  virtual void disarm() noexcept = 0;           // on a drive, or at shutdown

  handler_slot drive_slot_;
  handler_slot timer_slot_;

private:
  void drive_loop() noexcept;

  enum : int { idle, posted, running, rerun };
  pool_core* core_ = nullptr;
  std::atomic<int> state_{idle};
  std::atomic<bool> fired_{false};              // the timer expired since the last arm
  clock::time_point armed_ = clock::time_point::max(); // what the timer waits for (drives only)
};

template <class Executor>
class timing_host final : public timing_host_base {
  struct drive_op {
    timing_host* host;
    using allocator_type = slot_allocator<void>;
    allocator_type get_allocator() const noexcept { return allocator_type(&host->drive_slot_); }
    void operator()() const {
      rethrow_scope scope; // a handler that throws leaves this one (Asio's rule)
      host->run_posted_drive();
      scope.rethrow_if_any();
    }
  };
  struct timer_op {
    timing_host* host;
    using allocator_type = slot_allocator<void>;
    allocator_type get_allocator() const noexcept { return allocator_type(&host->timer_slot_); }
    void operator()(const error_code& ec) const {
      rethrow_scope scope;
      host->on_timer(!ec);
      scope.rethrow_if_any();
    }
  };

public:
  explicit timing_host(const Executor& ex) : ex_(ex) {}

  // Cancels and destroys the timer here, while every service of the context lives: made on
  // first use, its services may have been registered after ours, and a context destroys
  // its services in the reverse order - theirs before ours (a use after free under ASan
  // when the timer was destroyed with the host).
  void shutdown() noexcept override {
    disarm();
    timer_.reset();
  }

private:
  using timer_type = net::basic_waitable_timer<clock, net::wait_traits<clock>, Executor>;

  void post_drive() override { net::post(ex_, drive_op{this}); }
  // The timer is made for the first timed work, not with the host: on a context that is
  // neither an io_context nor a thread_pool, Asio gives a timer's reactor a thread of its
  // own, which a host that never times anything (waits that complete at once, a wheel on
  // a manual clock) must not start. Made on a drive, as every arm().
  void arm(clock::time_point due) override {
    if (!timer_) timer_.emplace(ex_);
    timer_->expires_at(due);
    timer_->async_wait(timer_op{this});
  }
  void disarm() noexcept override {
    if (!timer_) return;
    try {
      timer_->cancel(); // (the error_code overload is gone since Asio 1.33)
    } catch (...) { // only a failing reactor throws here: the wait then completes at its due time, a no-op
    }
  }

  Executor ex_;
  std::optional<timer_type> timer_;
};

using timing_host_factory = std::unique_ptr<timing_host_base> (*)(const void* source);

// The hosted core of `ctx`, made on first use with the host make(source) returns.
pool_core& hosted_timing_core(net::execution_context& ctx, timing_host_factory make, const void* source);

// The host of a context: its own executor when its type has one (an io_context, a
// thread_pool: never a strand, which would order the drives with the strand's work),
// else the executor a wait came with (behind an any_io_executor).
template <class Context, class Executor>
pool_core& hosted_core_of(Context& ctx, const Executor& ex) {
  if constexpr (requires { ctx.get_executor(); }) {
    using host_ex = decltype(ctx.get_executor());
    return hosted_timing_core(
        ctx, [](const void* c) -> std::unique_ptr<timing_host_base> {
          return std::make_unique<timing_host<host_ex>>(static_cast<Context*>(const_cast<void*>(c))->get_executor());
        },
        &ctx);
  } else {
    return hosted_timing_core(
        ctx, [](const void* e) -> std::unique_ptr<timing_host_base> {
          return std::make_unique<timing_host<Executor>>(*static_cast<const Executor*>(e));
        },
        &ex);
  }
}

} // namespace metronome::detail

#endif
