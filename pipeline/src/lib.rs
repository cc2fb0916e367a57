//! Riverbank's pipeline model: Beam YAML in, a validated graph and a serializable fused plan out.
//! No I/O, no async, no Kubernetes: every other crate speaks these types.
pub mod config;
pub mod display;
pub mod duration;
pub mod error;
pub mod graph;
pub mod options;
pub mod plan;
pub mod progress;
pub mod resources;
pub mod template;
pub mod trigger;
pub mod windowing;
pub mod yaml;

pub use error::{Issue, PipelineError};
pub use graph::{Graph, Transform};
pub use options::PipelineOptions;
pub use plan::{Exchange, Op, OpRole, Plan, Stage, StageInput};
pub use progress::{
    JobFailure, JobPhase, JobProgress, SnapshotRequest, SnapshotTaken, StageProgress, StopRequest,
    StreamingProgress, TransformProgress, UpdateCheck, UpdateVerdict, WorkItemProgress,
    WorkerProgress,
};
pub use resources::ResourceHints;

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
    // As Beam reads it: PyYAML's safe loader (YAML 1.1 scalars), see `yaml`.
    let doc = yaml::from_str(&rendered).map_err(PipelineError::Yaml)?;
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
