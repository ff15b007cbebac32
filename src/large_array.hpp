// An array that may be large: from 2 MiB up its storage is mapped from the system and
// asked for huge pages (platform::allocate_large), as the delay queue's run holds an
// entry per pending timer - 24 MiB at a million.
#ifndef METRONOME_SRC_LARGE_ARRAY_HPP
#define METRONOME_SRC_LARGE_ARRAY_HPP

#include "platform.hpp"

#include <cstddef>
#include <cstring>
#include <type_traits>
#include <utility>

namespace metronome::detail {

// `size` elements, uninitialised (T trivial): the owner writes before it reads.
template <class T>
class large_array {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);

public:
  large_array() noexcept = default;
  // @throws std::bad_alloc.
  explicit large_array(std::size_t size)
      : p_(static_cast<T*>(platform::allocate_large(size * sizeof(T)))), size_(size) {}
  large_array(large_array&& o) noexcept : p_(std::exchange(o.p_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  large_array& operator=(large_array&& o) noexcept {
    large_array(std::move(o)).swap(*this);
    return *this;
  }
  large_array(const large_array&) = delete;
  large_array& operator=(const large_array&) = delete;
  ~large_array() {
    if (p_) platform::free_large(p_, size_ * sizeof(T));
  }

  void swap(large_array& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(size_, o.size_);
  }
  void reset() noexcept { large_array().swap(*this); }
  // `size` elements now, the first `keep` (at most min(size, size())) kept, the rest
  // uninitialised. Mapped storage (from huge_page_bytes up, both sizes) resizes without
  // a copy (platform::resize_large); anything else moves to new storage, copying only
  // the `keep`: a page of it that nothing writes is never faulted in. @throws
  // std::bad_alloc, with nothing changed.
  void resize(std::size_t size, std::size_t keep) {
    if (p_ && size) {
      if (void* q = platform::resize_large(p_, size_ * sizeof(T), size * sizeof(T))) {
        p_ = static_cast<T*>(q);
        size_ = size;
        return;
      }
    }
    large_array moved(size);
    if (keep) std::memcpy(static_cast<void*>(moved.p_), p_, keep * sizeof(T));
    swap(moved);
  }
  std::size_t size() const noexcept { return size_; }
  T& operator[](std::size_t i) noexcept { return p_[i]; }
  const T& operator[](std::size_t i) const noexcept { return p_[i]; }

private:
  T* p_ = nullptr;
  std::size_t size_ = 0;
};

} // namespace metronome::detail

#endif
