// slot_handler: a completion handler wrapper with a cancellation slot of its own.
#ifndef METRONOME_DETAIL_SLOT_HANDLER_HPP
#define METRONOME_DETAIL_SLOT_HANDLER_HPP

#include <metronome/detail/asio.hpp>

#include <type_traits>
#include <utility>

namespace metronome::detail {

// Wraps the user's handler for an operation the library starts on the user's behalf
// (cancel_after's wrapped operation, interval's delay): the operation sees the
// cancellation slot the library owns (`Link::slot()`), and every other associator
// (executor, allocator, immediate executor...) of the user's handler. Invoking it calls
// `Link::complete(*this, args...)`, which finishes the library's side and invokes the
// user's handler (or starts the operation again with the wrapper). Link is moved with
// the wrapper and cleans up in its destructor if the wrapper is destroyed unrun.
template <class Handler, class Link>
class slot_handler {
public:
  slot_handler(Handler&& h, Link&& link) noexcept(std::is_nothrow_move_constructible_v<Handler> &&
                                                  std::is_nothrow_move_constructible_v<Link>)
      : handler_(std::move(h)), link_(std::move(link)) {}
  slot_handler(slot_handler&&) noexcept(std::is_nothrow_move_constructible_v<Handler> &&
                                         std::is_nothrow_move_constructible_v<Link>) = default;
  slot_handler& operator=(slot_handler&&) = delete;

  template <class... Args>
  void operator()(Args&&... args) {
    Link::complete(*this, std::forward<Args>(args)...);
  }

  const Handler& get() const noexcept { return handler_; }
  Handler& handler() noexcept { return handler_; }
  Link& link() noexcept { return link_; }
  net::cancellation_slot slot() const noexcept { return link_.slot(); }

private:
  Handler handler_;
  Link link_;
};

// Called by a metronome operation just before it clears the cancellation slot it took
// from the handler (handler_op): a slot_handler whose link owns that slot's signal
// (cancel_after) stops emitting first - and so does every one wrapped inside it: a
// cancel_after nested in another forwards its emission into the outer one's signal, the
// very slot being cleared. Nothing for any other handler.
// Asio's binders are looked through: `cancel_after(d2, bind_executor(strand,
// cancel_after(d1, cb)))` nests one adapter in the other as well.
template <class Handler>
void before_slot_clear(Handler&) noexcept {}
template <class Handler, class Link>
void before_slot_clear(slot_handler<Handler, Link>& h) noexcept {
  if constexpr (requires(Link& l) { l.before_slot_clear(); }) h.link().before_slot_clear();
  before_slot_clear(h.handler());
}
template <class Handler, class Executor>
void before_slot_clear(net::executor_binder<Handler, Executor>& h) noexcept {
  before_slot_clear(h.get());
}
template <class Handler, class Allocator>
void before_slot_clear(net::allocator_binder<Handler, Allocator>& h) noexcept {
  before_slot_clear(h.get());
}
template <class Handler, class Slot>
void before_slot_clear(net::cancellation_slot_binder<Handler, Slot>& h) noexcept {
  before_slot_clear(h.get());
}

} // namespace metronome::detail

// NOLINTNEXTLINE(modernize-concat-nested-namespaces): boost::asio, spelt by a macro
namespace METRONOME_NET_NAMESPACE {

template <template <class, class> class Associator, class Handler, class Link, class Default>
struct associator<Associator, metronome::detail::slot_handler<Handler, Link>, Default> {
  using type = typename Associator<Handler, Default>::type;
  static type get(const metronome::detail::slot_handler<Handler, Link>& h) noexcept {
    return Associator<Handler, Default>::get(h.get());
  }
  static auto get(const metronome::detail::slot_handler<Handler, Link>& h, const Default& d) noexcept
      -> decltype(Associator<Handler, Default>::get(h.get(), d)) {
    return Associator<Handler, Default>::get(h.get(), d);
  }
};

template <class Handler, class Link, class Slot>
struct associated_cancellation_slot<metronome::detail::slot_handler<Handler, Link>, Slot> {
  using type = cancellation_slot;
  static type get(const metronome::detail::slot_handler<Handler, Link>& h, const Slot& = Slot()) noexcept {
    return h.slot();
  }
};

} // namespace METRONOME_NET_NAMESPACE

#endif
