"""Lean chains on PROCESS harnesses give what Beam's own harness gives. One pipeline of the shapes
a chain runs (Map, Filter, FlatMap exploding past a batch, a DoFn class with setup and
start_bundle and tagged outputs, TimestampedValue outputs in sliding windows, WindowInto with
fixed, sliding, session and global windows, lifted combines with and without a timestamp
combiner, a user counter) runs on Beam's DirectRunner and on Riverbank; their files must be
equal line for line, the counter equal, and Riverbank's Map must have run inside a chain.
Usage: chains.py JOB_ENDPOINT PYTHON DIR"""
import os
import re
import sys

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.transforms.window import TimestampCombiner

LINES = ["The cat sat on the mat", "a Dog and a cat", "", "the END of the lines of text"]


class Split(beam.DoFn):
    """A DoFn class: setup and start_bundle called, odd numbers to a tagged output."""

    def setup(self):
        self.ready = True

    def start_bundle(self):
        self.seen = 0

    def process(self, n):
        assert self.ready
        self.seen += 1
        if n % 2:
            yield beam.pvalue.TaggedOutput("odd", n)
        else:
            yield n


def in_chain(x):
    # The caller of a Map's function is the chain's loop when the Map runs in a lean chain.
    return sys._getframe(1).f_code.co_filename.endswith(os.path.join("riverbank_harness", "chains.py"))


def restamp(x):
    return window.TimestampedValue(x, x + 0.5) if x % 3 == 0 else x


def show(kv, w=beam.DoFn.WindowParam, ts=beam.DoFn.TimestampParam):
    bounds = "global" if isinstance(w, window.GlobalWindow) else f"{w.start.micros}-{w.end.micros}"
    return f"{kv[0]} {kv[1]} {bounds} {ts.micros}"


def build(p, out):
    seen = Metrics.counter("chains", "words")

    def count_word(w):
        seen.inc()
        return w.lower()

    words = (p | "Lines" >> beam.Create(LINES)
             | "Words" >> beam.FlatMap(str.split)
             | "Lower" >> beam.Map(count_word)
             | "Long" >> beam.Filter(lambda w: len(w) > 2))
    counted = (words | "Pair" >> beam.Map(lambda w: (w, 1))
               | "CountWords" >> beam.CombinePerKey(sum)
               | "ShowWords" >> beam.Map(lambda kv: f"word {kv[0]} {kv[1]}"))

    exploded = (p | "Sizes" >> beam.Create([3000, 5, 0, 1500])
                | "Explode" >> beam.FlatMap(lambda n: range(n))
                | "Mod" >> beam.Map(lambda x: (x % 7, x))
                | "SumMod" >> beam.CombinePerKey(sum)
                | "ShowMod" >> beam.Map(lambda kv: f"mod {kv[0]} {kv[1]}"))

    numbers = p | "Numbers" >> beam.Create(list(range(40)))
    parts = numbers | "Split" >> beam.ParDo(Split()).with_outputs("odd", main="even")
    evens = parts.even | "CountEven" >> beam.combiners.Count.Globally() | "ShowEven" >> beam.Map(
        lambda n: f"even {n}")
    odds = parts.odd | "SumOdd" >> beam.CombineGlobally(sum) | "ShowOdd" >> beam.Map(lambda n: f"odd {n}")

    stamped = numbers | "Stamp" >> beam.Map(lambda x: window.TimestampedValue(x, x))
    sliding = (stamped | "Sliding" >> beam.WindowInto(window.SlidingWindows(4, 2))
               | "Restamp" >> beam.Map(restamp)
               | "KeySliding" >> beam.Map(lambda x: ("slide", x))
               | "SumSliding" >> beam.CombinePerKey(sum)
               | "ShowSliding" >> beam.Map(show))
    earliest = (stamped | "Fixed" >> beam.WindowInto(
        window.FixedWindows(10), timestamp_combiner=TimestampCombiner.OUTPUT_AT_EARLIEST)
                | "KeyFixed" >> beam.Map(lambda x: (x % 2, x))
                | "SumFixed" >> beam.CombinePerKey(sum)
                | "ShowFixed" >> beam.Map(show))
    sessions = (p | "Clicks" >> beam.Create([("u", 1), ("u", 2), ("u", 9), ("v", 3), ("u", 10.5)])
                | "StampClicks" >> beam.Map(lambda kv: window.TimestampedValue(kv, kv[1]))
                | "Sessions" >> beam.WindowInto(window.Sessions(3))
                | "OneClick" >> beam.Map(lambda kv: (kv[0], 1))
                | "CountClicks" >> beam.CombinePerKey(sum)
                | "ShowSessions" >> beam.Map(show))
    regrouped = (stamped | "Hourly" >> beam.WindowInto(window.FixedWindows(3600))
                 | "Global" >> beam.WindowInto(window.GlobalWindows())
                 | "KeyAll" >> beam.Map(lambda x: ("all", x))
                 | "SumAll" >> beam.CombinePerKey(sum)
                 | "ShowAll" >> beam.Map(show))

    branches = (counted, exploded, evens, odds, sliding, earliest, sessions, regrouped)
    ([b | f"Rewindow{i}" >> beam.WindowInto(window.GlobalWindows()) for i, b in enumerate(branches)]
     | beam.Flatten()
     | "Write" >> beam.io.WriteToText(os.path.join(out, "lines"), num_shards=1, shard_name_template=""))
    (words | "Probe" >> beam.Map(in_chain)
     | "Distinct" >> beam.Distinct()
     | "WriteProbe" >> beam.io.WriteToText(os.path.join(out, "probe"), num_shards=1, shard_name_template=""))


def run(args, out):
    p = beam.Pipeline(options=PipelineOptions(args))
    build(p, out)
    result = p.run()
    result.wait_until_finish()
    assert result.state == "DONE", result.state
    # Counted under the transform that counted (the DirectRunner names it by its label, the
    # portable runner by its id), not under the chain.
    counters = [c for c in result.metrics().query(MetricsFilter().with_namespace("chains"))["counters"]
                if re.fullmatch(r"Lower|ref_AppliedPTransform_Lower_\d+", c.key.step)]
    with open(os.path.join(out, "lines")) as f:
        lines = sorted(f.read().splitlines())
    with open(os.path.join(out, "probe")) as f:
        probe = f.read().split()
    return lines, sum(c.committed for c in counters), probe


def main(endpoint, python, scratch):
    direct, direct_words, _ = run(["--runner=DirectRunner"], os.path.join(scratch, "direct"))
    riverbank, riverbank_words, probe = run([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=PROCESS",
        f'--environment_config={{"command": "{python} -m apache_beam.runners.worker.sdk_worker_main"}}',
        "--sdk_worker_parallelism=1",
    ], os.path.join(scratch, "riverbank"))
    assert len(direct) > 40, direct
    assert riverbank == direct, "\n".join(
        [f"- {line}" for line in direct if line not in riverbank] +
        [f"+ {line}" for line in riverbank if line not in direct])
    assert direct_words == riverbank_words == 18, (direct_words, riverbank_words)
    assert probe == ["True"], probe
    print(f"chains: ok ({len(riverbank)} lines)")


if __name__ == "__main__":
    main(*sys.argv[1:4])
