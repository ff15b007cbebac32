#ifndef METRONOME_TEST_HELD_POOL_HPP
#define METRONOME_TEST_HELD_POOL_HPP

#include <metronome/scheduled_thread_pool.hpp>

#include "common/latch_task.hpp"

#include <boost/test/unit_test.hpp>

#include <utility>

namespace metronome::test {

// A pool whose only worker is held inside a task until release().
struct held_pool {
  explicit held_pool(pool_options o) : pool(std::move(o)) {
    BOOST_REQUIRE(occupy_worker(pool, release_gate, entered));
  }
  void release() { release_gate.open(); }
  ~held_pool() { release(); }

  counter entered;
  gate release_gate;
  scheduled_thread_pool pool;
};

} // namespace metronome::test

#endif
