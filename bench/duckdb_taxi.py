#!/usr/bin/env python3
"""The taxi benchmark's two aggregations in DuckDB, as a baseline for Riverbank.

Times everything from opening the connection to writing the result files (the
interpreter start and ``import duckdb`` are excluded), writes results in Riverbank's
layout and, given ``--riverbank-out``, checks that both engines agree.

    python3 bench/duckdb_taxi.py --input 'bench/data/*.parquet' --output bench/out/duckdb \
        [--riverbank-out bench/out/riverbank] [--threads N] [--result result.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import taxi_common as tc  # noqa: E402

ZONES_SQL = """
SELECT PULocationID AS zone, sum(total_amount) AS revenue
FROM read_parquet($files)
WHERE total_amount > 0
GROUP BY 1
"""

# epoch() of a timestamp without time zone treats it as UTC, like Riverbank does.
HOURS_SQL = """
SELECT (epoch(tpep_pickup_datetime)::BIGINT // 3600) * 3600 AS start, count(*) AS trips
FROM read_parquet($files)
GROUP BY 1
"""

ROWS_SQL = "SELECT count(*) FROM read_parquet($files)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", required=True, help="directory, file or glob of parquet files")
    ap.add_argument("--output", required=True, help="directory for zones-*.jsonl / hours-*.jsonl")
    ap.add_argument("--riverbank-out", help="Riverbank's output directory to cross-check against")
    ap.add_argument("--threads", type=int, help="DuckDB worker threads (default: all cores)")
    ap.add_argument("--result", help="write a JSON summary here")
    args = ap.parse_args()

    import duckdb

    files = tc.parquet_files(args.input)
    t0 = time.perf_counter()
    con = duckdb.connect()
    if args.threads:
        con.execute(f"SET threads TO {int(args.threads)}")
    zones = {int(z): float(r) for z, r in con.execute(ZONES_SQL, {"files": files}).fetchall()}
    hours = {int(s): int(n) for s, n in con.execute(HOURS_SQL, {"files": files}).fetchall()}
    tc.write_results(args.output, zones, hours)
    seconds = time.perf_counter() - t0
    # Counting rows reads only parquet metadata; kept outside the timed section.
    rows = int(con.execute(ROWS_SQL, {"files": files}).fetchone()[0])

    check = "SKIPPED"
    if args.riverbank_out:
        try:
            rb = tc.read_results(args.riverbank_out)
        except (OSError, ValueError, KeyError) as e:
            print(f"cross-check duckdb vs riverbank: MISMATCH (cannot read riverbank output: {e})")
            check = "MISMATCH"
        else:
            ok = tc.compare("riverbank", rb, (zones, hours), "duckdb")
            check = "OK" if ok else "MISMATCH"

    tc.write_summary(
        args.result,
        {
            "engine": f"DuckDB {duckdb.__version__}",
            "rows": rows,
            "seconds": seconds,
            "peak_rss_mb": tc.peak_rss_mb(),
            "check": check,
        },
    )
    return 0 if check != "MISMATCH" else 1


if __name__ == "__main__":
    sys.exit(main())
