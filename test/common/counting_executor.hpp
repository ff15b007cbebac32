#ifndef METRONOME_TEST_COUNTING_EXECUTOR_HPP
#define METRONOME_TEST_COUNTING_EXECUTOR_HPP

#include <metronome/detail/asio.hpp>

#include <atomic>
#include <utility>

namespace metronome::test {

// A Networking-TS executor over an io_context that counts the outstanding work held on
// it, the work released outside the io_context's own thread, and the work held when a
// function was handed to it, so that a test sees when an operation holds work for its
// handler and when it lets go (Asio's rule: once the executor has taken the
// completion, on the completing thread).
class counting_executor {
public:
  struct counts {
    std::atomic<int> held{0};
    std::atomic<int> released_elsewhere{0};
    std::atomic<int> held_when_handed{-1}; // at the last dispatch, post or defer
  };

  counting_executor(metronome::net::io_context& io, counts& c) noexcept : io_(&io), counts_(&c) {}

  metronome::net::io_context& context() const noexcept { return *io_; }
  void on_work_started() const noexcept {
    counts_->held.fetch_add(1);
    io_->get_executor().on_work_started();
  }
  void on_work_finished() const noexcept {
    counts_->held.fetch_sub(1);
    if (!io_->get_executor().running_in_this_thread()) counts_->released_elsewhere.fetch_add(1);
    io_->get_executor().on_work_finished();
  }
  template <class F, class A>
  void dispatch(F&& f, const A& a) const {
    counts_->held_when_handed.store(counts_->held.load());
    io_->get_executor().dispatch(std::forward<F>(f), a);
  }
  template <class F, class A>
  void post(F&& f, const A& a) const {
    counts_->held_when_handed.store(counts_->held.load());
    io_->get_executor().post(std::forward<F>(f), a);
  }
  template <class F, class A>
  void defer(F&& f, const A& a) const {
    counts_->held_when_handed.store(counts_->held.load());
    io_->get_executor().defer(std::forward<F>(f), a);
  }
  friend bool operator==(const counting_executor& a, const counting_executor& b) noexcept { return a.io_ == b.io_; }
  friend bool operator!=(const counting_executor& a, const counting_executor& b) noexcept { return a.io_ != b.io_; }

private:
  metronome::net::io_context* io_;
  counts* counts_;
};

} // namespace metronome::test

#endif
