//! The CustomResourceDefinition: checked-in copies are current, the schema is one a real API
//! server accepts (structural, known formats, CEL rules that compile within the cost budget),
//! every field is documented, and the CEL rules accept the example and reject the mistakes
//! they are there for.
mod common;

use common::{check_snapshot, taxi_job};
use kube::CustomResourceExt;
use kube::core::cel::{
    CompiledSchema, ScopeContext, Validator, WarningKind, analyze_rule, compile_schema,
};
use riverbank_operator::DataflowJob;
use serde_json::{Value, json};

const REGENERATE: &str = "UPDATE_SNAPSHOTS=1 cargo test -p riverbank-operator --test crd  (or: cargo run -p riverbank-operator -- crd > crds/dataflowjob.yaml && cp crds/dataflowjob.yaml charts/riverbank/crds/)";

fn schema() -> Value {
    let crd = DataflowJob::crd();
    let version = &crd.spec.versions[0];
    serde_json::to_value(
        version
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

#[test]
fn checked_in_crds_are_current() {
    let yaml = riverbank_operator::crd_yaml();
    check_snapshot("crds/dataflowjob.yaml", &yaml, REGENERATE);
    check_snapshot("charts/riverbank/crds/dataflowjob.yaml", &yaml, REGENERATE);
}

#[test]
fn crd_names_scope_subresources_and_columns() {
    let crd = DataflowJob::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("dataflowjobs.riverbank.dev")
    );
    assert_eq!(crd.spec.group, "riverbank.dev");
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.kind, "DataflowJob");
    assert_eq!(
        crd.spec.names.short_names.as_deref(),
        Some(&["dfj".to_string()][..])
    );
    let v = &crd.spec.versions[0];
    assert_eq!(v.name, "v1alpha1");
    assert!(v.served && v.storage);
    assert!(
        v.subresources.as_ref().unwrap().status.is_some(),
        "status subresource"
    );
    let columns: Vec<(&str, &str, i32)> = v
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c.name.as_str(),
                c.json_path.as_str(),
                c.priority.unwrap_or(0),
            )
        })
        .collect();
    for wanted in [
        ("State", ".status.state", 0),
        ("Workers", ".status.currentWorkers", 0),
        ("Backlog", ".status.backlogSeconds", 0),
        ("Age", ".metadata.creationTimestamp", 0),
    ] {
        assert!(
            columns.contains(&wanted),
            "missing column {wanted:?} in {columns:?}"
        );
    }
    // Every column's path exists in the schema.
    let s = schema();
    for (_, path, _) in &columns {
        if path.starts_with(".metadata") {
            continue;
        }
        let mut node = &s;
        for part in path.trim_start_matches('.').split('.') {
            node = &node["properties"][part];
        }
        assert!(
            node.get("type").is_some(),
            "column path {path} is not in the schema"
        );
    }
}

/// What the API server requires of a CRD schema
/// (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema),
/// plus what it rejects outright.
fn check_structural(node: &Value, path: &str, in_junctor: bool, problems: &mut Vec<String>) {
    let Some(obj) = node.as_object() else {
        problems.push(format!("{path}: schema is not an object"));
        return;
    };
    for forbidden in [
        "$ref",
        "definitions",
        "$defs",
        "$schema",
        "$id",
        "const",
        "patternProperties",
        "dependencies",
    ] {
        if obj.contains_key(forbidden) {
            problems.push(format!("{path}: has {forbidden}"));
        }
    }
    if obj
        .get("enum")
        .and_then(Value::as_array)
        .is_some_and(|e| e.iter().any(Value::is_null))
    {
        problems.push(format!("{path}: null among the enum values"));
    }
    if obj.get("uniqueItems") == Some(&json!(true)) {
        problems.push(format!("{path}: uniqueItems: true is not allowed"));
    }
    if obj.get("additionalProperties") == Some(&json!(false)) {
        problems.push(format!(
            "{path}: additionalProperties: false is not allowed"
        ));
    }
    if obj.contains_key("properties") && obj.contains_key("additionalProperties") {
        problems.push(format!("{path}: both properties and additionalProperties"));
    }
    let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&json!(true));
    let preserve = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
    if in_junctor {
        for key in [
            "type",
            "description",
            "default",
            "additionalProperties",
            "nullable",
        ] {
            if obj.contains_key(key) && !int_or_string {
                problems.push(format!("{path}: {key} inside allOf/anyOf/oneOf/not"));
            }
        }
    } else {
        match obj.get("type").and_then(Value::as_str) {
            Some("object" | "array" | "string" | "integer" | "number" | "boolean") => {}
            Some(other) => problems.push(format!("{path}: unknown type {other}")),
            None if int_or_string || preserve => {}
            None => problems.push(format!("{path}: no type")),
        }
    }
    if obj.contains_key("properties") && obj.get("type") != Some(&json!("object")) && !in_junctor {
        problems.push(format!("{path}: properties on a non-object"));
    }
    if let Some(items) = obj.get("items") {
        if !items.is_object() {
            problems.push(format!("{path}: items must be one schema"));
        }
        if obj.get("type") != Some(&json!("array")) && !in_junctor {
            problems.push(format!("{path}: items on a non-array"));
        }
    }
    if let Some(format) = obj.get("format").and_then(Value::as_str) {
        // The formats Kubernetes validates; others draw warnings or are dropped.
        let known = [
            "int32",
            "int64",
            "float",
            "double",
            "byte",
            "date",
            "date-time",
            "duration",
            "uri",
            "hostname",
            "ipv4",
            "ipv6",
            "cidr",
            "mac",
            "uuid",
            "password",
        ];
        if !known.contains(&format) {
            problems.push(format!(
                "{path}: format {format} is not one Kubernetes knows"
            ));
        }
    }
    match obj.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("map") => {
            let keys = obj
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let required = obj["items"]
                .get("required")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if keys.is_empty() || keys.iter().any(|k| !required.contains(k)) {
                problems.push(format!(
                    "{path}: list-map keys must be required fields of the items"
                ));
            }
        }
        Some("set") => {
            let item_type = obj["items"].get("type").and_then(Value::as_str);
            if !matches!(item_type, Some("string" | "integer" | "number" | "boolean")) {
                problems.push(format!("{path}: a list-type set needs scalar items"));
            }
        }
        Some("atomic") | None => {}
        Some(other) => problems.push(format!("{path}: unknown list type {other}")),
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        if let Some(required) = obj.get("required").and_then(Value::as_array) {
            for r in required {
                if !props.contains_key(r.as_str().unwrap_or_default()) {
                    problems.push(format!("{path}: required {r} is not a property"));
                }
            }
        }
        for (k, v) in props {
            check_structural(v, &format!("{path}.{k}"), in_junctor, problems);
        }
    }
    if let Some(items) = obj.get("items").filter(|i| i.is_object()) {
        check_structural(items, &format!("{path}[]"), in_junctor, problems);
    }
    if let Some(ap) = obj.get("additionalProperties").filter(|a| a.is_object()) {
        check_structural(ap, &format!("{path}{{}}"), in_junctor, problems);
    }
    for junctor in ["allOf", "anyOf", "oneOf"] {
        for (i, sub) in obj
            .get(junctor)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            check_structural(sub, &format!("{path}/{junctor}[{i}]"), true, problems);
        }
    }
    if let Some(not) = obj.get("not") {
        check_structural(not, &format!("{path}/not"), true, problems);
    }
}

#[test]
fn schema_is_structural() {
    let s = schema();
    let mut problems = vec![];
    check_structural(&s, "", false, &mut problems);
    assert!(
        problems.is_empty(),
        "the CRD schema is not structural:\n{}",
        problems.join("\n")
    );
    // The only metadata restriction allowed is on name, and it must be a CEL rule at the root.
    assert!(s["properties"].get("metadata").is_none());
    assert_eq!(
        s["properties"]["spec"]["properties"]["pipeline"]["x-kubernetes-preserve-unknown-fields"],
        json!(true)
    );
    assert_eq!(
        s["properties"]["spec"]["properties"]["pipeline"]["type"],
        json!("object")
    );
    // The checker catches what it claims to.
    let mut found = vec![];
    check_structural(
        &json!({"type": "object", "properties": {"a": {"$ref": "#/x"}, "b": {"anyOf": [{"type": "string"}]}}}),
        "",
        false,
        &mut found,
    );
    assert_eq!(found.len(), 4, "{found:?}");
}

/// Our own fields (not the embedded Kubernetes types, documented upstream) all have a
/// description, because `kubectl explain` is the manual.
fn check_described(node: &Value, path: &str, missing: &mut Vec<String>) {
    const UPSTREAM: &[&str] = &[
        ".spec.pods.affinity",
        ".spec.pods.resources",
        ".spec.pods.tolerations",
        ".spec.pods.env",
        ".spec.pods.imagePullSecrets",
        ".spec.worker.affinity",
        ".spec.worker.resources",
        ".spec.worker.tolerations",
        ".spec.worker.env",
        ".spec.worker.imagePullSecrets",
        ".status.conditions",
    ];
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            let p = format!("{path}.{k}");
            let described = v
                .get("description")
                .and_then(Value::as_str)
                .is_some_and(|d| d.len() > 10);
            if !described {
                missing.push(p.clone());
            }
            if !UPSTREAM.contains(&p.as_str()) {
                check_described(v, &p, missing);
            }
        }
    }
    if let Some(items) = node.get("items") {
        check_described(items, path, missing);
    }
}

#[test]
fn every_field_is_described() {
    let s = schema();
    assert!(s["description"].as_str().unwrap().contains("Beam YAML"));
    let mut missing = vec![];
    check_described(&s, "", &mut missing);
    assert!(
        missing.is_empty(),
        "fields without a description (kubectl explain shows nothing): {missing:?}"
    );
    // Descriptions are prose, not Rust: one paragraph per line, no doc-comment line breaks.
    let spec_desc = s["properties"]["spec"]["description"].as_str().unwrap();
    assert!(!spec_desc.contains('\n'), "{spec_desc:?}");
    // Option<enum> fields keep the field's description (not the enum type's).
    let opts = &s["properties"]["spec"]["properties"]["options"]["properties"];
    assert!(
        opts["autoscalingAlgorithm"]["description"]
            .as_str()
            .unwrap()
            .contains("THROUGHPUT_BASED")
    );
    assert!(
        s["properties"]["status"]["properties"]["state"]["description"]
            .as_str()
            .unwrap()
            .contains("Drained")
    );
}

fn collect_compile_errors(c: &CompiledSchema, path: &str, out: &mut Vec<String>) {
    for e in c.compilation_errors() {
        out.push(format!("{path}: {e}"));
    }
    for (k, v) in &c.properties {
        collect_compile_errors(v, &format!("{path}.{k}"), out);
    }
    if let Some(items) = &c.items {
        collect_compile_errors(items, &format!("{path}[]"), out);
    }
    if let Some(ap) = &c.additional_properties {
        collect_compile_errors(ap, &format!("{path}{{}}"), out);
    }
}

fn collect_rule_warnings(c: &CompiledSchema, path: &str, out: &mut Vec<String>, rules: &mut usize) {
    for r in c.validations.iter().flatten() {
        *rules += 1;
        for w in analyze_rule(&r.rule.rule, c, ScopeContext::CrdValidation) {
            if matches!(w.kind, WarningKind::CostExceeded | WarningKind::WrongScope) {
                out.push(format!("{path}: {}", w.message));
            }
        }
    }
    for (k, v) in &c.properties {
        collect_rule_warnings(v, &format!("{path}.{k}"), out, rules);
    }
    if let Some(items) = &c.items {
        collect_rule_warnings(items, &format!("{path}[]"), out, rules);
    }
}

#[test]
fn cel_rules_compile_within_budget() {
    let compiled = compile_schema(&schema());
    let mut errors = vec![];
    collect_compile_errors(&compiled, "", &mut errors);
    assert!(
        errors.is_empty(),
        "CEL rules that do not compile: {errors:?}"
    );
    let (mut warnings, mut rules) = (vec![], 0);
    collect_rule_warnings(&compiled, "", &mut warnings, &mut rules);
    assert!(
        warnings.is_empty(),
        "CEL rules the API server may reject: {warnings:?}"
    );
    // 16 rules, 2 of them (on credentials) also under the deprecated spec.worker.
    assert_eq!(rules, 18, "every rule was found and analysed");
}

fn validate(job: &Value, old: Option<&Value>) -> Result<(), String> {
    Validator::new().validate(&schema(), job, old).map_err(|e| {
        e.as_slice()
            .iter()
            .map(|e| format!("{}: {}", e.field_path, e.message))
            .collect::<Vec<_>>()
            .join("; ")
    })
}

fn taxi_json() -> Value {
    serde_json::to_value(taxi_job()).unwrap()
}

/// `job` with the value at a JSON pointer set, creating missing objects on the way.
fn with(mut job: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let mut node = &mut job;
    for part in parent.split('/').skip(1) {
        node = match node {
            Value::Array(items) => &mut items[part.parse::<usize>().unwrap()],
            other => other
                .as_object_mut()
                .unwrap()
                .entry(part)
                .or_insert_with(|| json!({})),
        };
    }
    match node {
        Value::Array(items) => items[key.parse::<usize>().unwrap()] = value,
        other => {
            other
                .as_object_mut()
                .unwrap()
                .insert(key.to_string(), value);
        }
    }
    job
}

#[test]
fn cel_accepts_the_example_and_a_full_job() {
    validate(&taxi_json(), None).unwrap();
    let full = with(taxi_json(), "/spec/options/streaming", json!(true));
    let full = with(full, "/spec/desiredState", json!("Drained"));
    let full = with(full, "/spec/options/numWorkers", json!(2));
    let full = with(full, "/spec/options/serviceAccount", json!("taxi"));
    let full = with(
        full,
        "/spec/pods",
        json!({
            "serviceAccountName": "taxi",
            "credentials": [
                {"name": "s3", "key": "secret", "env": "AWS_SECRET_ACCESS_KEY"},
                {"name": "gcp", "key": "key.json", "path": "/var/run/secrets/gcp/key.json"},
            ],
        }),
    );
    validate(&full, None).unwrap();
    // Unchanged and Running -> Cancelled updates are fine.
    validate(&full, Some(&full)).unwrap();
    let cancelled = with(taxi_json(), "/spec/desiredState", json!("Cancelled"));
    validate(&cancelled, Some(&taxi_json())).unwrap();
    // Scaling bounds and the pipeline may change on a running job.
    let rescaled = with(taxi_json(), "/spec/options/maxNumWorkers", json!(8));
    let rescaled = with(
        rescaled,
        "/spec/pipeline/transforms/1/config/keep",
        json!("total_amount > 1"),
    );
    validate(&rescaled, Some(&taxi_json())).unwrap();
}

#[test]
fn cel_rejects_common_mistakes() {
    let rejects = |job: Value, old: Option<Value>, needle: &str| {
        let err = validate(&job, old.as_ref()).expect_err(needle);
        assert!(err.contains(needle), "expected {needle:?} in {err:?}");
    };
    let taxi = taxi_json();
    rejects(
        with(taxi.clone(), "/spec/options/numWorkers", json!(5)),
        None,
        "must not exceed maxNumWorkers",
    );
    rejects(
        with(taxi.clone(), "/spec/desiredState", json!("Drained")),
        None,
        "streaming jobs only",
    );
    rejects(
        with(
            taxi.clone(),
            "/metadata/name",
            json!("a-job-name-that-is-much-too-long-for-its-pods"),
        ),
        None,
        "at most 40 characters",
    );
    rejects(
        with(taxi.clone(), "/metadata/name", json!("9lives")),
        None,
        "starting with a letter",
    );
    let cancelled = with(taxi.clone(), "/spec/desiredState", json!("Cancelled"));
    rejects(taxi.clone(), Some(cancelled), "cannot be resumed");
    let both = json!([{"name": "s3", "key": "k", "env": "K", "path": "/var/run/secrets/s3/k"}]);
    rejects(
        with(taxi.clone(), "/spec/pods/credentials", both),
        None,
        "exactly one of env",
    );
    let neither = json!([{"name": "s3", "key": "k"}]);
    rejects(
        with(taxi.clone(), "/spec/pods/credentials", neither),
        None,
        "exactly one of env",
    );
    let dots = json!([{"name": "s3", "key": "k", "path": "/var/run/../etc/k"}]);
    rejects(
        with(taxi.clone(), "/spec/pods/credentials", dots),
        None,
        "'..' segments",
    );
    rejects(
        with(taxi.clone(), "/spec/options/diskSizeGb", json!(20)),
        Some(taxi.clone()),
        "cannot change once the job exists",
    );
    let no_disk = {
        let mut t = taxi.clone();
        t["spec"]["options"]
            .as_object_mut()
            .unwrap()
            .remove("diskSizeGb");
        t
    };
    rejects(
        no_disk,
        Some(taxi.clone()),
        "diskSizeGb and options.workerDiskType",
    );
    rejects(
        with(taxi.clone(), "/spec/options/workerDiskType", json!("ssd")),
        Some(taxi.clone()),
        "workerDiskType cannot change",
    );
    rejects(
        with(taxi.clone(), "/spec/options/streaming", json!(true)),
        Some(taxi.clone()),
        "streaming cannot change",
    );
    let sa = with(taxi.clone(), "/spec/options/serviceAccount", json!("a"));
    rejects(
        with(sa.clone(), "/spec/pods/serviceAccountName", json!("b")),
        None,
        "set one of them",
    );
    // The deprecated name of pods is checked alike, and cannot be set beside it.
    rejects(
        with(sa, "/spec/worker/serviceAccountName", json!("b")),
        None,
        "set one of them",
    );
    let both = with(taxi.clone(), "/spec/pods", json!({"labels": {"a": "b"}}));
    rejects(
        with(both, "/spec/worker", json!({"labels": {"a": "b"}})),
        None,
        "deprecated name of pods",
    );
}

/// A Beam SDK pipeline's job (`spec.beamPipeline`, as the job service creates it): accepted
/// alone (batch or streaming), refused beside a YAML pipeline, without either, with a YAML
/// stream's snapshots, or changed afterwards.
#[test]
fn cel_takes_a_beam_sdk_job_and_its_mistakes() {
    let beam = json!({
        "location": "s3://b/beam/wordcount-1/",
        "sdkContainerImage": "example.com/beam-python-sdk:2.77.0"
    });
    let mut sdk = with(taxi_json(), "/spec/beamPipeline", beam.clone());
    sdk["spec"].as_object_mut().unwrap().remove("pipeline");
    validate(&sdk, None).unwrap();
    validate(&sdk, Some(&sdk)).unwrap();
    let rejects = |job: &Value, old: Option<&Value>, needle: &str| {
        let err = validate(job, old).expect_err(needle);
        assert!(err.contains(needle), "expected {needle:?} in {err:?}");
    };
    let both = with(taxi_json(), "/spec/beamPipeline", beam);
    rejects(&both, None, "exactly one of them");
    let mut neither = taxi_json();
    neither["spec"].as_object_mut().unwrap().remove("pipeline");
    rejects(&neither, None, "exactly one of them");
    // A streaming one too; its state is in its checkpoints, not in snapshots.
    validate(
        &with(sdk.clone(), "/spec/options/streaming", json!(true)),
        None,
    )
    .unwrap();
    for (field, value) in [
        ("/spec/snapshot", json!({"name": "s1"})),
        ("/spec/transformNameMapping", json!({"A": "B"})),
    ] {
        rejects(
            &with(sdk.clone(), field, value),
            None,
            "are for Beam YAML pipelines",
        );
    }
    rejects(
        &with(
            sdk.clone(),
            "/spec/beamPipeline/location",
            json!("s3://b/beam/other/"),
        ),
        Some(&sdk),
        "cannot change once the job exists",
    );
    // A streaming one's changes by the job service's --update (a new pipeline in place).
    let stream = with(sdk.clone(), "/spec/options/streaming", json!(true));
    validate(
        &with(
            stream.clone(),
            "/spec/beamPipeline/location",
            json!("s3://b/beam/other/"),
        ),
        Some(&stream),
    )
    .unwrap();
    // Its runner is given its SDK worker pods when it starts.
    let two = with(sdk.clone(), "/spec/options/numWorkers", json!(2));
    validate(&two, Some(&two)).unwrap();
    rejects(
        &with(sdk.clone(), "/spec/options/numWorkers", json!(3)),
        Some(&two),
        "numWorkers is fixed when it starts",
    );
    // A YAML job's numWorkers changes freely (a rescale).
    let yaml_two = with(taxi_json(), "/spec/options/numWorkers", json!(2));
    validate(
        &with(taxi_json(), "/spec/options/numWorkers", json!(3)),
        Some(&yaml_two),
    )
    .unwrap();
}

/// A job written with the deprecated `spec.worker` still configures its pods (the conversion
/// note in the README: rename `worker:` to `pods:`).
#[test]
fn the_deprecated_worker_block_is_read_as_pods() {
    let old = with(
        taxi_json(),
        "/spec/worker",
        json!({"image": "registry.example/riverbank:1", "serviceAccountName": "taxi"}),
    );
    validate(&old, None).unwrap();
    let job: DataflowJob = serde_json::from_value(old).unwrap();
    assert_eq!(
        job.pods().and_then(|p| p.image.as_deref()),
        Some("registry.example/riverbank:1")
    );
    assert_eq!(job.service_account(), Some("taxi"));
    let renamed = with(
        taxi_json(),
        "/spec/pods",
        json!({"image": "registry.example/riverbank:1", "serviceAccountName": "taxi"}),
    );
    let new: DataflowJob = serde_json::from_value(renamed).unwrap();
    assert_eq!(new.pods(), job.pods());
}

#[test]
fn openapi_bounds_are_in_the_schema() {
    // Enforced by the API server's OpenAPI validation (not CEL): check they are declared.
    let s = schema();
    let opts = &s["properties"]["spec"]["properties"]["options"]["properties"];
    assert_eq!(opts["diskSizeGb"]["minimum"], json!(1.0));
    assert_eq!(opts["numWorkers"]["minimum"], json!(1.0));
    assert_eq!(
        opts["autoscalingAlgorithm"]["enum"],
        json!(["THROUGHPUT_BASED", "NONE"])
    );
    let spec = &s["properties"]["spec"]["properties"];
    assert_eq!(
        spec["desiredState"]["enum"],
        json!(["Running", "Drained", "Cancelled"])
    );
    assert_eq!(spec["desiredState"]["default"], json!("Running"));
    // pipeline or beamPipeline: a CEL rule asks for exactly one.
    assert_eq!(s["properties"]["spec"]["required"], Value::Null);
    assert_eq!(
        spec["beamPipeline"]["required"],
        json!(["location", "sdkContainerImage"])
    );
    let states = s["properties"]["status"]["properties"]["state"]["enum"].clone();
    assert_eq!(
        states,
        json!([
            "Pending",
            "Running",
            "Done",
            "Failed",
            "Cancelled",
            "Draining",
            "Drained",
            "Updating"
        ])
    );
}

#[test]
fn example_round_trips_and_plans_like_the_cli() {
    let job = taxi_job();
    assert_eq!(job.spec.options.max_num_workers, Some(4));
    // The CLI's reading of the same manifest (riverbank plan examples/taxi/dataflowjob.yaml).
    let text =
        std::fs::read_to_string(common::root().join("examples/taxi/dataflowjob.yaml")).unwrap();
    let vars = json!({"input": "s3://riverbank-examples/taxi/*.parquet", "output": "s3://riverbank-examples/out/taxi"});
    let cli = riverbank_pipeline::load_plan(&text, vars.as_object().unwrap(), "x").unwrap();
    let ours = job.plan().unwrap();
    assert_eq!(ours.job_name, "nyc-taxi");
    assert_eq!(ours.stages, cli.stages);
    assert_eq!(
        riverbank_pipeline::display::to_json(&ours),
        riverbank_pipeline::display::to_json(&cli)
    );
    // Serializing and parsing back loses nothing.
    let again: DataflowJob = serde_json::from_value(serde_json::to_value(&job).unwrap()).unwrap();
    assert_eq!(again, job);
}
