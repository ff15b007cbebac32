// hand_over_hold: keeps a pool from terminating while work it accepted waits in a strand
// over it.
#ifndef METRONOME_DETAIL_HAND_OVER_HOLD_HPP
#define METRONOME_DETAIL_HAND_OVER_HOLD_HPP

#include <metronome/detail/core_access.hpp>
#include <metronome/detail/pool_core.hpp>

#include <metronome/detail/asio.hpp>

#include <concepts>
#include <cstdint>
#include <type_traits>
#include <typeinfo>
#include <utility>

namespace metronome {
class scheduled_thread_pool;
} // namespace metronome

namespace metronome::detail {

// Whether E is a pool's own executor (specialised in impl/pool_executor.hpp): work handed
// to it goes into the pool's ready queue, where the pool sees it.
template <class E>
struct is_own_pool_executor : std::false_type {};

// The execution context an executor names (void when it names none).
template <class E>
struct context_of {
  using type = void;
};
template <class E>
  requires requires(const E& ex) { net::query(ex, net::execution::context); }
struct context_of<E> {
  using type = std::remove_cvref_t<decltype(net::query(std::declval<const E&>(), net::execution::context))>;
};

// The library hands work a pool accepted (a bound task, an operation's completion, a
// wheel timeout bound to an executor) to its executor. When that executor runs on the
// pool but is not the pool's own (an Asio strand over it, a serial executor, an
// any_io_executor holding one), the work may wait in the strand's queue behind an
// invoker that another thread is still posting, where the pool cannot see it. A
// hand_over_hold travels with the work: until the work runs (release()) or is destroyed,
// a shut-down pool does not terminate (pool_core::begin_hand_over; the invariant is
// above pool_engine::begin_hand_over, src/pool_lifecycle.cpp). Holds nothing for any
// other executor (hand_over_hold_for: no_hand_over_hold, empty, for an executor that never runs
// on a pool).
class hand_over_hold {
public:
  hand_over_hold() noexcept = default;
  explicit hand_over_hold(pool_core* core) noexcept {
    if (core != nullptr && core->begin_hand_over()) {
      core_ = core;
      anchor_ = core->anchor();
      generation_ = core->anchor_generation();
    }
  }
  hand_over_hold(hand_over_hold&& o) noexcept
      : core_(std::exchange(o.core_, nullptr)), anchor_(o.anchor_), generation_(o.generation_) {}
  hand_over_hold& operator=(hand_over_hold&& o) noexcept {
    if (this != &o) {
      release();
      core_ = std::exchange(o.core_, nullptr);
      anchor_ = o.anchor_;
      generation_ = o.generation_;
    }
    return *this;
  }
  ~hand_over_hold() { release(); }

  // The work runs now (or is about to be destroyed): the pool may terminate once it is idle.
  void release() noexcept {
    if (const pool_core* c = std::exchange(core_, nullptr)) pool_core::end_hand_over(c, anchor_, generation_);
  }

  // A hold for work handed to `ex`, taken only when `ex` runs on a metronome pool and is
  // not that pool's own executor.
  template <class Executor>
  static hand_over_hold for_executor(const Executor& ex) noexcept {
    using context = typename context_of<Executor>::type;
    constexpr bool own = is_own_pool_executor<Executor>::value;
    if constexpr (!own && std::is_same_v<context, net::execution_context>)
      return for_type_erased(ex);
    else if constexpr (!own && std::is_base_of_v<scheduled_thread_pool, context>)
      return hand_over_hold(&core_access::core(net::query(ex, net::execution::context)));
    else
      return {};
  }

private:
  // any_io_executor and its kin: what they hold is known only at run time. Recognised:
  // an Asio strand over a pool's executor (the pool's executor itself needs no hold);
  // another wrapper over a pool, erased, carries none, and none is recognised without
  // RTTI. The type is compared here: Asio 1.22's target<T>() casts without looking.
  template <class Executor>
  static hand_over_hold for_type_erased([[maybe_unused]] const Executor& ex) noexcept {
#if defined(__cpp_rtti) || defined(__GXX_RTTI)
    using strand = net::strand<typename scheduled_thread_pool_of<Executor>::executor_type>;
    if constexpr (requires {
                    { ex.target_type() == typeid(strand) } -> std::convertible_to<bool>;
                    ex.template target<strand>();
                  }) {
      if (ex.target_type() == typeid(strand))
        if (const strand* s = ex.template target<strand>())
          return hand_over_hold(&core_access::core(net::query(s->get_inner_executor(), net::execution::context)));
    }
#endif
    return {};
  }

  // Names scheduled_thread_pool in a dependent context: it is complete where these
  // templates are instantiated, not where they are defined.
  template <class, class Pool = scheduled_thread_pool>
  struct scheduled_thread_pool_of {
    using executor_type = typename Pool::executor_type;
  };

  const pool_core* core_ = nullptr;
  pool_anchor* anchor_ = nullptr;
  std::uint32_t generation_ = 0;
};

// What an executor that can never run on a metronome pool (an io_context's, a strand
// over one) carries instead: nothing.
struct no_hand_over_hold {
  template <class Executor>
  static no_hand_over_hold for_executor(const Executor&) noexcept {
    return {};
  }
  void release() noexcept {}
};

template <class Executor>
constexpr bool may_run_on_a_pool() noexcept;

// A function handed to an executor with the hold it carries; the hold goes first when it
// runs (on the pool's worker, which the pool cannot terminate under) or is destroyed.
template <class F, class Hold>
class held_function {
public:
  held_function(F f, Hold hold) : f_(std::move(f)), hold_(std::move(hold)) {}
  held_function(held_function&&) noexcept(std::is_nothrow_move_constructible_v<F>) = default;
  held_function& operator=(held_function&&) = delete;

  using allocator_type = net::associated_allocator_t<F>;
  allocator_type get_allocator() const noexcept { return net::get_associated_allocator(f_); }

  void operator()() {
    hold_.release();
    std::move(f_)();
  }

private:
  F f_;
  [[no_unique_address]] Hold hold_;
};

template <class Executor>
constexpr bool may_run_on_a_pool() noexcept {
  using context = typename context_of<Executor>::type;
  return !is_own_pool_executor<Executor>::value &&
         (std::is_same_v<context, net::execution_context> || std::is_base_of_v<scheduled_thread_pool, context>);
}

// The hold that work handed to an Executor carries.
template <class Executor>
using hand_over_hold_for = std::conditional_t<may_run_on_a_pool<Executor>(), hand_over_hold, no_hand_over_hold>;

// `f` about to be handed to `ex` by the library, on behalf of work a pool accepted.
template <class Executor, class F>
auto with_hand_over_hold(const Executor& ex, F&& f) {
  using hold = hand_over_hold_for<Executor>;
  return held_function<std::decay_t<F>, hold>(std::forward<F>(f), hold::for_executor(ex));
}

} // namespace metronome::detail

#endif
