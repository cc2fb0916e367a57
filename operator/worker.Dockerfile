# syntax=docker/dockerfile:1.7
# The image of a DataflowJob's coordinator and worker pods: the `riverbank` binary (cli/), whose
# `coordinator` and `worker` subcommands the operator's StatefulSets run. Build from the
# repository root:
#   docker build -f operator/worker.Dockerfile -t riverbank/worker:0.1.0 .
# and the worker image with Beam's Python SDK, for pipelines with a PyTransform (the chart's
# jobDefaults.beamWorkerImage):
#   docker build -f operator/worker.Dockerfile --target worker-beam -t riverbank/worker-beam:0.1.0 .
# DataFusion makes this a long build (tens of minutes on 2 cores); the cache mounts make the
# next one incremental.
#
# The binary embeds CPython (PyO3, for `language: python` transforms): it links libpython and
# looks for the standard library where the interpreter it was built against keeps it. So the
# build stage and the runtime stage share one Python: the official slim Python image, whose
# interpreter lives in /usr/local (libpython3.X.so in /usr/local/lib, the standard library in
# /usr/local/lib/python3.X, pip through ensurepip for the venvs of `dependencies:`). The Rust
# toolchain is copied into the build stage from the Rust image of the same Debian release.

ARG RUST_VERSION=1.95
ARG PYTHON_IMAGE=docker.io/library/python:3.11-slim-bookworm
FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS rust

FROM ${PYTHON_IMAGE} AS build
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:/usr/local/bin:/usr/bin:/bin \
    PYO3_PYTHON=/usr/local/bin/python3
COPY --from=rust /usr/local/rustup /usr/local/rustup
COPY --from=rust /usr/local/cargo /usr/local/cargo
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The binary must link the libpython of this image's interpreter (the grep), nowhere else.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p riverbank \
 && install -D -m 0555 target/release/riverbank /out/riverbank \
 && ldd /out/riverbank | grep -q '/usr/local/lib/libpython3'

# The pods mount a read-only root file system with /tmp (emptyDir), /etc/riverbank (the plan)
# and /var/lib/riverbank (the job's disk, owned by fsGroup 65532; the venvs of `dependencies:`
# are made there) over it; nothing else is written. The pod spec runs `riverbank` from PATH,
# so the binary lives in /usr/local/bin.
FROM ${PYTHON_IMAGE} AS worker
LABEL org.opencontainers.image.title="riverbank-worker" \
      org.opencontainers.image.description="Riverbank's pipeline runtime: riverbank run / coordinator / worker" \
      org.opencontainers.image.licenses="Apache-2.0"
# The distroless `nonroot` user the chart's securityContext (runAsNonRoot, 65532) expects.
RUN groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --home-dir /home/nonroot --create-home --shell /usr/sbin/nologin nonroot \
 && rm -rf /usr/local/lib/python3.*/test /usr/local/lib/python3.*/idlelib /usr/local/lib/python3.*/tkinter
COPY --from=build /out/riverbank /usr/local/bin/riverbank
USER 65532:65532
# Fails the build unless the binary starts here and the interpreter has what venvs need.
RUN ["/usr/local/bin/riverbank", "--version"]
RUN ["/usr/local/bin/python3", "-c", "import ensurepip, ssl, sqlite3, venv"]
ENTRYPOINT ["/usr/local/bin/riverbank"]

# The worker image with Beam's Python SDK in a venv of the same interpreter: a PyTransform's
# output schema (the coordinator) and its rows (the workers) come from Beam, run by the
# `riverbank` binary with RIVERBANK_BEAM_PYTHON.
FROM worker AS worker-beam
ARG APACHE_BEAM_VERSION=2.77.0
USER root
RUN python3 -m venv /opt/beam \
 && /opt/beam/bin/pip install --no-cache-dir "apache-beam==${APACHE_BEAM_VERSION}" \
 && find /opt/beam -name __pycache__ -prune -exec rm -rf {} +
USER 65532:65532
ENV RIVERBANK_BEAM_PYTHON=/opt/beam/bin/python
RUN ["/opt/beam/bin/python", "-c", "import apache_beam.yaml"]

# The default target: the worker image without Beam.
FROM worker
