"""More of the Python SDK's everyday transforms on Riverbank: tagged outputs, Partition,
CoGroupByKey, a PCollection flattened with itself, Reshuffle, Distinct, Top, Mean,
Count.PerElement, AsSingleton and AsIter side inputs, Latest (timestamps through the runner),
an empty PCollection through a GroupByKey, a user's splittable DoFn.
Usage: more.py JOB_ENDPOINT"""
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.transforms import window


class Split(beam.DoFn):
    def process(self, x):
        if x % 2:
            yield beam.pvalue.TaggedOutput("odd", x)
        else:
            yield x


class Numbers(beam.transforms.core.RestrictionProvider):
    def initial_restriction(self, n):
        return OffsetRange(0, n)

    def create_tracker(self, restriction):
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, n, restriction):
        return restriction.size()

    def split(self, n, restriction):
        # Initial splits of 10 numbers: each its own element on the runner's data plane.
        return restriction.split(10)


class CountTo(beam.DoFn):
    """A user's splittable DoFn: yields 0..n-1, claiming each offset."""
    def process(self, n, tracker=beam.DoFn.RestrictionParam(Numbers())):
        position = tracker.current_restriction().start
        while tracker.try_claim(position):
            yield position
            position += 1


def main(endpoint):
    options = PipelineOptions(["--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK"])
    with beam.Pipeline(options=options) as p:
        nums = p | "Nums" >> beam.Create(list(range(10)))
        parts = nums | beam.ParDo(Split()).with_outputs("odd", main="even")
        assert_that(parts.even, equal_to([0, 2, 4, 6, 8]), label="Even")
        assert_that(parts.odd | "SumOdd" >> beam.CombineGlobally(sum), equal_to([25]), label="Odd")

        twice = (nums, nums) | "Twice" >> beam.Flatten() | "CountTwice" >> beam.combiners.Count.Globally()
        assert_that(twice, equal_to([20]), label="FlattenTwice")

        small, big = nums | beam.Partition(lambda x, n: 0 if x < 3 else 1, 2)
        assert_that(small, equal_to([0, 1, 2]), label="Small")
        assert_that(big | "CountBig" >> beam.combiners.Count.Globally(), equal_to([7]), label="Big")

        emails = p | "Emails" >> beam.Create([("amy", "a@x"), ("bob", "b@x"), ("amy", "a2@x")])
        phones = p | "Phones" >> beam.Create([("amy", "111"), ("cat", "333")])
        joined = ({"emails": emails, "phones": phones} | beam.CoGroupByKey()
                  | beam.MapTuple(lambda k, v: (k, sorted(v["emails"]), sorted(v["phones"]))))
        assert_that(joined, equal_to([("amy", ["a2@x", "a@x"], ["111"]), ("bob", ["b@x"], []), ("cat", [], ["333"])]),
                    label="Join")

        words = p | "Words" >> beam.Create(["b", "a", "b", "c", "b", "a"])
        assert_that(words | beam.Reshuffle() | beam.Distinct(), equal_to(["a", "b", "c"]), label="Distinct")
        assert_that(words | beam.combiners.Count.PerElement(), equal_to([("a", 2), ("b", 3), ("c", 1)]), label="PerElement")
        assert_that(nums | beam.combiners.Top.Of(3), equal_to([[9, 8, 7]]), label="Top")
        assert_that(nums | "MeanAll" >> beam.combiners.Mean.Globally(), equal_to([4.5]), label="Mean")

        total = nums | "Total" >> beam.CombineGlobally(sum)
        shares = nums | "Share" >> beam.Map(lambda x, t, all_: (x, x / t, len(list(all_))),
                                            t=beam.pvalue.AsSingleton(total), all_=beam.pvalue.AsIter(nums))
        assert_that(shares | beam.Filter(lambda s: s[0] == 9), equal_to([(9, 0.2, 10)]), label="Singleton")

        stamped = nums | "Stamp" >> beam.Map(lambda x: window.TimestampedValue(x, 100 - x))
        assert_that(stamped | "Latest" >> beam.combiners.Latest.Globally(), equal_to([0]), label="CheckLatest")

        counted = p | "Limits" >> beam.Create([25, 40]) | beam.ParDo(CountTo())
        assert_that(counted | "SumCounted" >> beam.CombineGlobally(sum), equal_to([sum(range(25)) + sum(range(40))]),
                    label="SplittableDoFn")

        empty = nums | "None" >> beam.Filter(lambda x: x > 100) | "KeyNone" >> beam.Map(lambda x: (x, x))
        assert_that(empty | "GroupNone" >> beam.GroupByKey(), equal_to([]), label="Empty")
    print("more: ok")


if __name__ == "__main__":
    main(sys.argv[1])
