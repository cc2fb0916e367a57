//! Riverbank's pipeline model: Beam YAML in, a validated graph and a serializable fused plan out.
//! No I/O, no async, no Kubernetes: every other crate speaks these types.
pub mod config;
pub mod display;
pub mod error;
pub mod graph;
pub mod options;
pub mod plan;
pub mod progress;
pub mod template;
pub mod trigger;
pub mod windowing;

pub use error::{Issue, PipelineError};
pub use graph::{Graph, Transform};
pub use options::PipelineOptions;
pub use plan::{Exchange, Op, OpRole, Plan, Stage, StageInput};
pub use progress::{
    JobFailure, JobPhase, JobProgress, SnapshotRequest, SnapshotTaken, StageProgress, StopRequest,
    StreamingProgress, TransformProgress, UpdateCheck, UpdateVerdict, WorkItemProgress,
    WorkerProgress,
};

use serde_json::{Map, Value};

/// What a file held: a Beam YAML pipeline, or a DataflowJob manifest wrapping one.
#[derive(Debug, Clone)]
pub struct PipelineSource {
    pub pipeline: Value,
    pub options: PipelineOptions,
    /// `metadata.name` of a DataflowJob, if the file was one.
    pub manifest_name: Option<String>,
}

/// Renders Jinja, parses YAML, and unwraps a DataflowJob manifest.
pub fn parse_source(
    text: &str,
    vars: &Map<String, Value>,
) -> Result<PipelineSource, PipelineError> {
    let rendered = template::render(text, vars)?;
    let yaml: serde_norway::Value =
        serde_norway::from_str(&rendered).map_err(|e| PipelineError::Yaml(e.to_string()))?;
    let doc = yaml_to_json(yaml).map_err(PipelineError::Yaml)?;
    let Value::Object(mut top) = doc else {
        return Err(PipelineError::Yaml(
            "the file must be a mapping with 'pipeline:' (or a DataflowJob manifest)".into(),
        ));
    };
    let mut manifest_name = None;
    if top.get("kind").and_then(|k| k.as_str()) == Some("DataflowJob") {
        manifest_name = top
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(|n| n.as_str())
            .map(String::from);
        top = match top.remove("spec") {
            Some(Value::Object(spec)) => spec,
            _ => {
                return Err(PipelineError::Invalid(vec![Issue::new(
                    "DataflowJob has no 'spec' mapping",
                )]));
            }
        };
    }
    let pipeline = top
        .remove("pipeline")
        .ok_or_else(|| PipelineError::Invalid(vec![Issue::new("no 'pipeline:' found")]))?;
    let options = match top.remove("options") {
        None | Some(Value::Null) => PipelineOptions::default(),
        Some(v) => serde_json::from_value(v).map_err(|e| {
            PipelineError::Invalid(vec![Issue {
                transform: None,
                field: Some("options".into()),
                message: e.to_string(),
            }])
        })?,
    };
    Ok(PipelineSource {
        pipeline,
        options,
        manifest_name,
    })
}

/// Parses, validates and plans a pipeline file in one step.
pub fn load_plan(
    text: &str,
    vars: &Map<String, Value>,
    default_name: &str,
) -> Result<Plan, PipelineError> {
    let src = parse_source(text, vars)?;
    let graph = graph::build(&src.pipeline).map_err(PipelineError::Invalid)?;
    let name = src
        .options
        .job_name
        .clone()
        .or(src.manifest_name.clone())
        .unwrap_or_else(|| default_name.to_string());
    Ok(plan::plan(&name, src.options, graph))
}

/// YAML allows non-string keys and tags; pipelines use neither, so map them to JSON plainly.
fn yaml_to_json(v: serde_norway::Value) -> Result<Value, String> {
    use serde_norway::Value as Y;
    Ok(match v {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                serde_json::Number::from_f64(n.as_f64().unwrap_or(f64::NAN))
                    .map(Value::Number)
                    .unwrap_or(Value::Null)
            }
        }
        Y::String(s) => Value::String(s),
        Y::Sequence(s) => Value::Array(s.into_iter().map(yaml_to_json).collect::<Result<_, _>>()?),
        Y::Mapping(m) => {
            let mut o = Map::new();
            for (k, v) in m {
                let key = match k {
                    Y::String(s) => s,
                    Y::Number(n) => n.to_string(),
                    Y::Bool(b) => b.to_string(),
                    other => return Err(format!("unsupported mapping key {other:?}")),
                };
                o.insert(key, yaml_to_json(v)?);
            }
            Value::Object(o)
        }
        Y::Tagged(t) => yaml_to_json(t.value)?,
    })
}
