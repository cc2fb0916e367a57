#!/usr/bin/env bash
# Distributed-runtime benchmark on this machine: the 31-day taxi pipeline in one process and on
# 1 and 2 worker processes (equal cores: the machine's cores shared among the workers), and the
# shuffle throughput on loopback (every trip through a Reshuffle). Checks that every run gives
# byte-identical output. Uses bench/data (bench/taxi.sh generates it).
#
# usage: bench/cluster.sh [RUNS]     (best of RUNS, default 3)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
RUNS=${1:-3}
DATA_DIR=${DATA_DIR:-$HERE/data}
OUT=${OUT_DIR:-$HERE/out}/cluster
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/riverbank/target}
BIN=$CARGO_TARGET_DIR/release/riverbank
cargo build --release --quiet -p riverbank
if ! compgen -G "$DATA_DIR/*.parquet" > /dev/null; then
  "$BIN" generate taxi --days 31 --rows-per-day 95500 --seed 2024 --format parquet --out "$DATA_DIR"
fi
rm -rf "$OUT"; mkdir -p "$OUT"

# best_of NAME ARGS...: runs riverbank RUNS times, prints the best wall time (s).
best_of() {
  local name=$1; shift
  local best=""
  for _ in $(seq "$RUNS"); do
    local t0 t1
    t0=$(date +%s.%N)
    "$BIN" run "$@" --no-progress 2> "$OUT/$name.log"
    t1=$(date +%s.%N)
    local t; t=$(echo "$t1 - $t0" | bc -l)
    if [[ -z $best ]] || (( $(echo "$t < $best" | bc -l) )); then best=$t; fi
  done
  echo "$best"
}

vars() { printf '{"input": "%s/*.parquet", "output": "%s/%s"}' "$DATA_DIR" "$OUT" "$1"; }
taxi=$ROOT/examples/taxi/taxi.yaml
t_local=$(best_of local "$taxi" --jinja-variables "$(vars local)")
t_w1=$(best_of w1 "$taxi" --workers 1 --jinja-variables "$(vars w1)")
t_w2=$(best_of w2 "$taxi" --workers 2 --jinja-variables "$(vars w2)")
for n in w1 w2; do
  cmp -s <(cat "$OUT"/local/*) <(cat "$OUT/$n"/*) || { echo "$n output differs from the local run" >&2; exit 1; }
done
printf '\n%-34s %8s %8s\n' "31-day taxi (2.96 M rows)" "wall s" "vs local"
printf '%-34s %8.3f %8s\n' "local (one process)" "$t_local" "1.00"
printf '%-34s %8.3f %8.2f\n' "--workers 1 (coordinator + 1)" "$t_w1" "$(echo "$t_w1 / $t_local" | bc -l)"
printf '%-34s %8.3f %8.2f\n' "--workers 2 (coordinator + 2)" "$t_w2" "$(echo "$t_w2 / $t_local" | bc -l)"
echo "outputs byte-identical: yes"

t_sh=$(best_of shuffle "$HERE/shuffle.yaml" --workers 2 --jinja-variables "$(vars shuffle)")
t_sh_local=$(best_of shuffle-local "$HERE/shuffle.yaml" --jinja-variables "$(vars shuffle-local)")
line=$(grep 'shuffled' "$OUT/shuffle.log")
bytes=$(echo "$line" | sed -E 's/.*; ([0-9.]+) (B|KiB|MiB|GiB) shuffled/\1 \2/')
mib=$(echo "$bytes" | awk '{v=$1; u=$2; if(u=="GiB")v*=1024; else if(u=="KiB")v/=1024; else if(u=="B")v/=1048576; print v}')
printf '\nshuffle (Reshuffle of every trip, six columns): %s MiB shuffled\n' "$mib"
printf '  2 workers (half the streams cross loopback HTTP/2): %.3f s end to end = %.0f MiB/s\n' \
  "$t_sh" "$(echo "$mib / $t_sh" | bc -l)"
printf '  one process (local files):                        %.3f s end to end = %.0f MiB/s\n' \
  "$t_sh_local" "$(echo "$mib / $t_sh_local" | bc -l)"
