//! What the console shows, as its JSON API serves it: what a feeder (the operator, `riverbank
//! run --ui`) reports about a job, and the fused stage graph drawn from its plan.
use riverbank_pipeline::display::{component_name, exchange_name};
use riverbank_pipeline::plan::stage_kind;
use riverbank_pipeline::{JobProgress, Plan};
use serde::{Deserialize, Serialize};

/// The fused stages as boxes and the shuffles between them as edges.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Graph {
    pub stages: Vec<GraphStage>,
    pub edges: Vec<GraphEdge>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GraphStage {
    /// `S00`: what [`JobProgress::stages`] names it.
    pub id: String,
    /// `F0`, Dataflow's fused stage name.
    pub name: String,
    pub kind: String,
    /// The fused transforms, as `riverbank plan` names them.
    pub components: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GraphEdge {
    pub from: String,
    pub to: String,
    pub collection: String,
    pub shuffle: String,
}

impl Graph {
    pub fn from_plan(plan: &Plan) -> Graph {
        let stages = plan
            .stages
            .iter()
            .map(|s| GraphStage {
                id: s.id(),
                name: s.name(),
                kind: stage_kind(plan, s).to_string(),
                components: s
                    .ops
                    .iter()
                    .map(|o| component_name(plan, o.transform, o.role))
                    .collect(),
            })
            .collect();
        let edges = plan
            .stages
            .iter()
            .flat_map(|s| {
                s.inputs.iter().flat_map(move |i| {
                    i.from_stages.iter().map(move |from| GraphEdge {
                        from: plan.stages[*from].id(),
                        to: s.id(),
                        collection: i.collection.clone(),
                        shuffle: exchange_name(&i.exchange).to_string(),
                    })
                })
            })
            .collect();
        Graph { stages, edges }
    }
}

/// One of Dataflow's insights about the job: what is wrong and what to do.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Insight {
    /// `MAX_NUM_WORKERS`, `LONG_WORK_ITEM`, ...
    pub code: String,
    #[serde(default)]
    pub subject: Option<String>,
    pub message: String,
    pub recommendation: String,
    /// RFC 3339, or seconds into a local run.
    pub since: String,
}

/// The autoscaler's last evaluation (`status.autoscaling.lastEvaluation`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Evaluation {
    pub time: String,
    /// ScaleUp, ScaleDown or Hold.
    pub decision: String,
    pub current_workers: u32,
    pub target_workers: u32,
    pub reason: String,
    pub message: String,
    #[serde(default)]
    pub dry_run: bool,
}

/// A Kubernetes Event of the job, or a local run's equivalent (a restart, a memory kill).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Unix seconds.
    pub time: f64,
    /// Normal or Warning.
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub message: String,
}

/// What a feeder knows of a job at one moment.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Observation {
    /// Pending, Running, Done, Failed, Cancelled (status.state).
    pub state: String,
    pub message: String,
    /// Unix seconds the job was created (its age).
    pub created: Option<f64>,
    pub current_workers: u32,
    pub target_workers: u32,
    pub streaming: bool,
    /// Set when the plan is known; kept from the last observation that had one.
    pub graph: Option<Graph>,
    /// The coordinator's progress, when it answered.
    pub progress: Option<JobProgress>,
    pub insights: Vec<Insight>,
    pub evaluation: Option<Evaluation>,
}

/// One worker's CPU and memory in a [`Sample`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkerSample {
    pub name: String,
    /// Fraction of its cores.
    pub cpu: f64,
    pub rss_bytes: u64,
}

/// One point of the job's charts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    /// Unix seconds.
    pub t: f64,
    pub workers: u32,
    pub target_workers: u32,
    pub throughput_bytes: f64,
    pub throughput_elements: f64,
    pub backlog_seconds: Option<f64>,
    pub remaining_bytes: u64,
    /// Streaming: how far the output watermark is behind wall time (data freshness).
    #[serde(default)]
    pub watermark_lag_seconds: Option<f64>,
    /// Streaming: source elements not read yet.
    #[serde(default)]
    pub backlog_elements: Option<u64>,
    /// Streaming: source bytes not read yet (what a Beam SDK job's sources say is left).
    #[serde(default)]
    pub backlog_bytes: Option<u64>,
    pub worker_samples: Vec<WorkerSample>,
}

/// An autoscaling decision that changed (or, in a dry run, would change) the worker count.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    pub t: f64,
    pub decision: String,
    pub from: u32,
    pub to: u32,
    pub reason: String,
    pub message: String,
}

/// A stage's rates between the job's last two samples.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct StageRate {
    pub id: String,
    pub elements_per_sec: f64,
    pub bytes_per_sec: f64,
}

/// A row of the job list (`kubectl get dfj`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobSummary {
    pub namespace: String,
    pub name: String,
    pub state: String,
    pub current_workers: u32,
    pub target_workers: u32,
    pub backlog_seconds: Option<f64>,
    pub progress: Option<f64>,
    pub created: Option<f64>,
    pub insights: Vec<String>,
}

/// The job page.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobDetail {
    pub summary: JobSummary,
    pub message: String,
    pub streaming: bool,
    pub graph: Graph,
    pub progress: Option<JobProgress>,
    pub stage_rates: Vec<StageRate>,
    pub history: Vec<Sample>,
    pub markers: Vec<Marker>,
    pub events: Vec<Event>,
    pub insights: Vec<Insight>,
    pub evaluation: Option<Evaluation>,
    /// Unix seconds of this answer (the charts' right edge).
    pub now: f64,
}
