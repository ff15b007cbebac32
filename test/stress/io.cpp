// Stress, I/O on the pool's own workers: sockets, Asio timers, posts, delayed tasks and a
// wheel's timeouts all at once on a pool of 2-3 workers, so that the reactor role
// (park_in_reactor) is taken, given up and interrupted while work of every kind arrives
// from the pool's threads and from outside. Every echo comes back, every post runs, every
// delayed task and timeout either runs or is cancelled (exactly one), every Asio timer
// completes - within a generous bound of real time. Seeds as in common/stress_rounds.hpp.

#include "common/stress_rounds.hpp"
#include "common/poll_until.hpp"

#include <metronome/detail/asio.hpp>
#include METRONOME_ASIO_HEADER(buffer.hpp)
#include METRONOME_ASIO_HEADER(ip/tcp.hpp)
#include METRONOME_ASIO_HEADER(read.hpp)
#include METRONOME_ASIO_HEADER(write.hpp)

#include <array>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using tcp = metronome::net::ip::tcp;
using metronome::detail::as_tuple; // net::experimental::as_tuple in Asio 1.22

// Echoes lines of 16 bytes until the peer closes.
net::awaitable<void> echo(tcp::socket s, std::atomic<long>& echoed) {
  std::array<char, 16> buf{};
  for (;;) {
    auto [ec, n] = co_await net::async_read(s, net::buffer(buf), as_tuple(net::use_awaitable));
    if (ec) co_return;
    auto [wec, w] = co_await net::async_write(s, net::buffer(buf.data(), n), as_tuple(net::use_awaitable));
    if (wec) co_return;
    echoed.fetch_add(1);
  }
}

struct tallies {
  std::atomic<long> echoed{0}, posts{0}, delayed_ran{0}, timeouts_ran{0}, timers{0};
};

// One round; returns a description of what went wrong, or an empty string.
std::string io_round(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::size_t threads = 2 + rng() % 2;
  const int connections = 4 + static_cast<int>(rng() % 8);
  const int lines = 20 + static_cast<int>(rng() % 40);
  const int posts = 200 + static_cast<int>(rng() % 400);
  const int delayed = 50 + static_cast<int>(rng() % 150);
  const int timeouts = 50 + static_cast<int>(rng() % 150);
  const int timers = 20 + static_cast<int>(rng() % 60);
  tallies t;
  std::atomic<long> echo_errors{0}, delayed_cancelled{0}, timeouts_cancelled{0};
  {
    scheduled_thread_pool pool(threads);
    metronome::wheel_timer wheel(pool);
    tcp::acceptor acceptor(pool, tcp::endpoint(net::ip::address_v4::loopback(), 0));
    const auto port = acceptor.local_endpoint().port();
    net::co_spawn(
        pool,
        [&]() -> net::awaitable<void> {
          for (int i = 0; i < connections; ++i) {
            auto [ec, s] = co_await acceptor.async_accept(as_tuple(net::use_awaitable));
            if (ec) co_return;
            net::co_spawn(acceptor.get_executor(), echo(std::move(s), t.echoed), net::detached);
          }
        },
        net::detached);
    std::vector<std::unique_ptr<net::steady_timer>> asio_timers;
    for (int i = 0; i < timers; ++i) asio_timers.push_back(std::make_unique<net::steady_timer>(pool));

    std::vector<std::thread> outside;
    // Clients: blocking sockets on threads of their own.
    for (int c = 0; c < connections; ++c) {
      outside.emplace_back([&, c] {
        try {
          net::io_context io;
          tcp::socket s(io);
          s.connect(tcp::endpoint(net::ip::address_v4::loopback(), port));
          for (int l = 0; l < lines; ++l) {
            std::array<char, 16> out{}, back{};
            const std::string text = std::to_string(c) + ":" + std::to_string(l);
            std::copy(text.begin(), text.end(), out.begin());
            net::write(s, net::buffer(out));
            net::read(s, net::buffer(back));
            if (back != out) echo_errors.fetch_add(1);
          }
        } catch (...) {
          echo_errors.fetch_add(1);
        }
      });
    }
    // Posts, delayed tasks with cancels, wheel timeouts with cancels, Asio timers: half
    // from outside, half from the pool's own threads.
    auto submit_some = [&](std::uint64_t s, int share, int of) {
      std::mt19937_64 r(s);
      for (int i = share; i < posts; i += of) net::post(pool, [&] { t.posts.fetch_add(1); });
      for (int i = share; i < delayed; i += of) {
        auto h = pool.schedule([&] { t.delayed_ran.fetch_add(1); }, std::chrono::microseconds(r() % 3000));
        if (r() % 4 == 0 && h.cancel()) delayed_cancelled.fetch_add(1);
      }
      for (int i = share; i < timeouts; i += of) {
        auto h = wheel.schedule([&] { t.timeouts_ran.fetch_add(1); }, std::chrono::microseconds(r() % 5000));
        if (r() % 4 == 0 && h.cancel()) timeouts_cancelled.fetch_add(1);
      }
      for (int i = share; i < timers; i += of) {
        asio_timers[static_cast<std::size_t>(i)]->expires_after(std::chrono::microseconds(r() % 3000));
        asio_timers[static_cast<std::size_t>(i)]->async_wait([&](error_code) { t.timers.fetch_add(1); });
      }
    };
    outside.emplace_back([&, s = rng()] { submit_some(s, 0, 2); });
    net::post(pool, [&, s = rng()] { submit_some(s, 1, 2); });

    const bool done = metronome::test::poll_until(
        [&] {
          return t.echoed.load() + echo_errors.load() >= long{connections} * lines && t.posts.load() == posts &&
                 t.delayed_ran.load() + delayed_cancelled.load() == delayed &&
                 t.timeouts_ran.load() + timeouts_cancelled.load() == timeouts && t.timers.load() == timers;
        },
        std::chrono::seconds(30));
    for (auto& th : outside) th.join(); // (the acceptor's loop ended with its last connection)
    if (!done || echo_errors.load() != 0)
      return "echoed " + std::to_string(t.echoed.load()) + "/" + std::to_string(long{connections} * lines) +
             " (errors " + std::to_string(echo_errors.load()) + "), posts " + std::to_string(t.posts.load()) + "/" +
             std::to_string(posts) + ", delayed " + std::to_string(t.delayed_ran.load()) + "+" +
             std::to_string(delayed_cancelled.load()) + "/" + std::to_string(delayed) + ", timeouts " +
             std::to_string(t.timeouts_ran.load()) + "+" + std::to_string(timeouts_cancelled.load()) + "/" +
             std::to_string(timeouts) + ", timers " + std::to_string(t.timers.load()) + "/" + std::to_string(timers);
  }
  return {};
}


// Counts itself once: run (ran) or destroyed unrun (dropped); a run after `after` was set
// counts as late. Moved-from copies count nothing.
struct read_tally {
  std::atomic<long> ran{0}, dropped{0}, late{0};
  std::atomic<bool> after{false};
};
class counted_read {
public:
  explicit counted_read(read_tally& t) : t_(&t) {}
  counted_read(counted_read&& o) noexcept : t_(std::exchange(o.t_, nullptr)) {}
  counted_read& operator=(counted_read&&) = delete;
  ~counted_read() {
    if (t_) t_->dropped.fetch_add(1);
  }
  void operator()(error_code, std::size_t) {
    read_tally* t = std::exchange(t_, nullptr);
    if (!t) return;
    if (t->after.load()) t->late.fetch_add(1);
    t->ran.fetch_add(1);
  }

private:
  read_tally* t_;
};

// One round of shutdown (or shutdown_now) racing pending socket reads, data arriving from
// a writer thread and CPU work that keeps the workers busy (so the reactor is polled by
// busy workers too). Every read's handler runs or is destroyed unrun, exactly once, and
// none runs after await_termination() said true - not even the reads the test then
// aborts by closing their sockets.
std::string shutdown_round(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::size_t threads = 1 + rng() % 3;
  const int pairs = 2 + static_cast<int>(rng() % 6);
  const int chains = static_cast<int>(rng() % (threads + 1));
  const bool now = rng() % 2 == 0;
  const auto writer_delay = std::chrono::microseconds(rng() % 400);
  read_tally reads;
  std::atomic<bool> load_on{true};
  {
    scheduled_thread_pool pool(threads);
    tcp::acceptor acceptor(pool, tcp::endpoint(net::ip::address_v4::loopback(), 0));
    std::vector<std::unique_ptr<tcp::socket>> clients, servers;
    for (int i = 0; i < pairs; ++i) {
      clients.push_back(std::make_unique<tcp::socket>(pool));
      servers.push_back(std::make_unique<tcp::socket>(pool));
      clients.back()->connect(acceptor.local_endpoint());
      acceptor.accept(*servers.back());
    }
    std::array<char, 8> sink{}; // (reads race for it: their bytes are not looked at)
    for (auto& s : servers) s->async_read_some(net::buffer(sink), counted_read(reads));
    struct chain {
      scheduled_thread_pool& pool;
      std::atomic<bool>& on;
      void operator()() const {
        const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(30);
        while (std::chrono::steady_clock::now() < end) {
        }
        if (on.load()) net::post(pool, chain{*this});
      }
    };
    for (int i = 0; i < chains; ++i) net::post(pool, chain{pool, load_on});
    std::thread writer([&] {
      std::this_thread::sleep_for(writer_delay); // (spreads the writes over the shutdown: not a synchronisation)
      for (auto& c : clients) {
        error_code ec;
        net::write(*c, net::buffer("x", 1), ec);
      }
    });
    load_on = false;
    if (now)
      (void)pool.shutdown_now();
    else
      pool.shutdown();
    const bool terminated = pool.await_termination(std::chrono::seconds(20));
    reads.after = true;
    writer.join();
    for (auto& s : servers) s->close(); // aborts the reads still pending: no thread may run them
    for (auto& c : clients) c->close();
    if (!terminated) return "not terminated in 20 s";
    servers.clear();
    clients.clear();
  } // the pool's destruction destroys the handlers nobody ran
  const long accounted = reads.ran.load() + reads.dropped.load();
  if (accounted != pairs || reads.late.load() != 0)
    return std::string(now ? "shutdown_now" : "shutdown") + ": reads ran " + std::to_string(reads.ran.load()) +
           " + dropped " + std::to_string(reads.dropped.load()) + " of " + std::to_string(pairs) + ", after termination " +
           std::to_string(reads.late.load());
  return {};
}
} // namespace

BOOST_AUTO_TEST_SUITE(stress_io)

namespace {
// A round function that describes its failure, or returns "", as run_rounds takes it.
template <class Round>
auto described(Round round) {
  return [round](std::uint64_t seed, errors& errs) {
    if (const std::string failure = round(seed); !failure.empty()) errs.add(failure);
    return true;
  };
}
} // namespace

BOOST_AUTO_TEST_CASE(sockets_timers_posts_delayed_work_and_a_wheel_share_the_pool_s_workers) {
  run_rounds("stress_io", 41, budget(ms(4000, 6000), 1, 200), described(io_round));
}

BOOST_AUTO_TEST_CASE(shutdown_races_pending_socket_reads_and_every_handler_is_accounted_once) {
  run_rounds("stress_io shutdown", 42, budget(ms(3000, 5000), 1, 2000), described(shutdown_round));
}

BOOST_AUTO_TEST_SUITE_END()
