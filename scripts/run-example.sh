#!/usr/bin/env bash
# Builds and runs the flagship example (installing what is missing first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DMETRONOME_BUILD_TESTS=OFF >/dev/null
cmake --build build/release --target example_flagship
./build/release/examples/example_flagship
