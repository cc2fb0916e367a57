"""The tutorial's pipeline (seed 001) as Beam Python SDK code, unchanged but for its read: the
generated Parquet through Beam's own ReadFromParquet (a splittable DoFn) instead of pandas and
Create. Runs on any Beam runner; on Riverbank with

    python examples/taxi/trips_pipeline.py --input 'data/taxi/*.parquet' --output out/sdk \\
        --runner=PortableRunner --job_endpoint=localhost:8099 --environment_type=LOOPBACK

and on Beam's DirectRunner with `--runner=DirectRunner`. Prints the tutorial's summary."""
import argparse
import shutil

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window


def to_record(row):
    return {"pickup": row["tpep_pickup_datetime"].timestamp(), "zone": int(row["PULocationID"]),
            "amount": float(row["total_amount"])}


def run(input_glob, out, beam_args):
    shutil.rmtree(out, ignore_errors=True)
    with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
        events = (pipeline
                  | "Read" >> beam.io.ReadFromParquet(
                      input_glob, columns=["tpep_pickup_datetime", "PULocationID", "total_amount"])
                  | "Record" >> beam.Map(to_record))

        # Batch: one result for the whole bounded collection.
        (events
         | "Valid" >> beam.Filter(lambda trip: trip["amount"] > 0)
         | "ZoneAmount" >> beam.Map(lambda trip: (trip["zone"], trip["amount"]))
         | "SumPerZone" >> beam.CombinePerKey(sum)
         | "FormatZone" >> beam.Map(lambda pair: f"{pair[1]:012.2f} zone {pair[0]}")
         | "WriteZones" >> beam.io.WriteToText(f"{out}/zones", num_shards=1, shard_name_template=""))

        # Streaming-style: the same elements, given event timestamps and grouped into one-hour windows.
        (events
         | "Stamp" >> beam.Map(lambda trip: window.TimestampedValue(trip, trip["pickup"]))
         | "Hourly" >> beam.WindowInto(window.FixedWindows(3600))
         | "One" >> beam.Map(lambda trip: 1)
         | "CountPerWindow" >> beam.CombineGlobally(sum).without_defaults()
         | "FormatHour" >> beam.Map(lambda count, w=beam.DoFn.WindowParam:
                                    f"{w.start.to_utc_datetime():%H:%M} to {w.end.to_utc_datetime():%H:%M}  {count:5}")
         | "Regroup" >> beam.WindowInto(window.GlobalWindows())
         | "WriteHours" >> beam.io.WriteToText(f"{out}/hours", num_shards=1, shard_name_template=""))


def lines(prefix):
    # Through Beam's file systems: the output may be in object storage (s3://, gs://).
    out = []
    for found in FileSystems.match([prefix + "*"])[0].metadata_list:
        with FileSystems.open(found.path) as f:
            out.extend(line.strip() for line in f.read().decode().splitlines() if line.strip())
    return sorted(out)


def summary(out):
    zones = lines(f"{out}/zones")
    print(f"batch branch: revenue for {len(zones)} pickup zones, top 3")
    for line in zones[-1:-4:-1]:
        amount, zone = line.split(" ", 1)
        print(f"  {zone:9} {float(amount):10,.0f}")
    hours = lines(f"{out}/hours")
    print(f"\nwindowed branch: {len(hours)} one-hour windows, first 6")
    for line in hours[:6]:
        print("  " + line)
    print(f"  trips in all windows: {sum(int(line.split()[-1]) for line in hours):,}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    known, beam_args = parser.parse_known_args()
    run(known.input, known.output, beam_args)
    summary(known.output)
