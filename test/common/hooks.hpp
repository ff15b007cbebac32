#ifndef METRONOME_TEST_HOOKS_HPP
#define METRONOME_TEST_HOOKS_HPP

// Drives the library's test hooks (detail/test_hooks.hpp): stop one thread exactly at a
// hand-over point, or yield at random at every point (chaos).

#include <metronome/detail/test_hooks.hpp>

#include "common/latch_task.hpp"

#include <array>
#include <memory>
#include <atomic>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <chrono>
#include <random>
#include <thread>

namespace metronome::test {

#if defined(METRONOME_TEST_HOOKS)

// One stop at a time: the first thread marked with `arm_this_thread()` (or any thread,
// when armed for any) that reaches `point` blocks there until release(); arrived()
// waits for it to get there. Uninstalls itself on destruction, releasing a stopped thread.
class hook_stop {
public:
  explicit hook_stop(detail::hook_point point, bool any_thread = false) : point_(point), any_(any_thread) {
    armed_.store(true);
    self_.store(this);
    detail::test_hook.store(&on_hook);
  }
  // Waits until no thread is inside on_hook with this object (a stopped one is released).
  ~hook_stop() {
    detail::test_hook.store(nullptr);
    self_.store(nullptr);
    release();
    while (inside_.load() != 0) std::this_thread::yield();
  }
  hook_stop(const hook_stop&) = delete;
  hook_stop& operator=(const hook_stop&) = delete;

  // The calling thread stops at the point (the next time it gets there).
  static void arm_this_thread() { marked_ = true; }
  static void disarm_this_thread() { marked_ = false; }
  static bool is_marked() { return marked_; }

  bool arrived() { return arrived_->wait_for_at_least(1); }
  void release() { gate_->open(); }

private:
  static void on_hook(detail::hook_point p) {
    inside_.fetch_add(1);
    hook_stop* s = self_.load();
    bool expected = true;
    if (s && p == s->point_ && (s->any_ || marked_) && s->armed_.compare_exchange_strong(expected, false)) {
      s->arrived_->add();
      s->gate_->wait();
    }
    inside_.fetch_sub(1);
  }

  static inline thread_local bool marked_ = false;
  static inline std::atomic<hook_stop*> self_{nullptr};
  static inline std::atomic<int> inside_{0};
  detail::hook_point point_;
  bool any_ = false;
  std::atomic<bool> armed_{false};
  // On the heap: a stopped thread may lock these under a library mutex, and TSan forgets
  // a mutex's lock order only when its memory is freed (it sees no std::mutex destructor),
  // so a later test's object on the stack at the same address would inherit that order
  // (a false lock-order inversion against, say, a manual_clock's mutex).
  std::unique_ptr<counter> arrived_ = std::make_unique<counter>();
  std::unique_ptr<gate> gate_ = std::make_unique<gate>();
};

// Several stops at once, one per point: the first thread that reaches each listed point
// (any thread, or only one marked with hook_stop::arm_this_thread()) blocks there until
// that point is released. For hand-overs where two threads must each be held at their side.
class hook_stops {
public:
  struct spec {
    detail::hook_point point;
    bool any_thread = true;
    // Set (see same_thread_as): only the thread that stopped at `earlier` stops here. A
    // thread that passed `earlier` before the stops were armed and reaches `point` after
    // is not the one the test holds: it goes on.
    std::optional<detail::hook_point> earlier{};
  };
  // A stop at `point` for the thread held at `earlier` only (listed before it).
  static spec same_thread_as(detail::hook_point point, detail::hook_point earlier) {
    return spec{point, true, earlier};
  }
  explicit hook_stops(std::initializer_list<spec> specs) {
    if (specs.size() > 6) throw std::logic_error("hook_stops: at most 6 points");
    for (auto sp : specs) {
      stops_[count_].point = sp.point;
      stops_[count_].any = sp.any_thread;
      if (sp.earlier) stops_[count_].earlier = &find(*sp.earlier);
      ++count_;
    }
    self_.store(this);
    detail::test_hook.store(&on_hook);
  }
  ~hook_stops() {
    detail::test_hook.store(nullptr);
    self_.store(nullptr);
    for (std::size_t i = 0; i < count_; ++i) stops_[i].opened.open();
    while (inside_.load() != 0) std::this_thread::yield();
  }
  hook_stops(const hook_stops&) = delete;
  hook_stops& operator=(const hook_stops&) = delete;

  bool arrived(detail::hook_point p) { return find(p).arrived.wait_for_at_least(1); }
  void release(detail::hook_point p) { find(p).opened.open(); }

private:
  struct stop {
    detail::hook_point point{};
    bool any = true;
    const stop* earlier = nullptr;              // same_thread_as: the stop whose thread this one holds
    std::atomic<const void*> held{nullptr};     // the thread held here (its token)
    std::atomic<bool> armed{true};
    counter arrived;
    gate opened;
  };
  static const void* this_thread_token() noexcept {
    static thread_local const char token = 0;
    return &token;
  }
  stop& find(detail::hook_point p) {
    for (std::size_t i = 0; i < count_; ++i)
      if (stops_[i].point == p) return stops_[i];
    throw std::logic_error("hook_stops: point not listed");
  }
  static void on_hook(detail::hook_point p) {
    inside_.fetch_add(1);
    if (hook_stops* s = self_.load()) {
      for (std::size_t i = 0; i < s->count_; ++i) {
        stop& st = s->stops_[i];
        bool expected = true;
        if (st.point == p && (st.any || hook_stop::is_marked()) &&
            (st.earlier == nullptr || st.earlier->held.load() == this_thread_token()) &&
            st.armed.compare_exchange_strong(expected, false)) {
          st.held.store(this_thread_token());
          st.arrived.add();
          st.opened.wait();
        }
      }
    }
    inside_.fetch_sub(1);
  }

  static inline std::atomic<hook_stops*> self_{nullptr};
  static inline std::atomic<int> inside_{0};
  // On the heap, as hook_stop's counter and gate are (see there).
  std::unique_ptr<std::array<stop, 6>> storage_ = std::make_unique<std::array<stop, 6>>();
  std::array<stop, 6>& stops_ = *storage_;
  std::size_t count_ = 0;
};

// Chaos: at every hand-over point, yield or sleep a little at random. Installed for the
// lifetime of the object.
class chaos {
public:
  chaos() { detail::test_hook.store(&on_hook); }
  ~chaos() { detail::test_hook.store(nullptr); }
  chaos(const chaos&) = delete;
  chaos& operator=(const chaos&) = delete;

private:
  static void on_hook(detail::hook_point) {
    thread_local std::minstd_rand rng(std::hash<std::thread::id>()(std::this_thread::get_id()));
    const unsigned r = rng() % 16;
    if (r < 6) {
      std::this_thread::yield();
    } else if (r == 6) {
      std::this_thread::sleep_for(std::chrono::microseconds(50 + rng() % 200));
    }
  }
};

#endif

} // namespace metronome::test

#endif
