#!/usr/bin/env bash
# Taxi benchmark: Riverbank's local runner vs DuckDB vs the Apache Beam DirectRunner on
# one month of synthetic NYC yellow-taxi trips. See bench/README.md.
#
# usage: bench/taxi.sh [--install] [--regenerate] [--skip-riverbank] [--skip-duckdb] [--skip-beam]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")

DAYS=${DAYS:-31}
ROWS_PER_DAY=${ROWS_PER_DAY:-95500}   # 31 x 95,500 = 2,960,500 rows ("about 2.96 million")
SEED=${SEED:-2024}
BEAM_DAYS=${BEAM_DAYS:-1}             # DirectRunner is slow: first N days; 0 or "all" = all
DATA_DIR=${DATA_DIR:-$HERE/data}
OUT_DIR=${OUT_DIR:-$HERE/out}
DUCKDB_THREADS=${DUCKDB_THREADS:-}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/riverbank/target}

INSTALL=0 REGENERATE=0 RUN_RIVERBANK=1 RUN_DUCKDB=1 RUN_BEAM=1
for arg in "$@"; do
  case "$arg" in
    --install) INSTALL=1 ;;
    --regenerate) REGENERATE=1 ;;
    --skip-riverbank) RUN_RIVERBANK=0 ;;
    --skip-duckdb) RUN_DUCKDB=0 ;;
    --skip-beam) RUN_BEAM=0 ;;
    -h | --help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $arg (try --help)" >&2; exit 2 ;;
  esac
done
[[ "$BEAM_DAYS" == all ]] && BEAM_DAYS=0

log() { printf '\n== %s\n' "$*"; }

# Python: bench/.venv if present (what --install creates), else $PYTHON or python3.
VENV=$HERE/.venv
if [[ $INSTALL == 1 ]]; then
  log "installing duckdb, pyarrow and apache-beam into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet duckdb pyarrow apache-beam
fi
if [[ -x $VENV/bin/python ]]; then PY=$VENV/bin/python; else PY=${PYTHON:-python3}; fi
have_py() { command -v "$PY" >/dev/null 2>&1 && "$PY" -c "import $1" >/dev/null 2>&1; }

# measure LOG CMD...: run CMD with output to LOG; sets WALL (seconds) and RSS_MB.
measure() {
  local out=$1
  shift
  local rc=0
  if [[ -x /usr/bin/time ]] && /usr/bin/time -v true >/dev/null 2>&1; then
    local t0 t1
    t0=$(date +%s.%N)
    /usr/bin/time -v -o "$out.rusage" "$@" >"$out" 2>&1 || rc=$?
    t1=$(date +%s.%N)
    WALL=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    RSS_MB=$(awk -F': *' '/Maximum resident set size/ { printf "%.1f", $2 / 1024 }' "$out.rusage")
  else
    python3 - "$out" "$@" >"$out.measure" <<'PY' || rc=$?
import resource, subprocess, sys, time
t = time.perf_counter()
with open(sys.argv[1], "w") as f:
    rc = subprocess.call(sys.argv[2:], stdout=f, stderr=subprocess.STDOUT)
wall = time.perf_counter() - t
rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
print(f"{wall:.3f} {rss_mb:.1f}")
sys.exit(rc)
PY
    read -r WALL RSS_MB <"$out.measure"
  fi
  if [[ $rc != 0 ]]; then
    echo "command failed (exit $rc): $*" >&2
    tail -n 30 "$out" >&2
    return "$rc"
  fi
}

mkdir -p "$OUT_DIR/results" "$DATA_DIR"
rm -f "$OUT_DIR"/results/*.json
ROWS=$((DAYS * ROWS_PER_DAY))
BIN=$CARGO_TARGET_DIR/release/riverbank

# 1. Build.
if [[ $RUN_RIVERBANK == 1 ]]; then
  log "building riverbank (release) into $CARGO_TARGET_DIR"
  (cd "$ROOT" && cargo build --release -p riverbank)
fi

# 2. Data: generated once, reused while the parameters match.
PARAMS="days=$DAYS rows_per_day=$ROWS_PER_DAY seed=$SEED"
shopt -s nullglob
files=("$DATA_DIR"/*.parquet)
if [[ $REGENERATE == 1 || ${#files[@]} != "$DAYS" || "$(cat "$DATA_DIR/.params" 2>/dev/null)" != "$PARAMS" ]]; then
  if [[ ! -x $BIN ]]; then
    echo "need $BIN to generate $DATA_DIR (run without --skip-riverbank once)" >&2
    exit 1
  fi
  log "generating $DAYS days x $ROWS_PER_DAY rows into $DATA_DIR"
  rm -f "$DATA_DIR"/*.parquet "$DATA_DIR/.params"
  measure "$OUT_DIR/generate.log" "$BIN" generate taxi --days "$DAYS" --rows-per-day "$ROWS_PER_DAY" \
    --seed "$SEED" --format parquet --out "$DATA_DIR"
  echo "$PARAMS" >"$DATA_DIR/.params"
  echo "generated $ROWS rows in ${WALL}s"
  files=("$DATA_DIR"/*.parquet)
else
  log "reusing $DATA_DIR ($PARAMS)"
fi
echo "${#files[@]} files, $(du -sh "$DATA_DIR" | cut -f1)"
RESULTS=()

# 3. Riverbank.
RB_OUT=$OUT_DIR/riverbank
if [[ $RUN_RIVERBANK == 1 ]]; then
  log "riverbank run examples/taxi/taxi.yaml"
  rm -rf "$RB_OUT"
  VARS=$(printf '{"input": "%s/*.parquet", "output": "%s"}' "$DATA_DIR" "$RB_OUT")
  measure "$OUT_DIR/riverbank.log" "$BIN" run "$ROOT/examples/taxi/taxi.yaml" --jinja-variables "$VARS"
  RPS=$(awk -v r="$ROWS" -v s="$WALL" 'BEGIN { printf "%.0f", r / s }')
  echo "riverbank: $ROWS rows in ${WALL}s = $RPS rows/s, peak RSS ${RSS_MB} MB"
  printf '{"engine": "Riverbank local", "rows": %s, "seconds": %s, "peak_rss_mb": %s, "check": "-"}\n' \
    "$ROWS" "$WALL" "$RSS_MB" >"$OUT_DIR/results/1-riverbank.json"
  RESULTS+=("$OUT_DIR/results/1-riverbank.json")
fi

# 4. DuckDB, cross-checked against Riverbank's output.
CHECK_FAILED=0
if [[ $RUN_DUCKDB == 1 ]]; then
  if have_py "duckdb, pyarrow"; then
    log "duckdb"
    args=(--input "$DATA_DIR" --output "$OUT_DIR/duckdb" --result "$OUT_DIR/results/2-duckdb.json")
    [[ $RUN_RIVERBANK == 1 ]] && args+=(--riverbank-out "$RB_OUT")
    [[ -n $DUCKDB_THREADS ]] && args+=(--threads "$DUCKDB_THREADS")
    measure "$OUT_DIR/duckdb.log" "$PY" "$HERE/duckdb_taxi.py" "${args[@]}" || CHECK_FAILED=1
    grep -E '^cross-check|^  ' "$OUT_DIR/duckdb.log" || true
    RESULTS+=("$OUT_DIR/results/2-duckdb.json")
  else
    log "duckdb: skipped ($PY cannot import duckdb and pyarrow; use --install)"
  fi
fi

# 5. Apache Beam DirectRunner (on a subset by default), cross-checked too.
if [[ $RUN_BEAM == 1 ]]; then
  if have_py "apache_beam, pyarrow"; then
    log "apache beam DirectRunner (BEAM_DAYS=${BEAM_DAYS/#0/all})"
    args=(--input "$DATA_DIR" --output "$OUT_DIR/beam" --days "$BEAM_DAYS" --total-rows "$ROWS"
      --result "$OUT_DIR/results/3-beam.json")
    [[ $RUN_RIVERBANK == 1 ]] && args+=(--riverbank-out "$RB_OUT")
    measure "$OUT_DIR/beam.log" "$PY" "$HERE/beam_taxi.py" "${args[@]}" || CHECK_FAILED=1
    grep -E '^cross-check|^  ' "$OUT_DIR/beam.log" || true
    RESULTS+=("$OUT_DIR/results/3-beam.json")
  else
    log "beam: skipped ($PY cannot import apache_beam and pyarrow; use --install)"
  fi
fi

# 6. Table. The Python engines time themselves (no interpreter start-up or imports);
#    Riverbank's time is the whole process.
log "results ($(nproc) cores)"
if ((${#RESULTS[@]})); then
  python3 "$HERE/report.py" "${RESULTS[@]}"
fi
exit "$CHECK_FAILED"
