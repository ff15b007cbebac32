#!/usr/bin/env bash
# Builds and runs every test: the normal g++ build (with the install/find_package
# consumer test and the examples), the same suite built with clang 14, then under
# ThreadSanitizer and under AddressSanitizer+UBSan. Installs what is missing first.
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

run release -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMETRONOME_BUILD_BENCH=ON
run clang -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++-14
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/test/tsan.supp" \
  run tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMETRONOME_SANITIZE=thread -DMETRONOME_BUILD_EXAMPLES=OFF
ASAN_OPTIONS="detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1" \
  run asan -DCMAKE_BUILD_TYPE=Debug -DMETRONOME_SANITIZE=address -DMETRONOME_BUILD_EXAMPLES=OFF
