//! Cutting a stage's input into bundles and running them over the harnesses: each harness
//! takes bundles from a shared queue, two at a time; a failed bundle goes back on the queue
//! until it has had [`ATTEMPTS`] tries, and a bundle whose harness died goes back too.
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::keyed::{Clock, KeyedRounds, TimerSet};
use super::progress::Live;
use super::spill::{Block, Spill};
use super::{ATTEMPTS, BLOCK_BYTES};
use crate::coders::Shape;
use crate::error::PortableError;
use crate::fn_api::DelayedBundleApplication;
use crate::fnapi::{
    BundleFailure, BundleInputs, BundleOutput, BundleState, OutputSink, SideInputStore,
    TimerFamily, UserState, Worker, Workers,
};
use crate::plan::Keyed;
use crate::runner_api::Components;

/// A bundle's inputs: data-source transform id and blocks of whole elements (in memory or in
/// the job's spill file until the bundle runs).
pub(crate) type Bundle = Vec<(String, Vec<Block>)>;

/// A bundle's inputs read back, as the harness is sent them.
pub(crate) type Loaded = Vec<(String, Vec<Bytes>)>;

/// Bundles a harness runs at once: one computing while the next one's data arrives.
pub(crate) const SLOTS_PER_HARNESS: usize = 2;
/// Bundles per harness a stage's input is cut into, so that a slow one does not hold the stage.
const BUNDLES_PER_HARNESS: usize = 4;

/// Cuts `blocks` (elements of `shape`) into bundles of similar size, whole elements each.
pub(crate) fn split(
    blocks: &[Bytes],
    shape: &Shape,
    harnesses: usize,
) -> Result<Vec<Vec<Bytes>>, PortableError> {
    let mut bounds: Vec<(usize, usize, usize)> = Vec::new();
    let mut total = 0usize;
    for (b, block) in blocks.iter().enumerate() {
        let mut pos = 0;
        while pos < block.len() {
            let end = shape.skip(block, pos)?;
            bounds.push((b, pos, end));
            total += end - pos;
            pos = end;
        }
    }
    if bounds.is_empty() {
        return Ok(vec![Vec::new()]);
    }
    let pieces = harnesses.max(1) * BUNDLES_PER_HARNESS;
    let per_bundle_elements = bounds.len().div_ceil(pieces);
    let per_bundle_bytes = (total / pieces).clamp(64 << 10, 64 << 20);
    let mut bundles = Vec::new();
    let mut current: Vec<Bytes> = Vec::new();
    let (mut elements, mut bytes) = (0usize, 0usize);
    // A run of consecutive elements of one block: sliced without copying.
    let mut run: Option<(usize, usize, usize)> = None;
    let flush_run = |run: &mut Option<(usize, usize, usize)>, current: &mut Vec<Bytes>| {
        if let Some((b, s, e)) = run.take() {
            current.push(blocks[b].slice(s..e));
        }
    };
    for (b, s, e) in bounds {
        run = match run {
            Some((rb, rs, re)) if rb == b && re == s && e - rs <= BLOCK_BYTES => Some((rb, rs, e)),
            other => {
                let mut other = other;
                flush_run(&mut other, &mut current);
                Some((b, s, e))
            }
        };
        elements += 1;
        bytes += e - s;
        if elements >= per_bundle_elements || bytes >= per_bundle_bytes {
            flush_run(&mut run, &mut current);
            bundles.push(std::mem::take(&mut current));
            elements = 0;
            bytes = 0;
        }
    }
    flush_run(&mut run, &mut current);
    if !current.is_empty() {
        bundles.push(current);
    }
    Ok(bundles)
}

/// Cuts a materialized input into bundles: by element as [`split`] does while it is all in
/// memory; once part of it is on disk, by whole blocks, read back only when their bundle runs
/// (a bundle at most a quarter of the memory budget, so the bundles in flight stay near it).
pub(crate) fn cut(
    blocks: &[Block],
    shape: &Shape,
    harnesses: usize,
    budget: usize,
) -> Result<Vec<Vec<Block>>, PortableError> {
    let in_memory: Option<Vec<Bytes>> = blocks
        .iter()
        .map(|b| match b {
            Block::Memory(b) => Some(b.clone()),
            Block::Disk { .. } => None,
        })
        .collect();
    if let Some(bytes) = in_memory {
        return Ok(split(&bytes, shape, harnesses)?
            .into_iter()
            .map(|b| b.into_iter().map(Block::Memory).collect())
            .collect());
    }
    let total: usize = blocks.iter().map(Block::len).sum();
    let most = (budget / 4).clamp(1 << 20, 64 << 20);
    let per_bundle = (total / (harnesses.max(1) * BUNDLES_PER_HARNESS)).clamp(64 << 10, most);
    let mut bundles: Vec<Vec<Block>> = vec![Vec::new()];
    let mut bytes = 0;
    for block in blocks {
        if bytes >= per_bundle {
            bundles.push(Vec::new());
            bytes = 0;
        }
        bytes += block.len();
        bundles.last_mut().expect("one bundle").push(block.clone());
    }
    Ok(bundles)
}

/// What a bundle gave: its outputs kept in the job's spill store, and work it handed back.
pub(crate) struct Finished {
    pub outputs: HashMap<String, Vec<Block>>,
    pub residuals: Vec<DelayedBundleApplication>,
}

/// The bundles of one stage and how far they got.
pub(crate) struct Work {
    queue: Arc<Mutex<VecDeque<Queued>>>,
    /// Bundles on a harness now, which an idle harness may split (dynamic work rebalancing).
    running: Arc<Mutex<HashMap<String, Running>>>,
    /// The elements' shape, when the stage reads one input (only then are bundles split).
    shape: Option<Shape>,
    /// Where a residual of (transform, input tag) is fed: the stage's data source for it.
    residual_ports: HashMap<(String, String), String>,
    /// A stateful DoFn's stage: its timer families, whose timers are fired in further bundles.
    keyed: Option<Arc<Keyed>>,
    /// A streaming run's stateful stage: its buckets' state and timers, and the round's clock.
    rounds: Option<Arc<KeyedRounds>>,
}

/// A bundle waiting for a harness: its attempts so far, and (a streaming stateful stage's)
/// the bucket of keys it holds.
struct Queued {
    bundle: Bundle,
    attempt: usize,
    bucket: Option<usize>,
}

struct Running {
    worker: Arc<Worker>,
    port: String,
    blocks: Vec<Bytes>,
    elements: usize,
    started: Instant,
    /// Not split before then: a young bundle, or one whose harness kept it all when asked
    /// (it had not reached its element yet), which is asked again later.
    split_after: Instant,
    split: bool,
    /// Once split: what the harness kept (its primary), which is all a retry may run again.
    primary: Option<Loaded>,
}

/// A bundle younger than this is not split: its harness may finish it sooner than a split pays.
const SPLIT_AFTER: Duration = Duration::from_millis(300);
/// How often an idle harness slot looks again for a bundle to split.
const IDLE_POLL: Duration = Duration::from_millis(50);

/// What one round over the live harnesses gave.
pub(crate) struct Round {
    pub outputs: Vec<Finished>,
    /// A bundle failed [`ATTEMPTS`] times: the user's error.
    pub fatal: Option<String>,
    /// Bundles split while running, for the job's messages.
    pub splits: usize,
}

impl Work {
    /// `ports` maps each input PCollection to its data source; `shape` is given for a stage
    /// with one input.
    /// `rounds` is given for a streaming stateful stage, whose bundles each name their bucket.
    pub fn new(
        bundles: Vec<(Bundle, Option<usize>)>,
        components: &Components,
        transforms: &[String],
        ports: &HashMap<String, String>,
        shape: Option<Shape>,
        keyed: Option<Keyed>,
        rounds: Option<Arc<KeyedRounds>>,
    ) -> Work {
        let mut residual_ports = HashMap::new();
        for t in transforms {
            for (tag, pcoll) in &components.transforms[t].inputs {
                if let Some(port) = ports.get(pcoll) {
                    residual_ports.insert((t.clone(), tag.clone()), port.clone());
                }
            }
        }
        Work {
            queue: Arc::new(Mutex::new(
                bundles
                    .into_iter()
                    .map(|(bundle, bucket)| Queued {
                        bundle,
                        attempt: 0,
                        bucket,
                    })
                    .collect(),
            )),
            running: Default::default(),
            // A keyed bundle holds whole keys: it is not split.
            shape: if keyed.is_some() { None } else { shape },
            residual_ports,
            keyed: keyed.map(Arc::new),
            rounds,
        }
    }

    /// The stage's bundles waiting, and those running that an idle harness could split: what
    /// [`Live::backlog`] reads while the stage runs.
    pub fn bundles_view(&self) -> impl Fn() -> (u64, u64) + Send + Sync + 'static {
        let (queue, running) = (self.queue.clone(), self.running.clone());
        move || {
            let queued = queue.lock().expect("queue").len();
            let splittable = running
                .lock()
                .expect("running")
                .values()
                .filter(|r| !r.split && r.split_after <= Instant::now())
                .count();
            (queued as u64, splittable as u64)
        }
    }

    pub fn is_done(&self) -> bool {
        self.queue.lock().expect("queue").is_empty()
    }

    /// Queues what a splittable DoFn handed back, as a bundle of the input it came from.
    pub fn push_residual(
        &self,
        residual: DelayedBundleApplication,
        stage: &str,
    ) -> Result<(), PortableError> {
        let app = residual.application.unwrap_or_default();
        let port = self
            .residual_ports
            .get(&(app.transform_id.clone(), app.input_id.clone()))
            .ok_or_else(|| {
                PortableError::unsupported(
                    stage,
                    format!(
                        "a residual of '{}' that does not read the stage's input",
                        app.transform_id
                    ),
                )
            })?;
        self.queue.lock().expect("queue").push_back(Queued {
            bundle: vec![(port.clone(), vec![Block::Memory(Bytes::from(app.element))])],
            attempt: 0,
            bucket: None,
        });
        Ok(())
    }

    /// Runs queued bundles on `harnesses` until the queue is empty, a bundle has failed for
    /// good, or every harness is gone (the caller then starts new ones). A harness with nothing
    /// left to take splits the longest-running bundle and takes its rest. Harnesses that
    /// arrive on `joining` while it runs (started in a worker pool added since) take bundles
    /// too.
    #[allow(clippy::too_many_arguments)]
    pub async fn run(
        &mut self,
        workers: Arc<Workers>,
        harnesses: &[String],
        joining: &mut mpsc::UnboundedReceiver<String>,
        descriptor: &str,
        sinks: &[String],
        side_inputs: Option<Arc<SideInputStore>>,
        cancel: &watch::Receiver<bool>,
        live: &Arc<Live>,
        spill: &Arc<Spill>,
    ) -> Round {
        let keyed = self.keyed.clone();
        let rounds = self.rounds.clone();
        let outputs = Arc::new(Mutex::new(Vec::new()));
        let fatal: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
        let splits = Arc::new(Mutex::new(0usize));
        let this = Arc::new(Shared {
            queue: self.queue.clone(),
            running: self.running.clone(),
            ended: Mutex::default(),
            broken: Mutex::default(),
            shape: self.shape.clone(),
            residual_ports: self.residual_ports.clone(),
        });
        let mut tasks = JoinSet::new();
        let spawn_slots = |tasks: &mut JoinSet<()>, id: &str| {
            let Some(worker) = workers.get(id) else {
                return;
            };
            for _ in 0..SLOTS_PER_HARNESS {
                let (workers, worker, this) = (workers.clone(), worker.clone(), this.clone());
                let (outputs, fatal, cancel, splits, live, spill) = (
                    outputs.clone(),
                    fatal.clone(),
                    cancel.clone(),
                    splits.clone(),
                    live.clone(),
                    spill.clone(),
                );
                let (descriptor, sinks, side_inputs, keyed, rounds) = (
                    descriptor.to_string(),
                    sinks.to_vec(),
                    side_inputs.clone(),
                    keyed.clone(),
                    rounds.clone(),
                );
                tasks.spawn(async move {
                    loop {
                        if fatal.lock().expect("fatal").is_some() || *cancel.borrow() {
                            return;
                        }
                        let next = this.queue.lock().expect("queue").pop_front();
                        let next = match next {
                            Some(next) => next,
                            None => {
                                // Nothing queued: while bundles run elsewhere, split one when it
                                // is old enough and take its rest (this harness, not the busy
                                // one's other slot), or wait for one to end (it may fail and come
                                // back).
                                if this.running.lock().expect("running").is_empty() {
                                    return;
                                }
                                let mut rest = this.split_one(&workers, &worker.id).await.into_iter();
                                let Some(first) = rest.next() else {
                                    tokio::time::sleep(IDLE_POLL).await;
                                    continue;
                                };
                                *splits.lock().expect("splits") += 1;
                                this.queue.lock().expect("queue").extend(rest);
                                first
                            }
                        };
                        let Queued { bundle, attempt, bucket } = next;
                        let loaded: Result<Loaded, PortableError> = bundle
                            .iter()
                            .map(|(port, blocks)| Ok((port.clone(), spill.load_all(blocks)?)))
                            .collect();
                        let loaded = match loaded {
                            Ok(l) => l,
                            Err(e) => {
                                *fatal.lock().expect("fatal") = Some(e.to_string());
                                return;
                            }
                        };
                        let instruction = workers.new_instruction();
                        this.started(&instruction, &worker, &loaded);
                        live.started(&instruction, &worker);
                        let kept = Kept::new(&spill);
                        let sink: Arc<dyn OutputSink> = kept.clone();
                        let result = match &keyed {
                            None => {
                                let state = BundleState { side_inputs: side_inputs.clone(), user: None };
                                let inputs = BundleInputs { data: loaded, timers: vec![], outputs: Some(sink) };
                                workers
                                    .process_bundle(&worker, instruction.clone(), &descriptor, inputs, &sinks, state)
                                    .await
                            }
                            Some(keyed) => {
                                let chain = Chain { workers: &workers, worker: &worker, descriptor: &descriptor, sinks: &sinks };
                                let rounds = rounds.as_deref().zip(bucket);
                                chain.run(instruction.clone(), loaded, keyed, rounds, side_inputs.clone(), sink).await
                            }
                        };
                        // A bundle split while it ran is, on failure, retried as its primary
                        // only: its rest is another bundle already.
                        let primary = this.ended(&instruction, result.is_ok());
                        match result {
                            Ok(out) => {
                                live.finished(&instruction, &out.monitoring_infos);
                                let finalize = out.finalize.clone();
                                match kept.finish(out) {
                                    Ok(finished) => {
                                        outputs.lock().expect("outputs").push(finished);
                                        // Its output is the runner's now: the user's callbacks
                                        // run (best effort, as in Beam).
                                        for bundle in finalize {
                                            if let Err(e) = workers.finalize(&worker, &bundle).await {
                                                tracing::warn!(harness = %worker.id, "bundle finalization failed: {e}");
                                            }
                                        }
                                    }
                                    Err(e) => {
                                        *fatal.lock().expect("fatal") = Some(e.to_string());
                                        return;
                                    }
                                }
                            }
                            Err(failure) => {
                                live.failed(&instruction);
                                kept.discard();
                                tracing::warn!(harness = %worker.id, attempt = attempt + 1, "bundle failed: {failure}");
                                if attempt + 1 >= ATTEMPTS {
                                    *fatal.lock().expect("fatal") = Some(failure.to_string());
                                    return;
                                }
                                let retry = match primary {
                                    Some(primary) => primary
                                        .into_iter()
                                        .map(|(port, blocks)| (port, blocks.into_iter().map(Block::Memory).collect()))
                                        .collect(),
                                    None => bundle,
                                };
                                this.queue.lock().expect("queue").push_back(Queued { bundle: retry, attempt: attempt + 1, bucket });
                                if matches!(failure, BundleFailure::Lost(_)) {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        };
        for id in harnesses {
            spawn_slots(&mut tasks, id);
        }
        loop {
            tokio::select! {
                ended = tasks.join_next() => if ended.is_none() { break },
                Some(id) = joining.recv() => spawn_slots(&mut tasks, &id),
            }
        }
        let outputs = std::mem::take(&mut *outputs.lock().expect("outputs"));
        let fatal = fatal
            .lock()
            .expect("fatal")
            .take()
            .or_else(|| this.broken.lock().expect("broken").take());
        let splits = *splits.lock().expect("splits");
        Round {
            outputs,
            fatal,
            splits,
        }
    }
}

/// One attempt's output blocks, kept in the job's spill store as the harness sends them (so
/// neither a bundle's output nor a round's waits in memory for its end).
struct Kept {
    spill: Arc<Spill>,
    blocks: Mutex<HashMap<String, Vec<Block>>>,
    error: Mutex<Option<PortableError>>,
}

impl Kept {
    fn new(spill: &Arc<Spill>) -> Arc<Kept> {
        Arc::new(Kept {
            spill: spill.clone(),
            blocks: Mutex::default(),
            error: Mutex::default(),
        })
    }

    /// What the attempt gave, unless keeping a block failed.
    fn finish(&self, out: BundleOutput) -> Result<Finished, PortableError> {
        if let Some(e) = self.error.lock().expect("kept").take() {
            self.discard();
            return Err(e);
        }
        Ok(Finished {
            outputs: std::mem::take(&mut *self.blocks.lock().expect("kept")),
            residuals: out.residuals,
        })
    }

    /// A failed attempt's blocks: nobody reads them.
    fn discard(&self) {
        for (_, blocks) in self.blocks.lock().expect("kept").drain() {
            self.spill.release(&blocks);
        }
    }
}

impl OutputSink for Kept {
    fn take(&self, sink: &str, data: Bytes) {
        match self.spill.keep(data) {
            Ok(block) => self
                .blocks
                .lock()
                .expect("kept")
                .entry(sink.to_string())
                .or_default()
                .push(block),
            Err(e) => {
                self.error.lock().expect("kept").get_or_insert(e);
            }
        }
    }
}

/// A keyed bundle and the bundles that fire its timers, on one harness, with one user state:
/// the elements first, then, while any timer the clock fires is set, those timers (batch: the
/// watermark is past them all once the input ends). Fails as a whole, and is retried from the
/// start. In a streaming run (`rounds`: its bucket of a [`KeyedRounds`]) it starts from the
/// bucket's state and timers, fires what the round's clock fires, and leaves the rest set.
struct Chain<'a> {
    workers: &'a Workers,
    worker: &'a Arc<Worker>,
    descriptor: &'a str,
    sinks: &'a [String],
}

/// Rounds of timers after which a stateful DoFn is taken to be setting timers forever.
const MAX_TIMER_ROUNDS: usize = 10_000;

impl Chain<'_> {
    async fn run(
        &self,
        first: String,
        bundle: Loaded,
        keyed: &Keyed,
        rounds: Option<(&KeyedRounds, usize)>,
        side_inputs: Option<Arc<SideInputStore>>,
        outputs: Arc<dyn OutputSink>,
    ) -> Result<BundleOutput, BundleFailure> {
        let (user, mut timers, clock) = match rounds {
            Some((rounds, bucket)) => {
                let (user, timers) = rounds.checkout(bucket);
                (user, timers, rounds.clock())
            }
            None => (
                Arc::new(UserState::with_bags(&keyed.bags)),
                TimerSet::default(),
                Clock::END,
            ),
        };
        let state = BundleState {
            side_inputs,
            user: Some(user.clone()),
        };
        let empty: Loaded = bundle
            .iter()
            .map(|(port, _)| (port.clone(), Vec::new()))
            .collect();
        let no_timers = || {
            keyed
                .timer_families
                .iter()
                .map(|(t, f, _)| ((t.clone(), f.clone()), Vec::new()))
                .collect()
        };
        let mut inputs = bundle;
        let mut fired: Vec<(TimerFamily, Vec<Bytes>)> = no_timers();
        // The elements first, alone: one may set again a kept timer the clock fires, which
        // then fires once, as it was last set. A streaming bucket's bundle without elements
        // (it came for its timers) starts with them.
        let mut start = 0;
        if inputs.iter().all(|(_, blocks)| blocks.is_empty()) {
            match timers.take_due(keyed, clock) {
                Some(due) => (fired, start) = (due, 1),
                None => {
                    if let Some((rounds, bucket)) = rounds {
                        rounds.commit(bucket, user, timers);
                    }
                    return Ok(BundleOutput::default());
                }
            }
        }
        let mut total = BundleOutput::default();
        for round in start..MAX_TIMER_ROUNDS {
            let instruction = if round == start {
                first.clone()
            } else {
                self.workers.new_instruction()
            };
            let out = self
                .workers
                .process_bundle(
                    self.worker,
                    instruction,
                    self.descriptor,
                    BundleInputs {
                        data: inputs,
                        timers: fired,
                        outputs: Some(outputs.clone()),
                    },
                    self.sinks,
                    state.clone(),
                )
                .await?;
            for (sink, blocks) in out.outputs {
                total.outputs.entry(sink).or_default().extend(blocks);
            }
            total.monitoring_infos.extend(out.monitoring_infos);
            total.residuals.extend(out.residuals);
            total.finalize.extend(out.finalize);
            for (transform, family, shape) in &keyed.timer_families {
                let key = (transform.clone(), family.clone());
                let set = out.timers.get(&key).map(Vec::as_slice).unwrap_or(&[]);
                timers
                    .apply(&key, set, shape)
                    .map_err(|e| BundleFailure::Failed(e.to_string()))?;
            }
            match timers.take_due(keyed, clock) {
                Some(due) => fired = due,
                None => {
                    if let Some((rounds, bucket)) = rounds {
                        drop(state);
                        rounds.commit(bucket, user, timers);
                    }
                    return Ok(total);
                }
            }
            inputs = empty.clone();
        }
        Err(BundleFailure::Failed(format!(
            "timers were still being set after {MAX_TIMER_ROUNDS} rounds of firing them"
        )))
    }
}

/// A keyed stage's input cut into bundles by key, each key's elements in one: at least
/// `buckets` of them, more when the input is larger than the job's memory budget (a bundle then
/// takes at most a quarter of it), through the GroupByKey's partitioning, so the input is read
/// a block at a time and waits on disk past the budget.
pub(crate) fn by_key(
    spill: &Spill,
    blocks: &[Block],
    shape: &Shape,
    buckets: usize,
    stage: &str,
) -> Result<Vec<Vec<Block>>, PortableError> {
    let total: usize = blocks.iter().map(Block::len).sum();
    let buckets = buckets.max(total.div_ceil((spill.budget() / 4).max(1)));
    let not_kv = || {
        PortableError::unsupported(
            stage,
            "a stateful DoFn needs windowed key-value pairs as its input",
        )
    };
    let mut out = super::group::by_key_into(spill, blocks, shape, buckets, not_kv)?;
    out.retain(|b| !b.is_empty());
    Ok(out)
}

/// What the harness tasks of a round share.
struct Shared {
    queue: Arc<Mutex<VecDeque<Queued>>>,
    running: Arc<Mutex<HashMap<String, Running>>>,
    /// Bundles of this round that ended, and whether they succeeded (read with `running` held).
    ended: Mutex<HashMap<String, bool>>,
    /// A split whose rest could not be queued: the round fails with it.
    broken: Mutex<Option<String>>,
    shape: Option<Shape>,
    residual_ports: HashMap<(String, String), String>,
}

impl Shared {
    fn started(&self, instruction: &str, worker: &Arc<Worker>, bundle: &Loaded) {
        let (Some(shape), [(port, blocks)]) = (&self.shape, bundle.as_slice()) else {
            return;
        };
        let elements = blocks
            .iter()
            .map(|b| shape.split(b).map(|e| e.len()).unwrap_or(0))
            .sum();
        let running = Running {
            worker: worker.clone(),
            port: port.clone(),
            blocks: blocks.clone(),
            elements,
            started: Instant::now(),
            split_after: Instant::now() + SPLIT_AFTER,
            split: false,
            primary: None,
        };
        self.running
            .lock()
            .expect("running")
            .insert(instruction.to_string(), running);
    }

    /// Bundle `instruction` ended: no longer splittable. Its primary, if it was split.
    fn ended(&self, instruction: &str, ok: bool) -> Option<Loaded> {
        let mut running = self.running.lock().expect("running");
        self.ended
            .lock()
            .expect("ended")
            .insert(instruction.to_string(), ok);
        running.remove(instruction).and_then(|r| r.primary)
    }

    /// A split of `instruction` gave nothing: it may be split again after a pause, if it runs
    /// still.
    fn split_later(&self, instruction: &str) {
        if let Some(r) = self.running.lock().expect("running").get_mut(instruction) {
            r.split = false;
            r.split_after = Instant::now() + SPLIT_AFTER;
        }
    }

    /// When harness `idle` runs nothing, splits the longest-running bundle of another harness
    /// (not split yet) in half, and returns what that harness gives back, for `idle` to run:
    /// the elements it had not reached, or the rest of a splittable DoFn's restriction (none:
    /// nothing was split).
    async fn split_one(&self, workers: &Workers, idle: &str) -> Vec<Queued> {
        let candidate = {
            let mut running = self.running.lock().expect("running");
            if running.values().any(|r| r.worker.id == idle) {
                return Vec::new();
            }
            running
                .iter_mut()
                .filter(|(_, r)| !r.split && r.split_after <= Instant::now() && r.elements >= 1)
                .min_by_key(|(_, r)| r.started)
                .map(|(id, r)| {
                    r.split = true;
                    (
                        id.clone(),
                        r.worker.clone(),
                        r.port.clone(),
                        r.blocks.clone(),
                        r.elements,
                    )
                })
        };
        let Some((instruction, worker, port, blocks, elements)) = candidate else {
            return Vec::new();
        };
        let Ok(response) = workers
            .split(&worker, &instruction, &port, 0.5, elements)
            .await
        else {
            self.split_later(&instruction);
            return Vec::new();
        };
        // The rest (elements not reached, the residual of the element being read) and the
        // primary (elements before, the primary of that element).
        let mut rest: Bundle = Vec::new();
        let mut primary: Loaded = Vec::new();
        let mut cut_at_channel = false;
        for channel in response
            .channel_splits
            .iter()
            .filter(|c| c.transform_id == port)
        {
            let Some(shape) = &self.shape else { continue };
            let first = channel.first_residual_element.max(0) as usize;
            let kept = (channel.last_primary_element + 1).max(0) as usize;
            match (
                rest_of(&blocks, shape, first),
                head_of(&blocks, shape, kept),
            ) {
                (Ok(r), Ok(p)) => {
                    if !r.is_empty() {
                        rest.push((port.clone(), r.into_iter().map(Block::Memory).collect()));
                    }
                    primary.push((port.clone(), p));
                    cut_at_channel = true;
                }
                (Err(e), _) | (_, Err(e)) => {
                    // The harness has let go of its rest: failing the job is all that is left
                    // short of losing it.
                    *self.broken.lock().expect("broken") =
                        Some(format!("a split bundle's rest could not be cut: {e}"));
                    return Vec::new();
                }
            }
        }
        let roots = |apps: Vec<crate::fn_api::BundleApplication>| -> Vec<(String, Bytes)> {
            apps.into_iter()
                .filter_map(|app| {
                    self.residual_ports
                        .get(&(app.transform_id.clone(), app.input_id.clone()))
                        .map(|p| (p.clone(), Bytes::from(app.element)))
                })
                .collect()
        };
        let residuals = roots(
            response
                .residual_roots
                .into_iter()
                .filter_map(|r| r.application)
                .collect(),
        );
        for (p, element) in residuals {
            rest.push((p, vec![Block::Memory(element)]));
        }
        // One entry per port: the harness takes a port's data as ended at its first end marker.
        for (p, element) in roots(response.primary_roots) {
            match primary.iter_mut().find(|(port, _)| *port == p) {
                Some((_, blocks)) => blocks.push(element),
                None => primary.push((p, vec![element])),
            }
        }
        if rest.is_empty() {
            // The harness kept it all (it may not have reached its element yet): ask again.
            self.split_later(&instruction);
            return Vec::new();
        }
        // Without the channel's split point the primary is unknown: a failure retries the
        // whole bundle (which the SDKs Riverbank was tried with never need).
        let primary = cut_at_channel.then_some(primary);
        // Under `running`: either the bundle is still running (a failure will retry its primary)
        // or it ended, and its rest is run only if it succeeded (a failure requeued it whole).
        let run_rest = match self.running.lock().expect("running").get_mut(&instruction) {
            Some(r) => {
                r.primary = primary;
                true
            }
            None => self
                .ended
                .lock()
                .expect("ended")
                .get(&instruction)
                .copied()
                .unwrap_or(false),
        };
        if !run_rest {
            return Vec::new();
        }
        tracing::debug!(bundle = %instruction, "split a running bundle; its rest goes to an idle harness");
        rest.into_iter()
            .map(|part| Queued {
                bundle: vec![part],
                attempt: 0,
                bucket: None,
            })
            .collect()
    }
}

/// The first `count` elements of `blocks`, as blocks (sliced, not copied).
fn head_of(blocks: &[Bytes], shape: &Shape, count: usize) -> Result<Vec<Bytes>, PortableError> {
    let mut index = 0;
    let mut head = Vec::new();
    for block in blocks {
        if index >= count {
            break;
        }
        let mut pos = 0;
        while pos < block.len() && index < count {
            pos = shape.skip(block, pos)?;
            index += 1;
        }
        head.push(block.slice(..pos));
    }
    Ok(head)
}

/// The elements of `blocks` from index `first` on, as blocks (sliced, not copied).
fn rest_of(blocks: &[Bytes], shape: &Shape, first: usize) -> Result<Vec<Bytes>, PortableError> {
    let mut index = 0;
    let mut rest = Vec::new();
    for block in blocks {
        let mut pos = 0;
        while pos < block.len() && index < first {
            pos = shape.skip(block, pos)?;
            index += 1;
        }
        if pos < block.len() {
            rest.push(block.slice(pos..));
        }
    }
    Ok(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_hold_whole_elements_and_spread_over_harnesses() {
        // 100 bytes elements (a varint length 99, then 99 bytes), 40 of them over 2 blocks.
        let element = |i: u8| {
            let mut e = vec![99u8];
            e.extend(std::iter::repeat_n(i, 99));
            e
        };
        let blocks: Vec<Bytes> = [0..20u8, 20..40u8]
            .into_iter()
            .map(|r| Bytes::from(r.flat_map(element).collect::<Vec<u8>>()))
            .collect();
        let bundles = split(&blocks, &Shape::Bytes, 2).unwrap();
        assert_eq!(bundles.len(), 8);
        let mut seen = Vec::new();
        for bundle in &bundles {
            for block in bundle {
                for e in Shape::Bytes.split(block).unwrap() {
                    assert_eq!(e.len(), 100);
                    seen.push(e[1]);
                }
            }
        }
        assert_eq!(seen, (0..40).collect::<Vec<u8>>());

        // What a split leaves: elements from index 25 on, across the two blocks.
        let rest = rest_of(&blocks, &Shape::Bytes, 25).unwrap();
        let rest: Vec<u8> = rest
            .iter()
            .flat_map(|b| Shape::Bytes.split(b).unwrap())
            .map(|e| e[1])
            .collect();
        assert_eq!(rest, (25..40).collect::<Vec<u8>>());
    }
}
