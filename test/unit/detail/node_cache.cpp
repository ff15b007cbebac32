#include <metronome/detail/node_cache.hpp>

#include <boost/test/unit_test.hpp>

#include "common/sanitizers.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

using metronome::detail::node_allocate;
using metronome::detail::node_cache_defer_frees;
using metronome::detail::node_cache_empty_chunks;
using metronome::detail::node_cache_mapped_bytes;
using metronome::detail::node_cache_prepare_ahead;
using metronome::detail::node_cache_trim;
using metronome::detail::node_cache_trim_pending;
using metronome::detail::node_deallocate;

namespace {

constexpr std::size_t sizes[] = {64, 96, 128, 192, 256, 257};
constexpr std::size_t mib = 1u << 20;
// Empty chunks the cache keeps for reuse, plus a chunk or two per thread and class
// still holding a thread's few most recently freed nodes.
constexpr std::size_t slack = 4 * mib;

// AddressSanitizer builds give every node its own heap block: nothing is mapped.
bool cache_on() {
  void* p = node_allocate(64);
  const bool on = node_cache_mapped_bytes() != 0;
  node_deallocate(p, 64);
  return on;
}

// A case about the cache itself reports itself skipped (not passed) where it is off.
boost::test_tools::assertion_result cache_is_on(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result r(cache_on());
  r.message() << "the node cache is off in this build (AddressSanitizer, or METRONOME_NODE_CACHE=OFF)";
  return r;
}
boost::test_tools::assertion_result cache_is_on_and_not_tsan(boost::unit_test::test_unit_id id) {
  if (metronome::test::under_thread_sanitizer) {
    boost::test_tools::assertion_result r(false);
    r.message() << "ThreadSanitizer refuses threads started after fork()";
    return r;
  }
  return cache_is_on(id);
}

std::vector<void*> allocate_n(std::size_t n, std::size_t size) {
  std::vector<void*> v;
  v.reserve(n);
  for (std::size_t i = 0; i < n; ++i) v.push_back(node_allocate(size));
  return v;
}

// Waits (up to 20 s) for the background thread to have `n` empty chunks ready.
bool ready_chunks_reach(std::size_t n) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (node_cache_empty_chunks() < n)
    if (std::chrono::steady_clock::now() > until)
      return false;
    else
      std::this_thread::yield();
  return true;
}

// Takes more chunks than the cache keeps empty (8), so that all kept ones are used and
// new ones are needed.
constexpr std::size_t past_the_kept = 12 * (256u << 10) / 64;

// Threads of this process (Linux: /proc/self/task).
std::size_t live_threads() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

void free_all(std::vector<void*>& v, std::size_t size) {
  for (void* p : v) node_deallocate(p, size);
  v.clear();
}

} // namespace

BOOST_AUTO_TEST_CASE(nodes_are_distinct_aligned_and_hold_their_whole_size) {
  for (std::size_t size : sizes) {
    auto v = allocate_n(5000, size);
    std::set<std::uintptr_t> seen;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto a = reinterpret_cast<std::uintptr_t>(v[i]);
      BOOST_TEST(a % alignof(std::max_align_t) == 0u);
      seen.insert(a);
      std::memset(v[i], static_cast<int>(i & 0xff), size);
    }
    BOOST_TEST(seen.size() == v.size());
    // No node overlaps another: every byte still has the value written to its node.
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto* b = static_cast<const unsigned char*>(v[i]);
      BOOST_TEST((b[0] == (i & 0xff) && b[size - 1] == (i & 0xff)));
    }
    free_all(v, size);
  }
}

BOOST_AUTO_TEST_CASE(freed_nodes_are_reused_not_mapped_again, *boost::unit_test::precondition(cache_is_on)) {
  auto v = allocate_n(100000, 64);
  free_all(v, 64);
  const std::size_t after_first = node_cache_mapped_bytes();
  for (int round = 0; round < 10; ++round) {
    v = allocate_n(100000, 64);
    free_all(v, 64);
  }
  BOOST_TEST(node_cache_mapped_bytes() <= after_first + slack);
}

// The producer/worker pattern: one thread allocates, another frees. Once every node
// of a chunk is back the chunk is empty, and beyond the few kept it is unmapped.
BOOST_AUTO_TEST_CASE(nodes_freed_on_another_thread_return_their_chunks, *boost::unit_test::precondition(cache_is_on)) {
  const std::size_t before = node_cache_mapped_bytes();
  auto v = allocate_n(300000, 96); // ~28 MiB
  BOOST_TEST(node_cache_mapped_bytes() >= before + 20 * mib);
  std::thread([&] { free_all(v, 96); }).join(); // its exit hands back what it kept
  BOOST_TEST(node_cache_mapped_bytes() <= before + slack);
}

// A pool worker defers: chunks that empty stay mapped until it trims, which it does
// once no thread has needed a new chunk for node_cache_trim_delay (or when forced, as
// on its exit).
BOOST_AUTO_TEST_CASE(a_deferring_thread_keeps_empty_chunks_until_trimmed, *boost::unit_test::precondition(cache_is_on)) {
  const std::size_t before = node_cache_mapped_bytes();
  for (const bool force : {false, true}) {
    auto v = allocate_n(300000, 128); // ~37 MiB
    std::size_t while_deferred = 0, trimmed = 0;
    bool pending = false, left = true;
    std::thread([&] {
      node_cache_defer_frees(true);
      free_all(v, 128);
      while_deferred = node_cache_mapped_bytes();
      pending = node_cache_trim_pending();
      if (force) {
        while (node_cache_trim(2, true)) {
        }
      } else { // within a few trim delays the unforced trim starts unmapping
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!node_cache_trim(2) && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
        while (node_cache_trim(2)) {
        }
      }
      trimmed = node_cache_mapped_bytes();
      left = node_cache_trim_pending();
    }).join();
    BOOST_TEST(while_deferred >= before + 30 * mib);
    BOOST_TEST(pending);
    BOOST_TEST(trimmed <= before + slack);
    BOOST_TEST(!left); // nothing beyond the kept chunks
  }
}

// A thread's cached nodes and its half-carved chunk go back when it exits: other
// threads then reuse them instead of mapping more.
BOOST_AUTO_TEST_CASE(a_thread_s_cache_is_handed_back_at_exit, *boost::unit_test::precondition(cache_is_on)) {
  for (int t = 0; t < 20; ++t)
    std::thread([] {
      auto v = allocate_n(3000, 192);
      free_all(v, 192);
    }).join();
  const std::size_t settled = node_cache_mapped_bytes();
  for (int t = 0; t < 20; ++t)
    std::thread([] {
      auto v = allocate_n(3000, 192);
      free_all(v, 192);
    }).join();
  BOOST_TEST(node_cache_mapped_bytes() <= settled + 512 * 1024);
}

// By default the cache starts no thread of its own: taking new chunks maps them on the
// allocating thread and prepares none ahead.
BOOST_AUTO_TEST_CASE(no_background_thread_by_default, *boost::unit_test::precondition(cache_is_on)) {
  const std::size_t threads_before = live_threads();
  auto v = allocate_n(past_the_kept, 64);
  BOOST_TEST(live_threads() == threads_before);
  free_all(v, 64);
}

// With prepare-ahead on, a thread that takes new chunks finds them mapped and
// populated: the background thread keeps two ready while there is demand.
BOOST_AUTO_TEST_CASE(new_chunks_are_prepared_in_the_background, *boost::unit_test::precondition(cache_is_on)) {
  node_cache_prepare_ahead(true);
  auto v = allocate_n(past_the_kept, 64);
  BOOST_TEST(ready_chunks_reach(2));
  free_all(v, 64);
}

// fork(): the child has no background thread of its own until it needs one, and then
// starts it (the parent's, running at the fork, is not copied).
BOOST_AUTO_TEST_CASE(a_forked_child_prepares_its_own_chunks, *boost::unit_test::precondition(cache_is_on_and_not_tsan)) {
  node_cache_prepare_ahead(true);
  auto v = allocate_n(past_the_kept, 64); // the parent's background thread is running
  BOOST_REQUIRE(ready_chunks_reach(2));
  const pid_t pid = ::fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    auto w = allocate_n(past_the_kept, 64);
    ::_exit(ready_chunks_reach(2) ? 0 : 1);
  }
  int status = 0;
  BOOST_REQUIRE(::waitpid(pid, &status, 0) == pid);
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0);
  free_all(v, 64);
}
