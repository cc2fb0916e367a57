#!/usr/bin/env bash
# A streaming job's load steps up 4x and later falls back; `riverbank run --workers 1
# --autoscale` scales it on its real backlog. Prints each autoscaling decision with the time
# since the step, then: the reaction time to the step up, the most workers used, when the job
# scaled back down, and how many times the direction of scaling changed (flapping).
#
#   bench/autoscale_step.sh                       # release build, 4 minutes of engine time x 20
#   RIVERBANK_BIN=target/debug/riverbank bench/autoscale_step.sh
#   BASE_RATE=400 STEP_AT=30 STEP_FOR=60 TAIL=90 TIME_SCALE=20 ROW_BUSY_US=1000 bench/autoscale_step.sh
#
# Each worker has one slot, and each element costs ROW_BUSY_US of CPU (a CPU-bound transform's
# stand-in): the base load takes 0.4 of a core, the step 1.6 cores, so it needs two workers.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-$HOME/.cache/riverbank/target}
bin=${RIVERBANK_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release -q -p riverbank
  bin=$target/release/riverbank
fi
base=${BASE_RATE:-400} step_at=${STEP_AT:-30} step_for=${STEP_FOR:-60} tail=${TAIL:-90}
scale=${TIME_SCALE:-20} busy=${ROW_BUSY_US:-1000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/job.yaml" <<YAML
pipeline:
  type: chain
  transforms:
    - type: ReadFromSynthetic
      config:
        rate: $base
        keys: 64
        partitions: 4
        rate_steps:
          - {after: ${step_at}s, rate: $((base * 4))}
          - {after: $((step_at + step_for))s, rate: $base}
    - type: WindowInto
      windowing: {type: fixed, size: 10s}
    - type: Combine
      config:
        group_by: key
        combine: {events: {fn: count}}
    - type: WriteToJson
      config: {path: $work/out/counts.jsonl}
options:
  streaming: true
  maxNumWorkers: 4
  checkpointIntervalSec: 1
YAML
python3 - "$bin" "$work" "$step_at" "$step_for" "$tail" "$scale" "$busy" <<'PY'
import re, signal, subprocess, sys, time
bin, work, step_at, step_for, tail, scale, busy = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:6]), sys.argv[6], sys.argv[7]
args = [bin, "run", f"{work}/job.yaml", "--no-progress", "--workers", "1", "--slots", "1",
        "--autoscale", "--max-workers", "4", "--autoscale-time-scale", scale,
        "--row-busy-us", busy, "--checkpoint-dir", f"{work}/ck", "--spill-dir", f"{work}/spill"]
p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, start_new_session=True)
start = time.monotonic()
end = step_at + step_for + tail
decisions = []
last = []
import threading
def read():
    for line in p.stderr:
        t = time.monotonic() - start
        last.append(line.rstrip())
        del last[:-15]
        m = re.match(r"autoscale: (\d+) -> (\d+) workers", line)
        if m:
            decisions.append((t, int(m[1]), int(m[2]), line.strip()))
            print(f"{t:7.1f} s  {line.strip()}", flush=True)
reader = threading.Thread(target=read, daemon=True)
reader.start()
while time.monotonic() - start < end and p.poll() is None:
    time.sleep(0.5)
p.send_signal(signal.SIGINT)  # drain
try:
    p.wait(timeout=120)
except subprocess.TimeoutExpired:
    p.send_signal(signal.SIGINT)
    p.wait()
reader.join(timeout=5)
rescales = [d for d in decisions if d[1] != d[2]]
up = next((d for d in rescales if d[2] > d[1] and d[0] >= step_at), None)
down = next((d for d in rescales if d[2] < d[1] and d[0] >= step_at + step_for), None)
directions = [1 if d[2] > d[1] else -1 for d in rescales]
flips = sum(1 for a, b in zip(directions, directions[1:]) if a != b)
print()
print(f"load: {sys.argv[3]} s at the base rate, {step_for:.0f} s at 4x, then the base rate again ({tail:.0f} s); engine clock x{scale}")
print(f"scale-up after the step: {'%.1f s (%d -> %d)' % (up[0] - step_at, up[1], up[2]) if up else 'none'}")
print(f"most workers: {max([1] + [d[2] for d in rescales])}")
print(f"scale-down after the load fell: {'%.1f s (%d -> %d)' % (down[0] - step_at - step_for, down[1], down[2]) if down else 'none'}")
print(f"rescales: {len(rescales)}, changes of direction: {flips}")
print(f"exit code after the drain: {p.returncode}")
if p.returncode != 0:
    print("\n".join(last))
PY
