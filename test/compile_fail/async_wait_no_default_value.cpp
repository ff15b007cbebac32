// Must not compile: async_wait on a handle whose value type has no default constructor
// (an error completes with R{}). CTest checks the one static_assert message.
#include <metronome/scheduled_thread_pool.hpp>

#include <exception>

struct no_default {
  explicit no_default(int v) : value(v) {}
  int value;
};

int main() {
  metronome::scheduled_thread_pool pool(1);
  auto h = pool.submit([] { return no_default(1); });
  h.async_wait([](std::exception_ptr, no_default) {});
}
