//! `riverbank run` without a cluster: the coordinator's tracker and `slots` work slots in one
//! process, shuffling through files under the spill directory. The same slot loop, items,
//! orders, merges and sink finish as a distributed run, so both give byte-identical results.
use super::exec::ExecContext;
use super::finish::{abort_sinks, commit_sinks};
use super::items::StageShape;
use super::shuffle::LocalFetch;
use super::slot::{RunningItems, WorkSource, run_slot};
use super::tracker::Tracker;
use super::work::{Assignment, ItemFailure, ItemReport, Lease, WorkerId};
use crate::compiled::{CompiledPlan, CompiledTransform};
use crate::config::{RunConfig, RunSummary};
use crate::error::RunError;
use crate::metrics::Metrics;
use crate::shards::StateShards;
use riverbank_io::Split;
use riverbank_pipeline::JobProgress;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The in-process coordinator: the tracker and what the slots share.
struct Local {
    tracker: Mutex<Tracker>,
    /// Signalled whenever an item ends or splits: work may have become runnable.
    notify: Notify,
    running: Arc<RunningItems>,
    metrics: Arc<Metrics>,
    first_error: Mutex<Option<RunError>>,
}

impl Local {
    fn tracker(&self) -> MutexGuard<'_, Tracker> {
        self.tracker.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The in-process heartbeat: progress into the tracker, split requests out to the items.
    fn sync(&self, t: &mut Tracker) {
        for p in self.running.snapshot() {
            t.progress_of(&p);
        }
        self.running
            .request_splits(t.take_split_requests().into_iter().map(|(id, _)| id));
    }

    /// Keeps the root cause: a real error wins over the internal echoes it causes.
    fn record(&self, e: RunError) {
        let mut g = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        let replace = match &*g {
            None => true,
            Some(RunError::Internal(_)) => !matches!(e, RunError::Internal(_)),
            Some(_) => false,
        };
        if replace {
            *g = Some(e);
        }
        self.running.cancel_all();
    }
}

/// One in-process slot's view of the coordinator.
struct InProcess {
    local: Arc<Local>,
    id: WorkerId,
}

impl WorkSource for InProcess {
    type Error = RunError;

    async fn lease(&self) -> Result<Lease, RunError> {
        let lease = {
            let mut t = self.local.tracker();
            self.local.sync(&mut t);
            t.seen(&self.id, Instant::now());
            t.coalesce(Instant::now());
            let lease = t.lease(&self.id, Instant::now());
            for (m, state) in self.local.metrics.stages.iter().zip(t.stage_states()) {
                m.state.store(state, Ordering::Relaxed);
            }
            if matches!(lease, Lease::Wait) && t.all_done() {
                // Everything ran: the caller commits, no need for a terminal phase first.
                Lease::Finished(t.phase())
            } else {
                lease
            }
        };
        if matches!(lease, Lease::Wait) {
            let _ =
                tokio::time::timeout(Duration::from_millis(20), self.local.notify.notified()).await;
        }
        Ok(lease)
    }

    async fn complete(
        &self,
        a: &Assignment,
        report: ItemReport,
    ) -> Result<(bool, Option<Lease>), RunError> {
        let accepted = self
            .local
            .tracker()
            .complete(&self.id, a.item.id, a.attempt, report, Instant::now())
            .accepted();
        self.local.notify.notify_waiters();
        // A lease costs nothing here: the slot asks for it next.
        Ok((accepted, None))
    }

    async fn fail(&self, a: &Assignment, error: RunError) -> Result<(), RunError> {
        let failure = ItemFailure::of(&error);
        if matches!(failure, ItemFailure::Fatal(_)) {
            self.local.record(error);
        }
        self.local
            .tracker()
            .fail(a.item.id, a.attempt, failure, Instant::now());
        self.local.notify.notify_waiters();
        Ok(())
    }

    async fn split(&self, item: u64, attempt: u32, keep: Split, give: Split) -> bool {
        let accepted = self
            .local
            .tracker()
            .propose_split(item, attempt, keep, give, Instant::now())
            .accepted();
        if accepted {
            // The residual is one more split for the progress display.
            Metrics::add(&self.local.metrics.splits_total, 1);
            self.local.notify.notify_waiters();
        }
        accepted
    }
}

/// Called with the job's progress (as a coordinator would serve it) every
/// [`OBSERVE_INTERVAL`] while an in-process run goes on: what `riverbank run --ui` shows.
pub type ProgressObserver = Arc<dyn Fn(JobProgress) + Send + Sync>;

pub const OBSERVE_INTERVAL: Duration = Duration::from_millis(250);

/// Runs a compiled plan to completion and commits its sinks.
pub async fn run(
    plan: CompiledPlan,
    cfg: RunConfig,
    metrics: Arc<Metrics>,
) -> Result<RunSummary, RunError> {
    run_observed(plan, cfg, metrics, None).await
}

/// [`run`], telling `observer` the progress while it runs.
pub async fn run_observed(
    plan: CompiledPlan,
    cfg: RunConfig,
    metrics: Arc<Metrics>,
    observer: Option<ProgressObserver>,
) -> Result<RunSummary, RunError> {
    let start = Instant::now();
    let plan = Arc::new(plan);
    let tracker = Tracker::new(
        plan.clone(),
        cfg.shuffle_partitions,
        Duration::from_secs(3600),
        start,
    )
    .coalescing(cfg.coalesce_bytes);
    for s in &plan.plan.stages {
        if tracker.stage_shape(s.index) == StageShape::Read
            && let CompiledTransform::Read { source, .. } = &plan.transforms[s.ops[0].transform]
        {
            Metrics::add(&metrics.splits_total, source.splits.len() as u64);
            Metrics::add(
                &metrics.estimated_input_bytes,
                source.splits.iter().map(|s| s.estimated_bytes).sum(),
            );
        }
    }
    let (tracker, first_error) =
        run_items_observed(tracker, &cfg, metrics.clone(), None, None, observer).await;
    let (parts, all_done, counts) = (
        tracker.sink_parts(),
        tracker.all_done(),
        tracker.elements_out(),
    );
    if first_error.is_some() || !all_done {
        abort_sinks(&plan, parts, &cfg.job_token).await;
        return Err(first_error
            .unwrap_or_else(|| RunError::Internal("the run stopped before finishing".into())));
    }
    // Every item succeeded: commit each sink, once.
    let files = commit_sinks(&plan, parts, &cfg.job_token)
        .await
        .map_err(|e| RunError::Io(e.source))?;
    for (t, n) in counts.iter().enumerate() {
        metrics.elements_out[t].store(*n, Ordering::Relaxed);
    }
    Ok(RunSummary {
        wall: start.elapsed(),
        elements_out: plan
            .plan
            .graph
            .transforms
            .iter()
            .zip(counts)
            .map(|(t, n)| (t.name.clone(), n))
            .collect(),
        files,
    })
}

/// Runs every item of `tracker` on `cfg.slots` in-process slots, shuffling through files under
/// the spill directory; gives the tracker back with the first error, if any. A streaming
/// checkpoint is one such run; `cancel` turning true stops it (`RunError::Cancelled`).
pub async fn run_items(
    tracker: Tracker,
    cfg: &RunConfig,
    metrics: Arc<Metrics>,
    shards: Option<Arc<dyn StateShards>>,
    cancel: Option<tokio::sync::watch::Receiver<bool>>,
) -> (Tracker, Option<RunError>) {
    run_items_observed(tracker, cfg, metrics, shards, cancel, None).await
}

/// [`run_items`], telling `observer` the progress while the items run.
async fn run_items_observed(
    tracker: Tracker,
    cfg: &RunConfig,
    metrics: Arc<Metrics>,
    shards: Option<Arc<dyn StateShards>>,
    cancel: Option<tokio::sync::watch::Receiver<bool>>,
    observer: Option<ProgressObserver>,
) -> (Tracker, Option<RunError>) {
    let plan = tracker.plan().clone();
    let job_name = plan.plan.job_name.clone();
    let shuffle_root = cfg
        .spill_dir
        .join(format!("riverbank-{}-shuffle", cfg.job_token));
    let ctx = Arc::new(ExecContext {
        plan,
        cfg: cfg.clone(),
        shuffle_root: shuffle_root.clone(),
        metrics: metrics.clone(),
        fetch: Arc::new(LocalFetch(shuffle_root.clone())),
        footers: Default::default(),
        shards,
        compress_shuffle: false,
    });
    let local = Arc::new(Local {
        tracker: Mutex::new(tracker),
        notify: Notify::new(),
        running: Arc::new(RunningItems::default()),
        metrics: metrics.clone(),
        first_error: Mutex::new(None),
    });
    let observing = observer.map(|observe| {
        let (local, name) = (local.clone(), job_name);
        tokio::spawn(async move {
            loop {
                let p = {
                    let mut t = local.tracker();
                    local.sync(&mut t);
                    t.progress(&name, Instant::now())
                };
                observe(p);
                tokio::time::sleep(OBSERVE_INTERVAL).await;
            }
        })
    });
    // Nothing stops an in-process slot from outside: a fatal error cancels the running items
    // and ends the job in the tracker, and the slots see it at their next lease.
    let (_stop, stop) = tokio::sync::watch::channel(false);
    let mut slots = tokio::task::JoinSet::new();
    for w in 0..cfg.slots.max(1) {
        let source = Arc::new(InProcess {
            local: local.clone(),
            id: WorkerId::local(&format!("local-{w}")),
        });
        slots.spawn(run_slot(
            source,
            ctx.clone(),
            local.running.clone(),
            stop.clone(),
        ));
    }
    let canceller = cancel.map(|mut cancel| {
        let local = local.clone();
        tokio::spawn(async move {
            if cancel.wait_for(|c| *c).await.is_ok() {
                local.record(RunError::Cancelled);
                local.tracker().cancel(Instant::now());
            }
        })
    });
    while let Some(r) = slots.join_next().await {
        let error = match r {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e,
            Err(e) => RunError::Internal(format!("a work slot panicked: {e}")),
        };
        local.record(error);
        local.tracker().cancel(Instant::now());
    }
    // Awaited, not only aborted: an observer caught in `observe` (on another runtime thread)
    // still holds `local` until its next await, and `Arc::into_inner` below needs the last one.
    if let Some(task) = observing {
        task.abort();
        let _ = task.await;
    }
    if let Some(c) = canceller {
        c.abort();
        let _ = c.await;
    }
    let _ = std::fs::remove_dir_all(&shuffle_root);
    drop(ctx);
    let first_error = local
        .first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    let local = Arc::into_inner(local).expect("the slots are gone");
    let tracker = local
        .tracker
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    (tracker, first_error)
}
