#!/usr/bin/env bash
# Nexmark on Riverbank's streaming runtime (bench/README.md, "Nexmark"): for each query,
#  1. peak throughput: COUNT events generated in the past (all available at once), one slot,
#     timed from start to drained; events per second per core;
#  2. latency at half that rate: events paced by the wall clock for SECONDS, then drained;
#     each event's latency is from its event time to the commit of the checkpoint that
#     output it, read from the checkpoint log (p50 / p99).
# Not a test. Needs a release build (built here).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/riverbank/target}"
COUNT="${COUNT:-2000000}"
SECONDS_PACED="${SECONDS_PACED:-20}"
QUERIES="${QUERIES:-q0 q1 q2 q5}"
cargo build --release -q -p riverbank
BIN="$CARGO_TARGET_DIR/release/riverbank"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
printf '%-4s %14s %14s %10s %10s %10s\n' query "events/s/core" "paced rate/s" "p50 ms" "p99 ms" "checkpts"
for q in $QUERIES; do
  # 1. Peak: everything available, one slot, large checkpoints.
  vars="{\"rate\": 1000000, \"count\": $COUNT, \"start\": \", start: '2024-01-01T00:00:00Z'\", \"out\": \"$WORK/$q-peak\", \"interval\": 1}"
  t0=$(date +%s.%N)
  "$BIN" run "bench/nexmark/$q.yaml" --jinja-variables "$vars" --no-progress --slots 1 \
    --checkpoint-dir "$WORK/$q-peak-ck" --spill-dir "$WORK/spill" --max-per-checkpoint 250000 2>/dev/null
  t1=$(date +%s.%N)
  peak=$(python3 -c "print(int($COUNT / ($t1 - $t0)))")
  # 2. Latency at half the peak, paced by the wall clock, checkpoints every 0.25 s.
  rate=$((peak / 2))
  vars="{\"rate\": $rate, \"count\": $((rate * SECONDS_PACED)), \"start\": \"\", \"out\": \"$WORK/$q-paced\", \"interval\": 0.25}"
  "$BIN" run "bench/nexmark/$q.yaml" --jinja-variables "$vars" --no-progress --slots 1 \
    --checkpoint-dir "$WORK/$q-paced-ck" --spill-dir "$WORK/spill" 2>/dev/null
  python3 - "$WORK/$q-paced-ck/checkpoints" "$rate" "$q" "$peak" <<'PY'
import json, os, sys
log, rate, q, peak = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
plans = {}
done = {}
for f in os.listdir(log):
    d = json.load(open(os.path.join(log, f)))
    (plans if f.endswith(".plan.json") else done)[d["id"]] = d
lat = []
for i, p in plans.items():
    if i not in done:
        continue
    at = done[i]["at_us"]
    start = p["start_us"]
    for (_t, part, frm, until) in p["reads"]:
        # Event n of partition `part` is n * 4 + part; its event time is start + n / rate.
        step = max(1, (until - frm) // 200)
        for o in range(frm, until, step):
            n = o * 4 + part
            lat.append((at - (start + n * 1e6 / rate)) / 1000)
lat.sort()
pct = lambda x: lat[min(len(lat) - 1, int(len(lat) * x))] if lat else float("nan")
print(f"{q:<4} {peak:>14} {int(rate):>14} {pct(0.5):>10.0f} {pct(0.99):>10.0f} {len(done):>10}")
PY
done
