//! Fixtures and the snapshot helper shared by the integration tests.
#![allow(dead_code)]
use riverbank_operator::DataflowJob;
use serde_json::{Map, Value, json};
use std::path::{Path, PathBuf};

/// The workspace root (operator/..).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("operator/ has a parent")
        .to_path_buf()
}

/// Compares `actual` with the checked-in file at `path` (relative to the workspace root), or
/// rewrites the file when UPDATE_SNAPSHOTS=1.
pub fn check_snapshot(path: &str, actual: &str, regenerate: &str) {
    let file = root().join(path);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&file).unwrap_or_default();
    if expected != actual {
        let diff_line = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "{path} is not what the code generates (first difference at line {}):\n  checked in: {:?}\n  generated:  {:?}\nIf the change is intended, regenerate it: {regenerate}",
            diff_line + 1,
            expected.lines().nth(diff_line).unwrap_or("<end of file>"),
            actual.lines().nth(diff_line).unwrap_or("<end of file>"),
        );
    }
}

/// examples/taxi/dataflowjob.yaml, rendered as a user would before `kubectl apply`, as the API
/// server returns it (namespace and uid set).
pub fn taxi_job() -> DataflowJob {
    let text = std::fs::read_to_string(root().join("examples/taxi/dataflowjob.yaml")).unwrap();
    let vars: Map<String, Value> = json!({
        "input": "s3://riverbank-examples/taxi/*.parquet",
        "output": "s3://riverbank-examples/out/taxi",
    })
    .as_object()
    .unwrap()
    .clone();
    let rendered = riverbank_pipeline::template::render(&text, &vars).unwrap();
    let mut job: DataflowJob =
        serde_norway::from_str(&rendered).expect("the example parses as a DataflowJob");
    job.metadata.namespace = Some("data-eng".into());
    job.metadata.uid = Some("3f6b1c2e-8d4a-4f0e-9b7a-2c5d8e1f0a93".into());
    job.metadata.generation = Some(1);
    job
}
