// Finds the metronome pool behind an executor: the one place that looks through an
// executor's context for a scheduled_thread_pool.
#ifndef METRONOME_DETAIL_POOL_OF_HPP
#define METRONOME_DETAIL_POOL_OF_HPP

#include <metronome/detail/core_access.hpp>
#include <metronome/detail/pool_core.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/detail/asio.hpp>

#include <type_traits>

namespace metronome::detail {

// Whether `Executor`'s context is a metronome pool (a pool's executor, or a
// serial_executor or other wrapper over one).
template <class Executor>
constexpr bool runs_on_a_metronome_pool() noexcept {
  if constexpr (requires(const Executor& ex) { net::query(ex, net::execution::context); })
    return std::is_convertible_v<decltype(net::query(std::declval<const Executor&>(),
                                                             net::execution::context)),
                                 scheduled_thread_pool&>;
  else
    return false;
}

// The engine of the pool behind `ex`, or nullptr when it is not a metronome executor.
template <class Executor>
pool_core* pool_of(const Executor& ex) noexcept {
  if constexpr (runs_on_a_metronome_pool<Executor>())
    return &core_access::core(static_cast<scheduled_thread_pool&>(net::query(ex, net::execution::context)));
  else
    return nullptr;
}

// The engine of a pool.
inline pool_core& pool_of(scheduled_thread_pool& pool) noexcept { return core_access::core(pool); }

} // namespace metronome::detail

#endif
