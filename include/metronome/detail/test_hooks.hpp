// Test hooks at the engine's hand-over points (only with METRONOME_TEST_HOOKS).
#ifndef METRONOME_DETAIL_TEST_HOOKS_HPP
#define METRONOME_DETAIL_TEST_HOOKS_HPP

// Test-only hooks at the hand-over points between threads (docs/design.md lists each
// protocol and its invariant). A test installs a function that stops the calling thread
// exactly there (or yields at random: the chaos mode) and checks that nothing is lost.
// Compiled in only when the library is built with METRONOME_TEST_HOOKS (the project's
// own test builds); otherwise every hook is an empty statement.
//
// Why a user's translation unit includes it: three hand-overs live in header templates
// (cancel_after's emission, a bound task's dispatch, a handle's waits), instantiated
// there; without METRONOME_TEST_HOOKS this header adds an enum and an empty macro.

#include <atomic>

namespace metronome::detail {

enum class hook_point {
  producer_after_push,    // a task is in the ready queue; the producer has not checked for termination
  producer_before_wake,   // ... nor looked for sleepers
  worker_before_park,     // a worker stopped spinning and is about to take the mutex to park
  owed_drain_before_post, // due serial tasks are queued; their drains not yet posted
  serial_after_push,      // a serial task is linked, its count not yet raised
  serial_before_settle,   // a drain ran its tasks and is about to lower the count
  serial_before_repost,   // a drain ran a full batch and is about to re-post itself
  worker_after_unpark,    // a worker left park() with work (a leader: after promoting), mutex released
  handle_before_anchor,   // a handle's cancel() won its task (callable not destroyed, completions not delivered); delay() is about to lock its pool's anchor
  handle_before_completions, // a cancel() on a manual clock took its task out of the heap; its completions not yet delivered
  wheel_producer_before_lock, // a wheel producer computed its deadline tick; the mutex not yet tried
  wheel_producer_before_push, // a wheel producer found the mutex taken; its timeout is not in the inbox yet
  wheel_producer_after_push,  // ... it is in the inbox; the producer has not read the timer's deadline
  wheel_timer_before_sleep,   // a tick (holding the wheel's mutex) chose its deadline, not yet published
  worker_terminating,         // a worker (holding the mutex) set the termination, not yet re-checked the ready queue
  wheel_cancel_after_claim,   // a cancel() claimed a timeout queued on the executor; not yet dropped it
  worker_woken_by_termination, // a parked worker woke (holding the mutex) in a terminated pool, looked at nothing yet
  wheel_handover_after_unlock, // a cancel()/reset() let go of the wheel's mutex; its due timeouts not yet handed over
  worker_after_idle_point,     // the last awake worker (manual clock: auto-advance or a wait_idle() waiter) let the clock decide; mutex not re-taken
  delayed_submit_before_lock,  // a delayed task is about to be pushed into the heap; the pool mutex not yet taken
  worker_after_take,           // a worker took a task from a queue and has not started it
  submit_before_push,          // a typed task due now passed the shutdown check; not in the ready queue yet
  task_before_closing_waits,   // a task ended (terminal); its list of async_waits not yet taken
  wait_hook_before_flag,       // an async_wait about to flag its task (has_waiters) and list itself
  wait_removed_before_abort,   // a cancellation took an async_wait out of its task's list; not completed yet
  cancel_after_emitting,       // cancel_after's timeout holds its emission lock; not emitted yet
  ready_push_before_link,      // a producer exchanged the ready queue's tail; its node not yet linked
  hosted_drive_before_arm,     // a host thread drove a hosted core and read its head; the timer not yet armed
  hosted_drive_before_idle,    // ... armed it; the drive not yet marked idle
  reactor_before_wait,         // a worker took the reactor role and let go of the pool mutex; not in epoll yet
  wheel_tick_after_unlock,     // a wheel's tick let go of the wheel's mutex; its due timeouts not yet handed over
  wheel_destroy_after_tick_look, // a wheel's destructor looked at its tick (under the mutex) and let go of both; not retired yet
  wait_before_lock,            // a timed wait (async_delay, a wheel's tick) passed the termination check; pool mutex not taken
  completion_before_wake,      // a completion ended elsewhere is in its pool's ready queue, in transit; nobody woken yet
  wheel_lateness_between_reads, // a wheel timeout about to run read its wheel's tick, not yet its start time
  close_before_discard,        // the pool's destructor took its delayed tasks out (in transit), mutex released; not ended yet
  bound_before_dispatch,       // a worker took a bound task (still pending) and is about to dispatch it to its executor
  bound_before_reschedule,     // a bound periodic task's run ended on its executor; its pool not yet looked up
  bound_dispatch_returned,     // a dispatch of a bound task returned; the dispatcher's copies of the executor still held
  bound_run_before_leaving,    // a bound periodic task's run was rescheduled or ended (in transit); the pool not yet let go
  reactor_in_poll,             // a busy worker took the reactor role to poll it (mutex released); not polled yet
  reactor_after_poll,          // ... polled it and gave the role back (mutex released); not back to its tasks yet
  follower_before_wait,        // a parking worker holds the mutex, counted as a follower; not waiting yet
  outside_post_before_push,    // a thread outside the pool passed post()'s shutdown check (a strand's invoker, say); not queued yet
  cancel_before_removal,       // a cancel() delivered its task's completions; the task not yet taken out of the delay queue
  wheel_cancel_before_release, // a cancel() took a timeout out of the wheel and dropped it; the wheel's reference not yet let go
  wheel_cancel_after_withdraw, // a cancel() took the last timeout out and withdrew the tick; sleeping_until_ not yet reset
  runner_error_kept,           // a task's runner kept its run's exception (callable destroyed); the task not yet done
  leader_before_wait,          // a parking worker holds the mutex as the leader (timing the heap's head); not waiting yet
  reschedule_before_lock,      // a periodic run's end read the time and computed the next due time; pool mutex not taken
  outside_push_after_clock,    // a push from outside asked the auto-advancing clock (it may have jumped); pool mutex not re-taken
  owed_drain_after_post,       // due serial tasks' drains are posted; their transit not yet left
  elastic_before_retire,       // an elastic thread timed out (holding the mutex, still counted parked) and gave its place back; not left the parking lot yet
  producer_before_wake_lock,   // a producer saw someone parking (without the mutex); the mutex not yet taken to wake them
  reap_before_join,            // a producer growing the pool holds the mutex and found an exited elastic thread; not joined yet
  worker_after_exit,           // a worker leaving its pool marked itself exited and let go of the mutex; not asked the clock (if it does) nor returned
  join_before_threads,         // join() saw the pool terminated and let go of the mutex; its threads not yet taken to be joined
  clock_before_tell,           // a manual clock's advance named a listener as the one it calls and let go of the clock's mutex; not called yet
  clock_deciding,              // a manual clock's decision (auto-advance, wait_idle()) holds the clock's mutex; nothing asked yet
  wheel_stop_before_detach,    // the stop() that stopped a wheel delivered what it took; the wheel not yet detached from its pool
  wheel_wait_read_pool,        // a wheel wait counted its use of the pool and read it; not yet counted on it nor inserted
  wheel_touch_after_unlock,    // a wheel's tick walking the next tick's timeouts ahead let go of the mutex between groups
};

using hook_function = void (*)(hook_point);

#if defined(METRONOME_TEST_HOOKS)
extern std::atomic<hook_function> test_hook;
#define METRONOME_TEST_HOOK(point)                                                                                    \
  do {                                                                                                                \
    if (::metronome::detail::hook_function metronome_hook_ =                                                         \
            ::metronome::detail::test_hook.load(std::memory_order_acquire))                                           \
      metronome_hook_(::metronome::detail::point);                                                                    \
  } while (false)
#else
#define METRONOME_TEST_HOOK(point)                                                                                    \
  do {                                                                                                                \
  } while (false)
#endif

} // namespace metronome::detail

#endif
