"""A streaming Beam Python pipeline: PeriodicImpulse emits an element every --interval seconds
(its timestamp is the time it is due) for --seconds; each is keyed by whether its index is even
or odd, counted per key in --window-second fixed windows, and each window's counts are written
to OUT/window-START.csv as the window fires (`key,count` lines).

    riverbank run examples/streaming/periodic_counts.py -- --output out/periodic --seconds 60

Ctrl-C drains it: the source stops, the windows it read into fire, and the run ends."""
import argparse
import os
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse


class WriteWindow(beam.DoFn):
    """Appends a fired window's counts to its own file."""

    def __init__(self, output):
        self.output = output

    def process(self, kv, w=beam.DoFn.WindowParam):
        key, count = kv
        os.makedirs(self.output, exist_ok=True)
        with open(os.path.join(self.output, f"window-{int(w.start)}.csv"), "a") as f:
            f.write(f"{key},{count}\n")


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--window-seconds", type=int, default=2)
    args, beam_args = parser.parse_known_args(argv)
    options = PipelineOptions(beam_args)
    options.view_as(StandardOptions).streaming = True
    # The next whole window: every window but a drained job's last is full.
    start = float((int(time.time()) // args.window_seconds + 1) * args.window_seconds)
    p = beam.Pipeline(options=options)
    (p
     | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + args.seconds,
                       fire_interval=args.interval)
     | "Key" >> beam.Map(lambda t: ("even" if round((float(t) - start) / args.interval) % 2 == 0
                                    else "odd", 1))
     | beam.WindowInto(window.FixedWindows(args.window_seconds))
     | "Count" >> beam.CombinePerKey(sum)
     | beam.ParDo(WriteWindow(args.output)))
    result = p.run()
    try:
        result.wait_until_finish()
    except RuntimeError:
        # Beam's client calls a drained job's end an error: here it is the end asked for.
        if result.state != PipelineState.DRAINED:
            raise
    print(f"{result.state}: windows in {args.output}")


if __name__ == "__main__":
    main()
