//! The coordinator's bookkeeping, without I/O: which items exist, who runs what, what is done
//! and where its output lives; when a stage may start, when the job is done or failed; which
//! running item to split for an idle worker. Time comes in as arguments, so it is testable, and
//! every durable change comes out as an [`Event`] the caller logs before answering, so a
//! restarted coordinator replays the log and resumes instead of starting over.
use super::exec::{Assignment, ItemReport};
use super::items::{ItemInput, StageShape, WorkItem, initial_items, stage_shape};
use super::shuffle::ShuffleRef;
use crate::compile::CompiledPlan;
use crate::error::RunError;
use crate::io::Split;
use riverbank_pipeline::{JobFailure, JobPhase, JobProgress, StageProgress, WorkerProgress};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
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
        attempt: u32,
    },
    Done {
        worker: String,
        address: String,
        report: ItemReport,
    },
}

#[derive(Clone, Debug)]
struct Item {
    item: WorkItem,
    state: ItemState,
    /// Attempts started in this epoch.
    attempts: u32,
    /// Times a lease was lost (the worker died) or the output was lost.
    lost: u32,
    units_started: u64,
    units_total: u64,
    /// Waiting to be sent to the worker running it.
    split_request: bool,
}

impl Item {
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
    address: String,
    last_seen: Instant,
    alive: bool,
    items_done: u64,
    cpu: f64,
    rss: u64,
    draining: bool,
}

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

pub struct Tracker {
    plan: Arc<CompiledPlan>,
    partitions: u32,
    max_attempts: u32,
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
}

impl Tracker {
    pub fn new(
        plan: Arc<CompiledPlan>,
        partitions: u32,
        max_attempts: u32,
        lease_timeout: Duration,
        now: Instant,
    ) -> Self {
        let mut next_id = 0;
        let mut items = BTreeMap::new();
        for s in &plan.plan.stages {
            for item in initial_items(&plan, s, partitions, &mut next_id) {
                items.insert(
                    item.id,
                    Item {
                        units_total: item.units().len() as u64,
                        item,
                        state: ItemState::Pending,
                        attempts: 0,
                        lost: 0,
                        units_started: 0,
                        split_request: false,
                    },
                );
            }
        }
        Tracker {
            plan,
            partitions,
            max_attempts,
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
        }
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
                    self.items.insert(
                        *residual,
                        Item {
                            units_total: new.units().len() as u64,
                            item: new,
                            state: ItemState::Pending,
                            attempts: 0,
                            lost: 0,
                            units_started: 0,
                            split_request: false,
                        },
                    );
                }
            }
            Event::Completed {
                item,
                worker,
                address,
                report,
                ..
            } => {
                if let Some(it) = self.items.get_mut(item) {
                    it.state = ItemState::Done {
                        worker: worker.clone(),
                        address: address.clone(),
                        report: report.clone(),
                    };
                    it.units_started = it.units_total;
                }
                if let Some(w) = self.workers.get_mut(worker) {
                    w.items_done += 1;
                }
                if self.phase == JobPhase::Pending {
                    self.phase = JobPhase::Running;
                }
            }
            Event::Invalidated { item } => {
                if let Some(it) = self.items.get_mut(item) {
                    it.state = ItemState::Pending;
                    it.lost += 1;
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

    /// A worker made contact (registration, heartbeat or any request).
    pub fn seen(&mut self, worker: &str, address: &str, now: Instant) {
        let w = self.workers.entry(worker.to_string()).or_insert(Worker {
            address: address.to_string(),
            last_seen: now,
            alive: true,
            items_done: 0,
            cpu: 0.0,
            rss: 0,
            draining: false,
        });
        w.address = address.to_string();
        w.last_seen = now;
        w.alive = true;
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

    /// Per stage: 0 waiting, 1 running, 2 done (for progress displays), in one pass.
    pub fn stage_states(&self) -> Vec<u64> {
        let mut states: Vec<u64> = self
            .completed_stages()
            .into_iter()
            .map(|done| if done { 2 } else { 0 })
            .collect();
        for i in self.items.values() {
            if states[i.item.stage] == 0 && !matches!(i.state, ItemState::Pending) {
                states[i.item.stage] = 1;
            }
        }
        states
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
    pub fn lease(&mut self, worker: &str, address: &str, now: Instant) -> Lease {
        self.seen(worker, address, now);
        if self.phase.is_terminal() {
            return Lease::Finished(self.phase);
        }
        if self.workers.get(worker).is_some_and(|w| w.draining) {
            return Lease::Wait;
        }
        if self.phase == JobPhase::Pending {
            self.phase = JobPhase::Running;
        }
        let runnable = self.runnable_stages();
        let next = self
            .items
            .values()
            .filter(|i| matches!(i.state, ItemState::Pending) && runnable[i.item.stage])
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
        let attempt = epoch * 1000 + it.attempts;
        it.state = ItemState::Running {
            worker: worker.to_string(),
            attempt,
        };
        it.units_started = 0;
        Lease::Work(Box::new(Assignment {
            item: it.item.clone(),
            attempt,
            inputs,
        }))
    }

    /// Where item `id` finds its input: for each stage input, the producers' files of its
    /// partition, producers in canonical order.
    fn inputs_of(&self, id: u64) -> Vec<Vec<ShuffleRef>> {
        let item = &self.items[&id].item;
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
                    address, report, ..
                } = &p.state
                else {
                    continue;
                };
                let mut files: Vec<_> = report
                    .shuffle
                    .iter()
                    .filter(|f| f.consumer == stage.index && f.input == input)
                    .filter(|f| match item.input {
                        ItemInput::Partition(part) => f.partition == part,
                        _ => true,
                    })
                    .collect();
                files.sort_by_key(|f| f.partition);
                refs.extend(files.into_iter().map(|f| ShuffleRef {
                    producer: p.item.id,
                    address: address.clone(),
                    path: f.path.clone(),
                    offset: f.offset,
                    len: f.bytes,
                }));
            }
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
    pub fn heartbeat(
        &mut self,
        worker: &str,
        address: &str,
        running: &[(u64, u32, u64, u64)],
        cpu: f64,
        rss: u64,
        now: Instant,
    ) -> Vec<u64> {
        self.seen(worker, address, now);
        if let Some(w) = self.workers.get_mut(worker) {
            w.cpu = cpu;
            w.rss = rss;
        }
        let mut split = vec![];
        for &(id, attempt, started, total) in running {
            if let Some(it) = self.items.get_mut(&id)
                && matches!(it.state, ItemState::Running { attempt: a, .. } if a == attempt)
            {
                it.units_started = started;
                it.units_total = total;
                if std::mem::take(&mut it.split_request) {
                    split.push(id);
                }
            }
        }
        split
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
    pub fn progress_of(&mut self, id: u64, attempt: u32, started: u64, total: u64) {
        if let Some(it) = self.items.get_mut(&id)
            && matches!(it.state, ItemState::Running { attempt: a, .. } if a == attempt)
        {
            it.units_started = started;
            it.units_total = total;
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
    ) -> Option<Event> {
        if self.phase.is_terminal() {
            return None;
        }
        let it = self.items.get(&id)?;
        if !matches!(it.state, ItemState::Running { attempt: a, .. } if a == attempt) {
            return None;
        }
        let e = Event::Split {
            item: id,
            keep,
            residual: self.next_id,
            give,
        };
        self.apply(&e, now);
        Some(e)
    }

    /// The worker finished an attempt. Only the current attempt's results count.
    pub fn complete(
        &mut self,
        worker: &str,
        address: &str,
        id: u64,
        attempt: u32,
        report: ItemReport,
        now: Instant,
    ) -> Option<Event> {
        self.seen(worker, address, now);
        if self.phase.is_terminal() {
            return None;
        }
        let it = self.items.get(&id)?;
        if !matches!(&it.state, ItemState::Running { attempt: a, .. } if *a == attempt) {
            return None;
        }
        let e = Event::Completed {
            item: id,
            attempt,
            worker: worker.to_string(),
            address: address.to_string(),
            report,
        };
        self.apply(&e, now);
        self.sample(now);
        Some(e)
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
                it.state = ItemState::Pending;
                tracing::warn!(
                    item = id,
                    producer,
                    "shuffle input lost, recomputing: {message}"
                );
                let mut out = vec![];
                if let Some(p) = self.items.get(&producer)
                    && matches!(p.state, ItemState::Done { .. })
                {
                    let e = Event::Invalidated { item: producer };
                    self.apply(&e, now);
                    out.push(e);
                }
                out.extend(self.check_lost(producer, now));
                out
            }
        }
    }

    /// Fails the job when an item keeps getting lost (a worker dies on it every time).
    fn check_lost(&mut self, id: u64, now: Instant) -> Vec<Event> {
        let Some(it) = self.items.get(&id) else {
            return vec![];
        };
        if it.lost < self.max_attempts || self.phase.is_terminal() {
            return vec![];
        }
        let name = self.plan.plan.stages[it.item.stage].id();
        let e = Event::Failed {
            failure: JobFailure {
                transform: None,
                message: format!(
                    "work item {id} of stage {name} was lost {} times (its workers died or its output became unreachable); giving up",
                    it.lost
                ),
                record: None,
                attempts: it.lost,
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

    /// Re-queues what a gone worker held.
    pub fn worker_gone(&mut self, name: &str, now: Instant) -> Vec<Event> {
        let mut events = vec![];
        let mut lost = vec![];
        let mut invalidate = vec![];
        for it in self.items.values_mut() {
            match &it.state {
                ItemState::Running { worker, .. } if worker == name => {
                    it.state = ItemState::Pending;
                    it.lost += 1;
                    it.split_request = false;
                    lost.push(it.item.id);
                }
                ItemState::Done { worker, report, .. }
                    if worker == name && !report.shuffle.is_empty() =>
                {
                    invalidate.push((it.item.id, it.item.stage));
                }
                _ => {}
            }
        }
        for (id, stage) in invalidate {
            if self.output_needed(stage) {
                let e = Event::Invalidated { item: id };
                self.apply(&e, now);
                events.push(e);
            }
        }
        for id in lost {
            events.extend(self.check_lost(id, now));
        }
        events
    }

    /// Some consumer of `stage`'s shuffle output has not finished.
    fn output_needed(&self, stage: usize) -> bool {
        self.plan.plan.stages.iter().any(|c| {
            c.inputs.iter().any(|i| i.from_stages.contains(&stage)) && !self.stage_complete(c.index)
        })
    }

    /// A worker leaves on purpose: no new work; what it runs is given back by the worker.
    pub fn drain(&mut self, worker: &str) {
        if let Some(w) = self.workers.get_mut(worker) {
            w.draining = true;
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
    pub fn sink_parts(&self) -> BTreeMap<usize, Vec<crate::io::TempPart>> {
        let mut out: BTreeMap<usize, Vec<crate::io::TempPart>> = BTreeMap::new();
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

    /// Elements out per transform, from accepted reports only (retries never count twice).
    pub fn elements_out(&self) -> Vec<u64> {
        let mut out = vec![0; self.plan.plan.graph.transforms.len()];
        for it in self.items.values() {
            if let ItemState::Done { report, .. } = &it.state {
                for &(t, n) in &report.elements_out {
                    out[t] += n;
                }
            }
        }
        out
    }

    /// Items finished per worker, for balance checks.
    pub fn items_per_worker(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for it in self.items.values() {
            if let ItemState::Done { worker, .. } = &it.state {
                *out.entry(worker.clone()).or_insert(0) += 1;
            }
        }
        out
    }

    /// (source bytes, rows) read by the finished items.
    pub fn read_totals(&self) -> (u64, u64) {
        self.done_reports()
            .fold((0, 0), |(a, b), r| (a + r.bytes_read, b + r.rows_read))
    }

    fn sample(&mut self, now: Instant) {
        let (bytes, rows) = self.read_totals();
        self.samples.push_back((now, bytes, rows));
        while self
            .samples
            .front()
            .is_some_and(|(t, ..)| now.duration_since(*t) > Duration::from_secs(30))
            && self.samples.len() > 2
        {
            self.samples.pop_front();
        }
    }

    /// The job's progress, as the coordinator serves it.
    pub fn progress(&self, job_name: &str, now: Instant) -> JobProgress {
        let remaining_bytes = self
            .items
            .values()
            .filter(|i| !matches!(i.state, ItemState::Done { .. }))
            .map(|i| {
                let b = i.item.estimated_bytes();
                let left = i.units_total.saturating_sub(i.units_started);
                b.checked_mul(left)
                    .and_then(|x| x.checked_div(i.units_total))
                    .unwrap_or(b)
            })
            .sum::<u64>();
        let (tput_b, tput_r) = match (self.samples.front(), self.samples.back()) {
            (Some(a), Some(b)) if b.0 > a.0 => {
                let dt = b.0.duration_since(a.0).as_secs_f64();
                ((b.1 - a.1) as f64 / dt, (b.2 - a.2) as f64 / dt)
            }
            _ => (0.0, 0.0),
        };
        let count = |f: &dyn Fn(&Item) -> bool| self.items.values().filter(|i| f(i)).count() as u64;
        let done = count(&|i| matches!(i.state, ItemState::Done { .. }));
        let running = count(&|i| matches!(i.state, ItemState::Running { .. }));
        let runnable_stages = self.runnable_stages();
        let runnable =
            count(&|i| matches!(i.state, ItemState::Pending) && runnable_stages[i.item.stage]);
        let splittable = count(&|i| i.splittable());
        let total = self.items.len() as u64;
        // Each item counts equally; a running source item by the share of its units read.
        let fraction = self
            .items
            .values()
            .map(|i| match i.state {
                ItemState::Done { .. } => 1.0,
                ItemState::Running { .. } if i.units_total > 0 => {
                    i.units_started.saturating_sub(1) as f64 / i.units_total as f64
                }
                _ => 0.0,
            })
            .sum::<f64>()
            / total.max(1) as f64;
        let stages = self
            .plan
            .plan
            .stages
            .iter()
            .map(|s| {
                let items: Vec<&Item> = self
                    .items
                    .values()
                    .filter(|i| i.item.stage == s.index)
                    .collect();
                let done: Vec<&ItemReport> = items
                    .iter()
                    .filter_map(|i| match &i.state {
                        ItemState::Done { report, .. } => Some(report),
                        _ => None,
                    })
                    .collect();
                let running = items
                    .iter()
                    .filter(|i| matches!(i.state, ItemState::Running { .. }))
                    .count() as u64;
                let first = s.ops.first().map(|o| o.transform);
                let last = s.ops.last().map(|o| o.transform);
                let out_of = |t: Option<usize>| {
                    t.map(|t| {
                        done.iter()
                            .flat_map(|r| &r.elements_out)
                            .filter(|(x, _)| *x == t)
                            .map(|(_, n)| n)
                            .sum::<u64>()
                    })
                    .unwrap_or(0)
                };
                StageProgress {
                    index: s.index,
                    name: s.id(),
                    state: if done.len() == items.len() {
                        "Done"
                    } else if running > 0 || !done.is_empty() {
                        "Running"
                    } else {
                        "Waiting"
                    }
                    .into(),
                    items_total: items.len() as u64,
                    items_done: done.len() as u64,
                    items_running: running,
                    elements_in: out_of(first),
                    elements_out: out_of(last),
                    bytes_in: done.iter().map(|r| r.bytes_read).sum::<u64>()
                        + self.shuffle_bytes_into(s.index),
                    bytes_out: done.iter().flat_map(|r| &r.shuffle).map(|f| f.bytes).sum(),
                }
            })
            .collect();
        let workers = self
            .workers
            .iter()
            .map(|(name, w)| WorkerProgress {
                name: name.clone(),
                address: w.address.clone(),
                alive: w.alive,
                items_done: w.items_done,
                items_running: self
                    .items
                    .values()
                    .filter(
                        |i| matches!(&i.state, ItemState::Running { worker, .. } if worker == name),
                    )
                    .count() as u64,
                cpu: w.cpu,
                rss_bytes: w.rss,
                last_seen_secs: now.duration_since(w.last_seen).as_secs_f64(),
                draining: w.draining,
            })
            .collect();
        let message = match self.phase {
            JobPhase::Pending => "waiting for workers".to_string(),
            JobPhase::Running => format!(
                "{done}/{total} work items done, {running} running, {} workers",
                self.workers.values().filter(|w| w.alive).count()
            ),
            JobPhase::Done => format!("done: {total} work items"),
            JobPhase::Failed => self
                .failure
                .as_ref()
                .map(|f| f.message.clone())
                .unwrap_or_else(|| "failed".into()),
            JobPhase::Cancelled => "cancelled".into(),
        };
        let since = |t: Instant| {
            let ago = now.saturating_duration_since(t);
            (chrono::Utc::now() - chrono::Duration::from_std(ago).unwrap_or_default()).to_rfc3339()
        };
        JobProgress {
            job_name: job_name.to_string(),
            phase: self.phase,
            message,
            failure: self.failure.clone(),
            started_at: Some(since(self.started)),
            finished_at: self.finished_at.map(since),
            work_items_total: total,
            work_items_done: done,
            work_items_running: running,
            fraction_consumed: fraction.clamp(0.0, 1.0),
            remaining_bytes,
            throughput_bytes_per_sec: tput_b,
            throughput_elements_per_sec: tput_r,
            backlog_seconds: (tput_b > 0.0).then(|| remaining_bytes as f64 / tput_b),
            active_keys: None,
            runnable_items: runnable,
            splittable_items: splittable,
            workers,
            stages,
        }
    }

    /// The reports of the finished items.
    fn done_reports(&self) -> impl Iterator<Item = &ItemReport> {
        self.items.values().filter_map(|i| match &i.state {
            ItemState::Done { report, .. } => Some(report),
            _ => None,
        })
    }

    /// Shuffle bytes written by the finished items.
    pub fn shuffle_bytes(&self) -> u64 {
        self.done_reports()
            .flat_map(|r| &r.shuffle)
            .map(|f| f.bytes)
            .sum()
    }

    fn shuffle_bytes_into(&self, stage: usize) -> u64 {
        self.done_reports()
            .flat_map(|r| &r.shuffle)
            .filter(|f| f.consumer == stage)
            .map(|f| f.bytes)
            .sum()
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
mod tests {
    use super::*;
    use crate::engine::shuffle::ShuffleFile;

    /// Create → Combine → Write: a one-item stage, then `partitions` shuffle items.
    async fn tracker(partitions: u32) -> Tracker {
        let yaml = r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{k: a, v: 1}, {k: b, v: 2}]}}
    - {type: Combine, name: Sum, input: In, config: {group_by: [k], combine: {t: {fn: sum, value: v}}}}
    - {type: WriteToJson, name: Out, input: Sum, config: {path: "memory:///out/x.jsonl"}}
"#;
        let plan = riverbank_pipeline::load_plan(yaml, &Default::default(), "t").unwrap();
        let plan = crate::compile(plan, 1024).await.unwrap();
        Tracker::new(
            Arc::new(plan),
            partitions,
            4,
            Duration::from_secs(5),
            Instant::now(),
        )
    }

    fn work(l: Lease) -> Assignment {
        match l {
            Lease::Work(a) => *a,
            other => panic!("expected work, got {other:?}"),
        }
    }

    fn report_with_shuffle(partitions: u32) -> ItemReport {
        ItemReport {
            shuffle: (0..partitions)
                .map(|p| ShuffleFile {
                    consumer: 1,
                    input: 0,
                    partition: p,
                    path: "j/s0/data.arrows".into(),
                    offset: u64::from(p) * 10,
                    rows: 1,
                    bytes: 10,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_running_source_item_with_units_left_to_give_can_be_split() {
        let read = |started, total, state| Item {
            item: WorkItem {
                id: 1,
                stage: 0,
                input: ItemInput::Read {
                    split: 0,
                    range: crate::io::Split {
                        location: "a.parquet".into(),
                        kind: crate::io::SplitKind::RowGroups { first: 0, count: 4 },
                        estimated_bytes: 4,
                        file_size: 4,
                        estimated_rows: None,
                        csv: None,
                    },
                },
            },
            state,
            attempts: 1,
            lost: 0,
            units_started: started,
            units_total: total,
            split_request: false,
        };
        let running = || ItemState::Running {
            worker: "w".into(),
            attempt: 1,
        };
        // Reading unit 1 of 4 (or not started): 3 to give. Reading the last one: nothing.
        assert!(read(1, 4, running()).splittable());
        assert!(read(0, 4, running()).splittable());
        assert!(read(3, 4, running()).splittable());
        assert!(!read(4, 4, running()).splittable());
        assert!(!read(1, 1, running()).splittable(), "one row group");
        assert!(
            !read(1, 4, ItemState::Pending).splittable(),
            "queued, not split"
        );
        let mut create = read(1, 4, running());
        create.item.input = ItemInput::Create;
        assert!(!create.splittable());
    }

    #[tokio::test]
    async fn stages_wait_for_their_producers_and_read_them_by_partition() {
        let mut t = tracker(2).await;
        let now = Instant::now();
        let a = work(t.lease("w1", "h1:1", now));
        assert_eq!(a.item.stage, 0);
        // Nothing else runnable until the producer stage is done.
        assert_eq!(t.lease("w2", "h2:1", now), Lease::Wait);
        assert!(
            t.complete(
                "w1",
                "h1:1",
                a.item.id,
                a.attempt,
                report_with_shuffle(2),
                now
            )
            .is_some()
        );
        let b = work(t.lease("w2", "h2:1", now));
        let c = work(t.lease("w1", "h1:1", now));
        assert_eq!((b.item.stage, c.item.stage), (1, 1));
        assert_eq!(b.inputs[0].len(), 1);
        assert_eq!(b.inputs[0][0].address, "h1:1");
        assert_ne!(
            b.inputs[0][0].offset, c.inputs[0][0].offset,
            "each partition its own range"
        );
        for x in [&b, &c] {
            t.complete("w", "h", x.item.id, x.attempt, ItemReport::default(), now);
        }
        assert!(t.all_done());
        assert_eq!(
            t.lease("w1", "h1:1", now),
            Lease::Wait,
            "commit pending, not terminal"
        );
    }

    #[tokio::test]
    async fn only_the_current_attempt_counts() {
        let mut t = tracker(1).await;
        let now = Instant::now();
        let a = work(t.lease("w1", "h1:1", now));
        // w1 goes silent; its lease expires and the item runs again elsewhere.
        let later = now + Duration::from_secs(6);
        t.seen("w2", "h2:1", later);
        t.expire(later);
        let b = work(t.lease("w2", "h2:1", later));
        assert_eq!(b.item.id, a.item.id);
        assert_ne!(b.attempt, a.attempt);
        assert!(
            t.complete(
                "w1",
                "h1:1",
                a.item.id,
                a.attempt,
                ItemReport::default(),
                later
            )
            .is_none()
        );
        assert!(
            t.complete(
                "w2",
                "h2:1",
                b.item.id,
                b.attempt,
                report_with_shuffle(1),
                later
            )
            .is_some()
        );
    }

    #[tokio::test]
    async fn a_dead_workers_needed_output_is_recomputed_and_four_losses_fail_the_job() {
        let mut t = tracker(1).await;
        let mut now = Instant::now();
        let a = work(t.lease("w1", "h1:1", now));
        t.complete(
            "w1",
            "h1:1",
            a.item.id,
            a.attempt,
            report_with_shuffle(1),
            now,
        );
        // w1 dies while the consumer stage still needs its shuffle file.
        now += Duration::from_secs(6);
        t.seen("w2", "h2:1", now);
        let events = t.expire(now);
        assert!(
            events.contains(&Event::Invalidated { item: a.item.id }),
            "{events:?}"
        );
        let again = work(t.lease("w2", "h2:1", now));
        assert_eq!(
            again.item.id, a.item.id,
            "the producer runs again before its consumers"
        );
        // An item whose worker keeps dying fails the job after 4 losses.
        for _ in 0..3 {
            now += Duration::from_secs(6);
            t.seen("w3", "h3:1", now);
            t.expire(now);
            if t.phase().is_terminal() {
                break;
            }
            work(t.lease("w2", "h2:1", now));
        }
        now += Duration::from_secs(6);
        t.seen("w3", "h3:1", now);
        t.expire(now);
        assert_eq!(t.phase(), JobPhase::Failed);
        assert!(
            t.failure().unwrap().message.contains("lost 4 times"),
            "{:?}",
            t.failure()
        );
    }

    #[tokio::test]
    async fn a_fatal_failure_fails_the_job_and_a_replayed_log_resumes_the_same_state() {
        let mut t = tracker(2).await;
        let now = Instant::now();
        let mut log = vec![t.start_epoch()];
        let a = work(t.lease("w1", "h1:1", now));
        log.extend(t.complete(
            "w1",
            "h1:1",
            a.item.id,
            a.attempt,
            report_with_shuffle(2),
            now,
        ));
        let b = work(t.lease("w1", "h1:1", now));
        // Replay into a fresh tracker: the done producer stays done; attempts get a new epoch.
        let mut r = tracker(2).await;
        for e in &log {
            r.apply(e, now);
        }
        let next = r.start_epoch();
        assert_eq!(next, Event::Started { epoch: 2 });
        let again = work(r.lease("w2", "h2:1", now));
        assert_eq!(again.item.stage, 1, "the finished stage is not re-run");
        assert!(
            again.attempt > 2000,
            "attempts of epoch 2: {}",
            again.attempt
        );
        let events = t.fail(
            b.item.id,
            b.attempt,
            ItemFailure::Fatal(JobFailure {
                transform: Some("Sum".into()),
                message: "boom".into(),
                record: None,
                attempts: 4,
            }),
            now,
        );
        assert_eq!(events.len(), 1);
        assert_eq!(t.phase(), JobPhase::Failed);
        assert_eq!(
            t.lease("w1", "h1:1", now),
            Lease::Finished(JobPhase::Failed)
        );
    }
}
