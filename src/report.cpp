// Where exceptions of user code go: the current pool's handler, else stderr.
#include "pool_engine.hpp"
#include <metronome/detail/report.hpp>

namespace metronome::detail {

pool_core* current_pool() noexcept { return pool_core::current(); }

void report_here(const std::exception_ptr& e, const char* where) noexcept {
  if (pool_core* p = current_pool())
    p->report(e);
  else
    print_unhandled(e, where);
}

namespace {
// Exception handlers running on this thread, one inside another: a handler whose own
// work is reported again (it posts to a shut-down pool, whose drop is reported to it)
// recursed until the stack overflowed.
thread_local int handler_depth = 0;
constexpr int max_handler_depth = 8;
} // namespace

void call_exception_handler(const std::function<void(std::exception_ptr)>& handler, std::exception_ptr e,
                            const char* where) noexcept {
  if (handler_depth >= max_handler_depth) {
    print_unhandled(e, "an exception handler reporting in itself, 8 deep");
    return;
  }
  ++handler_depth;
  try {
    handler(std::move(e));
  } catch (...) {
    print_unhandled(std::current_exception(), where);
  }
  --handler_depth;
}

} // namespace metronome::detail
