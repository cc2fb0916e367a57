//! A streaming job on the coordinator: the checkpoint loop (`riverbank_streaming::driver`) runs here,
//! and each checkpoint's items run on the workers through the coordinator's API, exactly as a
//! batch job's do: the checkpoint's tracker is installed in the coordinator, the workers lease
//! its items (state shards go to the worker that holds them), and the loop commits and records
//! the checkpoint once every item is done. A coordinator that restarts resumes from the
//! checkpoint log, not from its progress log: the checkpoint in flight runs again as planned.
use riverbank_pipeline::{SnapshotTaken, StageProgress, StreamingProgress};
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
    /// Each stage's counters over the checkpoints before the one installed now (each
    /// checkpoint has a tracker of its own): with the current one's, the stage's totals.
    pub past_stages: Mutex<Vec<StageCounters>>,
}

/// A stage's element and byte counters, summed over checkpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageCounters {
    pub elements_in: u64,
    pub elements_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl StageCounters {
    fn add(&mut self, s: &StageProgress) {
        self.elements_in += s.elements_in;
        self.elements_out += s.elements_out;
        self.bytes_in += s.bytes_in;
        self.bytes_out += s.bytes_out;
    }
}

/// Adds the stages of a checkpoint's tracker, about to be replaced, to `past`.
pub fn add_stages(past: &mut Vec<StageCounters>, stages: &[StageProgress]) {
    for s in stages {
        if past.len() <= s.index {
            past.resize(s.index + 1, StageCounters::default());
        }
        past[s.index].add(s);
    }
}

/// A streaming job's stages as its user sees them: counters over the whole run (the past
/// checkpoints' and the current one's), and Running until the job ends — a stage of a
/// stream is never done while the stream runs; its work items are the current checkpoint's.
pub fn stream_stages(
    stages: &mut [StageProgress],
    past: &[StageCounters],
    watermarks: &[Option<i64>],
    ended: bool,
) {
    let now = now_us();
    for s in stages {
        let mark = watermarks.get(s.index).copied().flatten();
        s.watermark = mark.and_then(watermark_text);
        // No lag before the first watermark (the minimum) nor after the last (the maximum).
        s.watermark_lag_seconds = mark
            .filter(|w| (i64::MIN / 2..i64::MAX / 2).contains(w))
            .map(|w| now.saturating_sub(w).max(0) as f64 / 1e6);
        if let Some(p) = past.get(s.index) {
            s.elements_in += p.elements_in;
            s.elements_out += p.elements_out;
            s.bytes_in += p.bytes_in;
            s.bytes_out += p.bytes_out;
        }
        if !ended {
            s.state = "Running".into();
        }
    }
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
            past_stages: Mutex::default(),
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

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// A watermark as reported: RFC 3339, or `end of time` past every window.
fn watermark_text(us: i64) -> Option<String> {
    if us >= i64::MAX / 2 {
        return Some("end of time".into());
    }
    chrono::DateTime::from_timestamp_micros(us).map(|t| t.to_rfc3339())
}

/// The numbers a streaming job reports, from the driver's status.
pub fn progress_of(st: &StreamStatus) -> StreamingProgress {
    let now = now_us();
    let known = st.checkpoint > 0;
    let ended = st.watermark_us >= i64::MAX / 2;
    StreamingProgress {
        checkpoint: st.checkpoint,
        watermark: (known || ended)
            .then(|| watermark_text(st.watermark_us))
            .flatten(),
        watermark_lag_seconds: (known && !ended && st.watermark_us > i64::MIN / 2)
            .then(|| now.saturating_sub(st.watermark_us).max(0) as f64 / 1e6),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(index: usize, state: &str, elements_in: u64) -> StageProgress {
        StageProgress {
            index,
            name: format!("S{index:02}"),
            state: state.into(),
            elements_in,
            elements_out: elements_in / 2,
            bytes_in: elements_in * 10,
            ..StageProgress::default()
        }
    }

    #[test]
    fn a_streams_stages_count_over_every_checkpoint_and_run_until_it_ends() {
        let mut past = vec![];
        add_stages(&mut past, &[stage(0, "Done", 100), stage(1, "Done", 40)]);
        add_stages(&mut past, &[stage(0, "Done", 60), stage(1, "Done", 20)]);
        let mut now = vec![stage(0, "Done", 10), stage(1, "Waiting", 0)];
        stream_stages(
            &mut now,
            &past,
            &[Some(1_704_067_200_000_000), Some(i64::MAX)],
            false,
        );
        assert_eq!(
            now.iter()
                .map(|s| (s.state.as_str(), s.elements_in, s.elements_out, s.bytes_in))
                .collect::<Vec<_>>(),
            [("Running", 170, 85, 1700), ("Running", 60, 30, 600)]
        );
        assert_eq!(
            (now[0].watermark.as_deref(), now[1].watermark.as_deref()),
            (Some("2024-01-01T00:00:00+00:00"), Some("end of time"))
        );
        assert!(now[0].watermark_lag_seconds.is_some_and(|l| l > 0.0));
        assert_eq!(now[1].watermark_lag_seconds, None);
        // Before its first watermark a stage's is the minimum: no lag (and no overflow).
        let mut waiting = vec![stage(0, "Waiting", 0)];
        stream_stages(&mut waiting, &[], &[Some(i64::MIN)], false);
        assert_eq!(
            (
                waiting[0].watermark.as_deref(),
                waiting[0].watermark_lag_seconds
            ),
            (None, None)
        );
        let mut ended = vec![stage(0, "Done", 0)];
        stream_stages(&mut ended, &past, &[], true);
        assert_eq!(
            (ended[0].state.as_str(), ended[0].elements_in),
            ("Done", 160)
        );
    }
}
