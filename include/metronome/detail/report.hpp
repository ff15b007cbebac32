#ifndef METRONOME_DETAIL_REPORT_HPP
#define METRONOME_DETAIL_REPORT_HPP

#include <exception>

namespace metronome::detail {

// The default exception handler: "metronome: unhandled exception in <where>: <what>"
// on stderr, and keep going.
void print_unhandled(std::exception_ptr e, const char* where) noexcept;

} // namespace metronome::detail

#endif
