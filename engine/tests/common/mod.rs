//! Helpers shared by the worker's integration tests: run a YAML pipeline end to end (parse,
//! plan, compile, run) and read what it wrote.
#![allow(dead_code)]
use riverbank_engine::{Metrics, RunConfig, RunError, RunSummary, compile, run};
use riverbank_pipeline::PipelineError;
use serde_json::{Map, Value};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// Jinja variables from a JSON object literal.
pub fn vars(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

/// Where a run stopped: while loading the YAML, or while compiling/running it.
#[derive(Debug)]
pub enum Failure {
    Pipeline(PipelineError),
    Run(RunError),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Pipeline(e) => write!(f, "{e}"),
            Failure::Run(e) => write!(f, "{e}"),
        }
    }
}

pub struct Outcome {
    pub summary: RunSummary,
    pub metrics: Arc<Metrics>,
}

impl Outcome {
    /// Elements out of a transform, as the run summary counts them.
    pub fn count(&self, transform: &str) -> u64 {
        self.summary
            .elements_out
            .iter()
            .find(|(n, _)| n == transform)
            .map(|(_, n)| *n)
            .unwrap_or_else(|| {
                panic!(
                    "no transform {transform} in {:?}",
                    self.summary.elements_out
                )
            })
    }
}

/// Loads, compiles and runs `yaml` with 2 partitions (tweak the config with `tweak`; sources
/// are read in batches of `cfg.batch_size` rows, so a small one makes many bundles).
pub async fn run_with(
    yaml: &str,
    vars: &Map<String, Value>,
    tweak: impl FnOnce(&mut RunConfig),
) -> Result<Outcome, Failure> {
    let (result, metrics) = run_full(yaml, vars, tweak).await;
    result.map(|summary| Outcome {
        summary,
        metrics: metrics.expect("metrics of a run"),
    })
}

/// Like [`run_with`], but also returns the metrics of a run that failed (`None` when it did
/// not get to run).
pub async fn run_full(
    yaml: &str,
    vars: &Map<String, Value>,
    tweak: impl FnOnce(&mut RunConfig),
) -> (Result<RunSummary, Failure>, Option<Arc<Metrics>>) {
    let spill = tempfile::tempdir().expect("spill dir");
    let mut cfg = RunConfig::local(spill.path().to_path_buf());
    cfg.slots = 2;
    tweak(&mut cfg);
    let plan = match riverbank_pipeline::load_plan(yaml, vars, "test") {
        Ok(p) => p,
        Err(e) => return (Err(Failure::Pipeline(e)), None),
    };
    let compiled = match compile(plan, cfg.batch_size).await {
        Ok(c) => c,
        Err(e) => return (Err(Failure::Run(e)), None),
    };
    let metrics = Arc::new(Metrics::new(
        compiled.plan.graph.transforms.len(),
        compiled.plan.stages.len(),
    ));
    let result = run(compiled, cfg, metrics.clone())
        .await
        .map_err(Failure::Run);
    (result, Some(metrics))
}

/// Runs `yaml` (no Jinja variables) and panics with the error if it fails.
pub async fn run_ok(yaml: &str) -> Outcome {
    run_with(yaml, &Map::new(), |_| {})
        .await
        .unwrap_or_else(|e| panic!("pipeline failed: {e}\n--- yaml ---\n{yaml}"))
}

/// Runs `yaml` and returns its error; panics if it succeeds.
pub async fn run_err(yaml: &str) -> Failure {
    match run_with(yaml, &Map::new(), |_| {}).await {
        Ok(_) => panic!("pipeline unexpectedly succeeded:\n{yaml}"),
        Err(e) => e,
    }
}

/// Names of the files in `dir` whose names start with `prefix`, sorted.
pub fn files(dir: &Path, prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with(prefix))
            .collect(),
        Err(_) => vec![],
    };
    v.sort();
    v
}

/// Every entry of `dir` (files and directories), sorted; empty if `dir` does not exist.
pub fn entries(dir: &Path) -> Vec<String> {
    files(dir, "")
}

/// Rows of every JSON-lines file in `dir` whose name starts with `prefix`.
pub fn read_jsonl(dir: &Path, prefix: &str) -> Vec<Value> {
    let names = files(dir, prefix);
    assert!(
        !names.is_empty(),
        "no files {prefix}* in {} (it has {:?})",
        dir.display(),
        entries(dir)
    );
    names
        .iter()
        .flat_map(|n| read_jsonl_file(&dir.join(n)))
        .collect()
}

pub fn read_jsonl_file(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{}: bad JSON line {l:?}: {e}", path.display()))
        })
        .collect()
}

/// Rows in a canonical order (by their JSON text), to compare collections.
pub fn sorted(mut rows: Vec<Value>) -> Vec<Value> {
    rows.sort_by_key(|r| r.to_string());
    rows
}

/// Quotes a path for use inside YAML.
pub fn yaml_path(p: &Path) -> String {
    serde_json::to_string(&p.to_string_lossy()).expect("a string")
}
