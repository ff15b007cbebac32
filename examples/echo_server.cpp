// A TCP echo server on 127.0.0.1 whose network runs on an io_context and whose
// timeouts and CPU work run on metronome:
//  - each session is a coroutine on the io_context;
//  - each session has an idle timeout in a wheel_timer that fires onto the io_context;
//    every read restarts it with timeout::reset() (an unlink and a link in the wheel:
//    no cancel, no new timer, no allocation), and when it fires it closes the socket;
//  - each message is "processed" on the pool (submit + co_await handle.async_wait)
//    and the result comes back to the io_context.
// The same program runs clients against it: busy clients get their echoes, an idle
// client is disconnected by the server's timeout. Exit code 0 when all went well.
#include <metronome/metronome.hpp>

#include <metronome/net.hpp> // the Asio metronome was built with (examples build with both); your code includes its own, e.g. <boost/asio.hpp>
#include METRONOME_NET_HEADER(ip/tcp.hpp)
#include METRONOME_NET_HEADER(read.hpp)
#include METRONOME_NET_HEADER(write.hpp)

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <string>

namespace net = metronome::net;
using net::ip::tcp;
using namespace std::chrono_literals;

namespace {

constexpr auto idle_timeout = 200ms;
std::atomic<int> timeouts{0}; // sessions closed by their idle timeout
std::atomic<int> ended{0};    // sessions over, for any reason

net::awaitable<void> session(tcp::socket socket, metronome::scheduled_thread_pool& pool, metronome::wheel_timer& wheel) {
  // The wheel fires onto the io_context, this session's thread: closing the socket there
  // ends the pending read with operation_aborted.
  auto idle = wheel.schedule(
      [&socket] {
        ++timeouts;
        socket.close();
      },
      idle_timeout);
  char data[1024];
  try {
    for (;;) {
      const std::size_t n = co_await socket.async_read_some(net::buffer(data), net::use_awaitable);
      // Activity: the idle timeout starts again. false: it already fell due (it is
      // closing the socket, or about to): the session is over.
      if (!idle.reset(idle_timeout)) break;
      // CPU work on the pool; the result comes back here, on the io_context. (The
      // handle is named in its own statement: g++ 12 destroys a temporary closure
      // inside a co_await full-expression twice.)
      auto processed = pool.submit([msg = std::string(data, n)] { return msg; });
      std::string echo = co_await processed.async_wait(net::use_awaitable);
      co_await net::async_write(socket, net::buffer(echo), net::use_awaitable);
    }
  } catch (const metronome::system_error&) {
    // closed by the idle timeout, or by the peer
  }
  // On this thread: false means the timeout has already run here (it never runs once
  // this frame is gone, which it uses).
  idle.cancel();
  ++ended;
}

net::awaitable<void> listener(tcp::acceptor& acceptor, metronome::scheduled_thread_pool& pool,
                               metronome::wheel_timer& wheel) {
  for (;;) {
    tcp::socket socket = co_await acceptor.async_accept(net::use_awaitable);
    net::co_spawn(acceptor.get_executor(), session(std::move(socket), pool, wheel), net::detached);
  }
}

net::awaitable<bool> busy_client(tcp::endpoint server, int id) {
  tcp::socket socket(co_await net::this_coro::executor);
  co_await socket.async_connect(server, net::use_awaitable);
  for (int i = 0; i < 5; ++i) {
    std::string msg = "client " + std::to_string(id) + " message " + std::to_string(i);
    co_await net::async_write(socket, net::buffer(msg), net::use_awaitable);
    std::string reply(msg.size(), '\0');
    co_await net::async_read(socket, net::buffer(reply), net::use_awaitable);
    if (reply != msg) co_return false;
  }
  co_return true;
}

net::awaitable<bool> idle_client(tcp::endpoint server) {
  tcp::socket socket(co_await net::this_coro::executor);
  co_await socket.async_connect(server, net::use_awaitable);
  const auto start = metronome::clock::now();
  char byte;
  try {
    co_await socket.async_read_some(net::buffer(&byte, 1), net::use_awaitable);
    co_return false; // the server should not send anything
  } catch (const metronome::system_error&) {
    // closed by the server's idle timeout
  }
  co_return metronome::clock::now() - start >= idle_timeout;
}

} // namespace

int main() {
  net::io_context io;
  metronome::scheduled_thread_pool pool(2);
  metronome::wheel_timer wheel(io.get_executor()); // idle timeouts fire on the io_context
  tcp::acceptor acceptor(io, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
  const tcp::endpoint server = acceptor.local_endpoint();
  net::co_spawn(io, listener(acceptor, pool, wheel), net::detached);

  std::atomic<int> ok{0};
  constexpr int busy = 4;
  auto tally = [&](std::exception_ptr e, bool good) {
    if (!e && good) ++ok;
  };
  for (int i = 0; i < busy; ++i) net::co_spawn(io, busy_client(server, i), tally);
  net::co_spawn(io, idle_client(server), tally);

  // Stop once every client reported and every session is over.
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        const auto deadline = metronome::clock::now() + 20s;
        while ((ok < busy + 1 || ended < busy + 1) && metronome::clock::now() < deadline)
          co_await metronome::async_delay(pool.get_executor(), 10ms, net::use_awaitable);
        io.stop();
      },
      net::detached);

  io.run();
  std::cout << "echo: " << ok << "/" << busy + 1 << " clients ok, " << ended << " sessions over, " << timeouts
            << " closed by the idle timeout\n";
  // The idle client's session ends by its timeout; the busy clients close theirs.
  return ok == busy + 1 && ended == busy + 1 && timeouts == 1 ? 0 : 1;
}
