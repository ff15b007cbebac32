// scheduled_thread_pool's non-template members and pending_task.
#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/detail/pool_locator.hpp>
#include <metronome/detail/report.hpp>

#include <stdexcept>

namespace metronome {

scheduled_thread_pool::scheduled_thread_pool(std::size_t threads)
    : scheduled_thread_pool(pool_options::fixed(threads)) {}

scheduled_thread_pool::scheduled_thread_pool(pool_options options)
    : core_(std::make_unique<detail::pool_core>(std::move(options))) {
  try {
    core_->set_context(this);
    boost::asio::make_service<detail::pool_locator>(*this, *core_);
  } catch (...) {
    core_->close(); // the workers are running: join them before the core goes
    throw;
  }
}

scheduled_thread_pool::~scheduled_thread_pool() {
  core_->close();
  // Services (e.g. anything registered with use_service) go before the core.
  boost::asio::execution_context::shutdown();
  boost::asio::execution_context::destroy();
}

void scheduled_thread_pool::shutdown() { core_->shutdown(); }

std::vector<pending_task> scheduled_thread_pool::shutdown_now() {
  auto taken = core_->shutdown_now();
  std::vector<pending_task> out;
  try {
    out.reserve(taken.count);
  } catch (...) {
    core_->discard_taken(taken.head);
    throw;
  }
  while (taken.head)
    if (detail::task_base* t = detail::pool_core::next_taken(taken)) out.push_back(pending_task(t)); // reserved
  return out;
}

void scheduled_thread_pool::join() { core_->join(); }

pending_task& pending_task::operator=(pending_task&& o) noexcept {
  if (this != &o) {
    pending_task tmp(std::move(o));
    std::swap(task_, tmp.task_);
  }
  return *this;
}

pending_task::~pending_task() {
  if (!task_) return;
  if (task_->is_scheduled()) {
    auto* t = static_cast<detail::scheduled_task_base*>(task_);
    t->finish_cancelled();
    t->release();
  } else {
    task_->complete(false);
  }
}

void pending_task::operator()() {
  detail::task_base* t = std::exchange(task_, nullptr);
  if (!t) throw std::logic_error("metronome: pending_task already run or empty");
  t->complete(true);
}

} // namespace metronome
