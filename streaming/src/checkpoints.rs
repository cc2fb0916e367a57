//! The streaming job's checkpoint log in `tempLocation`: each checkpoint's *plan* (the offset
//! ranges it reads, its processing time, the watermarks before it) is written before it runs,
//! and its *record* (offsets and watermarks after it) once its output is committed. A job that
//! restarts resumes after the last recorded checkpoint, and replays a planned but unrecorded
//! one exactly as planned: the same reads and clocks give the same state and the same files,
//! so a checkpoint's output is committed once, whatever fails when.
use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use riverbank_io::location::{Resolved, resolve};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use std::collections::BTreeMap;

/// A source partition: (source transform, partition).
pub type PartitionId = (usize, u32);

/// What checkpoint `id` reads and with which clocks.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CheckpointPlan {
    pub id: u64,
    pub now_us: i64,
    /// The job's first start: the generators' element 0 without a `start`.
    pub start_us: i64,
    /// Shards of every keyed state (fixed for the job's life).
    pub shards: u32,
    /// (source, partition, from, until).
    pub reads: Vec<(usize, u32, u64, u64)>,
    /// Every partition's watermark before the checkpoint.
    pub watermarks: Vec<(usize, u32, i64)>,
    /// The drain's last checkpoint: nothing read, every watermark at the end of time.
    pub drain: bool,
    /// Every partition's offset before the checkpoint (a replay of a job's first checkpoint
    /// must not take "latest" again for the partitions it does not read).
    #[serde(default)]
    pub offsets: Vec<(usize, u32, u64)>,
}

/// Where checkpoint `id` left the sources. Sources and states go by transform name, so a
/// snapshot outlives the pipeline that wrote it (an update renames or adds transforms).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CheckpointRecord {
    pub id: u64,
    pub start_us: i64,
    pub shards: u32,
    /// (source transform, partition, next offset).
    pub offsets: Vec<(String, u32, u64)>,
    pub watermarks: Vec<(String, u32, i64)>,
    /// Every keyed state: (Combine transform, signature of its keys and accumulators).
    #[serde(default)]
    pub states: Vec<(String, String)>,
    /// Files committed by this checkpoint: (sink transform, files).
    pub committed: Vec<(String, Vec<String>)>,
    /// Windowed file sinks: the panes of their open windows so far.
    #[serde(default)]
    pub window_panes: super::window_files::WindowPanes,
    /// When it was recorded (microseconds since the epoch).
    pub at_us: i64,
    pub drained: bool,
}

impl CheckpointRecord {
    /// Offsets by source index in a plan whose transforms are named `names`.
    pub fn offsets(&self, names: &[String]) -> BTreeMap<PartitionId, u64> {
        by_index(&self.offsets, names)
    }

    pub fn watermarks(&self, names: &[String]) -> BTreeMap<PartitionId, i64> {
        by_index(&self.watermarks, names)
    }
}

fn by_index<T: Copy>(v: &[(String, u32, T)], names: &[String]) -> BTreeMap<PartitionId, T> {
    v.iter()
        .filter_map(|(n, p, x)| Some(((names.iter().position(|m| m == n)?, *p), *x)))
        .collect()
}

#[derive(Debug, thiserror::Error)]
#[error("checkpoint log {location}: {message}")]
pub struct LogError {
    pub location: String,
    pub message: String,
}

/// The log under `{root}/checkpoints/`.
pub struct CheckpointLog {
    root: Resolved,
    shown: String,
}

/// Where a restarted job picks up.
#[derive(Debug, Default)]
pub struct Resume {
    pub last: Option<CheckpointRecord>,
    /// Planned after the last record and never recorded: to run again as planned.
    pub pending: Option<CheckpointPlan>,
}

impl CheckpointLog {
    pub fn open(root: &str) -> Result<CheckpointLog, LogError> {
        let shown = format!("{}/checkpoints", root.trim_end_matches('/'));
        let root = resolve(&shown).map_err(|e| LogError {
            location: shown.clone(),
            message: e.to_string(),
        })?;
        Ok(CheckpointLog { root, shown })
    }

    pub async fn resume(&self) -> Result<Resume, LogError> {
        let prefix = self.root.path().map_err(|e| self.err(e))?;
        let names: Vec<String> = self
            .root
            .store
            .list(Some(&prefix))
            .map_ok(|m| m.location.filename().unwrap_or_default().to_string())
            .try_collect()
            .await
            .map_err(|e| self.err(e))?;
        let id_of = |suffix: &str| -> Option<u64> {
            names
                .iter()
                .filter_map(|n| n.strip_suffix(suffix)?.parse().ok())
                .max()
        };
        let last = match id_of(".done.json") {
            Some(id) => self.get(&format!("{id:010}.done.json")).await?,
            None => None,
        };
        let after = last.as_ref().map_or(0, |r: &CheckpointRecord| r.id);
        let pending = match id_of(".plan.json") {
            Some(id) if id > after => self.get(&format!("{id:010}.plan.json")).await?,
            _ => None,
        };
        Ok(Resume { last, pending })
    }

    pub async fn plan(&self, p: &CheckpointPlan) -> Result<(), LogError> {
        self.put(&format!("{:010}.plan.json", p.id), p).await
    }

    pub async fn record(&self, r: &CheckpointRecord) -> Result<(), LogError> {
        self.put(&format!("{:010}.done.json", r.id), r).await
    }

    async fn put<T: Serialize>(&self, name: &str, v: &T) -> Result<(), LogError> {
        let json = serde_json::to_vec_pretty(v).map_err(|e| self.err(e))?;
        let path = self.object(name)?;
        self.root
            .store
            .put(&path, PutPayload::from(json))
            .await
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    async fn get<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, LogError> {
        let path = self.object(name)?;
        let bytes = match self.root.store.get(&path).await {
            Ok(r) => r.bytes().await.map_err(|e| self.err(e))?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.err(e)),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| self.err(format!("{name}: {e}")))
    }

    fn object(&self, name: &str) -> Result<object_store::path::Path, LogError> {
        let key = if self.root.key.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.root.key.trim_end_matches('/'))
        };
        self.root.with_key(key).path().map_err(|e| self.err(e))
    }

    fn err(&self, e: impl std::fmt::Display) -> LogError {
        LogError {
            location: self.shown.clone(),
            message: e.to_string(),
        }
    }
}
