#!/usr/bin/env bash
# Runs the checked-in .clang-tidy over src/ (and, through HeaderFilterRegex, the headers
# under include/metronome/ that src/ includes). Exits non-zero on any warning.
# Installs clang-tidy-14 when missing (apt-get, no prompts); needs no stdin.
# Usage: scripts/tidy.sh [build-dir]   (default build/tidy; only configured, never built)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/tidy}

if ! command -v clang-tidy-14 >/dev/null || ! command -v run-clang-tidy >/dev/null; then
  echo "metronome: installing clang-tidy-14"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq </dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang-tidy-14 </dev/null >/dev/null
fi
runner=$(command -v run-clang-tidy-14 || command -v run-clang-tidy)

# The compile commands of the library alone, as clang 14 sees them.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DMETRONOME_BUILD_TESTS=OFF -DMETRONOME_BUILD_EXAMPLES=OFF \
  -DMETRONOME_BUILD_BENCH=OFF >/dev/null

log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$runner" -clang-tidy-binary "$(command -v clang-tidy-14)" -p "$build" -j "$(nproc)" -quiet \
  "$PWD/src/.*\.cpp" </dev/null >"$log" 2>&1 || true
if grep -E "(warning|error): " "$log" | sort -u | grep .; then
  echo "metronome: clang-tidy found the problems above" >&2
  exit 1
fi
echo "metronome: clang-tidy clean over src/"
