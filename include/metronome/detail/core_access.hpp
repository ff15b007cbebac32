// How the library's internals reach the engine behind a public object (a pool's
// pool_core, a wheel's wheel_core): the one friend of the public classes.
#ifndef METRONOME_DETAIL_CORE_ACCESS_HPP
#define METRONOME_DETAIL_CORE_ACCESS_HPP

namespace metronome::detail {

struct core_access {
  template <class Public>
  static auto& core(Public& p) noexcept {
    return *p.core_;
  }
  // A serial executor's queue drain (serial_core, detail/serial_core.hpp).
  template <class Serial>
  static auto& serial_state(const Serial& s) noexcept {
    return *s.state_;
  }
};

} // namespace metronome::detail

#endif
