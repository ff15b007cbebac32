// large_array alone: storage for the delay queue's run, mapped from 2 MiB up
// (src/large_array.hpp, platform::allocate_large / resize_large).
#include "large_array.hpp"

#include <metronome/detail/node_cache.hpp>

#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>

using namespace metronome::detail;

namespace {
boost::test_tools::assertion_result huge_pages_on(boost::unit_test::test_unit_id) {
  if (!large_arrays_use_huge_pages()) {
    boost::test_tools::assertion_result r(false);
    r.message() << "large arrays come from the heap in this build (portable fallback, or METRONOME_HUGE_PAGES=OFF)";
    return r;
  }
  return true;
}

void fill(large_array<std::uint64_t>& a, std::size_t from, std::size_t to) {
  for (std::size_t i = from; i < to; ++i) a[i] = i * 2654435761u;
}
// The first `n` elements hold what fill() wrote.
std::size_t kept(const large_array<std::uint64_t>& a, std::size_t n) {
  std::size_t same = 0;
  for (std::size_t i = 0; i < n; ++i) same += a[i] == i * 2654435761u ? 1 : 0;
  return same;
}
constexpr std::size_t mib = std::size_t(1) << 20;
} // namespace

BOOST_AUTO_TEST_SUITE(large_array_suite)

// Whatever the storage, a resize keeps the elements asked for, growing and shrinking,
// across the 2 MiB line both ways.
BOOST_AUTO_TEST_CASE(a_resize_keeps_the_prefix_both_ways) {
  large_array<std::uint64_t> a(64);
  fill(a, 0, 64);
  a.resize(128, 64);
  BOOST_TEST(a.size() == 128u);
  BOOST_TEST(kept(a, 64) == 64u);
  fill(a, 64, 128);
  a.resize(4 * mib / 8, 128); // onto mapped storage where there is any
  BOOST_TEST(kept(a, 128) == 128u);
  fill(a, 128, a.size());
  a.resize(mib / 8, mib / 8); // back to the heap
  BOOST_TEST(a.size() == mib / 8);
  BOOST_TEST(kept(a, a.size()) == a.size());
  a.resize(16, 16);
  BOOST_TEST(kept(a, 16) == 16u);
}

// Mapped storage shrinks in place (the same address; the tail's pages unmapped, as
// large_arrays_mapped_bytes() shows) and grows by moving its pages, its prefix kept
// and the mapped bytes counted exactly; the last of it goes back when the array does.
BOOST_AUTO_TEST_CASE(mapped_storage_resizes_in_place_and_counts_its_bytes, *boost::unit_test::precondition(huge_pages_on)) {
  const std::size_t before = large_arrays_mapped_bytes();
  {
    large_array<std::uint64_t> a(8 * mib / 8);
    fill(a, 0, a.size());
    BOOST_TEST(large_arrays_mapped_bytes() - before == 8 * mib);
    const std::uint64_t* at = &a[0];
    a.resize(3 * mib / 8, 3 * mib / 8);
    BOOST_TEST(&a[0] == at); // in place
    BOOST_TEST(large_arrays_mapped_bytes() - before == 3 * mib);
    BOOST_TEST(kept(a, a.size()) == a.size());
    a.resize(12 * mib / 8 + 3, 3 * mib / 8); // not a whole number of pages: rounded up to one
    BOOST_TEST(large_arrays_mapped_bytes() - before == 12 * mib + 4096);
    BOOST_TEST(kept(a, 3 * mib / 8) == 3 * mib / 8);
    BOOST_TEST(reinterpret_cast<std::uintptr_t>(&a[0]) % (2 * mib) == 0u); // aligned for huge pages
    fill(a, 0, a.size()); // the new part is usable
    BOOST_TEST(kept(a, a.size()) == a.size());
    a.resize(2 * mib / 8, 2 * mib / 8);
    BOOST_TEST(large_arrays_mapped_bytes() - before == 2 * mib);
    BOOST_TEST(kept(a, a.size()) == a.size());
  }
  BOOST_TEST(large_arrays_mapped_bytes() == before);
}

BOOST_AUTO_TEST_SUITE_END()
