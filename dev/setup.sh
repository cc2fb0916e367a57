#!/usr/bin/env bash
# Installs what the tests use beside the Rust toolchain, on a fresh machine too; each step is
# skipped when its part is already there. Real servers, not mocks: s3s-fs (S3), tansu (Kafka
# protocol), nats-server, headless Chromium; Helm's renderer and Kubernetes' schemas as Python
# libraries for the chart test; Apache Beam in a venv for the conformance test. Called by
# dev/test.sh (the README's test command), hence by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
apt_install() { # apt_install PACKAGE... (one `apt-get update` per run)
  if [ -z "${APT_UPDATED:-}" ]; then
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    APT_UPDATED=1
  fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
have() { command -v "$1" >/dev/null 2>&1 || [ -x "$HOME/.cargo/bin/$1" ]; }

echo "== python packages for the chart test (Helm as a library, Kubernetes schemas)"
python3 -m pip install --quiet --disable-pip-version-check helm-python-sdk kubernetes-validate pyyaml

echo "== Apache Beam for the conformance test (its cases' UDFs name apache_beam's callables and CombineFns)"
# The worker's embedded Python gets this venv's site-packages (PYTHONPATH) in cli/tests/conformance.rs,
# as Beam's own test runs with Beam installed. Built by the Python riverbank embeds (python3 here).
venv="${RIVERBANK_BEAM_VENV:-$HOME/.cache/riverbank/beam-venv}"
if [ ! -f "$venv/.complete-2.77.0" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check 'apache-beam[yaml]==2.77.0' mock
  touch "$venv/.complete-2.77.0"
fi
# What Beam's own runner tests import beside apache-beam (portable/tests/sdk/validates_runner.py).
# (pytest: Beam's fn_runner_test imports it.)
if [ ! -f "$venv/.complete-runner-tests-2" ]; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check pyhamcrest tenacity parameterized pytest
  touch "$venv/.complete-runner-tests-2"
fi

echo "== a real S3 server for the s3:// tests (file-backed, on loopback)"
have s3s-fs || cargo install s3s-fs --version 0.14.1 --features binary --locked

echo "== Kafka and NATS brokers for the streaming connectors' tests (loopback, temp dirs)"
# tansu: a Kafka-protocol broker in Rust; only its in-memory storage engine (dynostore). Its own
# target dir, removed after: its build shares nothing with the workspace's.
if ! have tansu; then
  tansu_build="$(mktemp -d)"
  cargo install tansu --version 0.6.0 --no-default-features --features dynostore --locked --target-dir "$tansu_build"
  rm -rf "$tansu_build"
fi
if ! command -v nats-server >/dev/null 2>&1 && [ ! -x /usr/sbin/nats-server ]; then
  apt_install nats-server
fi

echo "== headless Chromium and chromedriver for the console's browser test (cli/tests/console.rs)"
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  apt_install chromium chromium-driver
fi
# The worker image's root-file-system test (cli/tests/image_rootfs.rs) needs ldd, unshare and
# chroot, which Debian has in every install (libc-bin, util-linux, coreutils).
