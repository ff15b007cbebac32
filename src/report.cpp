// Where exceptions of user code go: the current pool's handler, else stderr.
#include "pool_engine.hpp"
#include <metronome/detail/report.hpp>

#include <utility>

namespace metronome::detail {

pool_core* current_pool() noexcept { return pool_core::current(); }

namespace {
// Where the outermost rethrow_scope of this thread keeps its exception; null: no scope.
thread_local std::exception_ptr* outermost_kept = nullptr;
} // namespace

rethrow_scope::rethrow_scope() noexcept : owner_(outermost_kept == nullptr) {
  if (owner_) outermost_kept = &kept_;
}

rethrow_scope::~rethrow_scope() {
  if (!owner_) return;
  outermost_kept = nullptr;
  if (kept_) print_unhandled(kept_, "completion handler");
}

void rethrow_scope::rethrow_if_any() {
  if (!owner_ || !kept_) return;
  outermost_kept = nullptr; // the handler ends here: a scope made while it unwinds is outermost
  owner_ = false;
  std::rethrow_exception(std::exchange(kept_, nullptr));
}

bool rethrow_scope::keep(const std::exception_ptr& e) noexcept {
  if (outermost_kept == nullptr || *outermost_kept) return false;
  *outermost_kept = e;
  return true;
}

bool rethrow_scope::pending() noexcept { return outermost_kept != nullptr && *outermost_kept; }

void report_here(const std::exception_ptr& e, const char* where) noexcept {
  if (pool_core* p = current_pool())
    p->report(e); // a hosted core (an io_context's timing service) keeps it in the scope
  else if (!rethrow_scope::keep(e))
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
