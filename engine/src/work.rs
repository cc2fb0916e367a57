//! The engine's work types, as the tracker, the work slots and the wire protocol share them:
//! an item handed out (`Assignment`), what it produced (`ItemReport`), what a worker asking for
//! work gets (`Lease`), why an attempt did not succeed (`ItemFailure`), and the handle between a
//! running item and its supervisor (`ItemControl`).
use super::items::WorkItem;
use super::shuffle::{ShuffleFile, ShuffleRef};
use crate::error::RunError;
use riverbank_io as io;
use riverbank_pipeline::{JobFailure, JobPhase};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64};

/// Who is asking for or reporting work. A lease belongs to one *incarnation* of a worker: a
/// process restarted under the same name (a pod's container restarted in place, a StatefulSet
/// pod replaced) is a new incarnation, and whatever the old one held runs again.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct WorkerId {
    pub worker: String,
    /// Unique per process start (empty in process: its loops never restart).
    #[serde(default)]
    pub incarnation: String,
    /// `host:port` where the worker serves its shuffle files (empty in process).
    pub address: String,
}

impl WorkerId {
    /// A worker of the in-process run.
    pub fn local(name: &str) -> WorkerId {
        WorkerId {
            worker: name.to_string(),
            ..WorkerId::default()
        }
    }
}

/// An item handed to a worker, with where to find its input.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Assignment {
    pub item: WorkItem,
    pub attempt: u32,
    /// For each input of the stage (in the stage's order): the files to read, in order.
    pub inputs: Vec<Vec<ShuffleRef>>,
    /// Streaming: the checkpoint the item belongs to, with its clocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointCtx>,
    /// A sink's commit stage: the temp parts the sink's writers reported, to commit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commit: Vec<io::TempPart>,
}

/// Each source partition's watermark: (source transform, partition) → microseconds.
pub type SourceWatermarks = std::collections::BTreeMap<(usize, u32), i64>;

/// A streaming checkpoint as its items see it. Everything an item computes depends only on its
/// input and this, so a checkpoint replayed after a failure computes the same output and state.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CheckpointCtx {
    /// Checkpoint number, from 1; state is restored as of `id - 1`.
    pub id: u64,
    /// The event-time watermark when the checkpoint started: data behind it is late.
    pub watermark_in: i64,
    /// The watermark once the checkpoint's reads are done: windows fire against it (set by
    /// the tracker when the reads are done).
    pub watermark: i64,
    /// Processing time of the checkpoint (microseconds since the epoch), for processing-time
    /// triggers; fixed so that a replay fires the same panes.
    pub now_us: i64,
    /// The job's first start (microseconds since the epoch): generator sources without a
    /// `start` begin there.
    pub start_us: i64,
    /// Where the state shards' checkpoints go (`{tempLocation}/{job}/state`).
    pub state_prefix: String,
    /// Keyed states (their transforms' names) that the checkpoint before this one does not
    /// hold: a Combine added by an update. Their shards start empty instead of restoring a
    /// checkpoint that was never taken.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub new_states: Vec<String>,
    /// File reads with a `refresh_interval` that this checkpoint reads again (by name): the
    /// Sql and Join that keep their rows replace the rows of the read before with these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refreshed: Vec<String>,
}

impl CheckpointCtx {
    /// The checkpoint the state of transform `name` is restored as of (0: it starts empty).
    pub fn restore_from(&self, name: &str) -> u64 {
        if self.new_states.iter().any(|n| n == name) {
            0
        } else {
            self.id - 1
        }
    }
}

/// What a successful item produced.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ItemReport {
    pub shuffle: Vec<ShuffleFile>,
    /// (sink transform, temp part).
    pub sink_parts: Vec<(usize, io::TempPart)>,
    /// (transform, elements out).
    pub elements_out: Vec<(usize, u64)>,
    pub rows_read: u64,
    pub bytes_read: u64,
    pub bundles: u64,
    pub bundle_retries: u64,
    pub spills: u64,
    /// Distinct keys its final combine produced (0 when it has none).
    #[serde(default)]
    pub keys: u64,
    /// An item of coalesced partitions: the keys of each, (partition, keys).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partition_keys: Vec<(u32, u64)>,
    /// Streaming reads: (source transform, partition, watermark promised after this read).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub watermarks: Vec<(usize, u32, i64)>,
    /// Streaming: elements dropped as later than the allowed lateness.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub late_dropped: u64,
    /// Streaming: bytes of the state shard it kept, and of its checkpoint upload.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub state_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub checkpoint_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Shared between a running item and whoever supervises it.
#[derive(Default)]
pub struct ItemControl {
    /// Stop as soon as possible (the job failed or was cancelled, or the lease was lost).
    pub cancelled: AtomicBool,
    /// The coordinator asked for the unread remainder to be split off.
    pub split_requested: AtomicBool,
    pub units_started: AtomicU64,
    pub units_total: AtomicU64,
    /// Keys held by the item's final combine now (its active keys).
    pub keys: AtomicU64,
}

/// A running attempt's progress, as heartbeats report it.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct AttemptProgress {
    pub item: u64,
    pub attempt: u32,
    pub units_started: u64,
    pub units_total: u64,
    /// Keys held by its final combine (0 when it has none).
    #[serde(default)]
    pub keys: u64,
}

/// Decides a proposed split: `Some(true)` when the coordinator took the residual.
pub type SplitProposer =
    dyn Fn(io::Split, io::Split) -> futures::future::BoxFuture<'static, bool> + Send + Sync;

/// What a worker asking for work gets.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub enum Lease {
    Work(Box<Assignment>),
    /// Nothing runnable now; ask again shortly.
    Wait,
    /// The job is over.
    Finished(JobPhase),
}

/// Why an item attempt did not succeed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub enum ItemFailure {
    /// The data or the pipeline is at fault (bundle retries exhausted, an assertion): the job fails.
    Fatal(JobFailure),
    /// An input file of `producer` could not be read: recompute it, retry this item.
    ShuffleLost { producer: u64, message: String },
    /// The worker gave the item back (cancelled, shutting down).
    Released,
}

impl ItemFailure {
    /// How the coordinator treats an attempt that ended with `e`.
    pub fn of(e: &RunError) -> ItemFailure {
        match e {
            RunError::Cancelled => ItemFailure::Released,
            RunError::ShuffleLost {
                producer, message, ..
            } => ItemFailure::ShuffleLost {
                producer: *producer,
                message: message.clone(),
            },
            e => ItemFailure::Fatal(failure_of(e)),
        }
    }
}

/// The job-level description of an error: which transform, what, on which record.
pub fn failure_of(e: &RunError) -> JobFailure {
    let (transform, record, attempts) = match e {
        RunError::BundleRetriesExhausted {
            attempts, source, ..
        } => {
            let inner = failure_of(source);
            (inner.transform, inner.record, *attempts)
        }
        RunError::Transform {
            transform, record, ..
        } => (Some(transform.clone()), record.clone(), 1),
        RunError::Combine { transform, .. } | RunError::Assertion { transform, .. } => {
            (Some(transform.clone()), None, 1)
        }
        _ => (None, None, 1),
    };
    JobFailure {
        transform,
        message: e.to_string(),
        record,
        attempts,
    }
}
