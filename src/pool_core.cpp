#include <metronome/detail/pool_core.hpp>
#include <metronome/detail/node_cache.hpp>
#include <metronome/detail/report.hpp>
#include <metronome/manual_clock.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

#include <pthread.h>
#include <sys/prctl.h>

namespace metronome::detail {

struct worker {
  worker(pool_core* p, std::size_t i, bool c) : pool(p), id(i), core(c) {}

  pool_core* pool;
  std::size_t id;
  bool core;
  bool exited = false; // guarded by pool mutex
  std::thread thread;
  // Private continuation queue (defer from this thread); touched only by this thread.
  task_base* local_head = nullptr;
  task_base* local_tail = nullptr;
  unsigned tick = 0;
  alignas(64) std::atomic<std::uint64_t> completed{0};
  std::atomic<bool> busy{false};
};

namespace {

thread_local worker* this_worker = nullptr;
// Set when a pool is destroyed from inside one of its own tasks: that worker must
// not touch the pool again once the task returns.
thread_local bool this_thread_orphaned = false;

// Returned by park() when the caller should look for work again.
task_base* const retry_marker = reinterpret_cast<task_base*>(alignof(task_base));

constexpr clock::rep no_due = std::numeric_limits<clock::rep>::max();
constexpr int spin_rounds = 32;
constexpr int spin_pause_rounds = 16;

// A scheduled task cancelled while it waited in a queue (inbox, heap): drops the
// queue's reference; true if so, and the task goes no further.
bool release_if_cancelled(task_base* t) noexcept {
  if (!t->is_scheduled()) return false;
  auto* st = static_cast<scheduled_task_base*>(t);
  if (st->phase() == scheduled_task_base::pending) return false;
  st->release();
  return true;
}

task_base* pop_local(worker& w) noexcept {
  task_base* t = w.local_head;
  w.local_head = t->next_.load(std::memory_order_relaxed);
  if (!w.local_head) w.local_tail = nullptr;
  return t;
}

} // namespace

void init_library_thread(std::string name) noexcept {
  if (name.size() > 15) name = name.substr(name.size() - 15);
  ::pthread_setname_np(::pthread_self(), name.c_str());
  // Timed waits of this thread are deadlines: let the kernel wake it on time, not up
  // to 50 us late (the default slack, which every wheel tick and heap timer paid).
  ::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
}

pool_core::pool_core(pool_options opts) : opts_(std::move(opts)), manual_(opts_.time_source) {
  if (opts_.threads == 0) throw std::invalid_argument("metronome: a pool needs at least one thread");
  core_threads_ = opts_.threads;
  max_threads_ = std::max(opts_.threads, opts_.max_threads);
  if (opts_.keep_alive <= std::chrono::nanoseconds::zero() && max_threads_ > core_threads_)
    throw std::invalid_argument("metronome: keep_alive must be positive for an elastic pool");
  next_due_.store(no_due);
  if (manual_) manual_->attach(this);
  std::lock_guard lk(mtx_);
  try {
    for (std::size_t i = 0; i < core_threads_; ++i) start_worker(true);
  } catch (...) {
    terminated_ = true;
    follower_cv_.notify_all();
    leader_cv_.notify_all();
    throw;
  }
}

pool_core::~pool_core() {
  if (manual_) manual_->detach(this);
  for (auto& w : workers_)
    if (w->thread.joinable()) w->thread.detach();
}

clock::time_point pool_core::now() const noexcept { return manual_ ? manual_->now() : clock::now(); }

bool pool_core::running_in_this_thread() const noexcept { return this_worker != nullptr && this_worker->pool == this; }

void pool_core::report(std::exception_ptr e) noexcept {
  if (opts_.exception_handler) {
    try {
      opts_.exception_handler(e);
    } catch (...) {
    }
    return;
  }
  print_unhandled(e, "task");
}

void print_unhandled(std::exception_ptr e, const char* where) noexcept {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "metronome: unhandled exception in %s: %s\n", where, ex.what());
  } catch (...) {
    std::fprintf(stderr, "metronome: unhandled exception in %s\n", where);
  }
}

// ---------------------------------------------------------------- threads

void pool_core::start_worker(bool core) {
  // Reap elastic workers that have exited.
  for (auto it = workers_.begin(); it != workers_.end();) {
    if ((*it)->exited) {
      if ((*it)->thread.joinable()) (*it)->thread.join();
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  auto w = std::make_unique<worker>(this, next_worker_id_++, core);
  worker* raw = w.get();
  workers_.push_back(std::move(w));
  threads_.fetch_add(1);
  ++awake_;
  try {
    raw->thread = std::thread([this, raw] { worker_main(*raw); });
  } catch (...) {
    workers_.pop_back();
    threads_.fetch_sub(1);
    --awake_;
    throw;
  }
  std::size_t n = threads_.load();
  std::size_t largest = largest_.load();
  while (n > largest && !largest_.compare_exchange_weak(largest, n)) {
  }
}

void pool_core::worker_main(worker& w) {
  this_worker = &w;
  init_library_thread(opts_.thread_name_prefix + "-" + std::to_string(w.id));
  node_cache_defer_frees(true); // unmap emptied node chunks when idle, not mid-burst
  for (;;) {
    task_base* t = next_task(w);
    if (!t) break;
    run_task(w, t);
    if (this_thread_orphaned) {
      this_thread_orphaned = false;
      this_worker = nullptr;
      return;
    }
  }
  // Continuations left behind by shutdown_now are dropped, and reported.
  while (w.local_head) discard_task(pop_local(w));
  while (node_cache_trim(8, true)) {
  }
  this_worker = nullptr;
  std::lock_guard lk(mtx_);
  retired_completed_.fetch_add(w.completed.load());
  w.completed.store(0);
  threads_.fetch_sub(1);
  w.exited = true;
}

task_base* pool_core::next_task(worker& w) {
  for (;;) {
    if (w.local_head && ((++w.tick % 61) != 0 || !ready_.maybe_nonempty())) return pop_local(w);

    clock::rep nd = next_due_.load(std::memory_order_relaxed);
    if (nd != no_due && !manual_) {
      const clock::time_point current = clock::now();
      if (current.time_since_epoch().count() >= nd) promote_due(current);
    }

    if (task_base* t = ready_.try_pop()) {
      if (ready_.maybe_nonempty()) maybe_wake_after_push(); // more queued: get help
      return t;
    }
    if (w.local_head) return pop_local(w);

    // Spin briefly: a producer that sees a spinning worker does not wake anybody.
    spinning_.fetch_add(1, std::memory_order_seq_cst);
    for (int i = 0; i < spin_rounds; ++i) {
      if (ready_.maybe_nonempty()) {
        if (task_base* t = ready_.try_pop()) {
          // The last spinner found work: if more is queued, get another worker going.
          spinning_.fetch_sub(1, std::memory_order_seq_cst);
          if (ready_.maybe_nonempty()) maybe_wake_after_push();
          return t;
        }
      }
      if (i < spin_pause_rounds) {
        for (int k = 0; k < 16; ++k) cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }
    spinning_.fetch_sub(1, std::memory_order_seq_cst);
    // Idle: unmap a little of the node chunks a burst left empty, then look for work
    // again; park once there is none left to unmap.
    if (node_cache_trim(2)) continue;

    std::unique_lock lk(mtx_);
    task_base* t = park(w, lk);
    if (t != retry_marker) return t;
  }
}

// Called with mtx_ held. Returns retry_marker when there may be work, nullptr to exit.
task_base* pool_core::park(worker& w, std::unique_lock<std::mutex>& lk) {
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  struct leave_guard {
    pool_core* p;
    ~leave_guard() {
      p->sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      // A leader that leaves hands the heap to a follower (Java's DelayedWorkQueue).
      if (!p->manual_ && p->leader_ == nullptr && !p->heap_.empty() && p->followers_ > p->wake_tokens_) {
        ++p->wake_tokens_;
        p->follower_cv_.notify_one();
      }
    }
  } guard{this};

  for (;;) {
    if (!ready_.empty()) return retry_marker;
    drain_inbox_locked();
    if (!heap_.empty()) {
      const clock::time_point current = now();
      if (heap_.top()->due() <= current) {
        if (promote_due_locked(current) > 1) wake_some_locked(1);
        return retry_marker;
      }
    }
    if (terminated_.load()) return nullptr;
    if ((shutdown_.load() || joining_) && idle_for_termination_locked(closer_in_pool_ ? 2 : 1)) {
      terminate_locked();
      if (terminated_.load()) return nullptr;
      return retry_marker;
    }

    --awake_;
    bool timed_out = false;
    if (!heap_.empty() && !manual_ && leader_ == nullptr) {
      leader_ = &w;
      auto due = heap_.top()->due();
      if (node_cache_trim_pending()) // wake to unmap the node chunks a burst left empty
        leader_cv_.wait_until(lk, std::min(due, clock::now() + node_cache_trim_delay));
      else if (due == clock::time_point::max())
        leader_cv_.wait(lk);
      else
        leader_cv_.wait_until(lk, due);
      leader_ = nullptr;
    } else {
      ++followers_;
      if (node_cache_trim_pending()) // wake to unmap the node chunks a burst left empty
        follower_cv_.wait_for(lk, node_cache_trim_delay);
      else if (!w.core)
        timed_out = follower_cv_.wait_for(lk, opts_.keep_alive) == std::cv_status::timeout;
      else
        follower_cv_.wait(lk);
      --followers_;
      if (wake_tokens_ > 0) --wake_tokens_;
    }
    ++awake_;

    if (timed_out && ready_.empty() && !terminated_.load() && (heap_.empty() || leader_ != nullptr)) {
      --awake_; // this elastic thread retires
      return nullptr;
    }
    if (node_cache_trim_pending()) {
      lk.unlock();
      while (node_cache_trim(8)) {
      }
      lk.lock();
    }
  }
}

bool pool_core::idle_for_termination_locked(int awake_expected) const noexcept {
  return awake_ == awake_expected && ready_.empty() && heap_.empty() && inbox_.empty() &&
         (tracked_work_.load() == 0 || stopped_.load() || closing_);
}

void pool_core::terminate_locked() noexcept {
  terminated_.store(true, std::memory_order_seq_cst);
  // A producer may have pushed between our emptiness check and the store above; it
  // will see terminated_ and drop its work. If the queue is not empty now, we back off.
  if (!ready_.empty()) {
    terminated_.store(false, std::memory_order_seq_cst);
    return;
  }
  follower_cv_.notify_all();
  leader_cv_.notify_all();
  terminated_cv_.notify_all();
}

void pool_core::wake_one() noexcept {
  std::lock_guard lk(mtx_);
  wake_some_locked(1);
}

void pool_core::wake_some_locked(std::size_t n) noexcept {
  while (n > 0 && followers_ > wake_tokens_) {
    ++wake_tokens_;
    follower_cv_.notify_one();
    --n;
  }
  if (n > 0 && leader_ != nullptr) leader_cv_.notify_one();
}

void pool_core::wake_all_locked() noexcept {
  wake_tokens_ = followers_;
  follower_cv_.notify_all();
  leader_cv_.notify_all();
}

void pool_core::maybe_wake_after_push() noexcept {
  if (spinning_.load(std::memory_order_seq_cst) != 0) return;
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    wake_one();
  } else if (threads_.load(std::memory_order_relaxed) < max_threads_) {
    std::lock_guard lk(mtx_);
    if (threads_.load() < max_threads_ && !shutdown_.load()) {
      try {
        start_worker(false);
      } catch (...) {
        // Could not grow: the existing workers will take the work.
      }
    }
  }
}

// ---------------------------------------------------------------- running

void pool_core::run_task(worker& w, task_base* t) noexcept {
  if (stopped_.load(std::memory_order_acquire)) {
    discard_task(t);
    return;
  }
  w.busy.store(true, std::memory_order_relaxed);
  if (t->is_scheduled()) {
    auto* st = static_cast<scheduled_task_base*>(t);
    if (task_sink* sink = st->sink())
      sink->accept(st); // due: it joins its serial executor's queue
    else
      run_scheduled(st);
  } else {
    try {
      t->complete(true);
    } catch (...) {
      if (!this_thread_orphaned) report(std::current_exception());
    }
  }
  if (this_thread_orphaned) return;
  w.busy.store(false, std::memory_order_relaxed);
  w.completed.store(w.completed.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

void pool_core::run_scheduled(scheduled_task_base* t) noexcept {
  if (!t->try_start()) { // cancelled while queued
    t->release();
    return;
  }
  const clock::time_point started = now();
  const bool ok = t->invoke();
  if (this_thread_orphaned && t->kind_ == task_kind::periodic) {
    t->finish_cancelled();
    t->release();
    return;
  }
  if (t->kind_ == task_kind::one_shot) {
    t->destroy_callable();
    t->finish();
    t->release();
    return;
  }
  if (!ok) {
    std::exception_ptr e = t->failure();
    report(e);
    if (t->extras().periodic.on_error == on_exception::stop) {
      t->destroy_callable();
      t->finish();
      t->release();
      return;
    }
    t->set_error(nullptr);
  }
  reschedule(t, started);
}

void pool_core::run_detached(scheduled_task_base* t) noexcept {
  if (!t->try_start()) {
    t->release();
    return;
  }
  t->invoke();
  t->destroy_callable();
  t->finish();
  t->release();
}

void pool_core::reschedule(scheduled_task_base* t, clock::time_point started) {
  const clock::time_point current = now();
  const clock::duration period = t->extras().period;
  clock::time_point next;
  if (t->extras().fixed_delay) {
    next = saturating_add(current, period);
  } else {
    const clock::time_point due = t->due();
    const clock::time_point grid = saturating_add(due, period);
    if (grid > current) {
      next = grid;
    } else {
      switch (t->extras().periodic.missed) {
      case missed_tick::burst:
        next = grid;
        break;
      case missed_tick::delay:
        next = saturating_add(started, period);
        break;
      case missed_tick::skip: {
        auto k = (current - due) / period + 1;
        next = saturating_add(due, period * k);
        break;
      }
      }
    }
  }

  std::unique_lock lk(mtx_);
  const bool stop = stopped_.load() || closing_ || (shutdown_.load() && !opts_.continue_periodic_after_shutdown);
  if (stop || !t->try_rearm()) {
    lk.unlock();
    t->finish_cancelled();
    t->release();
    return;
  }
  t->set_due(next);
  if (next <= current) {
    lk.unlock();
    push_ready(t);
  } else {
    heap_push_locked(t);
  }
}

// ---------------------------------------------------------------- queues

void pool_core::push_ready(task_base* t) noexcept { push_ready_chain(t, t, 1); }

void pool_core::push_ready_quiet(task_base* t) noexcept {
  if (!running_in_this_thread()) {
    post(t, false); // the executor path's rules (after shutdown: dropped and reported)
    return;
  }
  ready_.push(t); // no termination race: this worker is awake, so the pool is not idle
}

void pool_core::push_ready_chain(task_base* first, task_base* last, std::size_t count) noexcept {
  ready_.push_chain(first, last, count);
  if (terminated_.load(std::memory_order_seq_cst)) {
    // Lost the race with termination: nobody will run it. Drop and report.
    ready_.consumer_lock().lock();
    std::vector<task_base*> left;
    while (task_base* x = ready_.pop_locked()) left.push_back(x);
    ready_.consumer_lock().unlock();
    for (auto* x : left) {
      rejected_.fetch_add(1);
      discard_task(x);
    }
    return;
  }
  maybe_wake_after_push();
  if (count > 1 && sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard lk(mtx_);
    wake_some_locked(count - 1);
  }
}

void pool_core::post(task_base* t, bool continuation) noexcept {
  worker* w = this_worker;
  const bool inside = w != nullptr && w->pool == this;
  if (stopped_.load(std::memory_order_acquire) || (!inside && shutdown_.load(std::memory_order_acquire))) {
    drop_outside(t);
    return;
  }
  if (inside && continuation) {
    t->next_.store(nullptr, std::memory_order_relaxed);
    if (w->local_tail)
      w->local_tail->next_.store(t, std::memory_order_relaxed);
    else
      w->local_head = t;
    w->local_tail = t;
    return;
  }
  push_ready(t);
}

void pool_core::drop_outside(task_base* t) noexcept {
  rejected_.fetch_add(1);
  discard_task(t);
}

void pool_core::discard_task(task_base* t) noexcept {
  if (t->is_scheduled()) {
    auto* st = static_cast<scheduled_task_base*>(t);
    st->finish_cancelled();
    st->release();
    return;
  }
  const bool is_op = t->kind_ == task_kind::op;
  try {
    t->complete(false);
  } catch (...) {
  }
  if (is_op) report(std::make_exception_ptr(rejected_execution("metronome: work dropped: the pool is shut down")));
}

void pool_core::heap_push_locked(timed_node* n) {
  const bool head = heap_.push(n, next_seq_++);
  if (head) {
    update_next_due_locked();
    wake_for_new_head_locked();
  }
}

// Only a new earliest task wakes the leader (or a follower, to become leader).
void pool_core::wake_for_new_head_locked() noexcept {
  if (manual_) return; // time moves only through on_time_advanced()
  if (leader_ != nullptr) {
    leader_cv_.notify_one();
  } else if (followers_ > wake_tokens_) {
    ++wake_tokens_;
    follower_cv_.notify_one();
  }
}

void pool_core::update_next_due_locked() noexcept {
  // A submitter pushes to the inbox and then lowers next_due_. Storing the heap's head
  // could overwrite a lower value whose task we have not drained yet, so store, then
  // look at the inbox again (both seq_cst): whatever we miss here was pushed after our
  // store, and its submitter's own lowering comes later still.
  do {
    drain_inbox_locked();
    next_due_.store(heap_.empty() ? no_due : heap_.top_due(), std::memory_order_seq_cst);
  } while (!inbox_.empty());
}

std::size_t pool_core::promote_due_locked(clock::time_point current) {
  drain_inbox_locked();
  task_base* first = nullptr;
  task_base* last = nullptr;
  std::size_t count = 0;
  const clock::rep limit = current.time_since_epoch().count();
  while (!heap_.empty() && heap_.top_due() <= limit) {
    timed_node* n = heap_.pop();
    n->next_.store(nullptr, std::memory_order_relaxed);
    if (last)
      last->next_.store(n, std::memory_order_relaxed);
    else
      first = n;
    last = n;
    ++count;
  }
  if (count) {
    update_next_due_locked();
    ready_.push_chain(first, last, count);
  }
  return count;
}

void pool_core::promote_due(clock::time_point current) {
  // Opportunistic: if the mutex is busy, someone else is probably promoting; the next
  // pick, or park(), which promotes under the lock, catches up.
  std::unique_lock lk(mtx_, std::try_to_lock);
  if (!lk) return;
  std::size_t n = promote_due_locked(current);
  // This worker takes one; wake others for the rest when nobody is spinning.
  if (n > 1 && spinning_.load() == 0) wake_some_locked(n - 1);
}

void pool_core::on_time_advanced() {
  std::unique_lock lk(mtx_);
  std::size_t n = promote_due_locked(now());
  if (n > 0) wake_some_locked(n);
}

void pool_core::submit_scheduled(scheduled_task_base* t, clock::time_point due) {
  const clock::time_point current = now();
  if (due <= current) {
    t->set_due(current);
    if (shutdown_.load() || terminated_.load()) {
      reject_scheduled(t);
      return;
    }
    if (opts_.max_queued != 0 && ready_.size() >= opts_.max_queued) {
      if (opts_.rejection != rejection_policy::discard_oldest) {
        reject_scheduled(t);
        return;
      }
      rejected_.fetch_add(1);
      if (task_base* oldest = ready_.pop_wait()) discard_task(oldest);
    }
    push_ready(t);
    return;
  }
  t->set_due(due);
  if (shutdown_.load() || terminated_.load()) {
    reject_scheduled(t);
    return;
  }
  push_delayed(t, due);
}

// Lock-free: the heap's lock holder (a promoting worker, the leader) moves the node into
// the heap, so submitters never queue behind timer work on the mutex (Netty's
// pending-timeouts queue). Only a new earliest due time wakes anybody.
void pool_core::push_delayed(timed_node* t, clock::time_point due) {
  inbox_.push(t);
  const clock::rep d = due.time_since_epoch().count();
  clock::rep nd = next_due_.load(std::memory_order_seq_cst);
  bool earlier = false;
  while (d < nd) {
    if (next_due_.compare_exchange_weak(nd, d, std::memory_order_seq_cst)) {
      earlier = true;
      break;
    }
  }
  if (shutdown_.load(std::memory_order_seq_cst) || terminated_.load(std::memory_order_seq_cst)) {
    // Raced shutdown(): apply its rules to what the inbox still holds.
    std::vector<timed_node*> gone;
    {
      std::lock_guard lk(mtx_);
      drain_inbox_locked();
      if (terminated_.load())
        heap_.drain([&](timed_node* n) { gone.push_back(n); });
      else
        sweep_for_shutdown_locked(gone);
      update_next_due_locked();
      wake_all_locked();
    }
    for (timed_node* n : gone) abort_timed(n);
    return;
  }
  if (earlier && !manual_) {
    std::lock_guard lk(mtx_);
    wake_for_new_head_locked();
  }
}

void pool_core::drain_inbox_locked() noexcept {
  for (;;) {
    task_base* t = inbox_.pop_locked(); // mtx_ makes us the only consumer
    if (!t) {
      if (inbox_.empty()) break;
      cpu_relax(); // a submitter is between its exchange and its link
      continue;
    }
    if (release_if_cancelled(t)) continue;
    heap_.push(static_cast<timed_node*>(t), next_seq_++);
  }
}

void pool_core::reject_scheduled(scheduled_task_base* t) {
  rejected_.fetch_add(1);
  switch (opts_.rejection) {
  case rejection_policy::abort:
    t->finish_cancelled();
    t->release();
    throw rejected_execution(shutdown_.load() ? "metronome: the pool is shut down"
                                              : "metronome: the ready queue is full");
  case rejection_policy::caller_runs:
    run_detached(t);
    return;
  case rejection_policy::discard:
  case rejection_policy::discard_oldest:
    t->finish_cancelled();
    t->release();
    return;
  }
}

void pool_core::on_cancelled(scheduled_task_base* t) noexcept {
  std::lock_guard lk(mtx_);
  if (t->heap_index_ == not_in_heap) return; // in the ready queue: dropped when popped
  const bool was_head = t->heap_index_ == 0;
  heap_.remove(t);
  if (was_head) update_next_due_locked();
  t->release();
  // A cancel wakes nobody, except that a shut-down pool may now be able to terminate.
  if (heap_.empty() && (shutdown_.load() || joining_)) wake_all_locked();
}

bool pool_core::add_wait(wait_node* n, clock::time_point due, clock::time_point current) {
  n->set_due(due);
  if (terminated_.load()) return false;
  if (shutdown_.load())
    n->aborted_ = true;
  else if (due > current) {
    push_delayed(n, due); // re-applies shutdown's rules itself if it races shutdown()
    return true;
  }
  push_ready(n);
  return true;
}

void pool_core::cancel_wait(wait_node* n) noexcept {
  {
    std::lock_guard lk(mtx_);
    drain_inbox_locked();                      // a wait still in the inbox is in the heap after this
    if (n->heap_index_ == not_in_heap) return; // already fired or aborted
    const bool was_head = n->heap_index_ == 0;
    heap_.remove(n);
    if (was_head) update_next_due_locked();
    n->aborted_ = true;
  }
  push_ready(n);
}

void pool_core::work_finished() noexcept {
  if (tracked_work_.fetch_sub(1) == 1) {
    std::lock_guard lk(mtx_);
    if (shutdown_.load() || joining_) wake_all_locked();
  }
}

// ---------------------------------------------------------------- lifecycle

void pool_core::shutdown() {
  std::vector<timed_node*> gone;
  {
    std::lock_guard lk(mtx_);
    if (shutdown_.load()) return;
    shutdown_.store(true);
    drain_inbox_locked();
    sweep_for_shutdown_locked(gone);
    update_next_due_locked();
    wake_all_locked();
  }
  for (timed_node* n : gone) abort_timed(n);
}

// Takes out of the heap what shutdown() does not keep (per the two options).
void pool_core::sweep_for_shutdown_locked(std::vector<timed_node*>& gone) {
  heap_.remove_if(
      [this](timed_node* n) {
        if (n->kind_ == task_kind::wait) return true;
        if (n->kind_ == task_kind::periodic) return !opts_.continue_periodic_after_shutdown;
        return !opts_.run_delayed_after_shutdown;
      },
      [&](timed_node* n) { gone.push_back(n); });
}

void pool_core::abort_timed(timed_node* n) noexcept {
  if (n->kind_ == task_kind::wait) {
    // Completes with operation_aborted on a pool thread, so a coroutine waiting on it
    // resumes where its continuations are still accepted.
    static_cast<wait_node*>(n)->aborted_ = true;
    push_ready(n);
  } else {
    discard_task(n);
  }
}

std::vector<pending_task> pool_core::shutdown_now() {
  std::vector<task_base*> taken;
  {
    std::lock_guard lk(mtx_);
    shutdown_.store(true);
    stopped_.store(true);
    drain_inbox_locked();
    heap_.drain([&](timed_node* n) { taken.push_back(n); });
    update_next_due_locked();
    ready_.consumer_lock().lock();
    std::vector<task_base*> ready;
    for (;;) {
      task_base* t = ready_.pop_locked();
      if (t) {
        ready.push_back(t);
        continue;
      }
      if (ready_.empty()) break;
      std::this_thread::yield();
    }
    ready_.consumer_lock().unlock();
    // Ready work first (it became ready earlier), then delayed work in due order
    // (the heap's drain order).
    taken.insert(taken.begin(), ready.begin(), ready.end());
    wake_all_locked();
  }
  std::vector<pending_task> out;
  out.reserve(taken.size());
  for (task_base* t : taken) {
    if (t->kind_ == task_kind::wait) {
      t->complete(false); // completes with operation_aborted
    } else if (!release_if_cancelled(t)) {
      out.push_back(pending_task(t));
    }
  }
  return out;
}

void pool_core::close() {
  if (!terminated_.load()) {
    std::vector<timed_node*> gone;
    {
      std::lock_guard lk(mtx_);
      shutdown_.store(true);
      closing_ = true;
      promote_due_locked(now()); // drains the inbox too
      heap_.drain([&](timed_node* n) { gone.push_back(n); });
      update_next_due_locked();
      wake_all_locked();
    }
    for (timed_node* n : gone) abort_timed(n);
  }
  if (running_in_this_thread()) {
    // Destroyed from one of our own tasks: help run what is ready, then let the
    // others terminate; this thread is detached and never touches the pool again.
    worker& self = *this_worker;
    while (task_base* t = ready_.pop_wait()) run_task(self, t);
    std::lock_guard lk(mtx_);
    closer_in_pool_ = true;
    if (!terminated_.load() && idle_for_termination_locked(1)) terminate_locked();
    wake_all_locked();
    this_thread_orphaned = true;
  }
  join_threads();
}

void pool_core::join() {
  if (running_in_this_thread()) throw std::logic_error("metronome: join() called from one of the pool's threads");
  {
    std::unique_lock lk(mtx_);
    joining_ = true;
    wake_all_locked();
    terminated_cv_.wait(lk, [this] { return terminated_.load(); });
  }
  join_threads();
}

void pool_core::join_threads() {
  std::lock_guard jl(join_mtx_);
  std::unique_lock lk(mtx_);
  terminated_cv_.wait(lk, [this] { return terminated_.load(); });
  std::vector<std::thread> threads;
  for (auto& w : workers_)
    if (w->thread.joinable()) threads.push_back(std::move(w->thread));
  lk.unlock();
  for (auto& th : threads) {
    if (th.get_id() == std::this_thread::get_id())
      th.detach();
    else
      th.join();
  }
}

bool pool_core::await_termination(clock::duration timeout) {
  std::unique_lock lk(mtx_);
  auto deadline = saturating_add(clock::now(), timeout);
  return terminated_cv_.wait_until(lk, deadline, [this] { return terminated_.load(); });
}

pool_stats pool_core::stats() const {
  pool_stats s;
  std::lock_guard lk(mtx_);
  const_cast<pool_core*>(this)->drain_inbox_locked(); // cancelled tasks leave the count now
  s.threads = threads_.load();
  s.completed = retired_completed_.load();
  for (auto& w : workers_) {
    if (w->exited) continue;
    s.active += w->busy.load(std::memory_order_relaxed) ? 1 : 0;
    s.completed += w->completed.load(std::memory_order_relaxed);
  }
  s.ready_queued = ready_.size();
  s.delayed_queued = heap_.size();
  s.rejected = rejected_.load();
  s.largest_pool_size = largest_.load();
  return s;
}

} // namespace metronome::detail
