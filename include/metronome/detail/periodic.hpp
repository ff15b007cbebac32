// When a periodic task runs next: the missed-tick arithmetic as a pure function.
#ifndef METRONOME_DETAIL_PERIODIC_HPP
#define METRONOME_DETAIL_PERIODIC_HPP

#include <metronome/detail/task.hpp>
#include <metronome/options.hpp>

namespace metronome::detail {

// When a periodic task runs next, as a pure function of its schedule and of the run that
// just ended (tested through the pool in test/unit/scheduled_thread_pool.cpp):
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
  const auto k = (now - due) / period + 1; // >= 1; now >= grid > due
  if (k > (clock::duration::max() / period)) return clock::time_point::max();
  return saturating_add(due, period * k);
}

} // namespace metronome::detail

#endif
