"""Writes a Beam SDK job's folder the way Riverbank's job service stores a submitted job for its
DataflowJob (`cli/src/beam_k8s/stored.rs`): `pipeline.pb`, its FILE artifacts copied under
`artifacts/` and named there, and `options.pb`. The pipeline counts words into a text file; its
environment is a DOCKER one, as `--environment_type=DOCKER` submits it. With SLOW_ELEMENTS, the
pipeline is instead a stage of that many elements taking 50 ms each (after a Reshuffle, so they
are bundles of the runner's), then their count and sum. With `stream:START`, it is a streaming
pipeline (`--streaming`, a checkpoint every 200 ms, no --temp_location of its own): PeriodicImpulse
from START (epoch seconds) for 10 minutes, 4 elements a second keyed even/odd by their index,
summed per key and 3-s fixed window by the CombinePerKey "Sum"; each firing appended as a
JSON line `{key, start, count, version, at}` to OUTPUT/fired-PID (OUTPUT a directory). With
`stream:START:2`, version 2 of that pipeline: the same, but its CombinePerKey is named "Total",
submitted with `--update --transform_name_mapping={"Sum": "Total"}`, and its lines say version 2.

    python stored_job.py FOLDER OUTPUT STAGED_FILE [SLOW_ELEMENTS | stream:START[:2]]
"""
import json
import os
import shutil
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.job import utils as job_utils
from apache_beam.transforms import environments

folder, output, staged = sys.argv[1:4]
mode = sys.argv[4] if len(sys.argv) > 4 else ""
streaming = mode.startswith("stream:")
version = int(mode.split(":")[2]) if mode.count(":") == 2 else 1
flags = [
    "--environment_type=DOCKER",
    "--environment_config=example.com/beam-python-sdk:2.77.0",
    f"--files_to_stage={staged}",
]
if streaming:
    flags += ["--streaming", "--experiments=checkpointing_interval=200"]
if version == 2:
    flags += ["--update", '--transform_name_mapping={"Sum": "Total"}']
options = PipelineOptions(flags)
environment = environments.DockerEnvironment.from_options(options.view_as(PortableOptions))


def slowly(x):
    time.sleep(0.05)
    return x


class Record(beam.DoFn):
    def __init__(self, out, version):
        self.out = out
        self.version = version

    def process(self, kv, w=beam.DoFn.WindowParam):
        key, total = kv
        line = json.dumps({"key": key, "start": float(w.start), "count": total,
                           "version": self.version, "at": time.time()})
        with open(os.path.join(self.out, f"fired-{os.getpid()}"), "a") as f:
            f.write(line + "\n")


def keyed(start):
    def key(t):
        k = round((float(t) - start) / 0.25)
        return ("even" if k % 2 == 0 else "odd", 1)
    return key


p = beam.Pipeline(options=options)
if streaming:
    from apache_beam.transforms import window
    from apache_beam.transforms.periodicsequence import PeriodicImpulse
    start = float(mode.split(":")[1])
    os.makedirs(output, exist_ok=True)
    _ = (
        p
        | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 600, fire_interval=0.25)
        | beam.Map(keyed(start))
        | beam.WindowInto(window.FixedWindows(3))
        | ("Sum" if version == 1 else "Total") >> beam.CombinePerKey(sum)
        | beam.ParDo(Record(output, version)))
elif mode:
    _ = (
        p
        | beam.Create(range(int(sys.argv[4])))
        | beam.Reshuffle()
        | "Slowly" >> beam.Map(slowly)
        | beam.Map(lambda x: (1, x))
        | beam.CombineGlobally(lambda pairs: tuple(map(sum, zip(*pairs))) or (0, 0))
        | beam.MapTuple(lambda n, total: f"{n} {total}")
        | beam.io.WriteToText(output, shard_name_template=""))
else:
    _ = (
        p
        | beam.Create(["the quick fox", "the lazy dog", "the end"])
        | beam.FlatMap(str.split)
        | beam.combiners.Count.PerElement()
        | beam.MapTuple(lambda word, n: f"{word}: {n}")
        | beam.io.WriteToText(output, shard_name_template=""))
proto = p.to_runner_api(default_environment=environment)

os.makedirs(os.path.join(folder, "artifacts"), exist_ok=True)
n = 0
for env in proto.components.environments.values():
    for dependency in env.dependencies:
        if dependency.type_urn != "beam:artifact:type:file:v1":
            continue
        payload = beam_runner_api_pb2.ArtifactFilePayload.FromString(dependency.type_payload)
        name = f"artifacts/{n}-{os.path.basename(payload.path)}"
        n += 1
        shutil.copy(payload.path, os.path.join(folder, name))
        payload.path = name
        dependency.type_payload = payload.SerializeToString()

with open(os.path.join(folder, "pipeline.pb"), "wb") as f:
    f.write(proto.SerializeToString())
values = {
    f"beam:option:{k}:v1": v
    for k, v in options.get_all_options(drop_default=True).items()
    if v is not None
}
with open(os.path.join(folder, "options.pb"), "wb") as f:
    f.write(job_utils.dict_to_struct(values).SerializeToString())
print(n)
