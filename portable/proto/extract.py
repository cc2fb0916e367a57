"""Writes beam-2.77.0.binpb: the FileDescriptorSet of Beam's portability protos (runner, Fn, job,
artifact and provision APIs) as the apache-beam wheel of that version compiled them. build.rs
generates Riverbank's Rust types and gRPC services from it, so building needs no protoc and no
Python. Regenerate (only to move to another Beam version):

    python -m venv /tmp/beam && /tmp/beam/bin/pip install apache-beam==2.77.0
    /tmp/beam/bin/python portable/proto/extract.py portable/proto/beam-2.77.0.binpb
"""
import importlib
import sys

import apache_beam
from google.protobuf import descriptor_pb2

API = "apache_beam.portability.api.org.apache.beam.model."
MODULES = [
    "pipeline.v1.beam_runner_api_pb2",
    "pipeline.v1.endpoints_pb2",
    "pipeline.v1.standard_window_fns_pb2",
    "pipeline.v1.metrics_pb2",
    "fn_execution.v1.beam_fn_api_pb2",
    "fn_execution.v1.beam_provision_api_pb2",
    "job_management.v1.beam_job_api_pb2",
    "job_management.v1.beam_artifact_api_pb2",
]


def main(out):
    files = {}

    def add(fd):  # dependencies first: a set in topological order
        for dep in fd.dependencies:
            add(dep)
        if fd.name not in files:
            proto = descriptor_pb2.FileDescriptorProto()
            fd.CopyToProto(proto)
            files[fd.name] = proto

    for name in MODULES:
        add(importlib.import_module(API + name).DESCRIPTOR)
    fds = descriptor_pb2.FileDescriptorSet(file=list(files.values()))
    with open(out, "wb") as f:
        f.write(fds.SerializeToString(deterministic=True))
    print(f"apache-beam {apache_beam.__version__}: {len(files)} files -> {out}")


if __name__ == "__main__":
    main(sys.argv[1])
