"""One Beam YAML PyTransform on Beam's Python SDK, for Riverbank's engine.

    python python_sdk.py schema JOB.json
    python python_sdk.py run JOB.json [Beam pipeline options]

JOB.json: {"name", "config" (the PyTransform's), "inputs": [[tag, parquet path, [timestamp
fields]], ...], "window" (the inputs' window fn, as Riverbank's plan gives it), "output": path}.
Timestamp fields come as Int64 microseconds (Beam reads no Arrow timestamp) and reach the
PTransform as Beam `Timestamp`s; a `Timestamp` field of the output goes back as a timestamp.

Each input is read with Beam's ReadFromParquet as schema'd rows, so the PTransform sees what
Beam YAML would give it: an input's `riverbank_timestamp` (microseconds) becomes each element's
timestamp and `riverbank_window_start`/`_end` its window (merging as sessions when the window fn
is sessions), and the fields are dropped. The PTransform is applied as Beam YAML applies one.
Its output's element type gives the output schema (Beam's own mapping to Arrow; a field Beam
types as Any, as it types what a Python callable returns, is Riverbank's Any: the value's JSON
text in a struct `{__rb_any}`; values that are not rows are rows of one field `element`, marked
to be written as themselves), with each element's timestamp and window in the same fields.

`schema` writes an empty Parquet file with that schema and `output`.json with the output's
window fn, without running anything; `run` runs the pipeline with the options given
(Riverbank's portable runner) and writes the output rows as Parquet files under `output`.
"""

import json
import sys

import apache_beam as beam
from apache_beam.coders import coders
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import schema_pb2
from apache_beam.transforms import window as windows
from apache_beam.typehints import schemas
from apache_beam.typehints.arrow_type_compatibility import arrow_schema_from_beam_schema
from apache_beam.utils.timestamp import Timestamp
from apache_beam.yaml.yaml_transform import YamlTransform

# Riverbank's Any (riverbank-elements' `any`): a value of no one type, as its JSON text.
ANY = pa.struct([pa.field("__rb_any", pa.string())])
TS, START, END = "riverbank_timestamp", "riverbank_window_start", "riverbank_window_end"
# Riverbank's (and Beam Java's) minimum timestamp, in microseconds.
MIN_TS = -9_223_372_036_854_775_000


class Refused(Exception):
    """What Riverbank says of this PyTransform, as the last line of stderr."""


class Bounds(windows.NonMergingWindowFn):
    """Each element's window as Riverbank gave it."""

    def assign(self, context):
        e = context.element
        return [windows.IntervalWindow(Timestamp(micros=e[START]), Timestamp(micros=e[END]))]

    def get_window_coder(self):
        return coders.IntervalWindowCoder()


class SessionBounds(windows.Sessions):
    """Each element's session window as Riverbank gave it; overlapping ones merge."""

    def assign(self, context):
        return Bounds().assign(context)


def apply(pipeline, job):
    inputs = {
        tag: read(pipeline, tag, path, instants, job["window"])
        for tag, path, instants in job["inputs"]
    }
    # The PyTransform inside a composite whose inputs are the ones given, as in the user's
    # pipeline: one PCollection under `input`, or a mapping of tags to PCollections.
    inner = {"type": "PyTransform", "name": job["name"], "config": job["config"]}
    if list(inputs) == ["input"]:
        inner["input"] = "input"
    else:
        # None: applied to the pipeline's start, which Beam wants said (`input: {}`).
        inner["input"] = {tag: tag for tag in inputs}
    spec = {
        "type": "composite",
        "input": {tag: tag for tag in inputs},
        "transforms": [inner],
        "output": job["name"],
    }
    # As text (JSON is YAML): Beam's loader marks each transform as its expansion expects.
    spec = json.dumps(spec)
    if not inputs:
        applied = pipeline | YamlTransform(spec)
    elif list(inputs) == ["input"]:
        applied = inputs["input"] | YamlTransform(spec)
    else:
        applied = inputs | YamlTransform(spec)
    if isinstance(applied, dict):
        raise Refused(
            f"it has several outputs ({', '.join(sorted(applied))}); a PyTransform in a "
            "Riverbank pipeline gives one")
    return applied


def describe(applied, job):
    """The output's Arrow schema as the script writes it, whether its values are not rows,
    and its window fn."""
    try:
        beam_schema = schemas.schema_from_element_type(applied.element_type)
        bare = False
    except Exception:
        # Values that are not rows (3, 'a') are rows of one field `element` to Riverbank, as
        # a Create of them gives.
        field = schema_pb2.Field(
            name="element", type=schemas.typing_to_runner_api(applied.element_type))
        beam_schema = schema_pb2.Schema(fields=[field])
        bare = True
    schema = arrow_schema(beam_schema)
    if bare:
        # riverbank-elements' `bare`: a JSON sink writes the values themselves, as Beam does.
        schema = pa.schema([schema.field(0).with_metadata({"riverbank.value": "bare"})])
    window = window_of(applied.windowing.windowfn, job["window"])
    timestamped = window["type"] != "global" or any(
        TS in pq.read_schema(path).names for _, path, _ in job["inputs"])
    if timestamped:
        schema = schema.append(pa.field(TS, pa.int64(), nullable=False))
    if window["type"] != "global":
        schema = schema.append(pa.field(START, pa.int64(), nullable=False))
        schema = schema.append(pa.field(END, pa.int64(), nullable=False))
    return schema, bare, window


def read(pipeline, tag, path, instants, window):
    """An input as Beam's schema'd rows (values that are not rows are rows of one field
    `element`, as Beam YAML's Create gives them), in their timestamps and windows, its
    `instants` as Beam `Timestamp`s."""
    rows = pipeline | f"Read {tag}" >> beam.io.ReadFromParquet(path, as_rows=True)
    names = pq.read_schema(path).names
    if TS not in names and START not in names and not instants:
        return rows
    user = schemas.schema_from_element_type(rows.element_type)
    instant = schemas.typing_to_runner_api(Timestamp)
    user = schema_pb2.Schema(fields=[
        schema_pb2.Field(name=f.name, type=instant) if f.name in instants else f
        for f in user.fields if f.name not in (TS, START, END)])
    row = schemas.named_tuple_from_schema(user)
    if TS in names:
        rows = rows | f"Timestamps {tag}" >> beam.Map(
            lambda r: windows.TimestampedValue(r, Timestamp(micros=getattr(r, TS))))
    if START in names:
        rows = rows | f"As dicts {tag}" >> beam.Map(lambda r: r._asdict())
        fn = SessionBounds(window["gap_us"] / 1e6) if window["type"] == "sessions" else Bounds()
        rows = rows | f"Windows {tag}" >> beam.WindowInto(fn)
        get = lambda r, f: r[f]
    else:
        get = getattr
    fields = [f.name for f in user.fields]

    def value(r, f):
        v = get(r, f)
        return Timestamp(micros=v) if f in instants and v is not None else v

    return rows | f"Rows {tag}" >> beam.Map(
        lambda r: row(**{f: value(r, f) for f in fields})).with_output_types(row)


def window_of(fn, inputs):
    """The output's window fn as Riverbank's plan writes one."""
    micros = lambda d: int(round(float(d) * 1e6))
    if isinstance(fn, windows.GlobalWindows):
        return {"type": "global"}
    if isinstance(fn, (Bounds, SessionBounds)):
        return inputs
    if isinstance(fn, windows.FixedWindows):
        return {"type": "fixed", "size_us": micros(fn.size), "offset_us": micros(fn.offset)}
    if isinstance(fn, windows.SlidingWindows):
        return {"type": "sliding", "size_us": micros(fn.size), "period_us": micros(fn.period),
                "offset_us": micros(fn.offset)}
    if isinstance(fn, windows.Sessions):
        return {"type": "sessions", "gap_us": micros(fn.gap_size)}
    raise Refused(
        f"its output is windowed by {type(fn).__name__}, which Riverbank does not know "
        "(global, fixed, sliding and sessions windows it does)")


def arrow_schema(beam_schema):
    """Each field as Beam maps it to Arrow, a `Timestamp` as a timestamp; one it cannot map
    (Any) as Riverbank's Any."""
    instant = schemas.typing_to_runner_api(Timestamp).logical_type.urn
    fields = []
    for f in beam_schema.fields:
        if f.type.logical_type.urn == instant:
            fields.append(pa.field(f.name, pa.timestamp("us", tz="UTC"), nullable=True))
            continue
        try:
            one = arrow_schema_from_beam_schema(schema_pb2.Schema(fields=[f]))
            fields.append(one.field(0))
        except NotImplementedError:
            fields.append(pa.field(f.name, ANY, nullable=True))
    return pa.schema(fields)


def plain(value):
    """A value as JSON and pyarrow take it: rows as dicts, numpy scalars as Python's, a Beam
    `Timestamp` as its microseconds."""
    if isinstance(value, Timestamp):
        return value.micros
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if hasattr(value, "as_dict"):
        return {k: plain(v) for k, v in value.as_dict().items()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (bytes, str)):
        return value.item()
    return value


class Record(beam.DoFn):
    """A row (a value, when `bare`) as the dict WriteToParquet takes: its Any fields as JSON
    text, its timestamp and window beside it when the schema has them."""

    def __init__(self, schema, bare):
        self._any = [f.name for f in schema if f.type == ANY]
        self._bare, self._names = bare, set(schema.names)

    def process(self, row, ts=beam.DoFn.TimestampParam, w=beam.DoFn.WindowParam):
        d = {"element": plain(row)} if self._bare else plain(row)
        for f in self._any:
            v = d.get(f)
            d[f] = None if v is None else {"__rb_any": json.dumps(v, default=str)}
        if TS in self._names:
            d[TS] = max(ts.micros, MIN_TS)
        if START in self._names:
            d[START], d[END] = w.start.micros, w.end.micros
        yield d


def main():
    mode, job_file, *options = sys.argv[1:]
    with open(job_file) as f:
        job = json.load(f)
    pipeline = beam.Pipeline(options=PipelineOptions(options))
    try:
        output = apply(pipeline, job)
        schema, bare, window = describe(output, job)
    except Refused as e:
        sys.exit(f"riverbank: {e}")
    if mode == "schema":
        pq.write_table(schema.empty_table(), job["output"])
        with open(job["output"] + ".json", "w") as f:
            json.dump(window, f)
        return
    _ = (
        output
        | "Records" >> beam.ParDo(Record(schema, bare))
        | beam.io.WriteToParquet(
            job["output"] + "/part", schema=schema, file_name_suffix=".parquet"))
    pipeline.run().wait_until_finish()


if __name__ == "__main__":
    main()
