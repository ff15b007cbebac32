#!/usr/bin/env bash
# The real-service benchmark: bench/service.cpp (metronome_service_bench) on each side,
# loaded by wrk, then holding 10,000 idle keep-alive connections. Builds nothing.
#
#   bash bench/service.sh BUILD/bench/metronome_service_bench [--secs 5] [--reps 5]
#        [--rss-reps 3] [--conns 10000] [--sides "asio mtr-io mtr-pool"]
#        [--variants "timers no-timers"] [--out results.tsv] [--port 18080]
#        (variants: timers no-timers timers-no-strand no-timers-no-strand timers-loaded
#         no-timers-loaded)
#
# Each run: the server pinned to core 0, `wrk -t1 -c50 -d<secs>s --latency` pinned to
# core 1; the sides interleaved within each repetition. Per run: requests/s, p50 and p99
# (wrk), CPU per request (the server's utime+stime from /proc/<pid>/stat over the run,
# divided by wrk's request count), threads (/proc/<pid>/status, mid-run). Then, per side,
# VmRSS with --conns idle keep-alive connections (bench/service_idle_clients.py, on
# core 1). Prints per-side medians as a markdown table, each metronome figure with its
# ratio to plain Asio of the same variant. Variants: timers (the full service), no-timers
# (no backend delay, deadline, idle timeout nor reporter), and the same with -no-strand
# appended (no per-connection strand / serial_executor); -loaded appended: with two chains
# of CPU work sliced in 100 µs handlers beside the service (--cpu-load 2: on the pool for
# mtr-pool, which then has 2 workers; on an asio::thread_pool(1) beside the io_context for
# asio and mtr-io) - CPU per request means little there; read p99, req/s and the CPU
# work done ("bg slices/s").
set -euo pipefail

bin=${1:?usage: bench/service.sh PATH/TO/metronome_service_bench [options]}
shift
secs=5 reps=5 rss_reps=3 conns=10000 port=18080
sides="asio mtr-io mtr-pool" variants="timers no-timers" out=""
while [ $# -gt 0 ]; do
  case $1 in
    --secs) secs=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --rss-reps) rss_reps=$2; shift 2 ;;
    --conns) conns=$2; shift 2 ;;
    --sides) sides=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$bin" ] || { echo "not an executable: $bin" >&2; exit 2; }
if ! command -v wrk >/dev/null; then
  apt-get update -qq
  apt-get install -y wrk >/dev/null
fi
ulimit -n $((conns + 1000))
tick=$(getconf CLK_TCK)
work=$(mktemp -d)
[ -n "$out" ] || out=$work/results.tsv
: >"$out"
server_pid=""
client_pid=""
cleanup() {
  [ -z "$client_pid" ] || kill "$client_pid" 2>/dev/null || true
  [ -z "$server_pid" ] || kill "$server_pid" 2>/dev/null || true
}
trap cleanup EXIT

flags_of() { # variant -> server flags
  case $1 in
    timers) echo "" ;;
    no-timers) echo "--no-timers" ;;
    timers-no-strand) echo "--no-strand" ;;
    no-timers-no-strand) echo "--no-timers --no-strand" ;;
    timers-loaded) echo "--cpu-load 2" ;;
    no-timers-loaded) echo "--no-timers --cpu-load 2" ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}

# Starts the server on core 0 and waits for it to listen; sets server_pid.
start_server() { # side variant port log
  # shellcheck disable=SC2046
  taskset -c 0 "$bin" --side "$1" --port "$3" $(flags_of "$2") >"$4" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do
    grep -qs listening "$4" && return 0
    sleep 0.05
  done
  echo "server $1 $2 did not start:" >&2
  cat "$4" >&2
  exit 1
}
stop_server() {
  kill "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
to_ms() { # wrk's "1.23ms" / "456.00us" / "1.02s" -> ms
  awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n += 0; else if (v ~ /s$/) n *= 1000; print n }'
}

run=0
for rep in $(seq "$reps"); do
  for variant in $variants; do
    for side in $sides; do
      run=$((run + 1))
      p=$((port + run % 100))
      start_server "$side" "$variant" "$p" "$work/server.log"
      c0=$(cpu_ticks "$server_pid")
      taskset -c 1 wrk -t1 -c50 -d"${secs}s" --latency "http://127.0.0.1:$p/" >"$work/wrk.txt" 2>&1 &
      wrk_pid=$!
      sleep "$(awk -v s="$secs" 'BEGIN { print s / 2 }')"
      threads=$(awk '/^Threads:/ {print $2}' "/proc/$server_pid/status")
      wait "$wrk_pid"
      c1=$(cpu_ticks "$server_pid")
      stop_server
      bg=$(awk '$1 == "cpu-slices" { n = $2; t = $3 } END { if (t > 0) printf "%.0f", n / t; else print 0 }' "$work/server.log")
      requests=$(awk '/requests in/ {print $1}' "$work/wrk.txt")
      rps=$(awk '/^Requests\/sec:/ {print $2}' "$work/wrk.txt")
      p50=$(to_ms "$(awk '$1 == "50%" {print $2}' "$work/wrk.txt")")
      p99=$(to_ms "$(awk '$1 == "99%" {print $2}' "$work/wrk.txt")")
      non2xx=$(awk '/Non-2xx/ {print $NF}' "$work/wrk.txt")
      errors=$(awk '/Socket errors/ {print $0}' "$work/wrk.txt")
      cpu_us=$(awk -v c=$((c1 - c0)) -v t="$tick" -v n="$requests" 'BEGIN { printf "%.2f", c / t * 1e6 / n }')
      printf 'load\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$side" "$variant" "$rep" "$rps" "$p50" "$p99" "$cpu_us" \
        "$threads" "${non2xx:-0}" "$bg" >>"$out"
      echo "rep $rep $variant $side: $rps req/s, p50 $p50 ms, p99 $p99 ms, $cpu_us us CPU/req, $threads threads, non-2xx ${non2xx:-0}, bg $bg slices/s $errors" >&2
    done
  done
done

for rep in $(seq "$rss_reps"); do
  for variant in $variants; do
    for side in $sides; do
      run=$((run + 1))
      p=$((port + run % 100))
      start_server "$side" "$variant" "$p" "$work/server.log"
      rss0=$(awk '/^VmRSS:/ {print $2}' "/proc/$server_pid/status")
      rm -f "$work/ready"
      taskset -c 1 python3 "$here/service_idle_clients.py" "$p" "$conns" "$work/ready" &
      client_pid=$!
      for _ in $(seq 600); do
        [ -s "$work/ready" ] && break
        sleep 0.05
      done
      sleep 0.5 # answers written, sessions back in their reads
      rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$server_pid/status")
      threads=$(awk '/^Threads:/ {print $2}' "/proc/$server_pid/status")
      answered=$(awk '{print $2}' "$work/ready" 2>/dev/null || echo 0)
      kill "$client_pid" 2>/dev/null || true
      wait "$client_pid" 2>/dev/null || true
      client_pid=""
      stop_server
      printf 'rss\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$side" "$variant" "$rep" "$rss0" "$rss" "$answered" "$threads" >>"$out"
      echo "rss rep $rep $variant $side: $((rss0 / 1024)) MiB idle, $((rss / 1024)) MiB with $answered connections answered" >&2
    done
  done
done

python3 - "$out" "$sides" "$variants" "$conns" "$secs" "$reps" <<'EOF'
import statistics, sys
path, sides, variants, conns, secs, reps = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4], sys.argv[5], sys.argv[6]
load, rss = {}, {}
for line in open(path):
    f = line.rstrip("\n").split("\t")
    if f[0] == "load":
        load.setdefault((f[1], f[2]), []).append([float(x) for x in f[4:11]])
    elif f[0] == "rss":
        rss.setdefault((f[1], f[2]), []).append([float(x) for x in f[4:8]])
def med(rows, i):
    return statistics.median(r[i] for r in rows) if rows else float("nan")
print(f"\nmedians of {reps} runs of {secs} s (wrk -t1 -c50, server on core 0); RSS: median over runs with {conns} idle connections")
print("ratio = metronome / plain Asio, same variant\n")
print("| variant | side | req/s | p50 ms | p99 ms | CPU µs/req | threads | non-2xx/run | bg slices/s | RSS idle MiB | RSS +conns MiB | KiB/conn |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for v in variants:
    base = {}
    for s in sides:
        L, R = load.get((s, v), []), rss.get((s, v), [])
        vals = {"rps": med(L, 0), "p50": med(L, 1), "p99": med(L, 2), "cpu": med(L, 3), "thr": med(L, 4), "n2": med(L, 5),
                "bg": med(L, 6) or float("nan"),
                "rss0": med(R, 0) / 1024, "rss": med(R, 1) / 1024,
                "kib": (med(R, 1) - med(R, 0)) / max(med(R, 2), 1)}
        if s == "asio":
            base = vals
        def cell(k, fmt):
            if vals[k] != vals[k]:
                return "–"  # not measured
            x = fmt.format(vals[k])
            if s != "asio" and base and base.get(k):
                x += f" ({vals[k] / base[k]:.2f}×)"
            return x
        print(f"| {v} | {s} | {cell('rps', '{:.0f}')} | {cell('p50', '{:.2f}')} | {cell('p99', '{:.2f}')} | "
              f"{cell('cpu', '{:.1f}')} | {vals['thr']:.0f} | {vals['n2']:.0f} | {cell('bg', '{:.0f}')} | {cell('rss0', '{:.1f}')} | "
              f"{cell('rss', '{:.1f}')} | {cell('kib', '{:.2f}')} |")
print(f"\nraw rows: {path}")
EOF
