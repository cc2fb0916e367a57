//! `riverbank run` without a cluster: the coordinator's tracker and `partitions` worker loops in
//! one process, shuffling through files under the spill directory. The same items, orders and
//! merges as a distributed run, so both give byte-identical results.
use super::exec::{ExecContext, ItemControl, SplitProposer, execute};
use super::items::StageShape;
use super::shuffle::LocalFetch;
use super::tracker::{ItemFailure, Lease, Tracker};
use crate::compile::{CompiledPlan, CompiledTransform};
use crate::error::RunError;
use crate::io;
use crate::metrics::Metrics;
use crate::runner::{RunConfig, RunSummary};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

struct Local {
    tracker: Mutex<Tracker>,
    notify: Notify,
    /// Running attempts: (item, attempt) → control.
    controls: Mutex<HashMap<(u64, u32), Arc<ItemControl>>>,
    first_error: Mutex<Option<RunError>>,
}

impl Local {
    fn tracker(&self) -> MutexGuard<'_, Tracker> {
        self.tracker.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves progress into the tracker and split requests out to the running items.
    fn sync(&self, t: &mut Tracker) {
        let controls = self.controls.lock().unwrap_or_else(|p| p.into_inner());
        for (&(id, attempt), c) in controls.iter() {
            t.progress_of(
                id,
                attempt,
                c.units_started.load(Ordering::SeqCst),
                c.units_total.load(Ordering::SeqCst),
            );
        }
        for key in t.take_split_requests() {
            if let Some(c) = controls.get(&key) {
                c.split_requested.store(true, Ordering::SeqCst);
            }
        }
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
        for c in self
            .controls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            c.cancelled.store(true, Ordering::SeqCst);
        }
    }
}

/// Runs a compiled plan to completion and commits its sinks.
pub async fn run(
    plan: CompiledPlan,
    cfg: RunConfig,
    metrics: Arc<Metrics>,
) -> Result<RunSummary, RunError> {
    let start = Instant::now();
    let plan = Arc::new(plan);
    let shuffle_root = cfg
        .spill_dir
        .join(format!("riverbank-{}-shuffle", cfg.job_token));
    let workers = cfg.partitions.max(1);
    let tracker = Tracker::new(
        plan.clone(),
        cfg.shuffle_partitions,
        cfg.max_attempts,
        Duration::from_secs(3600),
        start,
    );
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
    let ctx = Arc::new(ExecContext {
        plan: plan.clone(),
        cfg: cfg.clone(),
        shuffle_root: shuffle_root.clone(),
        metrics: metrics.clone(),
        fetch: Arc::new(LocalFetch(shuffle_root.clone())),
    });
    let local = Arc::new(Local {
        tracker: Mutex::new(tracker),
        notify: Notify::new(),
        controls: Mutex::new(HashMap::new()),
        first_error: Mutex::new(None),
    });
    let mut loops = tokio::task::JoinSet::new();
    for w in 0..workers {
        let (ctx, local) = (ctx.clone(), local.clone());
        loops.spawn(async move { worker_loop(&format!("local-{w}"), &ctx, &local).await });
    }
    while let Some(r) = loops.join_next().await {
        if let Err(e) = r {
            local.record(RunError::Internal(format!("a worker task panicked: {e}")));
            local.tracker().cancel(Instant::now());
        }
    }
    let _ = std::fs::remove_dir_all(&shuffle_root);

    let (mut parts, all_done, counts) = {
        let t = local.tracker();
        (t.sink_parts(), t.all_done(), t.elements_out())
    };
    let first_error = local
        .first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    let writes: Vec<(usize, &io::WriteOptions, &arrow::datatypes::SchemaRef)> = plan
        .transforms
        .iter()
        .enumerate()
        .filter_map(|(t, ct)| match ct {
            CompiledTransform::Write { options, schema } => Some((t, options, schema)),
            _ => None,
        })
        .collect();
    if first_error.is_some() || !all_done {
        for (t, options, _) in writes {
            io::abort_sink(options, parts.remove(&t).unwrap_or_default()).await;
            io::cleanup_temp(options, &cfg.job_token).await;
        }
        return Err(first_error
            .unwrap_or_else(|| RunError::Internal("the run stopped before finishing".into())));
    }
    // Every item succeeded: commit each sink, once.
    let mut files = vec![];
    for (t, options, schema) in writes {
        let written = io::commit_sink(
            options,
            Some(schema.clone()),
            parts.remove(&t).unwrap_or_default(),
        )
        .await;
        io::cleanup_temp(options, &cfg.job_token).await;
        files.push((plan.plan.graph.transforms[t].name.clone(), written?));
    }
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

async fn worker_loop(name: &str, ctx: &Arc<ExecContext>, local: &Arc<Local>) {
    loop {
        let lease = {
            let mut t = local.tracker();
            local.sync(&mut t);
            let lease = t.lease(name, "", Instant::now());
            for (m, state) in ctx.metrics.stages.iter().zip(t.stage_states()) {
                m.state.store(state, Ordering::Relaxed);
            }
            if matches!(lease, Lease::Wait) && t.all_done() {
                Lease::Finished(t.phase())
            } else {
                lease
            }
        };
        let a = match lease {
            Lease::Finished(_) => return,
            Lease::Wait => {
                let _ =
                    tokio::time::timeout(Duration::from_millis(20), local.notify.notified()).await;
                continue;
            }
            Lease::Work(a) => a,
        };
        let control = Arc::new(ItemControl::default());
        let key = (a.item.id, a.attempt);
        local
            .controls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, control.clone());
        let proposer: Box<SplitProposer> = {
            let (local, metrics) = (local.clone(), ctx.metrics.clone());
            Box::new(move |keep, give| {
                let accepted = local
                    .tracker()
                    .propose_split(key.0, key.1, keep, give, Instant::now())
                    .is_some();
                if accepted {
                    // The residual is one more split for the progress display.
                    Metrics::add(&metrics.splits_total, 1);
                    local.notify.notify_waiters();
                }
                Box::pin(async move { accepted })
            })
        };
        let began = Instant::now();
        let result = execute(ctx, &a, &control, &proposer).await;
        tracing::debug!(
            item = a.item.id,
            stage = a.item.stage,
            ms = began.elapsed().as_secs_f64() * 1e3,
            ok = result.is_ok(),
            "item finished"
        );
        local
            .controls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        let now = Instant::now();
        match result {
            Ok(report) => {
                let is_read = matches!(a.item.input, super::items::ItemInput::Read { .. });
                if local
                    .tracker()
                    .complete(name, "", a.item.id, a.attempt, report, now)
                    .is_some()
                    && is_read
                {
                    Metrics::add(&ctx.metrics.splits_done, 1);
                }
            }
            Err(e) => {
                let failure = ItemFailure::of(&e);
                if matches!(failure, ItemFailure::Fatal(_)) {
                    local.record(e);
                }
                local.tracker().fail(a.item.id, a.attempt, failure, now);
            }
        }
        local.notify.notify_waiters();
    }
}
