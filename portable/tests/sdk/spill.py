"""A GroupByKey and a stateful DoFn (GroupIntoBatches) over more data than the job server holds
in memory (the test gives it 1 MiB): the runner's copy waits on disk, is grouped a hash
partition of keys at a time, and is cut by key for the stateful DoFn a block at a time.
Usage: spill.py JOB_ENDPOINT"""
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to


def rows(i):
    # 1,000 values of 100 characters per element in: 100,000 in all, over 500 keys.
    return ((j % 500, "x" * 100) for j in range(i * 1000, (i + 1) * 1000))


def sizes(key, values):
    values = list(values)
    return key, len(values), sum(len(v) for v in values)


def main(endpoint):
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
    ])
    with beam.Pipeline(options=options) as p:
        keyed = p | beam.Create(list(range(100))) | beam.FlatMap(rows)
        grouped = keyed | beam.GroupByKey() | beam.MapTuple(sizes)
        assert_that(grouped, equal_to([(k, 200, 20000) for k in range(500)]), label="Grouped")
        # A stateful DoFn's input (bag state and a timer per key) cut by key through the spill.
        batches = keyed | beam.GroupIntoBatches(50) | beam.MapTuple(lambda k, vs: len(list(vs)))
        assert_that(batches | beam.CombineGlobally(sum), equal_to([100000]), label="Batched")
        assert_that(batches | "Batches" >> beam.combiners.Count.Globally(), equal_to([2000]),
                    label="BatchCount")
    print("spill: ok")


if __name__ == "__main__":
    main(*sys.argv[1:])
