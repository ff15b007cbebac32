// Sockets, acceptors and Asio timers made on a scheduled_thread_pool: Asio's reactor runs
// on the pool's own workers, with no thread of its own (pool_engine::park_in_reactor).
#include <metronome/scheduled_thread_pool.hpp>

#include "common/hooks.hpp"
#include "common/threads.hpp"
#include "common/poll_until.hpp"

#include <metronome/detail/asio.hpp>
#include METRONOME_ASIO_HEADER(buffer.hpp)
#include METRONOME_ASIO_HEADER(ip/tcp.hpp)
#include METRONOME_ASIO_HEADER(read.hpp)
#include METRONOME_ASIO_HEADER(write.hpp)
#include <boost/test/unit_test.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <optional>
#include <string>
#include <thread>

namespace net = metronome::net;
using metronome::test::process_threads;
using net::ip::tcp;
using metronome::error_code;
using metronome::scheduled_thread_pool;
using namespace std::chrono_literals;

namespace {

// Echoes one line per connection, on the pool.
net::awaitable<void> echo_once(tcp::socket s, std::atomic<int>& on_pool, scheduled_thread_pool& pool) {
  std::array<char, 64> buf{};
  const std::size_t n = co_await s.async_read_some(net::buffer(buf), net::use_awaitable);
  if (pool.get_executor().running_in_this_thread()) on_pool.fetch_add(1);
  co_await net::async_write(s, net::buffer(buf.data(), n), net::use_awaitable);
}


// CPU work sliced the usual way: `chains` handlers that each spin for `slice`, then
// re-post themselves, until stop() or `limit` after start. While it runs, no worker
// of a pool with as many threads as chains ever runs out of tasks.
class self_reposting_load {
public:
  self_reposting_load(scheduled_thread_pool& pool, int chains, std::chrono::microseconds slice,
                      std::chrono::seconds limit = 20s)
      : pool_(pool), slice_(slice), until_(std::chrono::steady_clock::now() + limit) {
    alive_ = chains;
    for (int i = 0; i < chains; ++i) net::post(pool_, [this] { run(); });
  }
  ~self_reposting_load() {
    stop();
    BOOST_TEST(metronome::test::poll_until([&] { return alive_.load() == 0; }));
  }
  void stop() { stopped_ = true; }
  // Whether the load was still running (not stopped, not past its limit) at the call.
  bool running() const { return !stopped_.load() && std::chrono::steady_clock::now() < until_; }
  // The workers that ran a slice so far.
  std::size_t workers_seen() {
    std::lock_guard lk(mtx_);
    return seen_.size();
  }

private:
  void run() {
    const auto end = std::chrono::steady_clock::now() + slice_;
    while (std::chrono::steady_clock::now() < end) {
    }
    {
      std::lock_guard lk(mtx_);
      if (seen_.size() < 8) seen_.insert(std::this_thread::get_id());
    }
    if (running())
      net::post(pool_, [this] { run(); });
    else
      alive_.fetch_sub(1);
  }
  scheduled_thread_pool& pool_;
  std::chrono::microseconds slice_;
  std::chrono::steady_clock::time_point until_;
  std::atomic<bool> stopped_{false};
  std::atomic<int> alive_{0};
  std::mutex mtx_;
  std::set<std::thread::id> seen_;
};

// A connected pair of sockets on the pool.
struct socket_pair {
  explicit socket_pair(scheduled_thread_pool& pool) : client(pool), server(pool) {
    tcp::acceptor acceptor(pool, tcp::endpoint(net::ip::address_v4::loopback(), 0));
    client.connect(acceptor.local_endpoint());
    acceptor.accept(server);
  }
  tcp::socket client;
  tcp::socket server;
};

} // namespace

BOOST_AUTO_TEST_SUITE(pool_io)

BOOST_AUTO_TEST_CASE(sockets_on_the_pool_run_on_its_workers_and_start_no_thread) {
  const std::size_t before = process_threads();
  std::atomic<int> on_pool{0};
  {
    scheduled_thread_pool pool(1);
    tcp::acceptor acceptor(pool, tcp::endpoint(net::ip::address_v4::loopback(), 0));
    const auto port = acceptor.local_endpoint().port();
    constexpr int connections = 20;
    net::co_spawn(
        pool,
        [&]() -> net::awaitable<void> {
          for (int i = 0; i < connections; ++i) {
            tcp::socket s = co_await acceptor.async_accept(net::use_awaitable);
            net::co_spawn(pool, echo_once(std::move(s), on_pool, pool), net::detached);
          }
        },
        net::detached);
    BOOST_TEST(process_threads() == before + 1); // the pool's one worker, and no reactor thread
    net::io_context client_io;
    for (int i = 0; i < connections; ++i) {
      tcp::socket c(client_io);
      c.connect(tcp::endpoint(net::ip::address_v4::loopback(), port));
      const std::string msg = "line " + std::to_string(i);
      net::write(c, net::buffer(msg));
      std::array<char, 64> back{};
      const std::size_t n = net::read(c, net::buffer(back.data(), msg.size()));
      BOOST_TEST(std::string(back.data(), n) == msg);
    }
    BOOST_TEST(process_threads() == before + 1);
    BOOST_TEST(metronome::test::poll_until([&] { return on_pool.load() == connections; }));
  }
  BOOST_TEST(metronome::test::settled_threads(before) == before);
}

BOOST_AUTO_TEST_CASE(an_asio_timer_on_the_pool_and_its_delayed_tasks_fire_beside_pending_io) {
  scheduled_thread_pool pool(1);
  tcp::acceptor acceptor(pool, tcp::endpoint(net::ip::address_v4::loopback(), 0));
  std::promise<error_code> accept_result;
  acceptor.async_accept([&](error_code ec, tcp::socket) { accept_result.set_value(ec); }); // pending throughout
  net::steady_timer timer(pool, 5ms);
  std::promise<std::thread::id> timer_thread;
  timer.async_wait([&](error_code) { timer_thread.set_value(std::this_thread::get_id()); });
  auto f = timer_thread.get_future();
  BOOST_REQUIRE((f.wait_for(20s) == std::future_status::ready));
  std::promise<bool> ran_on_pool;
  const auto start = std::chrono::steady_clock::now();
  auto h = pool.schedule([&] { ran_on_pool.set_value(pool.get_executor().running_in_this_thread()); }, 5ms);
  auto g = ran_on_pool.get_future();
  BOOST_REQUIRE((g.wait_for(20s) == std::future_status::ready));
  BOOST_TEST(g.get());
  BOOST_TEST((std::chrono::steady_clock::now() - start >= 5ms));
  net::post(pool, [&] { acceptor.close(); });
  auto accepted = accept_result.get_future();
  BOOST_REQUIRE((accepted.wait_for(20s) == std::future_status::ready));
  BOOST_TEST((accepted.get() == net::error::operation_aborted));
}

BOOST_AUTO_TEST_CASE(destroying_the_pool_with_io_pending_destroys_its_handlers_unrun) {
  auto token = std::make_shared<int>(0);
  bool called = false;
  {
    scheduled_thread_pool pool(2);
    auto acceptor = std::make_shared<tcp::acceptor>(pool, tcp::endpoint(net::ip::address_v4::loopback(), 0));
    acceptor->async_accept([&called, token, acceptor](error_code, tcp::socket) { called = true; });
    BOOST_TEST(token.use_count() == 2);
  } // the acceptor lives in its own handler: destroyed with the handler at the pool's shutdown
  BOOST_TEST(!called);
  BOOST_TEST(token.use_count() == 1);
}


// join() without shutdown() waits for I/O pending on the pool's own sockets, as
// asio::thread_pool::join does (a pending operation is outstanding work); after
// shutdown() it would not (a_pool_is_not_terminated_while_a_worker_is_in_its_reactor).
BOOST_AUTO_TEST_CASE(join_without_shutdown_waits_for_io_pending_on_the_pool) {
  scheduled_thread_pool pool(2);
  auto acceptor = std::make_shared<tcp::acceptor>(pool, tcp::endpoint(net::ip::address_v4::loopback(), 0));
  const auto endpoint = acceptor->local_endpoint();
  std::atomic<bool> accepted{false};
  acceptor->async_accept([&accepted, acceptor](error_code ec, tcp::socket) {
    accepted = !ec;
    acceptor->close(); // nothing pending any more: join() may return
  });
  auto joined = std::async(std::launch::async, [&] { pool.join(); });
  // Nothing but the pending accept keeps join() waiting.
  BOOST_TEST((joined.wait_for(200ms) == std::future_status::timeout));
  net::io_context io;
  tcp::socket client(io);
  client.connect(endpoint);
  BOOST_REQUIRE((joined.wait_for(20s) == std::future_status::ready));
  BOOST_TEST(accepted.load());
}


// Asio's rule: the reactor is polled fairly against queued work (its scheduler puts the
// reactor back in the queue on each pass; Tokio polls its driver every 61 tasks). On a
// pool whose workers never run out of tasks (every one runs a handler that re-posts
// itself), an Asio timer and a socket read made on the pool complete while that load
// still runs, within a bound of the same order as an io_context run by the same threads
// (one pass of its queue). Before, they completed only when the load stopped (20 s here).
// The bound asserted is generous (a busy 2-core machine, sanitizers); the figure on a
// quiet machine is in docs/benchmarks.md (the loaded service rows).
void io_completes_under_load(scheduled_thread_pool& pool, int chains) {
  std::promise<bool> timer_fired; // whether the load still ran then
  std::promise<bool> read_done;
  std::array<char, 4> buf{};
  socket_pair sockets(pool); // the reactor appears
  net::steady_timer timer(pool);
  self_reposting_load load(pool, chains, 100us);
  BOOST_REQUIRE(metronome::test::poll_until([&] { return load.workers_seen() >= static_cast<std::size_t>(chains); }));

  const auto start = std::chrono::steady_clock::now();
  timer.expires_after(10ms);
  timer.async_wait([&](error_code ec) { timer_fired.set_value(!ec && load.running()); });
  sockets.server.async_read_some(net::buffer(buf), [&](error_code ec, std::size_t n) {
    read_done.set_value(!ec && n == 4 && load.running());
  });
  net::write(sockets.client, net::buffer("ping", 4));
  auto read = read_done.get_future();
  BOOST_REQUIRE((read.wait_for(25s) == std::future_status::ready));
  const auto read_after = std::chrono::steady_clock::now() - start;
  auto fired = timer_fired.get_future();
  BOOST_REQUIRE((fired.wait_for(25s) == std::future_status::ready));
  const auto fired_after = std::chrono::steady_clock::now() - start;
  BOOST_TEST(read.get()); // under load
  BOOST_TEST(fired.get());
  BOOST_TEST((read_after < 2s));
  BOOST_TEST((fired_after < 2s));
  BOOST_TEST((fired_after >= 10ms));
}

BOOST_AUTO_TEST_CASE(io_on_a_pool_whose_one_worker_never_runs_out_of_tasks_completes_under_the_load) {
  scheduled_thread_pool pool(1);
  io_completes_under_load(pool, 1);
}

BOOST_AUTO_TEST_CASE(io_on_a_pool_whose_two_workers_never_run_out_of_tasks_completes_under_the_load) {
  scheduled_thread_pool pool(2);
  io_completes_under_load(pool, 2);
}

BOOST_AUTO_TEST_CASE(io_on_an_elastic_pool_whose_live_worker_never_runs_out_of_tasks_completes_under_the_load) {
  scheduled_thread_pool pool(metronome::pool_options::cached(1, 4, 60s));
  io_completes_under_load(pool, 1);
}

#if defined(METRONOME_TEST_HOOKS)

using metronome::detail::hook_point;

namespace {
// Stops the worker the second time it is about to wait in the reactor: the first wait
// returns at once (a new reactor's interrupter starts out readable), the second is a real one.
struct reactor_stop {
  std::atomic<int> arrivals{0};
  metronome::test::gate gate;
  metronome::test::counter stopped;
};
std::atomic<reactor_stop*> current_stop{nullptr};
void stop_second_reactor_wait(hook_point p) {
  reactor_stop* s = current_stop.load();
  if (s && p == hook_point::reactor_before_wait && s->arrivals.fetch_add(1) == 1) {
    s->stopped.add();
    s->gate.wait();
  }
}
} // namespace

// The reactor invariant: work (or a new earliest delayed task) that arrives after a
// worker took the reactor role but before it entered epoll_wait still ends that wait.
BOOST_AUTO_TEST_CASE(work_pushed_before_the_reactor_waiter_enters_epoll_wakes_it) {
  for (int round = 0; round < 2; ++round) {
    reactor_stop stop;
    current_stop.store(&stop);
    metronome::detail::test_hook.store(&stop_second_reactor_wait);
    scheduled_thread_pool pool(1);
    tcp::acceptor acceptor(pool, tcp::endpoint(net::ip::address_v4::loopback(), 0)); // the reactor appears
    acceptor.async_accept([](error_code, tcp::socket) {});
    BOOST_REQUIRE(stop.stopped.wait_for_at_least(1)); // role held, mutex released, not in epoll yet
    std::promise<void> ran;
    if (round == 0)
      net::post(pool, [&] { ran.set_value(); });
    else
      (void)pool.schedule([&] { ran.set_value(); }, 2ms); // a new head nobody times
    stop.gate.open();
    BOOST_TEST((ran.get_future().wait_for(20s) == std::future_status::ready));
    metronome::detail::test_hook.store(nullptr);
    current_stop.store(nullptr);
    net::post(pool, [&] { acceptor.close(); });
    pool.join();
  }
}

// "Terminated" means no thread of the pool runs user code any more. A worker in the
// reactor counts as parked, but it could still run an I/O completion - such as the one
// of a read aborted by closing its socket once await_termination() said true. So the
// pool terminates only with nobody in the reactor: the last worker to park interrupts
// the reactor waiter, which terminates the pool on its way out. Held at the door of the
// reactor, that worker keeps the pool from terminating; released, it terminates it, and
// the read aborted afterwards never runs.
BOOST_AUTO_TEST_CASE(a_pool_is_not_terminated_while_a_worker_is_in_its_reactor) {
  reactor_stop stop;
  current_stop.store(&stop);
  metronome::detail::test_hook.store(&stop_second_reactor_wait);
  scheduled_thread_pool pool(2);
  std::atomic<bool> read_ran{false};
  {
    tcp::acceptor acceptor(pool, tcp::endpoint(net::ip::address_v4::loopback(), 0)); // the reactor appears
    BOOST_REQUIRE(stop.stopped.wait_for_at_least(1)); // role held, mutex released, not in epoll yet
    tcp::socket client(pool);
    tcp::socket server(pool);
    client.connect(acceptor.local_endpoint());
    acceptor.accept(server);
    std::array<char, 1> buf{};
    server.async_read_some(net::buffer(buf), [&](error_code, std::size_t) { read_ran = true; });
    pool.shutdown();
    BOOST_TEST(!pool.await_termination(100ms)); // a worker is in the reactor
    stop.gate.open();
    BOOST_TEST(pool.await_termination(20s));
    metronome::detail::test_hook.store(nullptr);
    current_stop.store(nullptr);
    server.close(); // aborts the read: its completion has no thread of the pool left to run on
    client.close();
    pool.join();
    BOOST_TEST(!read_ran.load());
  }
}


// The poll's hand-over (pool_engine::poll_reactor): a busy worker that polls holds the
// reactor role, so a worker that parks meanwhile waits on a condition variable. Giving
// the role back, the poller must wake that worker into the reactor: held right after,
// the poller runs nothing, and a read that completes then is run by the other worker.
BOOST_AUTO_TEST_CASE(a_worker_that_parks_while_another_polls_the_reactor_takes_the_reactor_after_it) {
  std::promise<void> read_done;
  std::array<char, 4> buf{};
  scheduled_thread_pool pool(2);
  socket_pair sockets(pool); // the reactor appears
  auto load = std::make_unique<self_reposting_load>(pool, 2, 50us);
  BOOST_REQUIRE(metronome::test::poll_until([&] { return load->workers_seen() == 2; }));
  // Both workers run the load: neither parks, so the first to poll is a busy one. Only
  // the poller held in its poll is held after it: a worker whose poll began before the
  // stops were armed passes reactor_after_poll (held there, it could never park, and no
  // worker would reach follower_before_wait - seen once in 40 runs under ASan).
  using stops_t = metronome::test::hook_stops;
  stops_t stops{{hook_point::reactor_in_poll},
                {hook_point::follower_before_wait},
                stops_t::same_thread_as(hook_point::reactor_after_poll, hook_point::reactor_in_poll)};
  BOOST_REQUIRE(stops.arrived(hook_point::reactor_in_poll)); // the poller holds the role
  load->stop();
  BOOST_REQUIRE(stops.arrived(hook_point::follower_before_wait)); // the other parks: role held, a follower
  stops.release(hook_point::follower_before_wait); // (it waits before the poller can take the mutex)
  stops.release(hook_point::reactor_in_poll);
  BOOST_REQUIRE(stops.arrived(hook_point::reactor_after_poll)); // role given back; poller held
  sockets.server.async_read_some(net::buffer(buf), [&](error_code, std::size_t) { read_done.set_value(); });
  net::write(sockets.client, net::buffer("ping", 4));
  BOOST_TEST((read_done.get_future().wait_for(10s) == std::future_status::ready)); // the parked worker is in the reactor
  stops.release(hook_point::reactor_after_poll);
  load.reset();
}
#endif

BOOST_AUTO_TEST_SUITE_END()
