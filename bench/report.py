#!/usr/bin/env python3
"""Side-by-side table of the taxi benchmark results written by bench/taxi.sh.

    python3 bench/report.py RESULT.json...

Each file holds one JSON object: engine, format, rows, seconds, cpu_s, peak_rss_mb and,
for subset runs, extrapolated_rows / extrapolated_seconds. The first file of each format
is the baseline the ratios refer to (Riverbank when it ran).
"""

from __future__ import annotations

import json
import os
import sys


def rate(rows: float, seconds: float) -> str:
    if seconds <= 0:
        return "-"
    r = rows / seconds
    if r >= 1e6:
        return f"{r / 1e6:.2f}M"
    if r >= 1e3:
        return f"{r / 1e3:.1f}k"
    return f"{r:.0f}"


def main(paths: list[str]) -> int:
    results = []
    for p in paths:
        if os.path.exists(p):
            with open(p) as f:
                results.append(json.load(f))
    if not results:
        print("no results")
        return 1
    header = ("format", "engine", "rows", "wall s", "rows/s", "CPU s", "peak RSS MB",
              "wall vs 1st", "RSS vs 1st")
    lines = []
    bases: dict[str, dict] = {}
    for r in results:
        fmt = r.get("format", "parquet")
        base = bases.setdefault(fmt, r)
        rows, secs, rss = r["rows"], r["seconds"], r.get("peak_rss_mb")
        label = r["engine"]
        if r.get("files") and r.get("extrapolated_rows"):
            label += f" ({r['files']}-day subset)"
        cpu = r.get("cpu_s")
        lines.append((
            fmt, label, f"{rows:,}", f"{secs:.3f}", rate(rows, secs),
            f"{cpu:.2f}" if cpu is not None else "-",
            f"{rss:.0f}" if rss else "-",
            f"{secs / base['seconds']:.2f}" if base["seconds"] > 0 else "-",
            f"{rss / base['peak_rss_mb']:.2f}" if rss and base.get("peak_rss_mb") else "-",
        ))
        if r.get("extrapolated_seconds"):
            xr, xs = r["extrapolated_rows"], r["extrapolated_seconds"]
            lines.append((fmt, "  -> extrapolated to full data*", f"{xr:,}", f"{xs:.1f}*",
                          rate(xr, xs), "-", "-", "-", "-"))
    widths = [max(len(str(row[i])) for row in [header, *lines]) for i in range(len(header))]
    fmt_line = "  ".join(f"{{:<{w}}}" if i < 2 else f"{{:>{w}}}" for i, w in enumerate(widths))
    print(fmt_line.format(*header))
    print("  ".join("-" * w for w in widths))
    for row in lines:
        print(fmt_line.format(*row))
    if any(r.get("extrapolated_seconds") for r in results):
        print("* estimated from the subset's per-row rate, not measured.")
    print("wall and CPU: medians over the runs, each the whole process (start-up included); "
          "ratios against the first engine of the same format (below 1: faster / smaller).")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
