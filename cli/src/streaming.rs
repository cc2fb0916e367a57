//! `riverbank run` of a streaming job in this process: checkpoints until the sources end or the
//! user stops it. Ctrl-C (or SIGTERM) drains: reading stops, every window fires, the output is
//! committed and the run exits 0. A second Ctrl-C cancels: nothing further is committed.
use crate::progress;
use anyhow::{Result, bail};
use riverbank_engine::{Metrics, RunConfig, RunError, compile};
use riverbank_pipeline::Plan;
use riverbank_streaming::driver::{self, Control, StreamStatus, StreamingConfig};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How `run` runs a streaming job.
pub(crate) struct StreamingRun {
    pub(crate) checkpoint_dir: Option<String>,
    pub(crate) checkpoint_interval: Option<f64>,
    pub(crate) max_per_partition: u64,
    pub(crate) show_progress: bool,
    pub(crate) from_snapshot: Option<driver::FromSnapshot>,
}

pub(crate) fn run(plan: Plan, cfg: RunConfig, s: StreamingRun) -> Result<()> {
    let root = s
        .checkpoint_dir
        .or_else(|| {
            plan.options
                .temp_location
                .as_ref()
                .map(|t| format!("{}/{}", t.trim_end_matches('/'), plan.job_name))
        })
        .unwrap_or_else(|| format!(".riverbank/{}", plan.job_name));
    let interval = s
        .checkpoint_interval
        .map(Duration::from_secs_f64)
        .unwrap_or_else(|| plan.options.effective_checkpoint_interval());
    let scfg = StreamingConfig {
        interval,
        max_per_partition: s.max_per_partition.max(1),
        checkpoint_root: root.clone(),
        from_snapshot: s.from_snapshot.clone(),
    };
    let rt = crate::runtime(cfg.slots)?;
    rt.block_on(async move {
        let compiled = compile(plan, cfg.batch_size)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let metrics = Arc::new(Metrics::new(
            compiled.plan.graph.transforms.len(),
            compiled.plan.stages.len(),
        ));
        let (tx, rx) = watch::channel(Control::Run);
        tokio::spawn(stop_on_signals(tx));
        let status = Arc::new(Mutex::new(StreamStatus::default()));
        eprintln!(
            "streaming: checkpoints every {:.1}s in {root}; Ctrl-C drains, a second Ctrl-C cancels",
            interval.as_secs_f64()
        );
        let shown = s.show_progress.then(|| tokio::spawn(show(status.clone())));
        let result = driver::run(compiled, cfg, scfg, metrics.clone(), rx, status.clone()).await;
        if let Some(h) = shown {
            h.abort();
        }
        match result {
            Ok(summary) => {
                let st = status.lock().unwrap_or_else(|p| p.into_inner()).clone();
                eprintln!(
                    "drained after checkpoint {}: {} elements read, {} late elements dropped",
                    st.checkpoint, st.elements_read, st.late_dropped
                );
                progress::print_summary(&summary, &metrics);
                Ok(())
            }
            Err(RunError::Cancelled) => {
                bail!("cancelled: nothing after the last checkpoint was committed")
            }
            Err(e) => bail!("{e}"),
        }
    })
}

/// `riverbank snapshot`: the job's last completed checkpoint, kept under `name`.
pub(crate) fn snapshot(checkpoint_dir: &str, name: &str) -> Result<()> {
    let rt = crate::runtime(1)?;
    let r = rt
        .block_on(riverbank_streaming::snapshot::take(checkpoint_dir, name))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!(
        "snapshot '{name}' of checkpoint {} ({} keyed states, {} source partitions): {}/snapshots/{name}",
        r.id,
        r.states.len(),
        r.offsets.len(),
        checkpoint_dir.trim_end_matches('/')
    );
    Ok(())
}

/// `riverbank snapshot --coordinator`: a running job's last completed checkpoint, kept under
/// `name` by its coordinator (the job runs on).
pub(crate) fn snapshot_through(address: &str, name: &str) -> Result<()> {
    let rt = crate::runtime(1)?;
    let client = riverbank_cluster::client::CoordinatorClient::new(address, Duration::from_secs(5));
    let request = riverbank_pipeline::SnapshotRequest {
        name: name.to_string(),
    };
    let taken: riverbank_pipeline::SnapshotTaken = rt
        .block_on(client.post("/v1/job/snapshot", &request))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!(
        "snapshot '{}' of checkpoint {}: {}",
        taken.name, taken.checkpoint, taken.location
    );
    println!("{}", taken.location);
    Ok(())
}

/// `riverbank update`: the check, the stop and the snapshot of an update, through the running
/// job's coordinator. Prints the snapshot's location for `run --from-snapshot`.
pub(crate) fn update(
    address: &str,
    plan: Plan,
    transform_name_mapping: std::collections::BTreeMap<String, String>,
    check_only: bool,
) -> Result<()> {
    use riverbank_pipeline::{JobProgress, StopRequest, UpdateCheck, UpdateVerdict};
    let rt = crate::runtime(1)?;
    let client = riverbank_cluster::client::CoordinatorClient::new(address, Duration::from_secs(5));
    rt.block_on(async {
        let check = UpdateCheck {
            plan,
            transform_name_mapping,
        };
        let verdict: UpdateVerdict = client
            .post("/v1/job/update-check", &check)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if !verdict.compatible {
            bail!(
                "the update is refused, the job runs on: {}",
                verdict.reason.unwrap_or_default()
            );
        }
        eprintln!("the new pipeline can take the job's state");
        if check_only {
            return Ok(());
        }
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let name = format!("update-{secs}");
        let _: JobProgress = client
            .post(
                "/v1/job/stop",
                &StopRequest {
                    snapshot: name.clone(),
                },
            )
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        eprintln!("stopping after the checkpoint under way");
        loop {
            let p: JobProgress = client
                .get("/v1/status?wait_ms=1000")
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            if !p.phase.is_terminal() {
                continue;
            }
            let taken = p
                .streaming
                .iter()
                .flat_map(|s| &s.snapshots)
                .find(|s| s.name == name);
            return match taken {
                Some(t) => {
                    eprintln!(
                        "stopped at checkpoint {}; start the new pipeline with --from-snapshot {}",
                        t.checkpoint, t.location
                    );
                    println!("{}", t.location);
                    Ok(())
                }
                None => bail!(
                    "the job ended ({:?}: {}) without a snapshot of its state",
                    p.phase,
                    p.message
                ),
            };
        }
    })
}

/// First Ctrl-C or SIGTERM: drain. Second: cancel.
async fn stop_on_signals(tx: watch::Sender<Control>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return;
    };
    let mut n = 0;
    loop {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        n += 1;
        let next = if n == 1 {
            Control::Drain
        } else {
            Control::Cancel
        };
        eprintln!(
            "{}",
            if n == 1 {
                "draining: no more reads; firing every window (Ctrl-C again to cancel)"
            } else {
                "cancelling"
            }
        );
        let _ = tx.send(next);
    }
}

/// One line per checkpoint: lag, watermark delay, throughput, state, checkpoint age.
async fn show(status: Arc<Mutex<StreamStatus>>) {
    let mut last = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let st = status.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if st.checkpoint == last {
            continue;
        }
        last = st.checkpoint;
        eprintln!("{}", line(&st));
    }
}

fn line(st: &StreamStatus) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    let watermark = if st.watermark_us >= i64::MAX / 2 {
        "end of time".to_string()
    } else {
        format!("{:.1}s behind", (now - st.watermark_us).max(0) as f64 / 1e6)
    };
    format!(
        "checkpoint {}: backlog {} elements ({}), watermark {watermark}, {:.0} elements/s, state {} in {} windows, late dropped {}, took {} ms",
        st.checkpoint,
        st.backlog_elements,
        progress::human_bytes(st.backlog_bytes),
        st.throughput,
        progress::human_bytes(st.state_bytes),
        st.active_keys,
        st.late_dropped,
        st.last_checkpoint_ms,
    )
}
