// counted_ref: the owning pointer a public handle holds to a node with an intrusive count.
#ifndef METRONOME_DETAIL_COUNTED_REF_HPP
#define METRONOME_DETAIL_COUNTED_REF_HPP

#include <utility>

namespace metronome::detail {

// Holds one reference to a T with add_ref() and release() (release frees the node with
// its last reference): copying adds one, moving hands it on, destruction lets it go.
// What scheduled_future and wheel_timer::timeout hold; each node counts its handles
// together with the library's own references, so a handle may outlive the pool or
// wheel that made it.
template <class T>
class counted_ref {
public:
  counted_ref() noexcept = default;
  explicit counted_ref(T* adopted) noexcept : p_(adopted) {} // takes over a reference already counted
  counted_ref(const counted_ref& o) noexcept : p_(o.p_) {
    if (p_) p_->add_ref();
  }
  counted_ref(counted_ref&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  counted_ref& operator=(counted_ref o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~counted_ref() {
    if (p_) p_->release();
  }

  T* get() const noexcept { return p_; }
  T* operator->() const noexcept { return p_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }

private:
  T* p_ = nullptr;
};

} // namespace metronome::detail

#endif
