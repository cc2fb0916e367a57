#!/usr/bin/env bash
# The README's test command: installs what the tests use (dev/setup.sh), then runs every test
# of the workspace with nextest. Extra arguments go to nextest (a filter, `-p CRATE`, ...).
# The end-to-end test on a Kubernetes cluster is ignored here (nextest lists it as skipped);
# e2e/README.md says how to run it.
set -euo pipefail
cd "$(dirname "$0")/.."
dev/setup.sh
export RIVERBANK_BEAM_VENV="${RIVERBANK_BEAM_VENV:-$HOME/.cache/riverbank/beam-venv}"
exec cargo nextest run --workspace --no-fail-fast "$@"
