#!/usr/bin/env bash
# Builds the two images the chart runs, riverbank/operator:TAG and riverbank/worker:TAG, from
# binaries built on this machine: no base image, no registry. With tansu installed (`cargo
# install tansu`, as .ci/run does), also riverbank/kafka-broker:TAG, the Kafka-protocol broker
# the streaming end-to-end test runs in a pod. Each image is the binary, the
# shared libraries it links (as ldd lists them), CA certificates and a passwd entry for the
# distroless `nonroot` user (65532) the chart's securityContext expects, imported with
# `docker import`. Then load them into the cluster (see e2e/README.md).
#
#   e2e/images-from-binaries.sh [TAG]        # TAG defaults to the crate version, 0.1.0
#   IMAGES_ONLY=1 ...                        # skip `cargo build` (binaries already built)
#   ROOTFS_ONLY=DIR ...                      # write the root file systems under DIR, no docker
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)}
target=${CARGO_TARGET_DIR:-target}
if [ -z "${IMAGES_ONLY:-}" ]; then
  cargo build --release --locked -p riverbank -p riverbank-operator
fi

rootfs() { # rootfs DIR BINARY NAME
  local root=$1 bin=$2 name=$3 lib
  install -D -m 0555 "$bin" "$root/usr/local/bin/$name"
  # `libgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x...)` and `/lib64/ld-linux-x86-64.so.2 (0x...)`.
  for lib in $(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
  mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/home/nonroot"
  chmod 1777 "$root/tmp"
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
  fi
  echo 'root:x:0:0:root:/root:/sbin/nologin' > "$root/etc/passwd"
  echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >> "$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$root/etc/group"
  chown -R 65532:65532 "$root/home/nonroot" 2>/dev/null || true
}

pairs=("operator:$target/release/riverbank-operator" "worker:$target/release/riverbank")
tansu=${RIVERBANK_TANSU:-$(command -v tansu || true)}
if [ -n "$tansu" ]; then
  pairs+=("kafka-broker:$tansu")
fi
for pair in "${pairs[@]}"; do
  image=${pair%%:*} path=${pair#*:}
  bin=$(basename "$path")
  if [ -n "${ROOTFS_ONLY:-}" ]; then
    rootfs "$ROOTFS_ONLY/$image" "$path" "$bin"
    echo "$ROOTFS_ONLY/$image"
    continue
  fi
  dir=$(mktemp -d)
  rootfs "$dir" "$path" "$bin"
  tar -C "$dir" --numeric-owner -c . | docker import \
    --change 'USER 65532:65532' \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
    --change "ENTRYPOINT [\"/usr/local/bin/$bin\"]" \
    - "riverbank/$image:$tag"
  rm -rf "$dir"
  echo "riverbank/$image:$tag"
done
