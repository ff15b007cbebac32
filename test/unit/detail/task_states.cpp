// The task state table (include/metronome/detail/scheduled_task.hpp, above
// scheduled_task_base): every state x event, on a real task node of a real pool. Each
// transition the table allows happens, with the next state it names; every other
// pair is refused (false) and changes nothing.
#include <metronome/detail/pool_of.hpp>
#include <metronome/detail/scheduled_task.hpp>
#include <metronome/scheduled_thread_pool.hpp>

#include <metronome/detail/asio.hpp>
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <optional>
#include <string>

using metronome::detail::scheduled_task_base;
using metronome::detail::task_kind;

namespace {

enum class from { pending, running, running_cancel_requested, done, cancelled };
enum class event { try_start, try_rearm, finish_cancelled, begin_cancel, cancel };
enum class kind { one_shot, periodic };

const char* name(from f) {
  constexpr const char* n[] = {"pending", "running", "running + cancel_requested", "done", "cancelled"};
  return n[static_cast<int>(f)];
}
const char* name(event e) {
  constexpr const char* n[] = {"try_start", "try_rearm", "finish_cancelled", "begin_cancel", "cancel"};
  return n[static_cast<int>(e)];
}

// What a task looks like from outside: its phase and the flags the table speaks of.
struct look {
  std::uint32_t phase;
  bool cancel_requested;
  bool terminal;
  bool cancelled;
  bool operator==(const look&) const = default;
};
look look_at(const scheduled_task_base& t) {
  return {t.phase(), t.cancel_was_requested(), t.is_terminal(), t.is_cancelled()};
}
constexpr look pending_look{scheduled_task_base::pending, false, false, false};
constexpr look running_look{scheduled_task_base::running, false, false, false};
constexpr look cancel_requested_look{scheduled_task_base::running, true, false, false};
constexpr look done_look{scheduled_task_base::done, false, true, false};
constexpr look cancelled_look{scheduled_task_base::cancelled, false, true, true};

look look_of(from f) {
  constexpr look looks[] = {pending_look, running_look, cancel_requested_look, done_look, cancelled_look};
  return looks[static_cast<int>(f)];
}

// The allowed cells of the table, and the state each leads to. try_rearm is the periodic
// runner's (a one-shot runner never calls it); running + cancel_requested exists for
// periodic tasks only.
struct allowed {
  from f;
  event e;
  std::optional<kind> only; // none: both kinds
  look to;
};
constexpr allowed table[] = {
    {from::pending, event::try_start, {}, running_look},
    {from::pending, event::finish_cancelled, {}, cancelled_look},
    {from::pending, event::begin_cancel, {}, cancelled_look},
    {from::pending, event::cancel, {}, cancelled_look},
    {from::running, event::try_rearm, kind::periodic, pending_look},
    {from::running, event::finish_cancelled, {}, cancelled_look},
    {from::running, event::cancel, kind::periodic, cancel_requested_look},
    {from::running_cancel_requested, event::finish_cancelled, kind::periodic, cancelled_look},
};

const allowed* find(from f, event e, kind k) {
  for (const allowed& a : table)
    if (a.f == f && a.e == e && (!a.only || *a.only == k)) return &a;
  return nullptr;
}

// A task node as the pool makes it, not queued anywhere; bound to an io_context's
// executor when `bound`.
template <bool Bound>
scheduled_task_base* make_task(metronome::scheduled_thread_pool& pool, metronome::net::io_context& io, kind k) {
  const task_kind tk = k == kind::periodic ? task_kind::periodic : task_kind::one_shot;
  if constexpr (Bound) {
    auto f = metronome::net::bind_executor(io.get_executor(), [] {});
    return metronome::detail::make_scheduled_task<void, false, true>(&metronome::detail::pool_of(pool), f, tk);
  } else {
    return metronome::detail::make_scheduled_task<void, false, false>(&metronome::detail::pool_of(pool), [] {}, tk);
  }
}

// Brings a fresh task to `f` through allowed transitions only.
void bring_to(scheduled_task_base& t, from f) {
  switch (f) {
  case from::pending:
    break;
  case from::running:
    BOOST_REQUIRE(t.try_start());
    break;
  case from::running_cancel_requested:
    BOOST_REQUIRE(t.try_start());
    BOOST_REQUIRE(t.cancel());
    break;
  case from::done:
    BOOST_REQUIRE(t.try_start());
    t.finish();
    break;
  case from::cancelled:
    BOOST_REQUIRE(t.cancel());
    break;
  }
}

bool apply(scheduled_task_base& t, event e) {
  switch (e) {
  case event::try_start:
    return t.try_start();
  case event::try_rearm:
    return t.try_rearm();
  case event::finish_cancelled:
    return t.finish_cancelled();
  case event::begin_cancel: {
    std::uint32_t old = 0;
    if (!t.begin_cancel(old)) return false;
    t.complete_cancel(old);
    return true;
  }
  case event::cancel:
    return t.cancel();
  }
  return false;
}

template <bool Bound>
void walk(int& allowed_seen, int& refused_seen) {
  metronome::scheduled_thread_pool pool(1);
  metronome::net::io_context io;
  for (kind k : {kind::one_shot, kind::periodic}) {
    for (from f : {from::pending, from::running, from::running_cancel_requested, from::done, from::cancelled}) {
      if (f == from::running_cancel_requested && k == kind::one_shot) continue; // no such state
      for (event e : {event::try_start, event::try_rearm, event::finish_cancelled, event::begin_cancel, event::cancel}) {
        if (e == event::try_rearm && k == kind::one_shot) continue; // not an event of a one-shot
        scheduled_task_base* t = make_task<Bound>(pool, io, k);
        bring_to(*t, f);
        const look before = look_at(*t);
        BOOST_TEST((before == look_of(f)), name(f) << ": not reached");
        const bool accepted = apply(*t, e);
        const look after = look_at(*t);
        const std::string where = std::string(k == kind::periodic ? "periodic" : "one-shot") + (Bound ? ", bound" : "") +
                                  ": " + name(f) + " x " + name(e);
        if (const allowed* a = find(f, e, k)) {
          ++allowed_seen;
          BOOST_TEST(accepted, where << ": refused, the table allows it");
          BOOST_TEST((after == a->to), where << ": not the state the table names");
        } else {
          ++refused_seen;
          BOOST_TEST(!accepted, where << ": accepted, the table refuses it");
          BOOST_TEST((after == before), where << ": a refusal changed the state");
        }
        t->release();
      }
    }
  }
}

} // namespace

BOOST_AUTO_TEST_SUITE(task_states)

BOOST_AUTO_TEST_CASE(every_transition_of_the_task_state_table) {
  int allowed_seen = 0;
  int refused_seen = 0;
  walk<false>(allowed_seen, refused_seen);
  // A bound task's cancel() passes through settling: cancel() returns once it is done.
  walk<true>(allowed_seen, refused_seen);
  // Every allowed cell was walked, for each kind it applies to, plain and bound.
  BOOST_TEST(allowed_seen == 2 * 13); // pending 4 x 2 kinds, running 1 + 2 + 1, running + cancel_requested 1
  BOOST_TEST(refused_seen > allowed_seen);
}

BOOST_AUTO_TEST_SUITE_END()
