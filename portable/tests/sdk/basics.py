"""ParDo, GroupByKey, CombinePerKey (lifted), Flatten, side inputs (one larger than a State API
page) and user metrics, checked with assert_that inside the pipeline and with the metrics read
back through the Job API.
Usage: basics.py JOB_ENDPOINT [extra pipeline args]"""
import sys

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to


class CountWords(beam.DoFn):
    def __init__(self):
        self.words = Metrics.counter("basics", "words")
        self.lengths = Metrics.distribution("basics", "word_length")

    def process(self, line, stop):
        for word in line.split():
            if word in stop:
                continue
            self.words.inc()
            self.lengths.update(len(word))
            yield word


def main(endpoint, extra):
    options = PipelineOptions(
        ["--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK"] + extra
    )
    p = beam.Pipeline(options=options)
    lines = p | "Lines" >> beam.Create(["the cat sat", "on the mat", "the end"])
    stop = p | "Stop" >> beam.Create(["on"])
    words = lines | beam.ParDo(CountWords(), stop=beam.pvalue.AsList(stop))
    counts = words | beam.Map(lambda w: (w, 1)) | beam.CombinePerKey(sum)
    assert_that(counts, equal_to([("the", 3), ("cat", 1), ("sat", 1), ("mat", 1), ("end", 1)]), label="CheckCounts")

    grouped = words | "Key" >> beam.Map(lambda w: (len(w), w)) | beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, sorted(vs)))
    assert_that(grouped, equal_to([(3, ["cat", "end", "mat", "sat", "the", "the", "the"])]), label="CheckGroups")

    both = (lines, stop) | beam.Flatten()
    assert_that(both | beam.combiners.Count.Globally(), equal_to([4]), label="CheckFlatten")

    lookup = p | "Lookup" >> beam.Create([("cat", "animal"), ("mat", "thing")])
    kinds = words | "Kind" >> beam.Map(lambda w, d: (w, d.get(w, "?")), d=beam.pvalue.AsDict(lookup))
    assert_that(kinds | beam.Filter(lambda kv: kv[1] != "?"), equal_to([("cat", "animal"), ("mat", "thing")]), label="CheckDict")

    # A side input larger than a State API page (4 MiB): read page by page, every element once.
    big = p | "Seed" >> beam.Create([0]) | "Many" >> beam.FlatMap(lambda _: (f"{i:0100d}" for i in range(60_000)))
    seen = lines | "Big" >> beam.Map(lambda _, big: (len(big), sum(int(s) for s in big)), big=beam.pvalue.AsList(big))
    assert_that(seen, equal_to([(60_000, 60_000 * 59_999 // 2)] * 3), label="CheckBigSideInput")

    result = p.run()
    result.wait_until_finish()
    assert result.state == "DONE", result.state
    metrics = result.metrics().query(MetricsFilter().with_namespace("basics"))
    counters = {m.key.metric.name: m.committed for m in metrics["counters"]}
    assert counters == {"words": 7}, counters
    dist = metrics["distributions"][0].committed
    assert (dist.count, dist.sum, dist.min, dist.max) == (7, 21, 3, 3), dist
    print("basics: ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
