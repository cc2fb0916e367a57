#!/usr/bin/env bash
# Python UDF benchmark: the taxi job with `sql` UDFs, with Python expressions (translated to
# SQL by Riverbank) and with Python callables (run in the interpreter), on Riverbank, and the
# two Python versions on Beam's own YAML runner (DirectRunner), side by side. See bench/README.md.
#
# usage: bench/udf.sh [--skip-beam]     (Beam needs bench/.venv: bench/taxi.sh --install --beam)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
DAYS=${DAYS:-31}
ROWS_PER_DAY=${ROWS_PER_DAY:-95500}
SEED=${SEED:-2024}
DATA_DIR=${DATA_DIR:-$HERE/data}
OUT_DIR=${OUT_DIR:-$HERE/out/udf}
SLOTS=${SLOTS:-$(nproc)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/riverbank/target}
RUN_BEAM=1
[[ "${1:-}" == --skip-beam ]] && RUN_BEAM=0
PY=$HERE/.venv/bin/python
[[ -x $PY ]] || { echo "bench/.venv is missing: run bench/taxi.sh --install --beam first" >&2; exit 2; }

log() { printf '\n== %s\n' "$*" >&2; }

log "building riverbank (release)"
cargo build --release -p riverbank --manifest-path "$ROOT/Cargo.toml" >&2
RB=$CARGO_TARGET_DIR/release/riverbank

params="days=$DAYS rows_per_day=$ROWS_PER_DAY seed=$SEED"
if [[ "$(cat "$DATA_DIR/.params" 2>/dev/null)" != "$params" ]]; then
  log "generating $DAYS days of trips into $DATA_DIR"
  rm -rf "$DATA_DIR"
  "$RB" generate taxi --days "$DAYS" --rows-per-day "$ROWS_PER_DAY" --seed "$SEED" \
    --format parquet --out "$DATA_DIR" >&2
  echo "$params" >"$DATA_DIR/.params"
fi
UDATA=$DATA_DIR/udf
if [[ "$(cat "$UDATA/.params" 2>/dev/null)" != "$params" ]]; then
  log "converting timestamps to epoch microseconds into $UDATA (Beam YAML reads no Parquet timestamps)"
  rm -rf "$UDATA"
  "$PY" "$HERE/udf_data.py" "$DATA_DIR" "$UDATA" >&2
  echo "$params" >"$UDATA/.params"
fi
ROWS=$((DAYS * ROWS_PER_DAY))

rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR"
RESULTS=$OUT_DIR/results.tsv
# measure NAME CMD...: one row of results (wall s, CPU s, peak RSS MB).
measure() {
  local name=$1
  shift
  log "$name"
  /usr/bin/time -f "%e %U %S %M" -o "$OUT_DIR/$name.time" "$@" >"$OUT_DIR/$name.log" 2>&1 || {
    tail -n 20 "$OUT_DIR/$name.log" >&2
    return 1
  }
  read -r wall user sys rss <"$OUT_DIR/$name.time"
  printf '%s\t%s\t%s\t%s\n' "$name" "$wall" "$(awk -v u="$user" -v s="$sys" 'BEGIN{print u+s}')" "$((rss / 1024))" >>"$RESULTS"
}
vars() { printf '{"input": "%s/*.parquet", "output": "%s"}' "$UDATA" "$OUT_DIR/$1"; }

for v in sql python callable; do
  measure "riverbank-$v" "$RB" run "$HERE/udf/taxi_$v.yaml" --slots "$SLOTS" --no-progress \
    --jinja-variables "$(vars "riverbank-$v")"
done
"$RB" plan "$HERE/udf/taxi_python.yaml" --jinja-variables "$(vars unused)" | sed -n '/^Python UDFs/,$p' >&2
if [[ $RUN_BEAM == 1 ]]; then
  for v in python callable; do
    measure "beam-$v" "$PY" -m apache_beam.yaml.main --yaml_pipeline_file="$HERE/udf/taxi_$v.yaml" \
      --jinja_variables "$(vars "beam-$v")" --runner=DirectRunner
  done
fi
"$PY" "$HERE/udf_report.py" "$OUT_DIR" "$ROWS"
