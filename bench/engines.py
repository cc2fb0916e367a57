#!/usr/bin/env python3
"""The taxi benchmark's two aggregations in one other engine, as a whole command.

bench/taxi.sh times this whole process (interpreter start and imports included) with
/usr/bin/time, exactly as it times `riverbank run`, so every engine pays its start-up:

    python3 bench/engines.py ENGINE --format parquet|csv --input FILE_OR_GLOB --output DIR

ENGINE is one of duckdb, datafusion (its Python bindings), polars (lazy, streaming engine),
ballista (DataFusion Ballista, a cluster already started by bench/ballista_cluster.py).
Every engine writes zones.jsonl-* and hours.jsonl-* in Riverbank's layout; comparing them is
a separate, untimed step (`bench/engines.py check ...`).

The two aggregations, over every row of the input:
  zones: sum(total_amount) per PULocationID over rows with total_amount > 0;
  hours: count(*) per one-hour window of tpep_pickup_datetime (naive timestamps are UTC).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import taxi_common as tc  # noqa: E402


def files_of(pattern: str, fmt: str) -> list[str]:
    if os.path.isdir(pattern):
        pattern = os.path.join(pattern, f"*.{fmt}")
    files = sorted(glob.glob(pattern))
    if not files:
        raise SystemExit(f"no {fmt} files match {pattern}")
    return files


# The pickup hour as epoch seconds; the CSV readers below type the column as a timestamp.
ZONES_SQL = """
SELECT "PULocationID" AS zone, sum(total_amount) AS revenue
FROM trips WHERE total_amount > 0 GROUP BY 1
"""


def run_duckdb(files: list[str], fmt: str):
    import duckdb

    con = duckdb.connect()
    reader = "read_parquet" if fmt == "parquet" else "read_csv"
    con.execute(f"CREATE VIEW trips AS SELECT * FROM {reader}({files!r})")
    zones = con.execute(ZONES_SQL).fetchall()
    hours = con.execute(
        "SELECT (epoch(tpep_pickup_datetime)::BIGINT // 3600) * 3600, count(*) FROM trips GROUP BY 1"
    ).fetchall()
    return zones, hours


def run_datafusion(files: list[str], fmt: str):
    import datafusion

    ctx = datafusion.SessionContext()
    # One table over all files: register the directory's files through a listing table.
    if fmt == "parquet":
        ctx.register_parquet("trips", files[0] if len(files) == 1 else os.path.dirname(files[0]))
    else:
        ctx.register_csv("trips", files[0] if len(files) == 1 else os.path.dirname(files[0]))
    return _datafusion_results(ctx)


def _datafusion_results(ctx):
    """The two aggregations on a DataFusion or Ballista context with `trips` registered."""
    zones = ctx.sql(ZONES_SQL).to_pylist()
    hours = ctx.sql(
        "SELECT CAST(date_part('epoch', date_trunc('hour', tpep_pickup_datetime)) AS BIGINT) AS h,"
        " count(*) AS n FROM trips GROUP BY 1"
    ).to_pylist()
    return (
        [(r["zone"], r["revenue"]) for r in zones],
        [(r["h"], r["n"]) for r in hours],
    )


def run_ballista(files: list[str], fmt: str):
    """DataFusion Ballista: planned here, run by the cluster at BALLISTA_SCHEDULER (started by
    bench/ballista_cluster.py), results collected back here."""
    from ballista import BallistaSessionContext

    ctx = BallistaSessionContext(os.environ.get("BALLISTA_SCHEDULER", "df://127.0.0.1:50050"))
    kind = "PARQUET" if fmt == "parquet" else "CSV OPTIONS ('format.has_header' 'true')"
    where = files[0] if len(files) == 1 else os.path.dirname(files[0]) + "/"
    ctx.sql(f"CREATE EXTERNAL TABLE trips STORED AS {kind} LOCATION '{where}'")
    return _datafusion_results(ctx)


def run_polars(files: list[str], fmt: str):
    import polars as pl

    if fmt == "parquet":
        lf = pl.scan_parquet(files)
    else:
        lf = pl.scan_csv(files, try_parse_dates=True)
    zones = (
        lf.filter(pl.col("total_amount") > 0)
        .group_by("PULocationID")
        .agg(pl.col("total_amount").sum())
    )
    hours = lf.group_by(
        (pl.col("tpep_pickup_datetime").dt.truncate("1h").dt.epoch("s")).alias("h")
    ).agg(pl.len())
    z, h = pl.collect_all([zones, hours], engine="streaming")
    return list(z.iter_rows()), list(h.iter_rows())


ENGINES = {
    "duckdb": run_duckdb,
    "datafusion": run_datafusion,
    "polars": run_polars,
    "ballista": run_ballista,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine", choices=[*ENGINES, "check", "version"])
    ap.add_argument("--format", choices=["parquet", "csv"], default="parquet")
    ap.add_argument("--input", help="a file, directory or glob")
    ap.add_argument("--output", help="directory for zones.jsonl-* / hours.jsonl-*")
    ap.add_argument("--against", nargs="*", default=[], help="check: output directories")
    args = ap.parse_args()

    if args.engine == "version":
        import datafusion
        import duckdb
        import polars

        print(f"duckdb {duckdb.__version__}, datafusion {datafusion.__version__}, "
              f"polars {polars.__version__}")
        return 0
    if args.engine == "check":
        # Every directory against the first: revenue within 1e-9 relative, counts exact.
        base = tc.read_results(args.output)
        ok = True
        for other in args.against:
            ok &= tc.compare(other, tc.read_results(other), base, args.output)
        return 0 if ok else 1

    zones, hours = ENGINES[args.engine](files_of(args.input, args.format), args.format)
    tc.write_results(
        args.output,
        {int(z): float(r) for z, r in zones},
        {int(s): int(n) for s, n in hours},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
