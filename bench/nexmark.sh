#!/usr/bin/env bash
# Nexmark on Riverbank's streaming runtime (bench/README.md, "Nexmark"): for each query,
#  1. peak throughput: COUNT events generated in the past (all available at once), one slot,
#     timed from start to drained; events per second per core;
#  2. latency at half that rate (or PACED_RATE): events paced by the wall clock for SECONDS, then drained;
#     each event's latency is from its event time to the commit of the checkpoint that
#     output it, read from the checkpoint log (p50 / p99).
#  3. with --flink: the same queries and event counts on Apache Flink (PyFlink mini-cluster,
#     parallelism 1, its datagen; bench/flink_nexmark.py), side by side; needs
#     `python3 -m venv bench/.venv && bench/.venv/bin/pip install apache-flink` and Java 17
#     (or FLINK_PYTHON: a Python that has apache-flink, kept apart from the taxi venv's pins);
#  4. with --recovery: kill-recovery: Q0 (RECOVERY_QUERY) paced on `--workers 2`, one worker SIGKILLed after
#     KILL_AFTER seconds; the time from the kill to the next checkpoint recorded.
# Throughput per core: events / wall seconds with one slot (Flink: parallelism 1), and events
# per CPU-second the engine's processes spent (Riverbank: the whole run, from /usr/bin/time;
# Flink: its JVM from job submission to its end, JVM start-up and planning excluded). Timed from
# start to end, so at 1-2 M events Flink's deployment and final checkpoint weigh in:
# bench/nexmark_steady.sh measures both engines at steady state (the slope between two sizes).
# Not a test. Needs a release build (built here).
set -euo pipefail
cd "$(dirname "$0")/.."
FLINK=0
RECOVERY=0
for a in "$@"; do
  case "$a" in
    --flink) FLINK=1 ;;
    --recovery) RECOVERY=1 ;;
    *) echo "usage: $0 [--flink] [--recovery]" >&2; exit 2 ;;
  esac
done
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/riverbank/target}"
COUNT="${COUNT:-2000000}"
SECONDS_PACED="${SECONDS_PACED:-20}"
QUERIES="${QUERIES:-q0 q1 q2 q3 q4 q5 q7 q8}"
[ -n "${NO_BUILD:-}" ] || cargo build --release -q -p riverbank
BIN="$CARGO_TARGET_DIR/release/riverbank"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
printf '%-4s %14s %14s %14s %14s %14s %8s %8s %8s\n' query "rb ev/s/core" "rb ev/cpu-s" \
  "flink ev/s/core" "flink ev/cpu-s" "paced rate/s" "p50 ms" "p99 ms" "checkpts"
for q in $QUERIES; do
  # 1. Peak: everything available, one slot, large checkpoints.
  vars="{\"rate\": 1000000, \"count\": $COUNT, \"start\": \", start: '2024-01-01T00:00:00Z'\", \"out\": \"$WORK/$q-peak\", \"interval\": 1}"
  /usr/bin/time -f "%e %U %S" -o "$WORK/time" \
    "$BIN" run "bench/nexmark/$q.yaml" --jinja-variables "$vars" --no-progress --slots 1 \
    --checkpoint-dir "$WORK/$q-peak-ck" --spill-dir "$WORK/spill" --max-per-checkpoint 250000 2>/dev/null
  read -r wall user sys < "$WORK/time"
  peak=$(python3 -c "print(int($COUNT / $wall))")
  rb_cpu=$(python3 -c "print(int($COUNT / ($user + $sys)))")
  flink="-"
  flink_cpu="-"
  if [ "$FLINK" = 1 ]; then
    line=$("${FLINK_PYTHON:-bench/.venv/bin/python}" bench/flink_nexmark.py "$q" "$COUNT" 1000000 "$WORK/$q-flink" 2>/dev/null | tail -1)
    flink=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(int(d['events']/d['seconds']))" "$line")
    flink_cpu=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(int(d['events']/d['cpu']))" "$line")
  fi
  # 2. Latency at half the peak, paced by the wall clock, checkpoints every 0.25 s.
  rate=${PACED_RATE:-$((peak / 2))}
  vars="{\"rate\": $rate, \"count\": $((rate * SECONDS_PACED)), \"start\": \"\", \"out\": \"$WORK/$q-paced\", \"interval\": 0.25}"
  "$BIN" run "bench/nexmark/$q.yaml" --jinja-variables "$vars" --no-progress --slots 1 \
    --checkpoint-dir "$WORK/$q-paced-ck" --spill-dir "$WORK/spill" 2>/dev/null
  python3 - "$WORK/$q-paced-ck/checkpoints" "$rate" "$q" "$peak" "$rb_cpu" "$flink" "$flink_cpu" <<'PY'
import json, os, sys
log, rate, q, peak, rb_cpu, flink, flink_cpu = sys.argv[1], float(sys.argv[2]), *sys.argv[3:]
plans = {}
done = {}
for f in os.listdir(log):
    d = json.load(open(os.path.join(log, f)))
    (plans if f.endswith(".plan.json") else done)[d["id"]] = d
lat = []
# Every `step`-th offset of every read: each event counts the same (a step per read would
# weigh a small read, such as the last one of the run, as much as a big one).
total = sum(u - f for i, p in plans.items() if i in done for (_t, _p, f, u) in p["reads"])
step = max(1, total // 400_000)
for i, p in plans.items():
    if i not in done:
        continue
    at = done[i]["at_us"]
    start = p["start_us"]
    for (_t, part, frm, until) in p["reads"]:
        # Event n of partition `part` is n * 4 + part; its event time is start + n / rate.
        for o in range(frm - frm % step + (step if frm % step else 0), until, step):
            n = o * 4 + part
            lat.append((at - (start + n * 1e6 / rate)) / 1000)
lat.sort()
pct = lambda x: lat[min(len(lat) - 1, int(len(lat) * x))] if lat else float("nan")
print(f"{q:<4} {peak:>14} {rb_cpu:>14} {flink:>14} {flink_cpu:>14} {int(rate):>14} {pct(0.5):>8.0f} {pct(0.99):>8.0f} {len(done):>8}")
PY
  rm -rf "$WORK/$q-peak" "$WORK/$q-paced" "$WORK/$q-flink"
done

if [ "$RECOVERY" = 1 ]; then
  # Kill-recovery: RECOVERY_QUERY (default Q0; q5 keeps keyed state in its shards, which the
  # surviving worker restores from the checkpoint directory) paced at RECOVERY_RATE on two
  # workers, checkpoints every second; one worker SIGKILLed after KILL_AFTER s. Recovery: from
  # the kill to the next checkpoint recorded.
  RECOVERY_QUERY="${RECOVERY_QUERY:-q0}"
  RECOVERY_RATE="${RECOVERY_RATE:-100000}"
  KILL_AFTER="${KILL_AFTER:-8}"
  echo "kill-recovery: $RECOVERY_QUERY at $RECOVERY_RATE events/s on --workers 2"
  vars="{\"rate\": $RECOVERY_RATE, \"count\": $((RECOVERY_RATE * 25)), \"start\": \"\", \"out\": \"$WORK/rec\", \"interval\": 1}"
  "$BIN" run "bench/nexmark/$RECOVERY_QUERY.yaml" --jinja-variables "$vars" --no-progress --workers 2 \
    --checkpoint-dir "$WORK/rec-ck" --spill-dir "$WORK/spill" 2>/dev/null &
  run=$!
  sleep "$KILL_AFTER"
  victim=""
  for c in $(pgrep -P "$run"); do
    if tr '\0' ' ' < "/proc/$c/cmdline" | grep -q ' worker '; then victim=$c; break; fi
  done
  if [ -z "$victim" ]; then echo "kill-recovery: no worker process found under $run" >&2; exit 1; fi
  killed_us=$(python3 -c "import time; print(int(time.time() * 1e6))")
  kill -9 "$victim"
  wait "$run"
  python3 - "$WORK/rec-ck/checkpoints" "$killed_us" "$victim" <<'PY'
import json, os, sys
log, killed, victim = sys.argv[1], int(sys.argv[2]), sys.argv[3]
done = sorted(json.load(open(os.path.join(log, f)))["at_us"] for f in os.listdir(log) if f.endswith(".done.json"))
before = [t for t in done if t <= killed]
after = [t for t in done if t > killed]
gaps = [b - a for a, b in zip(done, done[1:])]
typical = sorted(gaps)[len(gaps) // 2] / 1e6 if gaps else float("nan")
later = [b - a for a, b in zip(done, done[1:]) if b > killed]
print(f"kill-recovery: worker pid {victim} SIGKILLed; next checkpoint recorded "
      f"{(after[0] - killed) / 1e6:.2f} s after the kill (last before it {(killed - before[-1]) / 1e6:.2f} s "
      f"before; longest gap between checkpoints after the kill {max(later) / 1e6:.2f} s; "
      f"checkpoints otherwise every {typical:.2f} s; {len(done)} checkpoints)")
PY
fi
