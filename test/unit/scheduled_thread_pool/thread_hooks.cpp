// pool_options::on_thread_start / on_thread_stop.
#include <metronome/net.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include "common/exception_log.hpp"
#include "common/latch_task.hpp"
#include "common/poll_until.hpp"

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <pthread.h>

using namespace std::chrono_literals;
using metronome::pool_options;
using metronome::scheduled_thread_pool;
using metronome::test::poll_until;

namespace {

// What the hooks saw: the worker numbers they were given, and on which threads.
struct hook_log {
  std::mutex m;
  std::multiset<std::size_t> started, stopped;
  std::set<std::thread::id> start_threads;
  std::vector<std::string> start_names;

  void install(pool_options& o) {
    o.on_thread_start = [this](std::size_t id) {
      char name[16] = {};
      ::pthread_getname_np(::pthread_self(), name, sizeof name);
      std::lock_guard lk(m);
      started.insert(id);
      start_threads.insert(std::this_thread::get_id());
      start_names.emplace_back(name);
    };
    o.on_thread_stop = [this](std::size_t id) {
      std::lock_guard lk(m);
      stopped.insert(id);
    };
  }
  std::size_t starts() {
    std::lock_guard lk(m);
    return started.size();
  }
  std::size_t stops() {
    std::lock_guard lk(m);
    return stopped.size();
  }
  bool started_on_this_thread() {
    std::lock_guard lk(m);
    return start_threads.count(std::this_thread::get_id()) != 0;
  }
};

} // namespace

BOOST_AUTO_TEST_SUITE(pool_hooks)

BOOST_AUTO_TEST_CASE(a_fixed_pool_calls_each_hook_once_per_worker_and_stop_hooks_have_run_when_join_returns) {
  hook_log log;
  auto o = pool_options::fixed(3);
  o.thread_name_prefix = "hooked";
  log.install(o);
  scheduled_thread_pool pool(o);
  // Every task runs on a thread whose start hook already ran.
  std::atomic<int> before_hook{0};
  for (int i = 0; i < 200; ++i)
    pool.submit([&] {
      if (!log.started_on_this_thread()) ++before_hook;
    });
  BOOST_TEST(poll_until([&] { return log.starts() == 3u; }));
  BOOST_TEST(log.stops() == 0u);
  pool.shutdown();
  pool.join();
  BOOST_TEST(before_hook.load() == 0);
  // join() returned: every stop hook has returned, once per worker, with its number.
  std::lock_guard lk(log.m);
  BOOST_TEST((log.started == std::multiset<std::size_t>{1, 2, 3}));
  BOOST_TEST((log.stopped == std::multiset<std::size_t>{1, 2, 3}));
  BOOST_TEST(log.start_threads.size() == 3u);
#if !defined(METRONOME_PORTABLE_FALLBACK) // thread names are a Linux call; the fallback names no thread
  // The number is the one in the thread's name, which is set before the hook runs.
  std::set<std::string> names(log.start_names.begin(), log.start_names.end());
  BOOST_TEST((names == std::set<std::string>{"hooked-1", "hooked-2", "hooked-3"}));
#endif
}

BOOST_AUTO_TEST_CASE(the_destructor_returns_after_every_stop_hook) {
  hook_log log;
  auto o = pool_options::fixed(2);
  log.install(o);
  {
    scheduled_thread_pool pool(o);
    pool.submit([] {}).get();
  }
  BOOST_TEST(log.starts() == 2u);
  BOOST_TEST(log.stops() == 2u);
}

BOOST_AUTO_TEST_CASE(a_cached_pool_calls_the_hooks_on_elastic_threads_too) {
  hook_log log;
  auto o = pool_options::cached(1, 3, 1ms);
  log.install(o);
  scheduled_thread_pool pool(o);
  metronome::test::gate release;
  metronome::test::counter running;
  std::vector<metronome::scheduled_future<void>> hs;
  for (int i = 0; i < 3; ++i)
    hs.push_back(pool.submit([&] {
      running.add();
      release.wait();
    }));
  BOOST_TEST(running.wait_for_at_least(3)); // three at once: two elastic threads joined
  BOOST_TEST(log.starts() == 3u);
  release.open();
  for (auto& h : hs) h.get();
  // The two elastic threads retire after keep_alive: each runs its stop hook on the way out.
  BOOST_TEST(poll_until([&] { return log.stops() == 2u && pool.stats().threads == 1u; }));
  {
    std::lock_guard lk(log.m);
    BOOST_TEST(log.stopped.count(1) == 0u); // the core thread is still there
  }
  pool.shutdown();
  pool.join();
  std::lock_guard lk(log.m);
  BOOST_TEST((log.started == std::multiset<std::size_t>{1, 2, 3}));
  BOOST_TEST((log.stopped == std::multiset<std::size_t>{1, 2, 3}));
}

BOOST_AUTO_TEST_CASE(throwing_hooks_are_reported_and_the_thread_still_works) {
  metronome::test::exception_log errors;
  auto o = pool_options::fixed(1);
  o.exception_handler = errors.handler();
  o.on_thread_start = [](std::size_t) { throw std::runtime_error("start hook"); };
  o.on_thread_stop = [](std::size_t) { throw std::runtime_error("stop hook"); };
  scheduled_thread_pool pool(o);
  BOOST_TEST(pool.submit([] { return 7; }).get() == 7);
  pool.shutdown();
  pool.join();
  BOOST_TEST((errors.messages() == std::vector<std::string>{"start hook", "stop hook"}));
}

// A thread hook runs on a pool thread: join() from it throws std::logic_error, as from a
// task. From on_thread_start it deadlocked (every worker waited in join() for itself);
// from on_thread_stop it returned while that hook was still running (adversary pass 8).
BOOST_AUTO_TEST_CASE(join_from_a_thread_hook_is_a_logic_error) {
  std::atomic<int> refused_at_start{0}, refused_at_stop{0}, other{0};
  scheduled_thread_pool* self = nullptr;
  std::atomic<bool> ready{false};
  auto try_join = [&](std::atomic<int>& refused) {
    while (!ready.load()) std::this_thread::yield();
    try {
      self->join();
      ++other;
    } catch (const std::logic_error&) {
      ++refused;
    }
  };
  {
    pool_options o;
    o.threads = 2;
    o.on_thread_start = [&](std::size_t) { try_join(refused_at_start); };
    o.on_thread_stop = [&](std::size_t) { try_join(refused_at_stop); };
    scheduled_thread_pool pool(o);
    self = &pool;
    ready = true;
    BOOST_TEST(pool.submit([] { return 7; }).get() == 7);
    pool.shutdown();
    pool.join();
    BOOST_TEST(refused_at_stop.load() == 2); // every stop hook had returned
  }
  BOOST_TEST(refused_at_start.load() == 2);
  BOOST_TEST(other.load() == 0);
}

BOOST_AUTO_TEST_CASE(a_worker_detached_by_a_pool_destroyed_from_inside_still_runs_its_stop_hook) {
  std::atomic<int> stops{0};
  std::atomic<bool> stopped_on_task_thread{false};
  std::thread::id task_thread;
  metronome::test::counter done;
  auto o = pool_options::fixed(1);
  o.on_thread_stop = [&](std::size_t) {
    if (std::this_thread::get_id() == task_thread) stopped_on_task_thread = true;
    ++stops;
    done.add();
  };
  metronome::test::gate submitted; // the pool is deleted only once submit() has returned
  auto* pool = new scheduled_thread_pool(o);
  pool->submit([&, pool] {
    submitted.wait();
    task_thread = std::this_thread::get_id();
    delete pool;
  });
  submitted.open();
  BOOST_TEST(done.wait_for_at_least(1));
  BOOST_TEST(stops.load() == 1);
  BOOST_TEST(stopped_on_task_thread.load());
}

// A pool destroyed from one of its own thread hooks, as from one of its own tasks: the
// hook's thread is detached and touches nothing of the pool after (it locked the freed
// pool's mutex on its way out: a use after free), every other thread is joined, and the
// destructor returns (from a start hook it waited for ever: that thread was counted
// awake, so nobody could terminate the pool). The state lives on the heap: a failed case
// leaks it rather than leaving threads on freed memory.
namespace {
struct owned_by_a_hook {
  std::mutex m;
  scheduled_thread_pool* pool = nullptr; // taken and deleted by the first hook that wants it
  std::atomic<int> stops{0};
  metronome::test::counter destroyed;
  void destroy() {
    scheduled_thread_pool* p = nullptr;
    {
      std::lock_guard lk(m);
      p = std::exchange(pool, nullptr);
    }
    if (p == nullptr) return;
    delete p;
    destroyed.add();
  }
};
} // namespace

BOOST_AUTO_TEST_CASE(a_pool_destroyed_from_a_stop_hook_as_it_terminates_joins_the_others_and_returns) {
  auto own = std::make_shared<owned_by_a_hook>();
  auto shut = std::make_shared<metronome::test::gate>();
  auto o = pool_options::fixed(2);
  o.on_thread_stop = [own, shut](std::size_t) {
    ++own->stops;
    shut->wait(); // until shutdown() has returned: the pool is not destroyed inside a call
    own->destroy();
  };
  auto* pool = new scheduled_thread_pool(o);
  own->pool = pool;
  BOOST_TEST(pool->submit([] { return 7; }).get() == 7);
  pool->shutdown(); // its workers terminate it and leave; the first to stop destroys it
  shut->open();
  BOOST_REQUIRE(own->destroyed.wait_for_at_least(1));
  BOOST_TEST(own->stops.load() == 2); // the other thread was joined: its hook had run
}

BOOST_AUTO_TEST_CASE(a_pool_destroyed_from_a_retiring_elastic_thread_s_stop_hook_terminates_and_returns) {
  auto own = std::make_shared<owned_by_a_hook>();
  auto o = pool_options::cached(1, 2, 10ms);
  o.on_thread_stop = [own](std::size_t id) {
    ++own->stops;
    if (id == 2) own->destroy(); // the elastic thread (the core thread is worker 1), retiring
  };
  auto* pool = new scheduled_thread_pool(o);
  own->pool = pool;
  metronome::test::gate release;
  metronome::test::counter busy, ran;
  BOOST_REQUIRE(metronome::test::occupy_worker(*pool, release, busy));
  metronome::net::post(*pool, [&ran] { ran.add(); }); // one thread busy: the pool grows to 2
  BOOST_REQUIRE(ran.wait_for_at_least(1));
  release.open(); // both idle: the elastic one retires after 10 ms, and destroys the pool
  BOOST_REQUIRE(own->destroyed.wait_for_at_least(1));
  BOOST_TEST(own->stops.load() == 2); // the core thread was woken, terminated and joined
}

BOOST_AUTO_TEST_CASE(a_pool_destroyed_from_its_only_thread_s_start_hook_terminates_and_returns) {
  auto own = std::make_shared<owned_by_a_hook>();
  auto stored = std::make_shared<metronome::test::gate>();
  auto o = pool_options::fixed(1);
  o.on_thread_start = [own, stored](std::size_t) {
    stored->wait(); // until the test holds the pool
    own->destroy();
  };
  o.on_thread_stop = [own](std::size_t) { ++own->stops; }; // runs, with the pool gone
  own->pool = new scheduled_thread_pool(o);
  stored->open();
  BOOST_REQUIRE(own->destroyed.wait_for_at_least(1));
  BOOST_TEST(poll_until([&] { return own->stops.load() == 1; }));
}

BOOST_AUTO_TEST_SUITE_END()
