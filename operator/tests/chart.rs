//! The Helm chart agrees with the operator: versions and default images match, every value is
//! declared in values.schema.json. When Helm's Python SDK is installed (`pip install
//! helm-python-sdk kubernetes-validate`), also renders the chart and validates everything it
//! and the operator produce against the Kubernetes schemas (charts/test_chart.py).
mod common;

use common::root;
use riverbank_operator::OperatorSettings;
use serde_json::Value;
use std::process::Command;

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn chart_versions_and_default_images_match_the_operator() {
    let chart = yaml("charts/riverbank/Chart.yaml");
    assert_eq!(
        chart["appVersion"],
        env!("CARGO_PKG_VERSION"),
        "Chart.yaml appVersion is the operator's version"
    );
    let values = yaml("charts/riverbank/values.yaml");
    let worker = &values["jobDefaults"]["workerImage"];
    let image = format!(
        "{}:{}",
        worker["repository"].as_str().unwrap(),
        chart["appVersion"].as_str().unwrap()
    );
    assert_eq!(
        image,
        OperatorSettings::default().worker_image,
        "the chart's default worker image is the operator's"
    );
}

/// Every key of `values` is declared by `schema` (which forbids the rest), so the documented
/// defaults never fail the chart's own schema.
fn undeclared(values: &Value, schema: &Value, defs: &Value, path: &str, out: &mut Vec<String>) {
    let schema = match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => &defs[r.trim_start_matches("#/definitions/")],
        None => schema,
    };
    let Some(map) = values.as_object() else {
        return;
    };
    let props = schema.get("properties").and_then(Value::as_object);
    for (k, v) in map {
        match props.and_then(|p| p.get(k)) {
            Some(s) => undeclared(v, s, defs, &format!("{path}.{k}"), out),
            None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                out.push(format!("{path}.{k}"))
            }
            None => {}
        }
    }
}

#[test]
fn values_are_declared_in_the_schema() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("charts/riverbank/values.schema.json")).unwrap(),
    )
    .unwrap();
    let values = yaml("charts/riverbank/values.yaml");
    let mut out = vec![];
    undeclared(&values, &schema, &schema["definitions"], "", &mut out);
    assert!(
        out.is_empty(),
        "values.yaml keys missing from values.schema.json: {out:?}"
    );
    let mut typo = values.clone();
    typo["replicaCout"] = 2.into();
    let mut out = vec![];
    undeclared(&typo, &schema, &schema["definitions"], "", &mut out);
    assert_eq!(out, [".replicaCout"]);
}

#[test]
fn chart_renders_and_everything_is_valid_kubernetes() {
    let probe = Command::new("python3")
        .args(["-c", "import helm_python, kubernetes_validate, yaml"])
        .output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "needs python3 with `pip install helm-python-sdk kubernetes-validate pyyaml` (dev/setup.sh installs them)"
    );
    let out = Command::new("python3")
        .arg(root().join("charts/test_chart.py"))
        // The chart's Deployment args are checked against this very binary.
        .env(
            "RIVERBANK_OPERATOR_BIN",
            env!("CARGO_BIN_EXE_riverbank-operator"),
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "charts/test_chart.py failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
}
