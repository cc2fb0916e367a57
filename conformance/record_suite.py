"""Records the cases of Beam YAML's own test suite (`apache_beam/yaml/*_test.py` in the apache-beam
wheel) as conformance cases, with Beam as the oracle.

Beam's tests are unittest bodies: they build a pipeline in Python, apply a `YamlTransform(spec)` to
`beam.Create(...)` inputs and check its output with `assert_that`. This script runs each test with
Beam, as Beam's CI does, and records every `YamlTransform` it applies: the spec's own text, the
elements of each input (Beam's, as they reached the transform) and the elements of each output.
Each becomes conformance/cases/suite_<module>_<test>[_<n>]/ in the layout `record.py` writes:
`pipeline.yaml` (a `Create` per input, the spec under its own text, a `WriteToJson` per output),
`expected/<sink>.jsonl` and `case.json`. A transform Beam refuses (a test's `assertRaises`) is
recorded with `"beam": "refuses: ..."`: Riverbank must refuse it too.

usage: ~/.cache/riverbank/beam-venv/bin/python conformance/record_suite.py   (then run the
conformance test with RIVERBANK_CONFORMANCE_WRITE=1 to rewrite docs/conformance.md)
"""
import contextlib
import glob
import importlib
import inspect
import io
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

import apache_beam as beam
import yaml
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.yaml import yaml_transform
from record import CASES, _external, languages

# The modules whose tests apply YamlTransforms to data (yaml_io_test's on Beam's mocks of Pub/Sub,
# BigQuery and DICOM are recorded as such: no service to compare against). Not taken: yaml_ml_test
# and yaml_enrichment_test (models and external services), yaml_specifiable_test (Python objects
# as config), the unit tests of Beam's own Python helpers (json_utils, yaml_utils, yaml_provider,
# yaml_transform_unit/scope: they call Beam's functions, not a pipeline).
SUITES = ["yaml_mapping_test", "yaml_udf_test", "yaml_combine_test", "yaml_transform_test",
          "programming_guide_test", "yaml_join_test", "yaml_io_test"]


class Unexpressible(Exception):
    """A value a Beam YAML `Create` (or a JSON file) cannot hold."""


def to_json(v):
    """A Beam element as JSON, rows as objects."""
    if hasattr(v, "_asdict"):
        v = v._asdict()
    elif isinstance(v, beam.Row):
        v = v.as_dict()
    if isinstance(v, dict):
        return {str(k): to_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_json(x) for x in v]
    if hasattr(v, "item") and type(v).__module__ == "numpy":
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        raise Unexpressible(f"float {v}")
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    raise Unexpressible(type(v).__name__)


class Recorder(beam.DoFn):
    """Writes each element, with its timestamp and window, as a JSON line to `path`."""

    def __init__(self, path):
        self.path = path

    def process(self, element, ts=beam.DoFn.TimestampParam, w=beam.DoFn.WindowParam):
        try:
            line = {"v": to_json(element)}
        except Unexpressible as e:
            line = {"unexpressible": str(e), "repr": repr(element)[:200]}
        if ts > MIN_TIMESTAMP:
            line["ts"] = float(ts)
        if not isinstance(w, GlobalWindow):
            line["window"] = repr(w)
        with open(self.path, "a") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")


class Test:
    """What one test's YamlTransforms did."""

    def __init__(self, module, name, line, workdir):
        self.module, self.name, self.line, self.workdir = module, name, line, workdir
        self.transforms = []  # dicts: text, spec, providers, inputs, outputs, raised, files
        self.run_failed = None  # a pipeline of the test's raised when run (its assertRaises)
        self.ran = False  # some tests only build a pipeline, to check its types


CURRENT = None


def _recording_init(original):
    def init(self, spec, providers={}):  # noqa: B006 (Beam's own signature)
        rec = {"text": spec if isinstance(spec, str) else None,
               "spec": yaml.safe_load(spec) if isinstance(spec, str) else without_lines(spec),
               "providers": sorted(providers) if isinstance(providers, dict) else ["<list>"],
               "inputs": {}, "outputs": {}, "raised": None, "files": {}, "writes": {},
               "written": {}}
        if rec["text"]:
            rec["text"], rec["files"], rec["writes"] = take_files(rec["text"], CURRENT)
        self._rb_rec = rec
        if CURRENT is not None:
            CURRENT.transforms.append(rec)
        try:
            original(self, spec, providers)
        except Exception as e:
            rec["raised"] = f"{type(e).__name__}: {e}"
            raise
    return init


def without_lines(spec):
    """A spec as the test wrote it: without the `__line__`/`__uuid__` keys SafeLineLoader adds."""
    if isinstance(spec, dict):
        return {str(k): without_lines(v) for k, v in spec.items()
                if k not in ("__line__", "__uuid__")}
    if isinstance(spec, list):
        return [without_lines(v) for v in spec]
    return str(spec) if isinstance(spec, str) else spec  # SafeLineLoader's strings: a subclass


TEMP_PATH = re.compile(re.escape(tempfile.gettempdir()) + r"/[^\s'\"]+")


def copy_aside(pattern, files, workdir):
    """Copies the files a temp path names (a glob's matches too) into `workdir`, now, while the
    test's temp dir exists: files[name] = copy. Whether there were any."""
    found = False
    for path in glob.glob(pattern):
        if os.path.isfile(path):
            copy_to = os.path.join(workdir, "file-" + os.path.basename(path))
            shutil.copy(path, copy_to)
            files[os.path.basename(path)] = copy_to
            found = True
    return found


def take_files(text, test):
    """The spec's text with each temp path (a test's UDF file, input or output) as $CASE/<name>,
    the files that exist now (inputs) copied aside: {name: copy}, and the others (what the
    pipeline will write): {name: path}."""
    files, writes = {}, {}

    def case_path(m):
        path = m.group(0)
        name = os.path.basename(path)
        if test is not None and not copy_aside(path, files, test.workdir):
            writes[name] = path
        return "$CASE/" + name
    return TEMP_PATH.sub(case_path, text), files, writes


def case_paths(v, files, workdir):
    """A Create's value with each temp path in it as $CASE/<name>, the files it names copied
    aside (`copy_aside`)."""
    if isinstance(v, dict):
        return {k: case_paths(x, files, workdir) for k, x in v.items()}
    if isinstance(v, list):
        return [case_paths(x, files, workdir) for x in v]
    if not isinstance(v, str):
        return v

    def case_path(m):
        copy_aside(m.group(0), files, workdir)
        return "$CASE/" + os.path.basename(m.group(0))
    return TEMP_PATH.sub(case_path, v)


def _recording_expand(original):
    def expand(self, pcolls):
        rec = getattr(self, "_rb_rec", None)
        if rec is None or CURRENT is None:
            return original(self, pcolls)
        n = len(CURRENT.transforms)
        if isinstance(pcolls, beam.PCollection):
            inputs = {"input": pcolls}
        elif isinstance(pcolls, dict):
            inputs = dict(pcolls)
        else:
            inputs = {}
        attach(rec, "inputs", inputs, n)  # before expanding: a refused transform's inputs too
        try:
            result = original(self, pcolls)
        except Exception as e:
            rec["raised"] = f"{type(e).__name__}: {e}"
            raise
        attach(rec, "outputs", result if isinstance(result, dict) else {"": result}, n)
        return result
    return expand


def creator(pc):
    """The beam.Create whose output `pc` is (its producer is the Create's innermost part)."""
    applied = pc.producer
    while applied is not None:
        if isinstance(applied.transform, beam.Create) and pc in applied.outputs.values():
            return applied.transform
        applied = applied.parent
    return None


def attach(rec, kind, pcolls, n):
    """A Recorder on each PCollection of `pcolls`, its file under rec[kind][tag]."""
    for tag, pc in pcolls.items():
        if isinstance(pc, beam.PCollection):
            path = os.path.join(CURRENT.workdir, f"{n}-{kind}-{tag or 'main'}.jsonl")
            with open(path, "w") as f:
                # A beam.Create's values as the test gave them: what a run records can be
                # short when the run fails (the assertRaises cases).
                created = creator(pc)
                if kind == "inputs" and created is not None:
                    for v in created.values:
                        try:
                            v = case_paths(to_json(v), rec["files"], CURRENT.workdir)
                            f.write(json.dumps({"v": v}, sort_keys=True) + "\n")
                        except Unexpressible as e:
                            f.write(json.dumps({"unexpressible": str(e)}) + "\n")
                    rec[kind][tag] = path
                    continue
            rec[kind][tag] = path
            _ = pc | f"RbRecord{kind}{tag}{n}" >> beam.ParDo(Recorder(path))


def _recording_run(original):
    def run(self, *args, **kwargs):
        if CURRENT is not None:
            CURRENT.ran = True
        try:
            result = original(self, *args, **kwargs)
        except Exception as e:
            if CURRENT is not None:
                CURRENT.run_failed = f"{type(e).__name__}: {e}"
            raise
        if CURRENT is not None:  # the files the pipeline wrote, before the test removes them
            for rec in CURRENT.transforms:
                for name, path in rec["writes"].items():
                    rows = []
                    for shard in sorted(glob.glob(path + "*")):
                        if shard.endswith(".json") or ".json-" in shard:
                            rows += [{"v": json.loads(line)} for line in open(shard) if line.strip()]
                    if rows:
                        rec["written"][name] = rows
        return result
    return run


def read(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def walk_transforms(spec):
    """Every transform in a spec, composites' and chains' members included."""
    if isinstance(spec, dict):
        if isinstance(spec.get("type"), str):
            yield spec
        for k in ("transforms", "pipeline"):
            yield from walk_transforms(spec.get(k))
        if isinstance(spec.get("source"), dict):
            yield from walk_transforms(spec["source"])
        if isinstance(spec.get("sink"), dict):
            yield from walk_transforms(spec["sink"])
    elif isinstance(spec, list):
        for t in spec:
            yield from walk_transforms(t)


def type_names(spec):
    return sorted({t["type"] for t in walk_transforms(spec) if t["type"] not in ("chain", "composite")})


def indent(text, n):
    return textwrap.indent(text, " " * n)


def build(rec):
    """pipeline.yaml's text and the expected rows per sink; or why the case cannot be built."""
    spec = rec["spec"]
    if not isinstance(spec, dict):
        return None, "spec is not a mapping"
    fakes = sorted(set(type_names(spec)) & set(rec["providers"]))
    if fakes:
        return None, "uses test fakes in Beam's test: " + ", ".join(fakes)
    if "{%" in (rec["text"] or "") or "{{" in (rec["text"] or ""):
        return None, "a Jinja template (Beam's test expands it in Python first)"
    lines = ["pipeline:", "  transforms:"]
    for tag, path in rec["inputs"].items():
        elements = read(path)
        bad = [e for e in elements if "unexpressible" in e]
        if bad:
            return None, f"input '{tag}' holds values a YAML Create cannot ({bad[0]['unexpressible']})"
        if any("window" in e for e in elements):
            return None, f"input '{tag}' is windowed by Beam code outside the YAML (no YAML form)"
        values = [e["v"] for e in elements]
        lines += ["  - type: Create", f"    name: {tag}", "    config:",
                  f"      elements: {json.dumps(values)}"]
        if any("ts" in e for e in elements):
            return None, f"input '{tag}' carries timestamps set by Beam code outside the YAML (no YAML form)"
    name = spec.get("name") or "UnderTest"
    head = []
    if "name" not in spec:
        head.append(f"name: {name}")
    # The inputs as YamlTransform gives them (a chain whose first transform names its own input
    # keeps it); a composite takes them by name.
    members = spec.get("transforms") if isinstance(spec.get("transforms"), list) else []
    chain_has_input = spec.get("type") == "chain" and members and "input" in members[0]
    if rec["inputs"] and not spec.get("input") and not chain_has_input:
        if set(rec["inputs"]) == {"input"} and spec.get("type") != "composite":
            head.append("input: input")
        else:
            head.append("input: {" + ", ".join(f"{t}: {t}" for t in rec["inputs"]) + "}")
    body = textwrap.dedent(rec["text"]).strip("\n") if rec["text"] else \
        yaml.safe_dump(spec, sort_keys=False).strip("\n")
    item = head + body.split("\n")
    lines.append("  - " + item[0])
    lines += [indent(r, 4) if r.strip() else "" for r in item[1:]]
    expected = {}
    for tag, path in sorted(rec["outputs"].items()):  # (Partition's come in a set's order)
        elements = read(path)
        bad = [e for e in elements if "unexpressible" in e]
        if bad:
            return None, f"Beam's output '{tag or 'main'}' holds {bad[0]['unexpressible']} values (no JSON form)"
        names = [os.path.basename(f) for f in rec["files"]] + \
            [m.split("/")[-1] for m in re.findall(r"\$CASE/[^\s'\"]+", rec["text"] or "")]
        if any(isinstance(e["v"], str) and any(e["v"].startswith(n) for n in names) for e in elements):
            # The names of the files a sink wrote (Beam's and Riverbank's differ): the files'
            # rows are compared instead, as the test reads them back.
            if not rec["written"]:
                return None, (f"Beam's output '{tag or 'main'}' is the names of the files its sink "
                              "wrote, and they are not JSON: nothing to compare")
            continue
        # A file's path as the case names it (the test's temp dir is gone).
        for e in elements:
            e["v"] = json.loads(TEMP_PATH.sub(lambda m: "$CASE/" + os.path.basename(m.group(0)),
                                              json.dumps(e["v"])))
        sink = "Out" + (f"_{tag}" if tag else "")
        src = name + (f".{tag}" if tag else "")
        lines += ["  - type: WriteToJson", f"    name: {sink}", f"    input: {src}", "    config:",
                  f"      path: $CASE/out/{sink}/out.json"]
        expected[sink] = sorted((e["v"] for e in elements), key=lambda r: json.dumps(r, sort_keys=True))
    for name, elements in rec["written"].items():  # compared with the files Riverbank writes there
        expected["file-" + name] = sorted((e["v"] for e in elements),
                                          key=lambda r: json.dumps(r, sort_keys=True))
    text = "\n".join(lines) + "\n"
    try:  # Beam's own check of a pipeline file (YamlTransform checks less)
        yaml_transform.validate_against_schema(yaml.safe_load(text), "generic")
    except Exception as e:
        why = re.sub(r"\s+", " ", str(e).split("\n")[0])[:160]
        return None, f"valid for YamlTransform, but Beam's schema refuses it as a pipeline file ({why})"
    return text, expected


def run_test(module, cls, name):
    """Runs one test method of Beam's with the recorder in; its Test and unittest's verdict."""
    global CURRENT
    source = inspect.getsource(module).splitlines()
    line = next(i + 1 for i, text in enumerate(source)
                if re.match(rf"\s*(def {name}\(|{name} = )", text))
    workdir = tempfile.mkdtemp(prefix="rb-suite-")
    CURRENT = Test(module.__name__.rsplit(".", 1)[-1], name, line, workdir)
    result = unittest.TestResult()
    log = io.StringIO()
    # yaml_join_test skips itself outside Beam's postcommit suites (its Join expands through Beam
    # SQL, in Java): it runs anyway, to record what it needs.
    # So do yaml_udf_test's SQL cases: both are recorded as needing Java, not as skipped.
    method = getattr(cls, name)
    java_only = cls.__name__ == "YamlJoinTest" or "sql" in name
    with contextlib.ExitStack() as undo:
        if java_only:
            undo.enter_context(mock.patch.object(cls, "__unittest_skip__", False, create=True))
            if hasattr(method, "__wrapped__"):  # unittest.skipIf wraps a method in a raiser
                inner = method.__wrapped__  # (Beam's SQL cases are staticmethods)
                undo.enter_context(mock.patch.object(
                    cls, name, staticmethod(inner) if isinstance(
                        inspect.getattr_static(cls, name), staticmethod) else inner))
        undo.enter_context(contextlib.redirect_stderr(log))
        undo.enter_context(contextlib.redirect_stdout(log))
        undo.enter_context(mock.patch(
            "apache_beam.yaml.yaml_provider.ExternalProvider.create_transform", _external))
        cls(name).run(result)
    test, CURRENT = CURRENT, None
    if "create_test_method" in getattr(getattr(cls, name), "__qualname__", ""):
        verdict = "a readme_test-style case: Beam runs it on readme_test's fakes"
    elif result.skipped:
        verdict = "skipped by Beam's test: " + result.skipped[0][1]
    elif any("NeedsJava" in tb for _, tb in result.errors):  # record.NeedsJava, raised by _external
        verdict = "needs Beam's Java expansion service (no JVM here)"
    elif mocks(method):
        verdict = ("runs on Beam's mock of " + ", ".join(mocks(method)) +
                   " (an external service, or the transform itself, replaced by Beam's test)")
    elif result.errors or result.failures:
        tb = (result.errors or result.failures)[0][1].strip().splitlines()[-1]
        verdict = "fails in Beam: " + tb[:300]
    else:
        verdict = "ok"
    return test, verdict


# Transforms of Google Cloud services, which Beam's tests run on mocks (no service here).
CLOUD = {"ReadFromPubSub", "WriteToPubSub", "ReadFromBigQuery", "WriteToBigQuery", "DicomSearch",
         "ReadFromSpanner", "WriteToSpanner", "ReadFromBigTable", "WriteToBigTable"}


def mocks(method):
    """What a test method patches in with mock (Beam's fakes of external services)."""
    source = inspect.getsource(getattr(method, "__wrapped__", method))
    return sorted(set(re.findall(r"mock\.patch\(\s*['\"]([\w.]+)['\"]", source)))


def record(test, verdict, n, rec):
    case_id = f"suite_{test.module.removesuffix('_test')}_{test.name.removeprefix('test_')}"
    if n is not None:
        case_id += f"_{n}"
    case = CASES / case_id
    shutil.rmtree(case, ignore_errors=True)
    case.mkdir(parents=True)
    if rec is None:  # no YamlTransform: skipped, failed in Beam, or a test of Beam's helpers
        rec = {"spec": {}, "text": None, "providers": [], "inputs": {}, "outputs": {}, "raised": None,
               "files": {}, "writes": {}, "written": {}}
        if verdict == "ok":
            verdict = "applies no YamlTransform (it tests Beam's Python helpers)"
    spec = rec["spec"] if isinstance(rec["spec"], dict) else {}
    meta = {"doc": f"{test.module}.py", "line": test.line, "test": test.name,
            "languages": languages(spec, walk_transforms), "transforms": type_names(spec)}
    cloud = sorted(set(meta["transforms"]) & CLOUD)
    if cloud:
        meta["beam"] = (f"uses Google Cloud ({', '.join(cloud)}): Beam's test runs it on a mock of "
                        "the service")
    elif verdict != "ok":
        meta["beam"] = verdict
    else:
        if rec["raised"] or test.run_failed:
            why = rec["raised"] or "fails when run: " + test.run_failed
            meta["beam"] = "refuses: " + re.sub(r"\s+", " ", why)[:300]
        elif not test.ran:
            meta["beam"] = "Beam's test builds the pipeline only to check its output's type: no output to compare"
        pipeline, expected = build(rec)
        if pipeline is None:
            meta["beam"] = expected
        else:
            meta.setdefault("beam", "ok")
            (case / "pipeline.yaml").write_text(pipeline)
            for name, path in rec["files"].items():
                shutil.copy(path, case / name)
            if meta["beam"] == "ok":
                (case / "expected").mkdir()
                for sink, rows in expected.items():
                    with open(case / "expected" / f"{sink}.jsonl", "w") as f:
                        for r in rows:
                            f.write(json.dumps(r, sort_keys=True) + "\n")
    (case / "case.json").write_text(json.dumps(meta, indent=1) + "\n")
    return case_id, meta


def main():
    logging.disable(logging.WARNING)
    yaml_transform.YamlTransform.__init__ = _recording_init(yaml_transform.YamlTransform.__init__)
    yaml_transform.YamlTransform.expand = _recording_expand(yaml_transform.YamlTransform.expand)
    beam.Pipeline.run = _recording_run(beam.Pipeline.run)
    for old in glob.glob(str(CASES / "suite_*")):
        shutil.rmtree(old)
    n = 0
    for suite in SUITES:
        module = importlib.import_module(f"apache_beam.yaml.{suite}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if not issubclass(cls, unittest.TestCase) or cls.__module__ != module.__name__:
                continue
            for name in unittest.TestLoader().getTestCaseNames(cls):
                test, verdict = run_test(module, cls, name)
                recs = test.transforms or [None]
                for i, rec in enumerate(recs):
                    case_id, meta = record(test, verdict, i + 1 if len(recs) > 1 else None, rec)
                    n += 1
                    print(f"{case_id:60} {meta['beam'][:100]}", file=sys.stderr)
                shutil.rmtree(test.workdir, ignore_errors=True)
    print(f"recorded {n} cases of Beam's suite from apache-beam {beam.__version__} into {CASES}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
