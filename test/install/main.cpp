#include <metronome/metronome.hpp>

#include <chrono>

int main() {
  metronome::scheduled_thread_pool pool(1);
  auto f = pool.schedule([] { return 7; }, std::chrono::milliseconds(1));
  return f.get() == 7 ? 0 : 1;
}
