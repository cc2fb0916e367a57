"""One Beam YAML PyTransform on Beam's Python SDK, for Riverbank's engine.

    python python_sdk.py schema JOB.json
    python python_sdk.py run JOB.json [Beam pipeline options]

JOB.json: {"name", "config" (the PyTransform's), "inputs": [[tag, parquet path], ...],
"output": path}. Each input is read with Beam's ReadFromParquet as schema'd rows (so the
PTransform sees what Beam YAML would give it) and the PTransform is applied as Beam YAML applies
one (an output of values that are not rows as rows of one field `element`, as Beam YAML's
Create and Riverbank give such values). `schema` writes an empty Parquet file with the output's schema (Beam's own mapping of the
output element type to Arrow; a field Beam types as Any, as it types what a Python callable
returns, is Riverbank's Any: the value's JSON text in a struct `{__rb_any}`) without running
anything; `run` runs the pipeline with the options
given (Riverbank's portable runner) and writes the output rows as Parquet files under `output`.
"""

import json
import sys

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import schema_pb2
from apache_beam.typehints import schemas
from apache_beam.typehints.arrow_type_compatibility import arrow_schema_from_beam_schema
from apache_beam.yaml.yaml_transform import YamlTransform


# Riverbank's Any (riverbank-elements' `any`): a value of no one type, as its JSON text.
ANY = pa.struct([pa.field("__rb_any", pa.string())])


class Refused(Exception):
    """What Riverbank says of this PyTransform, as the last line of stderr."""


def apply(pipeline, job):
    inputs = {tag: read(pipeline, tag, path) for tag, path in job["inputs"]}
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
    return applied, schema, bare


def read(pipeline, tag, path):
    """An input as Beam's schema'd rows (values that are not rows are rows of one field
    `element`, as Beam YAML's Create gives them)."""
    return pipeline | f"Read {tag}" >> beam.io.ReadFromParquet(path, as_rows=True)


def arrow_schema(beam_schema):
    """Each field as Beam maps it to Arrow; one it cannot map (Any) as Riverbank's Any."""
    fields = []
    for f in beam_schema.fields:
        try:
            one = arrow_schema_from_beam_schema(schema_pb2.Schema(fields=[f]))
            fields.append(one.field(0))
        except NotImplementedError:
            fields.append(pa.field(f.name, ANY, nullable=True))
    return pa.schema(fields)


def plain(value):
    """A value as JSON and pyarrow take it: rows as dicts, numpy scalars as Python's."""
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


def record(row, any_fields, bare):
    """A row (a value, when `bare`) as the dict WriteToParquet takes, its Any fields as JSON
    text."""
    d = {"element": plain(row)} if bare else plain(row)
    for f in any_fields:
        v = d.get(f)
        d[f] = None if v is None else {"__rb_any": json.dumps(v, default=str)}
    return d


def main():
    mode, job_file, *options = sys.argv[1:]
    with open(job_file) as f:
        job = json.load(f)
    pipeline = beam.Pipeline(options=PipelineOptions(options))
    try:
        output, schema, bare = apply(pipeline, job)
    except Refused as e:
        sys.exit(f"riverbank: {e}")
    if mode == "schema":
        pq.write_table(schema.empty_table(), job["output"])
        return
    any_fields = [f.name for f in schema if f.type == ANY]
    _ = (
        output
        | "Records" >> beam.Map(record, any_fields, bare)
        | beam.io.WriteToParquet(
            job["output"] + "/part", schema=schema, file_name_suffix=".parquet"))
    pipeline.run().wait_until_finish()


if __name__ == "__main__":
    main()
