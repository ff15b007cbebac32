// Stress with accounting, the pool itself: producers race the pool's lifecycle
// (shutdown, shutdown_now, the destructor) with every kind of submission (lost wake-ups
// of delayed work are in wakeups.cpp). Every
// callable carries a token whose destructor counts, so each round checks that every
// callable was destroyed exactly once and that every submission is accounted for: ran,
// cancelled, returned by shutdown_now, or rejected.
//
// Each case is bounded in time (a few seconds in release; fewer rounds under
// sanitizers). Hangs caused by library defects are turned into failures by a watchdog
// (a bounded wait); what the hung library still touches is leaked on purpose so that
// the remaining cases can run.

#include "common/stress_rounds.hpp"
#include "common/latch_task.hpp"
#include "common/manual_pool.hpp"

#include <metronome/detail/asio.hpp>

#include <algorithm>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

namespace {

// ======================================================================= pool lifecycle

enum class ending { shutdown, shutdown_now, destructor };
const char* ending_name(ending e) {
  return e == ending::shutdown ? "shutdown" : e == ending::shutdown_now ? "shutdown_now" : "destructor";
}

// Bound tasks (bind_executor) in the mix: to a strand over the pool (one per producer:
// its tasks, one-shot and periodic, queue behind each other there, so hand-overs meet a
// busy strand, its invoker is re-posted - and dropped after shutdown_now() - and the
// strand's exclusion is checked across tasks), and in rounds with an io_context of the
// round (run by one or two threads of it) to its executor (two threads: a periodic
// task's runs could overlap there, only the pool keeps them apart) or to a strand of it,
// again one per producer.
using pool_strand = net::strand<scheduled_thread_pool::executor_type>;
using io_executor = net::io_context::executor_type;
using io_strand = net::strand<io_executor>;
enum class bind_to : std::uint8_t { none, pool_strand, io, io_strand };

// How a round with an io_context ends it: run until the pool is gone and it runs out of
// work (every hand-over runs); stopped at the pool's ending and destroyed after the pool
// (the hand-overs still queued end cancelled); or stopped and destroyed before the pool,
// once every handle bound to it is done (no pool thread touches it any more).
enum class io_end { drain, stop_first, destroy_first };
const char* io_end_name(io_end e) {
  return e == io_end::drain ? "drain" : e == io_end::stop_first ? "stop_first" : "destroy_first";
}

constexpr int on_io_thread = 3; // tl_role of a thread running the round's io_context

// Plain executor-path callables (post, defer, dispatch), per thread: run, destroyed
// unrun, and of those the drops a rejection report on this thread (or a pending_task
// dropped here) accounted for. A report with no unclaimed drop before it is another
// executor-path task dropped: a strand's invoker.
thread_local int tl_plain_ran = 0;
thread_local int tl_plain_unrun = 0;
thread_local int tl_plain_claimed = 0;

struct pop {
  enum kind_t { submit, schedule, rate, fdelay, post, defer, dispatch } kind = submit;
  bind_to target = bind_to::none;
  slot* s = nullptr;
  slot* child = nullptr;
  scheduled_future<int> h;
  scheduled_future<void> hp;
  bool rejected = false;
  bool after_shutdown = false; // is_shutdown() was already true before the call
  bool cancel_won = false;
  int runs_at_cancel = 0;
  int throw_on = 0;
  bool stop_on_error = true;
  std::chrono::microseconds delay{0};
  long long earliest_due_ns = 0;
  bool typed() const { return kind <= fdelay; }
  bool periodic() const { return kind == rate || kind == fdelay; }
  bool bound() const { return target != bind_to::none; }
  bool on_io() const { return target == bind_to::io || target == bind_to::io_strand; }
};

const char* kind_name(pop::kind_t k) {
  static const char* n[] = {"submit", "schedule", "fixed_rate", "fixed_delay", "post", "defer", "dispatch"};
  return n[k];
}

const char* op_name(const pop& o) {
  static const char* bound[3][4] = {
      {"submit bound to a pool strand", "schedule bound to a pool strand", "fixed_rate bound to a pool strand",
       "fixed_delay bound to a pool strand"},
      {"submit bound to the io_context", "schedule bound to the io_context", "fixed_rate bound to the io_context",
       "fixed_delay bound to the io_context"},
      {"submit bound to an io strand", "schedule bound to an io strand", "fixed_rate bound to an io strand",
       "fixed_delay bound to an io strand"}};
  if (!o.bound()) return kind_name(o.kind);
  return bound[static_cast<int>(o.target) - 1][o.kind];
}

// What the bound tasks did over a case's rounds (the case's closing message).
struct bound_tally {
  long ops = 0, ran = 0, cancelled = 0, rejected = 0, invokers_returned = 0, invokers_dropped_reported = 0;
  long must_run = 0, test_cancels_won = 0;
  long io_rounds[3] = {0, 0, 0};
};

struct pool_round {
  std::uint64_t seed = 0;
  ending end = ending::shutdown;
  int producers = 2;
  int ops_per = 0;
  int bound_percent = 12; // share of bound submissions among the producers' operations
  int pending_mode = 0; // shutdown_now's tasks: 0 run or drop each at random, 1 run all, 2 drop all
  metronome::rejection_policy policy = metronome::rejection_policy::abort;
  bool run_delayed = true, continue_periodic = false;
  std::unique_ptr<slot[]> slots;
  std::unique_ptr<std::atomic<int>[]> task_inside;   // per op: runs of that task under way
  std::unique_ptr<std::atomic<int>[]> strand_inside; // per producer: its pool strand, its io strand
  std::vector<std::vector<pop>> ops;
  reports rep;
  std::atomic<int> rejected_other{0}; // rejection reports of no plain callable: strand invokers
  std::atomic<int> off_executor{0}, task_overlaps{0}, strand_overlaps{0};
  // The round's io_context (with_io), and the strands, one per producer: each strand goes
  // before its context (the pool strands before the pool).
  bool with_io = false;
  io_end io_ending = io_end::drain;
  std::unique_ptr<net::io_context> io;
  std::optional<net::executor_work_guard<io_executor>> io_guard;
  std::vector<std::thread> io_threads;
  std::vector<std::optional<pool_strand>> pool_strands;
  std::vector<std::optional<io_strand>> io_strands;
  std::unique_ptr<scheduled_thread_pool> pool;
  std::atomic<int> ops_done{0}, producers_done{0}, in_phase2{0};
  std::atomic<bool> stop_submitting{false}, stop_all{false};
  errors errs;
};

auto oneshot_body(slot* s) {
  return [l = life(s), s] {
    count_run(s);
    return 7;
  };
}

auto periodic_body(slot* s, int throw_on) {
  return [l = life(s), s, throw_on] {
    int n = count_run(s);
    if (throw_on != 0 && n == throw_on && tl_role == on_library) {
      s->throws.fetch_add(1);
      throw boom{s};
    }
  };
}

// Carried by a plain executor-path callable: counts it, on the thread that destroys it,
// when it is destroyed without having run.
struct count_unrun_drop {
  void operator()(slot* s) const noexcept {
    if (s->runs.load() == 0) ++tl_plain_unrun;
  }
};
using drop_witness = metronome::test::slot_token<count_unrun_drop>;

auto exec_body(slot* s, slot* child, scheduled_thread_pool::executor_type ex) {
  return [l = life(s), w = drop_witness(s), s, child, ex] {
    count_run(s);
    ++tl_plain_ran;
    if (child && tl_role == on_library) {
      // A continuation from a pool thread: accepted even after shutdown().
      child->posted.store(1);
      net::defer(ex, [l2 = life(child), w2 = drop_witness(child), child] {
        count_run(child);
        ++tl_plain_ran;
      });
    }
  };
}

// A bound task's callable: counts its runs and the runs that were not on its executor,
// that overlapped another run of the same task, or another callable on its strand.
// Periodic ones throw at run `throw_on` on a pool thread only (a pool strand's), whose
// pool is alive then: its handler hears of it.
template <bool Periodic, class Where>
auto bound_body(pool_round& r, slot* s, Where where, std::atomic<int>* strand_in, int throw_on) {
  std::atomic<int>* task_in = &r.task_inside[(s - r.slots.get()) / 2];
  return [l = life(s), s, where, strand_in, task_in, throw_on, rp = &r] {
    if (!where.running_in_this_thread()) rp->off_executor.fetch_add(1);
    if (task_in->fetch_add(1) != 0) rp->task_overlaps.fetch_add(1);
    if (strand_in && strand_in->fetch_add(1) != 0) rp->strand_overlaps.fetch_add(1);
    const int n = count_run(s);
    if ((n & 1) == 1) { // a window for an overlapping run, and a strand busy when the next hand-over comes
      const long long until = real_ns() + 20000;
      while (real_ns() < until) {
      }
    }
    if (strand_in) strand_in->fetch_sub(1);
    task_in->fetch_sub(1);
    if constexpr (Periodic) {
      if (throw_on != 0 && n == throw_on && tl_role == on_library) {
        s->throws.fetch_add(1);
        throw boom{s};
      }
    } else {
      (void)throw_on; // (captured for the periodic kind only)
      return 7;
    }
  };
}

void try_cancel(pool_round& r, pop& o) {
  if (o.h.valid()) {
    if (o.h.cancel()) {
      if (o.cancel_won) r.errs.add(fmt("%s: cancel() returned true twice", op_name(o)));
      o.cancel_won = true;
      if (!o.h.is_cancelled() || !o.h.is_done())
        r.errs.add(fmt("%s: cancel() returned true but the handle is not done+cancelled", op_name(o)));
    }
  } else if (o.hp.valid()) {
    if (o.hp.cancel()) {
      if (o.cancel_won) r.errs.add(fmt("%s: cancel() returned true twice", op_name(o)));
      o.cancel_won = true;
      o.runs_at_cancel = o.s->runs.load();
    }
  }
}

// One bound submission of producer p: a one-shot (submit, schedule) or periodic task
// bound to its pool strand, or to the round's io_context or its io strand.
template <class Rng>
void submit_bound(pool_round& r, int p, pop& o, Rng& rng) {
  const int k = static_cast<int>(rng() % 100);
  const int t = r.with_io ? static_cast<int>(rng() % 4) : 0;
  o.target = t < 2 ? bind_to::pool_strand : t == 2 ? bind_to::io : bind_to::io_strand;
  o.kind = k < 30 ? pop::submit : k < 70 ? pop::schedule : k < 85 ? pop::rate : pop::fdelay;
  metronome::periodic_options po;
  std::chrono::microseconds initial{0}, period{0};
  if (o.kind == pop::schedule) {
    o.delay = std::chrono::microseconds(rng() % 6 == 0 ? 0 : rng() % 5001);
    o.earliest_due_ns = real_ns() + std::chrono::nanoseconds(o.delay).count();
  } else if (o.periodic()) {
    o.throw_on = rng() % 3 == 0 ? static_cast<int>(1 + rng() % 3) : 0;
    o.stop_on_error = rng() % 2 == 0;
    po.missed = static_cast<metronome::missed_tick>(rng() % 3);
    po.on_error = o.stop_on_error ? metronome::on_exception::stop : metronome::on_exception::continue_;
    initial = std::chrono::microseconds(rng() % 3001);
    period = std::chrono::microseconds(500 + rng() % 2500);
    o.earliest_due_ns = real_ns() + std::chrono::nanoseconds(initial).count();
  }
  auto go = [&](auto where, std::atomic<int>* strand_in) {
    if (!o.periodic()) {
      auto f = net::bind_executor(where, bound_body<false>(r, o.s, where, strand_in, 0));
      o.h = o.kind == pop::submit ? r.pool->submit(std::move(f)) : r.pool->schedule(std::move(f), o.delay);
    } else {
      auto f = net::bind_executor(where, bound_body<true>(r, o.s, where, strand_in, o.throw_on));
      o.hp = o.kind == pop::rate ? r.pool->schedule_at_fixed_rate(std::move(f), initial, period, po)
                                 : r.pool->schedule_with_fixed_delay(std::move(f), initial, period, po);
    }
  };
  switch (o.target) {
  case bind_to::pool_strand:
    go(*r.pool_strands[static_cast<std::size_t>(p)], &r.strand_inside[2 * p]);
    break;
  case bind_to::io:
    go(r.io->get_executor(), nullptr);
    break;
  default:
    go(*r.io_strands[static_cast<std::size_t>(p)], &r.strand_inside[2 * p + 1]);
    break;
  }
}

void produce(pool_round& r, int p) {
  tl_role = on_producer;
  std::mt19937_64 rng(r.seed * 7919 + p);
  auto& mine = r.ops[p];
  auto ex = r.pool->get_executor();
  for (int i = 0; i < r.ops_per && !r.stop_submitting.load(); ++i) {
    pop& o = mine.emplace_back(); // reserved: no reallocation
    o.s = &r.slots[(p * r.ops_per + i) * 2];
    o.child = o.s + 1;
    const bool bound = static_cast<int>(rng() % 100) < r.bound_percent;
    const int k = static_cast<int>(rng() % 100);
    o.after_shutdown = r.pool->is_shutdown();
    try {
      if (bound) {
        submit_bound(r, p, o, rng);
      } else if (k < 18) {
        o.kind = pop::submit;
        o.h = r.pool->submit(oneshot_body(o.s));
      } else if (k < 42) {
        o.kind = pop::schedule;
        o.delay = std::chrono::microseconds(rng() % 6 == 0 ? 0 : rng() % 5001);
        o.earliest_due_ns = real_ns() + std::chrono::nanoseconds(o.delay).count();
        o.h = r.pool->schedule(oneshot_body(o.s), o.delay);
      } else if (k < 56) {
        o.kind = k < 49 ? pop::rate : pop::fdelay;
        o.throw_on = rng() % 3 == 0 ? static_cast<int>(1 + rng() % 3) : 0;
        o.stop_on_error = rng() % 2 == 0;
        metronome::periodic_options po;
        po.missed = static_cast<metronome::missed_tick>(rng() % 3);
        po.on_error = o.stop_on_error ? metronome::on_exception::stop : metronome::on_exception::continue_;
        auto initial = std::chrono::microseconds(rng() % 3001);
        auto period = std::chrono::microseconds(500 + rng() % 2500);
        o.earliest_due_ns = real_ns() + std::chrono::nanoseconds(initial).count();
        if (o.kind == pop::rate)
          o.hp = r.pool->schedule_at_fixed_rate(periodic_body(o.s, o.throw_on), initial, period, po);
        else
          o.hp = r.pool->schedule_with_fixed_delay(periodic_body(o.s, o.throw_on), initial, period, po);
      } else {
        o.kind = k < 74 ? pop::post : k < 88 ? pop::defer : pop::dispatch;
        slot* child = rng() % 4 == 0 ? o.child : nullptr;
        if (o.kind == pop::post)
          net::post(ex, exec_body(o.s, child, ex));
        else if (o.kind == pop::defer)
          net::defer(ex, exec_body(o.s, child, ex));
        else
          net::dispatch(ex, exec_body(o.s, child, ex));
      }
    } catch (const rejected_execution&) {
      o.rejected = true;
    } catch (const std::exception& e) {
      r.errs.add(fmt("%s: unexpected exception from the call: %s", op_name(o), e.what()));
    }
    if (rng() % 5 == 0) try_cancel(r, mine[rng() % mine.size()]);
    r.ops_done.fetch_add(1);
  }
  r.producers_done.fetch_add(1);
  if (r.end == ending::destructor) {
    // Handles outlive the pool and may be used from any thread: keep cancelling and
    // querying while the test thread destroys the pool.
    r.in_phase2.fetch_add(1);
    while (!r.stop_all.load() && !mine.empty()) {
      pop& o = mine[rng() % mine.size()];
      try_cancel(r, o);
      if (o.h.valid()) (void)o.h.is_done();
      std::this_thread::yield();
    }
  }
}

// The round's io_context: stopped (its threads joined), or run until it runs out of work
// (false: it did not within the watchdog's limit).
void stop_io(pool_round& r) {
  if (!r.io) return;
  r.io_guard.reset();
  r.io->stop();
  for (auto& t : r.io_threads) t.join();
  r.io_threads.clear();
}

bool drain_io(pool_round& r) {
  if (!r.io) return true;
  r.io_guard.reset();
  if (!finishes_within(20s, [&r] {
        for (auto& t : r.io_threads) t.join();
      })) {
    r.errs.add("io_context::run() did not return within 20 s of the pool's end (work left on the bound executor?)");
    r.io->stop();
    return false;
  }
  r.io_threads.clear();
  return true;
}

// A cancel() by the test thread that returned true (destroy_first): the task's runs then.
struct test_cancel {
  const pop* op;
  int runs_at;
};

// destroy_first: the io_context is stopped, every handle bound to it cancelled and waited
// for until done, then the io_context (and its strands) destroyed while the pool may
// still hold and hand over other tasks. Producers may be cancelling the same handles (in
// the destructor's case): their fields are theirs, the test's wins go to `won`. False
// when a handle did not become done (the io_context must then be leaked).
bool destroy_io_first(pool_round& r, std::vector<test_cancel>& won) {
  stop_io(r);
  for (auto& v : r.ops)
    for (auto& op : v) {
      if (!op.on_io()) continue;
      auto cancel_and_wait = [&](auto& h) {
        if (!h.valid()) return true;
        const int runs = op.s->runs.load();
        if (h.cancel()) won.push_back({&op, runs});
        const auto until = std::chrono::steady_clock::now() + 10s;
        while (!h.is_done()) {
          if (std::chrono::steady_clock::now() > until) return false;
          std::this_thread::yield();
        }
        return true;
      };
      if (!(op.periodic() ? cancel_and_wait(op.hp) : cancel_and_wait(op.h))) {
        r.errs.add(fmt("%s: not done 10 s after cancel() with its io_context stopped", op_name(op)));
        return false;
      }
    }
  r.io_strands.clear();
  r.io.reset();
  return true;
}

// On a watchdog: what the hung library still touches is kept for ever; the io_context's
// threads are stopped (left running, their thread objects leak with the round).
void abandon(const std::shared_ptr<pool_round>& rp) {
  if (rp->io) rp->io->stop();
  metronome::test::leak(rp);
}

// Returns false when a watchdog fired (the round's state is then leaked).
bool run_pool_round(const std::shared_ptr<pool_round>& rp, bound_tally& tally) {
  pool_round& r = *rp;
  std::mt19937_64 rng(r.seed);
  pool_options o;
  o.threads = 2 + rng() % 2;
  o.rejection = rng() % 2 == 0 ? metronome::rejection_policy::abort : metronome::rejection_policy::caller_runs;
  o.run_delayed_after_shutdown = r.run_delayed = rng() % 3 != 0;
  o.continue_periodic_after_shutdown = r.continue_periodic = rng() % 3 == 0;
  // Rejections of plain executor-path callables go to the counting handler; one that
  // follows no drop of such a callable on its thread is a strand's invoker, dropped.
  o.exception_handler = [h = r.rep.handler(), rp = &r](std::exception_ptr e) {
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const rejected_execution&) {
        if (tl_plain_unrun == tl_plain_claimed) {
          rp->rejected_other.fetch_add(1);
          return;
        }
        ++tl_plain_claimed;
      } catch (...) {
      }
    }
    h(e);
  };
  r.policy = o.rejection;
  r.producers = 2 + static_cast<int>(rng() % 2);
  r.pending_mode = rng() % 2 == 0 ? 0 : static_cast<int>(1 + rng() % 2);
  r.with_io = rng() % 3 != 0;
  const int total = r.producers * r.ops_per;
  r.slots.reset(new slot[static_cast<std::size_t>(total * 2)]);
  r.task_inside.reset(new std::atomic<int>[static_cast<std::size_t>(total)]());
  r.strand_inside.reset(new std::atomic<int>[static_cast<std::size_t>(r.producers * 2)]());
  r.ops.resize(r.producers);
  for (auto& v : r.ops) v.reserve(r.ops_per);
  tl_plain_claimed = tl_plain_unrun; // this thread's count starts afresh
  if (r.with_io) {
    r.io_ending = static_cast<io_end>(rng() % 3);
    ++tally.io_rounds[static_cast<int>(r.io_ending)];
    r.io = std::make_unique<net::io_context>();
    r.io_guard.emplace(r.io->get_executor());
    const int io_threads = 1 + static_cast<int>(rng() % 2);
    for (int t = 0; t < io_threads; ++t)
      r.io_threads.emplace_back([&r] {
        tl_role = on_io_thread;
        r.io->run();
      });
  }
  r.pool = std::make_unique<scheduled_thread_pool>(o);
  for (int p = 0; p < r.producers; ++p) {
    r.pool_strands.emplace_back(net::make_strand(r.pool->get_executor()));
    if (r.with_io) r.io_strands.emplace_back(net::make_strand(*r.io));
  }

  std::vector<std::thread> producers;
  for (int p = 0; p < r.producers; ++p) producers.emplace_back([&r, p] { produce(r, p); });

  // The random moment: after a random share of the producers' operations.
  const int threshold = static_cast<int>(rng() % (total + total / 8 + 1));
  while (r.ops_done.load() < threshold && r.producers_done.load() < r.producers) std::this_thread::yield();

  std::vector<metronome::pending_task> pending;
  std::vector<test_cancel> test_won;
  const bool stop_io_at_end = r.with_io && r.io_ending == io_end::stop_first;
  switch (r.end) {
  case ending::shutdown:
    r.pool->shutdown();
    if (stop_io_at_end) stop_io(r);
    break;
  case ending::shutdown_now:
    pending = r.pool->shutdown_now();
    if (stop_io_at_end) stop_io(r);
    break;
  case ending::destructor:
    r.stop_submitting.store(true);
    while (r.in_phase2.load() < r.producers) std::this_thread::yield();
    r.pool_strands.clear(); // not to outlive the pool
    if (stop_io_at_end) stop_io(r);
    if (r.with_io && r.io_ending == io_end::destroy_first && !destroy_io_first(r, test_won)) {
      r.stop_all.store(true);
      for (auto& t : producers) t.join();
      abandon(rp);
      return false;
    }
    if (!finishes_within(20s, [&r] { r.pool.reset(); })) {
      BOOST_ERROR("seed " << r.seed << ": ~scheduled_thread_pool() did not return within 20 s (hang)");
      r.stop_all.store(true);
      for (auto& t : producers) t.join();
      abandon(rp);
      return false;
    }
    r.stop_all.store(true);
    break;
  }
  for (auto& t : producers) t.join();
  r.pool_strands.clear();
  bool with_pool_strands = false;
  for (auto& v : r.ops)
    for (auto& op : v) with_pool_strands |= op.target == bind_to::pool_strand;

  // shutdown_now's tasks: run or drop them (per the round's mode). An executor-path one
  // that runs or drops no plain callable is a strand's invoker.
  int ret_oneshot_ran = 0, ret_oneshot_dropped = 0, ret_periodic = 0, ret_exec_ran = 0, ret_exec_dropped = 0;
  int ret_invokers = 0;
  tl_role = on_test_thread;
  for (auto& pt : pending) {
    const bool typed = pt.has_handle(), periodic = pt.is_periodic();
    const int ran0 = tl_plain_ran, unrun0 = tl_plain_unrun;
    const bool run = r.pending_mode == 1 || (r.pending_mode == 0 && rng() % 2 == 0);
    if (run) {
      try {
        pt();
      } catch (const std::exception& e) {
        r.errs.add(fmt("running a pending_task threw: %s", e.what()));
      }
      if (typed && !periodic) ++ret_oneshot_ran;
    } else {
      metronome::pending_task drop(std::move(pt));
      if (typed && !periodic) ++ret_oneshot_dropped;
    }
    const int ran = tl_plain_ran - ran0, unrun = tl_plain_unrun - unrun0;
    tl_plain_claimed += unrun;
    if (!typed) {
      if (ran + unrun > 1 || (run && unrun != 0) || (!run && ran != 0))
        r.errs.add(fmt("an executor-path pending_task %s ran %d and dropped %d plain callables",
                       run ? "run" : "dropped", ran, unrun));
      else if (ran + unrun == 0)
        ++ret_invokers;
      else if (run)
        ++ret_exec_ran;
      else
        ++ret_exec_dropped;
    }
    if (periodic) ++ret_periodic;
  }
  pending.clear();
  tl_role = on_library;
  tally.invokers_returned += ret_invokers;
  if (ret_invokers != 0 && !with_pool_strands)
    r.errs.add(fmt("%d executor-path pending_tasks held no callable of the round, which has no strand", ret_invokers));

  metronome::pool_stats st{};
  if (r.end != ending::destructor) {
    if (r.with_io && r.io_ending == io_end::destroy_first && !destroy_io_first(r, test_won)) {
      abandon(rp);
      return false;
    }
    // Periodic tasks kept by continue_periodic_after_shutdown would keep join() waiting.
    for (auto& v : r.ops)
      for (auto& op : v)
        if (op.periodic()) try_cancel(r, op);
    if (!finishes_within(20s, [&r] { r.pool->join(); })) {
      BOOST_ERROR("seed " << r.seed << " (" << ending_name(r.end) << "): join() did not return within 20 s (hang)");
      abandon(rp);
      return false;
    }
    st = r.pool->stats();
    if (!finishes_within(20s, [&r] { r.pool.reset(); })) {
      BOOST_ERROR("seed " << r.seed << ": ~scheduled_thread_pool() after join() did not return within 20 s (hang)");
      abandon(rp);
      return false;
    }
  }
  // The io_context's end: after the pool, its hand-overs run (drain) or are destroyed
  // unrun (stop_first: the tasks end cancelled).
  if (r.io) {
    if (r.io_ending == io_end::drain && !drain_io(r)) {
      abandon(rp);
      return false;
    }
    stop_io(r);
    r.io_strands.clear();
    r.io.reset();
  }

  // ---- accounting (the pool and the io_context are gone: nothing runs any more)
  int typed_rejections = 0, exec_posted = 0, exec_ran = 0, ran_me_oneshot = 0, ran_me_exec = 0;
  int bound_maybe_caller_runs = 0, bound_oneshot_accepted = 0;
  for (auto& v : r.ops) {
    for (auto& op : v) {
      slot* s = op.s;
      const int ran = s->total();
      const char* kn = op_name(op);
      if (s->destroyed.load() != 1)
        r.errs.add(fmt("%s: callable destroyed %d times (want 1)", kn, s->destroyed.load()));
      if (op.typed()) {
        auto check_handle = [&](auto& h) {
          if (!h.valid()) return;
          if (!h.is_done()) {
            r.errs.add(fmt("%s: handle neither done nor cancelled after the pool is gone (ran %d)", kn, ran));
            return;
          }
          if (h.cancel()) r.errs.add(fmt("%s: cancel() returned true after the pool is gone", kn));
          if (h.delay() != metronome::clock::duration::zero())
            r.errs.add(fmt("%s: delay() of a finished task is not zero", kn));
        };
        if (op.bound()) {
          // A bound task due at once rejected under caller_runs is handed to its executor
          // and runs there: whether it was rejected does not show.
          ++tally.ops;
          tally.ran += ran;
          if (op.rejected) {
            ++typed_rejections;
            ++tally.rejected;
          } else if (!op.periodic() && op.delay == 0us && r.policy == metronome::rejection_policy::caller_runs) {
            ++bound_maybe_caller_runs;
          }
          if ((op.h.valid() && op.h.is_cancelled()) || (op.hp.valid() && op.hp.is_cancelled())) ++tally.cancelled;
        } else if (op.rejected || s->on_caller.load() > 0) {
          ++typed_rejections;
        }
        if (op.rejected && (op.h.valid() || op.hp.valid()))
          r.errs.add(fmt("%s: threw rejected_execution but produced a handle", kn));
        if (s->on_caller.load() > 0 && r.policy != metronome::rejection_policy::caller_runs)
          r.errs.add(fmt("%s: ran on the submitting thread without caller_runs", kn));
        if (!op.periodic()) {
          check_handle(op.h);
          const bool cancelled = op.h.valid() && op.h.is_cancelled();
          if (ran > 1) r.errs.add(fmt("%s: ran %d times", kn, ran));
          if (ran + (op.rejected ? 1 : 0) + (cancelled ? 1 : 0) != 1)
            r.errs.add(fmt("%s (after_shutdown=%d): outcomes ran=%d rejected=%d cancelled=%d; want exactly one", kn,
                           op.after_shutdown, ran, op.rejected, cancelled));
          if (op.cancel_won && ran > 0) r.errs.add(fmt("%s: cancel() returned true but the task ran", kn));
          if (op.cancel_won && !cancelled) r.errs.add(fmt("%s: cancel() returned true, handle not cancelled", kn));
          if (ran == 1 && op.h.valid() && !cancelled) {
            try {
              if (op.h.get() != 7) r.errs.add(fmt("%s: get() returned a wrong value", kn));
            } catch (const std::exception& e) {
              r.errs.add(fmt("%s: ran but get() threw %s", kn, e.what()));
            }
          }
          if (s->on_caller.load() > 0 && op.kind == pop::schedule && op.delay > 0us &&
              s->first_run_ns.load() < op.earliest_due_ns)
            r.errs.add(fmt("schedule(%lld us) rejected under caller_runs ran on the caller %lld us before its due "
                           "time (DESIGN: never early; delayed submissions after shutdown are rejected as under "
                           "abort)",
                           static_cast<long long>(op.delay.count()),
                           (op.earliest_due_ns - s->first_run_ns.load()) / 1000));
          if (!op.bound()) ran_me_oneshot += s->ran_me.load();
          if (op.bound() && !op.rejected) {
            ++bound_oneshot_accepted;
            // Accepted, never cancelled by a cancel() that returned true, on an executor
            // that ran everything handed to it: it must have run - ready work after
            // shutdown() (delayed work too, with run_delayed_after_shutdown) and in the
            // destructor, and under shutdown_now() what was returned and then run.
            const bool executor_ran_all = op.target == bind_to::pool_strand || r.io_ending == io_end::drain;
            const bool due_at_once = op.delay == 0us;
            const bool must_run =
                !op.cancel_won && executor_ran_all &&
                ((r.end == ending::shutdown && (due_at_once || r.run_delayed)) ||
                 (r.end == ending::destructor && due_at_once) ||
                 (r.end == ending::shutdown_now && op.on_io() && r.pending_mode == 1));
            tally.must_run += must_run ? 1 : 0;
            if (must_run && ran == 0)
              r.errs.add(fmt("%s (delay %lld us, after_shutdown=%d, io %s): accepted, not cancelled by a cancel() that "
                             "returned true, its executor ran everything handed to it, yet it never ran (%s)",
                             kn, static_cast<long long>(op.delay.count()), op.after_shutdown,
                             r.with_io ? io_end_name(r.io_ending) : "none", cancelled ? "cancelled" : "not cancelled"));
          }
        } else {
          check_handle(op.hp);
          if (op.rejected && ran > 0) r.errs.add(fmt("%s: rejected but ran %d times", kn, ran));
          if (s->on_caller.load() > 0)
            r.errs.add(fmt("%s submitted after shutdown ran %d time(s) on the calling thread under caller_runs "
                           "(DESIGN: periodic submissions after shutdown are rejected as under abort)",
                           kn, s->on_caller.load()));
          if (op.cancel_won && s->runs.load() > op.runs_at_cancel + 1)
            r.errs.add(fmt("%s: %d runs after cancel() returned true at %d runs (at most 1 may complete)", kn,
                           s->runs.load(), op.runs_at_cancel));
          if (s->reported.load() != s->throws.load())
            r.errs.add(fmt("%s: threw %d times on the pool, handler told %d times", kn, s->throws.load(),
                           s->reported.load()));
          if (s->throws.load() > 0 && op.stop_on_error) {
            if (s->ran.load() != op.throw_on)
              r.errs.add(fmt("%s: stopped by an exception at run %d but ran %d times on the pool", kn, op.throw_on,
                             s->ran.load()));
            try {
              op.hp.get();
              r.errs.add(fmt("%s: stopped by an exception but get() returned normally", kn));
            } catch (const boom&) {
            } catch (const std::exception& e) {
              r.errs.add(fmt("%s: stopped by an exception but get() threw %s", kn, e.what()));
            }
          }
          // Its own pending_task runs it once on the test thread and completes it (a bound
          // one's hands it to its executor; run there by a strand's invoker returned by
          // shutdown_now(), a bound periodic run is the last: it ends cancelled).
          if (!op.bound() && s->ran_me.load() > 0 && op.hp.valid() && (op.hp.is_cancelled() || !op.hp.is_done()))
            r.errs.add(fmt("%s: returned by shutdown_now and run, but its handle is not done", kn));
        }
      } else {
        ++exec_posted;
        exec_ran += ran;
        ran_me_exec += s->ran_me.load();
        if (ran > 1) r.errs.add(fmt("%s: ran %d times", kn, ran));
        if (s->on_caller.load() > 0) r.errs.add(fmt("%s: ran inline on the producer thread", kn));
        slot* c = op.child;
        if (c->posted.load()) {
          ++exec_posted;
          exec_ran += c->total();
          ran_me_exec += c->ran_me.load();
          if (c->total() > 1) r.errs.add(fmt("continuation ran %d times", c->total()));
          if (c->destroyed.load() != 1)
            r.errs.add(fmt("continuation destroyed %d times (want 1)", c->destroyed.load()));
        } else if (c->destroyed.load() != 0 || c->total() != 0) {
          r.errs.add("a continuation that was never posted ran or was destroyed");
        }
      }
    }
  }
  tally.test_cancels_won += static_cast<long>(test_won.size());
  for (const auto& w : test_won) {
    const int runs = w.op->s->runs.load();
    if (w.op->periodic() ? runs > w.runs_at + 1 : runs > 0)
      r.errs.add(fmt("%s: the test's cancel() returned true at %d runs, it ran %d times", op_name(*w.op), w.runs_at,
                     runs));
  }
  if (r.off_executor.load() != 0) r.errs.add(fmt("%d bound runs off their executor", r.off_executor.load()));
  if (r.task_overlaps.load() != 0)
    r.errs.add(fmt("%d runs of a bound task overlapped another run of it", r.task_overlaps.load()));
  if (r.strand_overlaps.load() != 0)
    r.errs.add(fmt("%d bound runs overlapped another on their strand", r.strand_overlaps.load()));
  // A producer's cancel() may win against a task already handed out by shutdown_now()
  // (it then never runs, and invoking its pending_task does nothing). A bound one's
  // pending_task hands it to its executor: it does not run on the test thread.
  int oneshot_cancel_wins = 0;
  for (auto& v : r.ops)
    for (auto& op : v)
      if (op.typed() && !op.periodic() && !op.bound() && op.cancel_won) ++oneshot_cancel_wins;
  if (ran_me_oneshot > ret_oneshot_ran ||
      ret_oneshot_ran - ran_me_oneshot > oneshot_cancel_wins + bound_oneshot_accepted)
    r.errs.add(fmt("invoked %d typed one-shot pending_tasks, %d unbound one-shot callables ran on the test thread "
                   "(%d cancel() wins and %d bound one-shots could explain a shortfall)",
                   ret_oneshot_ran, ran_me_oneshot, oneshot_cancel_wins, bound_oneshot_accepted));
  if (ran_me_exec != ret_exec_ran)
    r.errs.add(fmt("ran %d executor-path pending_tasks, %d callables report it", ret_exec_ran, ran_me_exec));
  const int exec_dropped = exec_posted - exec_ran;
  // None silently lost: every executor-path task that never ran was returned by
  // shutdown_now or reported to the exception handler as rejected_execution.
  if (exec_dropped != ret_exec_dropped + r.rep.rejected.load())
    r.errs.add(fmt("executor path: %d posted, %d ran, %d dropped = %d returned-and-dropped + %d reported? "
                   "(silently lost: %d)",
                   exec_posted, exec_ran, exec_dropped, ret_exec_dropped, r.rep.rejected.load(),
                   exec_dropped - ret_exec_dropped - r.rep.rejected.load()));
  // A strand's invoker is dropped (and reported) only when posted after shutdown_now():
  // after shutdown() it is accepted until the pool terminates, then runs on the poster.
  tally.invokers_dropped_reported += r.rejected_other.load();
  if (r.rejected_other.load() != 0 && (r.end != ending::shutdown_now || !with_pool_strands))
    r.errs.add(fmt("%d rejection reports for work other than the round's plain callables (strand invokers "
                   "dropped?) after %s",
                   r.rejected_other.load(), ending_name(r.end)));
  if (r.end == ending::shutdown) {
    const int want = typed_rejections + exec_dropped + r.rejected_other.load();
    if (static_cast<int>(st.rejected) < want || static_cast<int>(st.rejected) > want + bound_maybe_caller_runs)
      r.errs.add(fmt("stats().rejected = %zu, want %d typed + %d executor-path rejections (+ up to %d bound ones "
                     "under caller_runs)",
                     st.rejected, typed_rejections, exec_dropped, bound_maybe_caller_runs));
  }
  if (r.end == ending::destructor && (exec_dropped != 0 || typed_rejections != 0))
    r.errs.add(fmt("destructor: %d executor-path tasks never ran (ready work must run), %d rejections",
                   exec_dropped, typed_rejections));
  if (r.rep.nulls.load() != 0) r.errs.add("the exception handler received a null exception_ptr");
  if (r.rep.other.load() != 0) r.errs.add(fmt("the exception handler received %d unexpected exceptions", r.rep.other.load()));
  (void)ret_oneshot_dropped;
  (void)ret_periodic;
  return true;
}

void pool_lifecycle_stress(ending end) {
  budget b(std::chrono::milliseconds(scaled(3500, 5000)), 3, scaled(20000, 2000));
  findings f;
  bound_tally tally;
  while (b.next()) {
    auto r = std::make_shared<pool_round>();
    r->seed = run_seed + static_cast<std::uint64_t>(b.rounds()) * 1000003u + static_cast<std::uint64_t>(end);
    r->end = end;
    r->ops_per = scaled(300, 80);
    const bool ok = run_pool_round(r, tally);
    f.take(r->errs, fmt("seed %llu (%s, policy %s, run_delayed=%d, continue_periodic=%d, io %s, pending mode %d)",
                        static_cast<unsigned long long>(r->seed), ending_name(end),
                        r->policy == metronome::rejection_policy::abort ? "abort" : "caller_runs", r->run_delayed,
                        r->continue_periodic, r->with_io ? io_end_name(r->io_ending) : "none", r->pending_mode));
    if (!ok) break;
  }
  f.report(ending_name(end), b.rounds());
  BOOST_TEST_MESSAGE(ending_name(end) << ": " << b.rounds() << " rounds (" << f.bad_rounds() << " failed), base seed "
                                      << run_seed);
  BOOST_TEST_MESSAGE(ending_name(end) << ": bound tasks: " << tally.ops << " submitted, " << tally.ran << " runs, "
                                      << tally.cancelled << " cancelled, " << tally.rejected << " rejected, "
                                      << tally.must_run << " that had to run; " << tally.test_cancels_won
                                      << " cancelled before their io_context's destruction; "
                                      << tally.invokers_returned << " strand invokers returned by shutdown_now, "
                                      << tally.invokers_dropped_reported << " dropped and reported; io_context rounds "
                                      << tally.io_rounds[0] << " drain, " << tally.io_rounds[1] << " stop_first, "
                                      << tally.io_rounds[2] << " destroy_first");
}

} // namespace

BOOST_AUTO_TEST_SUITE(stress_suite)

// ---- the pool's lifecycle raced by producers

// Every task submitted before shutdown_now() (by the thread that calls it) either ran or
// was returned: none cancelled, none reported. Workers busy taking tasks when it comes
// must run what they took (they dropped it, 1 to 63 tasks a round).
BOOST_AUTO_TEST_CASE(shutdown_now_returns_or_runs_every_task_submitted_before_it) {
  budget b(std::chrono::milliseconds(scaled(2500, 4000)), 3, scaled(3000, 300));
  findings f;
  while (b.next()) {
    const int variant = static_cast<int>(b.rounds() % 3); // delayed on 1 worker, submit, post on 4
    std::atomic<int> reported{0};
    metronome::pool_options o = metronome::pool_options::fixed(variant == 0 ? 1 : 4);
    o.exception_handler = [&](std::exception_ptr) { reported.fetch_add(1); };
    constexpr int n = 400;
    std::vector<std::atomic<int>> ran(n);
    std::vector<metronome::scheduled_future<void>> handles;
    std::size_t returned = 0;
    {
      metronome::scheduled_thread_pool pool(o);
      for (int i = 0; i < n; ++i) {
        auto task = [&ran, i] { ran[static_cast<std::size_t>(i)].fetch_add(1); };
        if (variant == 0)
          handles.push_back(pool.schedule(task, std::chrono::microseconds(i)));
        else if (variant == 1)
          handles.push_back(pool.submit(task));
        else
          metronome::net::post(pool, task);
      }
      auto rest = pool.shutdown_now();
      returned = rest.size();
      pool.join();
      for (auto& t : rest) t();
    }
    int total = 0, twice = 0;
    for (auto& r : ran) {
      total += r.load();
      twice += r.load() > 1;
    }
    errors errs;
    if (total != n || twice != 0 || reported.load() != 0)
      errs.add(fmt("variant %d: %d of %d ran (%d twice), %zu returned, %d reported", variant, total, n, twice,
                         returned, reported.load()));
    for (auto& h : handles)
      if (h.is_cancelled()) {
        errs.add(fmt("variant %d: a handle was cancelled", variant));
        break;
      }
    f.take(errs, fmt("round %d", b.rounds()));
  }
  f.report("shutdown_now accounting", b.rounds());
}

// Two threads that, once `go` opens, cancel in a shuffled order the handles `pick(c, i)`
// gives canceller c (c = 0, 1); each draws its shuffle's seed from `rng`.
template <class Pick>
std::vector<std::thread> start_cancellers(std::vector<scheduled_future<void>>& handles, metronome::test::gate& go,
                                          std::mt19937_64& rng, Pick pick) {
  std::vector<std::thread> cancellers;
  for (std::size_t c = 0; c < 2; ++c)
    cancellers.emplace_back([&handles, &go, c, pick, seed = rng()] {
      std::vector<std::size_t> mine;
      for (std::size_t i = 0; i < handles.size(); ++i)
        if (pick(c, i)) mine.push_back(i);
      std::shuffle(mine.begin(), mine.end(), std::mt19937_64(seed));
      go.wait();
      for (std::size_t i : mine) handles[i].cancel();
    });
  return cancellers;
}

// Plain callbacks' waits (no executor of their own), ended by cancel() on two other
// threads while the pool ends (shutdown_now, the destructor, shutdown): a wait ended by
// a cancel is queued on the task's pool (post_completion), or run by the canceller once
// the pool has no thread left. Each wait completes exactly once - aborted, or with the
// run of its task - by the time the cancellers and the pool are gone: none is lost in the
// pool's ending, none runs twice.
BOOST_AUTO_TEST_CASE(plain_callback_waits_ended_by_cancel_race_the_pool_s_ending) {
  budget b(std::chrono::milliseconds(scaled(2000, 3000)), 3, scaled(2000, 200));
  findings f;
  while (b.next()) {
    const auto end = static_cast<ending>(b.rounds() % 3);
    std::mt19937_64 rng(run_seed ^ (static_cast<std::uint64_t>(b.rounds()) * 0x9e3779b97f4a7c15ULL));
    constexpr int n = 200;
    std::vector<std::atomic<int>> ran(n), completed(n), aborted(n);
    std::vector<scheduled_future<void>> handles;
    handles.reserve(n);
    auto pool = std::make_unique<scheduled_thread_pool>(2);
    for (std::size_t i = 0; i < n; ++i) {
      handles.push_back(pool->schedule([&ran, i] { ran[i].fetch_add(1); }, std::chrono::microseconds(rng() % 3000)));
      handles.back().async_wait([&completed, &aborted, i](std::exception_ptr e) {
        if (e) aborted[i].fetch_add(1);
        completed[i].fetch_add(1);
      });
    }
    metronome::test::gate go;
    std::vector<std::thread> cancellers =
        start_cancellers(handles, go, rng, [](std::size_t c, std::size_t i) { return i % 2 == c; });
    go.open();
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(rng() % 1500);
    while (std::chrono::steady_clock::now() < spin_until) std::this_thread::yield();
    std::vector<metronome::pending_task> taken;
    if (end == ending::shutdown_now)
      taken = pool->shutdown_now();
    else if (end == ending::shutdown)
      pool->shutdown();
    else
      pool.reset();
    for (auto& t : cancellers) t.join();
    pool.reset();  // shutdown: after the last delayed task has run
    taken.clear(); // tasks taken by shutdown_now(), dropped unrun: their waits end aborted
    errors errs;
    for (std::size_t i = 0; i < n; ++i) {
      const int runs = ran[i].load(), calls = completed[i].load(), errs_seen = aborted[i].load();
      if (calls != 1 || runs > 1 || (runs == 1) != (errs_seen == 0)) {
        errs.add(fmt("%s: wait %zu completed %d times (%d with an error), its task ran %d times",
                     ending_name(end), i, calls, errs_seen, runs));
        break;
      }
    }
    f.take(errs, fmt("round %d", b.rounds()));
  }
  BOOST_TEST(f.bad_rounds() == 0);
  f.report("plain-callback waits against the pool's ending", b.rounds());
}

// Waits added while their tasks end: tasks due within a few hundred microseconds, their
// handles' async_waits added on two other threads as the workers run them. A wait that
// flags its task before the ending is listed and completed by it; one that comes after
// completes at its initiation (docs/design.md "Where a handle's waits complete"). Each
// completes exactly once, with its task's value, by the time the pool is gone.
BOOST_AUTO_TEST_CASE(waits_added_race_their_tasks_endings) {
  budget b(std::chrono::milliseconds(scaled(2000, 3000)), 3, scaled(2000, 200));
  findings f;
  while (b.next()) {
    std::mt19937_64 rng(run_seed ^ (static_cast<std::uint64_t>(b.rounds()) * 0x9e3779b97f4a7c15ULL));
    constexpr int n = 200;
    std::vector<std::atomic<int>> completed(n), valued(n);
    std::vector<scheduled_future<int>> handles;
    handles.reserve(n);
    auto pool = std::make_unique<scheduled_thread_pool>(2);
    for (int i = 0; i < n; ++i)
      handles.push_back(pool->schedule([i] { return i; }, std::chrono::microseconds(rng() % 400)));
    metronome::test::gate go;
    std::vector<std::thread> waiters;
    for (int w = 0; w < 2; ++w)
      waiters.emplace_back([&, w] {
        go.wait();
        for (int i = w; i < n; i += 2)
          handles[static_cast<std::size_t>(i)].async_wait([&completed, &valued, i](std::exception_ptr e, int v) {
            if (!e && v == i) valued[static_cast<std::size_t>(i)].fetch_add(1);
            completed[static_cast<std::size_t>(i)].fetch_add(1);
          });
      });
    go.open();
    for (auto& t : waiters) t.join();
    for (auto& h : handles) h.wait();
    pool->shutdown();
    pool.reset(); // after the completions queued on it have run
    errors errs;
    for (std::size_t i = 0; i < n; ++i) {
      if (completed[i].load() != 1 || valued[i].load() != 1) {
        errs.add(fmt("wait %zu completed %d times, %d with its value; handle: %s", i, completed[i].load(), valued[i].load(), handles[i].is_cancelled() ? "cancelled" : handles[i].is_done() ? "done" : "not done"));
        break;
      }
    }
    f.take(errs, fmt("round %d", b.rounds()));
  }
  BOOST_TEST(f.bad_rounds() == 0);
  f.report("waits added against their tasks' endings", b.rounds());
}

BOOST_AUTO_TEST_CASE(producers_race_shutdown) { pool_lifecycle_stress(ending::shutdown); }
BOOST_AUTO_TEST_CASE(producers_race_shutdown_now) { pool_lifecycle_stress(ending::shutdown_now); }
BOOST_AUTO_TEST_CASE(handles_race_the_destructor) { pool_lifecycle_stress(ending::destructor); }

// A round of bound tasks, accounted once nothing runs any more: every handle done, every
// callable destroyed once, every periodic task cancelled, every one-shot run once on its
// strand or cancelled (never both, never neither). Adds the runs and cancels to the totals.
template <class IsPeriodic>
void account_bound_round(std::vector<slot>& slots, std::vector<scheduled_future<void>>& handles,
                         IsPeriodic is_periodic, int off_strand, errors& errs, long& ran_total, long& cancelled_total) {
  if (off_strand != 0) errs.add(fmt("%d runs off their strand", off_strand));
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const int runs = slots[i].runs.load(), destroyed = slots[i].destroyed.load();
    const bool periodic = is_periodic(i), done = handles[i].is_done(), cancelled = handles[i].is_cancelled();
    if (!done || destroyed != 1 || (periodic && !cancelled) || (!periodic && (runs > 1 || (runs == 1) == cancelled))) {
      errs.add(fmt("task %zu (periodic %d): ran %d times, done %d, cancelled %d, callable destroyed %d times", i,
                   int(periodic), runs, int(done), int(cancelled), destroyed));
      return;
    }
    ran_total += runs;
    cancelled_total += cancelled ? 1 : 0;
  }
}

// Tasks bound to a strand of an io_context (bind_executor), one-shot and periodic, while
// two threads cancel at random; then the io_context is stopped with hand-overs still
// queued in it, the pool shut down at once, and the io_context destroyed. Every one-shot
// ran once on its strand or ended cancelled (never both, never neither), every periodic
// task ended cancelled, and every callable was destroyed exactly once.
BOOST_AUTO_TEST_CASE(bound_tasks_race_cancels_and_their_executor_s_destruction) {
  budget b(std::chrono::milliseconds(scaled(2000, 3000)), 3, scaled(2000, 100));
  findings f;
  long ran_total = 0, cancelled_total = 0, queued_at_destruction = 0;
  while (b.next()) {
    std::mt19937_64 rng(run_seed ^ (static_cast<std::uint64_t>(b.rounds()) * 0x9e3779b97f4a7c15ULL));
    constexpr std::size_t n = 200;
    std::vector<slot> slots(n);
    std::atomic<int> off_strand{0};
    std::vector<scheduled_future<void>> handles;
    handles.reserve(n);
    scheduled_thread_pool pool(2);
    auto io = std::make_unique<net::io_context>();
    std::optional guard = net::make_work_guard(*io);
    std::optional strand = net::make_strand(*io);
    std::vector<std::thread> io_threads;
    for (int t = 0; t < 2; ++t) io_threads.emplace_back([&io] { io->run(); });
    for (std::size_t i = 0; i < n; ++i) {
      auto fn = net::bind_executor(*strand, [s = &slots[i], &strand, &off_strand, token = life(&slots[i])] {
        if (!strand->running_in_this_thread()) off_strand.fetch_add(1);
        s->runs.fetch_add(1);
      });
      const auto d = std::chrono::microseconds(rng() % 3000);
      if (i % 8 == 0)
        handles.push_back(pool.schedule_at_fixed_rate(std::move(fn), d, 300us));
      else
        handles.push_back(pool.schedule(std::move(fn), d));
    }
    metronome::test::gate go;
    std::vector<std::thread> cancellers =
        start_cancellers(handles, go, rng, [](std::size_t c, std::size_t i) { return i % 4 == c; }); // half of them
    go.open();
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(rng() % 2500);
    while (std::chrono::steady_clock::now() < spin_until) std::this_thread::yield();
    guard.reset();
    io->stop(); // hand-overs made from now on stay queued in it
    for (auto& t : io_threads) t.join();
    for (auto& t : cancellers) t.join();
    pool.shutdown_now(); // what is still in the pool: returned, and dropped here (cancelled)
    pool.join();         // no worker hands anything over any more
    strand.reset();
    std::size_t not_done = 0;
    for (auto& h : handles) not_done += h.is_done() ? 0 : 1;
    queued_at_destruction += static_cast<long>(not_done);
    io.reset(); // destroys the hand-overs still queued: those tasks end cancelled
    errors errs;
    account_bound_round(slots, handles, [](std::size_t i) { return i % 8 == 0; }, off_strand.load(), errs, ran_total,
                        cancelled_total);
    f.take(errs, fmt("round %d", b.rounds()));
  }
  BOOST_TEST(f.bad_rounds() == 0);
  BOOST_TEST_MESSAGE("bound tasks: " << b.rounds() << " rounds, " << ran_total << " runs, " << cancelled_total
                                     << " cancelled, " << queued_at_destruction << " still queued in the io_context");
  f.report("bound tasks against cancels and their executor's destruction", b.rounds());
}

// The other way round: a serial executor over an io_context schedules tasks bound to
// strands over a pool, one-shot, fixed-rate and fixed-delay, while two threads cancel at
// random. Then the io_context - whose timing service holds the tasks' schedule - is
// destroyed while the pool's workers run and end those tasks: either at once (runs away
// on the strands, ending after the engine is gone) or once every handle is done (the
// workers may still be leaving the engine: its shutdown waits for them). Every one-shot
// ran once on its strand or ended cancelled, every periodic task ended cancelled, and
// every callable was destroyed exactly once.
BOOST_AUTO_TEST_CASE(serial_tasks_over_an_io_context_bound_to_a_pool_race_cancels_and_the_io_context_s_end) {
  budget b(std::chrono::milliseconds(scaled(2000, 3000)), 4, scaled(2000, 100));
  findings f;
  long ran_total = 0, cancelled_total = 0, away_at_destruction = 0;
  while (b.next()) {
    std::mt19937_64 rng(run_seed ^ (static_cast<std::uint64_t>(b.rounds()) * 0x9e3779b97f4a7c15ULL));
    const bool wait_for_handles = b.rounds() % 2 == 1;
    constexpr std::size_t n = 200;
    std::vector<slot> slots(n);
    std::atomic<int> off_strand{0};
    std::vector<scheduled_future<void>> handles;
    handles.reserve(n);
    auto pool = std::make_unique<scheduled_thread_pool>(2);
    std::optional<pool_strand> strands[2] = {net::make_strand(pool->get_executor()),
                                             net::make_strand(pool->get_executor())};
    auto io = std::make_unique<net::io_context>();
    std::optional guard = net::make_work_guard(*io);
    std::thread io_thread([&io] { io->run(); });
    std::optional serial = metronome::make_serial_executor(io->get_executor());
    for (std::size_t i = 0; i < n; ++i) {
      pool_strand& strand = *strands[i % 2];
      const bool periodic = i % 4 == 0;
      // A periodic run lasts a little, so that cancels land during runs (which then end
      // on a worker in transit in the io_context's engine).
      auto fn = net::bind_executor(strand, [s = &slots[i], strand, periodic, &off_strand, token = life(&slots[i])] {
        if (!strand.running_in_this_thread()) off_strand.fetch_add(1);
        s->runs.fetch_add(1);
        const auto until = std::chrono::steady_clock::now() + 100us;
        while (periodic && std::chrono::steady_clock::now() < until) {
        }
      });
      const auto d = std::chrono::microseconds(rng() % 3000);
      if (i % 8 == 0)
        handles.push_back(serial->schedule_at_fixed_rate(std::move(fn), d, 300us));
      else if (i % 8 == 4)
        handles.push_back(serial->schedule_with_fixed_delay(std::move(fn), d, 200us));
      else
        handles.push_back(serial->schedule(std::move(fn), d));
    }
    metronome::test::gate go;
    std::vector<std::thread> cancellers = start_cancellers(handles, go, rng, [](std::size_t c, std::size_t i) {
      return (i * 2654435761U >> 7) % 4 == c;
    }); // half, periodic or not
    go.open();
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(rng() % 2500);
    while (std::chrono::steady_clock::now() < spin_until) std::this_thread::yield();
    errors errs;
    if (wait_for_handles) {
      // Cancelled with runs under way on the pool; the io_context stopped at once (the
      // runs end without it) and destroyed right after every handle reads done.
      for (auto& h : handles) h.cancel();
      io->stop();
      io_thread.join();
      for (std::size_t k = 0; k < n; ++k) {
        const std::size_t i = (k * 4) % n + (k * 4) / n; // the periodic tasks first
        if (handles[i].wait_for(10s) != std::future_status::ready) {
          errs.add(fmt("task %zu: not done 10 s after cancel()", i));
          break;
        }
      }
    } else {
      io->stop(); // runs away on the strands end after the io_context is gone
      io_thread.join();
    }
    for (auto& t : cancellers) t.join();
    serial.reset();
    guard.reset();
    if (errs.count() != 0) { // a hung task still touches the io_context and the pool: kept
      (void)io.release();
      (void)pool.release();
      f.take(errs, fmt("round %d", b.rounds()));
      break;
    }
    for (auto& h : handles) away_at_destruction += h.is_done() ? 0 : 1;
    io.reset(); // its timing service ends what it holds; runs away on the strands go on
    for (auto& s : strands) s.reset();
    pool.reset(); // runs what the strands still hold
    account_bound_round(slots, handles, [](std::size_t i) { return i % 4 == 0; }, off_strand.load(), errs, ran_total,
                        cancelled_total);
    f.take(errs, fmt("round %d", b.rounds()));
  }
  BOOST_TEST(f.bad_rounds() == 0);
  BOOST_TEST_MESSAGE("serial tasks over an io_context bound to a pool: "
                     << b.rounds() << " rounds, " << ran_total << " runs, " << cancelled_total << " cancelled, "
                     << away_at_destruction << " not done at the io_context's destruction");
  f.report("serial tasks over an io_context, bound to a pool, against cancels and the io_context's end", b.rounds());
}

BOOST_AUTO_TEST_SUITE_END()
