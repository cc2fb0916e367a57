"""Stateful DoFns in batch on Riverbank: per-key value and bag state, an event-time timer that
flushes at the end of the window, GroupIntoBatches (bag, combining state and a timer), state
kept apart per key and per window, ordered-list state (read whole, by range, cleared by
range), and a bag larger than a State API page. Usage: stateful.py JOB_ENDPOINT"""
import sys

import apache_beam as beam
from apache_beam.coders import StrUtf8Coder, VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window
from apache_beam.transforms.userstate import (
    BagStateSpec, OrderedListStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer)
from apache_beam.utils.timestamp import Timestamp
from apache_beam.transforms.timeutil import TimeDomain


class CountThenFlush(beam.DoFn):
    """Counts a key's values in value state, keeps them in a bag, and emits both when the
    window ends (an event-time timer)."""
    COUNT = ReadModifyWriteStateSpec("count", VarIntCoder())
    SEEN = BagStateSpec("seen", StrUtf8Coder())
    FLUSH = TimerSpec("flush", TimeDomain.WATERMARK)

    def process(self, kv, w=beam.DoFn.WindowParam, count=beam.DoFn.StateParam(COUNT),
                seen=beam.DoFn.StateParam(SEEN), flush=beam.DoFn.TimerParam(FLUSH)):
        key, value = kv
        count.write((count.read() or 0) + 1)
        seen.add(value)
        flush.set(w.max_timestamp())

    @on_timer(FLUSH)
    def flush(self, key=beam.DoFn.KeyParam, w=beam.DoFn.WindowParam,
              count=beam.DoFn.StateParam(COUNT), seen=beam.DoFn.StateParam(SEEN)):
        yield key, int(w.start), count.read(), sorted(seen.read())
        count.clear()
        seen.clear()


class SortedAtEnd(beam.DoFn):
    """Keeps a key's values in an ordered list by their own value; at the window's end emits
    the list, the part in [3, 10), and what is left once [3, 10) is cleared."""
    LIST = OrderedListStateSpec("list", StrUtf8Coder())
    FLUSH = TimerSpec("flush", TimeDomain.WATERMARK)

    def process(self, kv, w=beam.DoFn.WindowParam, items=beam.DoFn.StateParam(LIST),
                flush=beam.DoFn.TimerParam(FLUSH)):
        key, n = kv
        items.add((Timestamp(micros=n), f"{key}{n}"))
        flush.set(w.max_timestamp())

    @on_timer(FLUSH)
    def flush(self, key=beam.DoFn.KeyParam, items=beam.DoFn.StateParam(LIST)):
        whole = [v for _, v in items.read()]
        part = [v for _, v in items.read_range(Timestamp(micros=3), Timestamp(micros=10))]
        items.clear_range(Timestamp(micros=3), Timestamp(micros=10))
        yield key, whole, part, [v for _, v in items.read()]
        items.clear()


class GrowingBag(beam.DoFn):
    """Adds two 1-MB values to a key's bag in its first bundle (one append the runner cuts
    between elements), then one in each of 5 bundles (an event-time timer setting itself
    again), reading the bag whole each time: from 5 MB on it is more than one State API page
    (4 MiB), read page after page behind continuation tokens."""
    BAG = BagStateSpec("bag", StrUtf8Coder())
    GROW = TimerSpec("grow", TimeDomain.WATERMARK)

    def process(self, kv, bag=beam.DoFn.StateParam(BAG), grow=beam.DoFn.TimerParam(GROW)):
        bag.add("a" * 1_000_000)
        bag.add("b" * 1_000_000)
        grow.set(Timestamp(1))

    @on_timer(GROW)
    def grow(self, key=beam.DoFn.KeyParam, ts=beam.DoFn.TimestampParam,
             bag=beam.DoFn.StateParam(BAG), grow=beam.DoFn.TimerParam(GROW)):
        values = list(bag.read())
        if len(values) < 7:
            bag.add(str(len(values)) * 1_000_000)
            grow.set(ts + 1)
        else:
            yield key, [len(v) for v in values], "".join(v[0] for v in values)


def main(endpoint):
    options = PipelineOptions(["--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK"])
    with beam.Pipeline(options=options) as p:
        events = (p | beam.Create([("a", "x", 1), ("b", "y", 2), ("a", "z", 3), ("a", "w", 65), ("c", "v", 4)])
                  | beam.MapTuple(lambda k, v, t: window.TimestampedValue((k, v), t))
                  | beam.WindowInto(window.FixedWindows(60)))
        flushed = events | beam.ParDo(CountThenFlush())
        assert_that(flushed, equal_to([("a", 0, 2, ["x", "z"]), ("b", 0, 1, ["y"]), ("c", 0, 1, ["v"]),
                                       ("a", 60, 1, ["w"])]), label="CheckFlush")

        keyed = p | "Many" >> beam.Create([(k, i) for k in "pq" for i in range(7)])
        batches = keyed | beam.GroupIntoBatches(3) | beam.MapTuple(lambda k, vs: (k, len(list(vs))))
        assert_that(batches, equal_to([("p", 3), ("p", 3), ("p", 1), ("q", 3), ("q", 3), ("q", 1)]),
                    label="CheckBatches")

        numbers = p | "Numbers" >> beam.Create([("s", n) for n in [12, 3, -5, 7, 3, 0, 10]] + [("t", 4)])
        assert_that(numbers | beam.ParDo(SortedAtEnd()),
                    equal_to([("s", ["s-5", "s0", "s3", "s3", "s7", "s10", "s12"], ["s3", "s3", "s7"],
                               ["s-5", "s0", "s10", "s12"]),
                              ("t", ["t4"], ["t4"], [])]),
                    label="CheckOrderedList")

        grown = p | "Big" >> beam.Create([("big", 0)]) | beam.ParDo(GrowingBag())
        assert_that(grown, equal_to([("big", [1_000_000] * 7, "ab23456")]), label="CheckGrowingBag")
    print("stateful: ok")


if __name__ == "__main__":
    main(sys.argv[1])
