# syntax=docker/dockerfile:1.7
# The image of a DataflowJob's coordinator and worker pods: the `riverbank` binary (cli/), whose
# `coordinator` and `worker` subcommands the operator's StatefulSets run. Build from the
# repository root:
#   docker build -f operator/worker.Dockerfile -t riverbank/worker:0.1.0 .
# DataFusion makes this a long build (tens of minutes on 2 cores); the cache mounts make the
# next one incremental.

ARG RUST_VERSION=1.95
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p riverbank \
 && install -D -m 0555 target/release/riverbank /out/riverbank

# The pods mount a read-only root file system with /tmp (emptyDir), /etc/riverbank (the plan)
# and /var/lib/riverbank (the job's disk, owned by fsGroup 65532) over it; nothing else is
# written. The pod spec runs `riverbank` from PATH, so the binary lives in /usr/local/bin.
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="riverbank-worker" \
      org.opencontainers.image.description="Riverbank's pipeline runtime: riverbank run / coordinator / worker" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/riverbank /usr/local/bin/riverbank
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/riverbank"]
