"""Shared helpers for the taxi benchmark scripts: result files, reference
aggregates and the cross-check against Riverbank's output.

The two aggregations every engine computes over the same parquet files:

* zones: ``{"zone": PULocationID, "revenue": sum(total_amount)}`` over rows with
  ``total_amount > 0``;
* hours: ``{"window_start": ISO-8601 UTC, "window_end": ..., "trips": count}`` for
  one-hour fixed windows on ``tpep_pickup_datetime`` (all rows).
"""

from __future__ import annotations

import glob
import json
import os
import resource
from datetime import datetime, timezone

REL_TOL = 1e-9


def parquet_files(pattern: str, days: int | None = None) -> list[str]:
    """Sorted parquet files matching ``pattern`` (a directory, file or glob)."""
    if os.path.isdir(pattern):
        pattern = os.path.join(pattern, "*.parquet")
    files = sorted(glob.glob(pattern))
    if not files:
        raise SystemExit(f"no parquet files match {pattern}")
    return files[:days] if days else files


def iso_utc(epoch_seconds: int) -> str:
    return datetime.fromtimestamp(epoch_seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_instant(value) -> int:
    """Epoch seconds from an ISO-8601 string (``Z``, offset or naive = UTC) or a number
    (seconds, or milli/microseconds if large)."""
    if isinstance(value, (int, float)):
        v = float(value)
        while abs(v) > 1e11:  # ms or us
            v /= 1000.0
        return int(round(v))
    s = str(value).strip().replace(" ", "T")
    if s.endswith("Z"):
        s = s[:-1] + "+00:00"
    dt = datetime.fromisoformat(s)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(round(dt.timestamp()))


def write_results(out_dir: str, zones: dict[int, float], hours: dict[int, int]) -> None:
    """Write results in Riverbank's layout: zones.jsonl-* and hours.jsonl-*."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "zones.jsonl-00000-of-00001"), "w") as f:
        for zone in sorted(zones):
            f.write(json.dumps({"zone": zone, "revenue": zones[zone]}) + "\n")
    with open(os.path.join(out_dir, "hours.jsonl-00000-of-00001"), "w") as f:
        for start in sorted(hours):
            f.write(
                json.dumps(
                    {
                        "window_start": iso_utc(start),
                        "window_end": iso_utc(start + 3600),
                        "trips": hours[start],
                    }
                )
                + "\n"
            )


def _jsonl_rows(pattern: str):
    files = sorted(glob.glob(pattern))
    for path in files:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    yield json.loads(line)


def read_results(out_dir: str) -> tuple[dict[int, float], dict[int, int]]:
    """Read zones.jsonl-* / hours.jsonl-* (any shard naming) from ``out_dir``.
    Duplicate keys are summed, so per-shard partial results also work."""
    zones: dict[int, float] = {}
    hours: dict[int, int] = {}
    zone_files = glob.glob(os.path.join(out_dir, "zones.jsonl-*"))
    hour_files = glob.glob(os.path.join(out_dir, "hours.jsonl-*"))
    if not zone_files or not hour_files:
        raise FileNotFoundError(f"no zones.jsonl-* / hours.jsonl-* in {out_dir}")
    for r in _jsonl_rows(os.path.join(out_dir, "zones.jsonl-*")):
        z = int(r["zone"])
        zones[z] = zones.get(z, 0.0) + float(r["revenue"])
    for r in _jsonl_rows(os.path.join(out_dir, "hours.jsonl-*")):
        start = parse_instant(r["window_start"])
        if "window_end" in r and parse_instant(r["window_end"]) - start != 3600:
            raise ValueError(f"window is not one hour: {r}")
        hours[start] = hours.get(start, 0) + int(r["trips"])
    return zones, hours


def compare(
    name: str,
    got: tuple[dict[int, float], dict[int, int]],
    want: tuple[dict[int, float], dict[int, int]],
    want_name: str,
) -> bool:
    """Print OK or MISMATCH (with the first differences) and return whether equal:
    revenue within REL_TOL relative, trip counts exact, same keys."""
    problems: list[str] = []
    (gz, gh), (wz, wh) = got, want
    for z in sorted(set(gz) | set(wz)):
        if z not in gz or z not in wz:
            problems.append(f"zone {z}: {gz.get(z)} vs {wz.get(z)}")
        elif abs(gz[z] - wz[z]) > REL_TOL * max(abs(gz[z]), abs(wz[z]), 1e-300):
            problems.append(f"zone {z}: revenue {gz[z]!r} vs {wz[z]!r}")
    for h in sorted(set(gh) | set(wh)):
        if gh.get(h) != wh.get(h):
            problems.append(f"hour {iso_utc(h)}: trips {gh.get(h)} vs {wh.get(h)}")
    if problems:
        print(f"cross-check {name} vs {want_name}: MISMATCH ({len(problems)} differences)")
        for p in problems[:10]:
            print(f"  {p}")
        return False
    print(
        f"cross-check {name} vs {want_name}: OK "
        f"({len(gz)} zones within {REL_TOL:g} relative, {len(gh)} hourly counts exact)"
    )
    return True


def reference(files: list[str]) -> tuple[dict[int, float], dict[int, int]]:
    """Independent reference computed with pyarrow alone (used to validate subsets)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(files, columns=["PULocationID", "total_amount", "tpep_pickup_datetime"])
    pos = t.filter(pc.greater(t["total_amount"], 0))
    z = pos.group_by("PULocationID").aggregate([("total_amount", "sum")])
    zones = dict(zip(z["PULocationID"].to_pylist(), z["total_amount_sum"].to_pylist()))
    secs = pc.divide(t["tpep_pickup_datetime"].cast("int64"), 1_000_000)
    start = pc.multiply(pc.divide(secs, 3600), 3600)  # integer division: floor for >= 0
    h = t.append_column("start", start).group_by("start").aggregate([("start", "count")])
    hours = dict(zip(h["start"].to_pylist(), h["start_count"].to_pylist()))
    return zones, hours


def peak_rss_mb() -> float:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def write_summary(path: str | None, summary: dict) -> None:
    """Machine-readable result line for bench/taxi.sh's table."""
    print(json.dumps(summary))
    if path:
        with open(path, "w") as f:
            json.dump(summary, f)
            f.write("\n")
