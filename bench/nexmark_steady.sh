#!/usr/bin/env bash
# Nexmark at steady state, Riverbank beside Flink's best configuration (bench/README.md,
# "Nexmark at steady state"). Each engine runs each query at two sizes, SMALL and LARGE events
# (all available at once, one slot / parallelism 1); its steady throughput is the slope
#   (LARGE - SMALL) / (time at LARGE - time at SMALL),
# so start-up, planning, deployment and the final checkpoint, which both sizes pay alike, drop
# out. The same for CPU seconds (events per CPU-second: Riverbank's whole process tree, Flink's
# JVM from job submission). Memory: peak RSS at LARGE (Riverbank's process, Flink's JVM).
# Flink runs `default` and `tuned` (mini-batch and two-phase aggregation:
# bench/flink_nexmark.py); the better slope is reported, and named.
# RUNS (default 1) runs of each size on each side, their median wall and CPU time taken (a
# single run is at the mercy of one slow start, Flink's especially). Each run starts after a
# `sync`: the output of the run before (hundreds of MB for Q0/Q1) is written back first, not
# during the next run.
# Needs a release build (built here unless NO_BUILD) and FLINK_PYTHON: a Python with
# apache-flink (Java 17). Not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/riverbank/target}"
SMALL="${SMALL:-1000000}"
LARGE="${LARGE:-3000000}"
QUERIES="${QUERIES:-q0 q1 q2 q3 q4 q5 q7 q8}"
FLINK_CONFIGS="${FLINK_CONFIGS:-default tuned}"
FLINK_PYTHON="${FLINK_PYTHON:-bench/.venv/bin/python}"
RUNS="${RUNS:-1}"
[ -n "${NO_BUILD:-}" ] || cargo build --release -q -p riverbank
BIN="$CARGO_TARGET_DIR/release/riverbank"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# riverbank QUERY EVENTS: "wall cpu peak_mb" of one run with everything available at once.
riverbank() {
  local q=$1 n=$2
  # The last run's output flushed first: its writeback would slow this one.
  sync
  local vars="{\"rate\": 1000000, \"count\": $n, \"start\": \", start: '2024-01-01T00:00:00Z'\", \"out\": \"$WORK/$q-rb\", \"interval\": 1}"
  /usr/bin/time -f "%e %U %S %M" -o "$WORK/time" \
    "$BIN" run "bench/nexmark/$q.yaml" --jinja-variables "$vars" --no-progress --slots 1 \
    --checkpoint-dir "$WORK/$q-rb-ck" --spill-dir "$WORK/spill" --max-per-checkpoint 250000 2>/dev/null
  rm -rf "$WORK/$q-rb" "$WORK/$q-rb-ck"
  python3 -c "w,u,s,m=open('$WORK/time').read().split(); print(w, float(u)+float(s), int(m)//1024)"
}

# flink QUERY EVENTS CONFIG: "wall cpu peak_mb" of one Flink job.
flink() {
  local q=$1 n=$2 c=$3
  local line
  sync
  line=$("$FLINK_PYTHON" bench/flink_nexmark.py "$q" "$n" 1000000 "$WORK/$q-flink" "$c" 2>/dev/null | tail -1)
  rm -rf "$WORK/$q-flink" "$WORK/$q-flink-checkpoints"
  python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(d['seconds'], d['cpu'], d['peak_mb'])" "$line"
}

# median FUNCTION ARGS...: the median "wall cpu peak_mb" of RUNS runs of FUNCTION.
median() {
  local i out=""
  for ((i = 0; i < RUNS; i++)); do out+="$("$@")"$'\n'; done
  python3 -c 'import sys, statistics as st
rows = [l.split() for l in sys.stdin.read().splitlines() if l.strip()]
w, c, m = (st.median(float(r[k]) for r in rows) for k in range(3))
print(w, c, int(m))' <<< "$out"
}

printf '%-4s | %12s %12s %7s | %-8s %12s %12s %7s | %7s %7s\n' query "rb ev/s/core" "rb ev/CPU-s" "rb MB" \
  "flink" "ev/s/core" "ev/CPU-s" "MB" "x core" "x CPU"
for q in $QUERIES; do
  read -r w1 c1 _ < <(median riverbank "$q" "$SMALL")
  read -r w2 c2 m2 < <(median riverbank "$q" "$LARGE")
  rb=$(python3 -c "print(int(($LARGE - $SMALL) / max(1e-9, $w2 - $w1)), int(($LARGE - $SMALL) / max(1e-9, $c2 - $c1)), $m2)")
  best=""
  for c in $FLINK_CONFIGS; do
    read -r fw1 fc1 _ < <(median flink "$q" "$SMALL" "$c")
    read -r fw2 fc2 fm2 < <(median flink "$q" "$LARGE" "$c")
    f=$(python3 -c "print(int(($LARGE - $SMALL) / max(1e-9, $fw2 - $fw1)), int(($LARGE - $SMALL) / max(1e-9, $fc2 - $fc1)), $fm2)")
    echo "  $q flink $c: slope ev/s, ev/CPU-s, MB = $f (small: $fw1 s $fc1 CPU-s; large: $fw2 s $fc2 CPU-s)" >&2
    if [ -z "$best" ] || [ "${f%% *}" -gt "${best%% *}" ]; then best="$f $c"; fi
  done
  python3 - "$q" $rb $best <<'PY'
import sys
q, rb, rb_cpu, rb_mb, f, f_cpu, f_mb, config = sys.argv[1:]
rb, rb_cpu, f, f_cpu = (int(x) for x in (rb, rb_cpu, f, f_cpu))
print(f"{q:<4} | {rb:>12,} {rb_cpu:>12,} {rb_mb:>7} | {config:<8} {f:>12,} {f_cpu:>12,} {f_mb:>7} | "
      f"{rb / f:>6.1f}x {rb_cpu / f_cpu:>6.1f}x")
PY
done
