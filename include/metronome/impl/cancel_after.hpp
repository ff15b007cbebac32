// cancel_after's completion-token adapters as Asio sees them: the async_result
// specialisations of cancel_after_t and partial_cancel_after (included by
// <metronome/cancel_after.hpp>).
#ifndef METRONOME_IMPL_CANCEL_AFTER_HPP
#define METRONOME_IMPL_CANCEL_AFTER_HPP

#include <type_traits>
#include <utility>

namespace METRONOME_NET_NAMESPACE {

template <class CompletionToken, class Timing, class... Signatures>
struct async_result<metronome::cancel_after_t<CompletionToken, Timing>, Signatures...> {
  template <class Initiation, class RawToken, class... Args>
  static auto initiate(Initiation&& initiation, RawToken&& token, Args&&... args) {
    return metronome::net::async_initiate<
        std::conditional_t<std::is_const_v<std::remove_reference_t<RawToken>>, const CompletionToken, CompletionToken>,
        Signatures...>(
        metronome::detail::initiate_cancel_after<std::decay_t<Initiation>, Timing>(
            std::forward<Initiation>(initiation), token.amount_, token.relative_, token.type_, token.timing_),
        token.token_, std::forward<Args>(args)...);
  }
};

// The partial form used as a completion token: adapts the operation's default token.
template <class Timing, class... Signatures>
struct async_result<metronome::partial_cancel_after<Timing>, Signatures...> {
  template <class Initiation, class RawToken, class... Args>
  static auto initiate(Initiation&& initiation, RawToken&& token, Args&&... args) {
    using default_token = default_completion_token_t<associated_executor_t<std::decay_t<Initiation>>>;
    static_assert(!std::is_void_v<default_token>,
                  "metronome::cancel_after(timeout) as a completion token needs a default completion token (Asio "
                  "1.31 and later, or an executor that names one); pass your token: cancel_after(timeout)(token)");
    metronome::cancel_after_t<default_token, Timing> adapted = token(default_token{});
    return metronome::net::async_initiate<metronome::cancel_after_t<default_token, Timing>, Signatures...>(
        std::forward<Initiation>(initiation), adapted, std::forward<Args>(args)...);
  }
};

} // namespace METRONOME_NET_NAMESPACE

#endif
