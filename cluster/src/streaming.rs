//! A streaming job on the coordinator: the checkpoint loop (`streaming::driver`) runs here,
//! and each checkpoint's items run on the workers through the coordinator's API, exactly as a
//! batch job's do: the checkpoint's tracker is installed in the coordinator, the workers lease
//! its items (state shards go to the worker that holds them), and the loop commits and records
//! the checkpoint once every item is done. A coordinator that restarts resumes from the
//! checkpoint log, not from its progress log: the checkpoint in flight runs again as planned.
use riverbank_pipeline::{SnapshotTaken, StreamingProgress};
use riverbank_streaming::driver::{Control, StreamStatus, StreamingConfig};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// The streaming side of a coordinator.
pub struct Streaming {
    pub control: watch::Sender<Control>,
    pub status: Arc<Mutex<StreamStatus>>,
    /// The job's totals once it ended (elements out of every transform, files committed).
    pub summary: Mutex<Option<riverbank_engine::config::RunSummary>>,
    /// Where the checkpoint log and the state shards' checkpoints are.
    pub root: String,
    /// This run's id (`--run-id`), reported with its numbers.
    pub run_id: Option<String>,
    /// Snapshots taken by this run.
    pub snapshots: Mutex<Vec<SnapshotTaken>>,
    /// The snapshot a stop for an update keeps, once the loop has ended.
    pub stop_snapshot: Mutex<Option<String>>,
}

impl Streaming {
    pub fn new(root: String, run_id: Option<String>) -> Streaming {
        Streaming {
            control: watch::channel(Control::Run).0,
            status: Arc::new(Mutex::new(StreamStatus::default())),
            summary: Mutex::new(None),
            root,
            run_id,
            snapshots: Mutex::default(),
            stop_snapshot: Mutex::default(),
        }
    }

    /// Keeps the last completed checkpoint as snapshot `name` and lists it.
    pub async fn snapshot(&self, name: &str) -> Result<SnapshotTaken, String> {
        valid_snapshot_name(name)?;
        let record = riverbank_streaming::snapshot::take(&self.root, name)
            .await
            .map_err(|e| e.to_string())?;
        let taken = SnapshotTaken {
            name: name.to_string(),
            checkpoint: record.id,
            location: format!("{}/snapshots/{name}", self.root.trim_end_matches('/')),
            taken_at: chrono::Utc::now().to_rfc3339(),
        };
        let mut list = self.snapshots.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|s| s.name != name);
        list.push(taken.clone());
        tracing::info!(name, checkpoint = record.id, location = %taken.location, "snapshot taken");
        Ok(taken)
    }

    /// What `/v1/status` reports of it.
    pub fn progress(&self) -> StreamingProgress {
        let st = self
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut p = progress_of(&st);
        p.run_id = self.run_id.clone();
        p.snapshots = self
            .snapshots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        p.stopped = *self.control.borrow() == Control::Stop;
        p
    }
}

/// A snapshot's name becomes a directory: one path segment of safe characters.
pub fn valid_snapshot_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "snapshot name '{name}' must be 1 to 128 letters, digits, '-', '_' or '.', not starting with '.'"
        ))
    }
}

/// The numbers a streaming job reports, from the driver's status.
pub fn progress_of(st: &StreamStatus) -> StreamingProgress {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    let known = st.checkpoint > 0;
    let ended = st.watermark_us >= i64::MAX / 2;
    StreamingProgress {
        checkpoint: st.checkpoint,
        watermark: (known && !ended)
            .then(|| chrono::DateTime::from_timestamp_micros(st.watermark_us))
            .flatten()
            .map(|t| t.to_rfc3339())
            .or_else(|| ended.then(|| "end of time".to_string())),
        watermark_lag_seconds: (known && !ended)
            .then(|| (now - st.watermark_us).max(0) as f64 / 1e6),
        backlog_elements: st.backlog_elements,
        backlog_bytes: st.backlog_bytes,
        backlog_seconds: (st.throughput > 0.0).then(|| st.backlog_elements as f64 / st.throughput),
        throughput_elements_per_sec: st.throughput,
        elements_read: st.elements_read,
        late_elements_dropped: st.late_dropped,
        state_bytes: st.state_bytes,
        active_keys: st.active_keys,
        last_checkpoint_age_seconds: st.last_checkpoint.map(|t| t.elapsed().as_secs_f64()),
        last_checkpoint_ms: st.last_checkpoint_ms,
        draining: st.draining,
        rescales: st.rescales,
        last_rescale_pause_ms: st.last_rescale_pause_ms,
        ..StreamingProgress::default()
    }
}

/// The streaming config of a coordinator's job.
pub fn config(
    plan: &riverbank_pipeline::Plan,
    checkpoint_root: String,
    max_per_partition: u64,
    from_snapshot: Option<riverbank_streaming::driver::FromSnapshot>,
) -> StreamingConfig {
    StreamingConfig {
        interval: plan.options.effective_checkpoint_interval(),
        max_per_partition,
        checkpoint_root,
        from_snapshot,
    }
}
