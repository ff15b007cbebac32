// A small HTTP/1.1 keep-alive service (Boost.Beast) with the same behaviour on three
// engines, for the real-service benchmark (bench/service.sh drives it with wrk):
//   asio      plain Asio: one io_context run by the main thread, a strand per connection,
//             steady_timers for the backend delay, the deadline and the idle timeout;
//   mtr-io    sockets on that io_context (run by the main thread), a serial_executor per
//             connection over its executor, timing through metronome: async_delay,
//             cancel_after, backoff, a wheel_timer for the idle timeouts, an interval;
//   mtr-pool  sockets and sessions on a scheduled_thread_pool(1), the same metronome code.
// Per request: a simulated backend call of 0-5 ms (drawn from a SplitMix64 seeded per
// connection: the same delays on every side) under a 4.75 ms deadline; a call that misses
// it is retried once after a backoff (uniform in [0, 1 ms]); a second miss answers 503.
// Every request restarts the connection's 30 s idle timeout, increments a per-status
// counter map on one shared serializer (a strand, or a serial_executor), and gets a
// response of a few bytes. A reporter prints the counters to stderr every second.
// --no-timers: no backend delay, deadline, idle timeout nor reporter (engine overhead).
// --no-strand: sessions run on the engine's executor itself, no per-connection strand or
// serial_executor (every side runs its sessions on one thread, so this is safe here).
// --cpu-load N: N chains of CPU work beside the service, sliced the usual way (a handler
// that computes for 100 µs and re-posts itself): on an asio::thread_pool(1) beside the
// io_context (asio, mtr-io), on the pool itself (mtr-pool, which then has 2 workers: I/O
// and CPU work share its threads). Prints "cpu-slices <n> <seconds>" to stderr as it goes.
//
//   metronome_service_bench --side asio|mtr-io|mtr-pool [--port 8080] [--no-timers] [--no-strand]
//                           [--cpu-load N] [--seed 1]
#include <metronome/metronome.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using namespace std::chrono_literals;

constexpr auto deadline = 4750us;
constexpr auto idle_limit = 30s;
constexpr auto backoff_ceiling = 1ms;
constexpr auto report_period = 1s;

struct config {
  std::string side = "asio";
  unsigned short port = 8080;
  bool timers = true;
  bool strand = true; // a strand / serial_executor per connection
  int cpu_load = 0;    // chains of self-re-posting CPU work
  std::uint64_t seed = 1;
};

// The background CPU work of --cpu-load: `chains` handlers that each compute for
// 100 µs and re-post themselves to `ex`, for ever.
template <class Executor>
class cpu_load {
public:
  explicit cpu_load(Executor ex) : ex_(std::move(ex)) {}
  void start(int chains) {
    for (int i = 0; i < chains; ++i) asio::post(ex_, [this] { slice(); });
  }

private:
  void slice() {
    const auto end = std::chrono::steady_clock::now() + 100us;
    std::uint64_t x = sink_;
    while (std::chrono::steady_clock::now() < end) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    sink_ = x;
    const std::uint64_t n = slices_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (n % 2000 == 0)
      std::fprintf(stderr, "cpu-slices %llu %.3f\n", static_cast<unsigned long long>(n),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count());
    asio::post(ex_, [this] { slice(); });
  }
  Executor ex_;
  std::atomic<std::uint64_t> slices_{0};
  std::atomic<std::uint64_t> sink_{1};
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

// SplitMix64: per connection, seeded with (seed, connection number).
struct rng {
  std::uint64_t s;
  std::uint64_t operator()() noexcept {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::chrono::microseconds backend_delay() { return std::chrono::microseconds((*this)() % 5001); } // 0-5 ms
};

// The counter map, touched only on the shared serializer of the side.
std::map<unsigned, std::uint64_t> counters;
void report() {
  std::string line = "counts:";
  for (auto& [status, n] : counters) line += " " + std::to_string(status) + "=" + std::to_string(n);
  std::fprintf(stderr, "%s\n", line.c_str());
}

http::response<http::string_body> respond(const http::request<http::string_body>& req, unsigned status) {
  http::response<http::string_body> res{static_cast<http::status>(status), req.version()};
  res.set(http::field::content_type, "text/plain");
  res.keep_alive(req.keep_alive());
  res.body() = status == 200 ? "ok\n" : "busy\n";
  res.prepare_payload();
  return res;
}

// The HTTP loop, the same on every side. `Side` supplies the connection type and the
// timed parts: arm/touch/disarm of the idle timeout, the backend call, count().
template <class Side>
asio::awaitable<void> session(Side& side, std::shared_ptr<typename Side::conn> c) {
  boost::beast::flat_buffer buf;
  if (side.timers) side.arm_idle(c);
  for (;;) {
    http::request<http::string_body> req;
    auto [ec, n] = co_await http::async_read(c->sock, buf, req, asio::as_tuple(asio::use_awaitable));
    if (ec) break; // peer closed, or the idle timeout closed the socket
    unsigned status = 200;
    if (side.timers) {
      if (!side.touch_idle(c)) break; // the idle timeout already fired
      status = co_await side.call_backend(c) ? 200 : 503;
    }
    side.count(status);
    auto res = respond(req, status);
    auto [wec, wn] = co_await http::async_write(c->sock, res, asio::as_tuple(asio::use_awaitable));
    if (wec || !res.keep_alive()) break;
  }
  if (side.timers) side.disarm_idle(c);
  error_code ignored;
  c->sock.shutdown(tcp::socket::shutdown_both, ignored);
}

// ---- plain Asio

struct asio_side {
  asio::io_context& io;
  bool timers;
  bool per_conn_strand;
  std::uint64_t seed;
  asio::strand<asio::io_context::executor_type> stats{asio::make_strand(io)};

  struct conn {
    conn(tcp::socket s, const asio::any_io_executor& ex, std::uint64_t seed, bool timers)
        : sock(std::move(s)), r{seed} {
      if (timers) t = std::make_unique<timer_set>(ex);
    }
    tcp::socket sock;
    struct timer_set { // all on the connection's strand (or the io_context); none with --no-timers
      explicit timer_set(const asio::any_io_executor& ex) : backend(ex), deadline(ex), idle(ex) {}
      asio::steady_timer backend, deadline, idle;
    };
    std::unique_ptr<timer_set> t; // not inline: --no-timers connections carry none
    rng r;
    std::uint64_t attempt = 0; // tells a stale deadline completion from the current one
  };

  void start(tcp::socket s, std::uint64_t id) {
    asio::any_io_executor here = io.get_executor();
    if (per_conn_strand) here = asio::make_strand(io);
    auto c = std::make_shared<conn>(std::move(s), here, seed ^ (id * 0x9e3779b97f4a7c15ULL), timers);
    asio::co_spawn(here, session(*this, std::move(c)), asio::detached);
  }

  // The idle timeout: expires_after() cancels the pending wait (its handler runs with
  // operation_aborted), a new wait is started: Beast's tcp_stream does the same per operation.
  void arm_idle(const std::shared_ptr<conn>& c) {
    c->t->idle.expires_after(idle_limit);
    c->t->idle.async_wait([c](error_code ec) {
      if (!ec) c->sock.close();
    });
  }
  bool touch_idle(const std::shared_ptr<conn>& c) {
    arm_idle(c);
    return true; // a timeout that fired closed the socket: the read failed before this
  }
  void disarm_idle(const std::shared_ptr<conn>& c) { c->t->idle.cancel(); }

  // One backend attempt under the deadline: a second timer whose handler cancels the first.
  asio::awaitable<bool> attempt(const std::shared_ptr<conn>& c, std::chrono::microseconds d) {
    const std::uint64_t a = ++c->attempt;
    c->t->backend.expires_after(d);
    c->t->deadline.expires_after(deadline);
    c->t->deadline.async_wait([c, a](error_code ec) {
      if (!ec && a == c->attempt) c->t->backend.cancel();
    });
    auto [ec] = co_await c->t->backend.async_wait(asio::as_tuple(asio::use_awaitable));
    ++c->attempt;
    c->t->deadline.cancel();
    co_return !ec;
  }
  asio::awaitable<bool> call_backend(std::shared_ptr<conn> c) {
    if (co_await attempt(c, c->r.backend_delay())) co_return true;
    // Backoff, full jitter in [0, 1 ms] (the same draw from the connection's generator
    // as the mtr sides' backoff seed).
    const auto pause = std::chrono::nanoseconds(c->r() % (std::chrono::nanoseconds(backoff_ceiling).count() + 1));
    c->t->backend.expires_after(pause);
    co_await c->t->backend.async_wait(asio::as_tuple(asio::use_awaitable));
    co_return co_await attempt(c, c->r.backend_delay());
  }

  void count(unsigned status) {
    asio::post(stats, [status] { ++counters[status]; });
  }

  void start_reporter() {
    asio::co_spawn(
        stats,
        [this]() -> asio::awaitable<void> {
          asio::steady_timer t(stats);
          for (auto next = std::chrono::steady_clock::now();;) {
            t.expires_at(next += report_period);
            co_await t.async_wait(asio::use_awaitable);
            report();
          }
        },
        asio::detached);
  }
};

// ---- metronome, over the io_context's executor or a pool's

template <class Executor>
struct mtr_side {
  mtr_side(const Executor& e, bool t, bool p, std::uint64_t s) : ex(e), timers(t), per_conn_strand(p), seed(s) {}
  Executor ex; // sockets' and sessions' executor
  bool timers;
  bool per_conn_strand;
  std::uint64_t seed;
  metronome::serial_executor<Executor> stats{metronome::make_serial_executor(ex)};
  // Idle timeouts fire onto `ex`: the one thread that also runs every session.
  std::optional<metronome::wheel_timer> wheel;

  struct conn {
    tcp::socket sock;
    rng r;
    metronome::wheel_timer::timeout idle;
  };

  void start(tcp::socket s, std::uint64_t id) {
    auto c = std::make_shared<conn>(conn{std::move(s), rng{seed ^ (id * 0x9e3779b97f4a7c15ULL)}, {}});
    if (per_conn_strand) // a serial_executor in place of a strand
      asio::co_spawn(metronome::make_serial_executor(ex), session(*this, std::move(c)), asio::detached);
    else
      asio::co_spawn(ex, session(*this, std::move(c)), asio::detached);
  }

  // One node in the wheel for the connection's life, moved by reset() on every request.
  // Its function runs on `ex`, the same single thread as the session, and the session
  // cancels it before `conn` goes, so a plain pointer is enough.
  void arm_idle(const std::shared_ptr<conn>& c) {
    c->idle = wheel->schedule([p = c.get()] { p->sock.close(); }, idle_limit);
  }
  bool touch_idle(const std::shared_ptr<conn>& c) { return c->idle.reset(idle_limit); }
  void disarm_idle(const std::shared_ptr<conn>& c) { c->idle.cancel(); }

  static asio::awaitable<bool> attempt(std::chrono::microseconds d) {
    auto here = co_await asio::this_coro::executor; // the connection's serial executor
    auto [ec] = co_await metronome::async_delay(here, d,
                                                metronome::cancel_after(deadline, asio::as_tuple(asio::use_awaitable)));
    co_return !ec;
  }
  asio::awaitable<bool> call_backend(std::shared_ptr<conn> c) {
    if (co_await attempt(c->r.backend_delay())) co_return true;
    metronome::backoff retry({.initial = backoff_ceiling, .cap = backoff_ceiling, .max_retries = 1, .seed = c->r() | 1});
    auto here = co_await asio::this_coro::executor;
    co_await metronome::async_delay(here, *retry.next(), asio::use_awaitable);
    co_return co_await attempt(c->r.backend_delay());
  }

  void count(unsigned status) {
    asio::post(stats, [status] { ++counters[status]; });
  }

  void start_reporter() {
    asio::co_spawn(
        stats,
        []() -> asio::awaitable<void> {
          metronome::interval it(co_await asio::this_coro::executor, report_period, metronome::missed_tick::skip);
          co_await it.async_tick(asio::use_awaitable); // the first tick is now
          for (;;) {
            co_await it.async_tick(asio::use_awaitable);
            report();
          }
        },
        asio::detached);
  }
};

template <class Side>
asio::awaitable<void> listen(Side& side, tcp::acceptor& acceptor) {
  for (std::uint64_t id = 0;; ++id) {
    auto [ec, s] = co_await acceptor.async_accept(asio::as_tuple(asio::use_awaitable));
    if (ec) continue; // EMFILE and the like: go on
    s.set_option(tcp::no_delay(true));
    side.start(std::move(s), id);
  }
}

tcp::acceptor make_acceptor(auto& ctx, unsigned short port) {
  tcp::acceptor a(ctx);
  const tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), port);
  a.open(ep.protocol());
  a.set_option(asio::socket_base::reuse_address(true));
  a.bind(ep);
  a.listen(asio::socket_base::max_listen_connections);
  return a;
}

template <class Side>
void serve(Side& side, tcp::acceptor& acceptor, const config& cfg) {
  if (cfg.timers) side.start_reporter();
  asio::co_spawn(acceptor.get_executor(), listen(side, acceptor), asio::detached);
  std::printf("listening on 127.0.0.1:%u (%s%s%s)\n", cfg.port, cfg.side.c_str(), cfg.timers ? "" : ", no timers",
              cfg.strand ? "" : ", no strand");
  std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
  config cfg;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--side" && i + 1 < argc) cfg.side = argv[++i];
    else if (a == "--port" && i + 1 < argc) cfg.port = static_cast<unsigned short>(std::stoi(argv[++i]));
    else if (a == "--seed" && i + 1 < argc) cfg.seed = std::stoull(argv[++i]);
    else if (a == "--no-timers") cfg.timers = false;
    else if (a == "--no-strand") cfg.strand = false;
    else if (a == "--cpu-load" && i + 1 < argc) cfg.cpu_load = std::stoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s --side asio|mtr-io|mtr-pool [--port N] [--seed N] [--no-timers] [--no-strand] [--cpu-load N]\n", argv[0]);
      return 2;
    }
  }
  // The CPU work's own threads beside an io_context (none without --cpu-load).
  std::optional<asio::thread_pool> cpu_threads;
  if (cfg.cpu_load > 0 && cfg.side != "mtr-pool") cpu_threads.emplace(1);
  using cpu_executor = asio::thread_pool::executor_type;
  if (cfg.side == "asio") {
    asio::io_context io(1);
    asio_side side{io, cfg.timers, cfg.strand, cfg.seed};
    auto acceptor = make_acceptor(io, cfg.port);
    serve(side, acceptor, cfg);
    std::optional<cpu_load<cpu_executor>> load;
    if (cpu_threads) load.emplace(cpu_threads->get_executor()).start(cfg.cpu_load);
    io.run();
  } else if (cfg.side == "mtr-io") {
    asio::io_context io(1);
    mtr_side<asio::io_context::executor_type> side{io.get_executor(), cfg.timers, cfg.strand, cfg.seed};
    if (cfg.timers) side.wheel.emplace(io.get_executor());
    auto acceptor = make_acceptor(io, cfg.port);
    serve(side, acceptor, cfg);
    std::optional<cpu_load<cpu_executor>> load;
    if (cpu_threads) load.emplace(cpu_threads->get_executor()).start(cfg.cpu_load);
    io.run();
  } else if (cfg.side == "mtr-pool") {
    metronome::scheduled_thread_pool pool(cfg.cpu_load > 0 ? 2 : 1);
    using pool_executor = metronome::scheduled_thread_pool::executor_type;
    mtr_side<pool_executor> side{pool.get_executor(), cfg.timers, cfg.strand, cfg.seed};
    if (cfg.timers) side.wheel.emplace(pool); // fires onto the pool
    auto acceptor = make_acceptor(pool, cfg.port);
    serve(side, acceptor, cfg);
    std::optional<cpu_load<pool_executor>> load;
    if (cfg.cpu_load > 0) load.emplace(pool.get_executor()).start(cfg.cpu_load);
    pool.join(); // the accept loop never ends: runs until the process is killed
  } else {
    std::fprintf(stderr, "unknown side %s\n", cfg.side.c_str());
    return 2;
  }
}
