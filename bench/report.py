#!/usr/bin/env python3
"""Side-by-side table of the taxi benchmark results written by bench/taxi.sh.

    python3 bench/report.py RESULT.json...

Each file holds one JSON object: engine, rows, seconds, peak_rss_mb, check and, for
subset runs, extrapolated_rows / extrapolated_seconds. The first file is the
baseline the ratios refer to (Riverbank when it ran).
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
    base = results[0]
    base_rate = base["rows"] / base["seconds"] if base["seconds"] > 0 else 0.0
    base_rss = base.get("peak_rss_mb") or 0.0

    header = ("engine", "rows", "wall s", "rows/s", "peak RSS MB",
              f"{base['engine'].split()[0]} speedup", "RSS ratio", "check")
    lines = []
    for r in results:
        rows, secs, rss = r["rows"], r["seconds"], r.get("peak_rss_mb")
        label = r["engine"]
        if r.get("files") and r.get("extrapolated_rows"):
            label += f" ({r['files']}-day subset)"
        speed = base_rate / (rows / secs) if secs > 0 and rows else 0.0
        lines.append((
            label, f"{rows:,}", f"{secs:.2f}", rate(rows, secs),
            f"{rss:.0f}" if rss else "-",
            f"{speed:.1f}x" if r is not base else "1.0x",
            f"{rss / base_rss:.1f}x" if rss and base_rss else "-",
            r.get("check", "-"),
        ))
        if r.get("extrapolated_seconds"):
            xr, xs = r["extrapolated_rows"], r["extrapolated_seconds"]
            lines.append((
                "  -> extrapolated to full data*", f"{xr:,}", f"{xs:.1f}*", rate(xr, xs),
                "-", f"{speed:.1f}x", "-", "",
            ))
    widths = [max(len(str(row[i])) for row in [header, *lines]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    print(fmt.format(*header))
    print("  ".join("-" * w for w in widths))
    for row in lines:
        print(fmt.format(*row))
    if any(r.get("extrapolated_seconds") for r in results):
        print("* estimated from the subset's per-row rate, not measured.")
    print(f"speedup = {base['engine'].split()[0]} rows/s / engine rows/s "
          "(>1: the baseline is faster); RSS ratio = engine peak RSS / baseline peak RSS.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
