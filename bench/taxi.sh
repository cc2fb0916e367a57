#!/usr/bin/env bash
# Taxi benchmark, side by side: Riverbank in process, DuckDB, Apache DataFusion (Python
# bindings) and Polars (lazy, streaming engine) on the same two aggregations, each timed as a
# whole command (start-up included), median of RUNS; Parquet and CSV. See bench/README.md.
#
# usage: bench/taxi.sh [--days 31|365|N] [--format parquet|csv|both] [--runs N] [--install]
#                      [--regenerate] [--skip-riverbank] [--skip-duckdb] [--skip-datafusion]
#                      [--skip-polars] [--beam] [--no-build]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")

DAYS=${DAYS:-31}
FORMATS=parquet
RUNS=${RUNS:-5}
SEED=${SEED:-2024}
BEAM_DAYS=${BEAM_DAYS:-1}             # DirectRunner is slow: first N days; 0 or "all" = all
DATA_DIR=${DATA_DIR:-$HERE/data}
OUT_DIR=${OUT_DIR:-$HERE/out}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/riverbank/target}

INSTALL=0 REGENERATE=0 RUN_BEAM=0 BUILD=1
declare -A RUN=([riverbank]=1 [duckdb]=1 [datafusion]=1 [polars]=1)
while (($#)); do
  case "$1" in
    --days) DAYS=$2; shift ;;
    --format) FORMATS=$2; shift ;;
    --runs) RUNS=$2; shift ;;
    --install) INSTALL=1 ;;
    --regenerate) REGENERATE=1 ;;
    --skip-riverbank | --skip-duckdb | --skip-datafusion | --skip-polars) RUN[${1#--skip-}]=0 ;;
    --beam) RUN_BEAM=1 ;;
    --no-build) BUILD=0 ;;   # use the release binary as it is
    -h | --help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $FORMATS == both ]] && FORMATS="parquet csv"
[[ "$BEAM_DAYS" == all ]] && BEAM_DAYS=0
# The month: 31 daily files of 95,500 trips (2,960,500 rows, the product spec's month). Other
# lengths: one file, the generator's ≈77,000 trips a day (365 days: 28,105,000 rows, ≈600 MB).
if [[ $DAYS == 31 ]]; then ROWS_PER_DAY=${ROWS_PER_DAY:-95500}; else ROWS_PER_DAY=${ROWS_PER_DAY:-77000}; fi
ROWS=$((DAYS * ROWS_PER_DAY))

log() { printf '\n== %s\n' "$*"; }

VENV=$HERE/.venv
if [[ $INSTALL == 1 ]]; then
  log "installing duckdb, datafusion, polars and pyarrow into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet duckdb datafusion polars pyarrow
  if [[ $RUN_BEAM == 1 ]]; then "$VENV/bin/pip" install --quiet apache-beam; fi
fi
if [[ -x $VENV/bin/python ]]; then PY=$VENV/bin/python; else PY=${PYTHON:-python3}; fi
have_py() { "$PY" -c "import $1" >/dev/null 2>&1; }

BIN=$CARGO_TARGET_DIR/release/riverbank
if [[ ${RUN[riverbank]} == 1 && $BUILD == 1 ]]; then
  log "building riverbank (release) into $CARGO_TARGET_DIR"
  (cd "$ROOT" && cargo build --release -p riverbank)
fi

# input FORMAT: where that format's data is (generated once, reused while the parameters match).
input() {
  local fmt=$1 dir out
  if [[ $DAYS == 31 && $fmt == parquet ]]; then
    dir=$DATA_DIR out=$DATA_DIR            # the month's layout other scripts use
  elif [[ $DAYS == 31 ]]; then
    dir=$DATA_DIR/days-31-$fmt out=$dir
  else
    dir=$DATA_DIR/days-$DAYS-$fmt out=$dir/taxi.$fmt
  fi
  local params="days=$DAYS rows_per_day=$ROWS_PER_DAY seed=$SEED format=$fmt"
  shopt -s nullglob
  local files=("$dir"/*."$fmt")
  if [[ $REGENERATE == 1 || ${#files[@]} == 0 || "$(cat "$dir/.params" 2>/dev/null)" != "$params" ]]; then
    [[ -x $BIN ]] || { echo "need $BIN to generate data (run without --skip-riverbank once)" >&2; exit 1; }
    log "generating $DAYS days x $ROWS_PER_DAY rows ($fmt) into $dir" >&2
    mkdir -p "$dir"
    rm -f "$dir"/*."$fmt" "$dir/.params"
    "$BIN" generate taxi --days "$DAYS" --rows-per-day "$ROWS_PER_DAY" --seed "$SEED" \
      --format "$fmt" --out "$out" >&2
    echo "$params" >"$dir/.params"
  fi
  if [[ $DAYS == 31 ]]; then echo "$dir/*.$fmt"; else echo "$dir/taxi.$fmt"; fi
}

mkdir -p "$OUT_DIR/results"
rm -f "$OUT_DIR"/results/*.json
RESULTS=()
CHECK_FAILED=0
for fmt in $FORMATS; do
  IN=$(input "$fmt")
  log "$fmt: $ROWS rows from $IN ($(du -shc $IN | tail -1 | cut -f1)); median of $RUNS runs, one warm-up"
  measure() { # NAME OUTDIR CMD...: median of RUNS whole-process runs into results/.
    local name=$1 out=$2
    shift 2
    "$PY" "$HERE/measure.py" --engine "$name" --format "$fmt" --rows "$ROWS" --runs "$RUNS" \
      --clean "$out" --log "$OUT_DIR/$fmt-${name%% *}.log" \
      --result "$OUT_DIR/results/$fmt-$((${#RESULTS[@]} + 1))-${name%% *}.json" -- "$@"
    RESULTS+=("$OUT_DIR/results/$fmt-$((${#RESULTS[@]} + 1))-${name%% *}.json")
  }
  outs=()
  if [[ ${RUN[riverbank]} == 1 ]]; then
    pipeline=$ROOT/examples/taxi/taxi.yaml
    [[ $fmt == csv ]] && pipeline=$HERE/taxi_csv.yaml
    out=$OUT_DIR/$fmt/riverbank
    measure "Riverbank" "$out" "$BIN" run "$pipeline" --no-progress \
      --jinja-variables "{\"input\": \"$IN\", \"output\": \"$out\"}"
    outs+=("$out")
  fi
  for engine in duckdb datafusion polars; do
    [[ ${RUN[$engine]} == 1 ]] || continue
    if ! have_py "$engine"; then
      log "$engine: skipped ($PY cannot import it; use --install)"
      continue
    fi
    out=$OUT_DIR/$fmt/$engine
    measure "$engine" "$out" "$PY" "$HERE/engines.py" "$engine" --format "$fmt" --input "$IN" --output "$out"
    outs+=("$out")
  done
  # Correctness: every engine's answer against the first's (revenue within 1e-9, counts exact).
  if ((${#outs[@]} > 1)); then
    "$PY" "$HERE/engines.py" check --output "${outs[0]}" --against "${outs[@]:1}" || CHECK_FAILED=1
  fi
done

# Apache Beam's DirectRunner (optional; slow, on a subset; Parquet only).
if [[ $RUN_BEAM == 1 ]] && have_py "apache_beam, pyarrow"; then
  log "apache beam DirectRunner (BEAM_DAYS=${BEAM_DAYS/#0/all})"
  args=(--input "$DATA_DIR" --output "$OUT_DIR/beam" --days "$BEAM_DAYS" --total-rows "$ROWS"
    --result "$OUT_DIR/results/z-beam.json")
  "$PY" "$HERE/beam_taxi.py" "${args[@]}" || CHECK_FAILED=1
  RESULTS+=("$OUT_DIR/results/z-beam.json")
fi

log "results: $DAYS days, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" -c 'import duckdb, datafusion, polars' 2>/dev/null && "$PY" "$HERE/engines.py" version
python3 "$HERE/report.py" "${RESULTS[@]}"
exit "$CHECK_FAILED"
