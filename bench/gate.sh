#!/usr/bin/env bash
# The benchmark regression gate: builds two versions of metronome, the old one from a
# commit and the new one from the work tree (uncommitted changes included), and runs
# every micro row (bench/main.cpp) and the real-service benchmark (bench/service.sh) on
# both, the two sides alternated round by round (old new, new old, old new, ...). Prints
# each row's same-run ratio new/old (oriented: above 1 is better), the spread of the
# per-round ratios, the noise it measured (how far one side's rounds stray from their own
# median), and FLAGS every row that lost more than 5 % beyond that noise (save reference
# sides, which run no metronome code, and memory that moved by < 64 KiB). Plain Asio runs
# inside each bench run too: its new/old ratio ("asio drift") shows the machine's drift.
#
#   bash bench/gate.sh                          base: the last tag, else HEAD~1
#   bash bench/gate.sh --base a971da2 serial-x  only the cases whose names start so
#   bash bench/gate.sh --rounds 5 --reps 3 --no-service
#
# Options: --base REV, --rounds N (default 3, at least 3), --reps N (bench repetitions
# per round, default 3), --threshold PCT (default 5), --service-secs S (default 3),
# --conns N (idle connections the service's RSS is read with, default 10000: the
# I/O-loop issue's bound is stated there), --no-service, --out DIR (default build/gate).
# Exits 1 when a row is flagged. Takes long (two Release builds, then about rounds x 2
# bench runs): run it on a quiet machine, before resolving an issue that touches src/ or
# include/; not part of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
base="" rounds=3 reps=3 threshold=5 service=1 secs=3 conns=10000 out=build/gate
cases=()
while [ $# -gt 0 ]; do
  case $1 in
    --base) base=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --threshold) threshold=$2; shift 2 ;;
    --service-secs) secs=$2; shift 2 ;;
    --conns) conns=$2; shift 2 ;;
    --no-service) service=0; shift ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    -*) echo "gate: unknown option $1" >&2; exit 2 ;;
    *) cases+=("$1"); shift ;;
  esac
done
[ "$rounds" -ge 3 ] || { echo "gate: --rounds must be at least 3" >&2; exit 2; }
if [ -z "$base" ]; then
  base=$(git describe --tags --abbrev=0 2>/dev/null || git rev-parse --short HEAD~1)
fi
base_sha=$(git rev-parse --verify "$base^{commit}")
mkdir -p "$out"
out=$(cd "$out" && pwd)
echo "gate: old = $base ($(git log -1 --format='%h %s' "$base_sha" | cut -c1-72))"
echo "gate: new = work tree on $(git log -1 --format='%h %s' HEAD | cut -c1-72)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"

# The old source, as committed; the new one is the work tree itself.
rm -rf "$out/old-src"
mkdir -p "$out/old-src"
git archive "$base_sha" | tar -x -C "$out/old-src"

build() { # source dir, build dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMETRONOME_BUILD_BENCH=ON \
    -DMETRONOME_BUILD_TESTS=OFF -DMETRONOME_BUILD_EXAMPLES=OFF -DMETRONOME_INSTALL=OFF >/dev/null
  cmake --build "$2" --target metronome_bench >/dev/null
  if [ "$service" = 1 ]; then # (commits before the real-service benchmark have no such target)
    cmake --build "$2" --target metronome_service_bench >/dev/null ||
      { echo "gate: $1 has no real-service benchmark: run with --no-service" >&2; exit 2; }
  fi
}
echo "gate: building old and new (Release)"
build "$out/old-src" "$out/old"
build "$root" "$out/new"

rm -f "$out"/round-*.jsonl "$out"/service-*.tsv
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for side in $order; do
    echo "gate: round $r/$rounds, $side: micro rows" >&2
    "$out/$side/bench/metronome_bench" --reps="$reps" --json="$out/round-$r-$side.jsonl" "${cases[@]}" >/dev/null
    if [ "$service" = 1 ]; then
      echo "gate: round $r/$rounds, $side: real service" >&2
      bash bench/service.sh "$out/$side/bench/metronome_service_bench" --secs "$secs" --reps 1 --rss-reps 1 \
        --conns "$conns" --out "$out/service-$r-$side.tsv" >/dev/null 2>&1 ||
        echo "gate: the service benchmark failed on $side, round $r (see $out/service-$r-$side.tsv)" >&2
    fi
  done
done

python3 - "$out" "$rounds" "$threshold" <<'EOF'
import json, statistics, sys, glob, os
out, rounds, threshold = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) / 100

rows = {}  # (case, side, metric) -> {"up": bool, "old": [...], "new": [...], "asio_old": [...], "asio_new": [...]}
def add(key, up, which, value, asio=None):
    r = rows.setdefault(key, {"up": up, "old": [], "new": [], "asio_old": [], "asio_new": []})
    r[which].append(value)
    if asio is not None:
        r["asio_" + which].append(asio)

for r in range(1, rounds + 1):
    for which in ("old", "new"):
        path = f"{out}/round-{r}-{which}.jsonl"
        if os.path.exists(path):
            for line in open(path):
                j = json.loads(line)
                if "case" not in j or j["metronome"]["median"] is None:
                    continue
                asio = [v["median"] for k, v in j.items()
                        if isinstance(v, dict) and k != "metronome" and v.get("median") is not None]
                up = j["higher_is_better"]
                best = (max(asio) if up else min(asio)) if asio else None
                add((j["case"], j["side"], j["metric"]), up, which, j["metronome"]["median"], best)
        path = f"{out}/service-{r}-{which}.tsv"
        if os.path.exists(path):
            for line in open(path):
                f = line.rstrip("\n").split("\t")
                if f[0] == "load":
                    _, side, variant, _, rps, p50, p99, cpu, threads, _ = f[:10]
                    for metric, value, up in (("req/s", rps, True), ("p99 ms", p99, False), ("CPU us/req", cpu, False)):
                        add(("service " + variant, side, metric), up, which, float(value))
                elif f[0] == "rss":
                    _, side, variant, _, rss0, rss, _, _ = f
                    add(("service " + variant, side, "RSS KiB, idle conns"), False, which, float(rss))

def oriented(new, old, up):  # > 1: new is better
    if old == 0 or new == 0:
        return float("nan")
    return new / old if up else old / new

flagged = 0
print(f"| row | side | metric | old | new | new/old (>1 better) | per-round spread | noise | asio drift | |")
print("|---|---|---|---|---|---|---|---|---|---|")
for (case, side, metric), r in rows.items():
    n = min(len(r["old"]), len(r["new"]))
    if n == 0:
        continue
    old, new, up = r["old"][:n], r["new"][:n], r["up"]
    per_round = [oriented(a, b, up) for a, b in zip(new, old)]
    ratio = statistics.median(per_round)
    # Noise: how far one side's rounds stray from their own median, on either side.
    def stray(v):
        m = statistics.median(v)
        return max(abs(x / m - 1) for x in v) if m else 0.0
    noise = max(stray(old), stray(new))
    drift = ""
    if r["asio_old"] and r["asio_new"]:
        drift = f"{oriented(statistics.median(r['asio_new']), statistics.median(r['asio_old']), up):.3f}"
    # Reference sides (the callbacks alone, Asio with no timer) run no metronome code, and a
    # memory row that moved by less than 64 KiB is the allocator's own noise: shown, never
    # flagged.
    reference = side.startswith(("floor", "reference"))
    tiny = "MiB" in metric and abs(statistics.median(new) - statistics.median(old)) < 1 / 16
    flag = ratio < 1 - threshold - noise and not reference and not tiny
    flagged += flag
    print(f"| {case} | {side} | {metric} | {statistics.median(old):.4g} | {statistics.median(new):.4g} | "
          f"{ratio:.3f} | {min(per_round):.3f}-{max(per_round):.3f} | {noise:.3f} | {drift} | "
          f"{'**LOST**' if flag else ''} |")
print()
print(f"{flagged} row(s) lost more than {threshold:.0%} beyond their noise" if flagged else
      f"no row lost more than {threshold:.0%} beyond its noise")
sys.exit(1 if flagged else 0)
EOF
