#!/usr/bin/env bash
# Distributed-runtime benchmark on this machine: the taxi pipeline in one process, on a
# coordinator and 1 worker (all cores; and one slot), on 2 workers with one slot each over
# loopback, and on 2 workers in two network namespaces joined by a veth pair shaped to
# 1 Gbit/s (root only), so shuffle crosses a real network stack. Each timed as a whole command,
# median of RUNS; fails if any output differs from the in-process run by a byte. Then the
# shuffle throughput (every trip through a Reshuffle) on the 31-day data.
#
# usage: bench/cluster.sh [--days 31|365] [--runs N] [--no-netns] [--no-build]   (Ballista too when BALLISTA_VENV has it)
#   data: bench/taxi.sh --days N generates it (31: bench/data/*.parquet; else
#   bench/data/days-N-parquet/taxi.parquet).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
DAYS=31 RUNS=5 NETNS=1 BUILD=1
while (($#)); do
  case "$1" in
    --days) DAYS=$2; shift ;;
    --runs) RUNS=$2; shift ;;
    --no-netns) NETNS=0 ;;
    --no-build) BUILD=0 ;;
    -h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    [0-9]*) RUNS=$1 ;;   # the old positional RUNS
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
DATA_DIR=${DATA_DIR:-$HERE/data}
OUT=${OUT_DIR:-$HERE/out}/cluster-$DAYS
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/riverbank/target}
BIN=$CARGO_TARGET_DIR/release/riverbank
PY=python3
[[ -x $HERE/.venv/bin/python ]] && PY=$HERE/.venv/bin/python
[[ $BUILD == 0 ]] || (cd "$ROOT" && cargo build --release --quiet -p riverbank)
if [[ $DAYS == 31 ]]; then
  INPUT="$DATA_DIR/*.parquet"
  compgen -G "$INPUT" >/dev/null ||
    "$BIN" generate taxi --days 31 --rows-per-day 95500 --seed 2024 --format parquet --out "$DATA_DIR"
  ROWS=2960500
else
  INPUT=$DATA_DIR/days-$DAYS-parquet/taxi.parquet
  [[ -f $INPUT ]] || "$HERE/taxi.sh" --days "$DAYS" --runs 1 --no-build --skip-duckdb --skip-datafusion --skip-polars
  ROWS=$((DAYS * 77000))
fi
rm -rf "$OUT"; mkdir -p "$OUT/results"
taxi=$ROOT/examples/taxi/taxi.yaml
vars() { printf '{"input": "%s", "output": "%s/%s"}' "$INPUT" "$OUT" "$1"; }

# time_run NAME CMD...: median of RUNS whole-process runs (one warm-up), output in $OUT/NAME.
time_run() {
  local name=$1; shift
  "$PY" "$HERE/measure.py" --engine "$name" --rows "$ROWS" --runs "$RUNS" --clean "$OUT/$name" \
    --log "$OUT/$name.log" --result "$OUT/results/$name.json" -- "$@"
}
time_run local "$BIN" run "$taxi" --no-progress --jinja-variables "$(vars local)"
time_run w1 "$BIN" run "$taxi" --no-progress --workers 1 --jinja-variables "$(vars w1)"
time_run w1-1slot "$BIN" run "$taxi" --no-progress --workers 1 --slots 1 --jinja-variables "$(vars w1-1slot)"
time_run w2-1slot "$BIN" run "$taxi" --no-progress --workers 2 --slots 1 --jinja-variables "$(vars w2-1slot)"
runs=(local w1 w1-1slot w2-1slot)

# Two network namespaces, a veth pair between them shaped to 1 Gbit/s each way; the
# coordinator and worker 1 in the first, worker 2 in the second.
if [[ $NETNS == 1 && $(id -u) == 0 ]] && command -v ip >/dev/null; then
  cleanup() { ip netns del rbbench1 2>/dev/null || true; ip netns del rbbench2 2>/dev/null || true; }
  trap cleanup EXIT
  cleanup
  ip netns add rbbench1
  ip netns add rbbench2
  ip link add rbveth1 netns rbbench1 type veth peer name rbveth2 netns rbbench2
  ip -n rbbench1 addr add 10.77.0.1/24 dev rbveth1
  ip -n rbbench2 addr add 10.77.0.2/24 dev rbveth2
  for n in 1 2; do
    ip -n rbbench$n link set lo up
    ip -n rbbench$n link set rbveth$n up
    # netem (rate + delay) where the kernel has it; else a token bucket for the rate alone.
    if ! ip netns exec rbbench$n tc qdisc add dev rbveth$n root netem rate 1gbit delay 0.2ms 2>/dev/null; then
      ip netns exec rbbench$n tc qdisc add dev rbveth$n root tbf rate 1gbit burst 128kb latency 5ms
    fi
  done
  SHAPING=$(ip netns exec rbbench1 tc qdisc show dev rbveth1 | head -1)
  cat >"$OUT/netns-run.sh" <<EOF
#!/usr/bin/env bash
# One run: coordinator + worker 1 in rbbench1, worker 2 in rbbench2; ends when the job is over.
set -euo pipefail
state=\$(mktemp -d)
trap 'rm -rf "\$state"' EXIT
ip netns exec rbbench1 "$BIN" coordinator --plan "$taxi" --jinja-variables '$(vars netns)' \\
  --bind 10.77.0.1 --port 7070 --state-dir "\$state/c" --exit-when-done &
c=\$!
# Workers start once the coordinator listens (as \`run --workers\` does), not on a retry timer.
until ip netns exec rbbench1 bash -c 'echo > /dev/tcp/10.77.0.1/7070' 2>/dev/null; do
  kill -0 \$c || exit 1
  sleep 0.005
done
workers=()
for n in 1 2; do
  ip netns exec rbbench\$n "$BIN" worker --coordinator 10.77.0.1:7070 --plan "$taxi" \\
    --jinja-variables '$(vars netns)' --bind 10.77.0.\$n --port 7071 \\
    --advertise 10.77.0.\$n:7071 --data-dir "\$state/w\$n" --name w\$n --slots 1 --exit-when-done &
  workers+=(\$!)
done
# The workers exit once they hear the job is over (its output committed); the coordinator
# would linger 1.5 s more for late listeners, which \`run --workers\` does not wait for either.
wait "\${workers[@]}"
kill \$c 2>/dev/null || true
wait \$c || true
EOF
  chmod +x "$OUT/netns-run.sh"
  time_run netns "$OUT/netns-run.sh"
  runs+=(netns)
  cleanup
  trap - EXIT
else
  SHAPING="not run (needs root and iproute2)"
fi

for n in "${runs[@]:1}"; do
  cmp -s <(cat "$OUT"/local/*) <(cat "$OUT/$n"/*) || { echo "$n output differs from the in-process run" >&2; exit 1; }
done

# DataFusion Ballista on the same two aggregations, at equal cores: a scheduler and two
# executors of one task each (bench/ballista_cluster.py), started before and left out of the
# timing; the timed command is the client (`bench/engines.py ballista`: planning, the two
# queries on the cluster, results back). Needs BALLISTA_VENV with the `ballista` package.
BALLISTA_VENV=${BALLISTA_VENV:-$HOME/.cache/riverbank/ballista-venv}
BALLISTA=""
if [[ -x $BALLISTA_VENV/bin/python ]] && "$BALLISTA_VENV/bin/python" -c 'import ballista' 2>/dev/null; then
  BPY=$BALLISTA_VENV/bin/python
  "$BPY" "$HERE/ballista_cluster.py" scheduler --port 50050 >"$OUT/ballista-scheduler.log" 2>&1 &
  bpids=($!)
  until bash -c 'echo > /dev/tcp/127.0.0.1/50050' 2>/dev/null; do sleep 0.1; done
  for n in 1 2; do
    "$BPY" "$HERE/ballista_cluster.py" executor --port $((50050 + n)) --scheduler-port 50050 --tasks 1 \
      >"$OUT/ballista-executor-$n.log" 2>&1 &
    bpids+=($!)
  done
  sleep 3 # the executors register with the scheduler
  BALLISTA_SCHEDULER=df://127.0.0.1:50050 time_run ballista "$BPY" "$HERE/engines.py" ballista \
    --format parquet --input "$INPUT" --output "$OUT/ballista"
  kill "${bpids[@]}" 2>/dev/null || true
  wait "${bpids[@]}" 2>/dev/null || true
  "$PY" "$HERE/engines.py" check --output "$OUT/local" --against "$OUT/ballista" ||
    { echo "ballista output differs from the in-process run" >&2; exit 1; }
  runs+=(ballista)
  BALLISTA=" (Ballista: values checked, not bytes)"
fi
"$PY" - "$OUT/results" "$DAYS" "$ROWS" "$SHAPING" "$BALLISTA" "${runs[@]}" <<'PY'
import json, sys
d, days, rows, shaping, ballista, *runs = sys.argv[1:]
r = {n: json.load(open(f"{d}/{n}.json")) for n in runs}
label = {
    "local": "in process (all cores)",
    "w1": "--workers 1 (all cores)",
    "w1-1slot": "--workers 1 --slots 1",
    "w2-1slot": "--workers 2, one slot each",
    "netns": "2 workers, 2 netns, shaped veth",
    "ballista": "Ballista, 2 executors x 1 task",
}
print(f"\n{days}-day taxi ({int(rows):,} rows), median of {r['local']['runs']} whole-process runs")
print(f"{'run':34} {'wall s':>8} {'CPU s':>7} {'RSS MB':>7} {'vs local':>9} {'vs w1-1slot':>12}")
for n in runs:
    x = r[n]
    print(f"{label[n]:34} {x['seconds']:8.3f} {x['cpu_s']:7.2f} {x['peak_rss_mb']:7.0f} "
          f"{x['seconds'] / r['local']['seconds']:9.2f} {x['seconds'] / r['w1-1slot']['seconds']:12.2f}")
print(f"outputs byte-identical to the in-process run: yes{ballista}")
print(f"speed-up of 2 one-slot workers over 1: {r['w1-1slot']['seconds'] / r['w2-1slot']['seconds']:.2f}x")
print(f"veth shaping: {shaping}")
PY

if [[ $DAYS == 31 ]]; then
  shuffle_vars() { printf '{"input": "%s", "output": "%s/%s"}' "$INPUT" "$OUT" "$1"; }
  t0=$(date +%s.%N)
  "$BIN" run "$HERE/shuffle.yaml" --workers 2 --no-progress --jinja-variables "$(shuffle_vars shuffle)" 2>"$OUT/shuffle.log"
  t1=$(date +%s.%N)
  line=$(grep 'shuffled' "$OUT/shuffle.log")
  bytes=$(echo "$line" | sed -E 's/.*; ([0-9.]+) (B|KiB|MiB|GiB) shuffled/\1 \2/')
  mib=$(echo "$bytes" | awk '{v=$1; u=$2; if(u=="GiB")v*=1024; else if(u=="KiB")v/=1024; else if(u=="B")v/=1048576; print v}')
  printf '\nshuffle (Reshuffle of every trip, six columns, 2 workers): %s MiB in %.3f s = %.0f MiB/s\n' \
    "$mib" "$(echo "$t1 - $t0" | bc -l)" "$(echo "$mib / ($t1 - $t0)" | bc -l)"
fi
