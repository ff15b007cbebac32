#ifndef METRONOME_TEST_DEATH_HPP
#define METRONOME_TEST_DEATH_HPP

// Death tests for the rules debug builds assert: run a body in a forked child and tell
// whether the child died of SIGABRT (the assertion) rather than returning.

#include <csignal>
#include <cstdio>
#include <sys/wait.h>
#include <unistd.h>

namespace metronome::test {

// Runs `body` in a child process; true when the child died of SIGABRT. The child's
// stderr is closed (the assertion's message is expected) and SIGABRT restored to its
// default (not Boost.Test's handler); a body that returns makes the child exit with 0.
template <class F>
bool child_aborts(F body) {
  const pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    std::fclose(stderr);
    std::signal(SIGABRT, SIG_DFL);
    body();
    ::_exit(0);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return false;
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

} // namespace metronome::test

#endif
