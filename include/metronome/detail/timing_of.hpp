// timing_of: which engine keeps the timing of work started on an executor.
#ifndef METRONOME_DETAIL_TIMING_OF_HPP
#define METRONOME_DETAIL_TIMING_OF_HPP

#include <metronome/detail/pool_core.hpp>
#include <metronome/detail/pool_locator.hpp>
#include <metronome/detail/pool_of.hpp>
#include <metronome/detail/timing_service.hpp>

#include <metronome/detail/asio.hpp>

#include <type_traits>

namespace metronome::detail {

// The engine that keeps a wait (or a serial executor's delayed work) started on `ex`:
// the metronome pool behind it (a pool's executor, a serial_executor or strand over one,
// an any_io_executor wrapping one), else the timing service of ex's own execution
// context, driven by that context's threads (timing_service.hpp).
template <class Executor>
pool_core& pool_core_of(const Executor& ex) {
  if constexpr (requires { net::query(ex, net::execution::context); }) {
    decltype(auto) ctx = net::query(ex, net::execution::context);
    if constexpr (runs_on_a_metronome_pool<Executor>()) {
      return *pool_of(ex);
    } else {
      static_assert(std::is_convertible_v<decltype(ctx), net::execution_context&>,
                    "metronome: an executor whose context is not an Asio execution_context");
      if (pool_core* pool = pool_locator::find(ctx)) return *pool;
      return hosted_core_of(ctx, ex);
    }
  } else {
    static_assert(requires { ex.context(); }, "metronome: an executor without a context");
    if (pool_core* pool = pool_locator::find(ex.context())) return *pool;
    return hosted_core_of(ex.context(), ex);
  }
}

} // namespace metronome::detail

#endif
