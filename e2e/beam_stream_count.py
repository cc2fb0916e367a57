"""A streaming Beam Python SDK pipeline for the end-to-end test: PeriodicImpulse from START
(epoch seconds), 4 elements a second for at most 10 minutes, keyed even/odd by their index,
summed per key and 10-s fixed window; each window's sum written to OUTPUT/<key>-<window start>
through Beam's file systems (a window fired again after a restart writes the same object
again). The test drains its DataflowJob; the client then sees DRAINED and exits 0.

    python beam_stream_count.py --output URL --start EPOCH [pipeline options...]
"""
import argparse

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse

INTERVAL = 0.25


class Write(beam.DoFn):
    def __init__(self, output):
        self.output = output

    def process(self, kv, w=beam.DoFn.WindowParam):
        key, total = kv
        with FileSystems.create(f"{self.output}/{key}-{int(w.start)}") as f:
            f.write(str(total).encode())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--start", type=float, required=True)
    args, rest = parser.parse_known_args()
    start = args.start

    def keyed(t):
        k = round((float(t) - start) / INTERVAL)
        return ("even" if k % 2 == 0 else "odd", 1)

    p = beam.Pipeline(options=PipelineOptions(rest))
    _ = (
        p
        | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 600,
                          fire_interval=INTERVAL)
        | beam.Map(keyed)
        | beam.WindowInto(window.FixedWindows(10))
        | beam.CombinePerKey(sum)
        | beam.ParDo(Write(args.output)))
    result = p.run()
    try:
        result.wait_until_finish()
    except RuntimeError:
        pass  # Beam's client raises on any end but DONE
    print(f"the job ended {result.state}")
    if result.state != PipelineState.DRAINED:
        raise SystemExit(f"the streaming job ended {result.state}, not DRAINED")


if __name__ == "__main__":
    main()
