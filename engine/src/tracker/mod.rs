//! The coordinator's bookkeeping, without I/O: which items exist, who runs what, what is done
//! and where its output lives; when a stage may start, when the job is done or failed; which
//! running item to split for an idle worker. Time comes in as arguments, so it is testable, and
//! every durable change comes out as an [`Event`] the caller logs before answering, so a
//! restarted coordinator replays the log and resumes instead of starting over.
use super::items::{ItemInput, StageShape, StreamReads, WorkItem, initial_items, stage_shape};
use super::shuffle::ShuffleRef;
use super::work::{
    Assignment, AttemptProgress, CheckpointCtx, ItemFailure, ItemReport, Lease, SourceWatermarks,
    WorkerId,
};
use crate::compiled::CompiledPlan;
use riverbank_io::Split;
use riverbank_pipeline::{JobFailure, JobPhase};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A durable change, appended to the coordinator's log.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub enum Event {
    /// A coordinator (re)started; attempts are numbered per epoch so they never collide.
    Started {
        epoch: u32,
    },
    Split {
        item: u64,
        keep: Split,
        residual: u64,
        give: Split,
    },
    Completed {
        item: u64,
        attempt: u32,
        worker: String,
        address: String,
        report: ItemReport,
    },
    /// A batch stage's small neighbouring partitions run as one item each group: `groups`
    /// are the sizes of consecutive partition groups, in partition order (see
    /// [`Tracker::coalesce`]).
    Coalesced {
        stage: usize,
        groups: Vec<u32>,
    },
    /// A done item's output became unreachable; it runs again.
    Invalidated {
        item: u64,
    },
    Failed {
        failure: JobFailure,
    },
    Cancelled,
    /// Every sink committed: (sink transform name, files).
    Committed {
        files: Vec<(String, Vec<String>)>,
    },
}

#[derive(Clone, Debug)]
enum ItemState {
    Pending,
    Running {
        worker: String,
        /// The worker process that holds the lease: a restarted worker does not.
        incarnation: String,
        attempt: u32,
        since: Instant,
        /// Heartbeats from its worker in a row that did not list it (the lease reply was
        /// lost, or the worker forgot it): at two, it runs again.
        unlisted: u8,
    },
    Done {
        worker: String,
        /// The attempt whose report counts (a retried report of it is accepted again).
        attempt: u32,
        address: String,
        report: ItemReport,
    },
}

/// What the tracker made of a finished attempt's report.
#[derive(Debug, PartialEq)]
pub enum Report {
    /// Accepted: the event to log before answering.
    Accepted(Box<Event>),
    /// Accepted before: the same report sent again (its answer was lost, or the coordinator
    /// restarted after logging it). The worker must keep its output.
    AcceptedBefore,
    /// Not the current attempt: the worker discards its output.
    Rejected,
}

impl Report {
    pub fn accepted(&self) -> bool {
        !matches!(self, Report::Rejected)
    }
}

#[derive(Clone, Debug)]
struct Item {
    item: WorkItem,
    state: ItemState,
    /// Attempts started in this epoch.
    attempts: u32,
    /// Times an attempt was lost while running (its worker died, restarted or forgot it).
    lost: u32,
    units_started: u64,
    units_total: u64,
    /// Waiting to be sent to the worker running it.
    split_request: bool,
    /// Keys its final combine holds (running) or produced (done).
    keys: u64,
    /// When it was last done, for the active keys of the recent past.
    done_at: Option<Instant>,
    /// How long its accepted attempt ran (unknown for items replayed from the log).
    duration: Option<Duration>,
    /// Attempts that ended without a result: lost with their worker, or their input lost.
    failures: u32,
    /// What ended the last of them.
    last_failure: Option<String>,
    /// Pending after a failed attempt: not leased again before then (backoff).
    not_before: Option<Instant>,
    /// Its output could not be read, lately: since when, how often, and what the reader said.
    unreachable: Option<Unreachable>,
    /// Runs again on this worker (the reader that could not fetch its output, so that it reads
    /// it from its own disk), unless that worker does not ask for it before the deadline.
    prefer: Option<(String, Instant)>,
}

/// A done item's output that its readers could not fetch: a streak of such failures, each
/// within [`Tracker::output_patience`] of the one before.
#[derive(Clone, Debug)]
struct Unreachable {
    since: Instant,
    last: Instant,
    times: u32,
    /// Where it was, and the reader's error.
    what: String,
}

impl Item {
    /// A new item, waiting to run.
    fn queued(item: WorkItem) -> Item {
        Item {
            units_total: item.units().len() as u64,
            item,
            state: ItemState::Pending,
            attempts: 0,
            lost: 0,
            units_started: 0,
            split_request: false,
            keys: 0,
            done_at: None,
            duration: None,
            failures: 0,
            last_failure: None,
            not_before: None,
            unreachable: None,
            prefer: None,
        }
    }

    /// May be leased to `worker` now (its backoff is over, and no other worker is preferred).
    fn leasable_by(&self, worker: &str, now: Instant) -> bool {
        self.not_before.is_none_or(|t| now >= t)
            && self
                .prefer
                .as_ref()
                .is_none_or(|(w, until)| w == worker || now >= *until)
    }

    /// What it reads, for messages.
    fn describe(&self) -> String {
        match &self.item.input {
            ItemInput::Read { range, .. } => match &range.kind {
                riverbank_io::SplitKind::Offsets {
                    partition,
                    from,
                    until,
                } => format!(
                    "offsets {from}..{until} of partition {partition} of {}",
                    range.location
                ),
                kind => format!("{} {kind:?}", range.location),
            },
            ItemInput::Create => "created elements".into(),
            ItemInput::Partition(p) => format!("partition {p}"),
            ItemInput::Partitions { first, count } => {
                format!("partitions {first}..{}", first + count)
            }
            ItemInput::Gather => "all of its inputs".into(),
        }
    }

    fn record(&mut self, p: &AttemptProgress) {
        self.units_started = p.units_started;
        self.units_total = p.units_total;
        self.keys = p.keys;
    }

    /// A running source item with unread units beyond the one being read: it can give some
    /// away to another worker.
    fn splittable(&self) -> bool {
        matches!(self.state, ItemState::Running { .. })
            && matches!(self.item.input, ItemInput::Read { .. })
            && self.units_total.saturating_sub(self.units_started.max(1)) >= 1
    }
}

#[derive(Clone, Debug)]
struct Worker {
    incarnation: String,
    address: String,
    last_seen: Instant,
    alive: bool,
    items_done: u64,
    cpu: f64,
    rss: u64,
    draining: bool,
}

mod progress;

/// Times an item may be lost with its worker (while running, or its output after) before the
/// job fails: see [`Tracker::check_lost`].
pub const MAX_WORKER_LOSSES: u32 = 10;

/// How long a done item's output may stay unreachable to its readers (recomputed, and read
/// again after a backoff) before the job fails: a pod whose DNS name does not resolve yet, a
/// restarting pod, a slow node all get this long. `--output-patience-secs` sets it.
pub const OUTPUT_PATIENCE: Duration = Duration::from_secs(180);

/// The first wait before an item whose input could not be read runs again; it doubles with
/// every such failure, up to [`MAX_RETRY_BACKOFF`].
const RETRY_BACKOFF: Duration = Duration::from_millis(200);
const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(10);

/// How long a recomputed item waits for the reader that could not fetch its output (to run
/// on that reader's worker) before any worker may take it.
const PREFER_READER_FOR: Duration = Duration::from_secs(2);

pub struct Tracker {
    plan: Arc<CompiledPlan>,
    partitions: u32,
    lease_timeout: Duration,
    epoch: u32,
    items: BTreeMap<u64, Item>,
    next_id: u64,
    workers: BTreeMap<String, Worker>,
    phase: JobPhase,
    failure: Option<JobFailure>,
    cancel_requested: bool,
    committed: Option<Vec<(String, Vec<String>)>>,
    /// Items created by dynamic splitting.
    dynamic_splits: u64,
    started: Instant,
    /// (when, bytes done, rows read) samples for throughput.
    samples: VecDeque<(Instant, u64, u64)>,
    finished_at: Option<Instant>,
    /// Streaming: the checkpoint this tracker runs, and each source partition's watermark
    /// before it.
    checkpoint: Option<(CheckpointCtx, SourceWatermarks)>,
    /// Streaming: each stage's upstream sources (transform indices), whose partitions'
    /// watermarks are the stage's: a branch waits for its own sources, not a slower one's.
    stage_sources: Vec<BTreeSet<usize>>,
    /// Streaming: each source partition's watermark before the checkpoint, as lateness is
    /// judged (`checkpoint`'s map is the end of time in a drain).
    watermarks_in: SourceWatermarks,
    /// Batch: neighbouring shuffle partitions smaller than this together run as one item
    /// (0: never).
    coalesce_bytes: u64,
    /// Stages with nothing (more) to decide about coalescing: looked at, or not made of
    /// shuffle partitions.
    coalesced: Vec<bool>,
    /// See [`OUTPUT_PATIENCE`].
    output_patience: Duration,
}

impl Tracker {
    pub fn new(
        plan: Arc<CompiledPlan>,
        partitions: u32,
        lease_timeout: Duration,
        now: Instant,
    ) -> Self {
        Tracker::starting_at(plan, partitions, lease_timeout, now, 0, &Default::default())
    }

    /// A streaming checkpoint's tracker: its item ids start at `first_id` (never confused with
    /// an earlier checkpoint's) and its unbounded sources read `reads`.
    pub fn starting_at(
        plan: Arc<CompiledPlan>,
        partitions: u32,
        lease_timeout: Duration,
        now: Instant,
        first_id: u64,
        reads: &StreamReads,
    ) -> Self {
        let mut next_id = first_id;
        let coalesced = (plan.plan.stages.iter())
            .map(|s| stage_shape(&plan, s) != StageShape::Partitioned)
            .collect();
        let mut items = BTreeMap::new();
        for s in &plan.plan.stages {
            for item in initial_items(&plan, s, partitions, &mut next_id, reads) {
                items.insert(item.id, Item::queued(item));
            }
        }
        Tracker {
            plan,
            partitions,
            lease_timeout,
            epoch: 0,
            items,
            next_id,
            workers: BTreeMap::new(),
            phase: JobPhase::Pending,
            failure: None,
            cancel_requested: false,
            committed: None,
            dynamic_splits: 0,
            started: now,
            samples: VecDeque::new(),
            finished_at: None,
            checkpoint: None,
            stage_sources: Vec::new(),
            watermarks_in: SourceWatermarks::new(),
            coalesce_bytes: 0,
            coalesced,
            output_patience: OUTPUT_PATIENCE,
        }
    }

    /// How long unreachable output is recomputed and read again before the job fails (see
    /// [`OUTPUT_PATIENCE`]).
    pub fn with_output_patience(mut self, patience: Duration) -> Self {
        self.output_patience = patience;
        self
    }

    /// A streaming coordinator's tracker until its checkpoint loop installs a checkpoint's:
    /// nothing to lease. (Its items would be of no checkpoint: a worker asking in between, as
    /// workers do right after a coordinator restarts, would get a state shard's item without
    /// the checkpoint it belongs to.)
    pub fn awaiting_checkpoint(mut self) -> Self {
        self.items.clear();
        self
    }

    /// Coalesces a batch stage's neighbouring partitions up to `bytes` of shuffled input per
    /// item, once the stage's input is known (0: never). See [`Self::coalesce`].
    pub fn coalescing(mut self, bytes: u64) -> Self {
        self.coalesce_bytes = bytes;
        self
    }

    /// Streaming: this tracker runs checkpoint `ctx`; `watermarks` holds every source
    /// partition's watermark before it, and `watermarks_in` the same as data is judged late
    /// against (they differ in a drain, whose reads promise the end of time).
    pub fn set_checkpoint(
        &mut self,
        ctx: CheckpointCtx,
        watermarks: SourceWatermarks,
        watermarks_in: SourceWatermarks,
    ) {
        let up = self.plan.plan.graph.upstream_sources();
        self.stage_sources = (self.plan.plan.stages.iter())
            .map(|s| {
                s.ops
                    .iter()
                    .flat_map(|o| up[o.transform].iter().copied())
                    .collect()
            })
            .collect();
        self.watermarks_in = watermarks_in;
        self.checkpoint = Some((ctx, watermarks));
    }

    /// Streaming: the checkpoint as an item of `stage` sees it: the watermarks before and
    /// after the reads are those of the stage's upstream sources (the job's, when none of
    /// their partitions is known).
    fn checkpoint_of(&self, stage: usize) -> Option<CheckpointCtx> {
        let (ctx, before) = self.checkpoint.as_ref()?;
        let (after, job) = self
            .watermarks()
            .unwrap_or((before.clone(), ctx.watermark_in));
        Some(CheckpointCtx {
            watermark_in: self.stage_min(stage, &self.watermarks_in, ctx.watermark_in),
            watermark: self.stage_min(stage, &after, job),
            ..ctx.clone()
        })
    }

    /// Streaming: the watermark each stage fires against in this checkpoint, its own
    /// sources' (what the console shows on the stage); empty in a batch run.
    pub fn stage_watermarks(&self) -> Vec<Option<i64>> {
        let Some((after, job)) = self.watermarks() else {
            return vec![];
        };
        (0..self.plan.plan.stages.len())
            .map(|s| Some(self.stage_min(s, &after, job)))
            .collect()
    }

    /// The lowest of `m`'s watermarks of stage `stage`'s sources (`job` when it has none).
    fn stage_min(&self, stage: usize, m: &SourceWatermarks, job: i64) -> i64 {
        let sources = self.stage_sources.get(stage);
        (m.iter())
            .filter(|((t, _), _)| sources.is_none_or(|s| s.contains(t)))
            .map(|(_, w)| *w)
            .min()
            .unwrap_or(job)
    }

    /// Streaming: every source partition's watermark now (the read items done so far moved
    /// theirs), and their minimum: the checkpoint's output watermark once all reads are done.
    pub fn watermarks(&self) -> Option<(SourceWatermarks, i64)> {
        let (ctx, before) = self.checkpoint.as_ref()?;
        let mut now = before.clone();
        for i in self.items.values() {
            if let ItemState::Done { report, .. } = &i.state {
                for (t, p, w) in &report.watermarks {
                    let e = now.entry((*t, *p)).or_insert(*w);
                    *e = (*e).max(*w);
                }
            }
        }
        let min = now.values().copied().min().unwrap_or(ctx.watermark_in);
        Some((now, min))
    }

    pub fn phase(&self) -> JobPhase {
        self.phase
    }

    pub fn failure(&self) -> Option<&JobFailure> {
        self.failure.as_ref()
    }

    pub fn plan(&self) -> &Arc<CompiledPlan> {
        &self.plan
    }

    /// Begins a new epoch (after replay): the event to log first.
    pub fn start_epoch(&mut self) -> Event {
        let e = Event::Started {
            epoch: self.epoch + 1,
        };
        self.apply(&e, Instant::now());
        e
    }

    /// Replays or applies a logged event.
    pub fn apply(&mut self, e: &Event, now: Instant) {
        match e {
            Event::Started { epoch } => self.epoch = *epoch,
            Event::Split {
                item,
                keep,
                residual,
                give,
            } => {
                if let Some(it) = self.items.get_mut(item)
                    && let ItemInput::Read { split, range } = &mut it.item.input
                {
                    *range = keep.clone();
                    it.units_total = super::items::units(keep).len() as u64;
                    let new = WorkItem {
                        id: *residual,
                        stage: it.item.stage,
                        input: ItemInput::Read {
                            split: *split,
                            range: give.clone(),
                        },
                    };
                    self.next_id = self.next_id.max(residual + 1);
                    self.dynamic_splits += 1;
                    self.items.insert(*residual, Item::queued(new));
                }
            }
            Event::Completed {
                item,
                attempt,
                worker,
                address,
                report,
            } => {
                if let Some(it) = self.items.get_mut(item) {
                    it.state = ItemState::Done {
                        worker: worker.clone(),
                        attempt: *attempt,
                        address: address.clone(),
                        report: report.clone(),
                    };
                    it.units_started = it.units_total;
                    it.keys = report.keys;
                    it.done_at = Some(now);
                }
                if let Some(w) = self.workers.get_mut(worker) {
                    w.items_done += 1;
                }
                if self.phase == JobPhase::Pending {
                    self.phase = JobPhase::Running;
                }
            }
            Event::Coalesced { stage, groups } => self.merge_partitions(*stage, groups),
            Event::Invalidated { item } => {
                if let Some(it) = self.items.get_mut(item) {
                    it.state = ItemState::Pending;
                    it.units_started = 0;
                }
            }
            Event::Failed { failure } => {
                self.phase = JobPhase::Failed;
                self.failure = Some(failure.clone());
                self.finished_at = Some(now);
            }
            Event::Cancelled => {
                self.phase = JobPhase::Cancelled;
                self.cancel_requested = true;
                self.finished_at = Some(now);
            }
            Event::Committed { files } => {
                self.committed = Some(files.clone());
                self.phase = JobPhase::Done;
                self.finished_at = Some(now);
            }
        }
    }

    /// A worker made contact (registration, lease, heartbeat or report): call before handing
    /// its request to the tracker. A new incarnation under a known name means the process was
    /// restarted: the items its previous incarnation was running run again at once (its
    /// finished output stays: a worker restarted under its name has its disk back, and a file
    /// that is gone after all is recomputed when a reader misses it).
    pub fn seen(&mut self, w: &WorkerId, now: Instant) -> Vec<Event> {
        let entry = self.workers.entry(w.worker.clone()).or_insert(Worker {
            incarnation: w.incarnation.clone(),
            address: w.address.clone(),
            last_seen: now,
            alive: true,
            items_done: 0,
            cpu: 0.0,
            rss: 0,
            draining: false,
        });
        let restarted = entry.incarnation != w.incarnation;
        entry.incarnation = w.incarnation.clone();
        entry.address = w.address.clone();
        entry.last_seen = now;
        entry.alive = true;
        if restarted {
            // A new process is not draining, whatever the old one was asked.
            entry.draining = false;
            tracing::warn!(worker = %w.worker, "worker restarted; its running items run again");
            let held = self.running_on(|worker, incarnation| {
                worker == w.worker && incarnation != w.incarnation
            });
            return self.requeue(held, "its worker restarted", now);
        }
        vec![]
    }

    /// Streaming: the next checkpoint's tracker knows the workers this one knows (their
    /// leases do not carry over: there are none between checkpoints), keeps its settings, and
    /// a job that was running is running still: a checkpoint that no worker took yet is not a
    /// job "waiting for workers" (the operator decides updates only for a running job).
    pub fn inherit_workers(&mut self, other: &Tracker) {
        self.workers = other.workers.clone();
        self.epoch = other.epoch;
        self.output_patience = other.output_patience;
        if other.phase == JobPhase::Running && self.phase == JobPhase::Pending {
            self.phase = JobPhase::Running;
        }
    }

    /// Streaming: the job ran before this checkpoint (a resumed job's first checkpoint): it is
    /// Running, not waiting for its first worker.
    pub fn set_running(&mut self) {
        if self.phase == JobPhase::Pending {
            self.phase = JobPhase::Running;
        }
    }

    /// The workers taking work now (alive and not draining), by name.
    pub fn live_workers(&self) -> Vec<String> {
        self.workers
            .iter()
            .filter(|(_, w)| w.alive && !w.draining)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Streaming: the worker that runs state shard `p` (a partition of a keyed stage), so a
    /// shard stays on one worker's disk while the workers stay the same, and moves (restored
    /// from its checkpoint) when they change. Shards spread evenly over the live workers.
    fn shard_owner(&self, p: u32) -> Option<&str> {
        let live: Vec<&str> = self
            .workers
            .iter()
            .filter(|(_, w)| w.alive && !w.draining)
            .map(|(n, _)| n.as_str())
            .collect();
        (!live.is_empty()).then(|| live[p as usize % live.len()])
    }

    /// Whether `w` is the incarnation the tracker knows under its name.
    fn is_known(&self, w: &WorkerId) -> bool {
        self.workers
            .get(&w.worker)
            .is_some_and(|k| k.incarnation == w.incarnation)
    }

    /// Which stages have every item done, in one pass over the items.
    fn completed_stages(&self) -> Vec<bool> {
        let mut complete = vec![true; self.plan.plan.stages.len()];
        for i in self.items.values() {
            if !matches!(i.state, ItemState::Done { .. }) {
                complete[i.item.stage] = false;
            }
        }
        complete
    }

    fn stage_complete(&self, stage: usize) -> bool {
        self.items
            .values()
            .filter(|i| i.item.stage == stage)
            .all(|i| matches!(i.state, ItemState::Done { .. }))
    }

    /// Which stages may run: every stage feeding them is complete.
    fn runnable_stages(&self) -> Vec<bool> {
        let complete = self.completed_stages();
        self.plan
            .plan
            .stages
            .iter()
            .map(|st| {
                st.inputs
                    .iter()
                    .all(|i| i.from_stages.iter().all(|&s| complete[s]))
            })
            .collect()
    }

    /// Whether `attempt` is the one the coordinator currently counts on for item `id`.
    pub fn is_current(&self, id: u64, attempt: u32) -> bool {
        self.items.get(&id).is_some_and(
            |i| matches!(i.state, ItemState::Running { attempt: a, .. } if a == attempt),
        )
    }

    pub fn dynamic_splits(&self) -> u64 {
        self.dynamic_splits
    }

    /// Every item is done: the sinks may be committed.
    pub fn all_done(&self) -> bool {
        self.items
            .values()
            .all(|i| matches!(i.state, ItemState::Done { .. }))
    }

    /// Hands the next runnable item to `worker`, or asks a running item to split for it.
    /// `w` must have been [`seen`](Self::seen) first; a stale incarnation gets nothing.
    pub fn lease(&mut self, w: &WorkerId, now: Instant) -> Lease {
        if self.phase.is_terminal() {
            return Lease::Finished(self.phase);
        }
        if !self.is_known(w) || self.workers.get(&w.worker).is_some_and(|w| w.draining) {
            return Lease::Wait;
        }
        if self.phase == JobPhase::Pending {
            self.phase = JobPhase::Running;
        }
        let runnable = self.runnable_stages();
        let streaming = self.checkpoint.is_some();
        // Shards run once every read of the checkpoint is done, so each fires against the
        // watermark its own sources reached by the end of the checkpoint (a Join's, the lower
        // of its two sides'), never a partial one.
        let reads_done = !streaming
            || self.items.values().all(|i| {
                !matches!(i.item.input, ItemInput::Read { .. })
                    || matches!(i.state, ItemState::Done { .. })
            });
        let next = self
            .items
            .values()
            .filter(|i| matches!(i.state, ItemState::Pending) && runnable[i.item.stage])
            .filter(|i| i.leasable_by(&w.worker, now))
            .filter(|i| match i.item.input {
                ItemInput::Partition(p) if streaming => {
                    reads_done && self.shard_owner(p).is_none_or(|o| o == w.worker)
                }
                _ => true,
            })
            .min_by_key(|i| (i.item.stage, i.item.order()))
            .map(|i| i.item.id);
        let Some(id) = next else {
            self.request_split();
            return Lease::Wait;
        };
        let inputs = self.inputs_of(id);
        let epoch = self.epoch;
        let it = self.items.get_mut(&id).expect("found above");
        it.attempts += 1;
        it.not_before = None;
        it.prefer = None;
        let attempt = epoch * 1000 + it.attempts;
        it.state = ItemState::Running {
            worker: w.worker.clone(),
            incarnation: w.incarnation.clone(),
            attempt,
            since: now,
            unlisted: 0,
        };
        it.units_started = 0;
        let item = it.item.clone();
        // Items after the reads see the watermark the reads of their stage's sources reached
        // (shard items wait for every read of the checkpoint, above).
        let checkpoint = self.checkpoint_of(item.stage);
        let commit = self.commit_parts(item.stage);
        Lease::Work(Box::new(Assignment {
            item,
            attempt,
            inputs,
            checkpoint,
            commit,
        }))
    }

    /// For a sink's commit stage, the temp parts of the sink, from its writers' reports
    /// (every one of them done: the stage is runnable only then).
    fn commit_parts(&self, stage: usize) -> Vec<riverbank_io::TempPart> {
        match self.plan.plan.stages[stage].commits() {
            Some(sink) => self.sink_parts().remove(&sink).unwrap_or_default(),
            None => vec![],
        }
    }

    /// Adaptive coalescing of small shuffle partitions, as Spark's adaptive query execution
    /// does it. When a batch stage made of shuffle partitions becomes runnable, the size of
    /// each partition is known from its producers' reports; neighbouring partitions whose
    /// shuffled bytes together stay within the limit become one item, which runs them one
    /// after another (each with its own combiner and its own sink part, so the output is the
    /// same as uncoalesced). Small partitions then cost one lease, one report and one item's
    /// start instead of one each. Decided once per stage, before any of its items runs; the
    /// caller logs the events, so a restarted coordinator keeps the same items.
    pub fn coalesce(&mut self, now: Instant) -> Vec<Event> {
        // A streaming stage's partitions are state shards, each kept on one worker's disk.
        if self.coalesce_bytes == 0
            || self.plan.plan.is_streaming()
            || self.checkpoint.is_some()
            || self.phase.is_terminal()
            || self.coalesced.iter().all(|&c| c)
        {
            return vec![];
        }
        let runnable = self.runnable_stages();
        let mut out = vec![];
        for (s, runnable) in runnable.into_iter().enumerate() {
            if self.coalesced[s] || !runnable {
                continue;
            }
            self.coalesced[s] = true;
            let mut partitions = vec![];
            for i in self.items.values().filter(|i| i.item.stage == s) {
                match (&i.state, &i.item.input) {
                    (ItemState::Pending, ItemInput::Partition(p)) => partitions.push(*p),
                    _ => break,
                }
            }
            let all = self.items.values().filter(|i| i.item.stage == s).count();
            if partitions.len() != all {
                continue; // some already ran: they stay as they are
            }
            partitions.sort_unstable();
            let mut bytes: BTreeMap<u32, u64> = BTreeMap::new();
            for r in self.done_reports() {
                for f in r.shuffle.iter().filter(|f| f.consumer == s) {
                    *bytes.entry(f.partition).or_default() += f.bytes;
                }
            }
            let (mut groups, mut size, mut count) = (vec![], 0u64, 0u32);
            for p in &partitions {
                let b = bytes.get(p).copied().unwrap_or(0);
                if count > 0 && size + b > self.coalesce_bytes {
                    groups.push(count);
                    (size, count) = (0, 0);
                }
                size += b;
                count += 1;
            }
            if count > 0 {
                groups.push(count);
            }
            if groups.len() < partitions.len() {
                let e = Event::Coalesced { stage: s, groups };
                self.apply(&e, now);
                out.push(e);
            }
        }
        out
    }

    /// Applies [`Event::Coalesced`]: each group's first partition item takes the group's
    /// partitions; the others go.
    fn merge_partitions(&mut self, stage: usize, groups: &[u32]) {
        if let Some(c) = self.coalesced.get_mut(stage) {
            *c = true;
        }
        let mut ids: Vec<(u32, u64)> = self
            .items
            .values()
            .filter(|i| i.item.stage == stage)
            .filter_map(|i| match i.item.input {
                ItemInput::Partition(p) => Some((p, i.item.id)),
                _ => None,
            })
            .collect();
        ids.sort_unstable();
        let mut rest = ids.as_slice();
        for &count in groups {
            let (group, after) = rest.split_at((count as usize).min(rest.len()));
            rest = after;
            let [(first, keep), others @ ..] = group else {
                continue;
            };
            if others.is_empty() {
                continue;
            }
            for (_, id) in others {
                self.items.remove(id);
            }
            if let Some(it) = self.items.get_mut(keep) {
                it.item.input = ItemInput::Partitions {
                    first: *first,
                    count: group.len() as u32,
                };
            }
        }
    }

    /// Where item `id` finds its input: for each stage input, the producers' files of its
    /// partitions, partition after partition, producers in canonical order.
    fn inputs_of(&self, id: u64) -> Vec<Vec<ShuffleRef>> {
        let item = &self.items[&id].item;
        let parts = item.partitions();
        let stage = &self.plan.plan.stages[item.stage];
        let mut out = vec![];
        for (input, si) in stage.inputs.iter().enumerate() {
            let mut producers: Vec<&Item> = self
                .items
                .values()
                .filter(|i| si.from_stages.contains(&i.item.stage))
                .collect();
            producers.sort_by_key(|i| (i.item.stage, i.item.order()));
            let mut refs = vec![];
            for p in producers {
                let ItemState::Done {
                    worker,
                    address,
                    report,
                    ..
                } = &p.state
                else {
                    continue;
                };
                // Where its worker serves files now: a worker restarted under its name (with its
                // disk) may listen elsewhere than when it reported the item.
                let address = self.workers.get(worker).map_or(address, |w| &w.address);
                let mut files: Vec<_> = report
                    .shuffle
                    .iter()
                    .filter(|f| f.consumer == stage.index && f.input == input)
                    .filter(|f| parts.is_empty() || parts.contains(&f.partition))
                    .collect();
                files.sort_by_key(|f| f.partition);
                refs.extend(files.into_iter().map(|f| ShuffleRef {
                    producer: p.item.id,
                    address: address.clone(),
                    path: f.path.clone(),
                    offset: f.offset,
                    len: f.bytes,
                    partition: f.partition,
                }));
            }
            // Stable: producers stay in canonical order within each partition.
            refs.sort_by_key(|r| r.partition);
            out.push(refs);
        }
        out
    }

    /// An idle worker wants work: ask the running source item with the most unread units to
    /// give half of them away (dynamic work rebalancing).
    fn request_split(&mut self) {
        if self
            .items
            .values()
            .any(|i| i.split_request && matches!(i.state, ItemState::Running { .. }))
        {
            return; // one at a time: the answer changes what is left
        }
        let candidate = self
            .items
            .values_mut()
            .filter(|i| i.splittable())
            .max_by_key(|i| {
                (
                    i.units_total - i.units_started,
                    std::cmp::Reverse(i.item.id),
                )
            });
        if let Some(c) = candidate {
            c.split_request = true;
        }
    }

    /// Progress of a worker's running items; returns the items it should split.
    /// `w` must have been [`seen`](Self::seen) first. An item the tracker has running on `w`
    /// for over a second that two heartbeats in a row do not list is lost: the lease reply
    /// never arrived, or the worker forgot it. It runs again (events: see [`Self::fail`]).
    pub fn heartbeat(
        &mut self,
        w: &WorkerId,
        running: &[AttemptProgress],
        cpu: f64,
        rss: u64,
        now: Instant,
    ) -> (Vec<u64>, Vec<Event>) {
        if !self.is_known(w) {
            return (vec![], vec![]);
        }
        if let Some(k) = self.workers.get_mut(&w.worker) {
            k.cpu = cpu;
            k.rss = rss;
        }
        let mut split = vec![];
        for p in running {
            if let Some(it) = self.items.get_mut(&p.item)
                && let ItemState::Running {
                    attempt: a,
                    unlisted,
                    ..
                } = &mut it.state
                && *a == p.attempt
            {
                *unlisted = 0;
                it.record(p);
                if std::mem::take(&mut it.split_request) {
                    split.push(p.item);
                }
            }
        }
        let mut forgotten = vec![];
        for it in self.items.values_mut() {
            if let ItemState::Running {
                worker,
                incarnation,
                attempt,
                since,
                unlisted,
            } = &mut it.state
                && *worker == w.worker
                && *incarnation == w.incarnation
                && now.saturating_duration_since(*since) > Duration::from_secs(1)
                && !running
                    .iter()
                    .any(|r| (r.item, r.attempt) == (it.item.id, *attempt))
            {
                *unlisted += 1;
                if *unlisted >= 2 {
                    forgotten.push(it.item.id);
                }
            }
        }
        let events = if forgotten.is_empty() {
            vec![]
        } else {
            tracing::warn!(worker = %w.worker, items = ?forgotten, "the worker does not run items leased to it; they run again");
            self.requeue(forgotten, "its worker stopped listing it", now)
        };
        (split, events)
    }

    /// Items to split, for an in-process worker loop that reads the flags directly.
    pub fn take_split_requests(&mut self) -> Vec<(u64, u32)> {
        let mut out = vec![];
        for it in self.items.values_mut() {
            if let ItemState::Running { attempt, .. } = it.state
                && std::mem::take(&mut it.split_request)
            {
                out.push((it.item.id, attempt));
            }
        }
        out
    }

    /// Progress of one running attempt (in-process runs).
    pub fn progress_of(&mut self, p: &AttemptProgress) {
        if let Some(it) = self.items.get_mut(&p.item)
            && matches!(it.state, ItemState::Running { attempt: a, .. } if a == p.attempt)
        {
            it.record(p);
        }
    }

    /// The worker running `id` proposes to keep `keep` and give away `give`.
    pub fn propose_split(
        &mut self,
        id: u64,
        attempt: u32,
        keep: Split,
        give: Split,
        now: Instant,
    ) -> Report {
        let Some(it) = self.items.get(&id) else {
            return Report::Rejected;
        };
        if self.phase.is_terminal()
            || !matches!(it.state, ItemState::Running { attempt: a, .. } if a == attempt)
        {
            return Report::Rejected;
        }
        if let ItemInput::Read { range, .. } = &it.item.input
            && *range == keep
        {
            // This very split, offered again (its answer was lost): it stands.
            return Report::AcceptedBefore;
        }
        let e = Event::Split {
            item: id,
            keep,
            residual: self.next_id,
            give,
        };
        self.apply(&e, now);
        Report::Accepted(Box::new(e))
    }

    /// The worker finished an attempt. Only the current attempt's results count.
    /// `w` must have been [`seen`](Self::seen) first: a report from another incarnation than
    /// the one holding the lease is rejected, as is any attempt that is not the current one.
    pub fn complete(
        &mut self,
        w: &WorkerId,
        id: u64,
        attempt: u32,
        report: ItemReport,
        now: Instant,
    ) -> Report {
        let Some(it) = self.items.get(&id) else {
            return Report::Rejected;
        };
        match &it.state {
            ItemState::Done {
                attempt: a, worker, ..
            } if *a == attempt && *worker == w.worker => return Report::AcceptedBefore,
            ItemState::Running {
                attempt: a,
                worker,
                incarnation,
                ..
            } if *a == attempt
                && *worker == w.worker
                && *incarnation == w.incarnation
                && !self.phase.is_terminal() => {}
            _ => return Report::Rejected,
        }
        let since = match &it.state {
            ItemState::Running { since, .. } => Some(*since),
            _ => None,
        };
        let e = Event::Completed {
            item: id,
            attempt,
            worker: w.worker.clone(),
            address: w.address.clone(),
            report,
        };
        self.apply(&e, now);
        if let (Some(since), Some(it)) = (since, self.items.get_mut(&id)) {
            it.duration = Some(now.saturating_duration_since(since));
        }
        self.sample(now);
        Report::Accepted(Box::new(e))
    }

    /// An attempt failed. Returns what to log.
    pub fn fail(&mut self, id: u64, attempt: u32, why: ItemFailure, now: Instant) -> Vec<Event> {
        let Some(it) = self.items.get_mut(&id) else {
            return vec![];
        };
        if !matches!(it.state, ItemState::Running { attempt: a, .. } if a == attempt)
            || self.phase.is_terminal()
        {
            return vec![];
        }
        match why {
            ItemFailure::Fatal(failure) => {
                let e = Event::Failed { failure };
                self.apply(&e, now);
                vec![e]
            }
            ItemFailure::Released => {
                it.state = ItemState::Pending;
                vec![]
            }
            ItemFailure::ShuffleLost { producer, message } => {
                let reader = match &it.state {
                    ItemState::Running { worker, .. } => worker.clone(),
                    _ => String::new(),
                };
                it.state = ItemState::Pending;
                it.failures += 1;
                it.last_failure = Some(format!("its input was lost: {message}"));
                // Read again after a backoff, not at once: what made the input unreachable
                // (a name that does not resolve yet, a restarting pod) takes seconds to pass.
                let backoff = RETRY_BACKOFF
                    .saturating_mul(1 << it.failures.saturating_sub(1).min(16))
                    .min(MAX_RETRY_BACKOFF);
                it.not_before = Some(now + backoff);
                tracing::warn!(
                    item = id,
                    producer,
                    retry_in_ms = backoff.as_millis() as u64,
                    "shuffle input lost, recomputing: {message}"
                );
                let patience = self.output_patience;
                let mut out = vec![];
                if let Some(p) = self.items.get_mut(&producer)
                    && let ItemState::Done {
                        worker, address, ..
                    } = &p.state
                {
                    let what = format!("on worker {worker} at {address}: {message}");
                    match &mut p.unreachable {
                        Some(u) if now.saturating_duration_since(u.last) <= patience => {
                            u.times += 1;
                            u.last = now;
                            u.what = what;
                        }
                        u => {
                            *u = Some(Unreachable {
                                since: now,
                                last: now,
                                times: 1,
                                what,
                            })
                        }
                    }
                    // Recomputed where it will be read: on the reader's own disk.
                    if !reader.is_empty() {
                        p.prefer = Some((reader, now + PREFER_READER_FOR));
                    }
                    let e = Event::Invalidated { item: producer };
                    self.apply(&e, now);
                    out.push(e);
                }
                out.extend(self.check_lost(producer, now));
                out
            }
        }
    }

    /// Fails the job when an item keeps getting lost.
    ///
    /// Dataflow retries a failing *bundle* 4 times (`max_attempts`, in `exec`), but retries
    /// work lost to worker issues without counting it as the code's failure. A worker that dies
    /// while running the same item [`MAX_WORKER_LOSSES`] times is a crash loop on that item (a
    /// record that makes the process crash or run out of memory): the job fails, naming it.
    /// Output lost after the item finished is not the item's doing (a disk went away with its
    /// worker); it only fails the job when it keeps happening, as when no worker can reach
    /// another's files.
    fn check_lost(&mut self, id: u64, now: Instant) -> Vec<Event> {
        let Some(it) = self.items.get(&id) else {
            return vec![];
        };
        let unreachable = it.unreachable.as_ref().filter(|u| {
            u.times >= MAX_WORKER_LOSSES
                && now.saturating_duration_since(u.since) >= self.output_patience
        });
        let (message, attempts) = if it.lost >= MAX_WORKER_LOSSES {
            (
                format!(
                    "was lost {} times while running (its workers died)",
                    it.lost
                ),
                it.lost,
            )
        } else if let Some(u) = unreachable {
            (
                format!(
                    "({}) had its output unreachable to its readers for {} s ({} times, recomputed each time; the patience is {} s, --output-patience-secs); the last time {}",
                    it.describe(),
                    now.saturating_duration_since(u.since).as_secs(),
                    u.times,
                    self.output_patience.as_secs(),
                    u.what
                ),
                u.times,
            )
        } else {
            return vec![];
        };
        if self.phase.is_terminal() {
            return vec![];
        }
        let name = self.plan.plan.stages[it.item.stage].id();
        let e = Event::Failed {
            failure: JobFailure {
                transform: None,
                message: format!("work item {id} of stage {name} {message}; giving up"),
                record: None,
                attempts,
            },
        };
        self.apply(&e, now);
        vec![e]
    }

    /// Declares workers silent for longer than the lease timeout dead: their running items run
    /// again elsewhere, and their finished output still needed by a later stage is recomputed
    /// (it lived on their disk).
    pub fn expire(&mut self, now: Instant) -> Vec<Event> {
        let dead: Vec<String> = self
            .workers
            .iter()
            .filter(|(_, w)| w.alive && now.duration_since(w.last_seen) > self.lease_timeout)
            .map(|(n, _)| n.clone())
            .collect();
        let mut events = vec![];
        for name in dead {
            tracing::warn!(worker = %name, "worker missed its lease; re-running its work");
            if let Some(w) = self.workers.get_mut(&name) {
                w.alive = false;
            }
            events.extend(self.worker_gone(&name, now));
        }
        events
    }

    /// Re-queues what a gone worker held, and recomputes its finished output that a later
    /// stage still needs (it lived on the worker's disk).
    pub fn worker_gone(&mut self, name: &str, now: Instant) -> Vec<Event> {
        let mut events = vec![];
        let invalidate: Vec<(u64, usize)> = self
            .items
            .values()
            .filter(|it| {
                matches!(&it.state, ItemState::Done { worker, report, .. }
                    if worker == name && !report.shuffle.is_empty())
            })
            .map(|it| (it.item.id, it.item.stage))
            .collect();
        for (id, stage) in invalidate {
            if self.output_needed(stage) {
                let e = Event::Invalidated { item: id };
                self.apply(&e, now);
                events.push(e);
            }
        }
        let held = self.running_on(|worker, _| worker == name);
        events.extend(self.requeue(held, "its worker was lost", now));
        events
    }

    /// Items running on the workers (name, incarnation) that `on` picks.
    fn running_on(&self, on: impl Fn(&str, &str) -> bool) -> Vec<u64> {
        self.items
            .values()
            .filter(|it| {
                matches!(&it.state, ItemState::Running { worker, incarnation, .. }
                    if on(worker, incarnation))
            })
            .map(|it| it.item.id)
            .collect()
    }

    /// Lost running attempts: their items are queued again; one lost too often fails the job.
    fn requeue(&mut self, ids: Vec<u64>, why: &str, now: Instant) -> Vec<Event> {
        for id in &ids {
            if let Some(it) = self.items.get_mut(id) {
                if let ItemState::Running { worker, .. } = &it.state {
                    it.last_failure = Some(format!("{why} ({worker})"));
                }
                it.state = ItemState::Pending;
                it.lost += 1;
                it.failures += 1;
                it.split_request = false;
            }
        }
        ids.into_iter()
            .flat_map(|id| self.check_lost(id, now))
            .collect()
    }

    /// Some consumer of `stage`'s shuffle output has not finished.
    fn output_needed(&self, stage: usize) -> bool {
        self.plan.plan.stages.iter().any(|c| {
            c.inputs.iter().any(|i| i.from_stages.contains(&stage)) && !self.stage_complete(c.index)
        })
    }

    /// A worker leaves on purpose: no new work; what it runs is given back by the worker.
    /// (Only the incarnation that asked: a drain arriving late from a process that has since
    /// been replaced does not stop its successor.)
    pub fn drain(&mut self, w: &WorkerId) {
        if let Some(k) = self.workers.get_mut(&w.worker)
            && k.incarnation == w.incarnation
        {
            k.draining = true;
        }
    }

    pub fn cancel(&mut self, now: Instant) -> Option<Event> {
        if self.phase.is_terminal() {
            return None;
        }
        let e = Event::Cancelled;
        self.apply(&e, now);
        Some(e)
    }

    /// Sink parts of the finished items, per sink transform, in part order.
    pub fn sink_parts(&self) -> BTreeMap<usize, Vec<riverbank_io::TempPart>> {
        let mut out: BTreeMap<usize, Vec<riverbank_io::TempPart>> = BTreeMap::new();
        for it in self.items.values() {
            if let ItemState::Done { report, .. } = &it.state {
                for (t, p) in &report.sink_parts {
                    out.entry(*t).or_default().push(p.clone());
                }
            }
        }
        out
    }

    pub fn committed(&self) -> Option<&Vec<(String, Vec<String>)>> {
        self.committed.as_ref()
    }

    /// Shape of a stage, for callers deciding how to run it.
    pub fn stage_shape(&self, stage: usize) -> StageShape {
        stage_shape(&self.plan, &self.plan.plan.stages[stage])
    }

    pub fn partitions(&self) -> u32 {
        self.partitions
    }
}

#[cfg(test)]
mod tests;
