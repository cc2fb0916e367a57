#!/usr/bin/env bash
# Builds the images the chart runs, riverbank/operator:TAG and riverbank/worker:TAG, from
# binaries built on this machine: no base image, no registry. With tansu installed (`cargo
# install tansu`, as .ci/run does), also riverbank/kafka-broker:TAG, the Kafka-protocol broker
# the streaming end-to-end test runs in a pod. Each image is the binary, the shared libraries
# it links (as ldd lists them), CA certificates and a passwd entry for the distroless `nonroot`
# user (65532) the chart's securityContext expects. The worker image also carries the Python
# the binary embeds (PyO3), at the very path it was linked against: `bin/python3.X` (venvs for
# `dependencies:` are made with it), its standard library with `ensurepip` (so a venv gets pip),
# and the shared libraries of its extension modules (ssl, ctypes, sqlite, ...).
#
#   e2e/images-from-binaries.sh [TAG]        # TAG defaults to the crate version, 0.1.0
#   IMAGES_ONLY=1 ...                        # skip `cargo build` (binaries already built)
#   ROOTFS_ONLY=DIR ...                      # write the root file systems under DIR only
#   OCI_DIR=DIR ...                          # write OCI image archives DIR/IMAGE-TAG.tar (no
#                                            #   docker needed: `ctr -n k8s.io images import`)
#   (default)                                # `docker import` each image
#   RIVERBANK_BIN / RIVERBANK_OPERATOR_BIN   # binaries to use (default: target/release/...)
#   RIVERBANK_PYTHON                         # the interpreter the worker was built against
#                                            #   (default: PYO3_PYTHON, else python3)
#   IMAGES="worker ..."                      # only these images (default: all)
#   BEAM_VENV                                # a venv of the worker's Python with apache-beam
#                                            #   and boto3: also riverbank/beam-python-sdk:TAG
#                                            #   and riverbank/worker-beam:TAG (the worker image
#                                            #   with it, for PyTransforms; default
#                                            #   ~/.cache/riverbank/beam-venv, if there)
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)}
target=${CARGO_TARGET_DIR:-target}
if [ -z "${IMAGES_ONLY:-}" ]; then
  cargo build --release --locked -p riverbank -p riverbank-operator
fi
worker_bin=${RIVERBANK_BIN:-$target/release/riverbank}
operator_bin=${RIVERBANK_OPERATOR_BIN:-$target/release/riverbank-operator}

copy_libs() { # copy_libs ROOT FILE... : every shared library the files need, at its own path
  local root=$1 lib
  shift
  # `libgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x...)` and `/lib64/ld-linux-x86-64.so.2 (0x...)`;
  # given several files, ldd heads each one's list with `/path/to/file:`.
  for lib in $(ldd "$@" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' | sort -u); do
    [ -e "$root$lib" ] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}

rootfs() { # rootfs DIR BINARY NAME
  local root=$1 bin=$2 name=$3
  install -D -m 0555 "$bin" "$root/usr/local/bin/$name"
  copy_libs "$root" "$bin"
  mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/home/nonroot"
  chmod 1777 "$root/tmp"
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
  fi
  chmod 0755 "$root" # mktemp's 0700 would become the image's / and lock the nonroot user out
  echo 'root:x:0:0:root:/root:/sbin/nologin' > "$root/etc/passwd"
  echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >> "$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$root/etc/group"
  # `localhost` without DNS (a pod's runtime mounts its own over it): Beam's LOOPBACK harness
  # is reached at localhost.
  printf '127.0.0.1 localhost\n::1 localhost ip6-localhost\n' > "$root/etc/hosts"
  chown -R 65532:65532 "$root/home/nonroot" 2>/dev/null || true
}

python_runtime() { # python_runtime ROOT BINARY : the Python the binary embeds, where it links it
  local root=$1 bin=$2 python prefix version stdlib
  python=${RIVERBANK_PYTHON:-${PYO3_PYTHON:-python3}}
  read -r prefix version < <("$python" -c 'import sys; print(sys.base_prefix, "%d.%d" % sys.version_info[:2])')
  # Not `ldd | grep -q`: grep's early exit would fail the pipe (pipefail).
  if [[ "$(ldd "$bin")" != *"libpython$version"* ]]; then
    echo "images-from-binaries: $bin does not link libpython$version of $python (built with another Python, or without the python feature); set RIVERBANK_PYTHON" >&2
    exit 1
  fi
  stdlib=$prefix/lib/python$version
  mkdir -p "$root$prefix/bin" "$root$stdlib/site-packages"
  cp -L "$prefix/bin/python$version" "$root$prefix/bin/python$version"
  ln -sf "python$version" "$root$prefix/bin/python3"
  # The standard library without its tests, IDLE, Tk, the static library, byte code (the root
  # file system is read-only; the process writes none) and whatever was pip-installed here.
  tar -C "$stdlib" -c \
    --exclude=./test --exclude=./idlelib --exclude=./tkinter --exclude=./turtledemo \
    --exclude=./lib2to3/tests --exclude='./config-*' --exclude=./site-packages \
    --exclude=__pycache__ --exclude='*.pyc' . | tar -C "$root$stdlib" -x
  copy_libs "$root" "$root$prefix/bin/python$version" "$stdlib"/lib-dynload/*.so
  # /root is the build machine's home when Python is pyenv's: the nonroot user must read it.
  chmod 0755 "$root/root" 2>/dev/null || true
  [ -f "$root$stdlib/os.py" ] && [ -d "$root$stdlib/ensurepip" ]
}

beam_venv_into() { # beam_venv_into ROOT VENV : the venv at its own path (its Python is the worker's)
  local root=$1 venv=$2
  mkdir -p "$root$venv"
  tar -C "$venv" -c --exclude=__pycache__ --exclude='*.pyc' . | tar -C "$root$venv" -x
  # The system libraries the venv's extension modules link (most wheels carry their own).
  find "$root$venv" -name '*.so*' -type f | while read -r f; do copy_libs "$root" "$f"; done
}

# The Beam Python SDK image the end-to-end test's SDK pipeline runs its user code in (any Beam
# SDK image would do; this one needs no registry): the worker's Python, the Beam venv at its own
# path and first on PATH (its `python` is what the worker pool starts), and Beam's worker pool as
# the entry point, each harness started through e2e/beam_boot.py (what Beam's boot does).
beam_sdk_rootfs() { # beam_sdk_rootfs ROOT VENV WORKER_BINARY
  local root=$1 venv=$2 bin=$3
  # The common root (passwd, CA certificates, /tmp); its one program is a harmless `true`.
  rootfs "$root" "$(type -P true)" true
  python_runtime "$root" "$bin"
  beam_venv_into "$root" "$venv"
  # The test's S3 server (s3s-fs) lists objects without ETags, which Beam's S3 client needs.
  cp e2e/beam_sitecustomize.py "$(echo "$root$venv"/lib/python*/site-packages)/sitecustomize.py"
  mkdir -p "$root/opt/riverbank"
  { echo "#!$venv/bin/python"; tail -n +2 e2e/beam_boot.py; } > "$root/opt/riverbank/boot"
  chmod 0555 "$root/opt/riverbank/boot"
  "$root$venv/bin/python" -c 'import apache_beam, boto3' 2>/dev/null || {
    echo "images-from-binaries: $venv needs apache-beam and boto3 (pip install boto3)" >&2
    exit 1
  }
}

oci_archive() { # oci_archive ROOTFS OUT.tar IMAGE:TAG ENTRYPOINT_JSON [PATH] [NAME=VALUE...]
  local root=$1 out=$2 ref=$3 entry=$4 path=${5:-/usr/local/bin:/usr/bin:/bin} work layer diff layer_digest config config_digest manifest manifest_digest env
  env=$(printf ',"%s"' "PATH=$path" "${@:6}")
  env=${env#,}
  work=$(mktemp -d)
  mkdir -p "$work/blobs/sha256"
  tar -C "$root" --numeric-owner --sort=name -c . > "$work/layer.tar"
  diff=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
  gzip -n -1 < "$work/layer.tar" > "$work/layer.tar.gz"
  layer_digest=$(sha256sum "$work/layer.tar.gz" | cut -d' ' -f1)
  mv "$work/layer.tar.gz" "$work/blobs/sha256/$layer_digest"
  config=$(printf '{"architecture":"amd64","os":"linux","config":{"User":"65532:65532","Env":[%s],"Entrypoint":%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$env" "$entry" "$diff")
  config_digest=$(printf '%s' "$config" | sha256sum | cut -d' ' -f1)
  printf '%s' "$config" > "$work/blobs/sha256/$config_digest"
  manifest=$(printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%d},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%d}]}' \
    "$config_digest" "${#config}" "$layer_digest" "$(stat -c %s "$work/blobs/sha256/$layer_digest")")
  manifest_digest=$(printf '%s' "$manifest" | sha256sum | cut -d' ' -f1)
  printf '%s' "$manifest" > "$work/blobs/sha256/$manifest_digest"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%d,"annotations":{"org.opencontainers.image.ref.name":"%s","io.containerd.image.name":"docker.io/%s"}}]}' \
    "$manifest_digest" "${#manifest}" "$tag" "$ref" > "$work/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' > "$work/oci-layout"
  rm "$work/layer.tar"
  tar -C "$work" -cf "$out" oci-layout index.json blobs
  rm -rf "$work"
}

emit_image() { # emit_image DIR IMAGE ENTRYPOINT_JSON PATH [NAME=VALUE...] : the image of root DIR
  local dir=$1 image=$2 entry=$3 path=$4 kv
  shift 4
  if [ -n "${ROOTFS_ONLY:-}" ]; then
    echo "$dir"
    return
  fi
  if [ -n "${OCI_DIR:-}" ]; then
    oci_archive "$dir" "$OCI_DIR/$image-$tag.tar" "riverbank/$image:$tag" "$entry" "$path" "$@"
    echo "$OCI_DIR/$image-$tag.tar"
  else
    local changes=(--change 'USER 65532:65532' --change "ENV PATH=$path" --change "ENTRYPOINT $entry")
    for kv in "$@"; do changes+=(--change "ENV $kv"); done
    tar -C "$dir" --numeric-owner -c . | docker import "${changes[@]}" - "riverbank/$image:$tag"
    echo "riverbank/$image:$tag"
  fi
  rm -rf "$dir"
}

pairs=("operator:$operator_bin" "worker:$worker_bin")
tansu=${RIVERBANK_TANSU:-$(command -v tansu || true)}
if [ -n "$tansu" ]; then
  pairs+=("kafka-broker:$tansu")
fi
[ -n "${OCI_DIR:-}" ] && mkdir -p "$OCI_DIR"
for pair in "${pairs[@]}"; do
  image=${pair%%:*} path=${pair#*:}
  bin=$(basename "$path")
  case " ${IMAGES:-$image} " in *" $image "*) ;; *) continue ;; esac
  if [ -n "${ROOTFS_ONLY:-}" ]; then
    dir=$ROOTFS_ONLY/$image
  else
    dir=$(mktemp -d)
  fi
  rootfs "$dir" "$path" "$bin"
  if [ "$image" = worker ]; then
    python_runtime "$dir" "$path"
  fi
  emit_image "$dir" "$image" "[\"/usr/local/bin/$bin\"]" /usr/local/bin:/usr/bin:/bin
done

beam_venv=${BEAM_VENV:-$HOME/.cache/riverbank/beam-venv}

# The worker image with Beam's Python SDK, for pipelines with a PyTransform (the chart's
# jobDefaults.beamWorkerImage): the worker image plus the Beam venv at its own path, named by
# RIVERBANK_BEAM_PYTHON, which the binary runs Beam with.
case " ${IMAGES:-worker-beam} " in *" worker-beam "*) want_worker_beam=1 ;; *) want_worker_beam= ;; esac
if [ -n "$want_worker_beam" ] && [ -x "$beam_venv/bin/python" ]; then
  image=worker-beam
  dir=${ROOTFS_ONLY:+$ROOTFS_ONLY/$image}
  dir=${dir:-$(mktemp -d)}
  rootfs "$dir" "$worker_bin" riverbank
  python_runtime "$dir" "$worker_bin"
  beam_venv_into "$dir" "$beam_venv"
  "$dir$beam_venv/bin/python" -c 'import apache_beam.yaml' 2>/dev/null || {
    echo "images-from-binaries: $beam_venv needs apache-beam" >&2
    exit 1
  }
  emit_image "$dir" "$image" '["/usr/local/bin/riverbank"]' /usr/local/bin:/usr/bin:/bin \
    "RIVERBANK_BEAM_PYTHON=$beam_venv/bin/python"
fi

case " ${IMAGES:-beam-python-sdk} " in *" beam-python-sdk "*) want_sdk=1 ;; *) want_sdk= ;; esac
if [ -n "$want_sdk" ] && [ -x "$beam_venv/bin/python" ]; then
  image=beam-python-sdk
  dir=${ROOTFS_ONLY:+$ROOTFS_ONLY/$image}
  dir=${dir:-$(mktemp -d)}
  beam_sdk_rootfs "$dir" "$beam_venv" "$worker_bin"
  entry="[\"$beam_venv/bin/python\",\"-m\",\"apache_beam.runners.worker.worker_pool_main\",\"--service_port=50000\",\"--container_executable=/opt/riverbank/boot\"]"
  emit_image "$dir" "$image" "$entry" "$beam_venv/bin:/usr/local/bin:/usr/bin:/bin"
fi
