// Timer rows: timers that fire (submit rate and lateness), timeouts scheduled and then
// cancelled, accuracy of a few timers, periodic tasks. Metronome's pool and wheel
// against steady_timer on each of the two plain-Asio contexts.
#include "harness.hpp"

#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <random>

namespace bench {
namespace {

std::vector<std::int64_t> random_delays_ns(long n, std::int64_t lo_us, std::int64_t hi_us, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> d(lo_us, hi_us);
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(rng) * 1000;
  return v;
}

// A steady_timer's handler: the user task when the timer expires, `aborted` when cancelled.
struct asio_timer_handler {
  user_task task;
  counter* aborted;
  void operator()(boost::system::error_code ec) const {
    if (!ec)
      task();
    else if (aborted)
      aborted->bump();
  }
};

// ------------------------------------------------------------ timers-fire
// n one-shot timers, each due at a random 0-200 ms after it is scheduled (due = the time
// of scheduling + delay); submit rate, lateness of each from its slot, memory.
constexpr std::uint64_t fire_seed = 12345;

template <class Schedule>
metrics fire_common(long n, Schedule schedule) {
  auto delays = random_delays_ns(n, 0, 200000, fire_seed);
  std::vector<std::int64_t> due(static_cast<std::size_t>(n));
  results r(n);
  double base = heap_in_use_mib();
  metrics m;
  schedule(r, delays, due, m);
  r.wait_all();
  add_lateness(m, r, due);
  m["peak RSS MiB"] = peak_rss_mib();
  m["heap after MiB"] = heap_in_use_mib() - base;
  return m;
}

template <class Submit>
void submit_fire(long n, results& r, const std::vector<std::int64_t>& delays, std::vector<std::int64_t>& due,
                 metrics& m, Submit submit) {
  auto start = clock::now();
  for (long i = 0; i < n; ++i) {
    due[i] = now_ns() + delays[i];
    submit(std::chrono::nanoseconds(delays[i]), user_task{&r, i});
  }
  m["submit Mops/s"] = static_cast<double>(n) / seconds_since(start) / 1e6;
}

metrics fire_pool(const options& o, long n) {
  return fire_common(n, [&](results& r, auto& delays, auto& due, metrics& m) {
    metronome::scheduled_thread_pool pool(static_cast<std::size_t>(o.threads));
    submit_fire(n, r, delays, due, m, [&](auto d, user_task t) { pool.schedule(t, d); });
    r.wait_all();
  });
}

metrics fire_wheel(const options& o, long n) {
  return fire_common(n, [&](results& r, auto& delays, auto& due, metrics& m) {
    metronome::scheduled_thread_pool pool(static_cast<std::size_t>(o.threads));
    metronome::wheel_timer wheel(pool); // 1 ms tick
    submit_fire(n, r, delays, due, m, [&](auto d, user_task t) { wheel.schedule(t, d); });
    r.wait_all();
  });
}

template <class Context>
metrics fire_asio(const options& o, long n) {
  return fire_common(n, [&](results& r, auto& delays, auto& due, metrics& m) {
    Context ctx(o.threads);
    // Constructed empty before timing, as the metronome side needs no storage of its own.
    std::vector<std::optional<asio::steady_timer>> timers(static_cast<std::size_t>(n));
    long next = 0;
    submit_fire(n, r, delays, due, m, [&](auto d, user_task t) {
      auto& timer = timers[next++].emplace(ctx.get_executor(), d);
      timer.async_wait(asio_timer_handler{t, nullptr});
    });
    r.wait_all();
    ctx.join();
  });
}

// ------------------------------------------------------------ timeout-cancel
// n timeouts at 60 s, each keeping a handle, then all cancelled: both rates, the memory
// they hold while pending, peak RSS, and the heap still in use once everything is gone.
template <class Body>
metrics cancel_common(long n, Body body) {
  results r(n); // the task a timeout would run; none does
  double base = heap_in_use_mib();
  metrics m;
  body(r, m, base);
  check(r.done() == 0, "timeout-cancel: a cancelled timeout ran");
  m["peak RSS MiB"] = peak_rss_mib();
  m["heap after MiB"] = heap_in_use_mib() - base;
  return m;
}

template <class Handle, class Schedule>
void cancel_handles(long n, results& r, metrics& m, double base, Schedule schedule) {
  std::vector<Handle> hs(static_cast<std::size_t>(n)); // faulted in before timing
  auto start = clock::now();
  for (long i = 0; i < n; ++i) hs[i] = schedule(user_task{&r, i});
  m["schedule Mops/s"] = static_cast<double>(n) / seconds_since(start) / 1e6;
  m["held MiB"] = heap_in_use_mib() - base;
  start = clock::now();
  long won = 0;
  for (auto& h : hs) won += h.cancel() ? 1 : 0;
  m["cancel Mops/s"] = static_cast<double>(n) / seconds_since(start) / 1e6;
  check(won == n, "timeout-cancel: a cancel did not win");
}

metrics cancel_pool(const options& o, long n) {
  return cancel_common(n, [&](results& r, metrics& m, double base) {
    metronome::scheduled_thread_pool pool(static_cast<std::size_t>(o.threads));
    cancel_handles<metronome::scheduled_future<void>>(n, r, m, base,
                                                      [&](user_task t) { return pool.schedule(t, 60s); });
  });
}

metrics cancel_wheel(const options& o, long n) {
  return cancel_common(n, [&](results& r, metrics& m, double base) {
    metronome::scheduled_thread_pool pool(static_cast<std::size_t>(o.threads));
    metronome::wheel_timer wheel(pool);
    cancel_handles<metronome::wheel_timer::timeout>(n, r, m, base, [&](user_task t) { return wheel.schedule(t, 60s); });
  });
}

// The floor under the pool's side: per timeout only what an exact, thread-safe timer
// that leaves at once when cancelled cannot skip - a clock read for its deadline, a fresh
// node written, one uncontended lock around an O(1) link into a list (no due order, no
// worker, no wake-up decision, no state for waiters); per cancel one CAS that claims the
// node and one lock around its O(1) unlink. A library with a lock on its queue does no
// less, so floor / Asio's best bounds the ratio the pool's rows can show.
struct floor_node {
  std::atomic<int> state{0};
  std::int64_t due = 0;
  floor_node* prev = nullptr;
  floor_node* next = nullptr;
  user_task task{};
};
struct floor_list {
  std::mutex mtx;
  floor_node head;
  floor_list() { head.prev = head.next = &head; }
};
struct floor_handle {
  floor_node* p = nullptr;
  floor_list* l = nullptr;
  bool cancel() noexcept {
    int pending = 0;
    if (!p->state.compare_exchange_strong(pending, 1, std::memory_order_acq_rel)) return false;
    std::lock_guard lk(l->mtx);
    p->prev->next = p->next;
    p->next->prev = p->prev;
    return true;
  }
};

metrics cancel_floor(long n) {
  return cancel_common(n, [&](results& r, metrics& m, double base) {
    floor_list timers;
    // Untouched memory, as a fresh allocation is: its pages are faulted in while timing.
    std::unique_ptr<unsigned char[]> arena(new unsigned char[sizeof(floor_node) * static_cast<std::size_t>(n)]);
    long next = 0;
    cancel_handles<floor_handle>(n, r, m, base, [&](user_task t) {
      auto* p = ::new (arena.get() + sizeof(floor_node) * static_cast<std::size_t>(next++)) floor_node{};
      p->due = now_ns() + std::chrono::nanoseconds(60s).count();
      p->task = t;
      std::lock_guard lk(timers.mtx);
      p->prev = &timers.head;
      p->next = timers.head.next;
      timers.head.next->prev = p;
      timers.head.next = p;
      return floor_handle{p, &timers};
    });
    check(timers.head.next == &timers.head, "timeout-cancel: the floor's list is not empty");
  });
}

template <class Context>
metrics cancel_asio(const options& o, long n) {
  return cancel_common(n, [&](results& r, metrics& m, double base) {
    Context ctx(o.threads);
    counter aborted(n);
    std::vector<std::optional<asio::steady_timer>> timers(static_cast<std::size_t>(n));
    auto start = clock::now();
    for (long i = 0; i < n; ++i)
      timers[i].emplace(ctx.get_executor(), 60s).async_wait(asio_timer_handler{user_task{&r, i}, &aborted});
    m["schedule Mops/s"] = static_cast<double>(n) / seconds_since(start) / 1e6;
    m["held MiB"] = heap_in_use_mib() - base;
    start = clock::now();
    for (auto& t : timers) t->cancel();
    m["cancel Mops/s"] = static_cast<double>(n) / seconds_since(start) / 1e6;
    aborted.wait(); // each cancelled wait's handler runs with operation_aborted, freeing it
    timers.clear();
    timers.shrink_to_fit();
    ctx.join();
  });
}

// ------------------------------------------------------------ accuracy
// 2,000 timers due at random 1-50 ms after one start time, on an otherwise idle pool.
constexpr long accuracy_n = 2000;

template <class Schedule>
metrics accuracy_common(Schedule schedule) {
  auto delays = random_delays_ns(accuracy_n, 1000, 50000, 777);
  std::vector<std::int64_t> due(static_cast<std::size_t>(accuracy_n));
  results r(accuracy_n);
  schedule(r, delays, due);
  metrics m;
  add_lateness(m, r, due);
  return m;
}

metrics accuracy_pool(const options& o) {
  return accuracy_common([&](results& r, auto& delays, auto& due) {
    metronome::scheduled_thread_pool pool(static_cast<std::size_t>(o.threads));
    auto start = clock::now();
    for (long i = 0; i < accuracy_n; ++i) {
      auto when = start + std::chrono::nanoseconds(delays[i]);
      due[i] = when.time_since_epoch().count();
      pool.schedule_at(user_task{&r, i}, when);
    }
    r.wait_all();
  });
}

metrics accuracy_wheel(const options& o) {
  return accuracy_common([&](results& r, auto& delays, auto& due) {
    metronome::scheduled_thread_pool pool(static_cast<std::size_t>(o.threads));
    metronome::wheel_timer wheel(pool);
    auto start = clock::now();
    for (long i = 0; i < accuracy_n; ++i) {
      auto when = start + std::chrono::nanoseconds(delays[i]);
      due[i] = when.time_since_epoch().count();
      wheel.schedule(user_task{&r, i}, when - clock::now()); // the wheel takes delays only
    }
    r.wait_all();
  });
}

template <class Context>
metrics accuracy_asio(const options& o) {
  return accuracy_common([&](results& r, auto& delays, auto& due) {
    Context ctx(o.threads);
    std::vector<std::optional<asio::steady_timer>> timers(static_cast<std::size_t>(accuracy_n));
    auto start = clock::now();
    for (long i = 0; i < accuracy_n; ++i) {
      auto when = start + std::chrono::nanoseconds(delays[i]);
      due[i] = when.time_since_epoch().count();
      timers[i].emplace(ctx.get_executor(), when).async_wait(asio_timer_handler{user_task{&r, i}, nullptr});
    }
    r.wait_all();
    ctx.join();
  });
}

// ------------------------------------------------------------ periodic
// A fixed-rate task every 5 ms (drift of each run from its ideal time), then a fixed-delay
// task every 5 ms after a 1 ms body (how many runs fit). Each run writes its time into
// the next slot and bumps the counter.
constexpr auto period = 5ms;

struct periodic_task {
  std::vector<std::int64_t>* slots;
  std::atomic<long>* runs;
  void operator()() const noexcept {
    long i = runs->fetch_add(1, std::memory_order_acq_rel);
    if (i < static_cast<long>(slots->size())) (*slots)[static_cast<std::size_t>(i)] = now_ns();
  }
};

std::chrono::milliseconds periodic_span(const options& o) { return o.quick ? 200ms : 2s; }

metrics periodic_metrics(const std::vector<std::int64_t>& slots, long runs, std::int64_t first_ns, long fd_runs) {
  double max_drift = 0, end_drift = 0;
  const long n = std::min(runs, static_cast<long>(slots.size()));
  for (long i = 0; i < n; ++i) {
    double d = static_cast<double>(slots[i] - (first_ns + std::chrono::nanoseconds(period).count() * i)) / 1e6;
    max_drift = std::max(max_drift, d);
    end_drift = d;
  }
  return {{"end drift ms", end_drift},
          {"max drift ms", max_drift},
          {"fixed-rate runs", static_cast<double>(runs)},
          {"fixed-delay runs", static_cast<double>(fd_runs)}};
}

metrics periodic_pool(const options& o) {
  const auto span = periodic_span(o);
  std::vector<std::int64_t> slots(static_cast<std::size_t>(span / period + 100));
  std::atomic<long> runs{0}, fd_runs{0};
  metronome::scheduled_thread_pool pool(static_cast<std::size_t>(o.threads));
  auto first = now_ns() + std::chrono::nanoseconds(period).count();
  auto h = pool.schedule_at_fixed_rate(periodic_task{&slots, &runs}, period, period);
  std::this_thread::sleep_for(span);
  h.cancel();
  h.wait();
  std::vector<std::int64_t> fd_slots(slots.size());
  auto fd = pool.schedule_with_fixed_delay(
      [t = periodic_task{&fd_slots, &fd_runs}] {
        std::this_thread::sleep_for(1ms);
        t();
      },
      0ms, period);
  std::this_thread::sleep_for(span);
  fd.cancel();
  fd.wait();
  return periodic_metrics(slots, runs.load(), first, fd_runs.load());
}

template <class Context>
metrics periodic_asio(const options& o) {
  const auto span = periodic_span(o);
  std::vector<std::int64_t> slots(static_cast<std::size_t>(span / period + 100));
  std::atomic<long> runs{0}, fd_runs{0};
  Context ctx(o.threads);
  asio::steady_timer timer(ctx.get_executor()), fd_timer(ctx.get_executor());
  std::promise<void> rate_done;
  const auto first = clock::now() + period;
  const auto stop_at = clock::now() + span;
  std::function<void(boost::system::error_code)> tick = [&,
                                                         t = periodic_task{&slots, &runs}](boost::system::error_code) {
    t();
    if (clock::now() >= stop_at) return rate_done.set_value();
    timer.expires_at(timer.expiry() + period);
    timer.async_wait(tick);
  };
  timer.expires_at(first);
  timer.async_wait(tick);
  rate_done.get_future().wait();
  // Fixed delay: re-armed from the end of a 1 ms body.
  std::vector<std::int64_t> fd_slots(slots.size());
  const auto fd_stop = clock::now() + span;
  std::function<void(boost::system::error_code)> fd_tick =
      [&, t = periodic_task{&fd_slots, &fd_runs}](boost::system::error_code) {
        if (clock::now() >= fd_stop) return;
        std::this_thread::sleep_for(1ms);
        t();
        fd_timer.expires_after(period);
        fd_timer.async_wait(fd_tick);
      };
  fd_timer.expires_after(0ms);
  fd_timer.async_wait(fd_tick);
  ctx.join(); // the chain ends by itself at fd_stop
  return periodic_metrics(slots, runs.load(), first.time_since_epoch().count(), fd_runs.load());
}

template <class Fn>
side metronome_side(const std::string& name, Fn fn) {
  return {name, false, fn};
}

} // namespace

void add_timer_cases(std::vector<bench_case>& out, const options& o) {
  const std::vector<long> sizes = o.quick ? std::vector<long>{10000} : std::vector<long>{10000, 100000, 1000000};
  for (long n : sizes)
    out.push_back({"timers-fire/" + count_label(n),
                   {metronome_side("metronome pool", [=] { return fire_pool(o, n); }),
                    metronome_side("metronome wheel", [=] { return fire_wheel(o, n); }),
                    {asio_io_threads::name, true, [=] { return fire_asio<asio_io_threads>(o, n); }},
                    {asio_pool::name, true, [=] { return fire_asio<asio_pool>(o, n); }}}});
  for (long n : sizes)
    out.push_back({"timeout-cancel/" + count_label(n),
                   {metronome_side("metronome pool", [=] { return cancel_pool(o, n); }),
                    metronome_side("metronome wheel", [=] { return cancel_wheel(o, n); }),
                    {"floor: a clock read, a node, a lock around an O(1) link", false, [=] { return cancel_floor(n); }},
                    {asio_io_threads::name, true, [=] { return cancel_asio<asio_io_threads>(o, n); }},
                    {asio_pool::name, true, [=] { return cancel_asio<asio_pool>(o, n); }}}});
  out.push_back({"accuracy",
                 {metronome_side("metronome pool", [=] { return accuracy_pool(o); }),
                  metronome_side("metronome wheel", [=] { return accuracy_wheel(o); }),
                  {asio_io_threads::name, true, [=] { return accuracy_asio<asio_io_threads>(o); }},
                  {asio_pool::name, true, [=] { return accuracy_asio<asio_pool>(o); }}}});
  out.push_back({"periodic",
                 {metronome_side("metronome pool", [=] { return periodic_pool(o); }),
                  {asio_io_threads::name, true, [=] { return periodic_asio<asio_io_threads>(o); }},
                  {asio_pool::name, true, [=] { return periodic_asio<asio_pool>(o); }}}});
}

} // namespace bench
