#!/usr/bin/env bash
# Builds and runs every test: clang-tidy over the library, then the CMake presets (the
# same ones a developer uses, CMakePresets.json; the README's table says what each covers):
#   release      g++ 12, Boost 1.81 (Asio 1.26), as a consumer builds it (no test hooks):
#                the install/find_package consumer test, the examples, the bench's smoke run
#   libcxx       clang 16 + libc++, standalone Asio 1.22 (Debian's libasio-dev), the
#                portable fallbacks, Boost.Test header-only
#   asio-newest  clang 14 + libstdc++, standalone Asio 1.38.2 with ASIO_NO_DEPRECATED, from
#                ../shared/asio; skipped, saying so, where that folder is absent
#   tsan         g++ 12, ThreadSanitizer, with the stress tests' chaos reruns
#   asan         g++ 12, AddressSanitizer + UBSan, BOOST_ASIO_NO_DEPRECATED, chaos reruns
# The std::execution tests (test/execution/, metronome/execution.hpp) build in release,
# libcxx, tsan and asan, over stdexec from ../shared/stdexec (clang 14 cannot parse it: not
# in asio-newest); skipped, saying so, where that folder is absent.
# Every preset but release has the test hooks (the hand-over tests). Installs what is
# missing first. Prints each stage's time and the total.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)
start=$SECONDS
stage_times=()

stage() { # name, then the command
  local name=$1 t0=$SECONDS
  shift
  "$@"
  stage_times+=("$name $((SECONDS - t0)) s")
}

echo "=== metronome: clang-tidy over src/"
stage tidy bash scripts/tidy.sh build/ci-tidy
if [ ! -f ../shared/stdexec/include/stdexec/execution.hpp ]; then
  echo "=== metronome tests: std::execution tests skipped (../shared/stdexec is absent: a user's clone)"
fi
for preset in release libcxx asio-newest tsan asan; do
  if [ "$preset" = asio-newest ] && [ ! -f ../shared/asio/asio-1.38.2/include/asio/version.hpp ]; then
    echo "=== metronome tests: asio-newest skipped (../shared/asio/asio-1.38.2 is absent: a user's clone)"
    continue
  fi
  echo "=== metronome tests: $preset"
  stage "$preset configure+build" bash -c "cmake --preset $preset >/dev/null && cmake --build --preset $preset -j $jobs"
  stage "$preset tests" ctest --preset "$preset" -j "$jobs"
done
echo "=== metronome: stage times"
printf '  %s\n' "${stage_times[@]}"
echo "  total $((SECONDS - start)) s"
