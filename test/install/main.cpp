#if defined(METRONOME_TEST_HOOKS) || defined(METRONOME_NODE_CACHE_OFF) || defined(METRONOME_PORTABLE_FALLBACK)
#error "the installed metronome exported a define of its own build to its consumer"
#endif
#include <metronome/metronome.hpp>

#include <chrono>

int main() {
  metronome::scheduled_thread_pool pool(1);
  auto f = pool.schedule([] { return 7; }, std::chrono::milliseconds(1));
  return f.get() == 7 ? 0 : 1;
}
