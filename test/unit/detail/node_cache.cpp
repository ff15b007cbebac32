#include <metronome/detail/node_cache.hpp>

#include <boost/test/unit_test.hpp>

#include "common/sanitizers.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
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
using metronome::detail::node_lifetime;

namespace {

constexpr std::size_t sizes[] = {64, 72, 80, 96, 128, 192, 256, 257};
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

boost::test_tools::assertion_result huge_pages_on(boost::unit_test::test_unit_id id) {
  if (!metronome::detail::large_arrays_use_huge_pages()) {
    boost::test_tools::assertion_result r(false);
    r.message() << "no huge pages in this build (portable fallback, or METRONOME_HUGE_PAGES=OFF)";
    return r;
  }
  return cache_is_on(id);
}

// The system's transparent huge pages setting: "always", "madvise" or "never".
std::string thp_setting() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(f, line);
  const auto open = line.find('['), close = line.find(']');
  return open != std::string::npos && close != std::string::npos ? line.substr(open + 1, close - open - 1) : "";
}

// The THPeligible line of the mapping holding `p` (/proc/self/smaps): 1 when the system
// may back it with huge pages.
int thp_eligible(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(f, line)) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= a && a < hi;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::stoi(line.substr(12));
    }
  }
  return -1;
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

// A node is aligned to the largest power of two up to 64 that divides its size, from a
// size class or (beyond 256 bytes, or with the cache off) from the heap: a type aligned
// to 32 or 64 bytes, whose size is a multiple of that, is aligned wherever it lands.
BOOST_AUTO_TEST_CASE(a_node_is_aligned_as_far_as_its_size_allows_up_to_64_bytes) {
  for (std::size_t align : {16u, 32u, 64u})
    for (std::size_t size = align; size <= 640; size += align) {
      auto v = allocate_n(100, size);
      const std::size_t want = std::min<std::size_t>(64, size & (~size + 1));
      for (void* p : v) BOOST_TEST(reinterpret_cast<std::uintptr_t>(p) % want == 0u, "size " << size);
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

// Past 16 MiB mapped, a timed carver's new chunk comes a huge page at a time: one 2 MiB
// mapping, aligned and asked for transparent huge pages, whose first chunk the thread
// carves while the other seven wait as spares, taken before anything more is mapped.
// Brief nodes carved between them still come a 256 KiB chunk at a time, never from the
// spares. All freed, the chunks go back as any chunk does, and a forced trim unmaps
// the spares too.
BOOST_AUTO_TEST_CASE(timed_nodes_past_16_mib_come_a_huge_page_at_a_time, *boost::unit_test::precondition(huge_pages_on)) {
  constexpr std::size_t size = 256;
  constexpr std::size_t per_chunk = ((256u << 10) - 64) / size;
  std::thread([&] { // a thread of its own: its exit hands back what it kept
    const std::size_t before = node_cache_mapped_bytes();
    std::vector<void*> timed, brief;
    std::vector<std::size_t> steps;       // each growth of the mapped bytes by a timed node past 16 MiB
    std::vector<std::size_t> first_nodes; // timed's index of the node that caused it
    std::vector<std::size_t> brief_steps; // each growth by a brief node
    while (steps.size() < 3) {
      std::size_t mapped = node_cache_mapped_bytes();
      timed.push_back(node_allocate(size, node_lifetime::timed));
      const std::size_t grown = node_cache_mapped_bytes() - mapped;
      if (grown != 0 && mapped >= 16 * mib) {
        steps.push_back(grown);
        first_nodes.push_back(timed.size() - 1);
      }
      if (timed.size() % 16 == 0) { // one brief node of the same class every 16 timed
        mapped = node_cache_mapped_bytes();
        brief.push_back(node_allocate(size));
        if (const std::size_t b = node_cache_mapped_bytes() - mapped) brief_steps.push_back(b);
      }
      BOOST_REQUIRE(timed.size() < 200 * per_chunk);
    }
    for (std::size_t i = 0; i < steps.size(); ++i) {
      BOOST_TEST(steps[i] == 2 * mib);
      const auto node = reinterpret_cast<std::uintptr_t>(timed[first_nodes[i]]);
      BOOST_TEST(node % (2 * mib) == 64u); // the region's first chunk, just past its header
      if (i > 0) BOOST_TEST(first_nodes[i] - first_nodes[i - 1] >= 8 * per_chunk); // the seven spares came first
      if (thp_setting() != "never") BOOST_TEST(thp_eligible(timed[first_nodes[i]]) == 1);
    }
    BOOST_TEST(!brief_steps.empty());
    for (std::size_t b : brief_steps) BOOST_TEST(b == 256u << 10);
    if (thp_setting() == "madvise") // only what is asked for may be huge: brief nodes never come from a region
      for (void* p : brief) BOOST_TEST(thp_eligible(p) != 1);
    free_all(timed, size);
    free_all(brief, size);
    while (node_cache_trim(8, true)) {
    }
    BOOST_TEST(node_cache_mapped_bytes() <= before + slack);
  }).join();
  while (node_cache_trim(8, true)) {
  }
  BOOST_TEST(node_cache_empty_chunks() <= 8u + 2u); // the kept, and at most two prepared ahead
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
