#ifndef METRONOME_DETAIL_POOL_LOCATOR_HPP
#define METRONOME_DETAIL_POOL_LOCATOR_HPP

#include <metronome/detail/asio.hpp>

namespace metronome::detail {

class pool_core;

// A service every scheduled_thread_pool registers in itself, so that code holding only
// an `execution_context&` (what a type-erased executor or a strand over a pool reports)
// can tell whether it is a metronome pool: execution_context is not polymorphic.
class pool_locator final : public net::execution_context::service {
public:
  static inline net::execution_context::id id;

  pool_locator(net::execution_context& ctx, pool_core& core)
      : net::execution_context::service(ctx), core_(&core) {}
  // Required by use_service; find() never lets it create one.
  explicit pool_locator(net::execution_context& ctx) : net::execution_context::service(ctx) {}

  // The pool behind `ctx`, or nullptr. Takes the context's service registry mutex.
  static pool_core* find(net::execution_context& ctx) noexcept {
    if (!net::has_service<pool_locator>(ctx)) return nullptr;
    return net::use_service<pool_locator>(ctx).core_;
  }

private:
  void shutdown() override {}
  pool_core* core_ = nullptr;
};

} // namespace metronome::detail

#endif
