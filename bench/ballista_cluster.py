#!/usr/bin/env python3
"""A Ballista cluster on this machine for bench/cluster.sh: a scheduler, or one executor.

    python bench/ballista_cluster.py scheduler --port 50050
    python bench/ballista_cluster.py executor --port 50051 --scheduler-port 50050 --tasks 1

Each runs until killed. The Python package `ballista` (PyPI; built from source here, as it
ships no wheel for this platform) embeds Ballista's scheduler and executor; the query side is
`bench/engines.py ballista` with BALLISTA_SCHEDULER=df://127.0.0.1:PORT.
"""

from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=["scheduler", "executor"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--scheduler-port", type=int, default=50050)
    ap.add_argument("--tasks", type=int, default=1, help="executor: concurrent tasks (cores)")
    args = ap.parse_args()

    from ballista import BallistaExecutor, BallistaScheduler

    if args.role == "scheduler":
        node = BallistaScheduler(bind_host="127.0.0.1", bind_port=args.port)
    else:
        node = BallistaExecutor(
            bind_port=args.port,
            bind_host="127.0.0.1",
            scheduler_host="127.0.0.1",
            scheduler_port=args.scheduler_port,
            concurrent_tasks=args.tasks,
        )
    node.start()
    node.wait_for_termination()


if __name__ == "__main__":
    main()
