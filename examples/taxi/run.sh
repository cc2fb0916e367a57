#!/usr/bin/env bash
# The main job: the taxi tutorial pipeline (seed 001) on one generated day of trips.
# Builds riverbank, generates data/taxi/ if it is not there, then runs the pipeline.
set -euo pipefail
cd "$(dirname "$0")/../.."
# The same build directory as CI and the benches (outside the clone), unless one is set.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/riverbank/target}
riverbank() { cargo run --release --quiet -p riverbank -- "$@"; }
cargo build --release --quiet -p riverbank
if ! compgen -G "data/taxi/*.parquet" > /dev/null; then
  riverbank generate taxi --days 1 --format parquet --out data/taxi
fi
riverbank run examples/taxi/taxi.yaml --jinja-variables '{"input": "data/taxi/*.parquet", "output": "out/taxi"}'
echo "--- top zones by revenue (out/taxi/zones-*.jsonl):"
sort -t: -k3 -g -r out/taxi/zones-*.jsonl | head -3 || true
echo "--- first hours (out/taxi/hours-*.jsonl):"
sort out/taxi/hours-*.jsonl | head -3
