#!/usr/bin/env bash
# The main job: the taxi tutorial pipeline (seed 001) on one generated day of trips.
# Builds riverbank, generates data/taxi/ if it is not there, then runs the pipeline.
set -euo pipefail
cd "$(dirname "$0")/../.."
# The same build directory as CI and the benches (outside the clone), unless one is set.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/riverbank/target}
# The dev profile: a day of trips takes a fraction of a second unoptimized, and the build takes
# well under half of `release`'s (bench/README.md, "First-run build time"); it is also the build
# the tests share. Benchmarks and real data want `--release`.
riverbank() { cargo run --quiet -p riverbank -- "$@"; }
cargo build --quiet -p riverbank
if ! compgen -G "data/taxi/*.parquet" > /dev/null; then
  riverbank generate taxi --days 1 --format parquet --out data/taxi
fi
riverbank run examples/taxi/taxi.yaml --jinja-variables '{"input": "data/taxi/*.parquet", "output": "out/taxi"}'
echo "--- top zones by revenue (out/taxi/zones.jsonl-*):"
sort -t: -k3 -g -r out/taxi/zones.jsonl-* | head -3 || true
echo "--- first hours (out/taxi/hours.jsonl-*):"
sort out/taxi/hours.jsonl-* | head -3
