#ifndef METRONOME_TEST_MANUAL_POOL_HPP
#define METRONOME_TEST_MANUAL_POOL_HPP

#include <metronome/manual_clock.hpp>
#include <metronome/options.hpp>

#include <cstddef>

namespace metronome::test {

// Options for a pool whose time is the test's manual clock.
inline pool_options on_clock(manual_clock& c, std::size_t threads = 1) {
  pool_options o;
  o.threads = threads;
  o.time_source = &c;
  return o;
}

} // namespace metronome::test

#endif
