"""Dynamic work rebalancing: one text file is one element, hence one bundle; the second SDK
harness, idle, makes the runner split the running bundle (ProcessBundleSplit), and takes the
rest of the file's range. Both harness processes read lines, and every line is read once.
Usage: split.py JOB_ENDPOINT PYTHON DIR"""
import os
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that

LINES = 600


def slow(line, markers):
    # Each harness process marks itself, and waits (up to a minute) until a second one has: only
    # a split of the running bundle gives the second harness lines, so the first holds its
    # bundle until the runner has split it, however slowly the second harness started (a CI run
    # once saw it arrive after a 6-s bundle had ended). Then a costly record.
    open(os.path.join(markers, str(os.getpid())), "w").close()
    deadline = time.time() + 60
    while len(os.listdir(markers)) < 2 and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.01)
    return os.getpid(), 1


def check(per_process):
    counts = dict(per_process)
    assert sum(counts.values()) == LINES, counts
    assert len(counts) == 2, f"one harness read every line: {counts}"


def main(endpoint, python, scratch):
    path = os.path.join(scratch, "lines.txt")
    with open(path, "w") as f:
        f.writelines(f"line {i}\n" for i in range(LINES))
    markers = os.path.join(scratch, "harnesses")
    os.makedirs(markers)
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=PROCESS",
        f'--environment_config={{"command": "{python} -m apache_beam.runners.worker.sdk_worker_main"}}',
        "--sdk_worker_parallelism=2",
    ])
    with beam.Pipeline(options=options) as p:
        per_process = p | beam.io.ReadFromText(path) | beam.Map(slow, markers) | beam.CombinePerKey(sum)
        assert_that(per_process, check)
    print("split: ok")


if __name__ == "__main__":
    main(*sys.argv[1:4])
