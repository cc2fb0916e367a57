//! One work slot: lease an item, run it, report it, until the job is over or the slot is told
//! to stop. The same loop serves the in-process run and the worker processes; only the
//! [`WorkSource`] differs (the tracker behind a mutex, or the coordinator over HTTP), so both
//! treat every outcome alike and give the same bytes by construction.
use super::exec::{ExecContext, execute};
use super::items::ItemInput;
use super::shuffle::ShuffleFile;
use super::work::{Assignment, AttemptProgress, ItemControl, ItemReport, Lease, SplitProposer};
use crate::compiled::CompiledTransform;
use crate::error::RunError;
use crate::metrics::Metrics;
use riverbank_io::{self as io, Split, TempPart};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;

/// Where a slot gets work and reports it.
pub trait WorkSource: Send + Sync + 'static {
    type Error: Send;

    /// The next item for this slot. `Wait` after waiting a little for work to appear (so a
    /// caller may loop on it without spinning).
    fn lease(&self) -> impl Future<Output = Result<Lease, Self::Error>> + Send;

    /// The attempt succeeded. `false`: another attempt counts, and this one's output is to be
    /// discarded. With it, maybe the slot's next lease (a source that leases over the network
    /// saves a round trip so).
    fn complete(
        &self,
        a: &Assignment,
        report: ItemReport,
    ) -> impl Future<Output = Result<(bool, Option<Lease>), Self::Error>> + Send;

    /// The attempt failed with `error`.
    fn fail(
        &self,
        a: &Assignment,
        error: RunError,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Offers to keep `keep` of a running item and give `give` away; `true` if taken.
    fn split(
        &self,
        item: u64,
        attempt: u32,
        keep: Split,
        give: Split,
    ) -> impl Future<Output = bool> + Send;
}

/// The attempts running in one process, with the handles their supervisors use: progress for
/// heartbeats, split and stop requests from the coordinator.
#[derive(Default)]
pub struct RunningItems(Mutex<HashMap<(u64, u32), Arc<ItemControl>>>);

impl RunningItems {
    fn lock(&self) -> MutexGuard<'_, HashMap<(u64, u32), Arc<ItemControl>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn start(&self, a: &Assignment) -> Arc<ItemControl> {
        let control = Arc::new(ItemControl::default());
        self.lock().insert((a.item.id, a.attempt), control.clone());
        control
    }

    fn end(&self, a: &Assignment) {
        self.lock().remove(&(a.item.id, a.attempt));
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// What a heartbeat reports.
    pub fn snapshot(&self) -> Vec<AttemptProgress> {
        self.lock()
            .iter()
            .map(|(&(item, attempt), c)| AttemptProgress {
                item,
                attempt,
                units_started: c.units_started.load(Ordering::SeqCst),
                units_total: c.units_total.load(Ordering::SeqCst),
                keys: c.keys.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Asks the running attempts of these items to split off their unread remainder.
    pub fn request_splits(&self, items: impl IntoIterator<Item = u64>) {
        let running = self.lock();
        for id in items {
            for (_, c) in running.iter().filter(|((i, _), _)| *i == id) {
                c.split_requested.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Stops these attempts (their lease was given away).
    pub fn cancel(&self, attempts: impl IntoIterator<Item = (u64, u32)>) {
        let running = self.lock();
        for key in attempts {
            if let Some(c) = running.get(&key) {
                c.cancelled.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Stops every running attempt (the job is over, or failed here).
    pub fn cancel_all(&self) {
        for c in self.lock().values() {
            c.cancelled.store(true, Ordering::SeqCst);
        }
    }
}

/// Runs one slot until the source says the job is over or `stop` turns true. A slot that is
/// running an item when told to stop finishes it first (a drain).
pub async fn run_slot<S: WorkSource>(
    source: Arc<S>,
    ctx: Arc<ExecContext>,
    running: Arc<RunningItems>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), S::Error> {
    // A lease that came with the last report.
    let mut next: Option<Lease> = None;
    loop {
        if *stop.borrow() {
            if let Some(Lease::Work(a)) = next.take() {
                source.fail(&a, RunError::Cancelled).await?; // given back unstarted
            }
            return Ok(());
        }
        let lease = match next.take() {
            Some(lease) => lease,
            None => tokio::select! {
                lease = source.lease() => lease?,
                _ = stop.wait_for(|stop| *stop) => return Ok(()),
            },
        };
        let a = match lease {
            Lease::Finished(_) => return Ok(()),
            Lease::Wait => continue,
            Lease::Work(a) => *a,
        };
        let control = running.start(&a);
        let proposer: Box<SplitProposer> = {
            let (source, key) = (source.clone(), (a.item.id, a.attempt));
            Box::new(move |keep, give| {
                let source = source.clone();
                Box::pin(async move { source.split(key.0, key.1, keep, give).await })
            })
        };
        tracing::debug!(
            item = a.item.id,
            attempt = a.attempt,
            stage = a.item.stage,
            "running"
        );
        let started = std::time::Instant::now();
        let result = execute(&ctx, &a, &control, &proposer).await;
        tracing::debug!(item = a.item.id, took = ?started.elapsed(), ok = result.is_ok(), "ran");
        // The attempt stays listed in the heartbeats until its report is in: a heartbeat in
        // between that did not list it would have the coordinator give it to another worker
        // (two attempts of a state shard writing the same checkpoint) when the report is slow.
        match result {
            Ok(report) => {
                let (shuffle, parts) = (report.shuffle.clone(), report.sink_parts.clone());
                let reported = source.complete(&a, report).await;
                running.end(&a);
                let (accepted, then) = reported?;
                next = then;
                if accepted {
                    if matches!(a.item.input, ItemInput::Read { .. }) {
                        Metrics::add(&ctx.metrics.splits_done, 1);
                    }
                } else {
                    discard(&ctx, shuffle, parts).await;
                }
            }
            Err(e) => {
                let reported = source.fail(&a, e).await;
                running.end(&a);
                reported?
            }
        }
    }
}

/// Removes what a finished attempt wrote when another attempt's report counts instead: its
/// shuffle files and its sink temp parts.
async fn discard(ctx: &ExecContext, shuffle: Vec<ShuffleFile>, parts: Vec<(usize, TempPart)>) {
    let files: std::collections::BTreeSet<String> = shuffle.into_iter().map(|f| f.path).collect();
    for f in files {
        let _ = tokio::fs::remove_file(ctx.shuffle_root.join(f)).await;
    }
    for (t, p) in parts {
        if let CompiledTransform::Write { options, .. } = &ctx.plan.transforms[t] {
            io::abort_sink(options, vec![p]).await;
        }
    }
}
