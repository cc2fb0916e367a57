"""A streaming pipeline on Riverbank: PeriodicImpulse (an unbounded splittable DoFn that waits
for the clock, and moves the watermark as it goes) keyed, windowed in fixed 3-s windows and
summed per key. Each window's sum is written by the pipeline as it fires, with the wall-clock
time, so that the check sees windows fire while the source still runs, and every element counted
once in its window.

Usage: streaming.py JOB_ENDPOINT OUT_DIR run|drain
  run    the source emits 4 elements a second for 12 s and ends; every window fires once.
  drain  the source would run 10 minutes; once two windows have fired the job is drained
         through the Job API: the source stops, what it read is summed, the job ends DRAINED.
  stateful  a stateful DoFn after the source: refused at Prepare, by name."""
import glob
import json
import os
import sys
import time

import apache_beam as beam
import grpc
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse

INTERVAL = 0.25
WINDOW = 3


class Record(beam.DoFn):
    def __init__(self, out):
        self.out = out

    def process(self, kv, w=beam.DoFn.WindowParam):
        key, total = kv
        line = json.dumps({"key": key, "start": float(w.start), "count": total, "at": time.time()})
        with open(os.path.join(self.out, f"fired-{os.getpid()}"), "a") as f:
            f.write(line + "\n")


def fired(out):
    lines = []
    for path in glob.glob(os.path.join(out, "fired-*")):
        with open(path) as f:
            lines.extend(json.loads(l) for l in f if l.strip())
    return lines


def keyed(start):
    def key(t):
        k = round((float(t) - start) / INTERVAL)
        return ("even" if k % 2 == 0 else "odd", 1)
    return key


def expected(start, n):
    """Each of the first n elements' (key, window start) counted."""
    counts = {}
    for k in range(n):
        t = start + k * INTERVAL
        w = (t // WINDOW) * WINDOW
        key = "even" if k % 2 == 0 else "odd"
        counts[(key, w)] = counts.get((key, w), 0) + 1
    return counts


class Buffer(beam.DoFn):
    SEEN = beam.transforms.userstate.BagStateSpec("seen", beam.coders.VarIntCoder())

    def process(self, kv, seen=beam.DoFn.StateParam(SEEN)):
        seen.add(kv[1])
        yield kv


def refused(endpoint):
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
        "--streaming",
    ])
    p = beam.Pipeline(options=options)
    (p
     | PeriodicImpulse(fire_interval=1)
     | beam.Map(lambda t: ("k", 1))
     | "KeepSeen" >> beam.ParDo(Buffer()))
    try:
        p.run()
    except Exception as e:
        assert "KeepSeen" in str(e) and "state and timers in a streaming pipeline" in str(e), e
        print("streaming stateful: refused:", str(e).splitlines()[0][:300])
        print("streaming stateful: ok")
        return
    raise AssertionError("a stateful DoFn in a streaming pipeline ran")


def main(endpoint, out, mode):
    if mode == "stateful":
        return refused(endpoint)
    seconds = 12 if mode == "run" else 600
    # A whole second, a little ahead: the first element waits for the clock.
    start = float(int(time.time()) + 2)
    stop = start + seconds
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
        "--streaming",
    ])
    p = beam.Pipeline(options=options)
    (p
     | PeriodicImpulse(start_timestamp=start, stop_timestamp=stop, fire_interval=INTERVAL)
     | beam.Map(keyed(start))
     | beam.WindowInto(window.FixedWindows(WINDOW))
     | beam.CombinePerKey(sum)
     | beam.ParDo(Record(out)))
    result = p.run()
    if mode == "drain":
        while len({line["start"] for line in fired(out)}) < 2:
            assert time.time() < start + 60, "no two windows fired within a minute"
            time.sleep(0.2)
        drained_at = time.time()
        stub = beam_job_api_pb2_grpc.JobServiceStub(grpc.insecure_channel(endpoint))
        stub.Drain(beam_job_api_pb2.DrainJobRequest(job_id=result._job_id))
        try:
            result.wait_until_finish()
        except RuntimeError as e:
            assert "DRAINED" in str(e), e
        assert result.state == PipelineState.DRAINED, result.state
        assert time.time() - drained_at < 30, "the drained job took over 30 s to end"
    else:
        result.wait_until_finish()
        assert result.state == PipelineState.DONE, result.state

    lines = fired(out)
    got = {}
    for line in lines:
        k = (line["key"], line["start"])
        assert k not in got, f"window {k} fired twice: {lines}"
        got[k] = line["count"]
    if mode == "run":
        want = expected(start, int(seconds / INTERVAL))
        assert got == want, f"got {sorted(got.items())}, want {sorted(want.items())}"
    else:
        # What the source read before the drain: n elements, summed into their windows, the
        # last window partly; every element read counted once.
        n = sum(got.values())
        want = expected(start, n)
        assert got == want, f"got {sorted(got.items())}, want {sorted(want.items())} ({n} read)"
        assert n < seconds / INTERVAL / 2, f"the source was not stopped: {n} elements"
    # Streaming: the first window fired while the source was still emitting (3-s windows, a
    # 12-s source), not at its end; and not before the clock reached the window's end (the
    # source's watermark runs at most one interval ahead of it).
    first = min(line["at"] for line in lines)
    first_window_end = min(line["start"] for line in lines) + WINDOW
    if mode == "run":
        assert first < stop - 4, f"the first window fired at the end ({first - start:.1f} s in)"
    assert first >= first_window_end - 2 * INTERVAL, "a window fired before the clock reached its end"
    print(f"streaming {mode}: {len(got)} window sums, {sum(got.values())} elements, first window fired "
          f"{first - first_window_end:.2f} s after its end")
    print(f"streaming {mode}: ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
