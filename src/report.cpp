// Where exceptions of user code go: the current pool's handler, else stderr.
#include <metronome/detail/pool_core.hpp>
#include <metronome/detail/report.hpp>

namespace metronome::detail {

pool_core* current_pool() noexcept { return pool_core::current(); }

void report_here(const std::exception_ptr& e, const char* where) noexcept {
  if (pool_core* p = current_pool())
    p->report(e);
  else
    print_unhandled(e, where);
}

void call_exception_handler(const std::function<void(std::exception_ptr)>& handler, std::exception_ptr e,
                            const char* where) noexcept {
  try {
    handler(std::move(e));
  } catch (...) {
    print_unhandled(std::current_exception(), where);
  }
}

} // namespace metronome::detail
