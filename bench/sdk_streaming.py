"""A streaming Beam Python pipeline side by side: `examples/streaming/periodic_counts.py`
(PeriodicImpulse at RATE elements a second for SECONDS, counted per key in 2-s windows, each
window's counts written as it fires) on Beam's DirectRunner (streaming mode) and on Riverbank's
job server (release build of `riverbank-portable`'s `job_server` example), user code on a
LOOPBACK harness in both. Same Python, same script. For each run: wall and CPU seconds of the
whole command (the job server is a child of the timed command, so its CPU counts), peak RSS,
whether every element was counted in some window, and how long after its end each window
fired (the last write to its file, by the wall clock). `riverbank-checkpointed` is Riverbank
with `--temp_location` and a checkpoint every second (`checkpointing_interval=1000`), to see
what checkpoints cost.

    python3 bench/sdk_streaming.py [--rates 100,1000,4000] [--seconds 20]
        [--engines beam-direct,riverbank,riverbank-checkpointed]
"""
import argparse
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
WINDOW = 2


def build(target):
    subprocess.run(["cargo", "build", "--quiet", "--release", "-p", "riverbank-portable",
                    "--example", "job_server"], cwd=ROOT, check=True,
                   env={**os.environ, "CARGO_TARGET_DIR": str(target)})
    return target / "release" / "examples" / "job_server"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def timed(command, log):
    """Runs `command` under /usr/bin/time: (wall s, CPU s, peak RSS MB)."""
    stats = log.with_suffix(".time")
    with open(log, "w") as out:
        subprocess.run(["/usr/bin/time", "-o", str(stats), "-f", "%e %U %S %M"] + command,
                       stdout=out, stderr=subprocess.STDOUT, check=True)
    wall, user, system, rss_kb = stats.read_text().split()[-4:]
    return float(wall), float(user) + float(system), int(rss_kb) / 1024


def windows(out):
    """(elements counted, windows, fire lags in s) from the window files."""
    files = sorted(out.glob("window-*.csv"))
    lags, counted = [], 0
    for f in files:
        start = int(f.stem.split("-")[1])
        lags.append(f.stat().st_mtime - (start + WINDOW))
        counted += sum(int(line.split(",")[1]) for line in f.read_text().split())
    return counted, len(files), lags


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rates", default="100,1000,4000")
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--engines", default="beam-direct,riverbank,riverbank-checkpointed")
    args = parser.parse_args()
    venv = pathlib.Path(os.environ.get("RIVERBANK_BEAM_VENV",
                                       pathlib.Path.home() / ".cache/riverbank/beam-venv"))
    python = venv / "bin" / "python"
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR",
                                         pathlib.Path.home() / ".cache/riverbank/target"))
    server = build(target)
    work = ROOT / "bench" / "out" / "sdk-streaming"
    work.mkdir(parents=True, exist_ok=True)
    script = ROOT / "examples" / "streaming" / "periodic_counts.py"
    wrapper = work / "riverbank.sh"
    wrapper.write_text(f"""#!/usr/bin/env bash
set -euo pipefail
port=$1; shift
"{server}" "$port" 2>"{work}/job-server.log" &
server=$!
trap 'kill $server; wait $server || true' EXIT
for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.05; done
"{python}" "$@" --runner=PortableRunner --job_endpoint=127.0.0.1:$port --environment_type=LOOPBACK
""")
    wrapper.chmod(0o755)
    print(f"{'engine':<22}{'rate/s':>8}{'elements':>10}{'wall s':>8}{'CPU s':>8}"
          f"{'CPU µs/elt':>11}{'RSS MB':>8}{'windows':>8}{'lag p50':>9}{'lag max':>9}  all counted")
    for rate in [int(r) for r in args.rates.split(",")]:
        base = [str(script), "--seconds", str(args.seconds), "--interval", str(1 / rate),
                "--window-seconds", str(WINDOW)]
        for engine in args.engines.split(","):
            out = work / f"{engine}-{rate}"
            shutil.rmtree(out, ignore_errors=True)
            log = work / f"{engine}-{rate}.log"
            command = {
                "beam-direct": [str(python)] + base + ["--output", str(out),
                                                       "--runner=DirectRunner"],
                "riverbank": [str(wrapper), str(free_port())] + base + ["--output", str(out)],
                "riverbank-checkpointed": [str(wrapper), str(free_port())] + base + [
                    "--output", str(out), f"--temp_location={work}/checkpoints",
                    f"--job_name=bench-{rate}", "--experiments=checkpointing_interval=1000"],
            }[engine]
            wall, cpu, rss = timed(command, log)
            counted, n, lags = windows(out)
            elements = rate * args.seconds
            print(f"{engine:<22}{rate:>8}{elements:>10}{wall:>8.1f}{cpu:>8.1f}"
                  f"{cpu / elements * 1e6:>11.0f}{rss:>8.0f}{n:>8}"
                  f"{statistics.median(lags) if lags else float('nan'):>9.2f}"
                  f"{max(lags) if lags else float('nan'):>9.2f}  {counted == elements}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
