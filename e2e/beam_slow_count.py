"""A Beam Python SDK pipeline whose one long stage is worth more SDK worker pods: ELEMENTS
elements taking 100 ms each after a Reshuffle (so they are bundles the runner hands out), then
their count and sum written to OUTPUT as "COUNT SUM". The e2e test submits it with
`--num_workers=1 --max_num_workers=3` and checks that its SDK worker pods were scaled up while it
ran and that every element was counted once.

    python beam_slow_count.py --output URL [--elements N] [pipeline options...]
"""
import argparse
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions


def slowly(x):
    time.sleep(0.1)
    return x


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--elements", type=int, default=3000)
    args, rest = parser.parse_known_args()
    with beam.Pipeline(options=PipelineOptions(rest)) as p:
        _ = (
            p
            | beam.Create(range(args.elements))
            | beam.Reshuffle()
            | "Slowly" >> beam.Map(slowly)
            | beam.Map(lambda x: (1, x))
            | beam.CombineGlobally(lambda pairs: tuple(map(sum, zip(*pairs))) or (0, 0))
            | beam.MapTuple(lambda n, total: f"{n} {total}")
            | beam.io.WriteToText(args.output, shard_name_template=""))


if __name__ == "__main__":
    main()
