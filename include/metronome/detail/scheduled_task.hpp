#ifndef METRONOME_DETAIL_SCHEDULED_TASK_HPP
#define METRONOME_DETAIL_SCHEDULED_TASK_HPP

#include <metronome/detail/task.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <new>
#include <optional>
#include <type_traits>
#include <utility>

namespace metronome::detail {

// Called once when a scheduled task reaches a terminal state (async_wait).
struct completion_hook {
  completion_hook* next_ = nullptr;
  virtual void on_complete() noexcept = 0;

protected:
  ~completion_hook() = default;
};

// The state shared by a scheduled task and its handles. One allocation holds the
// node, the callable and the result. Reference counted: one reference per handle
// and one while the pool holds it (queued or running).
class scheduled_task_base : public timed_node {
public:
  // State word: low bits are the phase, high bits flags.
  static constexpr std::uint32_t pending = 0, running = 1, done = 2, cancelled = 3;
  static constexpr std::uint32_t phase_mask = 0x7;
  static constexpr std::uint32_t cancel_requested = 0x8; // periodic run in progress
  static constexpr std::uint32_t has_waiters = 0x10;

  explicit scheduled_task_base(pool_core* pool) noexcept;

  void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  std::uint32_t phase() const noexcept { return state_.load(std::memory_order_acquire) & phase_mask; }
  bool is_terminal() const noexcept { return phase() >= done; }
  bool is_periodic() const noexcept { return kind_ == task_kind::periodic; }

  // Handle-side operations (src/scheduled_task.cpp).
  bool cancel() noexcept;
  void wait() const;
  bool wait_until(clock::time_point real_deadline) const;
  clock::duration delay() const noexcept;
  // false when the task already ended (the caller delivers the result itself).
  bool add_hook(completion_hook* h) noexcept;
  std::exception_ptr failure() const; // cancelled_error, the task's exception, or null
  void rethrow_if_failed() const;

  // Pool-side operations.
  bool try_start() noexcept;                    // pending -> running
  void finish() noexcept;                         // running -> done (value or error stored)
  bool finish_cancelled() noexcept;             // pending/running -> cancelled, destroys callable
  bool try_rearm() noexcept;                    // running -> pending unless cancel requested
  void set_error(std::exception_ptr e) noexcept { error_ = std::move(e); }

  virtual bool invoke() noexcept = 0;          // false if the callable threw (error stored)
  virtual void destroy_callable() noexcept = 0;

  pool_core* pool_;
  clock::duration period_{0};
  bool fixed_delay_ = false;
  periodic_options periodic_;

protected:
  virtual ~scheduled_task_base() = default;
  std::exception_ptr error_;

private:
  void notify_terminal(std::uint32_t old_state) noexcept;
  static void complete_thunk(task_base* t, bool run);

  mutable std::atomic<std::uint32_t> state_{pending};
  std::atomic<std::uint32_t> refs_{1};
  std::atomic<completion_hook*> hooks_{nullptr};
};

template <class R>
class scheduled_result : public scheduled_task_base {
public:
  using scheduled_task_base::scheduled_task_base;
  std::optional<R> value_;
};

template <>
class scheduled_result<void> : public scheduled_task_base {
public:
  using scheduled_task_base::scheduled_task_base;
};

template <class R, class F>
class scheduled_task final : public scheduled_result<R> {
public:
  template <class G>
  scheduled_task(pool_core* pool, G&& g) : scheduled_result<R>(pool) {
    ::new (static_cast<void*>(&storage_)) F(std::forward<G>(g));
    alive_ = true;
  }

  bool invoke() noexcept override {
    try {
      F& f = *std::launder(reinterpret_cast<F*>(&storage_));
      if constexpr (std::is_void_v<R>) {
        std::invoke(f);
      } else {
        this->value_.emplace(std::invoke(f));
      }
      return true;
    } catch (...) {
      this->error_ = std::current_exception();
      return false;
    }
  }

  void destroy_callable() noexcept override {
    if (alive_) {
      alive_ = false;
      std::launder(reinterpret_cast<F*>(&storage_))->~F();
    }
  }

private:
  ~scheduled_task() override { destroy_callable(); }

  alignas(F) unsigned char storage_[sizeof(F)];
  bool alive_ = false;
};

} // namespace metronome::detail

#endif
