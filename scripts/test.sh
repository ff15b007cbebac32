#!/usr/bin/env bash
# Builds and runs every test: clang-tidy over the library, the normal g++ build (with
# the install/find_package consumer test, the examples and the bench's smoke run), the
# same suite built with clang 14 on the portable fallbacks, then under ThreadSanitizer
# and under AddressSanitizer+UBSan. Installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)

run() { # name, cmake args...
  local name=$1; shift
  echo "=== metronome tests: $name"
  cmake -S . -B "build/ci-$name" -G Ninja "$@" >/dev/null
  cmake --build "build/ci-$name" -j "$jobs"
  (cd "build/ci-$name" && ctest --output-on-failure -j "$jobs" --timeout 600)
}

echo "=== metronome: clang-tidy over src/"
bash scripts/tidy.sh build/ci-tidy
run release -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMETRONOME_BUILD_BENCH=ON
# clang 14, with the portable fallbacks of src/platform.cpp instead of the Linux calls.
run clang -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++-14 -DMETRONOME_PORTABLE_FALLBACK=ON
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/test/tsan.supp" \
  run tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMETRONOME_SANITIZE=thread -DMETRONOME_BUILD_EXAMPLES=OFF
# AddressSanitizer builds bypass the node cache (src/node_depot.hpp): every node is its
# own operator new, so ASan sees each one.
ASAN_OPTIONS="detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1" \
  run asan -DCMAKE_BUILD_TYPE=Debug -DMETRONOME_SANITIZE=address -DMETRONOME_BUILD_EXAMPLES=OFF
