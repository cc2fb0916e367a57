"""A slow stage whose progress is followed while it runs (by the test, through the Job API):
each element sleeps 10 ms and counts itself in a user counter.
Usage: progress.py JOB_ENDPOINT N"""
import sys
import time

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to


class Slow(beam.DoFn):
    def __init__(self):
        self.seen = Metrics.counter("progress", "seen")

    def process(self, x):
        time.sleep(0.01)
        self.seen.inc()
        yield x


def main(endpoint, n):
    n = int(n)
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
    ])
    with beam.Pipeline(options=options) as p:
        counted = p | beam.Create(list(range(n))) | beam.ParDo(Slow()) | beam.combiners.Count.Globally()
        assert_that(counted, equal_to([n]))
    print("progress: ok")


if __name__ == "__main__":
    main(*sys.argv[1:])
