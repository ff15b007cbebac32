// Reporting exceptions of user code to a handler or stderr.
#ifndef METRONOME_DETAIL_REPORT_HPP
#define METRONOME_DETAIL_REPORT_HPP

#include <exception>
#include <functional>

namespace metronome::detail {

class pool_core;

// The default exception handler: "metronome: unhandled exception in <where>: <what>"
// on stderr, and keep going.
void print_unhandled(const std::exception_ptr& e, const char* where) noexcept;

// The metronome pool whose worker the calling thread is; nullptr on any other thread.
pool_core* current_pool() noexcept;

// An exception of user code that the library ran outside a pool task of its own (a
// completion handler, a wheel timeout): to the exception handler of the pool the
// calling thread works for, as for any other work there; elsewhere printed.
void report_here(const std::exception_ptr& e, const char* where) noexcept;

// Calls a user's exception handler; if that throws, its exception is printed (one
// line) rather than lost, and the caller goes on.
void call_exception_handler(const std::function<void(std::exception_ptr)>& handler, std::exception_ptr e,
                            const char* where) noexcept;

} // namespace metronome::detail

#endif
