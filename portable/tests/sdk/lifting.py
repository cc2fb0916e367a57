"""CombinePerKey submitted whole (`--experiments=pre_optimize=none`, as Java and Go SDKs submit
it), for the runner to lift: sums, means and a CombineFn with its own accumulator, in the global
window, in fixed windows and in session windows.
Usage: lifting.py JOB_ENDPOINT"""
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window


class Spread(beam.CombineFn):
    """(min, max) of the values, with a tuple accumulator the runner cannot read."""
    def create_accumulator(self):
        return (None, None)

    def add_input(self, acc, x):
        lo, hi = acc
        return (x if lo is None else min(lo, x), x if hi is None else max(hi, x))

    def merge_accumulators(self, accs):
        los = [a[0] for a in accs if a[0] is not None]
        his = [a[1] for a in accs if a[1] is not None]
        return (min(los) if los else None, max(his) if his else None)

    def extract_output(self, acc):
        return acc


def main(endpoint):
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
        "--experiments=pre_optimize=none",
    ])
    n = 3000
    with beam.Pipeline(options=options) as p:
        pairs = p | beam.Create([(f"k{i % 3}", i) for i in range(n)])
        sums = pairs | "Sum" >> beam.CombinePerKey(sum)
        assert_that(sums, equal_to([(f"k{r}", sum(range(r, n, 3))) for r in range(3)]), label="Sums")
        spreads = pairs | "Spread" >> beam.CombinePerKey(Spread())
        assert_that(spreads, equal_to([("k0", (0, 2997)), ("k1", (1, 2998)), ("k2", (2, 2999))]),
                    label="Spreads")
        mean = pairs | beam.Values() | "Mean" >> beam.combiners.Mean.Globally()
        assert_that(mean, equal_to([(n - 1) / 2]), label="Mean")

        stamped = pairs | beam.Map(lambda kv: window.TimestampedValue(kv, kv[1]))
        fixed = (stamped | "Fixed" >> beam.WindowInto(window.FixedWindows(1000))
                 | "SumFixed" >> beam.CombinePerKey(sum)
                 | "WithWindow" >> beam.ParDo(WithWindow()))
        assert_that(fixed, equal_to([
            (f"k{r}", w, sum(i for i in range(w, w + 1000) if i % 3 == r))
            for r in range(3) for w in (0, 1000, 2000)]), label="FixedSums")

        # Per key, the values 3 apart bridge one session; a gap of 500 cuts it.
        gapped = (p | "Gapped" >> beam.Create([("a", t) for t in (0, 3, 6, 600, 603)])
                  | "Stamp" >> beam.Map(lambda kv: window.TimestampedValue(kv, kv[1]))
                  | "Sessions" >> beam.WindowInto(window.Sessions(10))
                  | "CountSessions" >> beam.combiners.Count.PerKey()
                  | "SessionBounds" >> beam.ParDo(WithWindow()))
        assert_that(gapped, equal_to([("a", 0, 3), ("a", 600, 2)]), label="SessionCounts")
    print("lifting: ok")


class WithWindow(beam.DoFn):
    def process(self, kv, w=beam.DoFn.WindowParam):
        yield kv[0], int(w.start), kv[1]


if __name__ == "__main__":
    main(*sys.argv[1:])
