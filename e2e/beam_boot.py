#!/usr/bin/env python3
"""A Beam SDK container's boot, for the SDK image `images-from-binaries.sh` builds for the
end-to-end test (Beam's own SDK images carry a boot program in Go; this does the part the test
needs, the same way). Beam's worker pool (`worker_pool_main --container_executable=THIS`) runs it
once per SDK harness the runner asks for, with the runner's endpoints:

    beam_boot.py --id=ID --provision_endpoint=H:P --artifact_endpoint=H:P \\
        --logging_endpoint=H:P --control_endpoint=H:P

It asks the runner for the worker's provision info (its pipeline options and staged files),
fetches the staged files into SEMI_PERSISTENT_DIRECTORY/staged (where the SDK finds a pickled
main session and staged modules), then becomes the SDK harness (`sdk_worker_main`).
"""
import argparse
import os
import sys

import grpc
from google.protobuf import json_format

from apache_beam.portability.api import beam_artifact_api_pb2
from apache_beam.portability.api import beam_artifact_api_pb2_grpc
from apache_beam.portability.api import beam_provision_api_pb2
from apache_beam.portability.api import beam_provision_api_pb2_grpc
from apache_beam.portability.api import beam_runner_api_pb2

parser = argparse.ArgumentParser()
for flag in ("id", "provision_endpoint", "artifact_endpoint", "logging_endpoint", "control_endpoint"):
    parser.add_argument(f"--{flag}", required=True)
parser.add_argument("--semi_persistent_directory", default=os.environ.get("TMPDIR", "/tmp"))
args, _ = parser.parse_known_args()
worker = [("worker_id", args.id)]

with grpc.insecure_channel(args.provision_endpoint) as channel:
    info = beam_provision_api_pb2_grpc.ProvisionServiceStub(channel).GetProvisionInfo(
        beam_provision_api_pb2.GetProvisionInfoRequest(), metadata=worker).info

directory = os.path.join(args.semi_persistent_directory, args.id)
staged = os.path.join(directory, "staged")
os.makedirs(staged, exist_ok=True)
with grpc.insecure_channel(info.artifact_endpoint.url or args.artifact_endpoint) as channel:
    retrieval = beam_artifact_api_pb2_grpc.ArtifactRetrievalServiceStub(channel)
    for artifact in info.dependencies:
        if artifact.role_urn != "beam:artifact:role:staging_to:v1":
            continue
        role = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(artifact.role_payload)
        name = os.path.basename(role.staged_name)
        with open(os.path.join(staged, name), "wb") as out:
            request = beam_artifact_api_pb2.GetArtifactRequest(artifact=artifact)
            for chunk in retrieval.GetArtifact(request, metadata=worker):
                out.write(chunk.data)

control = info.control_endpoint.url or args.control_endpoint
logging = info.logging_endpoint.url or args.logging_endpoint
os.environ.update({
    "WORKER_ID": args.id,
    "PIPELINE_OPTIONS": json_format.MessageToJson(info.pipeline_options),
    "SEMI_PERSISTENT_DIRECTORY": directory,
    "CONTROL_API_SERVICE_DESCRIPTOR": f'url: "{control}"',
    "LOGGING_API_SERVICE_DESCRIPTOR": f'url: "{logging}"',
})
os.execv(sys.executable, [sys.executable, "-m", "apache_beam.runners.worker.sdk_worker_main"])
