//! A streaming job in one process: a loop of checkpoints. Each checkpoint reads the sources'
//! new offsets (at most `max_per_partition` per partition), runs the pipeline's items over them
//! on the same engine as a batch job (source items, shuffles, state shards), commits the sinks'
//! output under the checkpoint's name, and records where the sources stand. A checkpoint is
//! the unit of exactly-once: planned before it runs, recorded after its output is committed,
//! and replayed as planned after a failure (see `checkpoints`).
//!
//! Control: `Drain` stops reading, advances every watermark to the end of time, fires every
//! window and ends the job; `Cancel` stops at once and commits nothing further.
use super::checkpoints::{CheckpointLog, CheckpointPlan, CheckpointRecord, PartitionId};
use riverbank_engine::compile::{CompiledPlan, CompiledTransform};
use riverbank_engine::config::{RunConfig, RunSummary};
use riverbank_engine::error::RunError;
use riverbank_engine::items::StreamReads;
use riverbank_engine::local::run_items;
use riverbank_engine::metrics::Metrics;
use riverbank_engine::tracker::Tracker;
use riverbank_engine::work::CheckpointCtx;
use riverbank_io::unbounded::{END_OF_TIME, StreamSource};
use riverbank_io::{self as io, Split, SplitKind};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Checkpoints between collections of old checkpoint files.
const GC_EVERY: u64 = 10;

/// What the user asks of a running streaming job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    Run,
    /// Stop reading, fire every window, commit, end.
    Drain,
    /// Stop at once; commit nothing further.
    Cancel,
    /// Finish the checkpoint under way and start no other: the state stays as that checkpoint
    /// left it (windows open), for an update to continue from. Ends as a cancel does.
    Stop,
}

/// How the checkpoints go.
#[derive(Clone, Debug)]
pub struct StreamingConfig {
    pub interval: Duration,
    /// Most elements a partition reads in one checkpoint (bounds a checkpoint's size when a
    /// backlog is caught up): that many offsets, more where offsets are sparse
    /// (`offset_cap`).
    pub max_per_partition: u64,
    /// `tempLocation`-like root of the checkpoint log and the state shards' checkpoints.
    pub checkpoint_root: String,
    /// Start a new job from this snapshot (ignored once the job has checkpoints of its own).
    pub from_snapshot: Option<FromSnapshot>,
}

/// `--from-snapshot`: where the snapshot is, and the update's renames (old → new name).
#[derive(Clone, Debug, Default)]
pub struct FromSnapshot {
    pub path: String,
    pub transform_name_mapping: BTreeMap<String, String>,
}

/// The job as a live display and the coordinator's status show it.
#[derive(Clone, Debug, Default)]
pub struct StreamStatus {
    pub checkpoint: u64,
    /// The output watermark (minimum over partitions), microseconds.
    pub watermark_us: i64,
    /// Offsets not read yet, over all partitions, and their estimated bytes.
    pub backlog_elements: u64,
    pub backlog_bytes: u64,
    /// Elements read per second over the last checkpoint.
    pub throughput: f64,
    pub elements_read: u64,
    pub late_dropped: u64,
    pub state_bytes: u64,
    /// Windows (key, window) held in state.
    pub active_keys: u64,
    pub last_checkpoint: Option<Instant>,
    pub last_checkpoint_ms: u64,
    pub files_committed: u64,
    pub draining: bool,
    /// Source bytes read per second over the last checkpoint (elements × their mean size).
    pub throughput_bytes: f64,
    /// Times the workers changed, and how long the first checkpoint after the last change
    /// took: the rescale's pause (shards moved through their checkpoints meanwhile).
    pub rescales: u64,
    pub last_rescale_pause_ms: Option<u64>,
    /// The workers of the last checkpoint.
    pub workers: Vec<String>,
}

pub use crate::shards::state_dir;

/// What a checkpoint's run of items left: the driver commits and records from it.
pub struct Checkpointed {
    pub parts: BTreeMap<usize, Vec<io::TempPart>>,
    /// Every source partition's watermark after the reads, and their minimum.
    pub watermarks: Option<(riverbank_engine::work::SourceWatermarks, i64)>,
    pub elements_out: Vec<u64>,
    pub late_dropped: u64,
    pub state_bytes: u64,
    pub active_keys: u64,
    /// The workers that took work (their shards are where they are now).
    pub workers: Vec<String>,
    /// The first error, or why the items did not all finish.
    pub error: Option<RunError>,
}

impl Checkpointed {
    pub fn of(tracker: &Tracker, error: Option<RunError>) -> Checkpointed {
        let reports: Vec<_> = tracker.done_reports().collect();
        let shards: Vec<_> = reports.iter().filter(|r| r.state_bytes > 0).collect();
        Checkpointed {
            parts: tracker.sink_parts(),
            watermarks: tracker.watermarks(),
            elements_out: tracker.elements_out(),
            late_dropped: reports.iter().map(|r| r.late_dropped).sum(),
            state_bytes: shards.iter().map(|r| r.state_bytes).sum(),
            active_keys: shards.iter().map(|r| r.keys).sum(),
            workers: tracker.live_workers(),
            error: error.or_else(|| {
                (!tracker.all_done()).then(|| {
                    RunError::Internal("a checkpoint stopped before its items ended".into())
                })
            }),
        }
    }
}

/// Runs one checkpoint's items: in this process, or on a coordinator's workers.
pub trait CheckpointRunner: Send + Sync {
    /// Names the temporary files of checkpoint `id`.
    fn job_token(&self, id: u64) -> String;
    /// Runs every item of `tracker`; `cancel` turning true stops them.
    fn run(
        &self,
        tracker: Tracker,
        id: u64,
        cancel: watch::Receiver<bool>,
    ) -> impl std::future::Future<Output = Checkpointed> + Send;
}

/// The in-process runner: the work slots of this process.
pub struct InProcess {
    pub cfg: RunConfig,
    pub metrics: Arc<Metrics>,
    pub job_name: String,
}

impl CheckpointRunner for InProcess {
    fn job_token(&self, id: u64) -> String {
        // Named after the job and the checkpoint: a replay first removes what a killed
        // attempt of the same checkpoint left.
        format!("{}-c{id}", self.job_name)
    }

    async fn run(&self, tracker: Tracker, id: u64, cancel: watch::Receiver<bool>) -> Checkpointed {
        let cfg = RunConfig {
            job_token: self.job_token(id),
            ..self.cfg.clone()
        };
        let shards = crate::shards::StreamingShards::of_job(&cfg, &self.job_name);
        let (tracker, error) = run_items(
            tracker,
            &cfg,
            self.metrics.clone(),
            Some(shards),
            Some(cancel),
        )
        .await;
        Checkpointed::of(&tracker, error)
    }
}

/// Runs a streaming plan in this process until it is drained, cancelled, or its sources end.
pub async fn run(
    plan: CompiledPlan,
    cfg: RunConfig,
    scfg: StreamingConfig,
    metrics: Arc<Metrics>,
    control: watch::Receiver<Control>,
    status: Arc<Mutex<StreamStatus>>,
) -> Result<RunSummary, RunError> {
    let runner = InProcess {
        job_name: plan.plan.job_name.clone(),
        cfg: cfg.clone(),
        metrics: metrics.clone(),
    };
    let shards = cfg.shuffle_partitions;
    drive(
        Arc::new(plan),
        &runner,
        shards,
        scfg,
        metrics,
        control,
        status,
    )
    .await
}

/// The checkpoint loop, whoever runs the items.
pub async fn drive(
    plan: Arc<CompiledPlan>,
    runner: &impl CheckpointRunner,
    shards: u32,
    scfg: StreamingConfig,
    metrics: Arc<Metrics>,
    mut control: watch::Receiver<Control>,
    status: Arc<Mutex<StreamStatus>>,
) -> Result<RunSummary, RunError> {
    let started = Instant::now();
    let log = CheckpointLog::open(&scfg.checkpoint_root)
        .map_err(|e| RunError::Internal(e.to_string()))?;
    let mut resume = log
        .resume()
        .await
        .map_err(|e| RunError::Internal(e.to_string()))?;
    if let Some(snap) = &scfg.from_snapshot
        && resume.last.is_none()
        && resume.pending.is_none()
    {
        let r = super::snapshot::restore(
            &snap.path,
            &scfg.checkpoint_root,
            &plan,
            shards,
            &snap.transform_name_mapping,
        )
        .await
        .map_err(|e| RunError::Internal(e.to_string()))?;
        tracing::info!(checkpoint = r.id, snapshot = %snap.path, "started from a snapshot");
        resume = log
            .resume()
            .await
            .map_err(|e| RunError::Internal(e.to_string()))?;
    }
    let start_us = resume
        .last
        .as_ref()
        .map(|r| r.start_us)
        .or(resume.pending.as_ref().map(|p| p.start_us))
        .unwrap_or_else(now_us);
    if let Some(r) = &resume.last
        && r.shards != shards
    {
        return Err(RunError::Internal(format!(
            "the job's state has {} shards; it cannot resume with {shards} (keep --shuffle-partitions)",
            r.shards
        )));
    }
    let mut sources: Vec<(usize, StreamSource)> = vec![];
    for (t, ct) in plan.transforms.iter().enumerate() {
        if let CompiledTransform::ReadStream(r) = ct {
            let name = &plan.plan.graph.transforms[t].name;
            sources.push((t, StreamSource::of(&r.spec, name, start_us)?));
        }
    }
    // Where a job without a checkpoint starts: a generator at 0, a log at its earliest or
    // latest offset (`auto.offset.reset`).
    let mut offsets: BTreeMap<PartitionId, u64> = BTreeMap::new();
    let mut watermarks: BTreeMap<PartitionId, i64> = BTreeMap::new();
    for (e, t, s) in ends_of(&sources, now_us()).await? {
        offsets.insert((t, e.partition), s.initial_offset(&e));
        watermarks.insert((t, e.partition), s.initial_watermark(e.partition));
    }
    let mut last_id = 0;
    let names: Vec<String> = plan
        .plan
        .graph
        .transforms
        .iter()
        .map(|t| t.name.clone())
        .collect();
    if let Some(r) = &resume.last {
        offsets.extend(r.offsets(&names));
        watermarks.extend(r.watermarks(&names));
        last_id = r.id;
        if r.drained {
            return Err(RunError::Internal(format!(
                "the job was drained at checkpoint {}: start it from a new tempLocation",
                r.id
            )));
        }
        check_states(&r.states, &plan, &scfg.checkpoint_root, r.id)?;
        tracing::info!(checkpoint = r.id, "resuming after the last checkpoint");
    }
    // The keyed states the last checkpoint holds (none before the first): a Combine the
    // pipeline has beyond them (added by an update) starts empty.
    let signatures = super::snapshot::state_signatures(&plan);
    // (A record without states predates their signatures: it holds them all.)
    let mut held: Vec<String> = match &resume.last {
        Some(r) if !r.states.is_empty() => r.states.iter().map(|s| s.0.clone()).collect(),
        _ => signatures.iter().map(|s| s.0.clone()).collect(),
    };
    let mut pending = resume.pending;
    // Windowed file sinks' panes so far: a replay names its files as the first attempt did.
    let mut panes = resume
        .last
        .as_ref()
        .map(|r| r.window_panes.clone())
        .unwrap_or_default();
    let mut counts = vec![0u64; plan.plan.graph.transforms.len()];
    let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
    loop {
        let wanted = *control.borrow();
        if matches!(wanted, Control::Cancel | Control::Stop) {
            return Err(RunError::Cancelled);
        }
        let tick = Instant::now();
        let id = last_id + 1;
        let ends = ends_of(&sources, now_us()).await?;
        let all_ended = all_read(&ends, &offsets);
        let cp = match pending.take().filter(|p| p.id == id) {
            Some(p) => {
                offsets.extend(p.offsets.iter().map(|(t, q, o)| ((*t, *q), *o)));
                p
            }
            None => plan_checkpoint(
                id,
                start_us,
                shards,
                &ends,
                &offsets,
                &watermarks,
                wanted == Control::Drain || all_ended,
                scfg.max_per_partition,
            ),
        };
        log.plan(&cp)
            .await
            .map_err(|e| RunError::Internal(e.to_string()))?;
        status.lock().unwrap_or_else(|p| p.into_inner()).draining = cp.drain;

        let reads = reads_of(&cp, &plan);
        let mut tracker = Tracker::starting_at(
            plan.clone(),
            shards,
            Duration::from_secs(3600),
            tick,
            id * 10_000_000,
            &reads,
        );
        let before: BTreeMap<PartitionId, i64> = cp
            .watermarks
            .iter()
            .map(|(t, p, w)| ((*t, *p), if cp.drain { END_OF_TIME } else { *w }))
            .collect();
        let watermark_in = cp
            .watermarks
            .iter()
            .map(|w| w.2)
            .min()
            .unwrap_or(END_OF_TIME);
        tracker.set_checkpoint(
            CheckpointCtx {
                id,
                watermark_in,
                watermark: watermark_in,
                now_us: cp.now_us,
                start_us,
                state_prefix: format!("{}/state", scfg.checkpoint_root.trim_end_matches('/')),
                new_states: signatures
                    .iter()
                    .map(|s| s.0.clone())
                    .filter(|n| !held.contains(n))
                    .collect(),
                refreshed: refreshed_in(&cp, &sources, &plan),
            },
            before,
            cp.watermarks
                .iter()
                .map(|(t, p, w)| ((*t, *p), *w))
                .collect(),
        );
        let token = runner.job_token(id);
        riverbank_engine::finish::abort_sinks(&plan, BTreeMap::new(), &token).await;
        let (cancel_tx, cancel_rx) = watch::channel(false);
        let mut watch_control = control.clone();
        let forward = tokio::spawn(async move {
            if watch_control
                .wait_for(|c| *c == Control::Cancel)
                .await
                .is_ok()
            {
                let _ = cancel_tx.send(true);
            }
        });
        let mut done = runner.run(tracker, id, cancel_rx).await;
        forward.abort();
        let ran = tick.elapsed();
        if let Some(e) = done.error.take() {
            riverbank_engine::finish::abort_sinks(&plan, std::mem::take(&mut done.parts), &token)
                .await;
            return Err(e);
        }
        let (after, watermark) = done
            .watermarks
            .clone()
            .unwrap_or((BTreeMap::new(), watermark_in));
        let committed = super::commit::commit(
            &plan,
            std::mem::take(&mut done.parts),
            &token,
            id,
            &mut panes,
            (!cp.drain).then_some((&after, watermark)),
        )
        .await?;
        done.late_dropped += committed.late_rows;
        let committed = committed.files;
        let commit_done = tick.elapsed();
        // A partition a checkpoint read nothing from keeps its watermark; once idle (caught
        // up, nothing new) it stops holding the others back.
        let ends_after = ends_of(&sources, now_us()).await?;
        for (t, p, _, until) in &cp.reads {
            offsets.insert((*t, *p), *until);
        }
        watermarks = after;
        // A log partition that is caught up and read nothing this checkpoint is idle: it does
        // not hold back the partitions that are moving (they set the pace until it speaks).
        let moving: std::collections::BTreeSet<PartitionId> =
            cp.reads.iter().map(|r| (r.0, r.1)).collect();
        if let Some(pace) = watermarks
            .iter()
            .filter(|(k, _)| moving.contains(k))
            .map(|(_, w)| *w)
            .min()
        {
            for (e, t, s) in &ends_after {
                let k = (*t, e.partition);
                if matches!(s, StreamSource::Connector(_))
                    && !moving.contains(&k)
                    && offsets.get(&k).is_some_and(|o| *o >= e.end)
                {
                    let w = watermarks.entry(k).or_insert(pace);
                    *w = (*w).max(pace);
                }
            }
        }
        if cp.drain {
            watermarks.values_mut().for_each(|w| *w = END_OF_TIME);
        }
        let record = CheckpointRecord {
            id,
            start_us,
            shards,
            offsets: offsets
                .iter()
                .map(|((t, p), o)| (names[*t].clone(), *p, *o))
                .collect(),
            watermarks: watermarks
                .iter()
                .map(|((t, p), w)| (names[*t].clone(), *p, *w))
                .collect(),
            states: signatures.clone(),
            committed: committed.clone(),
            window_panes: panes.clone(),
            at_us: now_us(),
            drained: cp.drain,
        };
        log.record(&record)
            .await
            .map_err(|e| RunError::Internal(e.to_string()))?;
        last_id = id;
        held = signatures.iter().map(|s| s.0.clone()).collect();
        tracing::debug!(
            checkpoint = id,
            items_ms = ran.as_secs_f64() * 1e3,
            commit_ms = (commit_done - ran).as_secs_f64() * 1e3,
            record_ms = (tick.elapsed() - commit_done).as_secs_f64() * 1e3,
            "checkpoint recorded"
        );
        // Old checkpoints' files, now and then (a listing of the directory each time).
        if id % GC_EVERY == 0 || cp.drain {
            let retained = plan.plan.options.checkpoints_retained();
            match super::gc::collect(&scfg.checkpoint_root, id, retained).await {
                Ok(c) => tracing::debug!(checkpoint = id, ?c, "old checkpoint files deleted"),
                Err(e) => {
                    tracing::warn!(checkpoint = id, error = %e, "cannot delete old checkpoint files")
                }
            }
        }
        for (n, c) in counts.iter_mut().zip(&done.elements_out) {
            *n += c;
        }
        for (t, n) in counts.iter().enumerate() {
            metrics.elements_out[t].store(*n, std::sync::atomic::Ordering::Relaxed);
        }
        let read: u64 = cp
            .reads
            .iter()
            .map(|r| ((r.3 - r.2) as f64 * per_offset(&ends, r.0, r.1)).round() as u64)
            .sum();
        let took = tick.elapsed();
        update_status(
            &status,
            &done,
            &ends_after,
            &offsets,
            id,
            watermark,
            read,
            took,
            &committed,
        );
        for (sink, fs) in committed {
            files.entry(sink).or_default().extend(fs);
        }
        if cp.drain {
            break;
        }
        // The next checkpoint starts an interval after this one started, or at once when this
        // one read as much as a checkpoint may (a backlog is being caught up) or the sources
        // ended; a drain or cancel starts it early.
        let capped = cp
            .reads
            .iter()
            .any(|r| r.3 - r.2 >= offset_cap(scfg.max_per_partition, per_offset(&ends, r.0, r.1)));
        if !capped && !all_read(&ends_after, &offsets) {
            let wait = scfg.interval.saturating_sub(took);
            let _ = tokio::time::timeout(wait, control.changed()).await;
        }
    }
    Ok(RunSummary {
        wall: started.elapsed(),
        elements_out: plan
            .plan
            .graph
            .transforms
            .iter()
            .zip(counts)
            .map(|(t, n)| (t.name.clone(), n))
            .collect(),
        files: files.into_iter().collect(),
    })
}

/// A job resumed from its checkpoint log must be the pipeline that wrote it, as far as its
/// keyed state goes: a Combine renamed or changed in place would restore nothing (its shards'
/// checkpoints are under its old name) or misread the old accumulators. A changed pipeline
/// continues a job through a snapshot (an update), in a checkpoint directory of its own.
fn check_states(
    recorded: &[(String, String)],
    plan: &CompiledPlan,
    root: &str,
    id: u64,
) -> Result<(), RunError> {
    let signatures: BTreeMap<String, String> = super::snapshot::state_signatures(plan)
        .into_iter()
        .collect();
    let how = "a changed pipeline continues a job from a snapshot (an update, with transformNameMapping for renames) in a checkpoint directory of its own";
    for (name, sig) in recorded {
        match signatures.get(name) {
            None => {
                return Err(RunError::Internal(format!(
                    "the checkpoints at {root} (checkpoint {id}) hold the state of '{name}', and this pipeline has no such Combine: it is not the pipeline that took them; {how}"
                )));
            }
            Some(s) if s != sig => {
                return Err(RunError::Internal(format!(
                    "the checkpoints at {root} (checkpoint {id}) hold the state of '{name}' as ({sig}); this pipeline's '{name}' keeps ({s}): it is not the pipeline that took them; {how}"
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// What checkpoint `id` reads: each partition's next offsets up to its end now, at most
/// `max` of them; nothing when draining.
#[allow(clippy::too_many_arguments)]
fn plan_checkpoint(
    id: u64,
    start_us: i64,
    shards: u32,
    ends: &Ends<'_>,
    offsets: &BTreeMap<PartitionId, u64>,
    watermarks: &BTreeMap<PartitionId, i64>,
    drain: bool,
    max: u64,
) -> CheckpointPlan {
    let now = now_us();
    let mut reads = vec![];
    if !drain {
        for (e, t, _) in ends {
            let from = offsets.get(&(*t, e.partition)).copied().unwrap_or(0);
            let until = e
                .end
                .min(from.saturating_add(offset_cap(max, e.elements_per_offset)));
            if until > from {
                reads.push((*t, e.partition, from, until));
            }
        }
    }
    CheckpointPlan {
        id,
        now_us: now,
        start_us,
        shards,
        reads,
        watermarks: watermarks.iter().map(|((t, p), w)| (*t, *p, *w)).collect(),
        drain,
        offsets: offsets.iter().map(|((t, p), o)| (*t, *p, *o)).collect(),
    }
}

/// The most offsets a partition reads in one checkpoint: about `max` elements' worth, so a
/// source whose offsets are sparse (a Nexmark reader of people reads one event number in 50)
/// reads as many elements a checkpoint as any other, not a fiftieth of them.
fn offset_cap(max: u64, elements_per_offset: f64) -> u64 {
    let max = max.max(1);
    let per = elements_per_offset.clamp(1e-6, 1.0);
    ((max as f64 / per).ceil() as u64).max(max)
}

/// Elements per offset of source `t`'s partition `p` (1 if it is not in `ends`).
fn per_offset(ends: &Ends<'_>, t: usize, p: u32) -> f64 {
    ends.iter()
        .find(|(e, s, _)| *s == t && e.partition == p)
        .map_or(1.0, |(e, _, _)| e.elements_per_offset)
}

/// Every source partition's ends now, with its source.
type Ends<'a> = Vec<(
    riverbank_io::unbounded::PartitionEnds,
    usize,
    &'a StreamSource,
)>;

/// Every partition of every source has ended and was read to its end. A file read again
/// every `refresh_interval` never ends, but does not keep a job running whose other sources
/// have ended (a side input is only ever beside them).
fn all_read(ends: &Ends<'_>, offsets: &BTreeMap<PartitionId, u64>) -> bool {
    let mut ending = ends.iter().filter(|(_, _, s)| !s.refreshes()).peekable();
    if ending.peek().is_none() {
        // Refreshed reads alone run until drained.
        return ends.is_empty();
    }
    ending.all(|(e, t, _)| e.finished && offsets.get(&(*t, e.partition)).copied() == Some(e.end))
}

/// The file reads with a `refresh_interval` that checkpoint `cp` reads again, by name.
fn refreshed_in(
    cp: &CheckpointPlan,
    sources: &[(usize, StreamSource)],
    plan: &CompiledPlan,
) -> Vec<String> {
    let mut names: Vec<String> = cp
        .reads
        .iter()
        .filter(|(t, ..)| sources.iter().any(|(s, src)| s == t && src.refreshes()))
        .map(|(t, ..)| plan.plan.graph.transforms[*t].name.clone())
        .collect();
    names.dedup();
    names
}

async fn ends_of(sources: &[(usize, StreamSource)], now: i64) -> Result<Ends<'_>, RunError> {
    let mut out = vec![];
    for (t, s) in sources {
        for e in s.ends_now(now).await? {
            out.push((e, *t, s));
        }
    }
    Ok(out)
}

fn reads_of(cp: &CheckpointPlan, plan: &CompiledPlan) -> StreamReads {
    let mut reads = StreamReads::new();
    for (t, s) in plan.transforms.iter().enumerate() {
        if matches!(s, CompiledTransform::ReadStream(_)) {
            reads.insert(t, vec![]);
        }
    }
    for &(t, partition, from, until) in &cp.reads {
        reads.entry(t).or_default().push(Split {
            location: plan.plan.graph.transforms[t].name.clone(),
            kind: SplitKind::Offsets {
                partition,
                from,
                until,
            },
            estimated_bytes: 0,
            file_size: 0,
            estimated_rows: Some(until - from),
            csv: None,
        });
    }
    reads
}

#[allow(clippy::too_many_arguments)]
fn update_status(
    status: &Mutex<StreamStatus>,
    done: &Checkpointed,
    ends: &Ends<'_>,
    offsets: &BTreeMap<PartitionId, u64>,
    id: u64,
    watermark: i64,
    read: u64,
    took: Duration,
    committed: &[(String, Vec<String>)],
) {
    let (mut backlog, mut bytes) = (0u64, 0f64);
    for (e, t, _) in ends {
        let behind = e
            .end
            .saturating_sub(offsets.get(&(*t, e.partition)).copied().unwrap_or(0));
        let elements = behind as f64 * e.elements_per_offset;
        backlog += elements.round() as u64;
        bytes += elements * e.bytes_per_element;
    }
    let mut st = status.lock().unwrap_or_else(|p| p.into_inner());
    if !st.workers.is_empty() && st.workers != done.workers {
        st.rescales += 1;
        st.last_rescale_pause_ms = Some(took.as_millis() as u64);
    }
    st.workers = done.workers.clone();
    st.checkpoint = id;
    st.watermark_us = watermark;
    st.backlog_elements = backlog;
    st.backlog_bytes = bytes as u64;
    st.elements_read += read;
    st.throughput = read as f64 / took.as_secs_f64().max(1e-3);
    let per_element = ends.first().map_or(0.0, |e| e.0.bytes_per_element);
    st.throughput_bytes = st.throughput * per_element;
    st.late_dropped += done.late_dropped;
    if done.state_bytes > 0 {
        st.state_bytes = done.state_bytes;
        st.active_keys = done.active_keys;
    }
    st.last_checkpoint = Some(Instant::now());
    st.last_checkpoint_ms = took.as_millis() as u64;
    st.files_committed += committed.iter().map(|c| c.1.len() as u64).sum::<u64>();
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use riverbank_pipeline::config::StreamSourceConfig;

    fn nexmark(kind: &str) -> StreamSource {
        StreamSource::new(
            &StreamSourceConfig::Nexmark {
                kind: kind.into(),
                rate: 1000.0,
                partitions: 1,
                count: Some(10_000_000),
                start_us: Some(0),
                seed: 1,
                columns: None,
            },
            0,
        )
    }

    /// A checkpoint reads about `max` elements of each partition: a reader of people (1 event
    /// number in 50) reads 50 times the offsets a reader of bids (46 in 50) reads.
    #[test]
    fn a_checkpoint_caps_elements_not_offsets() {
        let (people, bids) = (nexmark("person"), nexmark("bid"));
        let ends: Ends<'_> = [(0, &people), (1, &bids)]
            .into_iter()
            .map(|(t, s)| (s.ends(i64::MAX / 2)[0], t, s))
            .collect();
        let cp = plan_checkpoint(
            1,
            0,
            1,
            &ends,
            &BTreeMap::new(),
            &BTreeMap::new(),
            false,
            1_000,
        );
        let offsets: Vec<(usize, u64)> = cp.reads.iter().map(|r| (r.0, r.3 - r.2)).collect();
        assert_eq!(offsets, vec![(0, 50_000), (1, 1_087)]);
        assert_eq!(offset_cap(1_000, 1.0), 1_000);
        // Never fewer offsets than `max`, whatever a source says.
        assert_eq!(offset_cap(1_000, 3.0), 1_000);
    }
}
