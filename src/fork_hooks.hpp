// fork(): the process's one set of pthread_atfork hooks, over everything the library
// keeps with locks: wheels (their anchors' mutexes), pools (mutex, consumer lock), and
// the parking stripes of get()/wait(). Taken in that order before the fork - the order
// in which code nests them (a wheel hands timeouts to a pool under its mutex; a stripe
// is a leaf) - and given back in reverse; in the child each part forgets the parent's
// threads (docs/design.md, fork()).
#ifndef METRONOME_SRC_FORK_HOOKS_HPP
#define METRONOME_SRC_FORK_HOOKS_HPP

namespace metronome::detail {

// Registers the hooks once (every pool and wheel constructor calls it).
void ensure_fork_hooks() noexcept;

void wheels_prepare_fork() noexcept;
void wheels_parent_after_fork() noexcept;
void wheels_child_after_fork() noexcept;
void pools_prepare_fork() noexcept;
void pools_parent_after_fork() noexcept;
void pools_child_after_fork() noexcept;
void stripes_prepare_fork() noexcept;
void stripes_parent_after_fork() noexcept;
void stripes_child_after_fork() noexcept;

} // namespace metronome::detail

#endif
