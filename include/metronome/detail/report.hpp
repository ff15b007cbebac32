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

// Asio's rule for a handler that throws on a context that is not a metronome pool: its
// exception leaves the handler (io_context::run() throws it; asio::thread_pool
// terminates). Where metronome runs user code inside an Asio handler of its own there
// (a drive of an io_context's timing service, a serial executor's drain, a wheel's
// timeout, a completion), that handler holds a rethrow_scope: the first exception
// reported meanwhile is kept by the outermost scope of the thread, the code running user
// work stops and puts the rest back in the context's queue (pending()), and the
// outermost handler rethrows it once its own state is consistent (rethrow_if_any()).
// Scopes inside another are inert: only the outermost one is at Asio's handler boundary.
class rethrow_scope {
public:
  rethrow_scope() noexcept;
  ~rethrow_scope(); // an exception kept and never rethrown (the owner left by another path) is printed
  rethrow_scope(const rethrow_scope&) = delete;
  rethrow_scope& operator=(const rethrow_scope&) = delete;

  // Throws the kept exception, if this is the outermost scope and it holds one.
  void rethrow_if_any();
  // The outermost scope of this thread takes `e` if it holds none yet; false otherwise.
  static bool keep(const std::exception_ptr& e) noexcept;
  // The outermost scope of this thread holds an exception: run no more user code.
  static bool pending() noexcept;

private:
  bool owner_;
  std::exception_ptr kept_;
};

// An exception of user code that the library ran outside a pool task of its own (a
// completion handler, a wheel timeout): to the exception handler of the pool the
// calling thread works for, as for any other work there; elsewhere kept by the
// thread's rethrow_scope (it leaves the Asio handler), else printed.
void report_here(const std::exception_ptr& e, const char* where) noexcept;

// Calls a user's exception handler; if that throws, its exception is printed (one
// line) rather than lost, and the caller goes on.
void call_exception_handler(const std::function<void(std::exception_ptr)>& handler, std::exception_ptr e,
                            const char* where) noexcept;

} // namespace metronome::detail

#endif
