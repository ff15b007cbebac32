// Lets BOOST_TEST print a std::chrono::duration where the standard library has no
// operator<< for it (C++20's, missing from libc++ before 17: the libcxx preset).
#ifndef METRONOME_TEST_COMMON_PRINT_DURATION_HPP
#define METRONOME_TEST_COMMON_PRINT_DURATION_HPP

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <ostream>

#if !defined(__cpp_lib_chrono) || __cpp_lib_chrono < 201907L
namespace boost::test_tools::tt_detail {
template <class Rep, class Period>
struct print_log_value<std::chrono::duration<Rep, Period>> {
  void operator()(std::ostream& os, const std::chrono::duration<Rep, Period>& d) const {
    os << d.count() << " x " << Period::num << "/" << Period::den << " s";
  }
};
} // namespace boost::test_tools::tt_detail
#endif

#endif
