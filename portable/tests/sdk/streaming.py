"""Streaming pipelines on Riverbank: PeriodicImpulse (an unbounded splittable DoFn that waits
for the clock, and moves the watermark as it goes) keyed, windowed in fixed 3-s windows and
summed per key, and variations. What fires is written by the pipeline as it fires, with the
wall-clock time, so that each check sees windows fire while the source still runs, and every
element counted once in its window. Each mode checks itself and ends with `streaming MODE: ok`.

Usage: streaming.py JOB_ENDPOINT OUT_DIR MODE
  run    the source emits 4 elements a second for 12 s and ends (each weighed by a bounded side
         input); every window fires once.
  drain  the source would run 10 minutes; once two windows have fired the job is drained
         through the Job API: the source stops, what it read is summed, the job ends DRAINED.
  stateful  state and timers: a bag summed per window by an event-time timer, and counts
            flushed by a processing-time timer.
  refused   a side input that never ends in the global window: refused at Prepare, by name.
  triggers  sessions with early firings (panes go on as sessions merge), and OrFinally ending a
            window's panes.
  early     early firings by processing time, accumulating, then the on-time pane.
  crash     a PROCESS harness dies once inside a stateful DoFn: retried, every window exact.
  sides     a side input that never ends (windowed PeriodicImpulse): each main element reads its
            own window's side value, once that window is complete.
  branches  a slow branch (an hour-old watermark) beside a fast one: the fast one's windows fire
            while the slow one runs.
  hold      a processing-time timer's hold: elements buffered past the watermark and let go
            with their own timestamps are not late for the windows after it.
  late      allowed lateness: a late element fires a late pane, one past the lateness is dropped.
  resume    checkpoints (--temp_location): run twice against two job servers, the first killed
            mid-job (cli/tests/beam_sdk.rs); the second run resumes the job from its checkpoint.
  update    --update: a running job replaced by one with changed code and renamed transforms;
            an incompatible replacement refused.
  backlog   an unbounded splittable DoFn that reads one offset of 100 a round and sizes what is
            left at 1,000 bytes an offset: the runner reports that as the sources' backlog."""
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
from apache_beam.transforms import trigger, userstate, window
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.utils.timestamp import Duration, Timestamp

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


def fired(out, kind="fired"):
    lines = []
    for path in glob.glob(os.path.join(out, f"{kind}-*")):
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


class BufferPerWindow(beam.DoFn):
    """Each key's values in a bag per window, summed by an event-time timer at the window's
    end: a GroupByKey written as state and timers. With `die_once`, its harness process dies
    in the timer that sums the second window, once: after the same chain of bundles wrote the
    round's elements to the state, so the retried chain must start from the state as it was."""
    SEEN = userstate.BagStateSpec("seen", beam.coders.VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", userstate.TimeDomain.WATERMARK)

    def __init__(self, out, die_once=False):
        self.out = out
        self.die_once = die_once

    def process(self, kv, w=beam.DoFn.WindowParam, seen=beam.DoFn.StateParam(SEEN),
                flush=beam.DoFn.TimerParam(FLUSH)):
        seen.add(kv[1])
        flush.set(w.max_timestamp())

    @userstate.on_timer(FLUSH)
    def flushed(self, key=beam.DoFn.KeyParam, w=beam.DoFn.WindowParam,
                seen=beam.DoFn.StateParam(SEEN)):
        marker = os.path.join(self.out, "died")
        if self.die_once and len(fired(self.out, "timers")) == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)  # the harness dies mid-chain, as a pod killed for memory would
        record(self.out, "timers", {"key": key, "start": float(w.start), "count": sum(seen.read())})
        seen.clear()


class EverySecond(beam.DoFn):
    """Each key's count since its last flush, flushed by a processing-time timer a second after
    the first element it counts."""
    COUNT = userstate.ReadModifyWriteStateSpec("count", beam.coders.VarIntCoder())
    TICK = userstate.TimerSpec("tick", userstate.TimeDomain.REAL_TIME)

    def __init__(self, out):
        self.out = out

    def process(self, kv, count=beam.DoFn.StateParam(COUNT), tick=beam.DoFn.TimerParam(TICK)):
        c = count.read() or 0
        if c == 0:
            tick.set(Timestamp.now() + Duration(seconds=1))
        count.write(c + kv[1])

    @userstate.on_timer(TICK)
    def ticked(self, key=beam.DoFn.KeyParam, count=beam.DoFn.StateParam(COUNT)):
        record(self.out, "ticks", {"key": key, "count": count.read() or 0})
        count.clear()


class KeepPerWindow(beam.DoFn):
    """A bag per key and window that is never cleared: the runner drops it when its window
    expires."""
    KEPT = userstate.BagStateSpec("kept", beam.coders.VarIntCoder())

    def process(self, kv, kept=beam.DoFn.StateParam(KEPT)):
        kept.add(kv[1])


def record(out, kind, fields):
    fields["at"] = time.time()
    with open(os.path.join(out, f"{kind}-{os.getpid()}"), "a") as f:
        f.write(json.dumps(fields) + "\n")


def stateful(endpoint, out):
    """State and timers in a streaming job: the event-time timers' sums equal the windows'
    counts, each fired once; the processing-time timers fire while the source runs, and their
    counts add up to every element."""
    start = float(int(time.time()) + 2)
    stop = start + 12
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
        "--streaming",
    ])
    with beam.Pipeline(options=options) as p:
        keyed_ = (p
                  | PeriodicImpulse(start_timestamp=start, stop_timestamp=stop, fire_interval=INTERVAL)
                  | beam.Map(keyed(start)))
        (keyed_
         | beam.WindowInto(window.FixedWindows(WINDOW))
         | "BufferPerWindow" >> beam.ParDo(BufferPerWindow(out)))
        keyed_ | "EverySecond" >> beam.ParDo(EverySecond(out))
        (keyed_
         | "Windowed" >> beam.WindowInto(window.FixedWindows(WINDOW))
         | "KeepPerWindow" >> beam.ParDo(KeepPerWindow()))
    n = int(12 / INTERVAL)
    timers = fired(out, "timers")
    got = {}
    for line in timers:
        k = (line["key"], line["start"])
        assert k not in got, f"window {k} fired twice: {timers}"
        got[k] = line["count"]
    want = expected(start, n)
    assert got == want, f"got {sorted(got.items())}, want {sorted(want.items())}"
    first = min(line["at"] for line in timers)
    assert first < stop - 4, f"the first event-time timer fired at the end ({first - start:.1f} s in)"
    ticks = fired(out, "ticks")
    for key in ("even", "odd"):
        counts = [line["count"] for line in ticks if line["key"] == key]
        assert sum(counts) == n // 2, f"{key}: {counts}"
        early = [line for line in ticks if line["key"] == key and line["at"] < stop - 2]
        assert len(early) >= 3, f"{key}: processing-time timers did not fire while the source ran: {ticks}"
    print(f"streaming stateful: {len(got)} windows flushed by event-time timers, "
          f"{len(ticks)} flushes by processing-time timers")
    print("streaming stateful: ok")


class BufferASecond(beam.DoFn):
    """Each key's elements buffered until a processing-time timer a second after the first,
    then let go with their own timestamps (a batching DoFn's pattern)."""
    BUFFER = userstate.BagStateSpec("buffer", beam.coders.FloatCoder())
    FLUSH = userstate.TimerSpec("flush", userstate.TimeDomain.REAL_TIME)
    ARMED = userstate.ReadModifyWriteStateSpec("armed", beam.coders.BooleanCoder())

    def process(self, kv, buffer=beam.DoFn.StateParam(BUFFER), armed=beam.DoFn.StateParam(ARMED),
                flush=beam.DoFn.TimerParam(FLUSH)):
        if not armed.read():
            flush.set(Timestamp.now() + Duration(seconds=1))
            armed.write(True)
        buffer.add(kv[1])

    @userstate.on_timer(FLUSH)
    def flushed(self, key=beam.DoFn.KeyParam, buffer=beam.DoFn.StateParam(BUFFER),
                armed=beam.DoFn.StateParam(ARMED)):
        for t in buffer.read():
            yield window.TimestampedValue((key, 1), t)
        buffer.clear()
        armed.clear()


def hold(endpoint, out):
    """Timers hold the watermark: a source whose first 30 s are in the past (read at once, its
    watermark at the present in the first round) into a DoFn that buffers each key's elements
    for a second of processing time and lets them go with their own timestamps, then counted
    per 3-s window. The processing-time timer holds the windows after it at the buffered
    elements' time, so none is late: every element is counted in its window."""
    start = float(int(time.time()) - 30)
    stop = start + 36
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
        "--streaming",
    ])
    with beam.Pipeline(options=options) as p:
        (p
         | PeriodicImpulse(start_timestamp=start, stop_timestamp=stop, fire_interval=INTERVAL)
         | beam.Map(lambda t: (keyed(start)(t)[0], float(t)))
         | beam.ParDo(BufferASecond())
         | beam.WindowInto(window.FixedWindows(WINDOW))
         | beam.CombinePerKey(sum)
         | beam.ParDo(Record(out)))
    n = int((stop - start) / INTERVAL)
    got = {}
    for line in fired(out):
        k = (line["key"], line["start"])
        assert k not in got, f"window {k} fired twice"
        got[k] = line["count"]
    want = expected(start, n)
    assert got == want, f"got {sorted(got.items())}, want {sorted(want.items())}"
    print(f"streaming hold: {len(got)} windows, {n} elements, none late")
    print("streaming hold: ok")


def late(endpoint, out):
    """Allowed lateness: a pre-timestamped PeriodicImpulse whose fifth element is late (its
    window fired on time already) within the 10 s allowed, and whose seventh is late past it.
    Accumulating: the late pane holds the window's earlier elements too; the element past the
    lateness is dropped."""
    start = float((int(time.time()) // 2 + 1) * 2)
    at = [0.1, 0.6, 2.1, 4.1, 1.0, 6.1, -20.0, 8.1]
    data = [(Timestamp.of(start + t), i) for i, t in enumerate(at)]
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
        "--streaming",
    ])

    def write(kv, w=beam.DoFn.WindowParam, p=beam.DoFn.PaneInfoParam):
        record(out, "panes", {"start": float(w.start) - start, "count": len(list(kv[1])),
                              "timing": p.timing, "index": p.index})

    with beam.Pipeline(options=options) as p:
        (p
         | PeriodicImpulse(data=data, start_timestamp=start,
                           stop_timestamp=start + len(data) * INTERVAL, fire_interval=INTERVAL)
         | beam.Map(lambda i: ("k", i))
         | beam.WindowInto(window.FixedWindows(2), allowed_lateness=10,
                           accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
         | beam.GroupByKey()
         | beam.Map(write))
    got = sorted((line["start"], line["index"], line["timing"], line["count"])
                 for line in fired(out, "panes"))
    ON_TIME, LATE = 1, 2
    want = [(0.0, 0, ON_TIME, 2), (0.0, 1, LATE, 3), (2.0, 0, ON_TIME, 1), (4.0, 0, ON_TIME, 1),
            (6.0, 0, ON_TIME, 1), (8.0, 0, ON_TIME, 1)]
    assert got == want, f"got {got}, want {want}"
    print(f"streaming late: {len(got)} panes, one late")
    print("streaming late: ok")


def early(endpoint, out):
    """Early firings: 6-s windows with AfterWatermark(early=AfterProcessingTime(1)),
    accumulating: panes about every second while a window is open, each holding what came so
    far, then the on-time pane with every element of the window."""
    # Six to twelve seconds ahead: the job is up before its first window opens, however slowly
    # a loaded machine starts it (CI once took 4 s, and the first window lost its early panes).
    start = float((int(time.time()) // 6 + 2) * 6)
    seconds = 12
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
        "--streaming",
    ])

    def write(kv, w=beam.DoFn.WindowParam, p=beam.DoFn.PaneInfoParam):
        record(out, "panes", {"start": float(w.start) - start, "count": kv[1],
                              "timing": p.timing, "index": p.index, "first": p.is_first})

    with beam.Pipeline(options=options) as p:
        (p
         | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + seconds,
                           fire_interval=INTERVAL)
         | beam.Map(lambda t: ("k", 1))
         | beam.WindowInto(window.FixedWindows(6),
                           trigger=trigger.AfterWatermark(early=trigger.AfterProcessingTime(1)),
                           accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
         | beam.CombinePerKey(sum)
         | beam.Map(write))
    panes = sorted(fired(out, "panes"), key=lambda l: (l["start"], l["index"]))
    EARLY, ON_TIME = 0, 1
    per_window = int(6 / INTERVAL)
    for w in (0.0, 6.0):
        mine = [l for l in panes if l["start"] == w]
        early_ = [l for l in mine if l["timing"] == EARLY]
        on_time = [l for l in mine if l["timing"] == ON_TIME]
        assert len(on_time) == 1 and on_time[0]["count"] == per_window, mine
        assert len(early_) >= 3, f"window {w}: {len(early_)} early panes: {mine}"
        counts = [l["count"] for l in early_]
        assert counts == sorted(counts) and counts[-1] < per_window, mine
        assert [l["index"] for l in mine] == list(range(len(mine))), mine
        assert mine[0]["first"] and not mine[1]["first"], mine
    print(f"streaming early: {len(panes)} panes over 2 windows")
    print("streaming early: ok")


def crash(endpoint, out):
    """A streaming job on a PROCESS harness that dies once inside a stateful DoFn: the harness
    is replaced, the bundle retried on the bucket's state as it was, every window exact."""
    start = float(int(time.time()) + 3)
    seconds = 12
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=PROCESS",
        f'--environment_config={{"command": "{sys.executable} -m apache_beam.runners.worker.sdk_worker_main"}}',
        "--sdk_worker_parallelism=1", "--streaming",
    ])


    with beam.Pipeline(options=options) as p:
        (p
         | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + seconds,
                           fire_interval=INTERVAL)
         # One key: every round's element and every timer in the same bucket of keys.
         | beam.Map(lambda t: ("k", 1))
         | beam.WindowInto(window.FixedWindows(WINDOW))
         | "BufferDyingOnce" >> beam.ParDo(BufferPerWindow(out, die_once=True)))
    assert os.path.exists(os.path.join(out, "died")), "the harness never died"
    got = {}
    for line in fired(out, "timers"):
        k = (line["key"], line["start"])
        assert k not in got, f"window {k} fired twice"
        got[k] = line["count"]
    want = {}
    for k in range(int(seconds / INTERVAL)):
        w = ((start + k * INTERVAL) // WINDOW) * WINDOW
        want[("k", w)] = want.get(("k", w), 0) + 1
    assert got == want, f"got {sorted(got.items())}, want {sorted(want.items())}"
    print(f"streaming crash: {len(got)} windows exact after the harness died")
    print("streaming crash: ok")


def sides(endpoint, out):
    """A side input that never ends (Beam's slowly updating side input): a second
    PeriodicImpulse every 3 s, windowed (apply_windowing), gives each 3-s window a version;
    the main stream, in the same windows, reads it with AsSingleton. Each main element must
    see its own window's version: it waits until that side window is complete."""
    start = float((int(time.time()) // WINDOW + 2) * WINDOW)
    stop = start + 12
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
        "--streaming",
    ])

    class Tag(beam.DoFn):
        def process(self, t, version, w=beam.DoFn.WindowParam):
            record(out, "tagged", {"window": (float(w.start) - start) / WINDOW, "version": version})
            yield t

    with beam.Pipeline(options=options) as p:
        versions = (p
                    | "Versions" >> PeriodicImpulse(start_timestamp=start, stop_timestamp=stop,
                                                    fire_interval=WINDOW, apply_windowing=True)
                    | "Version" >> beam.Map(lambda t: (float(t) - start) / WINDOW))
        (p
         | PeriodicImpulse(start_timestamp=start, stop_timestamp=stop, fire_interval=INTERVAL)
         | beam.WindowInto(window.FixedWindows(WINDOW))
         | "Tag" >> beam.ParDo(Tag(), beam.pvalue.AsSingleton(versions)))
    tagged = fired(out, "tagged")
    assert len(tagged) == int(12 / INTERVAL), f"{len(tagged)} elements tagged"
    wrong = [t for t in tagged if t["window"] != t["version"]]
    assert not wrong, f"elements saw another window's version: {wrong[:5]}"
    print(f"streaming sides: {len(tagged)} elements, each with its window's version")
    print("streaming sides: ok")


def branches(endpoint, out):
    """Two branches: a 12-s PeriodicImpulse counted in 3-s windows, and beside it a 20-s
    pre-timestamped one whose events are an hour old (its watermark an hour behind). The slow
    branch must not hold back the fast one's windows: they fire while it still runs."""
    start = float(int(time.time()) + 2)
    now = time.time()
    old = [(Timestamp.of(now - 3600 + k), k) for k in range(40)]
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
        "--streaming",
    ])

    class Write(beam.DoFn):
        def __init__(self, kind):
            self.kind = kind

        def process(self, kv, w=beam.DoFn.WindowParam):
            record(out, self.kind, {"key": kv[0], "start": float(w.start), "count": kv[1]})

    with beam.Pipeline(options=options) as p:
        (p
         | "Fast" >> PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 12,
                                     fire_interval=INTERVAL)
         | "KeyFast" >> beam.Map(keyed(start))
         | "WindowFast" >> beam.WindowInto(window.FixedWindows(WINDOW))
         | "CountFast" >> beam.CombinePerKey(sum)
         | "WriteFast" >> beam.ParDo(Write("fast")))
        (p
         | "Slow" >> PeriodicImpulse(data=old, start_timestamp=start,
                                     stop_timestamp=start + 40 * 0.5, fire_interval=0.5)
         | "KeySlow" >> beam.Map(lambda k: ("old", 1))
         | "WindowSlow" >> beam.WindowInto(window.FixedWindows(WINDOW))
         | "CountSlow" >> beam.CombinePerKey(sum)
         | "WriteSlow" >> beam.ParDo(Write("slow")))
    fast, slow = fired(out, "fast"), fired(out, "slow")
    got = {(l["key"], l["start"]): l["count"] for l in fast}
    assert len(got) == len(fast), f"a window fired twice: {fast}"
    want = expected(start, int(12 / INTERVAL))
    assert got == want, f"got {sorted(got.items())}, want {sorted(want.items())}"
    assert sum(l["count"] for l in slow) == 40, slow
    first = min(l["at"] for l in fast)
    assert first < start + 8, f"the fast branch's first window fired {first - start:.1f} s in: held back"
    slow_end = max(l["at"] for l in slow) - start
    print(f"streaming branches: the fast branch's first window fired {first - start:.1f} s in, "
          f"the slow one's last at {slow_end:.1f} s")
    print("streaming branches: ok")


def refused(endpoint):
    """A side input that never ends in the global window (it would never be complete):
    refused at Prepare, naming the transform that reads it."""
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
        "--streaming",
    ])
    p = beam.Pipeline(options=options)
    ticks = p | "Ticks" >> PeriodicImpulse(fire_interval=1)
    (p
     | PeriodicImpulse(fire_interval=1)
     | "ReadsTicks" >> beam.Map(lambda t, latest: (t, latest), beam.pvalue.AsSingleton(ticks)))
    try:
        p.run()
    except Exception as e:
        assert "ReadsTicks" in str(e) and "not in fixed windows" in str(e), e
        print("streaming refused:", str(e).splitlines()[0][:300])
        print("streaming refused: ok")
        return
    raise AssertionError("a never-ending side input in the global window ran")


def triggers(endpoint, out):
    """Two triggers the event-time core fires for SDK and YAML pipelines alike, on one source
    (an element every 0.25 s, pre-timestamped):
    - Sessions (1-s gap) with AfterWatermark(early=AfterCount(2)), accumulating: elements at
      0, 0.25, 0.5, 0.75 s make session [0, 1.75 s), at 2, 2.25, 2.5, 2.75 s session
      [2, 3.75 s). Each element arrives in its own window, which merges with the session kept
      from earlier rounds; the merged session goes on counting toward its early panes. Each
      session: early panes of growing counts, then one on-time pane with all four.
    - One 60-s window with Repeatedly(AfterCount(3)).orFinally(AfterCount(7)), discarding:
      panes of at least three elements until the seventh, whose pane is the last; the rest
      are dropped."""
    start = (int(time.time()) // 2 + 1) * 2
    # The ten elements (2.95 s) in one 60-s window: not across a minute's end.
    if start % 60 > 56:
        start += 60 - start % 60
    start = float(start)
    at = [0.0, 0.25, 0.5, 0.75, 2.0, 2.25, 2.5, 2.75, 2.9, 2.95]
    data = [(Timestamp.of(start + t), i) for i, t in enumerate(at)]
    # A trigger that finishes drops what comes after: Beam asks to be told that is meant.
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
        "--streaming", "--allow_unsafe_triggers",
    ])

    def write(kind):
        def write(kv, w=beam.DoFn.WindowParam, p=beam.DoFn.PaneInfoParam):
            record(out, kind, {"start": float(w.start) - start, "end": float(w.end) - start,
                               "count": len(list(kv[1])), "timing": p.timing,
                               "index": p.index, "last": p.is_last})
        return write

    with beam.Pipeline(options=options) as p:
        elements = (p
                    | PeriodicImpulse(data=data[:8], start_timestamp=start,
                                      stop_timestamp=start + 8 * INTERVAL, fire_interval=INTERVAL)
                    | beam.Map(lambda i: ("k", i)))
        (elements
         | "Sessions" >> beam.WindowInto(
             window.Sessions(1),
             trigger=trigger.AfterWatermark(early=trigger.AfterCount(2)),
             accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
         | "GroupSessions" >> beam.GroupByKey()
         | "WriteSessions" >> beam.Map(write("sessions")))
        (p
         | "Ten" >> PeriodicImpulse(data=data, start_timestamp=start,
                                    stop_timestamp=start + 10 * INTERVAL, fire_interval=INTERVAL)
         | "KeyTen" >> beam.Map(lambda i: ("k", i))
         | "Minute" >> beam.WindowInto(
             window.FixedWindows(60),
             trigger=trigger.OrFinally(trigger.Repeatedly(trigger.AfterCount(3)),
                                       trigger.AfterCount(7)),
             accumulation_mode=trigger.AccumulationMode.DISCARDING)
         | "GroupUntil" >> beam.GroupByKey()
         | "WriteUntil" >> beam.Map(write("until")))
    EARLY, ON_TIME = 0, 1
    sessions = sorted(fired(out, "sessions"), key=lambda l: (l["start"], l["index"]))
    on_time = [(l["start"], l["end"], l["count"]) for l in sessions if l["timing"] == ON_TIME]
    assert on_time == [(0.0, 1.75, 4), (2.0, 3.75, 4)], sessions
    for w in (0.0, 2.0):
        mine = [l for l in sessions if l["start"] == w]
        counts = [l["count"] for l in mine]
        assert len(mine) >= 2 and mine[0]["timing"] == EARLY, sessions
        assert counts == sorted(counts) and counts[0] >= 2, sessions
        assert [l["index"] for l in mine] == list(range(len(mine))), sessions
    until = sorted(fired(out, "until"), key=lambda l: l["index"])
    assert sum(l["count"] for l in until) == 7, until
    assert [l["last"] for l in until] == [False] * (len(until) - 1) + [True], until
    assert all(l["count"] >= 3 for l in until[:-1]) and len(until) >= 2, until
    print(f"streaming triggers: {len(sessions)} session panes, {len(until)} panes until the 7th")
    print("streaming triggers: ok")


def resume(endpoint, out):
    """A checkpointed streaming job (`--temp_location`, a checkpoint every 0.2 s), weighed by a
    bounded side input, counted per key and 3-s window twice: by CombinePerKey, and by a stateful DoFn (a bag per key and
    window, summed by an event-time timer). The test kills the first run's job server once
    windows have fired, and runs this again against a new one: the job resumes from its last
    checkpoint (the same start, kept in OUT/start). Both runs' firings together: every window
    of both counts exact; a window fired again after the resume (what ran after the last
    checkpoint runs again: output is at least once) with the same count; windows fired
    before the checkpoint not fired again (a job started over would fire them all again); the
    checkpoint removed once the job is done."""
    marker = os.path.join(out, "start")
    second = os.path.exists(marker)
    if second:
        with open(marker) as f:
            start = float(f.read())
    else:
        start = float(int(time.time()) + 2)
        with open(marker, "w") as f:
            f.write(str(start))
    resumed_at = time.time()
    seconds = 16
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
        "--streaming", f"--temp_location={out}/temp", "--job_name=resumed",
        "--experiments=checkpointing_interval=200",
    ])
    with beam.Pipeline(options=options) as p:
        # A bounded side input, read in the first round: a resumed job has it from the
        # checkpoint (its file of bounded side inputs, written once).
        weights = p | "Weights" >> beam.Create([("even", 1), ("odd", 1)])
        windowed = (p
                    | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + seconds,
                                      fire_interval=INTERVAL)
                    | beam.Map(keyed(start))
                    | "Weigh" >> beam.Map(lambda kv, w: (kv[0], kv[1] * w[kv[0]]),
                                          w=beam.pvalue.AsDict(weights))
                    | beam.WindowInto(window.FixedWindows(WINDOW)))
        windowed | beam.CombinePerKey(sum) | beam.ParDo(Record(out))
        windowed | "Buffered" >> beam.ParDo(BufferPerWindow(out))
    assert second, "the first run ended: its job server was to be killed mid-job"
    want = expected(start, int(seconds / INTERVAL))
    for kind in ("fired", "timers"):
        lines = fired(out, kind)
        got, before, after = {}, set(), set()
        for line in lines:
            k = (line["key"], line["start"])
            assert got.get(k, line["count"]) == line["count"], f"{kind}: {k} fired unlike before: {lines}"
            got[k] = line["count"]
            (before if line["at"] < resumed_at else after).add(k)
        assert got == want, f"{kind}: got {sorted(got.items())}, want {sorted(want.items())}"
        assert before, f"{kind}: no window fired before the job server was killed"
        assert before - after, f"{kind}: every window fired before the kill fired again: started over"
        print(f"streaming resume: {kind}: {len(before)} windows before the kill, "
              f"{len(before & after)} of them again after the resume, {len(after - before)} new")
    checkpoint = os.path.join(out, "temp", "riverbank-checkpoints", "resumed", "checkpoint.pb")
    assert not os.path.exists(checkpoint), "the done job's checkpoint is left"
    print("streaming resume: ok")


class Versioned(beam.DoFn):
    """Writes each window's count with the version of the code that fired it."""
    def __init__(self, out, version):
        self.out = out
        self.version = version

    def process(self, kv, w=beam.DoFn.WindowParam):
        record(self.out, "fired", {"key": kv[0], "start": float(w.start), "count": kv[1],
                                   "version": self.version})


def update(endpoint, out):
    """Dataflow's `--update`: a streaming job (12 s of PeriodicImpulse counted per key and 3-s
    window, by CombinePerKey and by a stateful DoFn's bags and event-time timers) replaced, once
    windows have fired, by the same pipeline with changed code (its DoFn writes version 2) and
    two transforms renamed (`--transform_name_mapping`: the source and the stateful DoFn, whose
    residual and bags are kept by transform). The old job stops between two rounds and ends
    UPDATED; the new one goes on from its state. Together: every window of both counts exact
    and fired once (the state passes between rounds, so nothing runs twice), some by each
    version. Before that, a replacement with another transform is refused, naming it, and the
    job runs on."""
    start = float(int(time.time()) + 2)
    seconds = 12

    def pipeline(version, extra=None, update=False):
        flags = [
            "--runner=PortableRunner", f"--job_endpoint={endpoint}",
            "--environment_type=LOOPBACK", "--streaming", "--job_name=counts",
        ]
        if update:
            flags += ["--update"]
        if version == 2:
            flags += ['--transform_name_mapping={"PeriodicImpulse": "Ticks", "Buffered": "Bags"}']
        source, bags = ("PeriodicImpulse", "Buffered") if version == 1 else ("Ticks", "Bags")
        p = beam.Pipeline(options=PipelineOptions(flags))
        counted = (p
                   | source >> PeriodicImpulse(start_timestamp=start,
                                               stop_timestamp=start + seconds,
                                               fire_interval=INTERVAL)
                   | beam.Map(keyed(start))
                   | beam.WindowInto(window.FixedWindows(WINDOW)))
        if extra:
            counted = counted | extra >> beam.Map(lambda kv: kv)
        counted | beam.CombinePerKey(sum) | beam.ParDo(Versioned(out, version))
        counted | bags >> beam.ParDo(BufferPerWindow(out))
        return p

    first = pipeline(1).run()
    while len(fired(out)) < 2:
        assert time.time() < start + 60, "no window fired within a minute"
        time.sleep(0.1)
    try:
        pipeline(1, extra="Reweigh", update=True).run()
        raise AssertionError("an update with another transform ran")
    except AssertionError:
        raise
    except Exception as e:
        assert "Reweigh" in str(e) and "cannot take the place of job" in str(e), e
        print("streaming update: refused:", str(e).splitlines()[0][:200])
    second = pipeline(2, update=True).run()
    try:
        first.wait_until_finish()
    except RuntimeError as e:
        assert "UPDATED" in str(e), e
    assert first.state == PipelineState.UPDATED, first.state
    second.wait_until_finish()
    assert second.state == PipelineState.DONE, second.state
    want = expected(start, int(seconds / INTERVAL))
    for kind in ("fired", "timers"):
        lines = fired(out, kind)
        got = {}
        for line in lines:
            k = (line["key"], line["start"])
            assert k not in got, f"{kind}: window {k} fired twice: {lines}"
            got[k] = line["count"]
        assert got == want, f"{kind}: got {sorted(got.items())}, want {sorted(want.items())}"
    lines = fired(out)
    versions = [sum(1 for l in lines if l["version"] == v) for v in (1, 2)]
    assert all(versions), f"windows fired by version 1 and 2: {versions}"
    print(f"streaming update: {versions[0]} window sums by the old code, {versions[1]} by the new")
    print("streaming update: ok")


class Countdown(beam.transforms.core.RestrictionProvider):
    """Offsets [0, n) of element n, each sized at 1,000 bytes."""

    def initial_restriction(self, n):
        return OffsetRange(0, n)

    def create_tracker(self, restriction):
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, n, restriction):
        return 1000 * restriction.size()


class OnePerRound(beam.DoFn):
    """Reads one offset, then hands back the rest for 0.15 s later."""

    @beam.DoFn.unbounded_per_element()
    def process(self, n, tracker=beam.DoFn.RestrictionParam(Countdown())):
        at = tracker.current_restriction().start
        if tracker.try_claim(at):
            yield at
            tracker.defer_remainder(Duration(seconds=0.15))


def backlog(endpoint, out):
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
    ])
    p = beam.Pipeline(options=options)
    (p | beam.Create([100]) | beam.ParDo(OnePerRound())
     | beam.Map(lambda at: record(out, "read", {"offset": at})))
    result = p.run()
    result.wait_until_finish()
    assert result.state == PipelineState.DONE, result.state
    read = sorted(line["offset"] for line in fired(out, "read"))
    assert read == list(range(100)), read
    print("streaming backlog: ok")


def main(endpoint, out, mode):
    if mode == "backlog":
        return backlog(endpoint, out)
    if mode == "stateful":
        return stateful(endpoint, out)
    if mode == "refused":
        return refused(endpoint)
    if mode == "triggers":
        return triggers(endpoint, out)
    if mode == "late":
        return late(endpoint, out)
    if mode == "hold":
        return hold(endpoint, out)
    if mode == "early":
        return early(endpoint, out)
    if mode == "crash":
        return crash(endpoint, out)
    if mode == "sides":
        return sides(endpoint, out)
    if mode == "branches":
        return branches(endpoint, out)
    if mode == "resume":
        return resume(endpoint, out)
    if mode == "update":
        return update(endpoint, out)
    seconds = 12 if mode == "run" else 600
    # A whole second, a little ahead: the first element waits for the clock.
    start = float(int(time.time()) + 2)
    stop = start + seconds
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK",
        "--streaming",
    ])
    p = beam.Pipeline(options=options)
    # A bounded side input beside the unbounded source: read in the first round, kept for all.
    weights = p | "Weights" >> beam.Create([("even", 1), ("odd", 1)])
    (p
     | PeriodicImpulse(start_timestamp=start, stop_timestamp=stop, fire_interval=INTERVAL)
     | beam.Map(keyed(start))
     | "Weigh" >> beam.Map(lambda kv, w: (kv[0], kv[1] * w[kv[0]]), w=beam.pvalue.AsDict(weights))
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
