// Must not compile: async_delay's first argument is neither an executor nor an
// execution context. CTest checks the one static_assert message.
#include <metronome/async_delay.hpp>

#include <chrono>

int main() {
  int not_an_executor = 0;
  metronome::async_delay(not_an_executor, std::chrono::milliseconds(1), [](metronome::error_code) {});
}
