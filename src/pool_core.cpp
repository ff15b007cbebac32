// The pool's threads: construction, workers (spin, park, wake, elastic growth) and
// running a task. The producers' side is in pool_submit.cpp.
#include <metronome/detail/internal_post.hpp>
#include <metronome/detail/node_cache.hpp>
#include "pool_engine.hpp"
#include <metronome/detail/report.hpp>
#include <metronome/manual_clock.hpp>

#include "platform.hpp"
#include "pool_internal.hpp"
#include <metronome/detail/test_hooks.hpp>
#include <metronome/errors.hpp>

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

namespace metronome::detail {

thread_local worker* this_worker = nullptr;
thread_local const pool_engine* this_hook_pool = nullptr;
thread_local bool this_thread_orphaned = false;
thread_local bool this_thread_in_start_hook = false;
#if !defined(NDEBUG)
thread_local int calls_dismissed = 0;
#endif

namespace {

// Returned by park() when the caller should look for work again.
task_base* const retry_marker = reinterpret_cast<task_base*>(alignof(task_base));

constexpr int spin_rounds = 32;
// A worker with deferred continuations of its own runs them first, but looks at the
// due heap and the shared ready queue first on every this-many-th pick, so that neither
// timed nor outside work is starved by a thread that keeps deferring (a prime, as in
// Go's scheduler, so that it does not fall into step with a periodic pattern of the
// work).
constexpr unsigned shared_look_every = 61;
constexpr int spin_pause_rounds = 16;
// A worker's pick promotes due heap work only once the head is this late. The picks of
// busy workers then take the pool mutex once per batch of due tasks, not once per task:
// with a million timers falling due about one a microsecond, nearly every pick took it,
// and the thread submitting them spun or slept on it (submit at 1 M: 1.25x with this,
// docs/benchmarks.md "Promotion by busy workers in batches"). Exact elsewhere: a parked
// leader wakes at the head's due time and park() promotes it; a due-now submission
// promotes what is due before it queues (due order). So only a due task whose workers
// are all busy waits up to this much more (Asio looks at its timers once per reactor
// run, Netty once per loop iteration). Tested by
// `a_due_task_runs_while_the_only_worker_never_runs_out_of_posted_work`,
// `a_deferring_worker_s_look_at_the_heap_promotes_what_is_due_at_once`.
constexpr clock::rep pick_promotion_lag_ns = 10'000;

pool_options validated(pool_options o, bool hosted) {
  if (hosted) {
    o.threads = o.max_threads = 0;
    return o;
  }
  if (o.threads == 0) throw std::invalid_argument("metronome: a pool needs at least one thread");
  if (o.max_threads != 0 && o.max_threads < o.threads)
    throw std::invalid_argument("metronome: max_threads is below threads (0 or equal means a fixed pool)");
  if (o.max_threads > o.threads && o.keep_alive <= std::chrono::nanoseconds::zero())
    throw std::invalid_argument("metronome: keep_alive must be positive for an elastic pool");
  return o;
}

std::uint32_t generation_of(pool_anchor* a) noexcept {
  std::lock_guard lk(a->mtx);
  return a->generation;
}

} // namespace

void init_library_thread(const std::string& name) noexcept {
  platform::name_this_thread(name.c_str());
  platform::wake_on_time(); // its timed waits are deadlines
}

// The options are checked before the anchor (the base's) is taken: a delegating
// constructor, since the base is built first.
pool_engine::pool_engine(pool_options opts, core_host* host)
    : pool_engine(validated(std::move(opts), host != nullptr), host, checked_options{}) {}

pool_engine::pool_engine(pool_options&& opts, core_host* host, checked_options)
    : pool_core(acquire_pool_anchor(this), 0), opts_(std::move(opts)), host_(host), manual_(opts_.time_source),
      core_threads_(opts_.threads), max_threads_(std::max(opts_.threads, opts_.max_threads)), mtx_(anchor_->mtx) {
  generation_ = generation_of(anchor_);
  next_due_.store(no_due);
  // The node cache's process-wide depot (a function-local static) is made here, before
  // any worker exists: made first inside an allocation that fails (bad_alloc out of its
  // initializer) while an idle worker waited on its guard, it left that worker waiting
  // for ever under ThreadSanitizer, whose __cxa_guard_abort wakes no waiter (GCC 12).
  (void)node_cache_trim_pending();
  enroll_for_fork();
  if (host_) restart_after_fork(); // no thread to restart: the child keeps its work, its host drives it
  try {
    if (host_) host_worker_ = std::make_unique<worker>(this, 0, true);
    if (manual_) manual_->attach(this);
    std::lock_guard lk(mtx_);
    try {
      for (std::size_t i = 0; i < core_threads_; ++i) start_worker(true);
    } catch (...) {
      state_.set_terminated();
      parking_.wake_all();
      throw;
    }
  } catch (...) {
    // Workers already started see the pool terminated and exit; wait for them before the
    // members they use go away.
    for (auto& w : workers_)
      if (w->thread.joinable()) w->thread.join();
    if (manual_) manual_->detach(this);
    leave_fork_registry();
    retire_pool_anchor(anchor_);
    throw;
  }
}

pool_engine::~pool_engine() {
  // Every worker is joined (or, destroyed from inside, is this thread): a call still
  // counted is another thread's, about to read freed memory.
  assert(calls_.load() == 0 &&
         "metronome: a pool is destroyed while another thread is inside one of its calls (post, submit, "
         "schedule, async_delay); the pool must outlive every call into it");
  assert(wheels_.empty() &&
         "metronome: a pool is destroyed before a running wheel_timer built over it; stop or destroy the wheel first");
  leave_fork_registry();
  if (manual_) manual_->detach(this);
  for (auto& w : workers_)
    if (w->thread.joinable()) w->thread.detach();
  retire_pool_anchor(anchor_); // from here on, handles see the pool as gone
}

// ---------------------------------------------------------------- pool_core's calls

clock::time_point pool_core::now() const noexcept {
  const pool_engine& e = engine(*this);
  return e.manual_ ? e.manual_->now() : clock::now();
}

bool pool_core::running_in_this_thread() const noexcept {
  return this_worker != nullptr && this_worker->pool == &engine(*this);
}

pool_core* pool_core::current() noexcept { return this_worker ? this_worker->pool : nullptr; }

void pool_core::report(const std::exception_ptr& x) noexcept {
  assert(x && "metronome: reporting a null exception");
  if (!x) return;
  const pool_engine& e = engine(*this);
  // A hosted core's work runs inside an Asio handler of its host context (a drive of an
  // io_context's timing service): Asio's rule, the exception leaves that handler.
  if (e.host_ && !e.opts_.exception_handler && rethrow_scope::keep(x)) return;
  if (e.opts_.exception_handler)
    call_exception_handler(e.opts_.exception_handler, x, "the pool's exception handler");
  else
    print_unhandled(x, "task");
}

void pool_engine::report_dropped(const std::exception_ptr& e) noexcept {
  if (e && opts_.exception_handler) call_exception_handler(opts_.exception_handler, e, "the pool's exception handler");
}

void print_unhandled(const std::exception_ptr& e, const char* where) noexcept {
  if (!e) {
    std::fprintf(stderr, "metronome: unhandled error in %s (no exception object)\n", where);
    return;
  }
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "metronome: unhandled exception in %s: %s\n", where, ex.what());
  } catch (...) {
    std::fprintf(stderr, "metronome: unhandled exception in %s\n", where);
  }
}

// ---------------------------------------------------------------- threads

// A thread hook that throws is reported (to the pool's handler while it lives) and the
// thread goes on.
void pool_engine::run_thread_hook(const std::function<void(std::size_t)>& hook, std::size_t id,
                                pool_engine* pool) noexcept {
  this_hook_pool = pool;
  try {
    hook(id);
    this_hook_pool = nullptr;
  } catch (...) {
    this_hook_pool = nullptr;
    if (pool && !this_thread_orphaned) // (a hook that destroyed the pool and threw: no handler left)
      pool->report(std::current_exception());
    else
      print_unhandled(std::current_exception(), "a pool's on_thread_stop hook");
  }
}

// Caller holds mtx_.
void pool_engine::start_worker(bool core) {
  // Reap elastic workers that have exited.
  for (auto it = workers_.begin(); it != workers_.end();) {
    if ((*it)->exited) {
      // Under mtx_: the thread touches no lock after it marked itself exited (worker_main).
      METRONOME_TEST_HOOK(hook_point::reap_before_join);
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
  live_.fetch_add(1);
  ++awake_;
  try {
    raw->thread = std::thread([this, raw] { worker_main(*raw); });
  } catch (...) {
    workers_.pop_back();
    threads_.fetch_sub(1);
    live_.fetch_sub(1);
    --awake_;
    throw;
  }
  std::size_t n = live_.load();
  std::size_t largest = largest_.load();
  while (n > largest && !largest_.compare_exchange_weak(largest, n)) {
  }
}

void pool_engine::worker_main(worker& w) {
  const std::size_t id = w.id;
  init_library_thread(opts_.thread_name_prefix + "-" + std::to_string(id));
  node_cache_defer_frees(true); // unmap emptied node chunks when idle, not mid-burst
  // The hooks run outside this_worker's scope (they are not tasks: what they post is
  // queued like outside work). Both are copied first: a pool destroyed from inside a task,
  // or from a hook, leaves this thread without its options. A hook that destroyed the pool
  // (close()) leaves this thread orphaned, as a task that did: it touches nothing of the
  // pool again.
  std::function<void(std::size_t)> stop_hook;
  if (opts_.on_thread_stop) stop_hook = opts_.on_thread_stop;
  // After a start hook or a task that destroyed the pool: w and the pool are gone.
  const auto leave_orphaned = [&stop_hook, id] {
    this_thread_orphaned = false;
    this_worker = nullptr;
    if (stop_hook) run_thread_hook(stop_hook, id, nullptr);
  };
  if (opts_.on_thread_start) {
    const std::function<void(std::size_t)> start_hook = opts_.on_thread_start;
    this_thread_in_start_hook = true;
    run_thread_hook(start_hook, id, this);
    this_thread_in_start_hook = false;
    if (this_thread_orphaned) return leave_orphaned();
  }
  this_worker = &w;
  for (;;) {
    task_base* t = next_task(w);
    if (!t) break;
    METRONOME_TEST_HOOK(hook_point::worker_after_take);
    run_task(w, t);
    if (this_thread_orphaned) return leave_orphaned();
    if (!w.has_reactor && (++w.io_tick % 64) == 0) w.has_reactor = reactor_.exists();
    if (w.has_reactor) poll_reactor_if_due(w); // the fairness of I/O under load
  }
  // Continuations left behind by shutdown_now are dropped, and reported.
  while (w.local_head) discard_task(pop_local(w), "metronome: work dropped: the pool was shut down now");
  while (node_cache_trim(8, true)) {
  }
  this_worker = nullptr;
  if (stop_hook) run_thread_hook(stop_hook, id, this);
  if (this_thread_orphaned) { // the hook destroyed the pool (close())
    this_thread_orphaned = false;
    return;
  }
  bool terminated = false;
  {
    std::lock_guard lk(mtx_);
    retired_completed_.fetch_add(w.completed.load());
    w.latency.move_to(shared_latency_);
    w.completed.store(0);
    if (!w.retired) threads_.fetch_sub(1); // a retiring thread gave its place back in park()
    live_.fetch_sub(1);
    w.exited = true;
    terminated = state_.terminated();
  }
  METRONOME_TEST_HOOK(hook_point::worker_after_exit);
  // The pool terminated: this thread may have been what kept it from quiescent when
  // another pool's last worker asked the clock (which then parked for good), and it parks
  // nowhere, so it asks on its way out, holding nothing (the clock's mutex comes before
  // ours). A retiring elastic thread does not ask (unless its pool terminated meanwhile):
  // it was counted awake only inside one hold of mtx_ (park()), so it refused no
  // decision; and a producer growing the pool joins it under mtx_ (start_worker), which
  // an ask (quiescent() takes mtx_) would deadlock. A terminated pool starts no thread (so
  // reaps none), and its threads are joined without mtx_ (join_threads). Tested by
  // `a_pool_ending_while_another_pool_s_last_worker_has_asked_the_clock_makes_it_jump`,
  // `a_producer_growing_the_pool_joins_a_retired_elastic_thread_without_waiting_for_the_clock`,
  // `a_post_that_raced_a_join_s_termination_starts_no_thread_in_the_terminated_pool`.
  if (terminated && manual_ && manual_->wants_idle_points()) manual_->idle_point();
}

task_base* pool_engine::next_task(worker& w) {
  for (;;) {
    // After shutdown_now() nothing more starts: this thread's continuations (defer) stay
    // behind and are dropped, and reported, when it exits.
    const bool local = w.local_head && !state_.at_least(lifecycle::stop, std::memory_order_acquire);
    if (local && (++w.tick % shared_look_every) != 0) return pop_local(w);

    clock::rep nd = next_due_.load(std::memory_order_relaxed);
    if (nd != no_due && !manual_) {
      const clock::time_point current = clock::now();
      // The look of a worker with continuations of its own (every 61st pick) promotes
      // whatever is due: with the lag, a task due just before it waited 61 picks more.
      const clock::rep lag = local ? 0 : pick_promotion_lag_ns;
      if (current.time_since_epoch().count() - nd >= lag) promote(current, promoter::by_worker);
    }

    if (task_base* t = ready_.try_pop()) {
      if (ready_.maybe_nonempty()) maybe_wake_after_push(); // more queued: get help
      return t;
    }
    if (local) return pop_local(w);

    // Spin briefly: a producer that sees a spinning worker does not wake anybody. (Not
    // with a reactor: I/O completions wait for a parked worker, as Asio's threads do not spin.)
    if (!reactor_.exists()) {
      parking_.start_spinning();
      for (int i = 0; i < spin_rounds; ++i) {
        if (ready_.maybe_nonempty()) {
          if (task_base* t = ready_.try_pop()) {
            // The last spinner found work: if more is queued, get another worker going.
            parking_.stop_spinning();
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
      parking_.stop_spinning();
    }
    METRONOME_TEST_HOOK(hook_point::worker_before_park);
    // Idle: unmap a little of the node chunks a burst left empty, then look for work
    // again; park once there is none left to unmap.
    if (node_cache_trim(2)) continue;

    task_base* t = nullptr;
    {
      std::unique_lock lk(mtx_);
      t = park(w, lk);
    }
    METRONOME_TEST_HOOK(hook_point::worker_after_unpark);
    if (t != retry_marker) return t;
  }
}

// Called with mtx_ held. Returns retry_marker when there may be work, nullptr to exit.
// The park invariant (parking_lot.hpp (P)): a worker waits only after seeing, under
// mtx_ and after entering the parking lot, an empty ready queue and no due heap node; a
// producer that pushes and then sees someone parking notifies under mtx_, so it cannot
// slip in between that check and the wait.
task_base* pool_engine::park(worker& w, std::unique_lock<std::mutex>& lk) {
  parking_.enter();
  struct leave_guard {
    pool_engine* p;
    const held_lock& lk; // held again whenever the guard runs: park() returns with it
    ~leave_guard() {
      p->parking_.leave();
      // A leader that leaves hands the heap to a follower (Java's DelayedWorkQueue).
      if (!p->manual_ && p->parking_.leader() == nullptr && !p->heap_.empty() && !p->parking_.wake_follower())
        p->interrupt_reactor(lk); // the worker in the reactor times it
    }
  } guard{this, lk};

  bool clock_told = false; // this worker let the clock decide since it last woke
  for (;;) {
    // Terminated first: a task pushed after termination belongs to its producer, which
    // sees the termination and drops it (a strand's invoker too); a worker woken
    // by the termination that took it instead would run it, and everything it posts
    // would be dropped - a strand's follow-up invoker with it, leaving the strand locked.
    if (state_.terminated()) return nullptr;
    if (!ready_.empty()) return retry_marker;
    if (!heap_.empty()) {
      const clock::time_point current = now();
      if (heap_.top()->due() <= current) {
        task_sink* owed = nullptr;
        if (promote_due(lk, current, owed) > 1) wake_some(lk, 1);
        if (owed) {
          lk.unlock();
          post_owed_drains(owed);
          lk.lock();
        }
        return retry_marker;
      }
    }
    if (state_.seeks_termination() && idle_for_termination(lk, state_.closer_in_pool ? 2 : 1)) {
      terminate(lk);
      if (state_.terminated()) return nullptr;
      if (reactor_.holder() == nullptr) return retry_marker; // backed off: a producer got in
      // Else the worker in the reactor terminates the pool on its way out: park meanwhile.
    }

    if (manual_ && !clock_told && manual_->wants_idle_points() && awake_ == 1 && in_transit_ == 0) {
      let_manual_clock_decide(lk);
      clock_told = !clock_ask_owed_; // a transit ended meanwhile with nobody awake: ask again (leave_transit)
      continue; // look at everything again
    }
    // The roles: with a reactor, one parked worker waits in it (timing the heap too,
    // when no leader does); else the first to find the heap untimed leads (waits for its
    // head), the others follow (wait to be woken).
    clock_told = false;
    if (reactor_.exists() && reactor_.holder() == nullptr) {
      park_in_reactor(w, lk, !heap_.empty() && !manual_ && parking_.leader() == nullptr);
      if (w.local_head) return retry_marker; // a completion deferred work on this thread
      continue;
    }
    --awake_;
    bool timed_out = false;
    if (!heap_.empty() && !manual_ && parking_.leader() == nullptr)
      wait_as_leader(w, lk);
    else
      timed_out = wait_as_follower(w, lk);
    ++awake_;
    if (state_.terminated()) METRONOME_TEST_HOOK(hook_point::worker_woken_by_termination);
    if (timed_out && ready_.empty() && !state_.terminated() && (heap_.empty() || parking_.leader() != nullptr)) {
      // This elastic thread retires. It gives its place back now, in the hold of mtx_ in
      // which it leaves the parking lot (Java's getTask() lowers the worker count when it
      // times out), not on its way out: a producer that saw it parked grows the pool under
      // mtx_ (wake_one) and must find the place free. It stays in live_ (stats().threads,
      // as Java's getPoolSize() counts it) until it ends, after on_thread_stop.
      --awake_;
      threads_.fetch_sub(1);
      w.retired = true;
      METRONOME_TEST_HOOK(hook_point::elastic_before_retire);
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

// The last awake worker, about to park on a manual clock that auto-advances or has a
// thread in wait_idle(): counts itself parked, and lets the clock decide - jump, or tell
// the waiters every pool is idle (its mutex before ours: ours is released). The caller
// then looks at everything again: while the mutex was released, time may have moved, work
// may have come, and the pool may have been shut down (whose wake-up found nobody waiting).
void pool_engine::let_manual_clock_decide(std::unique_lock<std::mutex>& lk) {
  assert(lk.owns_lock());
  --awake_;
  clock_ask_owed_ = false; // this ask covers every transit ended before it
  lk.unlock();
  manual_->idle_point();
  METRONOME_TEST_HOOK(hook_point::worker_after_idle_point);
  lk.lock();
  ++awake_;
}

// The leader times the heap's head for every parked worker (Java's DelayedWorkQueue):
// woken by a new earlier head, a termination, or the due time. Caller holds mtx_.
void pool_engine::wait_as_leader(worker& w, std::unique_lock<std::mutex>& lk) {
  assert(lk.owns_lock());
  const auto due = heap_.top()->due();
  // With node chunks a burst left empty, it wakes in time to unmap them.
  parking_.wait_as_leader(lk, &w, node_cache_trim_pending() ? std::min(due, clock::now() + node_cache_trim_delay) : due);
}

// A follower waits to be woken (a wake token) - an elastic thread at most keep_alive:
// returns true when that ran out. Caller holds mtx_.
bool pool_engine::wait_as_follower(worker& w, std::unique_lock<std::mutex>& lk) {
  assert(lk.owns_lock());
  if (node_cache_trim_pending()) { // wake to unmap the node chunks a burst left empty (not a time-out)
    parking_.wait_as_follower(lk, clock::now() + node_cache_trim_delay);
    return false;
  }
  // A core thread, or an elastic one kept for ever, waits without a limit (max()); the
  // sum saturates (wait_for overflowed on a huge keep_alive).
  return parking_.wait_as_follower(lk, w.core ? clock::time_point::max() : saturating_add(clock::now(), opts_.keep_alive));
}

// A producer that pushed and saw someone parking (without the mutex) decides again under
// mtx_: it wakes one - or, when nobody parks or spins any more, grows the pool as if it
// had seen nobody (maybe_wake_after_push). That is the case of an elastic thread that was
// the only one parked and retired in between: it leaves the parking lot and gives its
// place back (threads_) in one hold of mtx_ (park()), so this hold sees both or neither.
// Without it the push woke nobody and its task waited for a busy worker. Tested by
// `a_push_that_saw_a_retiring_elastic_thread_parked_grows_the_pool`.
void pool_engine::wake_one() noexcept {
  if (host_) {
    host_->request_drive();
    return;
  }
  std::unique_lock lk(mtx_);
  if (parking_.someone_parking())
    wake_some(lk, 1);
  else if (!parking_.someone_spinning())
    grow(lk);
}

// Starts an elastic thread, if the pool may grow: below max_threads, and not once it
// refuses new work - nor once terminated (join() ends a running pool without shutdown):
// start_worker() joins exited threads under mtx_, and a thread leaving a terminated pool
// asks the clock (worker_main), which takes mtx_. Caller holds mtx_.
void pool_engine::grow(const held_lock& lk) noexcept {
  assert_held(lk, mtx_);
  if (threads_.load() >= max_threads_ || state_.refuses_new_work()) return;
  try {
    start_worker(false);
  } catch (...) {
    // Could not grow: the existing workers take the work.
  }
}

void pool_engine::wake_some(const held_lock& lk, std::size_t n) noexcept {
  assert_held(lk, mtx_);
  if (host_) {
    if (n > 0) host_->request_drive();
    return;
  }
  if (parking_.wake_some(n, reactor_.holder())) interrupt_reactor(lk);
}

void pool_engine::wake_all(const held_lock& lk) noexcept {
  assert_held(lk, mtx_);
  if (host_) {
    host_->request_drive();
    return;
  }
  parking_.wake_all();
  interrupt_reactor(lk);
}

void pool_engine::maybe_wake_after_push() noexcept {
  METRONOME_TEST_HOOK(hook_point::producer_before_wake);
  if (host_) {
    host_->request_drive();
    return;
  }
  if (parking_.someone_spinning()) return;
  if (parking_.someone_parking()) {
    METRONOME_TEST_HOOK(hook_point::producer_before_wake_lock);
    wake_one();
  } else if (threads_.load(std::memory_order_relaxed) < max_threads_) {
    std::unique_lock lk(mtx_);
    grow(lk);
  }
}

// ---------------------------------------------------------------- running

// A task this worker took runs, even when shutdown_now() came in between: it was taken
// before shutdown_now() emptied the queue, so it is not among the tasks returned, and
// dropping it here lost it (the README: a task a worker had already taken still runs).
void pool_engine::run_task(worker& w, task_base* t) noexcept {
  // A wait (async_delay, a wheel's) after shutdown_now(): discarded here, on a pool
  // thread (see shutdown_now()): nothing more starts, its handler included.
  if (t->is_completion() && state_.at_least(lifecycle::stop, std::memory_order_acquire)) {
    t->complete(false);
    return;
  }
  w.busy.store(true, std::memory_order_relaxed);
  if (t->is_scheduled()) {
    auto* st = static_cast<scheduled_task_base*>(t);
    // A serial executor's due tasks go to its queue when promoted, never through here.
    assert(st->sink() == nullptr);
    run_scheduled(st);
  } else {
    if (t->sampled_)
      record_post_wait(w, static_cast<const op_node*>(t));
    else if (t->kind_ == task_kind::wait)
      record_wait_start(static_cast<const wait_node*>(t));
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

} // namespace metronome::detail
