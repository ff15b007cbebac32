// The model-based test's reference model and its driver (test/model/model.cpp): the
// model's tasks and log, the model of the pool's rules (delay queue by (due, sequence),
// ready FIFO, periodic re-arming and missed ticks, serial order), quiescence without
// sleeps, and the comparison of the real pool against the model after every step. The
// random steps themselves are in model.cpp.
#ifndef METRONOME_TEST_MODEL_RUN_HPP
#define METRONOME_TEST_MODEL_RUN_HPP

#include <metronome/metronome.hpp>

#include "common/accounting.hpp"
#include "common/manual_pool.hpp"

#include <metronome/detail/asio.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace net = metronome::net;
using namespace std::chrono_literals;
using metronome::cancelled_error;
using metronome::manual_clock;
using metronome::missed_tick;
using metronome::rejected_execution;
using metronome::scheduled_future;
using metronome::scheduled_thread_pool;
using metronome::test::fmt;
using metronome::test::life;
using metronome::test::slot;

namespace {

using tick = std::chrono::milliseconds; // one model tick

struct model_boom {
  int id;
  int run;
};

enum class kind { once, rate, fdelay, post, serial_once };
const char* kind_name(kind k) {
  switch (k) {
  case kind::once:
    return "one-shot";
  case kind::rate:
    return "fixed-rate";
  case kind::fdelay:
    return "fixed-delay";
  case kind::post:
    return "post";
  default:
    return "serial one-shot";
  }
}
const char* missed_name(missed_tick m) {
  return m == missed_tick::burst ? "burst" : m == missed_tick::delay ? "delay" : "skip";
}

enum class state { pending, done, cancelled, errored, rejected, dropped };
const char* state_name(state s) {
  static const char* n[] = {"pending", "done", "cancelled", "errored", "rejected", "dropped"};
  return n[static_cast<int>(s)];
}

// What the library's threads record; read by the test thread under the mutex.
struct real_log {
  std::mutex m;
  std::condition_variable cv;
  std::vector<int> ids;                         // every run, in order
  std::vector<std::pair<int, int>> reports;     // (id, run) of model_boom reports
  int rejected_reports = 0, null_reports = 0, other_reports = 0;
  void ran(int id) {
    {
      std::lock_guard lk(m);
      ids.push_back(id);
    }
    cv.notify_all();
  }
  std::size_t size() {
    std::lock_guard lk(m);
    return ids.size();
  }
};

struct task {
  int id = 0;
  kind k = kind::once;
  int serial = -1;
  // the model
  state st = state::pending;
  bool in_heap = false;
  long long due = 0; // ticks since the seed's start
  std::uint64_t seq = 0, first_seq = 0;
  long long period = 0;
  missed_tick missed = missed_tick::burst;
  bool stop_on_error = true;
  int throw_on = 0;
  int runs = 0;
  bool returned = false; // by shutdown_now
  // the real side
  scheduled_future<int> h;
  scheduled_future<void> hp;
  slot s;
  bool has_handle() const { return h.valid() || hp.valid(); }
  bool periodic() const { return k == kind::rate || k == kind::fdelay; }
  std::string describe() const {
    std::string d = fmt("#%d %s", id, kind_name(k));
    if (serial >= 0) d += fmt(" on serial %d", serial);
    if (periodic()) {
      d += fmt(" period %lld", period);
      if (k == kind::rate) d += fmt(" %s", missed_name(missed));
      if (throw_on) d += fmt(" throws on run %d (%s)", throw_on, stop_on_error ? "stop" : "continue");
    }
    return d;
  }
};

// Operations the generator stops producing once a defect they trigger has been seen
// a few times, so that one systematic defect does not hide the others (each is still
// reported). Replay with the same limits: METRONOME_MODEL_NO_SERIAL_AFTER_SHUTDOWN=1,
// METRONOME_MODEL_NO_THROWING=1.
struct generator_limits {
  bool serial_after_shutdown = true; // immediate serial submissions after shutdown
  bool throwing = true;              // periodic tasks that throw
  std::string str() const {
    std::string s;
    if (!serial_after_shutdown) s += " METRONOME_MODEL_NO_SERIAL_AFTER_SHUTDOWN=1";
    if (!throwing) s += " METRONOME_MODEL_NO_THROWING=1";
    return s;
  }
};

struct outcome {
  std::string message, kind;
};

// The kind of a failure: its first line with numbers blanked.
std::string kind_of(const std::string& m) {
  std::string k;
  for (char c : m) {
    if (c == '\n') break;
    if (c >= '0' && c <= '9') {
      if (k.empty() || k.back() != '#') k += '#';
    } else {
      k += c;
    }
  }
  return k;
}

class model_run {
public:
  model_run(std::uint64_t seed, bool trace_all, bool ties_original, generator_limits lim)
      : seed_(seed), rng_(seed), trace_all_(trace_all), ties_original_(ties_original), lim_(lim) {}

  // Returns the failure (empty message: none).
  outcome run();

private:
  // ---------------------------------------------------------------- plumbing
  std::string failure_, kind_;
  bool failed() const { return !failure_.empty(); }
  void fail(const std::string& m, const char* kind = nullptr) {
    if (failed()) return;
    kind_ = kind ? kind : kind_of(m);
    std::ostringstream o;
    o << "seed " << seed_ << ", step " << step_ << " (" << (trace_.empty() ? "" : trace_.back()) << "): " << m;
    o << "\n  options: run_delayed_after_shutdown=" << run_delayed_ << " continue_periodic_after_shutdown="
      << continue_periodic_ << " ties=" << (ties_original_ ? "original" : "re-armed");
    o << "\n  steps" << (trace_all_ ? "" : " (last 25)") << ":";
    const std::size_t from = trace_all_ || trace_.size() <= 25 ? 0 : trace_.size() - 25;
    for (std::size_t i = from; i < trace_.size(); ++i) o << "\n    " << (i + 1) << ": " << trace_[i];
    o << "\n  replay:" << lim_.str() << " METRONOME_MODEL_SEED=" << seed_;
    failure_ = o.str();
  }
  void note(std::string s) { trace_.push_back(std::move(s)); }
  int rnd(int n) { return static_cast<int>(rng_() % static_cast<std::uint64_t>(n)); }
  bool chance(int percent) { return rnd(100) < percent; }

  task& new_task(kind k, int serial = -1) {
    auto& t = *tasks_.emplace_back(std::make_unique<task>());
    t.id = static_cast<int>(tasks_.size());
    t.k = k;
    t.serial = serial;
    return t;
  }

  // The callables. They log their run on whichever thread runs them.
  auto once_body(task& t) {
    return [l = life(&t.s), tp = &t, lg = log_] {
      tp->s.runs.fetch_add(1);
      lg->ran(tp->id);
      return tp->id;
    };
  }
  auto periodic_body(task& t) {
    return [l = life(&t.s), tp = &t, lg = log_] {
      const int n = tp->s.runs.fetch_add(1) + 1;
      lg->ran(tp->id);
      if (tp->throw_on == n) throw model_boom{tp->id, n};
    };
  }
  auto post_body(task& t) {
    return [l = life(&t.s), tp = &t, lg = log_] {
      tp->s.runs.fetch_add(1);
      lg->ran(tp->id);
    };
  }

  // ---------------------------------------------------------------- the model
  void heap_push(task& t, long long due, bool rearm) {
    t.due = due;
    t.seq = next_seq_++;
    if (!rearm) t.first_seq = t.seq;
    t.in_heap = true;
    heap_.insert({due, ties_original_ ? t.first_seq : t.seq, t.id});
  }
  void heap_remove(task& t) {
    if (!t.in_heap) return;
    heap_.erase({t.due, ties_original_ ? t.first_seq : t.seq, t.id});
    t.in_heap = false;
  }
  task& by_id(int id) { return *tasks_[id - 1]; }

  void expect_run(task& t) {
    ++t.runs;
    expected_total_++;
    stream(t).push_back(t.id);
  }
  std::vector<int>& stream(task& t) { return t.serial >= 0 ? expected_serial_[t.serial] : expected_pool_; }

  // Runs the model's ready queue to exhaustion (the pool's single worker).
  void process() {
    while (!ready_.empty()) {
      task& t = by_id(ready_.front());
      ready_.pop_front();
      if (t.st != state::pending) continue;
      switch (t.k) {
      case kind::once:
      case kind::post:
        expect_run(t);
        t.st = state::done;
        break;
      case kind::serial_once:
        // Popped by the worker: joins its serial executor's queue, whose drain runs
        // it in the order of joining.
        if (serials_[t.serial].disposed) {
          t.st = state::cancelled;
        } else {
          expect_run(t);
          t.st = state::done;
        }
        break;
      case kind::rate:
      case kind::fdelay:
        run_periodic(t);
        break;
      }
    }
  }

  void run_periodic(task& t) {
    expect_run(t);
    if (t.throw_on == t.runs) {
      expected_reports_.push_back({t.id, t.runs});
      if (t.stop_on_error) {
        t.st = state::errored;
        return;
      }
    }
    if (shutdown_ && !continue_periodic_) {
      t.st = state::cancelled;
      return;
    }
    long long next;
    if (t.k == kind::fdelay) {
      next = now_ + t.period;
    } else {
      const long long grid = t.due + t.period;
      if (grid > now_) {
        next = grid;
      } else if (t.missed == missed_tick::burst) {
        next = grid;
      } else if (t.missed == missed_tick::delay) {
        next = now_ + t.period;
      } else {
        next = t.due + t.period * ((now_ - t.due) / t.period + 1);
      }
    }
    if (next <= now_) {
      t.due = next;
      ready_.push_back(t.id);
    } else {
      heap_push(t, next, true);
    }
  }

  void model_advance(long long k) {
    now_ += k;
    while (!heap_.empty() && std::get<0>(*heap_.begin()) <= now_) {
      task& t = by_id(std::get<2>(*heap_.begin()));
      heap_.erase(heap_.begin());
      t.in_heap = false;
      ready_.push_back(t.id);
    }
    process();
  }

  // ---------------------------------------------------------------- quiescence
  bool quiesce() {
    if (stopped_) return true; // nothing runs on the pool any more
    if (!shutdown_) {
      // A sentinel runs after everything queued before it and reads, on the only
      // worker, how many tasks that worker has completed. Two sentinels in a row with
      // nothing completed between them mean nothing was queued behind the first one,
      // so the pool is quiescent. (stats().ready_queued alone is not enough: it lags a
      // push in progress, e.g. the test's own sentinel, by one.)
      auto* p = pool_.get();
      std::size_t prev = 0;
      for (int round = 0; round < 200000; ++round) {
        auto sentinel = p->submit([p] {
          auto st = p->stats();
          return std::pair<std::size_t, std::size_t>(st.completed, st.ready_queued);
        });
        if (sentinel.wait_for(10s) != std::future_status::ready) {
          fail("a sentinel task did not run within 10 s (the pool hangs)");
          return false;
        }
        const auto [completed, queued] = sentinel.get();
        if (round > 0 && completed == prev + 1 && queued == 0) return true;
        prev = completed;
      }
      fail("the pool never became quiescent (ready work kept coming)");
      return false;
    }
    // After shutdown: wait for the model's number of runs, then for idleness.
    {
      std::unique_lock lk(log_->m);
      if (!log_->cv.wait_for(lk, 5s, [&] { return log_->ids.size() >= expected_total_; })) {
        fail(fmt("after shutdown: %zu runs within 5 s, the model expects %zu", log_->ids.size(), expected_total_));
        return false;
      }
    }
    const auto limit = std::chrono::steady_clock::now() + 5s;
    for (;;) {
      auto st = pool_->stats();
      if (st.active == 0 && st.ready_queued == 0) return true;
      if (std::chrono::steady_clock::now() > limit) {
        fail(fmt("after shutdown: still active=%zu ready=%zu after 5 s", st.active, st.ready_queued));
        return false;
      }
      std::this_thread::yield();
    }
  }

  // ---------------------------------------------------------------- comparison
  void compare() {
    if (failed()) return;
    std::vector<int> ids;
    std::vector<std::pair<int, int>> reports;
    int rej, nul, oth;
    {
      std::lock_guard lk(log_->m);
      ids = log_->ids;
      reports = log_->reports;
      rej = log_->rejected_reports;
      nul = log_->null_reports;
      oth = log_->other_reports;
    }
    std::vector<int> pool_seen;
    std::vector<std::vector<int>> serial_seen(serials_.size());
    for (int id : ids) {
      task& t = by_id(id);
      if (t.serial >= 0)
        serial_seen[t.serial].push_back(id);
      else
        pool_seen.push_back(id);
    }
    if (!same_order(pool_seen, expected_pool_, "the pool's run order")) return;
    for (std::size_t j = 0; j < serials_.size(); ++j)
      if (!same_order(serial_seen[j], expected_serial_[j], fmt("serial %zu's run order", j).c_str())) return;
    if (nul)
      return fail(fmt("the exception handler received %d null exception_ptr(s) (expected reports: %s)", nul,
                      reports_str(expected_reports_).c_str()),
                  "the exception handler received a null exception_ptr for a throwing periodic task");
    if (oth) return fail(fmt("the exception handler received %d unexpected exception(s)", oth));
    if (reports != expected_reports_)
      return fail("exception handler reports " + reports_str(reports) + ", model expects " +
                  reports_str(expected_reports_));
    if (rejected_exact_ && rej != expected_rejected_reports_)
      return fail(fmt("the exception handler got %d rejected_execution reports, model expects %d", rej,
                      expected_rejected_reports_));
    for (auto& tp : tasks_) {
      task& t = *tp;
      const int real_runs = t.s.runs.load();
      if (real_runs != t.runs) return fail(fmt("%s ran %d times, model expects %d", t.describe().c_str(), real_runs, t.runs));
      const int destroyed = t.s.destroyed.load();
      const bool terminal = t.st != state::pending;
      if (destroyed != (terminal ? 1 : 0))
        return fail(fmt("%s (%s): callable destroyed %d times, want %d", t.describe().c_str(), state_name(t.st),
                        destroyed, terminal ? 1 : 0));
      if (t.has_handle() && !destroyed_) { // after destruction: check_after_destroy()
        const bool done = t.h.valid() ? t.h.is_done() : t.hp.is_done();
        const bool cancelled = t.h.valid() ? t.h.is_cancelled() : t.hp.is_cancelled();
        if (done != terminal || cancelled != (t.st == state::cancelled))
          return fail(fmt("%s: handle done=%d cancelled=%d, model state %s", t.describe().c_str(), done, cancelled,
                          state_name(t.st)));
      }
    }
    if (!destroyed_) {
      auto st = pool_->stats();
      if (st.delayed_queued != heap_.size())
        return fail(fmt("stats().delayed_queued = %zu, the model's delay queue holds %zu", st.delayed_queued,
                        heap_.size()));
      if (rejected_exact_ && st.rejected != expected_rejected_)
        return fail(fmt("stats().rejected = %zu, model expects %zu", st.rejected, expected_rejected_));
    }
  }

  bool same_order(const std::vector<int>& seen, const std::vector<int>& want, const char* what) {
    if (seen == want) return true;
    std::size_t i = 0;
    while (i < seen.size() && i < want.size() && seen[i] == want[i]) ++i;
    auto show = [&](const std::vector<int>& v) {
      std::string s;
      for (std::size_t k = i >= 3 ? i - 3 : 0; k < v.size() && k < i + 8; ++k) s += fmt(" #%d", v[k]);
      return s;
    };
    fail(fmt("%s differs at position %zu: ran [%s ], model [%s ]", what, i, show(seen).c_str(), show(want).c_str()) +
         (i < want.size() ? "\n  model's next: " + by_id(want[i]).describe() : std::string()) +
         (i < seen.size() ? "\n  ran instead: " + by_id(seen[i]).describe() : std::string()));
    return false;
  }
  static std::string reports_str(const std::vector<std::pair<int, int>>& v) {
    std::string s = "[";
    for (auto& [id, run] : v) s += fmt(" #%d@%d", id, run);
    return s + " ]";
  }

  // ---------------------------------------------------------------- steps
  void step_schedule(bool immediate_submit);
  void step_periodic(bool fixed_rate);
  void step_post();
  void step_cancel();
  void step_serial_make();
  void step_serial_submit(bool via_schedule);
  void step_serial_dispose();
  void step_advance();
  void step_shutdown();
  void step_shutdown_now();
  void destroy();
  void check_after_destroy();
  // A hung pool: keep everything its threads may still touch.
  void leak_all() {
    metronome::test::leak(std::shared_ptr<void>(log_));
    for (auto& t : tasks_) metronome::test::leak(std::shared_ptr<void>(t.release(), [](void*) {}));
    tasks_.clear();
  }
  template <class Call>
  void typed_submission(task& t, Call call, bool rejected_expected);

  // ---------------------------------------------------------------- state
  std::uint64_t seed_;
  std::mt19937_64 rng_;
  bool trace_all_, ties_original_;
  generator_limits lim_;
  int step_ = 0;
  std::vector<std::string> trace_;

  bool run_delayed_ = true, continue_periodic_ = false;
  manual_clock clock_;
  std::shared_ptr<real_log> log_ = std::make_shared<real_log>();
  std::unique_ptr<scheduled_thread_pool> pool_;
  struct serial_rec {
    std::optional<metronome::serial_executor<scheduled_thread_pool::executor_type>> ex;
    bool disposed = false;
  };
  std::vector<serial_rec> serials_;
  std::vector<std::unique_ptr<task>> tasks_;

  long long now_ = 0;
  std::uint64_t next_seq_ = 0;
  std::set<std::tuple<long long, std::uint64_t, int>> heap_;
  std::deque<int> ready_;
  bool shutdown_ = false, stopped_ = false, destroyed_ = false;
  bool stranded_ = false, after_destroy_checked_ = false;
  std::vector<int> expected_pool_;
  std::vector<std::vector<int>> expected_serial_;
  std::size_t expected_total_ = 0;
  std::vector<std::pair<int, int>> expected_reports_;
  int expected_rejected_reports_ = 0;
  std::size_t expected_rejected_ = 0;
  bool rejected_exact_ = true;
};

} // namespace

#endif
