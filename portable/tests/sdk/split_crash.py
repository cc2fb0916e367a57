"""A bundle split while it runs, whose harness then dies: the runner retries only what the
harness had kept (its primary), since the rest is another bundle already. One text file is one
bundle; the idle second harness gets the rest of its range; the first harness dies at line 200
(once, when the rest has started on the other harness). Every line must still be read exactly once.
Usage: split_crash.py JOB_ENDPOINT PYTHON DIR"""
import os
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

LINES = 600


class SlowDieOnce(beam.DoFn):
    def __init__(self, marker):
        self.marker = marker

    def process(self, line):
        time.sleep(0.005)  # 3 s for the file on one harness: long enough to be split
        n = int(line.split()[1])
        far = self.marker + ".far"
        if n >= 300:
            # Only the rest of a split bundle is read here while the first harness waits at
            # line 200 (a split leaves that harness at least half of what it had left).
            open(far, "a").close()
        if n == 200 and not os.path.exists(self.marker):
            # Die once the rest runs on the other harness: on a busy machine that harness may
            # start after this one reached line 200 (the bundle is split while this waits).
            deadline = time.time() + 30
            while not os.path.exists(far) and time.time() < deadline:
                time.sleep(0.05)
            open(self.marker, "w").close()
            os._exit(3)
        yield n


def main(endpoint, python, scratch):
    path = os.path.join(scratch, "lines.txt")
    with open(path, "w") as f:
        f.writelines(f"line {i}\n" for i in range(LINES))
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=PROCESS",
        f'--environment_config={{"command": "{python} -m apache_beam.runners.worker.sdk_worker_main"}}',
        "--sdk_worker_parallelism=2",
    ])
    with beam.Pipeline(options=options) as p:
        numbers = p | beam.io.ReadFromText(path) | beam.ParDo(SlowDieOnce(os.path.join(scratch, "died")))
        assert_that(numbers | beam.combiners.Count.Globally(), equal_to([LINES]), label="Count")
        assert_that(numbers | beam.CombineGlobally(sum), equal_to([sum(range(LINES))]), label="Sum")
    print("split_crash: ok")


if __name__ == "__main__":
    main(*sys.argv[1:4])
