// Template bodies of basic_interval (its pending tick, async_tick, reset_at, init).
#ifndef METRONOME_IMPL_INTERVAL_HPP
#define METRONOME_IMPL_INTERVAL_HPP

#include <metronome/detail/hand_over_hold.hpp>
#include <metronome/detail/internal_post.hpp>
#include <metronome/detail/slot_handler.hpp>

#include <metronome/detail/asio.hpp>

#include <memory>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace metronome {

namespace detail {

struct interval_forward_cancel {
  interval_state* target; // alive while the tick is pending (the tick holds it)
  void operator()(net::cancellation_type_t t) const { cancel_pending_tick(*target, t); }
};

// A pending tick's handler is the user's with the interval's slot
// (slot_handler<Handler, tick_link<Executor>>).
template <class Executor>
class tick_link {
public:
  tick_link(std::shared_ptr<interval_state> s, const Executor& ex) : state_(std::move(s)), ex_(ex) {}
  tick_link(tick_link&&) noexcept = default;
  tick_link& operator=(tick_link&&) = delete;
  // Destroyed unrun (its wait dropped by shutdown_now() or by a terminated pool): the
  // tick is no longer pending and not consumed, and the user's slot stops forwarding to
  // this interval - left, it reached the interval's state after it was freed.
  ~tick_link() {
    if (!state_) return; // completed, or moved on
    interval_state& s = *state_;
    s.pending = false;
    s.rearm = false;
    s.cancelled = false;
    s.release_user_slot();
    if (!std::exchange(s.moved, false)) s.give_back_tick();
  }

  net::cancellation_slot slot() const noexcept { return state_->signal.slot(); }

  template <class Wrapper>
  static void complete(Wrapper& w, error_code ec) {
    tick_link& self = w.link();
    interval_state& s = *self.state_;
    const bool rearm = std::exchange(s.rearm, false);
    const bool moved = std::exchange(s.moved, false);
    s.cancelled = false;
    if (ec == net::error::operation_aborted && rearm) { // reset(): wait again for the new grid
      s.pending_due = s.take();
      const clock::time_point due = s.pending_due;
      const Executor ex = self.ex_;
      async_delay_until(ex, due, std::move(w));
      return;
    }
    s.pending = false;
    s.release_user_slot();
    const clock::time_point due = s.pending_due;
    if (!moved) { // else `next` is the reset's grid
      if (ec)
        s.give_back_tick(); // an aborted tick is not consumed
      else
        s.settle(due, pool_core_of(self.ex_).now()); // now: the moment it completes
    }
    self.state_.reset();
    std::move(w.handler())(ec, due);
  }

private:
  std::shared_ptr<interval_state> state_;
  Executor ex_;
};

template <class Executor>
class initiate_tick {
public:
  using executor_type = Executor;
  initiate_tick(std::shared_ptr<interval_state> s, const Executor& ex) : state_(std::move(s)), ex_(ex) {}
  executor_type get_executor() const noexcept { return ex_; }

  template <class Handler>
  void operator()(Handler&& handler) const {
    using H = std::decay_t<Handler>;
    H h(std::forward<Handler>(handler));
    interval_state& s = *state_;
    if (s.pending) { // one tick at a time: the second completes at once with already_started
      auto hex = net::get_associated_executor(h, ex_);
      internal_post_scope internal; // a completion: a shut-down pool still takes it (not outside work)
      net::post(hex, with_hand_over_hold(hex, [h = std::move(h)]() mutable {
                  std::move(h)(error_code(net::error::already_started), clock::time_point());
                }));
      return;
    }
    if (s.ended) { // the grid ended at time_point::max(): no tick will ever fall due again
      auto hex = net::get_associated_executor(h, ex_);
      internal_post_scope internal; // as above
      net::post(hex, with_hand_over_hold(hex, [h = std::move(h)]() mutable {
                  std::move(h)(error_code(net::error::eof), clock::time_point::max());
                }));
      return;
    }
    auto user = net::get_associated_cancellation_slot(h);
    if (user.is_connected()) {
      user.template emplace<interval_forward_cancel>(interval_forward_cancel{&s});
      s.user_slot = user;
      s.user_slot_connected = true;
    }
    const clock::time_point saved = s.next;
    s.pending_due = s.take();
    s.pending = true;
    try {
      async_delay_until(ex_, s.pending_due, slot_handler<H, tick_link<Executor>>(std::move(h), tick_link<Executor>(state_, ex_)));
    } catch (...) {
      s.pending = false;
      s.next = saved;
      s.ended = false;
      s.release_user_slot();
      throw;
    }
  }

private:
  std::shared_ptr<interval_state> state_;
  Executor ex_;
};

} // namespace detail

template <class Executor>
template <class CompletionToken>
inline auto basic_interval<Executor>::async_tick(CompletionToken&& token) {
  return net::async_initiate<CompletionToken, void(error_code, clock::time_point)>(
      detail::initiate_tick<Executor>(state_, ex_), token);
}

template <class Executor>
inline void basic_interval<Executor>::reset_at(clock::time_point start) {
  detail::interval_state& s = *state_;
  s.next = start;
  s.ended = false;
  if (s.pending) {
    s.moved = true;
    if (!s.rearm && !s.cancelled) {
      s.rearm = true;
      s.signal.emit(net::cancellation_type::terminal);
    }
  }
}

template <class Executor>
template <class Rep, class Ratio>
inline void basic_interval<Executor>::init(clock::time_point start, std::chrono::duration<Rep, Ratio> period,
                                    missed_tick missed) {
  // A period beyond what the clock can count saturates (as the pool's periodic calls do);
  // one below its resolution (under a nanosecond) is zero.
  const clock::duration p = period > std::chrono::duration<Rep, Ratio>::zero()
                                ? detail::saturating_duration(period)
                                : clock::duration::zero();
  if (p <= clock::duration::zero()) throw std::invalid_argument("metronome: interval period must be positive");
  state_ = std::make_shared<detail::interval_state>();
  state_->next = start;
  state_->period = p;
  state_->missed = missed;
}

} // namespace metronome

#endif
