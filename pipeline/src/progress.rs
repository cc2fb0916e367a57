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
