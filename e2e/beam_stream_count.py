"""A streaming Beam Python SDK pipeline for the end-to-end test: PeriodicImpulse from START
(epoch seconds), 4 elements a second for at most 10 minutes, keyed even/odd by their index,
summed per key and 10-s fixed window by the CombinePerKey "Sum"; each window's sum written to
OUTPUT/<key>-<window start> as "SUM vVERSION" through Beam's file systems (a window fired again
after a restart writes the same object again). `--version 2` names the CombinePerKey "Total"
(submitted with `--update --transform_name_mapping='{"Sum": "Total"}'`). The client exits 0
when its job ends in the state `--expect` names (DRAINED: the test drains the DataflowJob;
UPDATED: the client of the job an update replaced).

    python beam_stream_count.py --output URL --start EPOCH [--version N] [--expect STATE]
        [pipeline options...]
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
    def __init__(self, output, version):
        self.output = output
        self.version = version

    def process(self, kv, w=beam.DoFn.WindowParam):
        key, total = kv
        with FileSystems.create(f"{self.output}/{key}-{int(w.start)}") as f:
            f.write(f"{total} v{self.version}".encode())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--version", type=int, default=1)
    parser.add_argument("--expect", default="DRAINED")
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
        | ("Sum" if args.version == 1 else "Total") >> beam.CombinePerKey(sum)
        | beam.ParDo(Write(args.output, args.version)))
    result = p.run()
    try:
        result.wait_until_finish()
    except RuntimeError:
        pass  # Beam's client raises on any end but DONE
    print(f"the job ended {result.state}")
    if result.state != getattr(PipelineState, args.expect):
        raise SystemExit(f"the streaming job ended {result.state}, not {args.expect}")


if __name__ == "__main__":
    main()
