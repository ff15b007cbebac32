// When a periodic task runs next: the missed-tick arithmetic as a pure function.
#ifndef METRONOME_DETAIL_PERIODIC_HPP
#define METRONOME_DETAIL_PERIODIC_HPP

#include <metronome/detail/random.hpp>
#include <metronome/detail/scheduled_task.hpp>
#include <metronome/detail/task.hpp>
#include <metronome/options.hpp>

namespace metronome::detail {

// When a periodic task runs next, as a pure function of its schedule and of the run that
// just ended (tested through the pool in test/unit/scheduled_thread_pool/basics.cpp):
//   fixed delay: the end of the run + period;
//   fixed rate, run started on time: previous due + period, under every policy;
//   late (the next grid point is already past): burst -> previous due + period (runs
//   at once, catching up one by one); delay -> start of the late run + period (the grid
//   shifts); skip -> the first grid point after now.
// `due` is the due time of the run that ended, `started` when it started, `now` when it
// ended. Saturates instead of wrapping.
inline clock::time_point next_periodic_due(bool fixed_delay, missed_tick missed, clock::duration period,
                                           clock::time_point due, clock::time_point started,
                                           clock::time_point now) noexcept {
  if (fixed_delay) return saturating_add(now, period);
  const clock::time_point grid = saturating_add(due, period);
  if (grid > now) return grid;
  switch (missed) {
  case missed_tick::burst:
    return grid;
  case missed_tick::delay:
    return saturating_add(started, period);
  case missed_tick::skip:
    break;
  }
  // In 128 bits: now - due overflows 64 when the grid starts far in the past (a start at
  // time_point::min()); the result, the first grid point after now, is at most
  // now + period and saturates only past the clock's end.
  const wide_int span = static_cast<wide_int>(now.time_since_epoch().count()) - due.time_since_epoch().count();
  const wide_int k = span / period.count() + 1; // >= 1; now >= grid > due
  const wide_int at = static_cast<wide_int>(due.time_since_epoch().count()) + k * period.count();
  if (at >= clock::duration::max().count()) return clock::time_point::max();
  return clock::time_point(clock::duration(static_cast<clock::rep>(at)));
}

// `nominal` moved by a uniform offset in [-jitter, +jitter] x period, drawn from `state`
// (saturating; jitter in [0, 1)).
inline clock::time_point jittered(clock::time_point nominal, clock::duration period, double jitter,
                                  std::uint64_t& state) noexcept {
  if (jitter <= 0.0) return nominal;
  const double offset = (2.0 * uniform01(state) - 1.0) * jitter * static_cast<double>(period.count());
  const auto off = clock::duration(static_cast<clock::rep>(offset)); // |offset| < period: fits
  if (off < clock::duration::zero()) {
    if (nominal.time_since_epoch() < clock::duration::min() - off) return clock::time_point::min();
    return nominal + off;
  }
  return saturating_add(nominal, off);
}

// The next due time of a periodic task with jitter: next_periodic_due() on the
// un-jittered schedule (kept in x.nominal, so a fixed rate never drifts), then jittered.
inline clock::time_point next_jittered_due(task_extras& x, clock::time_point due, clock::time_point started,
                                           clock::time_point now) noexcept {
  const clock::time_point base = x.nominal == clock::time_point{} ? due : x.nominal;
  x.nominal = next_periodic_due(x.fixed_delay, x.periodic.missed, x.period, base, started, now);
  if (x.jitter_state == 0) x.jitter_state = fresh_seed();
  return jittered(x.nominal, x.period, x.periodic.jitter, x.jitter_state);
}

} // namespace metronome::detail

#endif
