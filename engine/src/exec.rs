//! Runs one work item: reads its input (a source range, shuffle partitions, or everything),
//! pushes it through the stage's fused ops bundle by bundle, and writes the results to shuffle
//! files and sink temp parts. Nothing is visible to anyone until the coordinator accepts the
//! item's report, so an attempt that fails or dies leaves no trace in the results.
//!
//! A *bundle* is one batch entering the stage. It runs through every fused op and its results
//! are released only when the whole bundle succeeded; it is tried up to `max_attempts` times
//! (Dataflow batch: 4) before the item, and the job, fail.
use super::items::{ItemInput, WorkItem, input_partitions};
use super::shuffle::{Fetch, ShuffleRef, ShuffleWriter, attempt_prefix, back_to_back, decode_all};
use super::work::{Assignment, CheckpointCtx, ItemControl, ItemReport, SplitProposer};
use crate::combine::{FinalCombiner, PartialCombiner, hash_partition};
use crate::compiled::{CombineOp, CompiledPlan, CompiledTransform};
use crate::config::RunConfig;
use crate::error::RunError;
use crate::metrics::Metrics;
use crate::ops::Emit;
use crate::shards::{CombineShard, SqlShard, StateShards};
use arrow::array::{ArrayRef, AsArray, RecordBatch, TimestampMicrosecondArray};
use arrow::compute::cast;
use arrow::datatypes::{SchemaRef, TimestampMicrosecondType};
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use riverbank_elements::columns::{TS, WINDOW_END, user_batch};
use riverbank_elements::json_rows::batch_to_rows;
use riverbank_io as io;
use riverbank_pipeline::{Exchange, OpRole, Stage};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::mpsc::unbounded_channel;

/// What a process needs to run items.
pub struct ExecContext {
    pub plan: Arc<CompiledPlan>,
    pub cfg: RunConfig,
    /// Where this process writes shuffle files (the worker's persistent disk).
    pub shuffle_root: PathBuf,
    /// Live counters for progress displays and metrics endpoints (not the job's totals: those
    /// come from accepted reports only).
    pub metrics: Arc<Metrics>,
    pub fetch: Arc<dyn Fetch>,
    /// Parquet footers this process read last, for the next row group of the same file.
    pub footers: io::RecentFooters,
    /// A streaming job's state shards (`None` in a batch run, which has none).
    pub shards: Option<Arc<dyn StateShards>>,
    /// Whether shuffle streams are written in LZ4 frames: for workers, whose streams may cross
    /// machines; not for a run whose items all run in this process, which reads its shuffle
    /// back from the page cache, where compressing costs CPU and saves nothing.
    pub compress_shuffle: bool,
}

/// Runs one attempt of an item. On error the attempt's files are removed.
pub async fn execute(
    ctx: &ExecContext,
    a: &Assignment,
    control: &ItemControl,
    propose_split: &SplitProposer,
) -> Result<ItemReport, RunError> {
    let stage = ctx
        .plan
        .plan
        .stages
        .get(a.item.stage)
        .ok_or_else(|| RunError::Internal(format!("no stage {}", a.item.stage)))?
        .clone();
    let mut w = ItemWorker::new(ctx, &stage, a);
    let result = w.run(a, control, propose_split).await;
    w.finish(result).await
}

/// The state keys of `collection` in stage `consumer`, when that stage is a streaming query
/// over the global window or sessions (its rows are cut into state shards by key).
fn route_keys(
    plan: &CompiledPlan,
    consumer: &Stage,
    collection: &str,
) -> Option<(Vec<String>, Vec<arrow::datatypes::DataType>)> {
    let first = consumer.ops.first()?;
    let CompiledTransform::Sql(op) = &plan.transforms[first.transform] else {
        return None;
    };
    let keyed = op.keyed.as_ref()?;
    let fields = keyed.of_collection(op, collection)?;
    Some((fields.to_vec(), keyed.types.clone()))
}

/// The fields of `collection` that stage `consumer` reads, when it is a Sql/Join reading the
/// collection alone (`None`: all): the rows it gathers are narrowed before the shuffle, so
/// neither the shuffle nor a streaming query's state carries fields nothing reads.
fn read_fields(plan: &CompiledPlan, consumer: &Stage, collection: &str) -> Option<Vec<String>> {
    let (first, rest) = consumer.ops.split_first()?;
    let CompiledTransform::Sql(op) = &plan.transforms[first.transform] else {
        return None;
    };
    let transforms = &plan.plan.graph.transforms;
    let others = rest.iter().any(|o| {
        transforms[o.transform]
            .inputs
            .iter()
            .any(|(_, c)| c == collection)
    });
    match others {
        true => None,
        false => Some(
            op.columns_of(collection)?
                .into_iter()
                .map(String::from)
                .collect(),
        ),
    }
}

/// The schema of a Sql/Join's table reading `collection`: the fields of it the query reads
/// (what its producers send: [`read_fields`]).
fn table_schema(plan: &CompiledPlan, op: &crate::compiled::SqlOp, collection: &str) -> SchemaRef {
    let user = riverbank_elements::columns::user_schema(&plan.schemas[collection]);
    match op.columns_of(collection) {
        Some(fields) => Arc::new(arrow::datatypes::Schema::new(
            user.fields()
                .iter()
                .filter(|f| fields.contains(&f.name().as_str()))
                .cloned()
                .collect::<Vec<_>>(),
        )),
        None => user,
    }
}

/// A cross-stage output of the stage.
struct Route {
    collection: String,
    exchange: Exchange,
    consumer: usize,
    input: usize,
    partitions: u32,
    /// Round-robin position for Redistribute (per item, so it is deterministic).
    next: u32,
    /// A streaming query over the global window or sessions: the key columns (and key types)
    /// its state shards are cut by; `None`: a windowed query's shards, cut by window.
    keys: Option<(Vec<String>, Vec<arrow::datatypes::DataType>)>,
    /// The fields the consumer reads (`None`: all).
    fields: Option<Vec<String>>,
}

/// Where a bundle's results go once it has succeeded.
enum Dest {
    Sink(usize),
    Partial(usize),
    Route(usize),
}

type Processed = (Vec<(Dest, RecordBatch)>, Vec<(usize, u64)>);

struct ItemWorker<'a> {
    ctx: &'a ExecContext,
    stage: &'a Stage,
    item: WorkItem,
    /// Streaming: the checkpoint this item belongs to.
    checkpoint: Option<CheckpointCtx>,
    routes: Vec<Route>,
    shuffle: Option<ShuffleWriter>,
    /// Sink writers by (sink, window): a streaming item writes one part per window it saw.
    writers: HashMap<(usize, Option<(i64, i64)>), io::SinkWriter>,
    /// Sink parts of this item closed so far (an item of coalesced partitions closes its
    /// parts partition by partition).
    closed: Vec<(usize, io::TempPart)>,
    /// The part number of the sink parts being written.
    part: usize,
    /// One partial combiner per Combine, reused (and flushed) bundle after bundle.
    partials: HashMap<usize, PartialCombiner>,
    report: ItemReport,
    counts: Vec<u64>,
}

impl<'a> ItemWorker<'a> {
    fn new(ctx: &'a ExecContext, stage: &'a Stage, a: &Assignment) -> Self {
        let plan = &ctx.plan;
        let mut routes = vec![];
        for consumer in &plan.plan.stages {
            for (input, i) in consumer.inputs.iter().enumerate() {
                if i.from_stages.contains(&stage.index) {
                    routes.push(Route {
                        collection: i.collection.clone(),
                        exchange: i.exchange.clone(),
                        consumer: consumer.index,
                        input,
                        partitions: input_partitions(plan, consumer, ctx.cfg.shuffle_partitions),
                        next: 0,
                        keys: route_keys(plan, consumer, &i.collection),
                        fields: read_fields(plan, consumer, &i.collection),
                    });
                }
            }
        }
        ItemWorker {
            ctx,
            stage,
            item: a.item.clone(),
            checkpoint: a.checkpoint.clone(),
            routes,
            shuffle: Some(
                ShuffleWriter::new(
                    &ctx.shuffle_root,
                    attempt_prefix(&ctx.cfg.job_token, stage.index, a.item.id, a.attempt),
                )
                .compressed(ctx.compress_shuffle),
            ),
            writers: HashMap::new(),
            closed: vec![],
            part: a.item.part_number(),
            partials: HashMap::new(),
            report: ItemReport::default(),
            counts: vec![0; plan.plan.graph.transforms.len()],
        }
    }

    fn name(&self, t: usize) -> &str {
        &self.ctx.plan.plan.graph.transforms[t].name
    }

    /// The streaming job's state shards, which only a streaming checkpoint's items use.
    fn shards(&self) -> Result<Arc<dyn StateShards>, RunError> {
        self.ctx.shards.clone().ok_or_else(|| {
            RunError::Internal("a state-shard item outside a streaming checkpoint".into())
        })
    }

    async fn run(
        &mut self,
        a: &Assignment,
        control: &ItemControl,
        propose_split: &SplitProposer,
    ) -> Result<(), RunError> {
        let plan = self.ctx.plan.clone();
        let entry = self
            .stage
            .ops
            .first()
            .ok_or_else(|| RunError::Internal("empty stage".into()))?
            .clone();
        let ct = &plan.transforms[entry.transform];
        let name = self.name(entry.transform).to_string();
        match (&a.item.input, entry.role, ct) {
            (
                ItemInput::Read { range, .. },
                OpRole::Apply,
                CompiledTransform::Read { options, source },
            ) => {
                self.read(
                    options,
                    &source.schema,
                    range.clone(),
                    control,
                    propose_split,
                )
                .await
            }
            (ItemInput::Read { range, .. }, OpRole::Apply, CompiledTransform::ReadStream(r)) => {
                self.read_stream(entry.transform, r, range, a.checkpoint.as_ref(), control)
                    .await
            }
            (ItemInput::Create, OpRole::Apply, CompiledTransform::Create { batch }) => {
                self.bundle(batch.clone()).await
            }
            (ItemInput::Partition(p), OpRole::FinalCombine, CompiledTransform::Combine(op)) => {
                let input = self.input(a, 0);
                match &a.checkpoint {
                    Some(ctx) => self.shard_combine(op, &name, *p, ctx, input, control).await,
                    None => self.final_combine(op, &name, input, control).await,
                }
            }
            (ItemInput::Partition(_), OpRole::ShuffleRead, CompiledTransform::Reshuffle) => {
                let input = self.input(a, 0);
                self.bundles(input, control).await
            }
            // Coalesced partitions (batch only): each as its own item would run it.
            (
                ItemInput::Partitions { .. },
                OpRole::FinalCombine,
                CompiledTransform::Combine(op),
            ) if a.checkpoint.is_none() => {
                let refs = a.inputs.first().cloned().unwrap_or_default();
                let input = fetch_all(self.ctx.fetch.clone(), refs).await?;
                for p in a.item.partitions() {
                    self.start_partition(p).await?;
                    let before = self.report.keys;
                    self.final_combine(op, &name, input.partition(p), control)
                        .await?;
                    // Per partition, so a hot key is still seen in its partition's share.
                    self.report
                        .partition_keys
                        .push((p, self.report.keys - before));
                }
                Ok(())
            }
            (ItemInput::Partitions { .. }, OpRole::ShuffleRead, CompiledTransform::Reshuffle) => {
                let refs = a.inputs.first().cloned().unwrap_or_default();
                let input = fetch_all(self.ctx.fetch.clone(), refs).await?;
                for p in a.item.partitions() {
                    self.start_partition(p).await?;
                    self.bundles(input.partition(p), control).await?;
                }
                Ok(())
            }
            (ItemInput::Gather, OpRole::Commit, CompiledTransform::Write { options, schema }) => {
                let files =
                    crate::written_files::commit(&name, options, schema, a.commit.clone()).await?;
                self.bundle(files).await
            }
            (ItemInput::Gather, OpRole::ShuffleRead, CompiledTransform::Sql(op)) => {
                self.sql(a, op, &name, control).await
            }
            (ItemInput::Partition(p), OpRole::ShuffleRead, CompiledTransform::Sql(op)) => {
                let ctx = a.checkpoint.as_ref().ok_or_else(|| {
                    RunError::Internal(format!("a sharded Sql {name} outside a streaming job"))
                })?;
                self.shard_sql(a, op, &name, *p, ctx, control).await
            }
            (
                ItemInput::Gather,
                OpRole::ShuffleRead,
                CompiledTransform::AssertEqual { expected },
            ) => {
                let mut rows = vec![];
                for i in 0..self.stage.inputs.len() {
                    let mut s = self.input(a, i);
                    while let Some(b) = s.next().await {
                        rows.extend(batch_to_rows(&b?));
                    }
                }
                self.counts[entry.transform] += rows.len() as u64;
                crate::assert::assert_equal(&name, expected, rows)
            }
            (
                ItemInput::Gather,
                OpRole::ShuffleRead,
                CompiledTransform::PyTransform {
                    spec,
                    output_schema,
                    ..
                },
            ) => {
                self.py_transform(a, entry.transform, spec, output_schema, &name)
                    .await
            }
            (input, role, _) => Err(RunError::Internal(format!(
                "stage {} cannot run {input:?} starting with {role:?}",
                self.stage.id()
            ))),
        }
    }

    /// The batches of input `i`, file after file in the order given. Up to `PREFETCH` files
    /// are opened ahead (their first batch read), so a partition spread over many producers
    /// on other workers waits for one round trip at a time instead of one per producer; the
    /// order stays the canonical one, and each open stream holds at most one decoded batch
    /// plus what its socket buffers.
    fn input(&self, a: &Assignment, i: usize) -> BoxStream<'static, Result<RecordBatch, RunError>> {
        self.files(a.inputs.get(i).cloned().unwrap_or_default())
    }

    /// An item of coalesced partitions starts partition `p`: the sink parts of the previous
    /// one are closed, and later rows go to parts numbered as `p`'s own item would number
    /// them, so the output does not depend on how partitions were coalesced.
    async fn start_partition(&mut self, p: u32) -> Result<(), RunError> {
        self.close_writers().await?;
        self.part = WorkItem {
            input: ItemInput::Partition(p),
            ..self.item.clone()
        }
        .part_number();
        Ok(())
    }

    /// Closes the open sink writers into finished parts.
    async fn close_writers(&mut self) -> Result<(), RunError> {
        let mut result = Ok(());
        for ((t, window), w) in std::mem::take(&mut self.writers) {
            if result.is_err() {
                w.abort().await;
                continue;
            }
            match w.close().await {
                Ok(Some(part)) => self.closed.push((t, io::TempPart { window, ..part })),
                Ok(None) => {}
                Err(e) => result = Err(e.into()),
            }
        }
        result
    }

    fn files(&self, files: Vec<ShuffleRef>) -> BoxStream<'static, Result<RecordBatch, RunError>> {
        const PREFETCH: usize = 8;
        let fetch = self.ctx.fetch.clone();
        futures::stream::iter(files)
            .map(move |f| {
                let (producer, address) = (f.producer, f.address.clone());
                let mut stream = fetch
                    .open(&f)
                    .map(move |r| {
                        r.map_err(|message| RunError::ShuffleLost {
                            producer,
                            address: address.clone(),
                            message,
                        })
                    })
                    .peekable();
                async move {
                    std::pin::Pin::new(&mut stream).peek().await;
                    stream
                }
            })
            .buffered(PREFETCH)
            .flatten()
            .boxed()
    }

    async fn read(
        &mut self,
        options: &io::ReadOptions,
        schema: &SchemaRef,
        range: io::Split,
        control: &ItemControl,
        propose_split: &SplitProposer,
    ) -> Result<(), RunError> {
        let mut range = range;
        let mut units = super::items::units(&range);
        control
            .units_total
            .store(units.len() as u64, Ordering::SeqCst);
        let mut i = 0;
        while i < units.len() {
            if control.cancelled.load(Ordering::SeqCst) {
                return Err(RunError::Cancelled);
            }
            if control.split_requested.swap(false, Ordering::SeqCst)
                && let Some((keep, give)) = super::items::split_remainder(&range, i)
                && propose_split(keep.clone(), give).await
            {
                range = keep;
                units = super::items::units(&range);
                control
                    .units_total
                    .store(units.len() as u64, Ordering::SeqCst);
                if i >= units.len() {
                    break;
                }
            }
            control.units_started.store(i as u64 + 1, Ordering::SeqCst);
            let unit = units[i].clone();
            // A unit that fails to read is re-read, skipping the batches already processed, so
            // a transient read error neither loses nor duplicates rows.
            let mut done = 0usize;
            let mut attempt = 0;
            loop {
                attempt += 1;
                match self
                    .read_unit(options, schema, &unit, &mut done, control)
                    .await
                {
                    Ok(()) => break,
                    Err(e @ RunError::Io(_)) if attempt < self.ctx.cfg.max_attempts => {
                        tracing::warn!("re-reading {} after: {e}", unit.location);
                    }
                    Err(e) => return Err(e),
                }
            }
            self.report.bytes_read += unit.estimated_bytes;
            Metrics::add(&self.ctx.metrics.bytes_read, unit.estimated_bytes);
            i += 1;
        }
        Ok(())
    }

    async fn read_unit(
        &mut self,
        options: &io::ReadOptions,
        schema: &SchemaRef,
        unit: &io::Split,
        done: &mut usize,
        control: &ItemControl,
    ) -> Result<(), RunError> {
        let mut stream =
            io::read_split_with(options, schema.clone(), unit, &self.ctx.footers).await?;
        let mut i = 0usize;
        while let Some(b) = stream.next().await {
            let b = b?;
            i += 1;
            if i <= *done {
                continue;
            }
            if control.cancelled.load(Ordering::SeqCst) {
                return Err(RunError::Cancelled);
            }
            self.report.rows_read += b.num_rows() as u64;
            Metrics::add(&self.ctx.metrics.rows_read, b.num_rows() as u64);
            self.bundle(b).await?;
            *done = i;
        }
        Ok(())
    }

    /// A streaming source's offsets for this checkpoint; reports the watermark they promise.
    async fn read_stream(
        &mut self,
        transform: usize,
        r: &crate::compiled::StreamRead,
        range: &io::Split,
        ctx: Option<&CheckpointCtx>,
        control: &ItemControl,
    ) -> Result<(), RunError> {
        let io::SplitKind::Offsets {
            partition,
            from,
            until,
        } = range.kind
        else {
            return Err(RunError::Internal(format!(
                "an unbounded source cannot read {:?}",
                range.kind
            )));
        };
        let start = ctx.map_or(0, |c| c.start_us);
        let name = self.name(transform).to_string();
        let source = riverbank_io::unbounded::StreamSource::of(&r.spec, &name, start)?;
        control.units_total.store(1, Ordering::SeqCst);
        control.units_started.store(1, Ordering::SeqCst);
        let error_output = self.ctx.plan.plan.graph.transforms[transform]
            .error_output
            .as_ref()
            .map(|tag| format!("{name}.{tag}"));
        let mut bad = vec![];
        let (batches, watermark) = source
            .read_range(
                partition,
                from,
                until,
                self.ctx.cfg.batch_size,
                error_output.is_some().then_some(&mut bad),
            )
            .await?;
        if let (Some(coll), false) = (error_output, bad.is_empty()) {
            tracing::warn!(transform = %name, partition, records = bad.len(), "records that do not decode go to the error output");
            let b = riverbank_io::connectors::format::bad_record_batch(&name, &bad);
            self.bundle_at(Some(coll), b).await?;
        }
        for b in batches {
            if control.cancelled.load(Ordering::SeqCst) {
                return Err(RunError::Cancelled);
            }
            let (rows, bytes) = (b.num_rows() as u64, b.get_array_memory_size() as u64);
            self.report.rows_read += rows;
            self.report.bytes_read += bytes;
            Metrics::add(&self.ctx.metrics.rows_read, rows);
            Metrics::add(&self.ctx.metrics.bytes_read, bytes);
            self.bundle(b).await?;
        }
        if let Some(w) = watermark {
            self.report.watermarks.push((transform, partition, w));
        }
        Ok(())
    }

    /// A streaming Combine: this checkpoint of state shard `shard` (see `riverbank_streaming::shard`).
    async fn shard_combine(
        &mut self,
        op: &CombineOp,
        name: &str,
        shard: u32,
        ctx: &CheckpointCtx,
        mut input: BoxStream<'static, Result<RecordBatch, RunError>>,
        control: &ItemControl,
    ) -> Result<(), RunError> {
        let mut batches = vec![];
        while let Some(b) = input.next().await {
            if control.cancelled.load(Ordering::SeqCst) {
                return Err(RunError::Cancelled);
            }
            batches.push(b?);
        }
        let out = self
            .shards()?
            .combine(
                CombineShard {
                    op,
                    name,
                    shard,
                    // The store's cache shares the combine memory of this process's slots.
                    cache_bytes: self.ctx.cfg.memory_limit / self.ctx.cfg.slots.max(1),
                    batch_size: self.ctx.cfg.batch_size,
                    inputs: batches,
                },
                ctx,
            )
            .await?;
        control.keys.store(out.keys, Ordering::Relaxed);
        self.report.keys += out.keys;
        self.report.late_dropped += out.late_dropped;
        self.report.state_bytes += out.state_bytes;
        self.report.checkpoint_bytes += out.checkpoint_bytes;
        for b in out.fired {
            let b = final_output(op, &b).map_err(|m| RunError::transform(name, m))?;
            self.bundle(b).await?;
        }
        Ok(())
    }

    /// A streaming Sql or Join: this checkpoint of state shard `shard` (see
    /// `riverbank_streaming::sql_shard`, `sql_keyed`, `sql_sessions`).
    async fn shard_sql(
        &mut self,
        a: &Assignment,
        op: &crate::compiled::SqlOp,
        name: &str,
        shard: u32,
        ctx: &CheckpointCtx,
        control: &ItemControl,
    ) -> Result<(), RunError> {
        let mut inputs = vec![];
        let mut collections = vec![];
        for (i, input) in self.stage.inputs.iter().enumerate() {
            let mut s = self.input(a, i);
            let mut batches = vec![];
            let fields = op.columns_of(&input.collection);
            while let Some(b) = s.next().await {
                if control.cancelled.load(Ordering::SeqCst) {
                    return Err(RunError::Cancelled);
                }
                // The state keeps only the fields the query reads.
                let b = b?;
                batches.push(match &fields {
                    Some(fields) => riverbank_elements::columns::with_user_fields(&b, fields),
                    None => b,
                });
            }
            inputs.push(batches);
            collections.push(input.collection.clone());
        }
        let plan = self.ctx.plan.clone();
        let schemas = op
            .tables
            .iter()
            .map(|(_, c)| table_schema(&plan, op, c))
            .collect();
        let out = self
            .shards()?
            .sql(
                SqlShard {
                    op,
                    name,
                    shard,
                    schemas,
                    cache_bytes: self.ctx.cfg.memory_limit / self.ctx.cfg.slots.max(1),
                    collections,
                    inputs,
                },
                ctx,
            )
            .await?;
        control.keys.store(out.keys, Ordering::Relaxed);
        self.report.keys += out.keys;
        self.report.late_dropped += out.late_dropped;
        self.report.state_bytes += out.state_bytes;
        self.report.checkpoint_bytes += out.checkpoint_bytes;
        self.bundles(
            futures::stream::iter(out.fired.into_iter().map(Ok)),
            control,
        )
        .await
    }

    async fn final_combine(
        &mut self,
        op: &CombineOp,
        name: &str,
        mut input: BoxStream<'static, Result<RecordBatch, RunError>>,
        control: &ItemControl,
    ) -> Result<(), RunError> {
        let cerr = |e| RunError::Combine {
            transform: name.to_string(),
            source: e,
        };
        let dir = self.ctx.cfg.spill_dir.join(format!(
            "{}-{}-i{}",
            self.ctx.cfg.job_token,
            self.stage.id(),
            self.item.id
        ));
        // Up to `partitions` items run at once in this process: share the memory between them.
        let memory = self.ctx.cfg.memory_limit / self.ctx.cfg.slots.max(1);
        let mut fc = FinalCombiner::new(op.spec.clone(), memory, &dir).map_err(cerr)?;
        let result = async {
            if op.sessions {
                // Session windows merge per key once all of the key's windows are known.
                let mut states = vec![];
                while let Some(b) = input.next().await {
                    states.push(b?);
                }
                for b in crate::sessions::merge_windows(&states, op.keys.len())
                    .map_err(|m| RunError::transform(name, m))?
                {
                    fc.merge(&b).map_err(cerr)?;
                }
            } else {
                while let Some(b) = input.next().await {
                    if control.cancelled.load(Ordering::SeqCst) {
                        return Err(RunError::Cancelled);
                    }
                    fc.merge(&b?).map_err(cerr)?;
                    control
                        .keys
                        .store(fc.num_groups() as u64, Ordering::Relaxed);
                }
            }
            // Spilled keys are not in `num_groups`: the report's count is the output's.
            let mut keys = 0;
            self.report.spills += fc.spill_count() as u64;
            Metrics::add(&self.ctx.metrics.spills, fc.spill_count() as u64);
            for b in fc.finish(self.ctx.cfg.batch_size).map_err(cerr)? {
                let b = final_output(op, &b.map_err(cerr)?)
                    .map_err(|m| RunError::transform(name, m))?;
                keys += b.num_rows() as u64;
                self.bundle(b).await?;
            }
            self.report.keys += keys;
            Ok(())
        }
        .await;
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    /// A PyTransform: Beam gives a PTransform whole PCollections, so every input's rows (with
    /// their timestamps and windows, not panes) go to Beam's Python SDK in one call, and what it
    /// gives back goes through the rest of the stage.
    async fn py_transform(
        &mut self,
        a: &Assignment,
        transform: usize,
        spec: &crate::python_sdk::PyTransformSpec,
        output_schema: &SchemaRef,
        name: &str,
    ) -> Result<(), RunError> {
        let plan = self.ctx.plan.clone();
        let mut inputs = vec![];
        // The stage reads each collection once; the transform may take one under two tags.
        for (_, c) in &plan.plan.graph.transforms[transform].inputs {
            let i = self.stage.inputs.iter().position(|x| &x.collection == c);
            let i = i.ok_or_else(|| {
                RunError::Internal(format!("{name}'s input {c} is not its stage's"))
            })?;
            let rows = self.input(a, i).map(|b| {
                let mut b = b?;
                if let Ok(pane) = b.schema_ref().index_of(riverbank_elements::columns::PANE) {
                    b.remove_column(pane);
                }
                Ok(b)
            });
            inputs.push(rows.boxed());
        }
        let sdk = crate::python_sdk::sdk().map_err(|m| RunError::transform(name, m))?;
        let mut out = sdk.apply(spec, inputs, output_schema.clone()).await?;
        while let Some(b) = out.next().await {
            self.bundle(b?).await?;
        }
        Ok(())
    }

    async fn sql(
        &mut self,
        a: &Assignment,
        op: &crate::compiled::SqlOp,
        name: &str,
        control: &ItemControl,
    ) -> Result<(), RunError> {
        let plan = self.ctx.plan.clone();
        // One feed per stage input; a collection backing two table names (a self-join) is teed.
        let mut by_collection = HashMap::new();
        for (i, input) in self.stage.inputs.iter().enumerate() {
            let (tx, rx) = unbounded_channel();
            let mut s = self.input(a, i);
            // The table's fields (its producers narrowed the rows already, unless another op
            // of this stage reads them too).
            let fields: Option<Vec<String>> = op
                .columns_of(&input.collection)
                .map(|f| f.into_iter().map(String::from).collect());
            let feeder = tokio::spawn(async move {
                while let Some(b) = s.next().await {
                    match b {
                        Ok(b) => {
                            let b = match &fields {
                                Some(f) => riverbank_elements::columns::with_user_fields(&b, f),
                                None => b,
                            };
                            if tx.send(b).is_err() {
                                break;
                            }
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            });
            by_collection.insert(input.collection.clone(), (vec![rx], feeder));
        }
        let mut feeders = vec![];
        let rxs = by_collection
            .into_iter()
            .map(|(c, (rx, f))| {
                feeders.push(f);
                (c, rx)
            })
            .collect();
        let mut tables = vec![];
        for ((table, coll), rxs) in op
            .tables
            .iter()
            .zip(crate::sql::table_feeds(rxs, &op.tables, 1))
        {
            tables.push((table.clone(), table_schema(&plan, op, coll), rxs));
        }
        // One DataFusion partition: its plan then has no exchanges, and the output order follows
        // the input's canonical order, so the files do not depend on the worker count (which
        // sets the partitions) or on thread timing. The item still runs beside other items.
        let parts = 1;
        let result = if op.windowed {
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
            if let Some(keys) = &op.session_keys {
                // Sessions merge across the windowed inputs; a side input's rows stay whole.
                let windowed = |t: &(String, _, Vec<RecordBatch>)| !op.side_tables.contains(&t.0);
                let merged = crate::sessions::merge_across(
                    full.iter_mut()
                        .map(|t| match windowed(t) {
                            true => std::mem::take(&mut t.2),
                            false => vec![],
                        })
                        .collect(),
                    keys,
                )
                .map_err(|m| RunError::transform(name, m))?;
                for (table, batches) in full.iter_mut().zip(merged) {
                    if windowed(table) {
                        table.2 = batches;
                    }
                }
            }
            match crate::sql::run_windowed(&op.query, full, op.output_schema.clone()).await {
                Ok(out) => {
                    self.bundles(futures::stream::iter(out.into_iter().map(Ok)), control)
                        .await
                }
                Err(m) => Err(RunError::transform(name, m)),
            }
        } else {
            match crate::sql::run_query(&op.query, tables, parts, self.ctx.cfg.memory_limit).await {
                Ok(streams) => {
                    let mut r = Ok(());
                    for s in streams {
                        let s = s.map(|b| b.map_err(|e| RunError::transform(name, e.to_string())));
                        r = self.bundles(s, control).await;
                        if r.is_err() {
                            break;
                        }
                    }
                    r
                }
                Err(m) => Err(RunError::transform(name, m)),
            }
        };
        // A lost input is the root cause of whatever the query saw (a closed table).
        for f in feeders {
            match f.await {
                Ok(Err(e)) => return Err(e),
                Err(e) => return Err(RunError::Internal(format!("input feeder panicked: {e}"))),
                Ok(Ok(())) => {}
            }
        }
        result
    }

    /// Runs every batch as a bundle, stopping at the first failure.
    async fn bundles(
        &mut self,
        batches: impl Stream<Item = Result<RecordBatch, RunError>>,
        control: &ItemControl,
    ) -> Result<(), RunError> {
        let mut batches = std::pin::pin!(batches);
        while let Some(b) = batches.next().await {
            if control.cancelled.load(Ordering::SeqCst) {
                return Err(RunError::Cancelled);
            }
            self.bundle(b?).await?;
        }
        Ok(())
    }

    /// Runs one bundle through the stage, retrying, then releases its results.
    async fn bundle(&mut self, batch: RecordBatch) -> Result<(), RunError> {
        self.bundle_at(None, batch).await
    }

    /// A bundle entering the stage at collection `at` (default: the first op's main output;
    /// a source's error output, say).
    async fn bundle_at(&mut self, at: Option<String>, batch: RecordBatch) -> Result<(), RunError> {
        let metrics = &self.ctx.metrics.stages[self.stage.index];
        let mut attempt = 0;
        let (emits, counts) = loop {
            attempt += 1;
            let result = if self.ctx.cfg.chaos.fails(attempt) {
                Err(RunError::Internal(format!(
                    "injected failure of attempt {attempt}"
                )))
            } else {
                self.process(&batch, at.as_deref())
            };
            match result {
                Ok(v) => break v,
                Err(e) if attempt < self.ctx.cfg.max_attempts => {
                    self.report.bundle_retries += 1;
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
        self.ctx.cfg.chaos.after_bundle(batch.num_rows()).await;
        for (t, n) in counts {
            self.counts[t] += n;
        }
        self.report.bundles += 1;
        Metrics::add(&metrics.bundles, 1);
        for (dest, b) in emits {
            self.release(dest, b).await?;
        }
        Ok(())
    }

    /// The pure part of a bundle: every op of the stage, results held back.
    fn process(&self, batch: &RecordBatch, at: Option<&str>) -> Result<Processed, RunError> {
        let plan = &self.ctx.plan;
        let graph = &plan.plan.graph;
        let entry = &self.stage.ops[0];
        let mut colls: HashMap<String, Vec<RecordBatch>> = HashMap::new();
        colls.insert(
            at.map_or_else(
                || graph.transforms[entry.transform].name.clone(),
                str::to_string,
            ),
            vec![batch.clone()],
        );
        // Elements out of the entry op: its main output only.
        let mut counts = vec![(
            entry.transform,
            if at.is_some() {
                0
            } else {
                batch.num_rows() as u64
            },
        )];
        let mut emits = vec![];
        for op in &self.stage.ops[1..] {
            let t = &graph.transforms[op.transform];
            let inputs: Vec<RecordBatch> = t
                .inputs
                .iter()
                .flat_map(|(_, c)| colls.get(c).cloned().unwrap_or_default())
                .collect();
            match (op.role, &plan.transforms[op.transform]) {
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
                        // Window columns go along: a streaming sink writes a part per window.
                        emits.push((Dest::Sink(op.transform), b));
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
                let groups = match &self.checkpoint {
                    Some(_) => riverbank_elements::columns::split_by_window(&b)
                        .map(|g| g.into_iter().map(|(w, b)| (Some(w), b)).collect()),
                    None => None,
                }
                .unwrap_or_else(|| vec![(None, b)]);
                for (window, b) in groups {
                    self.write_sink(t, window, &user_batch(&b)).await?;
                }
            }
            Dest::Partial(t) => self.partial_combine(t, &b)?,
            Dest::Route(i) => {
                let r = &mut self.routes[i];
                let b = match &r.fields {
                    Some(f) => riverbank_elements::columns::with_user_fields(&b, f),
                    None => b,
                };
                let partition = match r.exchange {
                    Exchange::Redistribute => {
                        r.next = r.next.wrapping_add(1);
                        (r.next - 1) % r.partitions
                    }
                    // A streaming Sql's state shards: all of a key's rows in one shard
                    // (global window, sessions), or all of a window's; the rows of an
                    // unwindowed side input beside windowed ones go to every shard (every
                    // window sees them).
                    Exchange::Gather if r.partitions > 1 => {
                        let (consumer, input, n) = (r.consumer, r.input, r.partitions);
                        let side = r.keys.is_none()
                            && riverbank_elements::columns::window_bounds(&b).is_none();
                        let groups = match &r.keys {
                            None if side => (0..n).map(|p| (p, b.clone())).collect(),
                            Some((fields, types)) => {
                                crate::shards::split_by_key(&b, fields, types, n).map_err(|m| {
                                    RunError::Internal(format!(
                                        "state keys of stage {consumer}: {m}"
                                    ))
                                })?
                            }
                            None => riverbank_elements::columns::split_by_window(&b)
                                .ok_or_else(|| {
                                    RunError::Internal(format!(
                                        "rows for sharded stage {consumer} without a window"
                                    ))
                                })?
                                .into_iter()
                                .map(|((ws, we), rows)| {
                                    (crate::shards::shard_of_window(ws, we, n), rows)
                                })
                                .collect(),
                        };
                        let shuffle = self.shuffle.as_mut().expect("open until finish");
                        for (p, rows) in groups {
                            shuffle.write((consumer, input, p), &rows)?;
                        }
                        return Ok(());
                    }
                    _ => 0,
                };
                let key = (r.consumer, r.input, partition);
                // Gathered batches keep their window columns: a windowed Sql needs them.
                self.shuffle
                    .as_mut()
                    .expect("open until finish")
                    .write(key, &b)?;
            }
        }
        Ok(())
    }

    async fn write_sink(
        &mut self,
        t: usize,
        window: Option<(i64, i64)>,
        b: &RecordBatch,
    ) -> Result<(), RunError> {
        let w = match self.writers.entry((t, window)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let CompiledTransform::Write { options, .. } = &self.ctx.plan.transforms[t] else {
                    unreachable!()
                };
                e.insert(io::SinkWriter::create(options, &self.ctx.cfg.job_token, self.part).await?)
            }
        };
        w.write(b).await?;
        Ok(())
    }

    /// The partial combine of one bundle, flushed at once: a bundle's rows are a fixed part of
    /// the input, so the states (and float sums built from them) do not depend on how items
    /// were scheduled or split.
    fn partial_combine(&mut self, t: usize, b: &RecordBatch) -> Result<(), RunError> {
        let CompiledTransform::Combine(op) = &self.ctx.plan.transforms[t] else {
            unreachable!()
        };
        let name = self.name(t).to_string();
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
        // Streaming: elements of windows already expired when the checkpoint started are late
        // beyond the allowed lateness: dropped here (and counted), before they cost a shuffle.
        let on_time;
        let b = match &self.checkpoint {
            Some(ctx) if op.windowed => {
                let end = b
                    .column(op.spec.key_fields.len() - 1)
                    .as_primitive::<TimestampMicrosecondType>();
                let lateness = op.triggering.allowed_lateness_us;
                // A slice is taken while one of its windows is open; an element is counted
                // late once for each of its windows that closed, as when windows are kept.
                let mut late = 0;
                let keep = arrow::array::BooleanArray::from_iter(end.values().iter().map(|&e| {
                    Some(match &op.slices {
                        Some(_) if e > ctx.watermark_in => true,
                        Some(s) => {
                            let closed =
                                s.window_ends(e).filter(|w| *w <= ctx.watermark_in).count();
                            late += closed as u64;
                            s.last_window_end(e) > ctx.watermark_in
                        }
                        None => {
                            let on_time = e.saturating_add(lateness) > ctx.watermark_in;
                            late += u64::from(!on_time);
                            on_time
                        }
                    })
                }));
                self.report.late_dropped += late;
                if keep.true_count() == b.num_rows() {
                    b
                } else {
                    on_time = arrow::compute::filter_record_batch(b, &keep)
                        .map_err(|e| RunError::Internal(e.to_string()))?;
                    &on_time
                }
            }
            _ => b,
        };
        pc.update(b).map_err(cerr)?;
        let Some(states) = pc.flush().map_err(cerr)? else {
            return Ok(());
        };
        let r = self
            .routes
            .iter()
            .find(|r| r.exchange == Exchange::CombineStates { combine: t })
            .ok_or_else(|| RunError::Internal(format!("no shuffle for combine {name}")))?;
        // Sessions: partition by the user key alone, so all of a key's windows meet and
        // merge; slices too, so that a window's slices meet.
        let num_keys = if op.sessions || op.slices.is_some() {
            op.keys.len()
        } else {
            op.spec.key_fields.len()
        };
        let (consumer, input) = (r.consumer, r.input);
        let parts = hash_partition(&states, num_keys, r.partitions as usize).map_err(cerr)?;
        let shuffle = self.shuffle.as_mut().expect("open until finish");
        for (p, b) in parts.into_iter().enumerate() {
            shuffle.write((consumer, input, p as u32), &b)?;
        }
        Ok(())
    }

    /// Ends the attempt: closes sink writers and shuffle files and builds the report; on
    /// failure removes what the attempt wrote.
    async fn finish(mut self, result: Result<(), RunError>) -> Result<ItemReport, RunError> {
        let mut result = result;
        if result.is_ok() {
            result = self.close_writers().await;
        }
        for (_, w) in self.writers.drain() {
            w.abort().await;
        }
        let mut parts = std::mem::take(&mut self.closed);
        let shuffle = self.shuffle.take().expect("open until finish");
        if let Err(e) = result {
            shuffle.abort();
            for (t, part) in parts {
                if let CompiledTransform::Write { options, .. } = &self.ctx.plan.transforms[t] {
                    io::abort_sink(options, vec![part]).await;
                }
            }
            return Err(e);
        }
        self.report.shuffle = shuffle.finish()?;
        // Reports are compared when sent again: a fixed order.
        parts.sort_by_key(|(t, p)| (*t, p.window, p.part));
        self.report.sink_parts = parts;
        self.report.elements_out = self
            .counts
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(t, n)| (t, *n))
            .collect();
        Ok(self.report)
    }
}

/// An input of an item of coalesced partitions, read into memory (coalescing kept
/// it small): each producer's streams for these partitions lie back to back in its file,
/// so they come in one read or request instead of one per partition.
async fn fetch_all(fetch: Arc<dyn Fetch>, refs: Vec<ShuffleRef>) -> Result<Fetched, RunError> {
    const PARALLEL: usize = 8;
    let runs: Vec<_> = futures::stream::iter(back_to_back(&refs))
        .map(|(run, members)| {
            let read = fetch.read(&run);
            async move {
                let lost = |message| RunError::ShuffleLost {
                    producer: run.producer,
                    address: run.address.clone(),
                    message,
                };
                let bytes = read.await.map_err(lost)?;
                if bytes.len() as u64 != run.len {
                    return Err(lost(format!(
                        "{}: {} bytes where {} were written",
                        run.path,
                        bytes.len(),
                        run.len
                    )));
                }
                Ok((run, members, bytes))
            }
        })
        .buffer_unordered(PARALLEL)
        .try_collect()
        .await?;
    let mut streams = vec![Bytes::new(); refs.len()];
    for (run, members, bytes) in runs {
        for k in members {
            let at = (refs[k].offset - run.offset) as usize;
            streams[k] = bytes.slice(at..at + refs[k].len as usize);
        }
    }
    Ok(Fetched { refs, streams })
}

/// An input read whole: each stream's bytes beside its reference.
struct Fetched {
    refs: Vec<ShuffleRef>,
    streams: Vec<Bytes>,
}

impl Fetched {
    /// Partition `p`'s batches, producers in canonical order.
    fn partition(&self, p: u32) -> BoxStream<'static, Result<RecordBatch, RunError>> {
        let streams: Vec<_> = self
            .refs
            .iter()
            .zip(&self.streams)
            .filter(|(r, _)| r.partition == p)
            .map(|(r, b)| (r.producer, r.address.clone(), b.clone()))
            .collect();
        futures::stream::iter(streams)
            .flat_map(|(producer, address, bytes)| {
                decode_all(vec![bytes]).map(move |r| {
                    r.map_err(|message| RunError::ShuffleLost {
                        producer,
                        address: address.clone(),
                        message,
                    })
                })
            })
            .boxed()
    }
}

/// Final-combine output in the Combine's output schema: keys and aggregates, then the window
/// and the element timestamp Beam gives a combined value (the end of its window, minus 1µs).
fn final_output(op: &CombineOp, b: &RecordBatch) -> Result<RecordBatch, String> {
    let mut cols: Vec<ArrayRef> = vec![];
    for f in op.output_schema.fields() {
        if f.name() == riverbank_elements::columns::PANE {
            // A streaming shard says which pane each row is; a batch job fires each window once.
            cols.push(
                match b.schema().index_of(riverbank_elements::columns::PANE) {
                    Ok(i) => b.column(i).clone(),
                    Err(_) => riverbank_elements::columns::pane_array(
                        &vec![riverbank_elements::columns::ON_TIME_ONLY; b.num_rows()],
                    ),
                },
            );
        } else if f.name() == TS {
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

/// The partial-combine input: key columns (and window bounds), then the values.
fn combine_input(op: &CombineOp, b: &RecordBatch) -> Result<RecordBatch, String> {
    let sliced;
    let b = match &op.slices {
        Some(s) => {
            sliced = to_slices(s, b)?;
            &sliced
        }
        None => b,
    };
    let user = user_batch(b);
    let mut cols: Vec<ArrayRef> = op.keys.iter().map(|&i| user.column(i).clone()).collect();
    if op.windowed {
        for n in [riverbank_elements::columns::WINDOW_START, WINDOW_END] {
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

/// Elements in sliding windows (one row per window) to their slices (`CombineOp::slices`): of
/// an element's rows, the one whose window ends with the slice the element falls in, its
/// window start moved to the slice's start.
fn to_slices(s: &crate::compiled::Slices, b: &RecordBatch) -> Result<RecordBatch, String> {
    let schema = b.schema();
    let col = |n: &str| schema.index_of(n).map_err(|e| e.to_string());
    let (ts, ws, we) = (
        col(TS)?,
        col(riverbank_elements::columns::WINDOW_START)?,
        col(WINDOW_END)?,
    );
    let ends = b.column(we).as_primitive::<TimestampMicrosecondType>();
    let times = b.column(ts).as_primitive::<TimestampMicrosecondType>();
    let keep = arrow::array::BooleanArray::from_iter(
        ends.values()
            .iter()
            .zip(times.values())
            .map(|(&e, &t)| Some(t < e && t >= e.saturating_sub(s.period_us))),
    );
    let kept = arrow::compute::filter_record_batch(b, &keep).map_err(|e| e.to_string())?;
    let starts = kept
        .column(we)
        .as_primitive::<TimestampMicrosecondType>()
        .unary::<_, TimestampMicrosecondType>(|e| e.saturating_sub(s.period_us))
        .with_data_type(schema.field(ws).data_type().clone());
    let mut cols = kept.columns().to_vec();
    cols[ws] = Arc::new(starts);
    RecordBatch::try_new(schema, cols).map_err(|e| e.to_string())
}
