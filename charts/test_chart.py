#!/usr/bin/env python3
"""Checks of the riverbank Helm chart and of the objects the operator generates.

Renders the chart with Helm's own engine (the `helm-python-sdk` package: Helm as a library, no
binary) under several values, lints it, and validates every rendered object, the CRD and the
operator's child-object snapshots against the Kubernetes OpenAPI schemas of the oldest
supported version (the `kubernetes-validate` package, strict: unknown fields are errors).

    pip install helm-python-sdk kubernetes-validate
    python3 charts/test_chart.py          # also run by `cargo test -p riverbank-operator --test chart`

Prints one line per check and `N passed, N failed` at the end; exits non-zero on a failure.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import traceback

import helm_python as helm
import kubernetes_validate
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
CHART = os.path.join(HERE, "riverbank")
ROOT = os.path.dirname(HERE)
# The oldest Kubernetes the chart supports whose schemas kubernetes-validate ships, and the
# version the operator's types are generated for (k8s-openapi feature v1_33).
KUBE_VERSION = "1.33.0"
NAMESPACE = "riverbank-system"

results: list[tuple[str, str | None]] = []


def check(name):
    def wrap(fn):
        try:
            fn()
            results.append((name, None))
        except Exception:  # noqa: BLE001 - report every failure, keep going
            results.append((name, traceback.format_exc()))
        return fn

    return wrap


def render(values: dict | None = None) -> list[dict]:
    chart = helm.Chart.load(CHART)
    manifests = chart.render(values or {}, name="riverbank", namespace=NAMESPACE, is_install=True)
    docs = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc["__source__"] = path
                docs.append(doc)
    return docs


def strip(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "__source__"}


def validate_k8s(doc: dict) -> None:
    kubernetes_validate.validate(strip(doc), KUBE_VERSION, strict=True)


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


@check("default values render, every object is valid Kubernetes")
def _():
    docs = render()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding", "Deployment",
         "Role", "RoleBinding", "Service", "Service", "ServiceAccount"]
    ), kinds
    for d in docs:
        assert d["metadata"]["name"], d
        validate_k8s(d)


@check("RBAC is least privilege: no Secrets, no wildcards, reads only where enough")
def _():
    for values in ({}, {"watchNamespaces": ["team-a", "team-b"]}):
        docs = render(values)
        for role in by_kind(docs, "ClusterRole") + by_kind(docs, "Role"):
            for rule in role["rules"]:
                assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
                assert "*" not in rule.get("apiGroups", []), rule
                assert "secrets" not in rule["resources"], rule
                if rule["resources"] == ["pods"]:
                    assert rule["verbs"] == ["get", "list", "watch"], rule
                # Disks are the StatefulSets' business (retention policy), not the operator's.
                assert "persistentvolumeclaims" not in rule["resources"], rule
                if rule["resources"] == ["dataflowjobs"]:
                    # patch: its own finalizer (a JSON patch of metadata.finalizers), never spec.
                    assert set(rule["verbs"]) == {"get", "list", "watch", "patch"}, rule
                if rule["resources"] == ["dataflowjobs/status"]:
                    assert rule["verbs"] == ["patch"], "status by server-side apply only"
                if "statefulsets" in rule["resources"] or "configmaps" in rule["resources"]:
                    # Server-side apply only; garbage collection deletes children with their job.
                    assert set(rule["verbs"]) == {"get", "list", "watch", "create", "patch"}, rule
                if rule["resources"] == ["networkpolicies"]:
                    # A Beam SDK job's, applied with its children; never read back or deleted.
                    assert set(rule["verbs"]) == {"get", "create", "patch"}, rule
        leases = [r for role in by_kind(docs, "Role") for r in role["rules"] if "leases" in r["resources"]]
        assert leases and all(role["metadata"]["namespace"] == NAMESPACE for role in by_kind(docs, "Role"))
        # Only creating needs no name; reading and renewing are limited to the operator's Lease.
        for rule in leases:
            assert rule["verbs"] == ["create"] or rule.get("resourceNames") == ["riverbank"], rule


@check("the Deployment runs `riverbank-operator run` with flags the binary accepts")
def _():
    dep = by_kind(render({"jobDefaults": {"diskSizeGb": 50}, "watchNamespaces": ["team-a"]}), "Deployment")[0]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    assert args[0] == "run", args
    assert "--leader-election-namespace=$(POD_NAMESPACE)" in args and "--leader-election-lease=riverbank" in args
    assert {e["name"] for e in c["env"]} >= {"POD_NAME", "POD_NAMESPACE"}, "identity and Lease namespace"
    binary = os.environ.get("RIVERBANK_OPERATOR_BIN")
    if binary:
        # clap checks every flag and value in order before --help prints: exit 0 = all accepted.
        out = subprocess.run([binary, *args, "--help"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
    else:
        print("     (RIVERBANK_OPERATOR_BIN not set: flags not checked against the binary; cargo test sets it)")


@check("watchNamespaces binds the rules in those namespaces only")
def _():
    docs = render({"watchNamespaces": ["team-a", "team-b"]})
    assert not by_kind(docs, "ClusterRoleBinding"), "no cluster-wide access"
    bindings = [(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in by_kind(docs, "RoleBinding")]
    for ns in ("team-a", "team-b"):
        assert (ns, "riverbank-jobs") in bindings and (ns, "riverbank-workloads") in bindings, bindings
    args = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespaces=team-a,team-b" in args, args
    for d in docs:
        validate_k8s(d)


@check("the operator pod is restricted: non-root, read-only root, no privilege escalation, probes")
def _():
    dep = by_kind(render(), "Deployment")[0]
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert c["livenessProbe"]["httpGet"]["port"] == "health"
    assert c["readinessProbe"]["httpGet"]["port"] == "health"
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert c["image"] == "riverbank/operator:0.1.0"
    assert "--worker-image=riverbank/worker:0.1.0" in c["args"]
    assert "--beam-worker-image=riverbank/worker-beam:0.1.0" in c["args"]
    # The metrics Service selects the operator pod and nothing else (not job pods).
    svc = [s for s in by_kind(render(), "Service") if s["metadata"]["name"] == "riverbank-metrics"][0]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "operator"


@check("monitoring objects render when enabled")
def _():
    docs = render({
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}, "jobPodMonitor": {"enabled": True}},
        "jobDefaults": {"diskSizeGb": 50},
        "watchNamespaces": ["team-a"],
    })
    sm = by_kind(docs, "ServiceMonitor")[0]
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    pm = by_kind(docs, "PodMonitor")[0]
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}
    assert pm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/managed-by"] == "riverbank-operator"
    args = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--default-disk-size-gb=50" in args


@check("the console: a port and a ClusterIP Service off the metrics port, the flag; none when disabled")
def _():
    docs = render({"console": {"port": 9000}})
    dep = by_kind(docs, "Deployment")[0]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert "--console-port=9000" in c["args"], c["args"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["console"] == 9000 and ports["metrics"] != 9000, ports
    (svc,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == "riverbank-console"]
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [{"name": "console", "port": 9000, "targetPort": "console", "protocol": "TCP"}]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    for d in docs:
        validate_k8s(d)
    off = render({"console": {"enabled": False}})
    (c,) = by_kind(off, "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith("--console-port") for a in c["args"])
    assert "console" not in {p["name"] for p in c["ports"]}
    assert [s["metadata"]["name"] for s in by_kind(off, "Service")] == ["riverbank-metrics"]
    # The console needs no RBAC of its own: the roles are the same with it on or off.
    roles = lambda docs: [r["rules"] for r in by_kind(docs, "ClusterRole") + by_kind(docs, "Role")]
    assert roles(docs) == roles(off)


@check("the Grafana dashboard ConfigMap: sidecar label, the dashboard JSON, every chart")
def _():
    assert not by_kind(render(), "ConfigMap"), "off by default"
    docs = render({"grafana": {"dashboard": {"enabled": True, "namespace": "monitoring"}}})
    (cm,) = by_kind(docs, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    validate_k8s(cm)
    dash = json.loads(cm["data"]["riverbank.json"])
    assert dash == json.load(open(os.path.join(CHART, "dashboards", "riverbank.json")))
    titles = " | ".join(p["title"] for p in dash["panels"])
    for chart in ("Workers", "Throughput", "Backlog", "CPU per worker", "Memory per worker", "stage"):
        assert chart in titles, (chart, titles)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), ids
    for p in dash["panels"]:
        assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
    assert "rescales" in dash["annotations"]["list"][0]["expr"]


@check("the PrometheusRule: job failed, backlog growing and watermark lag alerts, thresholds from values")
def _():
    assert not by_kind(render(), "PrometheusRule"), "off by default"
    docs = render({"prometheusRule": {"enabled": True, "labels": {"release": "prom"},
                                      "backlogGrowing": {"minSeconds": 120, "for": "20m"}}})
    (rule,) = by_kind(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prom"
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(rules) == {"RiverbankJobFailed", "RiverbankBacklogGrowing", "RiverbankWatermarkLag"}, set(rules)
    assert rules["RiverbankJobFailed"]["expr"] == 'riverbank_operator_job_state{state="Failed"} == 1'
    backlog = rules["RiverbankBacklogGrowing"]
    assert backlog["for"] == "20m"
    assert "riverbank_backlog_seconds > 120" in backlog["expr"] and "[20m]" in backlog["expr"], backlog["expr"]
    lag = rules["RiverbankWatermarkLag"]
    assert lag["expr"] == "riverbank_watermark_lag_seconds > 600" and lag["for"] == "10m", lag
    for r in rules.values():
        assert r["labels"]["severity"] and r["annotations"]["summary"], r
        # Prometheus templates survive Helm's: they reach Prometheus as written.
        assert "{{ $labels.job_name }}" in r["annotations"]["summary"], r["annotations"]


@check("values.schema.json rejects typos and bad values")
def _():
    chart = helm.Chart.load(CHART)
    chart.validate_schema({})
    for bad in ({"replicaCout": 2}, {"image": {"pullPolicy": "Sometimes"}}, {"jobDefaults": {"diskSizeGb": 0}},
                {"watchNamespaces": ["Not_A_Namespace"]}, {"metrics": {"serviceMonitor": {"interval": "soon"}}},
                {"console": {"port": 0}}, {"grafana": {"dashboard": {"enable": True}}},
                {"prometheusRule": {"backlogGrowing": {"for": "a while"}}}):
        try:
            chart.validate_schema(bad)
        except helm.HelmError:
            continue
        raise AssertionError(f"{bad} was accepted")


JOB_SERVICE = {
    "jobService": {
        "enabled": True,
        "namespace": "beam-jobs",
        "stagingLocation": "s3://beam-staging/jobs",
        "env": [{"name": "AWS_ENDPOINT", "value": "http://s3:9000"},
                {"name": "AWS_ACCESS_KEY_ID",
                 "valueFrom": {"secretKeyRef": {"name": "s3-keys", "key": "id"}}}],
        "jobTemplate": {"pods": {"env": [{"name": "AWS_ENDPOINT", "value": "http://s3:9000"}]}},
        "sdkWorkerParallelism": 4,
    }
}


@check("the job service: off by default; on, a least-privilege Deployment and Service")
def _():
    assert not [d for d in render() if "job-service" in d["metadata"]["name"]]
    docs = render(JOB_SERVICE)
    mine = [d for d in docs if d["metadata"]["name"] == "riverbank-job-service"]
    assert sorted(d["kind"] for d in mine) == [
        "Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"], mine
    for d in mine:
        validate_k8s(d)
        assert d["metadata"]["labels"]["app.kubernetes.io/component"] == "job-service"
    (role,) = [d for d in mine if d["kind"] == "Role"]
    assert role["metadata"]["namespace"] == "beam-jobs", "its jobs' namespace only"
    assert role["rules"] == [{"apiGroups": ["riverbank.dev"], "resources": ["dataflowjobs"],
                              "verbs": ["create", "get", "list", "watch", "patch"]}]
    (dep,) = by_kind(mine, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "riverbank-job-service"
    (c,) = pod["containers"]
    assert c["command"] == ["riverbank"] and c["args"][0] == "job-server", c
    args = c["args"]
    assert "--kubernetes-namespace=beam-jobs" in args and "--staging-location=s3://beam-staging/jobs" in args
    template = [a for a in args if a.startswith("--job-template=")]
    assert json.loads(template[0].split("=", 1)[1]) == JOB_SERVICE["jobService"]["jobTemplate"]
    assert "--sdk-worker-parallelism=4" in args
    assert c["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
    env = {e["name"]: e for e in c["env"]}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "s3-keys", "by Secret reference"
    (svc,) = by_kind(mine, "Service")
    assert svc["spec"]["ports"][0]["port"] == 8099
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    # The operator's own selector does not pick the job service's pods.
    (op,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "riverbank"]
    assert op["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    binary = os.environ.get("RIVERBANK_BIN")
    if binary:
        out = subprocess.run([binary, *args, "--help"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
    chart = helm.Chart.load(CHART)
    try:
        chart.validate_schema({"jobService": {"enabled": True}})
    except helm.HelmError:
        pass
    else:
        raise AssertionError("an enabled job service without stagingLocation was accepted")


@check("helm lint --strict finds no warnings or errors")
def _():
    report = helm.lint(CHART, strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert not problems, problems


@check("the chart's CRD is the generated one and a valid CustomResourceDefinition")
def _():
    chart_crd = open(os.path.join(CHART, "crds", "dataflowjob.yaml")).read()
    assert chart_crd == open(os.path.join(ROOT, "crds", "dataflowjob.yaml")).read()
    crd = yaml.safe_load(chart_crd)
    kubernetes_validate.validate(crd, KUBE_VERSION, strict=True)


@check("the operator's child objects (test snapshots) are valid Kubernetes")
def _():
    files = sorted(glob.glob(os.path.join(ROOT, "operator", "tests", "snapshots", "*.yaml")))
    assert len(files) >= 4, files
    for f in files:
        doc = yaml.safe_load(open(f))
        # Placeholders stand where the snapshot hides the plan hash; put a real-looking one back.
        ann = doc.get("spec", {}).get("template", {}).get("metadata", {}).get("annotations", {})
        if "riverbank.dev/plan-hash" in ann:
            ann["riverbank.dev/plan-hash"] = "0123456789abcdef"
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(f"{os.path.basename(f)}: {e.message} at {list(e.path)}") from e


@check("the example DataflowJob validates against the CRD's OpenAPI schema")
def _():
    import jsonschema  # installed with kubernetes-validate

    crd = yaml.safe_load(open(os.path.join(ROOT, "crds", "dataflowjob.yaml")))
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

    def to_jsonschema(node):
        # OpenAPI v3 `nullable` is JSON Schema `type: [T, null]`; drop Kubernetes extensions.
        if isinstance(node, dict):
            out = {k: to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
            if out.pop("nullable", False) and "type" in out:
                out["type"] = [out["type"], "null"]
            if node.get("x-kubernetes-int-or-string"):
                out["type"] = ["integer", "string"]
            return out
        if isinstance(node, list):
            return [to_jsonschema(v) for v in node]
        return node

    text = open(os.path.join(ROOT, "examples", "taxi", "dataflowjob.yaml")).read()
    text = text.replace("{{ input }}", "s3://b/in/*.parquet").replace("{{ output }}", "s3://b/out")
    job = yaml.safe_load(text)
    validator = jsonschema.Draft7Validator(to_jsonschema(schema))
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(job)]
    assert not errors, errors
    job["spec"]["options"]["diskSizeGb"] = 0
    job["spec"]["options"]["autoscalingAlgorithm"] = "SOMETIMES"
    assert len(list(validator.iter_errors(job))) == 2


def main() -> int:
    failed = 0
    for name, error in results:
        if error:
            failed += 1
            print(f"FAIL {name}\n{error}")
        else:
            print(f"ok   {name}")
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
