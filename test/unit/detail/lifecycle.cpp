// lifecycle alone: a pool's phase, its ending flags and the rules the engine asks of them
// (src/lifecycle.hpp).
#include "lifecycle.hpp"

#include <boost/test/unit_test.hpp>

using metronome::detail::lifecycle;

namespace {
lifecycle::outstanding nothing() { return {false, false, false, false}; }
} // namespace

BOOST_AUTO_TEST_SUITE(lifecycle_suite)

// running -> shutdown -> stop, never back: asking for shutdown after stop stays stopped.
BOOST_AUTO_TEST_CASE(the_phase_only_moves_forward) {
  lifecycle l;
  BOOST_TEST(l.at_least(lifecycle::running));
  BOOST_TEST(!l.at_least(lifecycle::shutdown));
  l.advance_to(lifecycle::stop);
  BOOST_TEST(l.at_least(lifecycle::shutdown));
  BOOST_TEST(l.at_least(lifecycle::stop));
  l.advance_to(lifecycle::shutdown); // close() after shutdown_now()
  BOOST_TEST(l.at_least(lifecycle::stop));
  lifecycle m;
  m.advance_to(lifecycle::shutdown);
  BOOST_TEST(m.at_least(lifecycle::shutdown));
  BOOST_TEST(!m.at_least(lifecycle::stop));
}

// Termination is a bit beside the phase: set from any phase, taken back without touching
// the phase.
BOOST_AUTO_TEST_CASE(termination_is_beside_the_phase_and_can_be_taken_back) {
  lifecycle l;
  l.set_terminated(); // join() of a running pool
  BOOST_TEST(l.terminated());
  BOOST_TEST(!l.at_least(lifecycle::shutdown));
  l.take_back_termination();
  BOOST_TEST(!l.terminated());
  l.advance_to(lifecycle::shutdown);
  l.set_terminated();
  l.take_back_termination();
  BOOST_TEST(l.at_least(lifecycle::shutdown));
  BOOST_TEST(!l.terminated());
}

// Typed work is refused after shutdown and after termination; a post after shutdown
// only from outside with no accepted work behind it, and every post once stopped.
BOOST_AUTO_TEST_CASE(what_a_pool_still_accepts) {
  lifecycle l;
  BOOST_TEST(!l.refuses_new_work());
  BOOST_TEST(!l.refuses_post(false, false));
  l.set_terminated();
  BOOST_TEST(l.refuses_new_work()); // a joined pool that ran out of work
  l.take_back_termination();
  l.advance_to(lifecycle::shutdown);
  BOOST_TEST(l.refuses_new_work());
  BOOST_TEST(l.refuses_post(false, false));
  BOOST_TEST(!l.refuses_post(true, false)); // from the pool's own threads
  BOOST_TEST(!l.refuses_post(false, true)); // a strand's invoker
  l.advance_to(lifecycle::stop);
  BOOST_TEST(l.refuses_post(true, false));
  BOOST_TEST(l.refuses_post(false, true));
  BOOST_TEST(l.refuses_post(true, true));
}

// A periodic task runs again while running; after shutdown only when the options keep
// periodic work; never once stopped or being destroyed.
BOOST_AUTO_TEST_CASE(when_a_periodic_task_runs_again) {
  lifecycle l;
  BOOST_TEST(!l.ends_periodic(false));
  l.advance_to(lifecycle::shutdown);
  BOOST_TEST(l.ends_periodic(false));
  BOOST_TEST(!l.ends_periodic(true));
  lifecycle closing;
  closing.closing = true;
  BOOST_TEST(closing.ends_periodic(true));
  lifecycle stopped;
  stopped.advance_to(lifecycle::stop);
  BOOST_TEST(stopped.ends_periodic(true));
}

// Idle workers look for the termination only after shutdown or during join().
BOOST_AUTO_TEST_CASE(who_looks_for_the_termination) {
  lifecycle l;
  BOOST_TEST(!l.seeks_termination());
  l.closing = true; // close() asks for shutdown itself
  BOOST_TEST(!l.seeks_termination());
  l.joining = true;
  BOOST_TEST(l.seeks_termination());
  lifecycle m;
  m.advance_to(lifecycle::shutdown);
  BOOST_TEST(m.seeks_termination());
}

// The termination rule, one reason at a time: queued work and undelivered wheel waits
// always keep the pool; a hand-over keeps it unless stopped or closed from inside;
// tracked work keeps a running pool (a join() waits for it) but not one shut down or
// being destroyed.
BOOST_AUTO_TEST_CASE(what_keeps_a_pool_from_terminating) {
  lifecycle running;
  BOOST_TEST(running.may_terminate(nothing()));
  auto with = [](bool lifecycle::outstanding::*reason) {
    lifecycle::outstanding o = nothing();
    o.*reason = true;
    return o;
  };
  const auto queued = with(&lifecycle::outstanding::queued);
  const auto wheel = with(&lifecycle::outstanding::wheel_waits);
  const auto hand = with(&lifecycle::outstanding::hand_overs);
  const auto tracked = with(&lifecycle::outstanding::tracked_work);

  BOOST_TEST(!running.may_terminate(queued));
  BOOST_TEST(!running.may_terminate(wheel));
  BOOST_TEST(!running.may_terminate(hand));
  BOOST_TEST(!running.may_terminate(tracked));

  lifecycle shut;
  shut.advance_to(lifecycle::shutdown);
  BOOST_TEST(!shut.may_terminate(queued));
  BOOST_TEST(!shut.may_terminate(wheel));
  BOOST_TEST(!shut.may_terminate(hand));
  BOOST_TEST(shut.may_terminate(tracked));

  lifecycle stopped;
  stopped.advance_to(lifecycle::stop);
  BOOST_TEST(!stopped.may_terminate(queued));
  BOOST_TEST(!stopped.may_terminate(wheel));
  BOOST_TEST(stopped.may_terminate(hand));
  BOOST_TEST(stopped.may_terminate(tracked));

  lifecycle closed_inside; // the destructor, from one of the pool's tasks
  closed_inside.closing = true;
  closed_inside.closer_in_pool = true;
  BOOST_TEST(closed_inside.may_terminate(hand));
  BOOST_TEST(closed_inside.may_terminate(tracked));
  BOOST_TEST(!closed_inside.may_terminate(queued));

  lifecycle closed_outside;
  closed_outside.closing = true;
  BOOST_TEST(!closed_outside.may_terminate(hand));
  BOOST_TEST(closed_outside.may_terminate(tracked));

  lifecycle joined; // join() without shutdown: tracked work still keeps it
  joined.joining = true;
  BOOST_TEST(!joined.may_terminate(tracked));
  BOOST_TEST(joined.may_terminate(nothing()));
}

BOOST_AUTO_TEST_SUITE_END()
