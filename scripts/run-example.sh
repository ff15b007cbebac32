#!/usr/bin/env bash
# Builds and runs the flagship example (installing what is missing first), in a build
# folder of its own: the test command's presets own theirs (build/<preset>).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build/example -G Ninja -DCMAKE_BUILD_TYPE=Release -DMETRONOME_BUILD_TESTS=OFF >/dev/null
cmake --build build/example --target example_flagship
./build/example/examples/example_flagship
