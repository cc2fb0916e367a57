#!/usr/bin/env bash
# What a Nexmark query writes: one `riverbank run` per query as bench/nexmark_steady.sh runs it
# (all events available at once, one slot, 250,000 events per checkpoint), with its wall and CPU
# seconds, peak RSS, the bytes it wrote through write(2) (`wchar` of /proc/PID/io: output,
# shuffle, state stores, checkpoint uploads) and what its checkpoint directory holds at the end.
# Usage: bench/nexmark_writes.sh [QUERIES] [EVENTS]   (BIN=path/to/riverbank to compare builds)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/riverbank/target}
BIN=${BIN:-$CARGO_TARGET_DIR/release/riverbank}
QUERIES=${1:-"q0 q3 q4 q5 q7 q8"}
EVENTS=${2:-3000000}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
printf '%-4s %8s %8s %8s %12s %14s\n' query "wall s" "CPU s" "peak MB" "written MB" "checkpoint MB"
for q in $QUERIES; do
  rm -rf "$WORK/run"; mkdir -p "$WORK/run"
  vars="{\"rate\": 1000000, \"count\": $EVENTS, \"start\": \", start: '2024-01-01T00:00:00Z'\", \"out\": \"$WORK/run/out\", \"interval\": 1}"
  /usr/bin/time -f "%e %U %S %M" -o "$WORK/time" "$BIN" run "bench/nexmark/$q.yaml" \
    --jinja-variables "$vars" --no-progress --slots 1 --checkpoint-dir "$WORK/run/ck" \
    --spill-dir "$WORK/run/spill" --max-per-checkpoint 250000 2>/dev/null &
  pid=$!
  written=0
  # The shell's child is time(1); riverbank is its child.
  while kill -0 "$pid" 2>/dev/null; do
    rb=$(pgrep -P "$pid" | head -1 || true)
    w=$( [ -n "$rb" ] && awk '/^wchar/ {print $2}' "/proc/$rb/io" 2>/dev/null || true)
    [ -n "$w" ] && written=$w
    sleep 0.02
  done
  wait "$pid"
  ck=$(du -sm "$WORK/run/ck" 2>/dev/null | cut -f1)
  read -r wall user sys peak < "$WORK/time"
  python3 -c "print(f'%-4s %8s %8.2f %8d %12d %14s' % ('$q', '$wall', $user + $sys, $peak // 1024, $written // 1000000, '${ck:-0}'))"
done
