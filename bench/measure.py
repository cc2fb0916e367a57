#!/usr/bin/env python3
"""Times a whole command several times and writes the medians as one JSON result.

    python3 bench/measure.py --engine NAME --rows N [--runs 5] [--warmup 1] \
        [--clean DIR] [--result FILE.json] -- COMMAND [ARG ...]

Each run is the whole process, start-up included: wall time from just before the fork to
the reap, CPU (user + sys) and peak RSS from the kernel's accounting of the reaped child
(`wait4`; CPU includes the child's own reaped children, peak RSS is the largest of them).
`--clean DIR` removes DIR before every run (engines write their output there).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time


def run_once(cmd: list[str], clean: str | None, log) -> tuple[float, float, float, int]:
    if clean:
        shutil.rmtree(clean, ignore_errors=True)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024.0, p.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", required=True)
    ap.add_argument("--format", default="parquet")
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--clean")
    ap.add_argument("--log", help="append the command's output here")
    ap.add_argument("--result")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command")

    walls, cpus, rsss = [], [], []
    with open(args.log or os.devnull, "ab") as log:
        for i in range(args.warmup + args.runs):
            wall, cpu, rss, rc = run_once(cmd, args.clean, log)
            if rc != 0:
                print(f"{args.engine}: command failed (exit {rc}): {' '.join(cmd)}", file=sys.stderr)
                return 1
            if i >= args.warmup:
                walls.append(wall)
                cpus.append(cpu)
                rsss.append(rss)
    result = {
        "engine": args.engine,
        "format": args.format,
        "rows": args.rows,
        "runs": args.runs,
        "seconds": statistics.median(walls),
        "seconds_min": min(walls),
        "seconds_max": max(walls),
        "cpu_s": statistics.median(cpus),
        "peak_rss_mb": statistics.median(rsss),
        "check": "-",
    }
    print(
        f"{args.engine} ({args.format}): median of {args.runs}: {result['seconds']:.3f} s wall "
        f"(min {min(walls):.3f}, max {max(walls):.3f}), {result['cpu_s']:.3f} CPU s, "
        f"{result['peak_rss_mb']:.0f} MB peak RSS"
    )
    if args.result:
        with open(args.result, "w") as f:
            json.dump(result, f)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
