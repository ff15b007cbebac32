// The surface the library's templates call (detail/pool_core.hpp), forwarded to the
// engine (pool_engine.hpp). Each is a jump to the engine's function of the same name.
#include "pool_engine.hpp"

namespace metronome::detail {

clock::time_point pool_core::now() const noexcept { return engine(*this).now(); }
void pool_core::post(task_base* t, bool continuation, bool internal) noexcept {
  engine(*this).post(t, continuation, internal);
}
void pool_core::post_op(op_node* t, bool continuation, bool internal) noexcept {
  engine(*this).post_op(t, continuation, internal);
}
bool pool_core::running_in_this_thread() const noexcept { return engine(*this).running_in_this_thread(); }
pool_core* pool_core::current() noexcept { return pool_engine::current(); }
void pool_core::work_finished() noexcept { engine(*this).work_finished(); }

void pool_core::submit_scheduled(scheduled_task_base* t, clock::time_point due, clock::time_point current) {
  engine(*this).submit_scheduled(t, due, current);
}
void pool_core::promote_due_before(clock::time_point current) noexcept { engine(*this).promote_due_before(current); }
bool pool_core::add_wait(wait_node* n, clock::time_point due, clock::time_point current) {
  return engine(*this).add_wait(n, due, current);
}
void pool_core::cancel_wait(pool_anchor* anchor, std::uint32_t generation, wait_node* n) noexcept {
  pool_engine::cancel_wait(anchor, generation, n);
}
bool pool_core::withdraw_wait(pool_anchor* anchor, std::uint32_t generation, wait_node* n) noexcept {
  return pool_engine::withdraw_wait(anchor, generation, n);
}
bool pool_core::push_ready(task_base* t) noexcept { return engine(*this).push_ready(t); }
void pool_core::repost_from_worker(task_base* t) noexcept { engine(*this).repost_from_worker(t); }

bool pool_core::await_termination(clock::duration timeout) { return engine(*this).await_termination(timeout); }
bool pool_core::is_shutdown() const noexcept { return engine(*this).is_shutdown(); }
bool pool_core::is_terminated() const noexcept { return engine(*this).is_terminated(); }
pool_stats pool_core::stats() const { return engine(*this).stats(); }
std::size_t pool_core::thread_count() const noexcept { return engine(*this).thread_count(); }
void pool_core::wheel_wait_started() noexcept { engine(*this).wheel_wait_started(); }
void pool_core::wheel_wait_done() noexcept { engine(*this).wheel_wait_done(); }
bool pool_core::begin_hand_over() noexcept { return engine(*this).begin_hand_over(); }
void pool_core::end_hand_over(const pool_core* core, pool_anchor* anchor, std::uint32_t generation) noexcept {
  // On a worker of that pool, the pool exists and that worker is awake.
  if (pool_engine* here = pool_engine::current(); here != nullptr && static_cast<const pool_core*>(here) == core) {
    here->end_hand_over_here();
    return;
  }
  pool_engine::end_hand_over(anchor, generation);
}
void pool_core::report(const std::exception_ptr& e) noexcept { engine(*this).report(e); }

} // namespace metronome::detail
