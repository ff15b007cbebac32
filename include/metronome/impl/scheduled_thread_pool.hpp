// Template bodies of scheduled_thread_pool's submit and schedule calls.
#ifndef METRONOME_IMPL_SCHEDULED_THREAD_POOL_HPP
#define METRONOME_IMPL_SCHEDULED_THREAD_POOL_HPP

#include <functional>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace metronome {

// One-shot tasks carry no extras (those are for periodic and serial-executor tasks). A
// callable bound to an executor of its own is a bound task (a node type of its own: an
// unbound callable's node is the same as without this).
template <class R, class F>
detail::scheduled_task_base* scheduled_thread_pool::make_one_shot(F&& f, detail::node_lifetime lifetime) {
  return detail::make_scheduled_task<R, false, detail::has_own_executor<std::decay_t<F>>>(
      core_.get(), std::forward<F>(f), detail::task_kind::one_shot, lifetime);
}

template <class R>
scheduled_future<R> scheduled_thread_pool::enqueue(detail::scheduled_task_base* t, clock::time_point due) {
  return enqueue<R>(t, due, core_->now());
}

template <class R>
scheduled_future<R> scheduled_thread_pool::enqueue(detail::scheduled_task_base* t, clock::time_point due,
                                                   clock::time_point current) {
  scheduled_future<R> handle(t);
  t->add_ref(); // the pool's reference; submit_scheduled takes it over
  core_->submit_scheduled(t, due, current);
  return handle;
}

template <class F>
auto scheduled_thread_pool::submit(F&& f) {
  using R = std::invoke_result_t<std::decay_t<F>&>;
  auto* t = make_one_shot<R>(std::forward<F>(f));
  return enqueue<R>(t, clock::time_point::min());
}

template <class F, class Rep, class Period>
auto scheduled_thread_pool::schedule(F&& f, std::chrono::duration<Rep, Period> delay) {
  using R = std::invoke_result_t<std::decay_t<F>&>;
  auto* t = make_one_shot<R>(std::forward<F>(f), detail::node_lifetime::timed);
  const clock::time_point current = core_->now();
  return enqueue<R>(t, detail::saturating_add(current, delay), current);
}

template <class F, class Duration>
auto scheduled_thread_pool::schedule_at(F&& f, std::chrono::time_point<clock, Duration> when) {
  using R = std::invoke_result_t<std::decay_t<F>&>;
  auto* t = make_one_shot<R>(std::forward<F>(f), detail::node_lifetime::timed);
  auto since = detail::saturating_duration(when.time_since_epoch());
  return enqueue<R>(t, clock::time_point(since));
}

template <class F, class Rep1, class Period1, class Rep2, class Period2>
scheduled_future<void> scheduled_thread_pool::periodic(F&& f, std::chrono::duration<Rep1, Period1> initial,
                                                       std::chrono::duration<Rep2, Period2> period, bool fixed_delay,
                                                       periodic_options options) {
  const clock::duration p = detail::checked_period(period);
  detail::check_jitter(options);
  auto* t = detail::make_scheduled_task<void, true, detail::has_own_executor<std::decay_t<F>>>(
      core_.get(), std::forward<F>(f), detail::task_kind::periodic, detail::node_lifetime::timed);
  t->extras().period = p;
  t->extras().fixed_delay = fixed_delay;
  t->extras().periodic = options;
  const clock::time_point current = core_->now();
  return enqueue<void>(t, detail::saturating_add(current, initial), current);
}

template <class F, class Rep1, class Period1, class Rep2, class Period2>
scheduled_future<void>
scheduled_thread_pool::schedule_at_fixed_rate(F&& f, std::chrono::duration<Rep1, Period1> initial_delay,
                                              std::chrono::duration<Rep2, Period2> period, periodic_options options) {
  return periodic(std::forward<F>(f), initial_delay, period, false, options);
}

template <class F, class Rep1, class Period1, class Rep2, class Period2>
scheduled_future<void>
scheduled_thread_pool::schedule_with_fixed_delay(F&& f, std::chrono::duration<Rep1, Period1> initial_delay,
                                                 std::chrono::duration<Rep2, Period2> delay, periodic_options options) {
  return periodic(std::forward<F>(f), initial_delay, delay, true, options);
}

} // namespace metronome

#endif
