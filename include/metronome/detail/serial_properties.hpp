// The Asio properties a serial_executor takes as preferences that change nothing in it.
#ifndef METRONOME_DETAIL_SERIAL_PROPERTIES_HPP
#define METRONOME_DETAIL_SERIAL_PROPERTIES_HPP

#include <metronome/detail/asio.hpp>

#include <type_traits>

namespace metronome::detail {

template <class P>
struct is_allocator_property : std::false_type {};
template <class A>
struct is_allocator_property<net::execution::allocator_t<A>> : std::true_type {};

// Properties a serial executor accepts as preferences and that change nothing in it.
template <class P>
concept serial_neutral_property = std::is_same_v<P, net::execution::relationship_t::fork_t> ||
                                  std::is_same_v<P, net::execution::relationship_t::continuation_t> ||
                                  is_allocator_property<P>::value;

} // namespace metronome::detail

#endif
