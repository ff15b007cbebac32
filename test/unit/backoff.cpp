#include <metronome/backoff.hpp>

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

using namespace std::chrono_literals;
using metronome::backoff;
using metronome::backoff_options;
using mclock = metronome::clock;

BOOST_AUTO_TEST_SUITE(backoff_suite)

BOOST_AUTO_TEST_CASE(without_jitter_the_delays_grow_exponentially_to_the_cap) {
  backoff b({.initial = 100ms, .multiplier = 2.0, .cap = 1s, .full_jitter = false});
  std::vector<mclock::duration> got;
  for (int i = 0; i < 6; ++i) got.push_back(*b.next());
  const std::vector<mclock::duration> want{100ms, 200ms, 400ms, 800ms, 1s, 1s};
  BOOST_TEST((got == want));
  BOOST_TEST(b.attempts() == 6u);
  b.reset();
  BOOST_TEST((*b.next() == 100ms));
}

BOOST_AUTO_TEST_CASE(a_fractional_multiplier_grows_from_a_tiny_initial_delay) {
  // 1 ns x 1.5^n, truncated to whole nanoseconds only when handed out: 1, 1, 2, 3, 5,
  // 7, 11 (a ceiling truncated at each step would stay at 1 ns for ever).
  backoff b({.initial = 1ns, .multiplier = 1.5, .cap = 1s, .full_jitter = false});
  std::vector<mclock::duration> got;
  for (int i = 0; i < 7; ++i) got.push_back(*b.next());
  const std::vector<mclock::duration> want{1ns, 1ns, 2ns, 3ns, 5ns, 7ns, 11ns};
  BOOST_TEST((got == want));
  for (int i = 0; i < 100; ++i) b.next();
  BOOST_TEST((*b.next() == 1s)); // 1.5^107 ns is far past the cap
  // The largest cap the clock allows is reached and held, never overflowed.
  backoff huge({.initial = 1ns, .multiplier = 1e300, .cap = mclock::duration::max(), .full_jitter = false});
  BOOST_TEST((*huge.next() == 1ns));
  BOOST_TEST((*huge.next() == mclock::duration::max()));
  BOOST_TEST((*huge.next() == mclock::duration::max()));
}

BOOST_AUTO_TEST_CASE(max_retries_ends_the_sequence) {
  backoff b({.initial = 1ms, .full_jitter = false, .max_retries = 3});
  BOOST_TEST(b.next().has_value());
  BOOST_TEST(b.next().has_value());
  BOOST_TEST(b.next().has_value());
  BOOST_TEST(!b.next().has_value());
  BOOST_TEST(!b.next().has_value());
  b.reset();
  BOOST_TEST(b.next().has_value());
}

BOOST_AUTO_TEST_CASE(full_jitter_stays_within_each_ceiling_and_spreads) {
  backoff_options o{.initial = 100ms, .multiplier = 3.0, .cap = 2s, .seed = 42};
  std::set<mclock::rep> distinct;
  for (int round = 0; round < 200; ++round) {
    backoff b(o);
    o.seed += 1;
    mclock::duration ceiling = 100ms;
    for (int i = 0; i < 5; ++i) {
      const mclock::duration d = *b.next();
      BOOST_TEST((d >= 0ns && d <= ceiling));
      distinct.insert(d.count());
      ceiling = std::min<mclock::duration>(ceiling * 3, 2s);
    }
  }
  BOOST_TEST(distinct.size() > 900u); // not a constant
}

BOOST_AUTO_TEST_CASE(the_same_seed_gives_the_same_delays_and_reset_replays_them) {
  backoff a({.seed = 7});
  backoff b({.seed = 7});
  backoff c({.seed = 8});
  std::vector<mclock::duration> da, db, dc;
  for (int i = 0; i < 8; ++i) {
    da.push_back(*a.next());
    db.push_back(*b.next());
    dc.push_back(*c.next());
  }
  BOOST_TEST((da == db));
  BOOST_TEST((da != dc));
  a.reset();
  std::vector<mclock::duration> again;
  for (int i = 0; i < 8; ++i) again.push_back(*a.next());
  BOOST_TEST((again == da));
}

// Unseeded, two processes (here a parent and its forked children, which share the
// parent's memory image) draw different delays: a fleet of clients must not retry in
// lockstep (the seed came from a counter with a fixed start).
BOOST_AUTO_TEST_CASE(unseeded_delays_differ_between_processes) {
  std::set<std::vector<long long>> seen;
  for (int child = 0; child < 3; ++child) {
    int fds[2];
    BOOST_REQUIRE(::pipe(fds) == 0);
    const pid_t pid = ::fork();
    BOOST_REQUIRE(pid >= 0);
    if (pid == 0) {
      backoff b({.initial = 1s, .cap = 1s});
      long long v[4];
      for (auto& x : v) x = b.next()->count();
      const ssize_t w = ::write(fds[1], v, sizeof v);
      ::_exit(w == static_cast<ssize_t>(sizeof v) ? 0 : 1);
    }
    ::close(fds[1]);
    std::vector<long long> v(4);
    const ssize_t r = ::read(fds[0], v.data(), sizeof(long long) * 4);
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    BOOST_REQUIRE(r == static_cast<ssize_t>(sizeof(long long) * 4));
    seen.insert(v);
  }
  BOOST_TEST(seen.size() == 3u); // 4 delays uniform over a second: equal only by a bug
}

BOOST_AUTO_TEST_CASE(bad_options_throw) {
  BOOST_CHECK_THROW(backoff({.initial = 0ms}), std::invalid_argument);
  BOOST_CHECK_THROW(backoff({.multiplier = 0.5}), std::invalid_argument);
  BOOST_CHECK_THROW(backoff({.multiplier = std::numeric_limits<double>::quiet_NaN()}), std::invalid_argument);
  BOOST_CHECK_THROW(backoff({.initial = 2s, .cap = 1s}), std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()
