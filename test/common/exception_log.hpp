#ifndef METRONOME_TEST_EXCEPTION_LOG_HPP
#define METRONOME_TEST_EXCEPTION_LOG_HPP

#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace metronome::test {

// An exception handler for pools and wheels that records what it receives.
class exception_log {
public:
  std::function<void(std::exception_ptr)> handler() {
    return [this](std::exception_ptr e) {
      std::lock_guard lk(m_);
      seen_.push_back(std::move(e));
    };
  }
  // what() of each exception received, in order; "null" for a null pointer.
  std::vector<std::string> messages() {
    std::lock_guard lk(m_);
    std::vector<std::string> out;
    for (const auto& e : seen_) {
      if (!e) {
        out.emplace_back("null");
        continue;
      }
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        out.emplace_back(x.what());
      } catch (...) {
        out.emplace_back("non-std");
      }
    }
    return out;
  }
  std::size_t count() {
    std::lock_guard lk(m_);
    return seen_.size();
  }
  // Every report carried an exception with this message.
  bool all_are(const char* what) {
    std::lock_guard lk(m_);
    for (auto& e : seen_) {
      if (!e) return false;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        if (std::strcmp(ex.what(), what) != 0) return false;
      } catch (...) {
        return false;
      }
    }
    return true;
  }

private:
  std::mutex m_;
  std::vector<std::exception_ptr> seen_;
};

} // namespace metronome::test

#endif
