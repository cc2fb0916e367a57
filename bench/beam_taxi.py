#!/usr/bin/env python3
"""The taxi benchmark pipeline in the Apache Beam Python SDK on the DirectRunner.

Same shape as examples/taxi/taxi.yaml: read parquet, revenue per pickup zone over
positive totals (Filter + CombinePerKey(sum)), and trips per one-hour fixed window
(TimestampedValue + FixedWindows(3600) + CombineGlobally(count).without_defaults()).

The DirectRunner is meant for testing and is slow, so ``--days N`` runs on the first N
daily files only; the summary then carries an extrapolation to ``--total-rows`` at the
measured per-row rate, clearly labelled as such. Results are checked against an
independent pyarrow computation on the same files and, when every file was processed
and ``--riverbank-out`` is given, against Riverbank's output.

    python3 bench/beam_taxi.py --input 'bench/data/*.parquet' --output bench/out/beam \
        [--days 1] [--total-rows N] [--riverbank-out DIR] [--result result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import taxi_common as tc  # noqa: E402

COLUMNS = ["PULocationID", "total_amount", "tpep_pickup_datetime"]
EPOCH = datetime(1970, 1, 1)


def event_seconds(ts) -> float:
    """Event time in epoch seconds; naive timestamps are UTC, as in Riverbank."""
    if ts.tzinfo is not None:
        return ts.timestamp()
    return (ts - EPOCH).total_seconds()


def build(p, files: list[str], output: str):
    import apache_beam as beam
    from apache_beam.transforms import window

    class FormatWindow(beam.DoFn):
        def process(self, trips, win=beam.DoFn.WindowParam):
            start = int(win.start.micros // 1_000_000)
            yield json.dumps(
                {
                    "window_start": tc.iso_utc(start),
                    "window_end": tc.iso_utc(start + 3600),
                    "trips": trips,
                }
            )

    rows = (
        p
        | "Files" >> beam.Create(files)
        | "ReadParquet" >> beam.io.ReadAllFromParquet(columns=COLUMNS)
    )
    (
        rows
        | "Positive" >> beam.Filter(lambda r: r["total_amount"] is not None and r["total_amount"] > 0)
        | "KeyByZone" >> beam.Map(lambda r: (r["PULocationID"], r["total_amount"]))
        | "SumPerZone" >> beam.CombinePerKey(sum)
        | "FormatZone" >> beam.Map(lambda kv: json.dumps({"zone": kv[0], "revenue": kv[1]}))
        | "WriteZones"
        >> beam.io.WriteToText(
            os.path.join(output, "zones"), file_name_suffix=".jsonl", num_shards=1
        )
    )
    (
        rows
        | "Timestamp"
        >> beam.Map(lambda r: window.TimestampedValue(1, event_seconds(r["tpep_pickup_datetime"])))
        | "Hourly" >> beam.WindowInto(window.FixedWindows(3600))
        | "Count" >> beam.CombineGlobally(beam.combiners.CountCombineFn()).without_defaults()
        | "FormatHour" >> beam.ParDo(FormatWindow())
        | "Rewindow" >> beam.WindowInto(window.GlobalWindows())
        | "WriteHours"
        >> beam.io.WriteToText(
            os.path.join(output, "hours"), file_name_suffix=".jsonl", num_shards=1
        )
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", required=True, help="directory, file or glob of parquet files")
    ap.add_argument("--output", required=True, help="directory for zones.jsonl-* / hours.jsonl-*")
    ap.add_argument("--days", type=int, default=0, help="only the first N daily files (0 = all)")
    ap.add_argument("--total-rows", type=int, help="rows of the full data set, to extrapolate to")
    ap.add_argument("--riverbank-out", help="Riverbank's output directory (full runs only)")
    ap.add_argument("--result", help="write a JSON summary here")
    args = ap.parse_args()

    import apache_beam as beam
    import pyarrow.parquet as pq
    from apache_beam.options.pipeline_options import PipelineOptions

    all_files = tc.parquet_files(args.input)
    files = all_files[: args.days] if args.days else all_files
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    shutil.rmtree(args.output, ignore_errors=True)
    os.makedirs(args.output)

    # flags=[]: do not let Beam parse (and warn about) this script's own arguments.
    opts = PipelineOptions(flags=[], runner="DirectRunner", direct_num_workers=1)
    t0 = time.perf_counter()
    with beam.Pipeline(options=opts) as p:
        build(p, files, args.output)
    seconds = time.perf_counter() - t0

    got = tc.read_results(args.output)
    ok = tc.compare("beam", got, tc.reference(files), "pyarrow reference")
    if args.riverbank_out and len(files) == len(all_files):
        try:
            ok = tc.compare("beam", got, tc.read_results(args.riverbank_out), "riverbank") and ok
        except (OSError, ValueError, KeyError) as e:
            print(f"cross-check beam vs riverbank: MISMATCH (cannot read riverbank output: {e})")
            ok = False

    summary = {
        "engine": f"Beam {beam.__version__} DirectRunner",
        "rows": rows,
        "seconds": seconds,
        "peak_rss_mb": tc.peak_rss_mb(),
        "check": "OK" if ok else "MISMATCH",
        "files": len(files),
    }
    if args.total_rows and rows and args.total_rows != rows:
        summary["extrapolated_rows"] = args.total_rows
        summary["extrapolated_seconds"] = seconds * args.total_rows / rows
    tc.write_summary(args.result, summary)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
