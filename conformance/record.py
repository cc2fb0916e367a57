"""Records the conformance cases: every pipeline of Beam YAML's own documentation that Beam
tests (the docs and `readme_test.py` shipped in the apache-beam wheel), run by Beam itself to
record its outputs, the oracle `cli/tests/conformance.rs` compares Riverbank's with.

Each case becomes conformance/cases/<doc>_<line>/: `pipeline.yaml` (paths under `$CASE`), its
input files (Beam's test inputs: the same CSV/TSV/JSON and UDF file readme_test.py writes),
`expected/<sink>.jsonl` (Beam's rows per sink; a sink is added on each leaf transform) and
`case.json` (doc, line, UDF languages, transforms, and what Beam did).

usage: ~/.cache/riverbank/beam-venv/bin/python conformance/record.py   (the venv dev/setup.sh makes;
apache-beam[yaml] and mock). Beam's test suite's cases (suite_*) are record_suite.py's.
"""
import contextlib
import glob
import io
import json
import os
import pathlib
import re
import shutil
import sys
from unittest import mock

import apache_beam as beam
import yaml
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.yaml import readme_test, yaml_provider, yaml_transform

HERE = pathlib.Path(__file__).resolve().parent
CASES = HERE / "cases"
DOCS = ["yaml.md", "yaml-udf.md", "yaml-errors.md", "yaml-combine.md", "yaml-join.md",
        "yaml-inline-python.md", "yaml-testing.md"]
WRITES = ("WriteToJson", "WriteToCsv", "WriteToText")
# Inputs as readme_test.TestEnvironment writes them.
INPUTS = {
    "input.csv": "col1,col2,col3\na,1,2.5\n",
    "input.tsv": "col1\tcol2\tcol3\nabc\t1\t2.5\n",
    "input.json": '{"col1": "abc", "col2": 1, "col3": 2.5"}\n',
}
UDFS = {"my_mapping": 'def my_mapping(row):\n\treturn "good"', "other": "def my_filter(row):\n\treturn True"}


def pipelines(doc):
    """(test type, name, yaml) of each code block Beam's readme_test makes a test of."""
    with mock.patch.object(readme_test, "create_test_method", lambda t, n, y: (t, n, y)):
        for name, made in readme_test.parse_test_methods(open(doc)):
            if isinstance(made, tuple):
                yield made


def replace(spec, type_, key, value):
    if isinstance(spec, dict):
        spec = {k: replace(v, type_, key, value) for k, v in spec.items()}
        if spec.get("type") == type_:
            spec.setdefault("config", {})[key] = value
    elif isinstance(spec, list):
        spec = [replace(v, type_, key, value) for v in spec]
    return spec


def walk(spec):
    if isinstance(spec, dict):
        yield spec
        for v in spec.values():
            yield from walk(v)
    elif isinstance(spec, list):
        for v in spec:
            yield from walk(v)


def transforms(spec):
    """The transforms of a pipeline, composites' members included."""
    p = spec.get("pipeline", spec) if isinstance(spec, dict) else spec
    items = p.get("transforms", []) if isinstance(p, dict) else p
    for t in items if isinstance(items, list) else []:
        if isinstance(t, dict):
            yield t
            if isinstance(t.get("transforms"), list):
                yield from transforms(t)


MAPPINGS = ("MapToFields", "Filter", "Partition", "AssignTimestamps", "Combine", "Explode")


def languages(spec, walk=transforms):
    """The UDF languages of a spec's mapping transforms (`walk` yields its transforms)."""
    return sorted({t["config"].get("language", "generic") for t in walk(spec)
                   if isinstance(t.get("config"), dict) and t.get("type") in MAPPINGS} or {"none"})


def add_sinks(spec):
    """A WriteToJson on each leaf transform of the top-level pipeline, and a directory per sink."""
    p = spec["pipeline"]
    transforms = p["transforms"] if isinstance(p, dict) else p
    if not isinstance(transforms, list):
        return
    for t in transforms:
        if t.get("type") in WRITES:
            t.setdefault("name", t["type"])
    if isinstance(p, dict) and p.get("type") == "chain":
        if transforms[-1].get("type") not in WRITES:
            transforms.append({"type": "WriteToJson", "name": "Out",
                               "config": {"path": "$CASE/out/Out/out.json"}})
    else:
        used = set()
        for t in transforms:
            inp = t.get("input")
            for i in (inp.values() if isinstance(inp, dict) else inp if isinstance(inp, list) else [inp]):
                if isinstance(i, str):
                    used.add(i.split(".")[0])
        for t in list(transforms):
            name = t.get("name", t.get("type"))
            if name in used or t.get("type") in WRITES or "output" in t:
                continue
            cfg = t.get("config", {})
            # A Partition's outputs are its tagged outputs (Beam refuses the bare name).
            tags = [None]
            if t.get("type") == "Partition":
                tags = list(cfg.get("outputs", [])) + [cfg[k] for k in ("unknown_output",) if k in cfg]
            eh = cfg.get("error_handling", {}).get("output") if isinstance(cfg.get("error_handling"), dict) else None
            if eh:
                tags += [eh] if tags != [None] else [eh]
            for tag in tags:
                src = name if tag is None else f"{name}.{tag}"
                sink = f"Out{name}" + ("" if tag is None else f"_{tag}")
                transforms.append({"type": "WriteToJson", "name": sink, "input": src,
                                   "config": {"path": f"$CASE/out/{sink}/out.json"}})
    for t in transforms:
        if t.get("type") in WRITES:
            t["config"]["path"] = f"$CASE/out/{t['name']}/out.{t['type'][7:].lower()}"


def rows(sink_dir):
    out = []
    for f in sorted(glob.glob(os.path.join(sink_dir, "*"))):
        for line in open(f):
            line = line.rstrip("\n")
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    out.append(line)
    return sorted(out, key=lambda r: json.dumps(r, sort_keys=True))


class NeedsJava(Exception):
    """A transform Beam runs through its Java expansion service (SQL, Join, Java UDFs)."""


def _external(*args, **kwargs):
    raise NeedsJava()


def run_beam(text, case):
    """Runs the pipeline with Beam (as readme_test does), its output under case/out."""
    spec = yaml.safe_load(text.replace("$CASE", str(case)))
    log = io.StringIO()
    with contextlib.redirect_stderr(log), contextlib.redirect_stdout(log), \
            mock.patch("apache_beam.yaml.yaml_provider.ExternalProvider.create_transform", _external):
        test_provider = readme_test.TestProvider(readme_test.TEST_TRANSFORMS)
        p = beam.Pipeline("FnApiRunner", options=PipelineOptions(pickle_library="cloudpickle"))
        yaml_transform.expand_pipeline(p, yaml.dump(spec), yaml_provider.merge_providers([test_provider]))
        p.run().wait_until_finish()


def record(doc_name, test_type, name, text):
    case_id = f"{doc_name[:-3].replace('-', '_')}_{name.removeprefix('test_line_')}"
    case = CASES / case_id
    shutil.rmtree(case, ignore_errors=True)
    case.mkdir(parents=True)
    meta = {"doc": doc_name, "line": int(name.removeprefix("test_line_")), "beam_test": test_type}
    text = text.replace("apache_beam.pkg.module.", "apache_beam.yaml.readme_test._Fakes.")
    text = text.replace("pkg.module.", "apache_beam.yaml.readme_test._Fakes.")
    text = text.replace("/path/to/*.tsv", "$CASE/input.tsv")
    if "my_mapping" in text or "my_filter" in text:
        udf = UDFS["my_mapping"] if "my_mapping" in text else UDFS["other"]
        (case / "udf.py").write_text(udf)
        text = text.replace("/path/to/some/udf.py", "$CASE/udf.py")
    spec = yaml.safe_load(text)
    meta["languages"] = languages(spec)
    meta["transforms"] = sorted({t["type"] for t in transforms(spec) if isinstance(t.get("type"), str)
                                 and t["type"] not in ("chain", "composite")})
    for src, f in [("ReadFromCsv", "input.csv"), ("ReadFromText", "input.csv"), ("ReadFromJson", "input.json")]:
        spec = replace(spec, src, "path", f"$CASE/{f}")
    for f, content in INPUTS.items():
        (case / f).write_text(content)
    fakes = sorted(t for t in readme_test.TEST_TRANSFORMS if t in text)
    if test_type != "RUN":
        meta["beam"] = f"not run by Beam's test ({test_type})"
    elif fakes:
        meta["beam"] = "uses test fakes in Beam's test: " + ", ".join(fakes)
    else:
        try:
            add_sinks(spec)
        except (KeyError, TypeError, AttributeError) as e:
            meta["beam"] = f"cannot add sinks: {e!r}"
    pipeline = yaml.dump(spec, sort_keys=False)
    (case / "pipeline.yaml").write_text(pipeline)
    if "beam" not in meta:
        try:
            run_beam(pipeline, case)
            meta["beam"] = "ok"
            expected = case / "expected"
            expected.mkdir()
            for sink in sorted(glob.glob(str(case / "out" / "*"))):
                sink_rows = rows(sink)
                with open(expected / (os.path.basename(sink) + ".jsonl"), "w") as f:
                    for r in sink_rows:
                        f.write(json.dumps(r, sort_keys=True) + "\n")
        except Exception as e:  # Beam's own failure: recorded, the case is then not compared.
            cause = e
            while cause is not None and not isinstance(cause, NeedsJava):
                cause = cause.__cause__ or cause.__context__
            msg = re.sub(r"\s+", " ", str(e))
            if cause is not None:
                meta["beam"] = "needs Beam's Java expansion service (no JVM here)"
            else:
                meta["beam"] = "fails in Beam: " + msg[:300]
    shutil.rmtree(case / "out", ignore_errors=True)
    (case / "case.json").write_text(json.dumps(meta, indent=1) + "\n")
    return case_id, meta


def main():
    for old in glob.glob(str(CASES / "*")):
        if not os.path.basename(old).startswith("suite_"):
            shutil.rmtree(old)
    docs = pathlib.Path(readme_test.YAML_DOCS_DIR)
    n = 0
    for doc in DOCS:
        for test_type, name, text in pipelines(docs / doc):
            case_id, meta = record(doc, test_type, name, text)
            n += 1
            print(f"{case_id:32} {meta['beam'][:90]}", file=sys.stderr)
    print(f"recorded {n} cases from apache-beam {beam.__version__} into {CASES}", file=sys.stderr)


if __name__ == "__main__":
    main()
