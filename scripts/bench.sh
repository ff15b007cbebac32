#!/usr/bin/env bash
# Builds the benchmark as a consumer's Release build gets it (the `release` preset:
# CMAKE_BUILD_TYPE=Release, i.e. -O3 -DNDEBUG, test hooks off) and runs every case:
# the table goes to stdout, JSON lines to the file given (default bench-results.jsonl).
# Run it on a quiet machine; it prints the load average at start and end.
#
#   scripts/bench.sh [results.jsonl] [metronome_bench arguments...]
#   scripts/bench.sh out.jsonl --reps=9          more repetitions
#   scripts/bench.sh out.jsonl timers-fire       only the cases whose names start so
set -euo pipefail
cd "$(dirname "$0")/.."
json=${1:-bench-results.jsonl}
[[ $# -gt 0 ]] && shift
# Builds on a shared machine serialise on this lock (see the build rules); none elsewhere.
lock=${METRONOME_BUILD_LOCK:-/tmp/metronome-build.lock}
locked() { if [[ -e $lock ]]; then flock "$lock" "$@"; else "$@"; fi; }

cmake --preset release >/dev/null
locked cmake --build --preset release --target metronome_bench >&2
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(uname -sr)"
echo "compiler: $("$(sed -n "s/^CMAKE_CXX_COMPILER:FILEPATH=//p" build/release/CMakeCache.txt)" --version | head -1); Boost 1.81; metronome $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo
exec ./build/release/bench/metronome_bench --json="$json" "$@"
