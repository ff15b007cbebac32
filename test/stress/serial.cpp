// Stress with accounting, ordered work: serial executors over a metronome pool, an
// net::thread_pool and an io_context keep their order and run every task once under
// load (delayed serial tasks in due order on four threads); join() with and without
// shutdown() returns with asio strands and serial executors busy over the pool.
// Bounded in time like every stress case; seeds as in common/stress_rounds.hpp.

#include "common/stress_rounds.hpp"
#include "common/poll_until.hpp"

#include <metronome/async_delay.hpp>
#include "common/manual_pool.hpp"

#include <metronome/detail/asio.hpp>

#include <algorithm>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace {

// ======================================================================= serial executors

struct serial_shared {
  std::atomic<bool> inflight{false};
  std::atomic<int> overlaps{0};
  int last[3] = {-1, -1, -1}; // plain: touched only inside serial tasks
  int fifo_breaks = 0;
  std::string first_break;
  metronome::test::counter done;
};

template <class Serial>
auto serial_body(serial_shared* sh, slot* s, int p, int seq) {
  return [l = life(s), sh, s, p, seq] {
    if (sh->inflight.exchange(true, std::memory_order_acq_rel)) sh->overlaps.fetch_add(1);
    if (seq != sh->last[p] + 1) {
      if (sh->fifo_breaks++ == 0) sh->first_break = fmt("producer %d: task %d ran after task %d", p, seq, sh->last[p]);
    }
    sh->last[p] = seq;
    count_run(s);
    sh->inflight.store(false, std::memory_order_release);
    sh->done.add();
  };
}

// Three producers post / dispatch / defer / submit to one serial executor; each also
// runs two throwing periodic tasks on it. Per-producer FIFO, mutual exclusion,
// exactly-once, callables destroyed once (checked by the caller once the executors are gone).
struct slot_block {
  std::unique_ptr<slot[]> p;
  int n;
};

void check_destroyed_once(std::vector<slot_block>& keep, errors& errs, const char* what) {
  for (auto& blk : keep)
    for (int i = 0; i < blk.n; ++i)
      if (blk.p[i].destroyed.load() != 1) {
        errs.add(fmt("%s: a callable was destroyed %d times (want 1)", what, blk.p[i].destroyed.load()));
        return;
      }
}

template <class Serial>
void serial_round(Serial serial, std::uint64_t seed, errors& errs, int per, std::vector<slot_block>& keep) {
  auto sh = std::make_unique<serial_shared>();
  const int producers = 3;
  std::unique_ptr<slot[]> slots(new slot[static_cast<std::size_t>(producers * per)]);
  std::unique_ptr<slot[]> pslots(new slot[producers * 2]);
  std::vector<std::vector<scheduled_future<void>>> handles(producers);
  std::vector<scheduled_future<void>> periodic(producers * 2);
  std::vector<std::thread> ts;
  for (int p = 0; p < producers; ++p) {
    ts.emplace_back([&, p] {
      tl_role = on_producer;
      std::mt19937_64 rng(seed * 131 + p);
      serial_shared* shp = sh.get();
      // Periodic tasks on the serial executor that throw: one stops, one goes on.
      for (int j = 0; j < 2; ++j) {
        slot* ps = &pslots[p * 2 + j];
        metronome::periodic_options po;
        po.on_error = j == 0 ? metronome::on_exception::stop : metronome::on_exception::continue_;
        auto body = [l = life(ps), ps, shp, j] {
          if (shp->inflight.exchange(true, std::memory_order_acq_rel)) shp->overlaps.fetch_add(1);
          const int n = count_run(ps);
          shp->inflight.store(false, std::memory_order_release);
          if (n == 3 - j) {
            ps->throws.fetch_add(1);
            throw boom{ps};
          }
        };
        try {
          if (j == 0)
            periodic[p * 2 + j] = serial.schedule_at_fixed_rate(std::move(body), 0ms, 1ms, po);
          else
            periodic[p * 2 + j] = serial.schedule_with_fixed_delay(std::move(body), 1ms, 1ms, po);
        } catch (const std::exception& e) {
          errs.add(fmt("periodic on a serial executor threw at submission: %s", e.what()));
        }
      }
      for (int i = 0; i < per; ++i) {
        slot* s = &slots[p * per + i];
        auto body = serial_body<Serial>(shp, s, p, i);
        switch (rng() % 4) {
        case 0:
          net::post(serial, std::move(body));
          break;
        case 1:
          net::dispatch(serial, std::move(body));
          break;
        case 2:
          net::defer(serial, std::move(body));
          break;
        default:
          try {
            handles[p].push_back(serial.submit(std::move(body)));
          } catch (const std::exception& e) {
            errs.add(fmt("serial submit threw %s", e.what()));
          }
          break;
        }
        if (rng() % 64 == 0) std::this_thread::yield();
      }
    });
  }
  for (auto& t : ts) t.join();
  const int want = producers * per;
  if (!sh->done.wait_for_at_least(want))
    errs.add(fmt("only %d of %d serial tasks ran within 20 s", sh->done.value(), want));
  for (auto& h : periodic) h.cancel();
  for (auto& h : periodic)
    if (h.valid() && h.wait_for(10s) != std::future_status::ready)
      errs.add("a cancelled periodic task of the serial executor did not finish within 10 s");
  for (int p = 0; p < producers; ++p)
    for (auto& h : handles[p])
      if (h.wait_for(1s) != std::future_status::ready) errs.add("a serial submit() handle is not done");
  if (sh->overlaps.load()) errs.add(fmt("%d times two tasks of one serial executor ran at once", sh->overlaps.load()));
  if (sh->fifo_breaks) errs.add(fmt("per-producer FIFO broken %d times; first: %s", sh->fifo_breaks, sh->first_break.c_str()));
  for (int i = 0; i < want; ++i)
    if (slots[i].total() != 1) {
      errs.add(fmt("serial task %d ran %d times", i, slots[i].total()));
      break;
    }
  for (int k = 0; k < producers * 2; ++k) {
    slot* ps = &pslots[k];
    if (k % 2 == 0 && ps->throws.load() > 0) {
      if (ps->runs.load() != 3) errs.add(fmt("a periodic serial task stopped by an exception at run 3 ran %d times", ps->runs.load()));
      try {
        periodic[k].get();
        errs.add("a periodic serial task stopped by an exception: get() returned normally");
      } catch (const boom&) {
      } catch (const std::exception& e) {
        errs.add(fmt("a periodic serial task stopped by an exception: get() threw %s", e.what()));
      }
    }
  }
  keep.push_back({std::move(slots), want});
  keep.push_back({std::move(pslots), producers * 2});
  // The documented rule before the executor underneath goes away: after dispose() no
  // library thread (the timing pool posting a due task's drain) is inside its post.
  serial.dispose();
}


// Delayed serial tasks due at distinct times, scheduled from one thread, must run in
// due order however many pool threads move them. Manual clock: exact due times.
void delayed_serial_order_manual(std::uint64_t seed, errors& errs, int n) {
  std::mt19937_64 rng(seed);
  // Outlives the pool: a task's callable (and its token) is destroyed after it signals done.
  std::unique_ptr<slot[]> slots(new slot[n]);
  metronome::manual_clock c;
  scheduled_thread_pool pool(metronome::test::on_clock(c, 4));
  auto serial = make_serial_executor(pool);
  std::vector<int> delays(n);
  for (int i = 0; i < n; ++i) delays[i] = (i + 1) * 3; // microseconds, distinct
  std::shuffle(delays.begin(), delays.end(), rng);
  struct rec {
    std::atomic<bool> inflight{false};
    std::atomic<int> overlaps{0};
    std::vector<int> order; // plain: only touched inside serial tasks
    metronome::test::counter done;
  };
  auto r = std::make_unique<rec>();
  r->order.reserve(n);
  rec* rp = r.get();
  for (int i = 0; i < n; ++i) {
    const int d = delays[i];
    serial.schedule(
        [l = life(&slots[i]), rp, d] {
          if (rp->inflight.exchange(true)) rp->overlaps.fetch_add(1);
          rp->order.push_back(d);
          rp->inflight.store(false);
          rp->done.add();
        },
        std::chrono::microseconds(d));
  }
  const int end = n * 3 + 3;
  int t = 0;
  while (t < end) {
    const int step = 1 + static_cast<int>(rng() % (n / 4 + 2)) * 3;
    c.advance(std::chrono::microseconds(step));
    t += step;
  }
  if (!r->done.wait_for_at_least(n)) {
    errs.add(fmt("manual clock: only %d of %d delayed serial tasks ran within 20 s", r->done.value(), n));
    return;
  }
  int inversions = 0;
  std::string first;
  for (int i = 1; i < n; ++i)
    if (r->order[i] < r->order[i - 1]) {
      if (inversions++ == 0)
        first = fmt("task due at +%d us ran right after the one due at +%d us (position %d)", r->order[i],
                    r->order[i - 1], i);
    }
  if (inversions) errs.add(fmt("manual clock, 4 threads: %d of %d delayed serial tasks out of due order; first: %s", inversions, n, first.c_str()));
  if (r->overlaps.load()) errs.add(fmt("manual clock: %d overlapping serial tasks", r->overlaps.load()));
}

// The same on the real clock: due_i lies in [before_i + d_i, after_i + d_i]; a pair
// run in the wrong order is a violation only when those intervals do not overlap.
void delayed_serial_order_real(std::uint64_t seed, errors& errs, int n) {
  std::mt19937_64 rng(seed);
  scheduled_thread_pool pool(4);
  auto serial = make_serial_executor(pool);
  std::vector<int> delays(n);
  for (int i = 0; i < n; ++i) delays[i] = 1000 + i * 25; // microseconds: 1 ms .. 1 ms + n*25 us
  std::shuffle(delays.begin(), delays.end(), rng);
  struct rec {
    std::atomic<bool> inflight{false};
    std::atomic<int> overlaps{0};
    std::vector<int> order;
    metronome::test::counter done;
  };
  auto r = std::make_unique<rec>();
  r->order.reserve(n);
  std::vector<long long> lo(n), hi(n);
  std::vector<bool> due_at_submit(n);
  rec* rp = r.get();
  for (int i = 0; i < n; ++i) {
    const long long before = real_ns();
    serial.schedule(
        [rp, i] {
          if (rp->inflight.exchange(true)) rp->overlaps.fetch_add(1);
          rp->order.push_back(i);
          rp->inflight.store(false);
          rp->done.add();
        },
        std::chrono::microseconds(delays[i]));
    const long long after = real_ns();
    lo[i] = before + delays[i] * 1000LL;
    hi[i] = after + delays[i] * 1000LL;
    // A schedule() call slower than its own delay may find the task due already: it then
    // joins the serial queue at once, as a task due now does, and may pass an earlier
    // task still waiting in the heap for the pool to notice it fell due (a task joins
    // the ready path when the pool promotes it). Only the order of tasks that went
    // through the heap is certain.
    due_at_submit[i] = after >= lo[i];
  }
  if (!r->done.wait_for_at_least(n)) {
    errs.add(fmt("real clock: only %d of %d delayed serial tasks ran within 20 s", r->done.value(), n));
    return;
  }
  int violations = 0;
  std::string first;
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) {
      const int x = r->order[a], y = r->order[b]; // x ran before y
      if (due_at_submit[x]) continue;
      if (hi[y] < lo[x]) {
        if (violations++ == 0)
          first = fmt("a task due %lld us later ran before one due earlier (run positions %d and %d)",
                      (lo[x] - hi[y]) / 1000, a, b);
      }
    }
  if (violations) errs.add(fmt("real clock, 4 threads: %d pairs of delayed serial tasks ran against their certain due order; first: %s", violations, first.c_str()));
  if (r->overlaps.load()) errs.add(fmt("real clock: %d overlapping serial tasks", r->overlaps.load()));
}

// ======================================================================= strands, serials and join()

// Producers post to asio strands and serial executors over the pool (tasks re-post a
// follow-up from inside); the test thread calls shutdown() at a random moment (or
// not at all), then join(), which must return. Without shutdown every task must have
// run exactly once when join() returns.
bool join_round(std::uint64_t seed, errors& errs, bool with_shutdown, int per) {
  std::mt19937_64 rng(seed);
  using strand_t = net::strand<scheduled_thread_pool::executor_type>;
  using serial_t = metronome::serial_executor<scheduled_thread_pool::executor_type>;
  struct target {
    std::atomic<bool> inflight{false};
    std::atomic<int> overlaps{0};
  };
  struct state {
    std::unique_ptr<scheduled_thread_pool> pool;
    std::vector<strand_t> strands;
    std::vector<serial_t> serials;
    target targets[5];
    std::unique_ptr<slot[]> slots; // 3 per op: the task and up to two follow-ups
    std::atomic<int> ops_done{0}, producers_done{0};
  };
  auto stp = std::make_shared<state>();
  state& st = *stp;
  const int producers = 2;
  {
    pool_options o;
    o.threads = 2;
    o.exception_handler = [](std::exception_ptr) {}; // dropped outside work is reported here
    st.pool = std::make_unique<scheduled_thread_pool>(o);
  }
  for (int i = 0; i < 3; ++i) st.strands.push_back(net::make_strand(st.pool->get_executor()));
  for (int i = 0; i < 2; ++i) st.serials.push_back(make_serial_executor(st.pool->get_executor()));
  st.slots.reset(new slot[producers * per * 3]);

  // A task on target t: checks exclusion, counts, and hands its follow-up (if any)
  // to a target chosen by its seed, from inside: post, defer or dispatch, directly or
  // through a short timer on the pool.
  struct poster {
    static void post_to(state* sp, int t, slot* s, int chain, unsigned how, bool inside = true) {
      auto body = [l = life(s), sp, t, s, chain, how] {
        target& tg = sp->targets[t];
        if (tg.inflight.exchange(true)) tg.overlaps.fetch_add(1);
        count_run(s);
        tg.inflight.store(false);
        if (chain > 0) {
          (s + 1)->posted.store(1);
          const unsigned next = how * 2654435761u + 1u;
          if (how % 4 == 3) {
            try {
              sp->pool->schedule([sp, next, s, chain] { post_to(sp, static_cast<int>(next % 5), s + 1, chain - 1, next); },
                                 std::chrono::microseconds(how % 1500));
            } catch (const rejected_execution&) {
              (s + 1)->posted.store(0); // the pool is shut down: this follow-up is never created
            }
          } else {
            post_to(sp, static_cast<int>(next % 5), s + 1, chain - 1, next);
          }
        }
      };
      auto go = [&](auto ex) {
        // From inside, no dispatch: onto the same strand it would nest (legitimately).
        switch (inside ? how % 2 : how % 3) {
        case 0:
          net::post(ex, std::move(body));
          break;
        case 1:
          net::defer(ex, std::move(body));
          break;
        default:
          net::dispatch(ex, std::move(body));
          break;
        }
      };
      if (t < 3)
        go(sp->strands[t]);
      else
        go(sp->serials[t - 3]);
    }
  };
  std::vector<std::thread> ts;
  for (int p = 0; p < producers; ++p)
    ts.emplace_back([&st, p, per, s0 = rng()] {
      std::mt19937_64 r2(s0);
      for (int i = 0; i < per; ++i) {
        slot* s = &st.slots[(p * per + i) * 3];
        s->posted.store(1);
        poster::post_to(&st, static_cast<int>(r2() % 5), s, static_cast<int>(r2() % 3), static_cast<unsigned>(r2()), false);
        st.ops_done.fetch_add(1);
      }
      st.producers_done.fetch_add(1);
    });
  if (with_shutdown) {
    const int threshold = static_cast<int>(rng() % (producers * per + 1));
    while (st.ops_done.load() < threshold && st.producers_done.load() < producers) std::this_thread::yield();
    st.pool->shutdown();
  }
  for (auto& t : ts) t.join();
  if (!finishes_within(20s, [&st] { st.pool->join(); })) {
    errs.add(fmt("join() %s did not return within 20 s (hang; stats: ready=%zu delayed=%zu active=%zu)",
                 with_shutdown ? "after shutdown()" : "without shutdown()", st.pool->stats().ready_queued,
                 st.pool->stats().delayed_queued, st.pool->stats().active));
    metronome::test::leak(stp);
    return false;
  }
  for (int t = 0; t < 5; ++t)
    if (st.targets[t].overlaps.load())
      errs.add(fmt("%s %d: %d times two tasks ran at once", t < 3 ? "strand" : "serial", t, st.targets[t].overlaps.load()));
  const int n = producers * per * 3;
  int not_run = 0;
  for (int i = 0; i < n; ++i) {
    slot& s = st.slots[i];
    if (!s.posted.load()) continue;
    if (s.total() > 1) errs.add(fmt("a strand/serial task ran %d times", s.total()));
    if (s.total() == 0) ++not_run;
  }
  if (!with_shutdown && not_run)
    errs.add(fmt("join() without shutdown() returned while %d posted strand/serial tasks had not run", not_run));
  st.strands.clear();
  st.serials.clear();
  if (!finishes_within(20s, [&st] { st.pool.reset(); })) {
    errs.add("~scheduled_thread_pool() after join() did not return within 20 s (hang)");
    metronome::test::leak(stp);
    return false;
  }
  for (int i = 0; i < n; ++i) {
    slot& s = st.slots[i];
    if (s.posted.load() && s.destroyed.load() != 1) {
      errs.add(fmt("a strand/serial callable was destroyed %d times (want 1)", s.destroyed.load()));
      break;
    }
  }
  return true;
}

} // namespace

BOOST_AUTO_TEST_SUITE(stress_suite)

// ---- serial executors over three kinds of executor

BOOST_AUTO_TEST_CASE(serial_over_a_metronome_pool) {
  run_rounds("serial over a metronome pool", 4, budget(ms(2500, 4000), 2, 100000),
             [](std::uint64_t seed, errors& errs) {
               std::vector<slot_block> keep;
               {
                 pool_options o;
                 o.threads = 2;
                 reports rep;
                 o.exception_handler = rep.handler();
                 scheduled_thread_pool pool(o);
                 serial_round(make_serial_executor(pool), seed, errs, scaled(3000, 500), keep);
               }
               check_destroyed_once(keep, errs, "serial over a metronome pool");
               return true;
             });
}

BOOST_AUTO_TEST_CASE(delayed_serial_tasks_keep_due_order_on_four_threads_manual_clock) {
  run_rounds("delayed serial order, manual clock, 4 threads", 7, budget(ms(2000, 3000), 3, 100000),
             [](std::uint64_t seed, errors& errs) {
               delayed_serial_order_manual(seed, errs, scaled(2000, 400));
               return true;
             });
}

BOOST_AUTO_TEST_CASE(delayed_serial_tasks_keep_due_order_on_four_threads_real_clock) {
  run_rounds("delayed serial order, real clock, 4 threads", 8, budget(ms(2500, 4000), 3, 100000),
             [](std::uint64_t seed, errors& errs) {
               delayed_serial_order_real(seed, errs, scaled(600, 200));
               return true;
             });
}

// ---- join() with strands and serial executors

BOOST_AUTO_TEST_CASE(join_after_shutdown_with_strands_and_serials) {
  run_rounds("join() after shutdown() with strands/serials", 10, budget(ms(2500, 4000), 3, 100000),
             [](std::uint64_t seed, errors& errs) { return join_round(seed, errs, true, scaled(400, 100)); });
}

BOOST_AUTO_TEST_CASE(join_without_shutdown_with_strands_and_serials) {
  run_rounds("join() without shutdown() with strands/serials", 11, budget(ms(2000, 3000), 3, 100000),
             [](std::uint64_t seed, errors& errs) { return join_round(seed, errs, false, scaled(400, 100)); });
}


// ---- serial executors over non-metronome executors: a throwing periodic serial task is
// reported through the shared timing pool's handler.

BOOST_AUTO_TEST_CASE(serial_over_an_asio_thread_pool) {
  run_rounds("serial over net::thread_pool", 5, budget(ms(2500, 4000), 2, 100000),
             [](std::uint64_t seed, errors& errs) {
               std::vector<slot_block> keep;
               {
                 net::thread_pool tp(2);
                 serial_round(make_serial_executor(tp.get_executor()), seed, errs, scaled(3000, 500), keep);
                 tp.join();
               }
               check_destroyed_once(keep, errs, "serial over net::thread_pool");
               return true;
             });
}

// Handlers that throw over an io_context (Asio's rule: the exception leaves run(), the
// rest waits for the next run()): two threads run the io_context, each calling run()
// again after every exception; two producers post to four serial executors, a strand and
// async_delay waits, one task in eight throwing. Every task runs once, each serial
// executor keeps each producer's order and never overlaps, and every exception comes out
// of run() exactly once.
BOOST_AUTO_TEST_CASE(throwing_handlers_over_an_io_context_lose_nothing) {
  struct thrown {};
  run_rounds("throwing handlers over io_context", 12, budget(ms(2000, 3000), 2, 100000),
             [](std::uint64_t seed, errors& errs) {
               constexpr int serials = 4;
               constexpr int producers = 2;
               const int per_producer = scaled(2000, 300);
               net::io_context ioc;
               auto guard = net::make_work_guard(ioc);
               std::vector<metronome::serial_executor<net::io_context::executor_type>> ex;
               for (int i = 0; i < serials; ++i) ex.push_back(make_serial_executor(ioc.get_executor()));
               auto strand = net::make_strand(ioc);
               struct lane {
                 std::atomic<bool> inside{false};
                 int last[producers] = {-1, -1};
               };
               std::vector<lane> lanes(serials);
               std::atomic<int> ran{0}, threw{0}, caught{0}, overlaps{0}, breaks{0}, twice{0};
               std::unique_ptr<std::atomic<int>[]> runs(new std::atomic<int>[producers * per_producer]());
               auto run_io = [&] {
                 for (;;) {
                   try {
                     ioc.run();
                     return;
                   } catch (const thrown&) {
                     caught.fetch_add(1);
                   }
                 }
               };
               std::thread r1(run_io), r2(run_io);
               std::vector<std::thread> ps;
               for (int p = 0; p < producers; ++p)
                 ps.emplace_back([&, p] {
                   std::minstd_rand rng(static_cast<unsigned>(seed) + p);
                   for (int i = 0; i < per_producer; ++i) {
                     const int id = p * per_producer + i;
                     const bool throws = rng() % 8 == 0;
                     auto body = [&, id, throws] {
                       if (runs[id].fetch_add(1) != 0) twice.fetch_add(1);
                       ran.fetch_add(1);
                       if (throws) {
                         threw.fetch_add(1);
                         throw thrown{};
                       }
                     };
                     switch (rng() % 3) {
                     case 0: { // a serial executor: order and exclusion checked
                       const int k = static_cast<int>(rng() % serials);
                       net::post(ex[k], [&, k, p, i, body] {
                         lane& l = lanes[k];
                         if (l.inside.exchange(true)) overlaps.fetch_add(1);
                         if (l.last[p] >= i) breaks.fetch_add(1);
                         l.last[p] = i;
                         l.inside.store(false);
                         body();
                       });
                       break;
                     }
                     case 1:
                       net::post(strand, body);
                       break;
                     default:
                       metronome::async_delay(ioc.get_executor(), std::chrono::microseconds(rng() % 500),
                                              [body](metronome::error_code) { body(); });
                       break;
                     }
                   }
                 });
               for (auto& t : ps) t.join();
               const int total = producers * per_producer;
               const bool all = metronome::test::poll_until([&] { return ran.load() == total; }, std::chrono::seconds(60));
               guard.reset();
               r1.join();
               r2.join();
               if (!all) errs.add(fmt("ran %d of %d tasks", ran.load(), total));
               if (twice.load() != 0) errs.add(fmt("%d tasks ran more than once", twice.load()));
               if (overlaps.load() != 0) errs.add(fmt("%d overlapping runs on a serial executor", overlaps.load()));
               if (breaks.load() != 0) errs.add(fmt("%d tasks ran before an earlier one of their producer", breaks.load()));
               if (caught.load() != threw.load())
                 errs.add(fmt("%d exceptions thrown, %d came out of run()", threw.load(), caught.load()));
               return all;
             });
}

BOOST_AUTO_TEST_CASE(serial_over_an_io_context_run_by_two_threads) {
  run_rounds("serial over io_context", 6, budget(ms(2500, 4000), 2, 100000),
             [](std::uint64_t seed, errors& errs) {
               std::vector<slot_block> keep;
               {
                 net::io_context ioc;
                 auto guard = net::make_work_guard(ioc);
                 std::thread t1([&] { ioc.run(); }), t2([&] { ioc.run(); });
                 serial_round(make_serial_executor(ioc.get_executor()), seed, errs, scaled(3000, 500), keep);
                 guard.reset();
                 ioc.stop();
                 t1.join();
                 t2.join();
               }
               check_destroyed_once(keep, errs, "serial over io_context");
               return true;
             });
}

BOOST_AUTO_TEST_SUITE_END()
