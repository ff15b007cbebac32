#include <metronome/latency_histogram.hpp>

#include <boost/test/unit_test.hpp>
#include "common/print_duration.hpp"

#include <chrono>
#include <sstream>

using namespace std::chrono_literals;
using metronome::latency_histogram;

BOOST_AUTO_TEST_SUITE(latency_histogram_suite)

BOOST_AUTO_TEST_CASE(buckets_are_powers_of_two_of_nanoseconds_from_256ns) {
  BOOST_TEST(latency_histogram::bucket_of(-5ns) == 0u);
  BOOST_TEST(latency_histogram::bucket_of(0ns) == 0u);
  BOOST_TEST(latency_histogram::bucket_of(255ns) == 0u);
  BOOST_TEST(latency_histogram::bucket_of(256ns) == 1u);
  BOOST_TEST(latency_histogram::bucket_of(511ns) == 1u);
  BOOST_TEST(latency_histogram::bucket_of(512ns) == 2u);
  BOOST_TEST(latency_histogram::bucket_of(5ms) == 15u); // [4.19 ms, 8.39 ms)
  BOOST_TEST(latency_histogram::bucket_of(std::chrono::hours(1)) == latency_histogram::bucket_count - 1);
  BOOST_TEST(latency_histogram::bucket_of(std::chrono::nanoseconds::max()) == latency_histogram::bucket_count - 1);
  for (std::size_t b = 0; b < latency_histogram::bucket_count; ++b) {
    BOOST_TEST(latency_histogram::bucket_of(latency_histogram::lower_bound(b)) == b);
    if (b + 1 < latency_histogram::bucket_count) {
      BOOST_TEST(latency_histogram::bucket_of(latency_histogram::upper_bound(b) - 1ns) == b);
      BOOST_TEST(latency_histogram::upper_bound(b) == latency_histogram::lower_bound(b + 1));
    }
  }
  BOOST_TEST((latency_histogram::upper_bound(latency_histogram::bucket_count - 1) == std::chrono::nanoseconds::max()));
}

BOOST_AUTO_TEST_CASE(percentiles_are_read_as_bucket_upper_bounds) {
  latency_histogram h;
  BOOST_TEST(h.empty());
  BOOST_TEST((h.p50() == 0ns));
  BOOST_TEST((h.p99() == 0ns));
  for (int i = 0; i < 98; ++i) h.record(100ns); // bucket 0
  h.record(3us);                                 // bucket 4: [2048, 4096) ns
  h.record(5ms);                                 // bucket 15
  BOOST_TEST(h.total() == 100u);
  BOOST_TEST((h.p50() == 256ns));
  BOOST_TEST((h.percentile(0.98) == 256ns));
  BOOST_TEST((h.p99() == 4096ns));
  BOOST_TEST((h.percentile(1.0) == latency_histogram::upper_bound(15)));
  BOOST_TEST((h.max_bound() == latency_histogram::upper_bound(15)));
}

BOOST_AUTO_TEST_CASE(prints_one_compact_line) {
  latency_histogram h;
  std::ostringstream empty;
  empty << h;
  BOOST_TEST(empty.str() == "n=0");
  h.record(100ns);
  h.record(5ms);
  std::ostringstream os;
  os << h;
  BOOST_TEST(os.str() == "n=2 p50<256ns p99<8.39ms max<8.39ms");
}

BOOST_AUTO_TEST_CASE(histograms_add_up) {
  latency_histogram a, b;
  a.record(1us);
  b.record(1us);
  b.record(1s);
  a += b;
  BOOST_TEST(a.total() == 3u);
  BOOST_TEST(a.count(latency_histogram::bucket_of(1us)) == 2u);
  BOOST_TEST(a.count(latency_histogram::bucket_of(1s)) == 1u);
}

BOOST_AUTO_TEST_SUITE_END()
