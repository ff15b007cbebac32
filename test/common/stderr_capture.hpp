#ifndef METRONOME_TEST_STDERR_CAPTURE_HPP
#define METRONOME_TEST_STDERR_CAPTURE_HPP

#include <cstdio>
#include <string>
#include <unistd.h>

namespace metronome::test {

// Sends what the process writes to stderr into a temporary file until take() (or the
// destructor) puts stderr back; take() returns what was written.
class stderr_capture {
public:
  stderr_capture() : file_(std::tmpfile()) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    if (file_) ::dup2(::fileno(file_), 2);
  }
  stderr_capture(const stderr_capture&) = delete;
  stderr_capture& operator=(const stderr_capture&) = delete;
  ~stderr_capture() {
    restore();
    if (file_) std::fclose(file_);
  }
  std::string take() {
    restore();
    std::string out;
    if (!file_) return out;
    std::rewind(file_);
    char buf[256];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, file_)) > 0;) out.append(buf, n);
    return out;
  }

private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::FILE* file_;
  int saved_ = -1;
};

} // namespace metronome::test

#endif
