//! The job's progress as the coordinator reports it (`GET /v1/status` on its port, JSON) and as
//! the operator and the autoscaler read it. A wire contract between processes: add fields with
//! `#[serde(default)]`, never rename them.
use serde::{Deserialize, Serialize};

/// Where a distributed job stands. The coordinator decides the terminal states.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobPhase {
    /// The coordinator is up; no worker has registered yet.
    Pending,
    /// Work items are being processed.
    Running,
    /// Every stage finished and every sink committed.
    Done,
    /// A bundle failed `max_attempts` times, or a sink could not commit.
    Failed,
    /// Stopped on request; sinks were aborted.
    Cancelled,
}

impl JobPhase {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobPhase::Done | JobPhase::Failed | JobPhase::Cancelled
        )
    }
}

/// The error that failed a job: which transform, what went wrong, on which record.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct JobFailure {
    pub transform: Option<String>,
    pub message: String,
    /// The failing record, rendered as JSON, when the error came from one.
    pub record: Option<String>,
    /// How many times the failing bundle was attempted.
    pub attempts: u32,
}

/// The whole job's progress.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobProgress {
    pub job_name: String,
    pub phase: JobPhase,
    /// One human-readable line: what the job is doing, or why it stopped.
    pub message: String,
    #[serde(default)]
    pub failure: Option<JobFailure>,
    /// RFC 3339.
    #[serde(default)]
    pub started_at: Option<String>,
    #[serde(default)]
    pub finished_at: Option<String>,
    /// Work items of all stages known so far (stages not yet started count as estimated).
    pub work_items_total: u64,
    pub work_items_done: u64,
    pub work_items_running: u64,
    /// Fraction of the job's estimated work done, 0 to 1.
    pub fraction_consumed: f64,
    /// Estimated bytes still to process in the running and pending stages.
    pub remaining_bytes: u64,
    /// Bytes processed per second by the job, averaged over the last 30 s.
    pub throughput_bytes_per_sec: f64,
    /// Elements read by the sources per second, averaged over the last 30 s.
    #[serde(default)]
    pub throughput_elements_per_sec: f64,
    /// remaining_bytes / throughput: Dataflow's backlog time. None until throughput is known.
    #[serde(default)]
    pub backlog_seconds: Option<f64>,
    /// Distinct keys in the running shuffle stages, when known.
    #[serde(default)]
    pub active_keys: Option<u64>,
    /// Work items that could run now: pending items of runnable stages.
    #[serde(default)]
    pub runnable_items: u64,
    /// Running source items with unread units left to give away: each can feed one more worker
    /// by dynamic splitting. With no runnable items either, more workers would idle: parallelism
    /// is capped (unsplittable input, fixed shard counts, fewer items than workers).
    #[serde(default)]
    pub splittable_items: u64,
    #[serde(default)]
    pub workers: Vec<WorkerProgress>,
    #[serde(default)]
    pub stages: Vec<StageProgress>,
    /// Work items worth a look: the running ones, longest-running first (at most
    /// [`MAX_REPORTED_ITEMS`]), then unfinished ones that failed before (lost with their worker,
    /// or their input lost). What the LONG_WORK_ITEM and STUCK insights read.
    #[serde(default)]
    pub work_items: Vec<WorkItemProgress>,
    /// Streaming jobs: watermark, backlog, state and checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streaming: Option<StreamingProgress>,
}

impl JobProgress {
    /// A job in `phase` saying `message`, before anything is counted.
    pub fn new(job_name: &str, phase: JobPhase, message: &str) -> JobProgress {
        JobProgress {
            job_name: job_name.to_string(),
            phase,
            message: message.to_string(),
            failure: None,
            started_at: None,
            finished_at: None,
            work_items_total: 0,
            work_items_done: 0,
            work_items_running: 0,
            fraction_consumed: 0.0,
            remaining_bytes: 0,
            throughput_bytes_per_sec: 0.0,
            throughput_elements_per_sec: 0.0,
            backlog_seconds: None,
            active_keys: None,
            runnable_items: 0,
            splittable_items: 0,
            workers: Vec::new(),
            stages: Vec::new(),
            work_items: Vec::new(),
            streaming: None,
        }
    }
}

/// A streaming job's numbers (Dataflow's data freshness, backlog and state; Flink's checkpoints).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct StreamingProgress {
    /// The last completed checkpoint (0: none yet).
    pub checkpoint: u64,
    /// The output watermark, RFC 3339 (absent before the first checkpoint; the end of time
    /// once drained).
    #[serde(default)]
    pub watermark: Option<String>,
    /// How far the watermark is behind wall time, seconds (data freshness).
    #[serde(default)]
    pub watermark_lag_seconds: Option<f64>,
    /// Source offsets not read yet, over all partitions, and their estimated bytes.
    pub backlog_elements: u64,
    pub backlog_bytes: u64,
    /// Backlog over throughput, seconds.
    #[serde(default)]
    pub backlog_seconds: Option<f64>,
    pub throughput_elements_per_sec: f64,
    pub elements_read: u64,
    pub late_elements_dropped: u64,
    /// Bytes of the state shards on the workers' disks.
    pub state_bytes: u64,
    /// Windows (key and window) held in state.
    pub active_keys: u64,
    /// Seconds since the last checkpoint completed.
    #[serde(default)]
    pub last_checkpoint_age_seconds: Option<f64>,
    /// How long the last checkpoint took, from its start to its commit.
    pub last_checkpoint_ms: u64,
    pub draining: bool,
    /// Times the workers changed; the last rescale's pause (its first checkpoint's length,
    /// shard moves included), milliseconds.
    #[serde(default)]
    pub rescales: u64,
    #[serde(default)]
    pub last_rescale_pause_ms: Option<u64>,
    /// The run these numbers come from (`coordinator --run-id`): an updated job's new pipeline
    /// runs under a new id, so a caller can tell its numbers from the old run's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Snapshots this run took, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotTaken>,
    /// The job stopped after a checkpoint with its state kept (for an update), instead of
    /// draining or cancelling.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
}

/// A named snapshot of a streaming job: its last completed checkpoint, copied aside.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotTaken {
    pub name: String,
    /// The checkpoint it holds.
    pub checkpoint: u64,
    /// Where it is: what a new job's `--from-snapshot` (`fromSnapshot.location`) takes.
    pub location: String,
    /// RFC 3339.
    pub taken_at: String,
}

/// `POST /v1/job/snapshot`: keep the last completed checkpoint under `name`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRequest {
    pub name: String,
}

/// `POST /v1/job/stop`: finish the checkpoint under way, start no other, keep the state (no
/// drain: windows stay open) and snapshot it as `snapshot`: the first step of an update.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StopRequest {
    pub snapshot: String,
}

/// `POST /v1/job/update-check`: could `plan` continue this job, keeping its state?
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpdateCheck {
    pub plan: crate::Plan,
    /// Renamed transforms, old name to new (an empty new name drops a state).
    #[serde(default)]
    pub transform_name_mapping: std::collections::BTreeMap<String, String>,
}

/// The answer to an [`UpdateCheck`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpdateVerdict {
    pub compatible: bool,
    /// Why not, naming the transform.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// At most this many running items are listed in [`JobProgress::work_items`] (a job with a
/// thousand workers runs thousands at once; the longest-running are the interesting ones).
pub const MAX_REPORTED_ITEMS: usize = 64;

/// One work item as the coordinator last heard of it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct WorkItemProgress {
    pub item: u64,
    /// Index of its stage.
    pub stage: usize,
    /// Running or Pending (waiting to run again after a failed attempt).
    pub state: String,
    /// The worker running it.
    #[serde(default)]
    pub worker: Option<String>,
    /// RFC 3339: when its current attempt started.
    #[serde(default)]
    pub started_at: Option<String>,
    /// Seconds its current attempt has been running.
    #[serde(default)]
    pub running_secs: f64,
    /// Attempts started so far (1 for a first attempt).
    #[serde(default)]
    pub attempts: u32,
    /// Attempts that ended without a result: lost with their worker (a crash, an OOM kill),
    /// or failed on their input. Bundle retries inside an attempt are not counted here.
    #[serde(default)]
    pub failures: u32,
    /// What ended the last failed attempt.
    #[serde(default)]
    pub last_failure: Option<String>,
    /// The shuffle partition it reads, for items of a shuffle stage.
    #[serde(default)]
    pub partition: Option<u32>,
    /// Keys its final combine holds now (0 when it has none).
    #[serde(default)]
    pub keys: u64,
}

/// One worker as the coordinator last heard of it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct WorkerProgress {
    /// The worker's name (pod name, or `worker-N` locally).
    pub name: String,
    /// Where it serves shuffle data.
    pub address: String,
    pub alive: bool,
    pub items_done: u64,
    pub items_running: u64,
    /// CPU use over the last heartbeat interval, as a fraction of the cores it may use.
    pub cpu: f64,
    pub rss_bytes: u64,
    /// Seconds since its last heartbeat.
    pub last_seen_secs: f64,
    /// Set while the worker is draining (asked to stop taking work before it leaves).
    #[serde(default)]
    pub draining: bool,
}

/// One fused stage.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct StageProgress {
    pub index: usize,
    pub name: String,
    /// Waiting, Running or Done.
    pub state: String,
    pub items_total: u64,
    pub items_done: u64,
    pub items_running: u64,
    pub elements_in: u64,
    pub elements_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Median seconds of the stage's finished items (those the coordinator saw run).
    #[serde(default)]
    pub median_item_secs: Option<f64>,
    /// Items of the stage finished so far whose duration is known.
    #[serde(default)]
    pub timed_items: u64,
    /// Bundles of finished items that failed and were retried.
    #[serde(default)]
    pub bundle_retries: u64,
    /// The stage's fused transforms in order, with their element counts from finished items.
    #[serde(default)]
    pub transforms: Vec<TransformProgress>,
    /// Streaming: the watermark the stage fires against (its own upstream sources'), RFC
    /// 3339, or `end of time` once they are exhausted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<String>,
    /// How far that watermark is behind wall time, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark_lag_seconds: Option<f64>,
    /// Distinct keys of the stage's final combine (running items, and finished ones).
    #[serde(default)]
    pub keys: Option<u64>,
    /// The share of the stage's input carried by its busiest key, when known. For a shuffle
    /// stage this is a lower bound from its partitions: the largest share of the shuffled
    /// bytes one partition receives, divided by the keys in it (exact for a one-key partition).
    #[serde(default)]
    pub hottest_key_share: Option<f64>,
}

/// One fused transform (op) of a stage.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TransformProgress {
    /// As `riverbank plan` and status.stages name it (`SumPerZone/PartialCombine`).
    pub name: String,
    /// Elements it received from the ops before it in the stage; None for the stage's first
    /// op, or one that reads a shuffle.
    #[serde(default)]
    pub elements_in: Option<u64>,
    pub elements_out: u64,
    /// The ops of the same stage that consume its output (fused after it).
    #[serde(default)]
    pub fused_consumers: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_tolerates_missing_optional_fields() {
        let text = r#"{"jobName":"j","phase":"Running","message":"m","workItemsTotal":4,
            "workItemsDone":1,"workItemsRunning":2,"fractionConsumed":0.25,"remainingBytes":10,
            "throughputBytesPerSec":5.0}"#;
        let p: JobProgress = serde_json::from_str(text).unwrap();
        assert_eq!(p.phase, JobPhase::Running);
        assert!(p.workers.is_empty() && p.backlog_seconds.is_none());
        let again: JobProgress = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(again, p);
        assert!(!p.phase.is_terminal() && JobPhase::Failed.is_terminal());
    }
}
