// internal_post_scope: marks the library's own completions posted to a pool as internal
// work.
#ifndef METRONOME_DETAIL_INTERNAL_POST_HPP
#define METRONOME_DETAIL_INTERNAL_POST_HPP

namespace metronome::detail {

// While one is alive, what the calling thread posts to a metronome pool (through any
// executor wrapper: any_io_executor, a strand) is the library's own completion of work
// the pool already accepted - internal work, accepted after shutdown until the pool
// terminates, like a strand's invoker. Handler operations open one around their post.
class internal_post_scope {
public:
  // `on` false: the user's code runs here (a handler run inline), its posts are its own.
  explicit internal_post_scope(bool on = true) noexcept;
  ~internal_post_scope();
  internal_post_scope(const internal_post_scope&) = delete;
  internal_post_scope& operator=(const internal_post_scope&) = delete;

  static bool active() noexcept;

private:
  bool outer_;
};

} // namespace metronome::detail

#endif
