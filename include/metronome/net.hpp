// The Asio metronome was built with, for code that must build with either (tests,
// examples, a library over metronome): metronome::net is boost::asio, or ::asio when
// the library was built with METRONOME_STANDALONE_ASIO; metronome::error_code and
// metronome::system_error are its error types. Every metronome header includes this.
// An Asio header of the same Asio: #include METRONOME_NET_HEADER(ip/tcp.hpp).
//
// Code that uses one Asio includes its own headers instead (<boost/asio.hpp>).
#ifndef METRONOME_NET_HPP
#define METRONOME_NET_HPP

#include <metronome/detail/asio.hpp>

/// Includes an Asio header of the Asio metronome was built with: `#include
/// METRONOME_NET_HEADER(ip/tcp.hpp)` is `<boost/asio/ip/tcp.hpp>` or `<asio/ip/tcp.hpp>`.
#define METRONOME_NET_HEADER(path) METRONOME_ASIO_HEADER(path) // NOLINT(bugprone-macro-parentheses): a path

#endif
