// The serial executor's queue drain, its delayed tasks and dispose.
#include <metronome/detail/internal_post.hpp>
#include <metronome/detail/report.hpp>
#include <metronome/detail/serial_core.hpp>
#include <metronome/detail/task.hpp>
#include <metronome/detail/test_hooks.hpp>
#include <metronome/errors.hpp>

#include "pool_engine.hpp"
#include "ready_queue.hpp"

#include <metronome/detail/executor_op.hpp>
#include <metronome/detail/node_cache.hpp>

#include <mutex>
#include <new>
#include <vector>

namespace metronome::detail {

namespace {
thread_local const serial_core* current_drain = nullptr;
}

// Whole cache lines, one group per kind of access: the queue's two (the drain's; the
// producers', which also holds the count of pending tasks, so a push writes one line),
// the flags both sides read on every task and nobody writes in steady state (one line,
// two with libc++'s larger std::function), and the registry of delayed tasks (written per
// delayed task, kept off the flags' line). It is built in place in serial_core's storage,
// which serial_core.hpp sizes from the same fields (one per connection in a service: its
// size is memory per connection, docs/benchmarks.md).
struct serial_core::state {
  state(serial_options opts, pool_core* owner_pool) : owner_pool_(owner_pool), opts_(std::move(opts)) {}
  uncounted_task_queue queue_;
  // The number of tasks pushed and not yet run (the drain's invariant, serial_core.hpp).
  std::atomic<std::uint64_t>& pending() noexcept { return queue_.owner_count(); }
  alignas(64) std::atomic<bool> disposed_{false};
  std::atomic<bool> abandoned_{false}; // set before disposed_ by abandon()
  // A drain shutdown_now() handed back has run (handed_back()): from then on the pool
  // may be gone, and owner_pool_ is never read through again. Set by the drain's thread
  // before its first task runs; work posted from those tasks reads it on that thread.
  std::atomic<bool> handed_back_{false};
  std::atomic<int> posting_{0}; // threads inside a post of the drain (see hand_drain)
  pool_core* owner_pool_;       // the metronome pool underneath, if any (its exception handler)
  serial_options opts_;
  alignas(64) std::mutex reg_mtx_; // the delayed tasks not yet due (track, forget, dispose)
  scheduled_task_base* reg_head_ = nullptr;
  serial_wait_link* waits_head_ = nullptr; // P2300 operations' waits (track_wait)
};

serial_core::state& serial_core::st() const noexcept {
  // Exactly: storage the state does not use is memory per serial executor for nothing.
  static_assert(sizeof(state) == state_bytes && alignof(state) <= 64,
                "metronome: serial_core::state_bytes differs from the drain's state");
  return *std::launder(reinterpret_cast<state*>(const_cast<unsigned char*>(state_)));
}

serial_core::serial_core(serial_options opts, pool_core& timers, pool_core* owner_pool) : timers_(timers) {
  if (opts.batch == 0) throw std::invalid_argument("metronome: serial_options::batch must be at least 1");
  ::new (static_cast<void*>(state_)) state(std::move(opts), owner_pool);
}

bool serial_core::is_disposed() const noexcept { return st().disposed_.load(std::memory_order_acquire); }

void serial_core::post_drain_to_pool(pool_core& pool, drain_post how) noexcept {
  try {
    drain_job drain{shared_from_this()};
    task_base* op = executor_op<drain_job, recycling_allocator<void>>::create(std::move(drain), {});
    switch (how) {
    case drain_post::producer:
    case drain_post::internal:
      // Internal work: never dropped while the pool runs (the tasks it carries were
      // accepted; outside work after shutdown is refused before it is queued).
      pool.push_ready(op);
      break;
    case drain_post::repost:
      // Only the drain's own re-post skips the wake-up: its worker takes it next.
      pool.repost_from_worker(op);
      break;
    }
  } catch (...) {
    report(std::current_exception());
  }
}

serial_core::~serial_core() {
  // Tasks a dropped drain never reached (the underlying executor shut down).
  while (task_base* t = st().queue_.pop_sole_consumer()) discard(t);
  st().~state();
}

bool serial_core::running_in_this_thread() const noexcept { return current_drain == this; }

// After a handed-back drain ran, its pool is stopped and may be destroyed: outside work
// is refused without asking it (test
// `a_handed_back_drain_run_after_its_pool_is_gone_refuses_posts_to_its_executor`).
bool serial_core::refuses_outside_work() const noexcept {
  if (st().handed_back_.load(std::memory_order_acquire)) return true;
  return st().owner_pool_ && st().owner_pool_->is_shutdown() && !st().owner_pool_->running_in_this_thread();
}

pool_core* serial_core::live_owner() const noexcept {
  return st().handed_back_.load(std::memory_order_acquire) ? nullptr : st().owner_pool_;
}

void serial_core::note_rejected() noexcept {
  if (pool_core* p = live_owner()) engine(p)->note_rejected();
}

bool serial_core::try_enqueue(task_base* t, bool may_run_here) noexcept {
  if (st().disposed_.load(std::memory_order_acquire)) return false;
  st().queue_.push(t);
  METRONOME_TEST_HOOK(hook_point::serial_after_push);
  if (st().pending().fetch_add(1, std::memory_order_acq_rel) == 0) {
    // This thread owes the drain. On a thread of the underlying executor it is that
    // executor's work already: run it here (no call into the executor, so dispose()'s
    // wait for posts under way does not concern it), else hand it over.
    if (may_run_here && inner_running_in_this_thread()) {
      internal_post_scope user(false); // the tasks' own posts are theirs, not the caller's completion
      drain();
    } else
      hand_drain(drain_post::producer);
  }
  return true;
}

// A drain is owed (the count left 0): hand it to the executor, unless disposed. The
// Dekker pair posting_ / disposed_ (both seq_cst) makes dispose() wait for a post under
// way, and a post that starts after dispose() discards here instead: after dispose()
// returns, no library thread calls into the underlying executor again.
void serial_core::hand_drain(drain_post how) noexcept {
  st().posting_.fetch_add(1, std::memory_order_seq_cst);
  if (st().disposed_.load(std::memory_order_seq_cst)) {
    leave_posting();
    drain(); // disposed: discards what is counted, runs no user task, never re-posts
    return;
  }
  post_drain(how);
  leave_posting();
}

// The last post under way wakes a dispose() waiting for it (it blocks, never spins).
void serial_core::leave_posting() noexcept {
  if (st().posting_.fetch_sub(1, std::memory_order_release) == 1) st().posting_.notify_all();
}

bool serial_core::enqueue_due(scheduled_task_base* t) noexcept {
  // Queued even when disposed: the drain discards what it finds after dispose().
  st().queue_.push(t);
  return st().pending().fetch_add(1, std::memory_order_acq_rel) == 0;
}

void serial_core::abandon() noexcept {
  st().abandoned_.store(true, std::memory_order_release);
  st().disposed_.store(true, std::memory_order_seq_cst);
  drain(); // disposed: discards, runs no user task, never re-posts
}

void serial_core::post_owed_drain() noexcept {
  // The tasks just queued keep this executor alive only until the drain runs them, which
  // may happen before the post returns: hold it until then.
  const std::shared_ptr<serial_core> keep = weak_from_this().lock(); // owned by a shared_ptr: never empty
  hand_drain(drain_post::internal);
}

task_base* serial_core::pop_one() noexcept {
  // pending() > 0 promises a node; a producer may still be linking it (the queue's
  // wait_for_link: spin briefly, then block until it has).
  for (;;) {
    if (task_base* t = st().queue_.pop_sole_consumer()) return t;
    st().queue_.wait_for_link_sole_consumer();
  }
}

// A drain over a metronome pool runs on that pool's threads - save one that
// shutdown_now() handed back in a pending_task, run by its caller, when the pool may be
// gone: that drain runs everything counted without re-posting (there is nowhere to post),
// typed tasks run detached (once, as the pool's own handed-back tasks), and exceptions
// are not reported to the pool. Compares pointers only: owner_pool_ may dangle then.
bool serial_core::handed_back() const noexcept { return st().owner_pool_ != nullptr && pool_core::current() != st().owner_pool_; }

void serial_core::drain() noexcept {
  const serial_core* outer = current_drain;
  current_drain = this;
  const bool handed = handed_back();
  if (handed) st().handed_back_.store(true, std::memory_order_release);
  const std::size_t batch = handed ? std::size_t(-1) : st().opts_.batch;
  std::size_t ran = 0;
  for (;;) {
    // Run the tasks already counted, up to the batch, and settle the count once per
    // run rather than once per task (its line is shared with producers). Never pop
    // more than was counted: a producer pushes before it counts, and an uncounted
    // node taken here would make the count underflow.
    const std::uint64_t counted = st().pending().load(std::memory_order_acquire);
    std::size_t consumed = 0;
    while (ran < batch && consumed < counted) {
      task_base* t = consumed == 0 ? pop_one() : st().queue_.pop_sole_consumer();
      if (!t) break;
      ++consumed;
      if (st().disposed_.load(std::memory_order_acquire)) {
        discard(t); // cheap and runs no user task: not counted against the batch
      } else {
        run_one(t, handed);
        ++ran;
        if (rethrow_scope::pending()) break; // a task threw over a foreign executor: it leaves this handler
      }
    }
    METRONOME_TEST_HOOK(hook_point::serial_before_settle);
    if (st().pending().fetch_sub(consumed, std::memory_order_acq_rel) == consumed) break; // drained
    if (ran >= batch || rethrow_scope::pending()) {
      current_drain = outer;
      METRONOME_TEST_HOOK(hook_point::serial_before_repost);
      post_drain(drain_post::repost); // let other work on the executor have a turn
      return;
    }
  }
  current_drain = outer;
}

void serial_core::run_one(task_base* t, bool handed) noexcept {
  if (t->is_scheduled()) {
    auto* st = static_cast<scheduled_task_base*>(t);
    if (handed)
      pool_engine::run_detached(st); // its pool may be gone (st->pool() null, or a new pool's)
    else
      engine(st->pool())->run_scheduled(st);
    return;
  }
  try {
    t->complete(true);
  } catch (...) {
    if (handed && !st().opts_.exception_handler)
      print_unhandled(std::current_exception(), "serial task"); // not to a pool that may be gone
    else
      report_unhandled(std::current_exception());
  }
}

// Executor-path work's exception (a handler's: post, dispatch, a coroutine's step): over
// a foreign executor with no exception handler it leaves the drain, as from a strand
// (Asio's rule). A typed task's goes to its handle, and report() only tells about it.
void serial_core::report_unhandled(std::exception_ptr e) noexcept {
  if (!st().opts_.exception_handler && live_owner() == nullptr && rethrow_scope::keep(e)) return;
  report(std::move(e));
}

void serial_core::report(std::exception_ptr e) noexcept {
  if (!e) return;
  if (st().opts_.exception_handler) {
    call_exception_handler(st().opts_.exception_handler, e, "a serial executor's exception handler");
  } else if (pool_core* p = live_owner()) {
    p->report(e);
  } else {
    print_unhandled(e, "serial task");
  }
}

void serial_core::report_dropped(const std::exception_ptr& e) noexcept {
  if (!e) return;
  if (st().opts_.exception_handler)
    call_exception_handler(st().opts_.exception_handler, e, "a serial executor's exception handler");
  else if (pool_core* p = live_owner())
    engine(p)->report_dropped(e);
}

void serial_core::report_refused() noexcept {
  if (st().abandoned_.load(std::memory_order_acquire)) // its context's shutdown (which you asked for) took the drain
    report_dropped(std::make_exception_ptr(
        rejected_execution("metronome: work dropped: the serial_executor's underlying context is shut down")));
  else
    report(std::make_exception_ptr(rejected_execution("metronome: serial_executor is disposed")));
}

void serial_core::track(scheduled_task_base* t) noexcept {
  std::lock_guard lk(st().reg_mtx_);
  t->extras().reg_prev = nullptr;
  t->extras().reg_next = st().reg_head_;
  if (st().reg_head_) st().reg_head_->extras().reg_prev = t;
  st().reg_head_ = t;
}

void serial_core::forget(scheduled_task_base* t) noexcept {
  std::lock_guard lk(st().reg_mtx_);
  if (t->extras().reg_prev)
    t->extras().reg_prev->extras().reg_next = t->extras().reg_next;
  else if (st().reg_head_ == t)
    st().reg_head_ = t->extras().reg_next;
  else
    return; // never tracked
  if (t->extras().reg_next) t->extras().reg_next->extras().reg_prev = t->extras().reg_prev;
  t->extras().reg_prev = t->extras().reg_next = nullptr;
}

bool serial_core::track_wait(serial_wait_link* l) noexcept {
  std::lock_guard lk(st().reg_mtx_);
  if (st().disposed_.load(std::memory_order_acquire)) return false;
  l->prev = nullptr;
  l->next = st().waits_head_;
  if (l->next) l->next->prev = l;
  st().waits_head_ = l;
  return true;
}

void serial_core::forget_wait(serial_wait_link* l) noexcept {
  std::lock_guard lk(st().reg_mtx_);
  if (l->prev)
    l->prev->next = l->next;
  else
    st().waits_head_ = l->next;
  if (l->next) l->next->prev = l->prev;
  l->prev = l->next = nullptr;
}

void serial_core::dispose() noexcept {
  if (st().disposed_.exchange(true, std::memory_order_acq_rel)) return;
  // P2300 operations' waits: stopped where they wait, under the registry's mutex (an
  // operation forgets its wait under it before it completes, so each is alive here).
  // Tested by `dispose_stops_a_serial_operation_waiting_in_the_delay_queue`.
  {
    std::lock_guard lk(st().reg_mtx_);
    for (serial_wait_link* l = st().waits_head_; l; l = l->next) pool_core::cancel_wait(l->anchor, l->generation, l->node);
  }
  // Delayed and periodic tasks: cancel them where they wait (the timing pool's heap).
  // Queued ones are discarded by the drain, which runs no user code once disposed.
  std::vector<scheduled_task_base*> live;
  {
    std::lock_guard lk(st().reg_mtx_);
    for (auto* t = st().reg_head_; t; t = t->extras().reg_next)
      if (t->try_add_ref()) live.push_back(t);
  }
  for (auto* t : live) {
    t->cancel();
    t->release();
  }
  for (int n = st().posting_.load(std::memory_order_seq_cst); n != 0; n = st().posting_.load(std::memory_order_seq_cst))
    st().posting_.wait(n, std::memory_order_seq_cst);
}

} // namespace metronome::detail
