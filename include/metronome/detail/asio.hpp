// The one header through which metronome names Asio: Boost.Asio by default, standalone
// Asio (namespace asio, std::error_code) when the library is built with
// METRONOME_STANDALONE_ASIO (the CMake option of the same name, which puts the define on
// the metronome target's interface: a consumer compiles with the library's choice).
//
// metronome::net is the Asio namespace (boost::asio or ::asio), metronome::error_code
// and metronome::system_error its error types. The rest of the library, its tests and
// examples spell Asio through these, never boost::asio or ::asio by name.
#ifndef METRONOME_DETAIL_ASIO_HPP
#define METRONOME_DETAIL_ASIO_HPP

#if defined(METRONOME_STANDALONE_ASIO)

#ifndef ASIO_STANDALONE
#define ASIO_STANDALONE
#endif
// Asio before 1.24 sees clang's C++20 coroutines only as the Coroutines TS
// (__cpp_coroutines, which clang 14 no longer defines in C++20): without this, no
// awaitable. metronome::asio puts the same define on every file that links it.
#if defined(__clang__) && !defined(ASIO_HAS_CO_AWAIT) && !defined(ASIO_DISABLE_CO_AWAIT) && \
    defined(__cpp_impl_coroutine) && __has_include(<coroutine>)
#define ASIO_HAS_CO_AWAIT 1
#endif
#include <asio/version.hpp>
// An Asio header outside the set below: #include METRONOME_ASIO_HEADER(ip/tcp.hpp).
#define METRONOME_ASIO_HEADER(path) METRONOME_ASIO_HEADER_STR(asio/path) // NOLINT(bugprone-macro-parentheses): a path
// Reopens Asio's namespace, to specialise its traits: namespace METRONOME_NET_NAMESPACE {.
#define METRONOME_NET_NAMESPACE asio
// Asio 1.22 (Debian 12's libasio-dev) keeps deferred and as_tuple in experimental and
// has no completion_signature_of nor any_completion_handler; Boost 1.81's Asio is 1.26.
#if ASIO_VERSION < 102400
#define METRONOME_ASIO_EXPERIMENTAL_DEFERRED 1
#endif
#if ASIO_VERSION < 102600
#define METRONOME_ASIO_NO_COMPLETION_SIGNATURE_OF 1
#define METRONOME_ASIO_NO_ANY_COMPLETION_HANDLER 1
#endif

#else

#include <boost/asio/version.hpp>
#include <boost/system/error_code.hpp>
#include <boost/system/system_error.hpp>
#define METRONOME_ASIO_HEADER(path) METRONOME_ASIO_HEADER_STR(boost/asio/path) // NOLINT(bugprone-macro-parentheses): a path
#define METRONOME_NET_NAMESPACE boost::asio

#endif

#define METRONOME_ASIO_HEADER_STR(path) #path

#include METRONOME_ASIO_HEADER(any_io_executor.hpp)
#include METRONOME_ASIO_HEADER(associated_allocator.hpp)
#include METRONOME_ASIO_HEADER(associated_cancellation_slot.hpp)
#include METRONOME_ASIO_HEADER(associated_executor.hpp)
#include METRONOME_ASIO_HEADER(associator.hpp)
#include METRONOME_ASIO_HEADER(async_result.hpp)
#include METRONOME_ASIO_HEADER(awaitable.hpp)
#include METRONOME_ASIO_HEADER(basic_waitable_timer.hpp)
#include METRONOME_ASIO_HEADER(bind_allocator.hpp)
#include METRONOME_ASIO_HEADER(bind_cancellation_slot.hpp)
#include METRONOME_ASIO_HEADER(bind_executor.hpp)
#include METRONOME_ASIO_HEADER(cancellation_signal.hpp)
#include METRONOME_ASIO_HEADER(cancellation_type.hpp)
#include METRONOME_ASIO_HEADER(co_spawn.hpp)
#include METRONOME_ASIO_HEADER(compose.hpp)
#include METRONOME_ASIO_HEADER(defer.hpp)
#include METRONOME_ASIO_HEADER(detached.hpp)
#include METRONOME_ASIO_HEADER(dispatch.hpp)
#include METRONOME_ASIO_HEADER(error.hpp)
#include METRONOME_ASIO_HEADER(execution.hpp)
#include METRONOME_ASIO_HEADER(execution/context.hpp)
#include METRONOME_ASIO_HEADER(execution/outstanding_work.hpp)
#include METRONOME_ASIO_HEADER(execution_context.hpp)
#include METRONOME_ASIO_HEADER(executor_work_guard.hpp)
#include METRONOME_ASIO_HEADER(experimental/parallel_group.hpp)
#include METRONOME_ASIO_HEADER(io_context.hpp)
#include METRONOME_ASIO_HEADER(is_executor.hpp)
#include METRONOME_ASIO_HEADER(post.hpp)
#include METRONOME_ASIO_HEADER(prefer.hpp)
#include METRONOME_ASIO_HEADER(query.hpp)
#include METRONOME_ASIO_HEADER(steady_timer.hpp)
#include METRONOME_ASIO_HEADER(strand.hpp)
#include METRONOME_ASIO_HEADER(system_executor.hpp)
#include METRONOME_ASIO_HEADER(this_coro.hpp)
#include METRONOME_ASIO_HEADER(thread_pool.hpp)
#include METRONOME_ASIO_HEADER(use_awaitable.hpp)
#include METRONOME_ASIO_HEADER(use_future.hpp)
#include METRONOME_ASIO_HEADER(wait_traits.hpp)
#if defined(METRONOME_ASIO_EXPERIMENTAL_DEFERRED)
#include METRONOME_ASIO_HEADER(experimental/as_tuple.hpp)
#include METRONOME_ASIO_HEADER(experimental/deferred.hpp)
#else
#include METRONOME_ASIO_HEADER(as_tuple.hpp)
#include METRONOME_ASIO_HEADER(deferred.hpp)
#endif

#include <system_error>
#include <utility>

namespace metronome {

#if defined(METRONOME_STANDALONE_ASIO)
namespace net = ::asio;
using error_code = std::error_code;
using system_error = std::system_error;
#else
namespace net = boost::asio;
using error_code = boost::system::error_code;
using system_error = boost::system::system_error;
#endif

namespace detail {

// deferred and as_tuple wherever this Asio keeps them.
#if defined(METRONOME_ASIO_EXPERIMENTAL_DEFERRED)
using net::experimental::as_tuple;
using net::experimental::deferred;
#else
using net::as_tuple;
using net::deferred;
#endif

// A completion token whose async_result hands back the operation's signature without
// starting it (as Asio 1.26's completion_signature_of probes).
struct signature_probe {};
template <class... Signatures>
struct signature_probe_result;
template <class Signature>
struct signature_probe_result<Signature> {
  using type = Signature;
};

// completion_signature_of_t<Operation>: the signature `op(token)` completes with.
#if defined(METRONOME_ASIO_NO_COMPLETION_SIGNATURE_OF)
template <class Operation>
using completion_signature_of_t = typename decltype(std::declval<Operation>()(signature_probe{}))::type;
#else
template <class Operation>
using completion_signature_of_t = net::completion_signature_of_t<Operation>;
#endif

} // namespace detail
} // namespace metronome

namespace METRONOME_NET_NAMESPACE { // NOLINT(modernize-concat-nested-namespaces): Asio's namespace, named by a macro
template <class... Signatures>
class async_result<metronome::detail::signature_probe, Signatures...> {
public:
  using return_type = metronome::detail::signature_probe_result<Signatures...>;
  template <class Initiation, class... Args>
  static return_type initiate(Initiation&&, metronome::detail::signature_probe, Args&&...) {
    return {};
  }
};
} // namespace METRONOME_NET_NAMESPACE

#endif
