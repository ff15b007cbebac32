#ifndef METRONOME_TEST_WAIT_BATCH_HPP
#define METRONOME_TEST_WAIT_BATCH_HPP

// Batches of asynchronous waits (async_delay, a wheel's async_wait) whose handlers run
// on a strand or serial executor, cancelled through their slots at once, later or
// never, with every handler's runs, result and destruction accounted for. Include
// after stress_rounds.hpp.

#include "common/stress_rounds.hpp"

#include <metronome/detail/asio.hpp>

#include <random>
#include <thread>
#include <vector>

namespace {

// Starts async_delay on `pool`: the `start` of launch_batch for the pool's own waits.
inline auto delay_on(scheduled_thread_pool& pool) {
  return [pex = pool.get_executor()](std::chrono::microseconds d, auto&& token) {
    metronome::async_delay(pex, d, std::forward<decltype(token)>(token));
  };
}


struct delay_state {
  net::cancellation_signal sig;
  std::atomic<int> calls{0};
  // Touched only on the handler's executor (serialised there).
  bool launched = false;
  bool emitted = false;
  bool emitted_before_completion = false;
  bool long_wait = false;
  error_code ec;
  slot s;
};

// Posts the launch of one wait to the handler's executor `hex`: `start(d, token)`
// begins it (async_delay, a wheel's async_wait); the wait, its cancellation slot and
// the emission of the signal all happen on `hex`, as Asio requires. The emission comes
// right behind the launch, later from a pool timer, or never (long waits are always
// cancelled). `launches_run` counts launches that have returned from `start`.
template <class HandlerExecutor, class Start>
void launch_delay(delay_state* st, scheduled_thread_pool& pool, HandlerExecutor hex, Start start, std::chrono::microseconds d,
                  int emit_mode, std::chrono::microseconds emit_after, metronome::test::counter& done,
                  std::atomic<int>& launches_run) {
  net::post(hex, [st, hex, start, d, emit_mode, emit_after, &pool, &done, &launches_run] {
    st->launched = true;
    start(d, net::bind_cancellation_slot(st->sig.slot(),
                                          net::bind_executor(hex, [l = life(&st->s), st, &done](error_code ec) {
                                            st->calls.fetch_add(1);
                                            st->ec = ec;
                                            st->emitted_before_completion = st->emitted;
                                            done.add();
                                          })));
    launches_run.fetch_add(1);
    auto emit = [st] {
      st->emitted = true;
      st->sig.emit(net::cancellation_type::terminal);
    };
    if (emit_mode == 0) {
      net::post(hex, emit);
    } else if (emit_mode == 1) {
      try {
        pool.schedule([hex, emit] { net::post(hex, emit); }, emit_after);
      } catch (const rejected_execution&) {
        net::post(hex, emit);
      }
    }
  });
}

struct delay_batch {
  std::vector<std::unique_ptr<delay_state>> states;
  metronome::test::counter done;
  std::atomic<int> launches_run{0};
};

template <class HandlerExecutor, class Start>
void launch_batch(delay_batch& b, scheduled_thread_pool& pool, HandlerExecutor hex, Start start, std::mt19937_64& rng, int n,
                  int shutdown_at = -1) {
  for (int i = 0; i < n; ++i) {
    if (i == shutdown_at) {
      // Let the handler's executor catch up (often it is then idle), so that the
      // launches posted from outside after shutdown() meet an idle executor.
      const auto limit = std::chrono::steady_clock::now() + 5s;
      while (b.launches_run.load() < i && std::chrono::steady_clock::now() < limit) std::this_thread::yield();
      pool.shutdown();
    }
    auto& st = b.states.emplace_back(std::make_unique<delay_state>());
    st->long_wait = rng() % 5 == 0;
    auto d = st->long_wait ? std::chrono::microseconds(3600s) : std::chrono::microseconds(rng() % 8 == 0 ? 0 : rng() % 2001);
    int mode = static_cast<int>(rng() % 3);
    if (st->long_wait && mode == 2) mode = 0;
    launch_delay(st.get(), pool, hex, start, d, mode, std::chrono::microseconds(rng() % 2001), b.done, b.launches_run);
  }
}

void check_delay_batch(delay_batch& b, errors& errs, bool shutdown_race) {
  int i = 0;
  for (auto& st : b.states) {
    ++i;
    if (!st->launched) {
      if (st->calls.load() != 0) errs.add(fmt("op %d: never launched but its handler ran", i));
      continue;
    }
    const int calls = st->calls.load();
    if (calls != 1) {
      errs.add(fmt("op %d (%s): handler ran %d times (want exactly 1)", i, st->long_wait ? "1 h wait" : "short wait",
                   calls));
      continue;
    }
    if (st->ec && st->ec != net::error::operation_aborted)
      errs.add(fmt("op %d: completed with %s", i, st->ec.message().c_str()));
    if (st->long_wait && st->ec != net::error::operation_aborted)
      errs.add(fmt("op %d: a cancelled 1 h wait completed with success", i));
    if (!shutdown_race && st->ec == net::error::operation_aborted && !st->emitted_before_completion)
      errs.add(fmt("op %d: completed with operation_aborted before any cancellation was emitted", i));
  }
}

void check_delay_lifetimes(delay_batch& b, errors& errs) {
  int i = 0;
  for (auto& st : b.states) {
    ++i;
    if (st->launched && st->s.destroyed.load() != 1)
      errs.add(fmt("op %d: completion handler destroyed %d times (want 1)", i, st->s.destroyed.load()));
  }
}


} // namespace

#endif
