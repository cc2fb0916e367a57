"""A GroupByKey of N thousand x 1,000 values of 100 characters over 5,000 keys, counted per key
(bench/sdk_memory.sh submits it to `riverbank job-server` with a memory budget).
Usage: group_memory.py JOB_ENDPOINT N"""
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to


def rows(i):
    return ((j % 5000, "x" * 100) for j in range(i * 1000, (i + 1) * 1000))


def sizes(key, values):
    return key, len(list(values))


def main(endpoint, n):
    n = int(n)
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
    ])
    with beam.Pipeline(options=options) as p:
        grouped = (p | beam.Create(list(range(n))) | beam.FlatMap(rows)
                   | beam.GroupByKey() | beam.MapTuple(sizes))
        assert_that(grouped, equal_to([(k, n // 5) for k in range(5000)]))


if __name__ == "__main__":
    main(*sys.argv[1:])
