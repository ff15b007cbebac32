#!/usr/bin/env bash
# Measures what each speed trick the library keeps buys (the ones that did not pay were
# removed; docs/benchmarks.md has their last measurement): builds the benchmark once as it is
# and once without each trick (Release, as scripts/bench.sh; a variant is the checked-out
# tree with bench/tricks/<variant>.patch applied to a copy: the product code carries no
# switch for it, and a patch that no longer applies stops the script), then runs the rows the
# trick exists for with both builds in turn, alternating which goes first, and prints
# the median of each metronome metric with and without, and their ratio. The node
# cache is measured the same way against plain operator new, under glibc's malloc and
# under mimalloc (LD_PRELOAD; installs libmimalloc2.0 when missing).
# Run it on a quiet machine. docs/benchmarks.md has the method and the last results.
#
#   scripts/tricks.sh [out-dir]        (default build/tricks; JSON lines kept there)
#   ROUNDS=3 REPS=3 scripts/tricks.sh  alternations per trick, repetitions per run
#   BUILD_ONLY=1 / SKIP_BUILD=1        only build the variants / only run them
#   ONLY=node-cache                    only the node cache against operator new (glibc, mimalloc)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/tricks}
rounds=${ROUNDS:-2}
reps=${REPS:-3}
mkdir -p "$out"

build() { # name, cmake args...
  local name=$1 src=.
  shift
  if [[ -f bench/tricks/$name.patch ]]; then # a copy of the working tree with the trick taken out
    src="$out/$name-src"
    rm -rf "$src" && mkdir -p "$src"
    git ls-files -z | xargs -0 cp --parents -t "$src"
    patch -p1 -s -d "$src" <"bench/tricks/$name.patch" # stops the script if it no longer applies
  fi
  cmake -S "$src" -B "$out/$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMETRONOME_BUILD_BENCH=ON \
    -DMETRONOME_TEST_HOOKS=OFF -DMETRONOME_BUILD_TESTS=OFF -DMETRONOME_BUILD_EXAMPLES=OFF "$@" >/dev/null
  cmake --build "$out/$name" --target metronome_bench >/dev/null
}

mimalloc=$(ls /usr/lib/x86_64-linux-gnu/libmimalloc.so.* 2>/dev/null | head -1 || true)
if [[ -z $mimalloc ]]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq </dev/null && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
    --no-install-recommends libmimalloc2.0 </dev/null >/dev/null || true
  mimalloc=$(ls /usr/lib/x86_64-linux-gnu/libmimalloc.so.* 2>/dev/null | head -1 || true)
fi

only=${ONLY:-}
if [[ -z ${SKIP_BUILD:-} ]]; then
echo "building: as is, and without each trick" >&2
build base
if [[ -z $only ]]; then
  build without-touch-ahead
  build without-local-run
  build without-delay-run
  build without-spin-before-timed-push-lock
  build without-pick-promotion-lag
  build with-prepare-ahead -DMETRONOME_NODE_CACHE_PREPARE_AHEAD=ON
fi
build without-node-cache -DMETRONOME_NODE_CACHE=OFF
fi
[[ -n ${BUILD_ONLY:-} ]] && exit 0

# compare label, variant build, preload ('' or a library), case prefixes...
compare() {
  local label=$1 variant=$2 preload=$3
  shift 3
  local a="$out/$label.base.jsonl" b="$out/$label.variant.jsonl"
  : >"$a"
  : >"$b"
  for ((r = 0; r < rounds; r++)); do
    local first=base second=$variant fa=$a fb=$b
    if ((r % 2)); then first=$variant second=base fa=$b fb=$a; fi
    LD_PRELOAD=$preload "$out/$first/bench/metronome_bench" --no-asio --reps="$reps" --json=/dev/stdout "$@" 2>/dev/null |
      grep '^{"case"' >>"$fa" || true
    LD_PRELOAD=$preload "$out/$second/bench/metronome_bench" --no-asio --reps="$reps" --json=/dev/stdout "$@" 2>/dev/null |
      grep '^{"case"' >>"$fb" || true
  done
  python3 - "$label" "$a" "$b" <<'PY'
import json, statistics, sys
label, a, b = sys.argv[1:4]
def load(p):
    vals = {}
    for line in open(p):
        r = json.loads(line)
        vals.setdefault((r["case"], r["side"], r["metric"], r["higher_is_better"]), []).extend(
            v for v in r["metronome"]["values"] if v is not None)
    return vals
base, var = load(a), load(b)
print(f"\n### {label}\n")
print("| case | side | metric | as is | variant | as is / variant |")
print("|---|---|---|---|---|---|")
for k in sorted(base):
    if k not in var or not base[k] or not var[k]:
        continue
    m, n = statistics.median(base[k]), statistics.median(var[k])
    better = (m / n if k[3] else n / m) if m and n else float("nan")
    print(f"| {k[0]} | {k[1]} | {k[2]} | {m:.4g} | {n:.4g} | {better:.2f}x {'better' if better >= 1 else 'worse'} as is |")
PY
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(uname -sr)"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg); $rounds alternations x $reps repetitions per build"
if [[ -z $only ]]; then
  compare "wheel: touch-ahead walk of the next tick (variant: none)" without-touch-ahead '' timers-fire accuracy
  compare "pool: shared queue looked at every 61st local pick (variant: every pick)" without-local-run '' post serial coroutines
  compare "pool: the delay queue's run beside the heap (variant: the heap alone)" without-delay-run '' timeout-cancel coroutines timers-fire
  compare "pool: a timed push tries the mutex ~3 us before it blocks (variant: blocks at once)" \
    without-spin-before-timed-push-lock '' timers-fire coroutines accuracy
  compare "pool: a busy worker's pick promotes once the head is 10 us late (variant: when due)" \
    without-pick-promotion-lag '' timers-fire accuracy coroutines
  compare "node cache: background prepare-ahead thread (variant: ON; as is: OFF)" with-prepare-ahead '' post/1p timers-fire/1M timeout-cancel/1M
fi
compare "node cache vs operator new, glibc malloc" without-node-cache '' post serial timers-fire/1M timeout-cancel/1M coroutines
if [[ -n $mimalloc ]]; then
  compare "node cache vs operator new, both under mimalloc ($(basename "$mimalloc"))" without-node-cache "$mimalloc" \
    post serial timers-fire/1M timeout-cancel/1M coroutines
else
  echo "mimalloc not available: its comparison was skipped"
fi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
