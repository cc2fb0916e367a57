#!/usr/bin/env bash
# Peak memory of `riverbank job-server` for a Beam Python SDK GroupByKey bigger than its memory
# budget (bench/sdk/group_memory.py: N thousand x 1,000 values of 100 characters, 5,000 keys),
# at each budget given: the materialized data past the budget waits in a spill file. Prints one
# line per run: values, budget, peak RSS of the job server, wall time, MiB spilled.
#
#   bench/sdk_memory.sh [--thousands "1000 2000 4000"] [--budgets "1024 16"]
set -euo pipefail
cd "$(dirname "$0")/.."
THOUSANDS="1000 2000 4000" BUDGETS="1024 16"
while [[ $# -gt 0 ]]; do
  case $1 in
    --thousands) THOUSANDS=$2; shift ;;
    --budgets) BUDGETS=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/riverbank/target}
PY=${RIVERBANK_BEAM_VENV:-$HOME/.cache/riverbank/beam-venv}/bin/python
[[ -x $PY ]] || { echo "no apache-beam venv: run dev/setup.sh" >&2; exit 1; }
cargo build --quiet -p riverbank
BIN=$CARGO_TARGET_DIR/debug/riverbank
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT
port=18700
for n in $THOUSANDS; do
  for mb in $BUDGETS; do
    port=$((port + 1))
    /usr/bin/time -f "%M %e" -o "$LOG/time" "$BIN" job-server --port $port --memory-mb "$mb" 2> "$LOG/server" &
    server=$!
    sleep 1
    start=$(date +%s.%N)
    "$PY" bench/sdk/group_memory.py "localhost:$port" "$n" > "$LOG/script" 2>&1 || { cat "$LOG/script"; exit 1; }
    end=$(date +%s.%N)
    # GNU time ignores SIGINT while it waits: Ctrl-C goes to the server itself.
    pkill -INT -P $server; wait $server || true
    read -r rss _ < "$LOG/time"
    spilled=$(grep -o 'spilled [0-9]* MiB' "$LOG/server" | grep -o '[0-9]*' || echo 0)
    printf '%9d values  budget %5s MiB  peak RSS %5d MB  %5.1f s  spilled %5s MiB\n' \
      $((n * 1000)) "$mb" $((rss / 1024)) "$(echo "$end - $start" | bc)" "$spilled"
  done
done
