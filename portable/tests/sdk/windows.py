"""Windowing on Riverbank: fixed and sliding windows with CombinePerKey, sessions merged by the
runner's GroupByKey, a merging WindowFn of the user's merged by the SDK (grouped and combined),
the timestamp each grouped result carries, and files read and written through splittable DoFns
(ReadFromText, WriteToText). Usage: windows.py JOB_ENDPOINT OUT_DIR"""
import glob
import os
import sys

import apache_beam as beam
from apache_beam.coders import coders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window

# (user, seconds): user a has sessions [0, 12) and [100, 103) with a 10-s gap; b one [5, 17).
EVENTS = [("a", 0), ("a", 2), ("a", 1), ("b", 5), ("a", 100), ("b", 7), ("a", 93 - 91), ("b", 6)]

# User c's events are one 10-s-gap session [0, 45), cut by CappedSessions at 30 s of span into
# [0, 30) (4 events) and [28, 45) (2 events).
CAPPED = [("c", 0), ("c", 12), ("c", 5), ("c", 20), ("c", 28), ("c", 35)]


class CappedSessions(window.WindowFn):
    """Sessions with a 10-s gap whose span never passes 30 s: a merging WindowFn the runner does
    not know, so its windows are merged by the SDK."""

    def assign(self, context):
        return [window.IntervalWindow(context.timestamp, context.timestamp + 10)]

    def merge(self, merge_context):
        current, members = None, []
        for w in sorted(merge_context.windows, key=lambda w: w.start):
            if current is not None and w.start < current.end and float(max(current.end, w.end)) - float(current.start) <= 30:
                current = window.IntervalWindow(current.start, max(current.end, w.end))
                members.append(w)
                continue
            if len(members) > 1:
                merge_context.merge(members, current)
            current, members = w, [w]
        if len(members) > 1:
            merge_context.merge(members, current)

    def get_window_coder(self):
        return coders.IntervalWindowCoder()


def bounds(kv, w=beam.DoFn.WindowParam, ts=beam.DoFn.TimestampParam):
    key, value = kv
    return (key, value, float(w.start), float(w.end), float(ts))


def main(endpoint, out):
    options = PipelineOptions(["--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK"])
    with beam.Pipeline(options=options) as p:
        events = (p | beam.Create(EVENTS) | beam.MapTuple(lambda u, t: window.TimestampedValue((u, 1), t)))

        fixed = events | "Fixed" >> beam.WindowInto(window.FixedWindows(60)) | "SumFixed" >> beam.CombinePerKey(sum)
        assert_that(fixed | "FixedBounds" >> beam.Map(bounds),
                    equal_to([("a", 4, 0, 60, 59.999), ("b", 3, 0, 60, 59.999), ("a", 1, 60, 120, 119.999)]),
                    label="CheckFixed")

        sliding = events | "Sliding" >> beam.WindowInto(window.SlidingWindows(60, 30)) | "SumSliding" >> beam.CombinePerKey(sum)
        assert_that(sliding | "SlidingBounds" >> beam.Map(lambda kv, w=beam.DoFn.WindowParam: (kv[0], kv[1], float(w.start))),
                    equal_to([("a", 4, -30), ("a", 4, 0), ("b", 3, -30), ("b", 3, 0), ("a", 1, 60), ("a", 1, 90)]),
                    label="CheckSliding")

        sessions = (events | "Sessions" >> beam.WindowInto(window.Sessions(10))
                    | "GroupSessions" >> beam.GroupByKey()
                    | "Size" >> beam.MapTuple(lambda k, vs: (k, len(list(vs)))))
        assert_that(sessions | "SessionBounds" >> beam.Map(bounds),
                    equal_to([("a", 4, 0, 12, 11.999), ("a", 1, 100, 110, 109.999), ("b", 3, 5, 17, 16.999)]),
                    label="CheckSessions")

        capped = (p | "Capped" >> beam.Create(CAPPED)
                  | "CappedTimes" >> beam.MapTuple(lambda u, t: window.TimestampedValue((u, 1), t))
                  | "CappedSessions" >> beam.WindowInto(CappedSessions()))
        grouped = capped | "GroupCapped" >> beam.GroupByKey() | "CappedSize" >> beam.MapTuple(lambda k, vs: (k, len(list(vs))))
        summed = capped | "SumCapped" >> beam.CombinePerKey(sum)
        for label, result in [("CheckCappedGroups", grouped), ("CheckCappedSums", summed)]:
            assert_that(result | f"{label}Bounds" >> beam.Map(bounds),
                        equal_to([("c", 4, 0, 30, 29.999), ("c", 2, 28, 45, 44.999)]), label=label)

        (p | "Numbers" >> beam.Create([str(i) for i in range(1000)])
         | "WriteNumbers" >> beam.io.WriteToText(os.path.join(out, "numbers"), num_shards=3))

    with beam.Pipeline(options=options) as p:
        total = (p | beam.io.ReadFromText(os.path.join(out, "numbers*"))
                 | beam.Map(int) | beam.CombineGlobally(sum))
        assert_that(total, equal_to([sum(range(1000))]), label="CheckFiles")
    assert len(glob.glob(os.path.join(out, "numbers*"))) == 3
    print("windows: ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
