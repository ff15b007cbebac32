// The test hook (see detail/test_hooks.hpp); absent from builds without METRONOME_TEST_HOOKS.
#include <metronome/detail/test_hooks.hpp>

namespace metronome::detail {
#if defined(METRONOME_TEST_HOOKS)
std::atomic<hook_function> test_hook{nullptr};
#endif
} // namespace metronome::detail
