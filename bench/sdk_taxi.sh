#!/usr/bin/env bash
# The tutorial's pipeline as Beam Python SDK code (examples/taxi/trips_pipeline.py) on the same
# generated Parquet, side by side: Beam's DirectRunner (one process, and its multi-processing
# mode with 2 workers, which is Beam's FnApiRunner over 2 SDK processes) and Riverbank's job
# server (LOOPBACK: user code in the submitting process; PROCESS: 2 SDK harness processes, as
# Riverbank starts them (Beam's harness with lean chains) and with Beam's harness alone).
# Same Python, same user code, same files. Each figure is the whole command (interpreter start,
# job server start and stop included: the server runs as a child of the timed command), timed
# by bench/measure.py; every output is compared with the DirectRunner's, line for line.
#
#   bench/sdk_taxi.sh [--days 31] [--runs 3] [--warmup 1]
set -euo pipefail
cd "$(dirname "$0")/.."
DAYS=31 RUNS=3 WARMUP=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --days) DAYS=$2; shift ;;
    --runs) RUNS=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/riverbank/target}
VENV=${RIVERBANK_BEAM_VENV:-$HOME/.cache/riverbank/beam-venv}
PY=$VENV/bin/python
[[ -x $PY ]] || { echo "no apache-beam venv at $VENV: run dev/setup.sh" >&2; exit 1; }
# The job server in release: the same JobServer as `riverbank job-server`, built without the whole
# CLI (whose release build takes a long while); the data generator from the dev build.
cargo build --quiet --release -p riverbank-portable --example job_server
cargo build --quiet -p riverbank
SERVER=$CARGO_TARGET_DIR/release/examples/job_server
BIN=$CARGO_TARGET_DIR/debug/riverbank
WORK=bench/out/sdk-taxi-$DAYS
DATA=bench/data/sdk-taxi-$DAYS
if ! compgen -G "$DATA/*.parquet" > /dev/null; then
  "$BIN" generate taxi --days "$DAYS" --format parquet --out "$DATA"
fi
ROWS=$((DAYS * 77000))
mkdir -p "$WORK"
PIPELINE=(examples/taxi/trips_pipeline.py --input "$DATA/*.parquet")
PROCESS_CONFIG="{\"command\": \"$PY -m apache_beam.runners.worker.sdk_worker_main\"}"

# One Riverbank run: a job server on a free port, the pipeline against it, the server stopped.
cat > "$WORK/riverbank.sh" <<SH
#!/usr/bin/env bash
set -euo pipefail
port=\$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$SERVER" "\$port" 2>"$WORK/job-server.log" &
server=\$!
trap 'kill \$server; wait \$server || true' EXIT
for _ in \$(seq 100); do (echo > /dev/tcp/127.0.0.1/\$port) 2>/dev/null && break; sleep 0.05; done
"$PY" "\$@" --runner=PortableRunner --job_endpoint=127.0.0.1:\$port
SH
chmod +x "$WORK/riverbank.sh"

measure() { # measure ENGINE OUT COMMAND...
  local engine=$1 out=$2; shift 2
  python3 bench/measure.py --engine "$engine" --rows "$ROWS" --runs "$RUNS" --warmup "$WARMUP" \
    --clean "$out" --log "$WORK/$engine.log" --result "$WORK/$engine.json" -- "$@"
}
measure beam-direct "$WORK/direct" "$PY" "${PIPELINE[@]}" --output "$WORK/direct" --runner=DirectRunner
measure beam-direct-2proc "$WORK/direct2" "$PY" "${PIPELINE[@]}" --output "$WORK/direct2" \
  --runner=DirectRunner --direct_num_workers=2 --direct_running_mode=multi_processing
measure riverbank-loopback "$WORK/loopback" "$WORK/riverbank.sh" "${PIPELINE[@]}" --output "$WORK/loopback" \
  --environment_type=LOOPBACK
measure riverbank-process-2 "$WORK/process" "$WORK/riverbank.sh" "${PIPELINE[@]}" --output "$WORK/process" \
  --environment_type=PROCESS --environment_config="$PROCESS_CONFIG" --sdk_worker_parallelism=2
measure riverbank-process-2-beam "$WORK/process-beam" "$WORK/riverbank.sh" "${PIPELINE[@]}" \
  --output "$WORK/process-beam" --environment_type=PROCESS --environment_config="$PROCESS_CONFIG" \
  --sdk_worker_parallelism=2 --experiments=riverbank_harness=off

status=0
for out in direct2 loopback process process-beam; do
  for f in zones hours; do
    if ! diff -q <(sort "$WORK/direct/$f") <(sort "$WORK/$out/$f") > /dev/null; then
      echo "MISMATCH: $out/$f differs from the DirectRunner's" >&2; status=1
    fi
  done
done
python3 - "$WORK" "$ROWS" <<'PY'
import json, sys
work, rows = sys.argv[1], int(sys.argv[2])
runs = {e: json.load(open(f"{work}/{e}.json")) for e in
        ["beam-direct", "beam-direct-2proc", "riverbank-loopback", "riverbank-process-2",
         "riverbank-process-2-beam"]}
base = runs["beam-direct"]["seconds"]
print(f"{rows:,} trips; median wall s, CPU s, peak RSS MB; speed-up over the DirectRunner")
for engine, r in runs.items():
    print(f"  {engine:24} {r['seconds']:7.2f} s  cpu {r['cpu_s']:7.2f} s  rss {r['peak_rss_mb']:7.1f} MB  x{base / r['seconds']:.2f}")
PY
exit $status
