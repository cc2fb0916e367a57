//! The local runtime: runs every stage of a compiled plan on this machine, each stage as
//! `partitions` parallel tasks, connected by in-memory shuffles.
//!
//! A *bundle* is one batch entering a stage; it runs through all of the stage's fused ops and
//! its results are released only when the whole bundle succeeded, so a retried bundle never
//! counts, writes or combines anything twice. A bundle is tried up to `max_attempts` times
//! (Dataflow batch: 4) before the run fails.
use crate::columns::{TS, WINDOW_END, user_batch};
use crate::combine::{FinalCombiner, PartialCombiner, hash_partition};
use crate::compile::{CombineOp, CompiledPlan, CompiledTransform};
use crate::elements::batch_to_rows;
use crate::error::RunError;
use crate::io;
use crate::metrics::Metrics;
use crate::ops::Emit;
use arrow::array::{ArrayRef, AsArray, RecordBatch, TimestampMicrosecondArray};
use arrow::compute::cast;
use arrow::datatypes::{SchemaRef, TimestampMicrosecondType};
use futures::StreamExt;
use riverbank_pipeline::{Exchange, OpRole, Stage};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// How a run is carried out.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Parallel tasks per stage (normally the number of cores).
    pub partitions: usize,
    pub batch_size: usize,
    /// Memory for each combine/SQL operator before it spills to disk.
    pub memory_limit: usize,
    pub spill_dir: PathBuf,
    /// Names this run's temporary files.
    pub job_token: String,
    pub max_attempts: u32,
    /// Chaos testing: fail the first N attempts of every bundle, as a flaky worker would.
    pub inject_bundle_failures: u32,
}

impl RunConfig {
    pub fn local(spill_dir: PathBuf) -> Self {
        let partitions = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        RunConfig {
            partitions,
            batch_size: 65_536,
            memory_limit: 512 << 20,
            spill_dir,
            job_token: new_token(),
            max_attempts: 4,
            inject_bundle_failures: 0,
        }
    }
}

fn new_token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}-{}", nanos, std::process::id())
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub wall: Duration,
    /// (transform name, elements out) in plan order.
    pub elements_out: Vec<(String, u64)>,
    /// (sink transform name, committed files).
    pub files: Vec<(String, Vec<String>)>,
}

type Shuffle = UnboundedSender<RecordBatch>;

/// Everything the partition tasks of all stages share.
struct Shared {
    plan: CompiledPlan,
    cfg: RunConfig,
    metrics: Arc<Metrics>,
    /// Temp parts written for each sink transform.
    parts: Mutex<HashMap<usize, Vec<io::TempPart>>>,
    first_error: Mutex<Option<RunError>>,
    failed: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// Records a failure. The root cause wins over its echoes (a producer whose consumer is
    /// gone reports an internal error after the consumer's real one).
    fn fail(&self, e: RunError) {
        let mut g = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        let replace = match &*g {
            None => true,
            Some(RunError::Internal(_)) => !matches!(e, RunError::Internal(_)),
            Some(_) => false,
        };
        if replace {
            *g = Some(e);
        }
        self.failed.store(true, Ordering::SeqCst);
    }
    fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }
}

/// Runs a compiled plan to completion and commits its sinks.
pub async fn run(
    plan: CompiledPlan,
    cfg: RunConfig,
    metrics: Arc<Metrics>,
) -> Result<RunSummary, RunError> {
    let start = Instant::now();
    let p = cfg.partitions.max(1);
    let stages = plan.plan.stages.clone();
    // One set of channels per (consumer stage, input collection): `p` partitions each.
    let mut senders: HashMap<(usize, String), Vec<Shuffle>> = HashMap::new();
    let mut receivers: HashMap<(usize, String), Vec<UnboundedReceiver<RecordBatch>>> =
        HashMap::new();
    for s in &stages {
        for i in &s.inputs {
            let (tx, rx): (Vec<_>, Vec<_>) = (0..p).map(|_| unbounded_channel()).unzip();
            senders.insert((s.index, i.collection.clone()), tx);
            receivers.insert((s.index, i.collection.clone()), rx);
        }
    }
    let shared = Arc::new(Shared {
        plan,
        cfg,
        metrics,
        parts: Mutex::new(HashMap::new()),
        first_error: Mutex::new(None),
        failed: Default::default(),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for s in &stages {
        // Where this stage's cross-stage outputs go.
        let mut routes: Vec<Route> = vec![];
        for consumer in &stages {
            for i in &consumer.inputs {
                if i.from_stages.contains(&s.index) {
                    routes.push(Route {
                        collection: i.collection.clone(),
                        exchange: i.exchange.clone(),
                        to: senders[&(consumer.index, i.collection.clone())].clone(),
                        next: Arc::new(AtomicUsize::new(0)),
                    });
                }
            }
        }
        let mut inputs: Vec<(String, Exchange, Vec<UnboundedReceiver<RecordBatch>>)> = vec![];
        for i in &s.inputs {
            inputs.push((
                i.collection.clone(),
                i.exchange.clone(),
                receivers
                    .remove(&(s.index, i.collection.clone()))
                    .unwrap_or_default(),
            ));
        }
        let shared = shared.clone();
        let stage = s.clone();
        tasks.spawn(async move {
            Metrics::add(&shared.metrics.stages[stage.index].state, 1);
            if let Err(e) = run_stage(&shared, &stage, routes, inputs).await {
                shared.fail(e);
            }
            Metrics::add(&shared.metrics.stages[stage.index].state, 1);
        });
    }
    drop(senders);
    while let Some(r) = tasks.join_next().await {
        if let Err(e) = r {
            shared.fail(RunError::Internal(format!("a stage task panicked: {e}")));
        }
    }
    let parts = std::mem::take(&mut *shared.parts.lock().unwrap_or_else(|p| p.into_inner()));
    let first_error = shared
        .first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    if let Some(e) = first_error {
        let mut parts = parts;
        for (t, ct) in shared.plan.transforms.iter().enumerate() {
            if let CompiledTransform::Write { options, .. } = ct {
                io::abort_sink(options, parts.remove(&t).unwrap_or_default()).await;
                // Also parts of writers that failed before reporting one.
                io::cleanup_temp(options, &shared.cfg.job_token).await;
            }
        }
        return Err(e);
    }
    // Every stage succeeded: commit each sink, once.
    let mut files = vec![];
    let mut parts = parts;
    for (t, ct) in shared.plan.transforms.iter().enumerate() {
        if let CompiledTransform::Write { options, schema } = ct {
            let ps = parts.remove(&t).unwrap_or_default();
            let written = io::commit_sink(options, Some(schema.clone()), ps).await;
            io::cleanup_temp(options, &shared.cfg.job_token).await;
            let written = written?;
            files.push((shared.plan.plan.graph.transforms[t].name.clone(), written));
        }
    }
    let elements_out = shared
        .plan
        .plan
        .graph
        .transforms
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (
                t.name.clone(),
                Metrics::get(&shared.metrics.elements_out[i]),
            )
        })
        .collect();
    Ok(RunSummary {
        wall: start.elapsed(),
        elements_out,
        files,
    })
}

/// A cross-stage output of a stage.
#[derive(Clone)]
struct Route {
    collection: String,
    exchange: Exchange,
    to: Vec<Shuffle>,
    /// Round-robin position for Redistribute.
    next: Arc<AtomicUsize>,
}

async fn run_stage(
    shared: &Arc<Shared>,
    stage: &Stage,
    routes: Vec<Route>,
    inputs: Vec<(String, Exchange, Vec<UnboundedReceiver<RecordBatch>>)>,
) -> Result<(), RunError> {
    let p = shared.cfg.partitions.max(1);
    let entry = stage
        .ops
        .first()
        .ok_or_else(|| RunError::Internal("empty stage".into()))?
        .clone();
    let ct = &shared.plan.transforms[entry.transform];
    let mut set = tokio::task::JoinSet::new();
    match (entry.role, ct) {
        (OpRole::Apply, CompiledTransform::Read { source, .. }) => {
            let queue = Arc::new(Mutex::new(
                source.splits.iter().cloned().collect::<VecDeque<_>>(),
            ));
            Metrics::add(&shared.metrics.splits_total, source.splits.len() as u64);
            Metrics::add(
                &shared.metrics.estimated_input_bytes,
                source.splits.iter().map(|s| s.estimated_bytes).sum(),
            );
            for part in 0..p {
                let (shared, stage, routes, queue) =
                    (shared.clone(), stage.clone(), routes.clone(), queue.clone());
                set.spawn(async move {
                    let mut w = PartitionWorker::new(&shared, &stage, routes, part);
                    let r = read_splits(&mut w, &queue).await;
                    w.finish(r).await
                });
            }
        }
        (OpRole::Apply, CompiledTransform::Create { batch }) => {
            let mut w = PartitionWorker::new(shared, stage, routes, 0);
            let r = w.bundle(batch.clone()).await;
            w.finish(r).await?;
        }
        (OpRole::FinalCombine, CompiledTransform::Combine(_)) => {
            let (_, _, rxs) = inputs
                .into_iter()
                .next()
                .ok_or_else(|| RunError::Internal("combine stage without input".into()))?;
            for (part, mut rx) in rxs.into_iter().enumerate() {
                let (shared, stage, routes) = (shared.clone(), stage.clone(), routes.clone());
                set.spawn(async move {
                    let mut w = PartitionWorker::new(&shared, &stage, routes, part);
                    let r = final_combine(&mut w, &mut rx).await;
                    w.finish(r).await
                });
            }
        }
        (OpRole::ShuffleRead, CompiledTransform::Reshuffle) => {
            let (_, _, rxs) = inputs
                .into_iter()
                .next()
                .ok_or_else(|| RunError::Internal("reshuffle stage without input".into()))?;
            for (part, mut rx) in rxs.into_iter().enumerate() {
                let (shared, stage, routes) = (shared.clone(), stage.clone(), routes.clone());
                set.spawn(async move {
                    let mut w = PartitionWorker::new(&shared, &stage, routes, part);
                    let r = w
                        .bundles(futures::stream::poll_fn(|cx| rx.poll_recv(cx)).map(Ok))
                        .await;
                    w.finish(r).await
                });
            }
        }
        (OpRole::ShuffleRead, CompiledTransform::Sql(op)) => {
            let by_collection: HashMap<String, Vec<UnboundedReceiver<RecordBatch>>> =
                inputs.into_iter().map(|(c, _, r)| (c, r)).collect();
            let mut tables = vec![];
            // The same collection may back two table names (a self-join): each gets all of it.
            for ((name, coll), rxs) in
                op.tables
                    .iter()
                    .zip(crate::sql::table_feeds(by_collection, &op.tables, p))
            {
                let schema = crate::columns::user_schema(&shared.plan.schemas[coll]);
                tables.push((name.clone(), schema, rxs));
            }
            let name = shared.plan.plan.graph.transforms[entry.transform]
                .name
                .clone();
            if op.windowed {
                // Per-window queries need each window whole: gather, then query window by window.
                let mut full = vec![];
                for (table, schema, rxs) in tables {
                    let mut batches = vec![];
                    for mut rx in rxs {
                        while let Some(b) = rx.recv().await {
                            batches.push(b);
                        }
                    }
                    full.push((table, schema, batches));
                }
                if shared.failed() {
                    return Ok(());
                }
                let out = crate::sql::run_windowed(&op.query, full, op.output_schema.clone())
                    .await
                    .map_err(|m| RunError::transform(&name, m))?;
                let mut w = PartitionWorker::new(shared, stage, routes, 0);
                let r = w
                    .bundles(futures::stream::iter(out.into_iter().map(Ok)))
                    .await;
                return w.finish(r).await;
            }
            let streams = crate::sql::run_query(&op.query, tables, p, shared.cfg.memory_limit)
                .await
                .map_err(|m| RunError::transform(&name, m))?;
            for (part, stream) in streams.into_iter().enumerate() {
                let (shared, stage, routes, name) =
                    (shared.clone(), stage.clone(), routes.clone(), name.clone());
                set.spawn(async move {
                    let mut w = PartitionWorker::new(&shared, &stage, routes, part);
                    let batches =
                        stream.map(|b| b.map_err(|e| RunError::transform(&name, e.to_string())));
                    let r = w.bundles(batches).await;
                    w.finish(r).await
                });
            }
        }
        (OpRole::ShuffleRead, CompiledTransform::AssertEqual { expected }) => {
            let name = shared.plan.plan.graph.transforms[entry.transform]
                .name
                .clone();
            let mut rows = vec![];
            for (_, _, rxs) in inputs {
                for mut rx in rxs {
                    while let Some(b) = rx.recv().await {
                        rows.extend(batch_to_rows(&b));
                    }
                }
            }
            if !shared.failed() {
                // The summary shows how many elements were checked.
                Metrics::add(
                    &shared.metrics.elements_out[entry.transform],
                    rows.len() as u64,
                );
                crate::assert::assert_equal(&name, expected, rows)?;
            }
        }
        _ => {
            return Err(RunError::Internal(format!(
                "stage {} cannot start with {:?}",
                stage.id(),
                entry.role
            )));
        }
    }
    let mut result = Ok(());
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                if result.is_ok() {
                    result = Err(e);
                }
            }
            Err(e) => result = Err(RunError::Internal(format!("partition task panicked: {e}"))),
        }
    }
    result
}

async fn read_splits(
    w: &mut PartitionWorker<'_>,
    queue: &Mutex<VecDeque<io::Split>>,
) -> Result<(), RunError> {
    let CompiledTransform::Read { options, source } =
        &w.shared.plan.transforms[w.stage.ops[0].transform]
    else {
        unreachable!("checked by caller")
    };
    loop {
        if w.shared.failed() {
            return Ok(());
        }
        let Some(split) = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front() else {
            return Ok(());
        };
        // A split that fails to read is re-read, skipping the batches already processed, so
        // that a transient read error neither loses nor duplicates rows.
        let mut done = 0usize;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match read_split_from(w, options, &source.schema, &split, &mut done).await {
                Ok(()) => break,
                Err(e @ RunError::Io(_)) if attempt < w.shared.cfg.max_attempts => {
                    tracing::warn!("re-reading split {} after: {e}", split.location);
                }
                Err(e) => return Err(e),
            }
        }
        Metrics::add(&w.shared.metrics.splits_done, 1);
        Metrics::add(&w.shared.metrics.bytes_read, split.estimated_bytes);
    }
}

async fn read_split_from(
    w: &mut PartitionWorker<'_>,
    options: &io::ReadOptions,
    schema: &SchemaRef,
    split: &io::Split,
    done: &mut usize,
) -> Result<(), RunError> {
    let mut stream = io::read_split(options, schema.clone(), split).await?;
    let mut i = 0usize;
    while let Some(b) = stream.next().await {
        let b = b?;
        i += 1;
        if i <= *done {
            continue;
        }
        Metrics::add(&w.shared.metrics.rows_read, b.num_rows() as u64);
        w.bundle(b).await?;
        *done = i;
    }
    Ok(())
}

async fn final_combine(
    w: &mut PartitionWorker<'_>,
    rx: &mut UnboundedReceiver<RecordBatch>,
) -> Result<(), RunError> {
    let t = w.stage.ops[0].transform;
    let CompiledTransform::Combine(op) = &w.shared.plan.transforms[t] else {
        unreachable!("checked by caller")
    };
    let name = w.shared.plan.plan.graph.transforms[t].name.clone();
    let cerr = |e| RunError::Combine {
        transform: name.clone(),
        source: e,
    };
    let dir = w.shared.cfg.spill_dir.join(format!(
        "{}-{}-{}",
        w.shared.cfg.job_token,
        w.stage.id(),
        w.part
    ));
    let mut fc = FinalCombiner::new(
        op.spec.clone(),
        w.shared.cfg.memory_limit / w.shared.cfg.partitions.max(1),
        &dir,
    )
    .map_err(cerr)?;
    if op.sessions {
        // Session windows merge per key once all of the key's windows are known.
        let mut states = vec![];
        while let Some(b) = rx.recv().await {
            states.push(b);
        }
        for b in crate::sessions::merge_windows(&states, op.keys.len())
            .map_err(|m| RunError::transform(&name, m))?
        {
            fc.merge(&b).map_err(cerr)?;
        }
    } else {
        while let Some(b) = rx.recv().await {
            fc.merge(&b).map_err(cerr)?;
        }
    }
    Metrics::add(&w.shared.metrics.spills, fc.spill_count() as u64);
    if w.shared.failed() {
        return Ok(());
    }
    for b in fc.finish(w.shared.cfg.batch_size).map_err(cerr)? {
        let b = final_output(op, &b.map_err(cerr)?).map_err(|m| RunError::transform(&name, m))?;
        w.bundle(b).await?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Final-combine output in the Combine's output schema: keys and aggregates, then the window
/// and the element timestamp Beam gives a combined value (the end of its window, minus 1µs).
fn final_output(op: &CombineOp, b: &RecordBatch) -> Result<RecordBatch, String> {
    let mut cols: Vec<ArrayRef> = vec![];
    for f in op.output_schema.fields() {
        if f.name() == TS {
            let we = b.column(b.schema().index_of(WINDOW_END).map_err(|e| e.to_string())?);
            let we = we.as_primitive::<TimestampMicrosecondType>();
            cols.push(Arc::new(
                TimestampMicrosecondArray::from(
                    we.values().iter().map(|v| v - 1).collect::<Vec<_>>(),
                )
                .with_timezone("UTC"),
            ));
        } else {
            let c = b.column(b.schema().index_of(f.name()).map_err(|e| e.to_string())?);
            cols.push(if c.data_type() == f.data_type() {
                c.clone()
            } else {
                cast(c, f.data_type()).map_err(|e| e.to_string())?
            });
        }
    }
    RecordBatch::try_new(op.output_schema.clone(), cols).map_err(|e| e.to_string())
}

/// A processed bundle: its results by destination, and elements out per transform.
type Processed = (Vec<(Dest, RecordBatch)>, Vec<(usize, u64)>);

/// Where a bundle's results go once it has succeeded.
enum Dest {
    Sink(usize),
    Partial(usize),
    Route(usize),
}

/// One partition of one stage: runs bundles through the fused ops and owns the partition's
/// sink writers, partial combiners and shuffle senders.
struct PartitionWorker<'a> {
    shared: &'a Arc<Shared>,
    stage: &'a Stage,
    routes: Vec<Route>,
    part: usize,
    writers: HashMap<usize, io::SinkWriter>,
    partials: HashMap<usize, PartialCombiner>,
}

impl<'a> PartitionWorker<'a> {
    fn new(shared: &'a Arc<Shared>, stage: &'a Stage, routes: Vec<Route>, part: usize) -> Self {
        PartitionWorker {
            shared,
            stage,
            routes,
            part,
            writers: HashMap::new(),
            partials: HashMap::new(),
        }
    }

    fn transform_name(&self, t: usize) -> &str {
        &self.shared.plan.plan.graph.transforms[t].name
    }

    /// Runs every batch as a bundle, stopping at the first failure.
    async fn bundles(
        &mut self,
        batches: impl futures::Stream<Item = Result<RecordBatch, RunError>>,
    ) -> Result<(), RunError> {
        let mut batches = std::pin::pin!(batches);
        while let Some(b) = batches.next().await {
            self.bundle(b?).await?;
        }
        Ok(())
    }

    /// Runs one bundle through the stage, retrying, then releases its results.
    async fn bundle(&mut self, batch: RecordBatch) -> Result<(), RunError> {
        let metrics = &self.shared.metrics.stages[self.stage.index];
        let mut attempt = 0;
        let (emits, counts) = loop {
            attempt += 1;
            let result = if attempt <= self.shared.cfg.inject_bundle_failures {
                Err(RunError::Internal(format!(
                    "injected failure of attempt {attempt}"
                )))
            } else {
                self.process(&batch)
            };
            match result {
                Ok(v) => break v,
                Err(e) if attempt < self.shared.cfg.max_attempts => {
                    Metrics::add(&metrics.bundle_retries, 1);
                    tracing::warn!(stage = %self.stage.id(), attempt, "bundle failed, retrying: {e}");
                }
                Err(e) => {
                    return Err(RunError::BundleRetriesExhausted {
                        stage: self.stage.id(),
                        attempts: attempt,
                        source: Box::new(e),
                    });
                }
            }
        };
        for (t, n) in counts {
            Metrics::add(&self.shared.metrics.elements_out[t], n);
        }
        Metrics::add(&metrics.bundles, 1);
        for (dest, b) in emits {
            self.release(dest, b).await?;
        }
        Ok(())
    }

    /// The pure part of a bundle: every op of the stage, results held back.
    fn process(&self, batch: &RecordBatch) -> Result<Processed, RunError> {
        let graph = &self.shared.plan.plan.graph;
        let entry = &self.stage.ops[0];
        let mut colls: HashMap<String, Vec<RecordBatch>> = HashMap::new();
        colls.insert(
            graph.transforms[entry.transform].name.clone(),
            vec![batch.clone()],
        );
        let mut counts = vec![(entry.transform, batch.num_rows() as u64)];
        let mut emits = vec![];
        for op in &self.stage.ops[1..] {
            let t = &graph.transforms[op.transform];
            let inputs: Vec<RecordBatch> = t
                .inputs
                .iter()
                .flat_map(|(_, c)| colls.get(c).cloned().unwrap_or_default())
                .collect();
            match (op.role, &self.shared.plan.transforms[op.transform]) {
                (OpRole::Apply, CompiledTransform::Element(e)) => {
                    let mut out: Emit = vec![];
                    for b in &inputs {
                        e.apply(b, &mut out)?;
                    }
                    let mut n = 0;
                    for (c, b) in out {
                        // Elements out: every output but the error output (Partition has several).
                        if Some(&c) != e.error_output.as_ref() {
                            n += b.num_rows() as u64;
                        }
                        colls.entry(c).or_default().push(b);
                    }
                    counts.push((op.transform, n));
                }
                (OpRole::Apply, CompiledTransform::Write { .. }) => {
                    let mut n = 0;
                    for b in inputs {
                        n += b.num_rows() as u64;
                        emits.push((Dest::Sink(op.transform), user_batch(&b)));
                    }
                    counts.push((op.transform, n));
                }
                (OpRole::PartialCombine, CompiledTransform::Combine(c)) => {
                    for b in inputs {
                        emits.push((
                            Dest::Partial(op.transform),
                            combine_input(c, &b).map_err(|m| RunError::transform(&t.name, m))?,
                        ));
                    }
                }
                (role, _) => {
                    return Err(RunError::Internal(format!(
                        "op {} ({role:?}) cannot run inside stage {}",
                        t.name,
                        self.stage.id()
                    )));
                }
            }
        }
        for (i, r) in self.routes.iter().enumerate() {
            if matches!(r.exchange, Exchange::CombineStates { .. }) {
                continue;
            }
            for b in colls.get(&r.collection).cloned().unwrap_or_default() {
                emits.push((Dest::Route(i), b));
            }
        }
        Ok((emits, counts))
    }

    async fn release(&mut self, dest: Dest, b: RecordBatch) -> Result<(), RunError> {
        if b.num_rows() == 0 {
            return Ok(());
        }
        match dest {
            Dest::Sink(t) => {
                if !self.writers.contains_key(&t) {
                    let CompiledTransform::Write { options, .. } = &self.shared.plan.transforms[t]
                    else {
                        unreachable!()
                    };
                    let part = self.stage.index * 1_000_000 + self.part;
                    let w =
                        io::SinkWriter::create(options, &self.shared.cfg.job_token, part).await?;
                    self.writers.insert(t, w);
                }
                self.writers
                    .get_mut(&t)
                    .expect("inserted")
                    .write(&b)
                    .await?;
            }
            Dest::Partial(t) => {
                let CompiledTransform::Combine(op) = &self.shared.plan.transforms[t] else {
                    unreachable!()
                };
                let name = self.transform_name(t).to_string();
                let cerr = |e| RunError::Combine {
                    transform: name.clone(),
                    source: e,
                };
                let pc = match self.partials.entry(t) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(PartialCombiner::new(op.spec.clone()).map_err(cerr)?)
                    }
                };
                pc.update(&b).map_err(cerr)?;
                // The partial combine is a cache: flushing early is always correct.
                if pc.memory_size() > self.shared.cfg.memory_limit / 8 {
                    self.flush_partial(t)?;
                }
            }
            Dest::Route(i) => {
                let r = &self.routes[i];
                let target = match r.exchange {
                    Exchange::Redistribute => r.next.fetch_add(1, Ordering::Relaxed) % r.to.len(),
                    _ => self.part % r.to.len(),
                };
                // Gathered batches keep their window columns: a windowed Sql needs them.
                r.to[target].send(b).map_err(|_| {
                    RunError::Internal(format!("consumer of {} is gone", r.collection))
                })?;
            }
        }
        Ok(())
    }

    fn flush_partial(&mut self, t: usize) -> Result<(), RunError> {
        let name = self.transform_name(t).to_string();
        let cerr = |e| RunError::Combine {
            transform: name.clone(),
            source: e,
        };
        let Some(pc) = self.partials.get_mut(&t) else {
            return Ok(());
        };
        let Some(states) = pc.flush().map_err(cerr)? else {
            return Ok(());
        };
        let CompiledTransform::Combine(op) = &self.shared.plan.transforms[t] else {
            unreachable!()
        };
        let route = self
            .routes
            .iter()
            .find(|r| r.exchange == Exchange::CombineStates { combine: t })
            .ok_or_else(|| RunError::Internal(format!("no shuffle for combine {name}")))?;
        // Sessions: partition by the user key alone, so all of a key's windows meet and merge.
        let num_keys = if op.sessions {
            op.keys.len()
        } else {
            op.spec.key_fields.len()
        };
        let parts = hash_partition(&states, num_keys, route.to.len()).map_err(cerr)?;
        for (i, b) in parts.into_iter().enumerate() {
            if b.num_rows() > 0 {
                route.to[i]
                    .send(b)
                    .map_err(|_| RunError::Internal(format!("final combine of {name} is gone")))?;
            }
        }
        Ok(())
    }

    /// Ends the partition: flushes partial combines and closes sink writers (keeping their
    /// temp parts for the commit). On failure, only closes.
    async fn finish(mut self, result: Result<(), RunError>) -> Result<(), RunError> {
        let mut result = result;
        if result.is_ok() {
            let ts: Vec<usize> = self.partials.keys().copied().collect();
            for t in ts {
                if let Err(e) = self.flush_partial(t) {
                    result = Err(e);
                    break;
                }
            }
        }
        for (t, w) in self.writers.drain() {
            match w.close().await {
                Ok(Some(part)) => self
                    .shared
                    .parts
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(t)
                    .or_default()
                    .push(part),
                Ok(None) => {}
                Err(e) => {
                    if result.is_ok() {
                        result = Err(e.into());
                    }
                }
            }
        }
        if result.is_err() {
            // Stop the other partitions early; the error itself is reported by the stage.
            self.shared.failed.store(true, Ordering::SeqCst);
        }
        result
    }
}

/// The partial-combine input: key columns (and window bounds), then the values.
fn combine_input(op: &CombineOp, b: &RecordBatch) -> Result<RecordBatch, String> {
    let user = user_batch(b);
    let mut cols: Vec<ArrayRef> = op.keys.iter().map(|&i| user.column(i).clone()).collect();
    if op.windowed {
        for n in [crate::columns::WINDOW_START, WINDOW_END] {
            cols.push(
                b.column(b.schema().index_of(n).map_err(|e| e.to_string())?)
                    .clone(),
            );
        }
    }
    for v in &op.values {
        cols.push(v.eval(&user)?);
    }
    let schema = op.spec.input_schema().map_err(|e| e.to_string())?;
    let cols = cols
        .into_iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(c)
            } else {
                cast(&c, f.data_type()).map_err(|e| e.to_string())
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema, cols).map_err(|e| e.to_string())
}
