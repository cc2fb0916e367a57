#!/usr/bin/env python3
"""The `helm` commands the end-to-end test runs, through Helm's own Go library (the PyPI
package helm-python-sdk: Helm's SDK built as a C library), for machines without the helm CLI:

    e2e/helm.py upgrade --install NAME CHART [--namespace NS] [--create-namespace]
        [--skip-crds] [--wait] [--timeout 5m] [--set K=V]... [--set-json K=JSON]... [--kubeconfig PATH]
    e2e/helm.py uninstall NAME [--namespace NS] [--wait] [--kubeconfig PATH]

Releases are Helm's (Secrets of type helm.sh/release.v1), so the helm CLI sees them too. Use it
with RIVERBANK_E2E_HELM=e2e/helm.py. `--skip-crds` is accepted: the library installs a chart's
crds/ only when the CRD is absent, and the test applies the CRD first.
"""
from __future__ import annotations

import argparse
import json
import re
import sys

import helm_python as helm


def seconds(text: str) -> int:
    """Go durations as helm takes them: 300s, 5m, 1h30m."""
    total, units = 0, {"h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+)([hms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise SystemExit(f"helm.py: --timeout {text!r} is not a duration like 300s or 5m")
    for number, unit in parts:
        total += int(number) * units[unit]
    return total


def merge(into: dict, new: dict) -> dict:
    """--set values, later ones winning, merged key by key as helm merges them."""
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value
    return into


def set_json(expression: str) -> dict:
    """`a.b=JSON` as helm's --set-json reads it: the value at the dotted key, parsed as JSON."""
    key, _, text = expression.partition("=")
    if not key or not text:
        raise SystemExit(f"helm.py: --set-json {expression!r} is not KEY=JSON")
    value = json.loads(text)
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="helm.py")
    parser.add_argument("command", choices=["upgrade", "uninstall"])
    parser.add_argument("release")
    parser.add_argument("chart", nargs="?")
    parser.add_argument("--install", action="store_true")
    parser.add_argument("--namespace", "-n", default="default")
    parser.add_argument("--create-namespace", action="store_true")
    parser.add_argument("--skip-crds", action="store_true")
    parser.add_argument("--wait", action="store_true")
    parser.add_argument("--timeout", default="5m")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--set-json", action="append", default=[])
    parser.add_argument("--kubeconfig")
    args = parser.parse_args(argv)
    wait = "watcher" if args.wait else None
    timeout = seconds(args.timeout)
    try:
        with helm.Config(namespace=args.namespace, kubeconfig_path=args.kubeconfig) as cfg:
            if args.command == "uninstall":
                cfg.uninstall(args.release, wait=wait, timeout=timeout, ignore_not_found=True)
                print(f'release "{args.release}" uninstalled')
                return 0
            if not args.chart:
                parser.error("upgrade needs a chart")
            values: dict = {}
            for expression in args.set:
                merge(values, helm.parse_set_string(expression))
            for expression in args.set_json:
                merge(values, set_json(expression))
            try:
                cfg.status(args.release)
                installed = True
            except helm.HelmNotFoundError:
                installed = False
            if installed or not args.install:
                release = cfg.upgrade(
                    args.chart, args.release, values, namespace=args.namespace,
                    wait=wait, timeout=timeout,
                )
            else:
                release = cfg.install(
                    args.chart, args.release, values, namespace=args.namespace,
                    wait=wait, timeout=timeout, create_namespace=args.create_namespace,
                )
            info = release.get("info", {}) if isinstance(release, dict) else {}
            print(f'release "{args.release}": {info.get("status", "deployed")}')
            return 0
    except helm.HelmError as e:
        print(f"helm.py {args.command} {args.release}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
