// The surface wheel_timer's templates call (detail/wheel_core.hpp), forwarded to the
// engine (wheel_engine.hpp).
#include "wheel_engine.hpp"

namespace metronome::detail {

std::unique_ptr<wheel_core> wheel_core::make(wheel_options opts, net::any_io_executor ex, pool_core* pool,
                                             pool_core* host) {
  return std::make_unique<wheel_engine>(std::move(opts), std::move(ex), pool, host);
}
void wheel_core::insert(wheel_entry* e, clock::duration delay) { engine(*this).insert(e, delay); }
void wheel_core::report(const wheel_entry* e, std::exception_ptr x) noexcept { wheel_engine::report(e, std::move(x)); }
std::vector<wheel_entry*> wheel_core::stop() { return engine(*this).stop(); }
std::size_t wheel_core::pending() const noexcept { return engine(*this).pending(); }
const net::any_io_executor& wheel_core::executor() const noexcept { return engine(*this).executor(); }
pool_core* wheel_core::pool() const noexcept { return engine(*this).pool(); }
clock::time_point wheel_core::now() const noexcept { return engine(*this).now(); }

} // namespace metronome::detail
