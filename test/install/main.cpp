#if defined(METRONOME_TEST_HOOKS) || defined(METRONOME_NODE_CACHE_OFF) || defined(METRONOME_PORTABLE_FALLBACK)
#error "the installed metronome exported a define of its own build to its consumer"
#endif
#include <metronome/metronome.hpp>

// The consumer spells Asio its own way; the package's target brought the right one.
#if defined(EXPECT_STANDALONE_ASIO)
#if !defined(METRONOME_STANDALONE_ASIO) || !defined(ASIO_STANDALONE)
#error "a standalone-Asio metronome did not export METRONOME_STANDALONE_ASIO and ASIO_STANDALONE"
#endif
#include <asio/post.hpp>
namespace user_asio = asio;
#else
#if defined(METRONOME_STANDALONE_ASIO)
#error "a Boost.Asio metronome exported METRONOME_STANDALONE_ASIO"
#endif
#include <boost/asio/post.hpp>
namespace user_asio = boost::asio;
#endif

#include <atomic>
#include <chrono>

int main() {
  metronome::scheduled_thread_pool pool(1);
  std::atomic<bool> posted{false};
  user_asio::post(pool, [&] { posted = true; });
  auto f = pool.schedule([] { return 7; }, std::chrono::milliseconds(1));
  const bool scheduled = f.get() == 7;
  pool.join();
  return scheduled && posted ? 0 : 1;
}
