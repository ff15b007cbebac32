// scheduled_thread_pool's non-template members and pending_task.
#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/detail/pool_locator.hpp>
#include <metronome/detail/report.hpp>

#include "pool_engine.hpp"

#include <metronome/detail/asio.hpp>

#include <stdexcept>

namespace metronome {

scheduled_thread_pool::scheduled_thread_pool(std::size_t threads)
    : scheduled_thread_pool(pool_options::fixed(threads)) {}

scheduled_thread_pool::scheduled_thread_pool(pool_options options)
    : core_(std::make_unique<detail::pool_engine>(std::move(options))) {
  try {
    core_->set_context(this);
    net::make_service<detail::pool_locator>(*this, *core_);
    // Asio's scheduler for I/O objects made on the pool, registered before any exists,
    // with no thread of its own (Asio's reactor makes one for any other context): the
    // pool's workers run it (src/reactor_adapter.hpp).
    const int hint = detail::engine(*core_).max_thread_count() == 1 ? 1 : 0; // 1: Asio's single-thread shortcuts
    detail::engine(*core_).attach_io(*this, hint);
  } catch (...) {
    detail::engine(*core_).close(); // the workers are running: join them before the core goes
    throw;
  }
}

scheduled_thread_pool::~scheduled_thread_pool() {
  detail::engine(*core_).close();
  detail::engine(*core_).release_io();
  // Services (e.g. anything registered with use_service) go before the core.
  net::execution_context::shutdown();
  net::execution_context::destroy();
}

void scheduled_thread_pool::shutdown() { detail::engine(*core_).shutdown(); }

std::vector<pending_task> scheduled_thread_pool::shutdown_now() {
  auto taken = detail::engine(*core_).shutdown_now();
  std::vector<pending_task> out;
  try {
    out.reserve(taken.count);
  } catch (...) {
    detail::engine(*core_).discard_taken(taken.head);
    throw;
  }
  detail::pool_engine& e = detail::engine(*core_);
  while (taken.head)
    if (detail::task_base* t = e.next_taken(taken, this)) out.push_back(pending_task(t)); // reserved
  return out;
}

void scheduled_thread_pool::join() { detail::engine(*core_).join(); }

pending_task& pending_task::operator=(pending_task&& o) noexcept {
  if (this != &o) {
    pending_task tmp(std::move(o));
    std::swap(task_, tmp.task_);
  }
  return *this;
}

pending_task::~pending_task() {
  if (task_) detail::discard(task_);
}

void pending_task::operator()() {
  detail::task_base* t = std::exchange(task_, nullptr);
  if (!t) throw std::logic_error("metronome: pending_task already run or empty");
  t->complete(true);
}

} // namespace metronome
