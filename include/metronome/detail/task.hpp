// task_base: the node every piece of work in a pool is, and its kinds.
#ifndef METRONOME_DETAIL_TASK_HPP
#define METRONOME_DETAIL_TASK_HPP

#include <metronome/options.hpp>

#include <metronome/detail/asio.hpp>
#include <metronome/detail/asio_internals.hpp>


#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <ratio>
#include <type_traits>

namespace metronome::detail {

class pool_core;

// op: fire-and-forget executor work; one_shot/periodic: scheduled_task_base;
// wait: an async_delay.
// op: executor work; one_shot/periodic: the typed API's tasks; wait: an async_delay
// wait (also in the delay queue); completion: another library completion queued on the
// pool (a wheel's async_wait). Waits and completions are not tasks: shutdown_now() never
// returns them, a worker discards them once the pool is stopped.
enum class task_kind : std::uint8_t { op, one_shot, periodic, wait, completion };

// A node in the ready queue. `complete(run=true)` invokes and frees it;
// `complete(run=false)` frees it without invoking (shutdown_now, dispose).
// Exceptions of the invocation propagate to the caller (the worker reports them).
// `complete_` receives the action: 0 = discard, 1 = run; a node type may use values
// from 2 up for its own purposes, with `io` pointing at the action's argument or result
// (the wheel's entries and the scheduled tasks do: one function pointer per node type
// instead of a vtable keeps a timeout at 64 bytes).
struct task_base {
  using complete_fn = void (*)(task_base*, unsigned action, void* io);
  static constexpr unsigned discard_action = 0, run_action = 1;

  explicit task_base(complete_fn fn) noexcept : complete_(fn) {}
  task_base(const task_base&) = delete;
  task_base& operator=(const task_base&) = delete;

  void complete(bool run) { complete_(this, run ? run_action : discard_action, nullptr); }

  bool is_scheduled() const noexcept { return kind_ == task_kind::one_shot || kind_ == task_kind::periodic; }
  // A library completion (an async_delay wait, a wheel's async_wait), not a task.
  bool is_completion() const noexcept { return kind_ == task_kind::wait || kind_ == task_kind::completion; }

  std::atomic<task_base*> next_{nullptr};
  complete_fn complete_;
  task_kind kind_ : 4 = task_kind::op;
  // An Asio strand's invoker queued on the pool (post_op): shutdown_now() destroys it
  // rather than hand it out (it holds the pool's executor, and runs handlers that post
  // to the pool). Shares kind_'s byte (the wheel's nodes use the padding after it).
  bool strand_invoker_ : 1 = false;
  // An op_node that pool_core::post_op() sampled for the queue-wait statistic: its
  // queued_at_ holds the pool's time when it was queued. Shares kind_'s byte too.
  bool sampled_ : 1 = false;
  // A typed-API task whose callable has an associated executor of its own
  // (bind_executor): when due, a worker hands it there (scheduled_task_base::hand_off).
  bool bound_ : 1 = false;
  // A scheduled task whose node carries task_extras (periodic, a serial executor's).
  bool has_extras_ : 1 = false;
  // kind_'s byte is written only before the node is published (its constructor, the
  // submitting thread): a bit field's write is a write of the whole byte.
};

// Ends a task without running it, wherever it was left (shutdown_now's leftovers, a
// disposed serial executor's queue, a pending_task never run): a scheduled task reads
// cancelled and drops its reference; an executor op destroys its function. Whatever that
// destruction throws is swallowed: the task is gone either way.
inline void discard(task_base* t) noexcept {
  try {
    t->complete(false);
  } catch (...) {
  }
}

// Executor-path work (executor_op): post_op() samples one in post_sample_every of these
// per posting thread, and the worker that starts a sampled one records its queue wait.
struct op_node : task_base {
  using task_base::task_base;
  clock::rep queued_at_ = 0; // the pool's time at post_op(), when sampled_
};

// A heap position; the heap refuses to grow to not_in_heap entries.
using heap_index_t = std::uint32_t;
inline constexpr heap_index_t not_in_heap = std::numeric_limits<heap_index_t>::max();

// A node that can sit in the delay heap: ordered by (due, seq).
struct timed_node : task_base {
  using task_base::task_base;

  clock::time_point due() const noexcept {
    return clock::time_point(clock::duration(due_.load(std::memory_order_relaxed)));
  }
  void set_due(clock::time_point t) noexcept { due_.store(t.time_since_epoch().count(), std::memory_order_relaxed); }

  // The small fields first: they sit in task_base's tail padding (three bytes and the
  // heap position fill it, so that a timed node is 32 bytes).
  // Scheduled tasks: what the callable's storage holds (the callable, or once it is gone
  // the exception of a finished run: scheduled_task::keep_error).
  static constexpr std::uint8_t holds_nothing = 0, holds_callable = 1, holds_error = 2;
  std::uint8_t storage_holds_ = holds_nothing;
  // This run waited for a due time (it went through the delay heap, or is a periodic
  // run): its start counts as lateness in the pool's stats, else as queue wait.
  bool timed_ = false;
  // A scheduled task of a pool on a manual clock: cancel() takes it out of the delay
  // queue before its completions, not after (scheduled_task_base::cancel()).
  bool cancel_removes_first_ = false;
  heap_index_t heap_index_ = not_in_heap;
  // Written under the pool mutex; read by handles (delay()) without it. The FIFO
  // sequence number of equal due times lives in the heap entry only.
  std::atomic<clock::rep> due_{0};
};

// A pending async_delay: completes with success when due, or operation_aborted when
// aborted_ is set (per-operation cancellation, pool shutdown).
struct wait_node : timed_node {
  explicit wait_node(complete_fn fn) noexcept : timed_node(fn) { kind_ = task_kind::wait; }
  bool aborted_ = false;
  // A wait whose canceller may act before add_wait() has queued it (a P2300 operation's
  // stop callback, registered before the wait is added: metronome/execution.hpp). Set by
  // its owner before the canceller can run; cleared by add_wait() under the pool mutex.
  // A cancel_wait() that finds it set records cancel_before_add_ (under that mutex), and
  // add_wait() then queues the wait aborted instead of timing it: a stop request that
  // comes before the wait is in the delay queue is never lost.
  bool adding_ = false;
  bool cancel_before_add_ = false;
  // A wheel's tick (wheel_tick.cpp): does not keep its pool from terminating, and
  // outlives shutdown() in the heap (the wheel keeps delivering until termination).
  bool untracked_ = false;
  // A cancel_after's timer: a deadline on an operation, not a wait of its own. After
  // shutdown() it is kept and timed as a delayed one-shot task is
  // (pool_options::run_delayed_after_shutdown; pool_engine::keeps_deadline): a drain
  // keeps its operations' deadlines, and the pool terminates once they fired or left.
  bool deadline_ = false;
};

// Saturating now + d: never wraps past time_point::max().
__extension__ using wide_int = __int128; // g++ and clang, on 64-bit targets

// `d` in the clock's nanoseconds, clamped to the range they can count (any source
// duration: coarser or finer than a nanosecond, integral or floating; NaN is zero).
// Truncates toward zero, as duration_cast does.
template <class Rep, class Period>
clock::duration saturating_duration(std::chrono::duration<Rep, Period> d) noexcept {
  static_assert(std::is_arithmetic_v<Rep>, "metronome: durations with an arithmetic representation");
  using ns_ratio = std::ratio_divide<Period, std::nano>; // one unit of d, in nanoseconds
  using limits = std::numeric_limits<clock::rep>;
  if constexpr (std::is_floating_point_v<Rep>) {
    const long double v = static_cast<long double>(d.count()) * ns_ratio::num / ns_ratio::den;
    if (v != v) return clock::duration::zero();
    if (v >= static_cast<long double>(limits::max())) return clock::duration::max();
    if (v <= static_cast<long double>(limits::min())) return clock::duration::min();
    return clock::duration(static_cast<clock::rep>(v));
  } else {
    static_assert(sizeof(Rep) <= sizeof(std::int64_t), "metronome: durations up to 64 bits");
    // |count| < 2^64 and num < 2^63: the product fits in 128 bits.
    const wide_int v = static_cast<wide_int>(d.count()) * ns_ratio::num / ns_ratio::den;
    if (v >= limits::max()) return clock::duration::max();
    if (v <= limits::min()) return clock::duration::min();
    return clock::duration(static_cast<clock::rep>(v));
  }
}

// now + d, saturating at time_point::max(); d <= 0 gives now.
template <class Rep, class Period>
clock::time_point saturating_add(clock::time_point now, std::chrono::duration<Rep, Period> d) noexcept {
  const clock::duration ns = saturating_duration(d);
  if (ns <= clock::duration::zero()) return now;
  if (now.time_since_epoch() > clock::duration::zero() && ns >= clock::time_point::max() - now)
    return clock::time_point::max();
  return now + ns;
}

template <class F>
inline constexpr bool is_executor_binder = false;
template <class T, class E>
inline constexpr bool is_executor_binder<net::executor_binder<T, E>> = true;

// True when a callable is observably empty (null pointer, empty std::function…), also
// inside the wrapper asio::post/dispatch/defer put around a handler on its way to
// execute(). (Behind a type-erased executor the handler cannot be seen: not checked.)
template <class F>
bool is_empty_callable(const F& f) noexcept {
  if constexpr (asio_internals::is_binder0<F>) {
    return is_empty_callable(asio_internals::binder0_handler(f));
  } else if constexpr (is_executor_binder<F>) {
    return is_empty_callable(f.get());
  } else if constexpr (std::is_pointer_v<F> || std::is_member_pointer_v<F>) {
    return f == nullptr;
  } else if constexpr (!std::is_function_v<F> && requires { static_cast<bool>(f == nullptr); }) {
    // (A function itself, not a pointer, is never null: comparing it warns.)
    return static_cast<bool>(f == nullptr);
  } else {
    return false;
  }
}

} // namespace metronome::detail

#endif
