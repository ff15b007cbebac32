#ifndef METRONOME_TEST_STRESS_ROUNDS_HPP
#define METRONOME_TEST_STRESS_ROUNDS_HPP

// What every stress test shares: the run's base seed (METRONOME_STRESS_SEED=N replays
// a run; each round's seed is printed with its failures), run counting by role, the
// exception handler that counts reports by kind, findings grouped by kind over the
// rounds, the round runner, and chaos mode (METRONOME_CHAOS=1: every hand-over point of
// the engine yields or sleeps at random). Included by exactly one test file per
// executable (it defines the chaos global fixture).

#include <metronome/metronome.hpp>

#include "common/accounting.hpp"
#include "common/hooks.hpp"

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

namespace net = metronome::net;
using namespace std::chrono_literals;
using metronome::error_code;
using metronome::make_serial_executor;
using metronome::pool_options;
using metronome::rejected_execution;
using metronome::scheduled_future;
using metronome::scheduled_thread_pool;
using metronome::test::budget;
using metronome::test::errors;
using metronome::test::finishes_within;
using metronome::test::fmt;
using metronome::test::life;
using metronome::test::real_ns;
using metronome::test::scaled;
using metronome::test::slot;

namespace {

const std::uint64_t run_seed = metronome::test::base_seed("METRONOME_STRESS_SEED");

// Who is running a callable: decides which counter of its slot a run goes to.
enum role : int { on_library = 0, on_producer = 1, on_test_thread = 2 };
thread_local int tl_role = on_library;

inline int count_run(slot* s) {
  switch (tl_role) {
  case on_producer:
    s->on_caller.fetch_add(1);
    break;
  case on_test_thread:
    s->ran_me.fetch_add(1);
    break;
  default:
    s->ran.fetch_add(1);
    break;
  }
  long long zero = 0;
  s->first_run_ns.compare_exchange_strong(zero, real_ns());
  return s->runs.fetch_add(1) + 1;
}

struct boom {
  slot* s;
};

// The pool's exception handler: counts by kind.
struct reports {
  std::atomic<int> rejected{0}, booms{0}, nulls{0}, other{0};
  std::function<void(std::exception_ptr)> handler() {
    return [this](std::exception_ptr e) {
      if (!e) {
        nulls.fetch_add(1);
        return;
      }
      try {
        std::rethrow_exception(e);
      } catch (const boom& b) {
        b.s->reported.fetch_add(1);
        booms.fetch_add(1);
      } catch (const rejected_execution&) {
        rejected.fetch_add(1);
      } catch (...) {
        other.fetch_add(1);
      }
    };
  }
};

// Collects a case's errors over its rounds, grouped by kind (the message with its
// numbers blanked), so that one systematic defect shows once with a count and an
// example rather than hiding the others.
class findings {
public:
  // Takes the round's errors; returns whether there were any.
  bool take(errors& e, const std::string& round) {
    const auto n = e.count();
    if (n == 0) return false;
    ++bad_rounds_;
    std::set<std::string> seen;
    for (auto& m : e.take()) {
      std::string key;
      for (char c : m)
        if (!(c >= '0' && c <= '9')) key += c;
        else if (key.empty() || key.back() != '#') key += '#';
      auto& k = kinds_[key];
      ++k.occurrences;
      if (seen.insert(key).second) ++k.rounds;
      if (k.example.empty()) k.example = round + ": " + m;
    }
    return true;
  }
  int bad_rounds() const { return bad_rounds_; }
  void report(const std::string& what, int rounds) {
    for (auto& [key, k] : kinds_)
      BOOST_ERROR(what << ": in " << k.rounds << " of " << rounds << " rounds (" << k.occurrences
                       << " occurrences); first: " << k.example);
  }

private:
  struct kind {
    int occurrences = 0, rounds = 0;
    std::string example;
  };
  std::map<std::string, kind> kinds_;
  int bad_rounds_ = 0;
};

// Runs rounds of `round(seed, errs) -> bool` (false: a watchdog fired, stop) within
// the budget; stops early after three failing rounds; reports findings grouped by kind.
template <class Round>
void run_rounds(const char* what, std::uint64_t salt, budget b, Round round) {
  findings f;
  while (b.next()) {
    const std::uint64_t seed = run_seed + salt * 1000003u + static_cast<std::uint64_t>(b.rounds());
    errors errs;
    const bool ok = round(seed, errs);
    f.take(errs, fmt("seed %llu", static_cast<unsigned long long>(seed)));
    if (!ok || f.bad_rounds() >= 3) break;
  }
  f.report(what, b.rounds());
  BOOST_TEST_MESSAGE(what << ": " << b.rounds() << " rounds (" << f.bad_rounds() << " failed), base seed " << run_seed);
}

inline std::chrono::milliseconds ms(int release, int sanitizer) { return std::chrono::milliseconds(scaled(release, sanitizer)); }

} // namespace

#if defined(METRONOME_TEST_HOOKS)
// Chaos mode (METRONOME_CHAOS=1, registered in CTest as stress_<area>_chaos): every hand-over
// point of the engine yields or sleeps at random, so the interleavings the scheduler
// rarely produces on its own come up in every round.
struct chaos_mode {
  std::unique_ptr<metronome::test::chaos> on;
  chaos_mode() {
    const char* e = std::getenv("METRONOME_CHAOS");
    if (e && e[0] == '1') on = std::make_unique<metronome::test::chaos>();
  }
};
BOOST_TEST_GLOBAL_FIXTURE(chaos_mode);
#endif

#endif
