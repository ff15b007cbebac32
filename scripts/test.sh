#!/usr/bin/env bash
# Builds and runs every test: clang-tidy over the library, then the CMake presets (the
# same ones a developer uses, CMakePresets.json): release (as a consumer builds it, no test
# hooks: with the install/find_package consumer test, the examples and the bench's smoke
# run), clang (clang 14 on the portable fallbacks, against standalone Asio: its
# unit tests, examples and a second install/find_package consumer test), tsan (ThreadSanitizer) and asan
# (AddressSanitizer+UBSan, which bypasses the node cache: every node is its own operator
# new). The hand-over tests need the test hooks: every preset but release has them.
# Installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)

echo "=== metronome: clang-tidy over src/"
bash scripts/tidy.sh build/ci-tidy
for preset in release clang tsan asan; do
  echo "=== metronome tests: $preset"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  ctest --preset "$preset" -j "$jobs"
done
