"""What a failure costs on Riverbank. `crash`: the SDK harness process dies in the middle of its
first bundle (os._exit), so the runner starts another and retries the bundle; the job still
counts every element once. `error`: a DoFn raises on one element every time, so the job fails
after four attempts with the user's message. Usage: failures.py JOB_ENDPOINT PYTHON MODE DIR"""
import os
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to


class DieOnce(beam.DoFn):
    def __init__(self, marker):
        self.marker = marker

    def process(self, x):
        if x == 500 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(3)  # the harness dies mid-bundle, as a pod killed for memory would
        yield x


class Refuse(beam.DoFn):
    def __init__(self, log):
        self.log = log

    def process(self, x):
        if x == 7:
            with open(self.log, "a") as f:
                f.write("attempt\n")
            raise ValueError("bad record 7")
        yield x


def main(endpoint, python, mode, scratch):
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=PROCESS",
        f'--environment_config={{"command": "{python} -m apache_beam.runners.worker.sdk_worker_main"}}',
        "--sdk_worker_parallelism=1",
    ])
    p = beam.Pipeline(options=options)
    numbers = p | beam.Create(list(range(1000)))
    if mode == "crash":
        kept = numbers | beam.ParDo(DieOnce(os.path.join(scratch, "died")))
        assert_that(kept | beam.CombineGlobally(sum), equal_to([sum(range(1000))]))
    else:
        numbers | beam.ParDo(Refuse(os.path.join(scratch, "attempts")))
    result = p.run()
    try:
        result.wait_until_finish()
    except Exception as e:  # the portable runner raises when the job fails
        print(f"failed: {e}")
        sys.exit(2)
    print(f"{mode}: {result.state}")


if __name__ == "__main__":
    main(*sys.argv[1:5])
