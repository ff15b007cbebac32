// The one place metronome names Asio's private API (namespace net::detail). Every use is
// here, adapted per Asio version; docs/asio.md ("Asio's internals we use") says why each
// one is needed and which versions were checked.
//
// Checked: standalone Asio 1.22.1 (Debian 12 libasio-dev), Boost 1.81 (Boost.Asio 1.26.0)
// and standalone Asio 1.38.2, each built and tested by the test command (scripts/test.sh);
// Boost.Asio 1.34.0 (Boost 1.87), 1.37.0 (Boost 1.90) and 1.38.0 by hand over Boost 1.81
// (METRONOME_BOOST_ASIO_INCLUDE_DIR, docs/asio.md). The adaptation splits at Asio 1.33.0,
// where the scheduler's constructor lost its concurrency hint. Outside that range the
// build stops here: define METRONOME_ASIO_UNCHECKED to try an Asio metronome was not
// checked against.
#ifndef METRONOME_DETAIL_ASIO_INTERNALS_HPP
#define METRONOME_DETAIL_ASIO_INTERNALS_HPP

#include <metronome/detail/asio.hpp>

#if defined(METRONOME_STANDALONE_ASIO)
#define METRONOME_ASIO_VERSION ASIO_VERSION
#define METRONOME_ASIO_OLDEST 102201 // 1.22.1
#else
#define METRONOME_ASIO_VERSION BOOST_ASIO_VERSION
#define METRONOME_ASIO_OLDEST 102600 // Boost 1.81
#endif
#define METRONOME_ASIO_NEWEST 103802 // 1.38.2

#if !defined(METRONOME_ASIO_UNCHECKED) && \
    (METRONOME_ASIO_VERSION < METRONOME_ASIO_OLDEST || METRONOME_ASIO_VERSION > METRONOME_ASIO_NEWEST)
#error "metronome: this Asio is outside the range metronome was checked against (standalone Asio 1.22.1-1.38.2, Boost 1.81 and newer up to Asio 1.38.2); see docs/asio.md, or define METRONOME_ASIO_UNCHECKED to try it"
#endif

#include METRONOME_ASIO_HEADER(detail/bind_handler.hpp)
#include METRONOME_ASIO_HEADER(detail/reactor.hpp)
#include METRONOME_ASIO_HEADER(detail/scheduler.hpp)
#include METRONOME_ASIO_HEADER(detail/scheduler_task.hpp)
#include METRONOME_ASIO_HEADER(detail/strand_executor_service.hpp)
#if METRONOME_ASIO_VERSION >= 103300
#include METRONOME_ASIO_HEADER(config.hpp)
#endif

#include <type_traits>

namespace metronome::detail::asio_internals {

// -- Handlers Asio wraps on their way to an executor.

// The wrapper asio::post/dispatch/defer put around a handler (binder0): seen through, so
// that an empty callable is refused also when posted (detail/task.hpp).
template <class F>
inline constexpr bool is_binder0 = false;
template <class H>
inline constexpr bool is_binder0<net::detail::binder0<H>> = true;
template <class H>
const H& binder0_handler(const net::detail::binder0<H>& b) noexcept {
  return b.handler_;
}

// An Asio strand's invoker: the strand queues it on its executor for handlers it has
// already accepted (impl/pool_executor.hpp treats it as internal work).
template <class F>
struct is_strand_invoker : std::false_type {};
template <class Executor, class Void>
struct is_strand_invoker<net::detail::strand_executor_service::invoker<Executor, Void>> : std::true_type {};

// -- The pool's reactor (src/scheduled_thread_pool.cpp, src/pool_reactor.cpp).
//
// Asio has no public way to run a reactor inside another execution context's threads:
// an I/O object finds its reactor, and the reactor its scheduler, as services of the
// context its executor names. So the pool registers Asio's scheduler in itself, with no
// thread of its own, and its parked workers run it (wait_one / poll).

using scheduler = net::detail::scheduler;
using scheduler_task = net::detail::scheduler_task;
using get_task_function = scheduler_task* (*)(net::execution_context&);

// The context's reactor: what the scheduler waits in, made on first use.
inline scheduler_task* reactor_of(net::execution_context& ctx) { return &net::use_service<net::detail::reactor>(ctx); }

// Registers Asio's scheduler in `ctx` with no thread of its own; get_task is called when
// the first I/O object asks for the reactor. concurrency_hint 1: Asio's single-thread
// shortcuts. Since Asio 1.33 the hint is read from the context's configuration (public:
// config_from_concurrency_hint), made here before the scheduler reads it.
inline scheduler& make_scheduler(net::execution_context& ctx, int concurrency_hint, get_task_function get_task) {
#if METRONOME_ASIO_VERSION >= 103300
  net::config_from_concurrency_hint(concurrency_hint).make(ctx);
  return net::make_service<scheduler>(ctx, false, get_task);
#else
  return net::make_service<scheduler>(ctx, concurrency_hint, false, get_task);
#endif
}

// One completion (blocking), then every one already ready: the reactor waiter's turn.
inline void run_ready(scheduler& s) {
  error_code ignored;
  if (s.wait_one(-1, ignored) != 0) s.poll(ignored);
}

// Without blocking: the reactor once (if no thread waits in it), then every completion
// ready: a busy worker's turn (the fairness of I/O under load).
inline void poll_ready(scheduler& s) {
  error_code ignored;
  s.poll(ignored);
}

inline void interrupt(scheduler_task& reactor) noexcept { reactor.interrupt(); }

} // namespace metronome::detail::asio_internals

#endif
