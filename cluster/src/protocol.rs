//! The coordinator's HTTP/JSON API, as both sides see it. Workers pull: they ask for work,
//! report progress in heartbeats (and learn there which item to split), and report each
//! attempt's outcome. Every request names the worker and where it serves its shuffle files.
use riverbank_engine::config::BundleChaos;
pub use riverbank_engine::work::WorkerId;
use riverbank_engine::work::{AttemptProgress, ItemFailure, ItemReport, Lease};
use riverbank_io::Split;
use riverbank_pipeline::JobPhase;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `GET /v1/job`: what every worker must agree on with the coordinator.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct JobConfig {
    pub job_name: String,
    /// Names temp files and shuffle directories of this job (stable across coordinator restarts).
    pub job_token: String,
    pub shuffle_partitions: u32,
    pub max_attempts: u32,
    pub batch_size: usize,
    pub memory_limit: usize,
    #[serde(default)]
    pub chaos: BundleChaos,
}

/// `GET /v1/compiled`: the plan as the coordinator compiled it (sources narrowed to the fields
/// used), its sources' schemas and its PyTransforms' outputs, so workers compile without
/// listing the input or asking Beam's Python SDK again.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CompiledJob {
    pub plan: riverbank_pipeline::Plan,
    /// (transform index, Arrow schema as an IPC stream with no batches).
    pub sources: Vec<(usize, Vec<u8>)>,
    /// (transform index, output schema as above, output window fn) of each PyTransform.
    #[serde(default)]
    pub py_outputs: Vec<(usize, Vec<u8>, riverbank_pipeline::windowing::WindowFn)>,
}

impl CompiledJob {
    pub fn new(
        plan: &riverbank_engine::compile::CompiledPlan,
    ) -> Result<CompiledJob, arrow::error::ArrowError> {
        use riverbank_engine::compile::CompiledTransform;
        let (mut sources, mut py_outputs) = (vec![], vec![]);
        for (i, t) in plan.transforms.iter().enumerate() {
            match t {
                CompiledTransform::Read { source, .. } => {
                    sources.push((i, schema_bytes(&source.schema)?));
                }
                CompiledTransform::PyTransform {
                    output_schema,
                    output_window,
                    ..
                } => py_outputs.push((i, schema_bytes(output_schema)?, *output_window)),
                _ => {}
            }
        }
        Ok(CompiledJob {
            plan: plan.plan.clone(),
            sources,
            py_outputs,
        })
    }

    /// What the coordinator compiled, as a worker's compile takes it.
    pub fn known(&self) -> Result<riverbank_engine::compile::Known, arrow::error::ArrowError> {
        let sources = self
            .sources
            .iter()
            .map(|(i, bytes)| Ok((*i, schema_of(bytes)?)))
            .collect::<Result<_, arrow::error::ArrowError>>()?;
        let py_outputs = self
            .py_outputs
            .iter()
            .map(|(i, bytes, window)| {
                let output = riverbank_engine::python_sdk::PyOutput {
                    schema: schema_of(bytes)?,
                    window: *window,
                };
                Ok((*i, output))
            })
            .collect::<Result<_, arrow::error::ArrowError>>()?;
        Ok(riverbank_engine::compile::Known {
            sources,
            py_outputs,
        })
    }
}

/// A schema as an Arrow IPC stream with no batches.
fn schema_bytes(schema: &arrow::datatypes::Schema) -> Result<Vec<u8>, arrow::error::ArrowError> {
    let mut w = arrow::ipc::writer::StreamWriter::try_new(Vec::new(), schema)?;
    w.finish()?;
    w.into_inner()
}

fn schema_of(bytes: &[u8]) -> Result<arrow::datatypes::SchemaRef, arrow::error::ArrowError> {
    let r = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)?;
    Ok(r.schema())
}

/// `POST /v1/heartbeat`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Heartbeat {
    #[serde(flatten)]
    pub from: WorkerId,
    pub running: Vec<AttemptProgress>,
    pub cpu: f64,
    pub rss: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct HeartbeatReply {
    pub phase: JobPhase,
    /// Items to split (dynamic work rebalancing).
    pub split: Vec<u64>,
    /// Attempts that are no longer current (the lease was given away): stop them.
    pub stale: Vec<(u64, u32)>,
}

/// `POST /v1/complete`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Completion {
    #[serde(flatten)]
    pub from: WorkerId,
    pub item: u64,
    pub attempt: u32,
    pub report: ItemReport,
    /// The slot that ran it wants its next item in the reply (one round trip per item
    /// instead of two).
    #[serde(default)]
    pub then_lease: bool,
}

/// Answer to complete.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CompletionReply {
    pub accepted: bool,
    /// With `then_lease`: the slot's next item, or the end of the job; none when nothing is
    /// runnable now (the slot then waits in a lease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Lease>,
}

/// `POST /v1/fail`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AttemptFailed {
    #[serde(flatten)]
    pub from: WorkerId,
    pub item: u64,
    pub attempt: u32,
    pub failure: ItemFailure,
}

/// `POST /v1/split`: the worker offers to keep `keep` and give `give` away.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SplitOffer {
    #[serde(flatten)]
    pub from: WorkerId,
    pub item: u64,
    pub attempt: u32,
    pub keep: Split,
    pub give: Split,
}

/// Answer to complete and split.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Accepted {
    pub accepted: bool,
}

/// `GET /v1/summary`: what a finished job produced.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
pub struct Summary {
    /// (transform, elements out), in plan order.
    pub elements_out: Vec<(String, u64)>,
    /// (sink, committed files).
    pub files: Vec<(String, Vec<String>)>,
    /// Work items finished per worker.
    pub items_per_worker: BTreeMap<String, u64>,
    /// Items created by dynamic splitting.
    pub dynamic_splits: u64,
    pub rows_read: u64,
    pub bytes_read: u64,
    /// Bytes written to shuffle files by the finished items (each read once by a consumer).
    pub shuffle_bytes: u64,
}
