//! A streaming Combine's state shard, for one checkpoint: the keyed, windowed accumulators and
//! their panes live in the shard's store on the worker's disk; the checkpoint's partial states
//! merge into them, the trigger of every window touched or due decides which panes fire, and
//! the store is checkpointed to `tempLocation` before the item reports, so whichever worker
//! runs the shard's next checkpoint can restore it.
//!
//! Namespaces per Combine (its transform name `T`):
//! - `a/T`: key bytes (group-by keys and window) → the accumulator row (Arrow row format of
//!   the state batch: keys, then state columns);
//! - `p/T`: key bytes → the window's [`Panes`] (JSON);
//! - `t/T`: event-time timers: big-endian (deadline) ++ key bytes, at the window's end and its
//!   expiry; `q/T`: processing-time timers, the same way.
use super::panes::{Arrival, Firing, Panes};
use super::sources::END_OF_TIME;
use super::state::ShardStore;
use super::trigger::Clock;
use crate::combine::FinalCombiner;
use crate::compile::CombineOp;
use crate::engine::work::CheckpointCtx;
use crate::error::RunError;
use arrow::array::{AsArray, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::{SchemaRef, TimestampMicrosecondType};
use arrow::row::{RowConverter, Rows, SortField};
use std::collections::BTreeMap;
use std::path::Path;

/// Redb cache per open shard: state beyond it stays on disk.
const CACHE_BYTES: usize = 32 << 20;

/// What a shard's checkpoint produced.
#[derive(Debug, Default)]
pub struct ShardOutput {
    /// Fired panes, in the combine's merged-state form evaluated to its output.
    pub fired: Vec<RecordBatch>,
    pub late_dropped: u64,
    /// Windows (key and window) held after the checkpoint.
    pub keys: u64,
    pub state_bytes: u64,
    pub checkpoint_bytes: u64,
}

/// Which shard of which Combine.
pub struct Shard<'a> {
    pub op: &'a CombineOp,
    /// The Combine's transform name (its state's namespace).
    pub name: &'a str,
    pub stage: usize,
    pub shard: u32,
}

/// Runs checkpoint `ctx.id` of shard `shard` of the Combine `name` in stage `stage`, keeping
/// the shard under `state_dir` (the worker's disk).
pub async fn run(
    which: Shard<'_>,
    ctx: &CheckpointCtx,
    inputs: Vec<RecordBatch>,
    state_dir: &Path,
    batch_size: usize,
) -> Result<ShardOutput, RunError> {
    let Shard {
        op,
        name,
        stage,
        shard,
    } = which;
    let serr = |source| RunError::State {
        transform: name.to_string(),
        source: Box::new(source),
    };
    let cerr = |source| RunError::Combine {
        transform: name.to_string(),
        source,
    };
    let dir = state_dir.join(format!("s{stage}"));
    let prefix = format!("{}/s{stage}/shard-{shard}", ctx.state_prefix);
    let mut store = open_at(&dir, shard, &prefix, ctx.id - 1)
        .await
        .map_err(serr)?;

    // The checkpoint's new data, merged per key and window.
    let spill = std::env::temp_dir();
    let mut delta = FinalCombiner::new(op.spec.clone(), usize::MAX, &spill).map_err(cerr)?;
    for b in &inputs {
        delta.merge(b).map_err(cerr)?;
    }
    let delta = delta.into_states().map_err(cerr)?;
    let codec = Codec::new(&delta.schema(), op.spec.key_fields.len())
        .map_err(|e| RunError::transform(name, format!("state rows: {e}")))?;
    let ns = Namespaces::of(name);
    let triggering = &op.triggering;
    let clock_in = Clock {
        watermark: ctx.watermark_in,
        now: ctx.now_us,
    };
    let clock = Clock {
        watermark: ctx.watermark,
        now: ctx.now_us,
    };
    let mut out = ShardOutput::default();

    // Arrivals: late data is judged against the watermark before this checkpoint.
    let delta_keys = codec
        .keys(&delta)
        .map_err(|e| RunError::transform(name, e))?;
    let ends = window_ends(op, &delta);
    let mut panes: BTreeMap<Vec<u8>, Panes> = BTreeMap::new();
    let mut fires_now: BTreeMap<Vec<u8>, Firing> = BTreeMap::new();
    let mut taken = vec![];
    let arrivals = element_counts(&delta);
    for i in 0..delta.num_rows() {
        let key = delta_keys.row(i).as_ref().to_vec();
        let mut p = match store.get(&ns.panes, &key).map_err(serr)? {
            Some(json) => serde_json::from_slice(&json)
                .map_err(|e| RunError::transform(name, format!("pane state: {e}")))?,
            None => Panes::new(triggering, ends[i]),
        };
        let mut kept = false;
        for _ in 0..arrivals[i] {
            match p.on_element(&clock_in) {
                (Arrival::Taken, firing) => {
                    kept = true;
                    if let Some(f) = firing {
                        fires_now.insert(key.clone(), f);
                    }
                }
                (Arrival::TooLate | Arrival::Closed, _) => out.late_dropped += 1,
            }
        }
        if kept {
            taken.push(i as u32);
        }
        panes.insert(key, p);
    }
    let delta = take_record_batch(&delta, &UInt32Array::from(taken))
        .map_err(|e| RunError::Internal(e.to_string()))?;

    // Windows due without new data: their end, expiry or processing-time deadline passed.
    let mut changes: Vec<(String, Vec<u8>, Option<Vec<u8>>)> = vec![];
    for (ns_t, bound) in [(&ns.timers, ctx.watermark), (&ns.ptimers, ctx.now_us)] {
        let hi = timer_key(bound.saturating_add(1), &[]);
        for (k, _) in store.scan_range(ns_t, &[], &hi).map_err(serr)? {
            let key = k[8..].to_vec();
            changes.push((ns_t.clone(), k, None));
            if panes.contains_key(&key) {
                continue;
            }
            if let Some(json) = store.get(&ns.panes, &key).map_err(serr)? {
                let p = serde_json::from_slice(&json)
                    .map_err(|e| RunError::transform(name, format!("pane state: {e}")))?;
                panes.insert(key, p);
            }
        }
    }

    // The accumulators of every window in play: stored ones and the new data, merged.
    let mut merged = FinalCombiner::new(op.spec.clone(), usize::MAX, &spill).map_err(cerr)?;
    let mut stored = vec![];
    for key in panes.keys() {
        if let Some(row) = store.get(&ns.acc, key).map_err(serr)? {
            stored.push(row);
        }
    }
    if !stored.is_empty() {
        let b = codec
            .decode(&delta.schema(), &stored)
            .map_err(|e| RunError::transform(name, e))?;
        merged.merge(&b).map_err(cerr)?;
    }
    merged.merge(&delta).map_err(cerr)?;
    let merged = merged.into_states().map_err(cerr)?;
    let merged_keys = codec
        .keys(&merged)
        .map_err(|e| RunError::transform(name, e))?;
    let rows = codec
        .rows(&merged)
        .map_err(|e| RunError::transform(name, e))?;
    let mut in_merged = BTreeMap::new();
    for j in 0..merged.num_rows() {
        in_merged.insert(merged_keys.row(j).as_ref().to_vec(), j);
    }

    // Triggers: which windows fire now, and what each keeps.
    let mut fire = vec![];
    for (key, p) in panes.iter_mut() {
        // A count trigger may have fired on an element already; the clock may fire again
        // (the data is one pane either way: a checkpoint is the trigger's granularity).
        let firing = p.on_clock(&clock).or_else(|| fires_now.get(key).copied());
        let row = in_merged.get(key).copied();
        let fired = firing.is_some();
        let clear = firing.is_some_and(|f| f.clear);
        if fired && let Some(j) = row {
            fire.push(j as u32);
        }
        match row {
            Some(j) if !(fired && clear) => changes.push((
                ns.acc.clone(),
                key.clone(),
                Some(rows.row(j).as_ref().to_vec()),
            )),
            _ => changes.push((ns.acc.clone(), key.clone(), None)),
        }
        if p.is_expired(ctx.watermark) {
            changes.push((ns.panes.clone(), key.clone(), None));
            continue;
        }
        let json = serde_json::to_vec(p).map_err(|e| RunError::Internal(e.to_string()))?;
        changes.push((ns.panes.clone(), key.clone(), Some(json)));
        // Look again at the window's end and at its expiry; sooner for processing time.
        let end = p.end();
        for t in [end, p.expiry()] {
            if t > ctx.watermark {
                changes.push((ns.timers.clone(), timer_key(t, key), Some(vec![])));
            }
        }
        if let Some(d) = p.next_deadline() {
            changes.push((ns.ptimers.clone(), timer_key(d, key), Some(vec![])));
        }
    }
    if !fire.is_empty() {
        let firing = take_record_batch(&merged, &UInt32Array::from(fire))
            .map_err(|e| RunError::Internal(e.to_string()))?;
        let mut fc = FinalCombiner::new(op.spec.clone(), usize::MAX, &spill).map_err(cerr)?;
        fc.merge(&firing).map_err(cerr)?;
        for b in fc.finish(batch_size).map_err(cerr)? {
            out.fired.push(b.map_err(cerr)?);
        }
    }

    store
        .apply(
            changes
                .iter()
                .map(|(ns, k, v)| (ns.as_str(), k.as_slice(), v.as_deref())),
        )
        .map_err(serr)?;
    store.set_version(ctx.id).map_err(serr)?;
    out.keys = store.scan(&ns.panes).map_err(serr)?.len() as u64;
    let manifest = store.checkpoint(ctx.id, &prefix).await.map_err(serr)?;
    out.checkpoint_bytes = manifest.uploaded_bytes;
    out.state_bytes = store.disk_bytes();
    Ok(out)
}

/// The shard as of checkpoint `id`: the local store if it is there already (the usual case: a
/// shard stays on its worker), else restored from `tempLocation` (it moved, or the worker
/// lost its disk), or empty before the first checkpoint.
async fn open_at(
    dir: &Path,
    shard: u32,
    prefix: &str,
    id: u64,
) -> Result<ShardStore, super::state::StateError> {
    if id == 0 {
        let _ = std::fs::remove_file(dir.join(format!("shard-{shard}.redb")));
        return ShardStore::open(dir, shard, CACHE_BYTES);
    }
    if dir.join(format!("shard-{shard}.redb")).exists() {
        let local = ShardStore::open(dir, shard, CACHE_BYTES)?;
        if local.version()? == id {
            return Ok(local);
        }
        drop(local);
    }
    ShardStore::restore(dir, shard, CACHE_BYTES, prefix, id).await
}

struct Namespaces {
    acc: String,
    panes: String,
    timers: String,
    ptimers: String,
}

impl Namespaces {
    fn of(name: &str) -> Namespaces {
        Namespaces {
            acc: format!("a/{name}"),
            panes: format!("p/{name}"),
            timers: format!("t/{name}"),
            ptimers: format!("q/{name}"),
        }
    }
}

/// A timer's key: the deadline, ordered as unsigned big-endian bytes, then the window's key.
fn timer_key(deadline: i64, key: &[u8]) -> Vec<u8> {
    let mut k = ((deadline as u64) ^ (1 << 63)).to_be_bytes().to_vec();
    k.extend_from_slice(key);
    k
}

/// Each state row's window end (exclusive); the global window ends at the end of time.
fn window_ends(op: &CombineOp, b: &RecordBatch) -> Vec<i64> {
    if !op.windowed {
        return vec![END_OF_TIME - 1; b.num_rows()];
    }
    let nk = op.spec.key_fields.len();
    b.column(nk - 1)
        .as_primitive::<TimestampMicrosecondType>()
        .values()
        .to_vec()
}

/// Elements behind each state row: the hidden element count when the trigger counts
/// elements, else one arrival per row (what every other trigger needs).
fn element_counts(b: &RecordBatch) -> Vec<u64> {
    let schema = b.schema();
    match schema
        .fields()
        .iter()
        .position(|f| f.name().starts_with(crate::compile::ELEMENT_COUNT))
    {
        Some(i) => {
            let c = arrow::compute::cast(b.column(i), &arrow::datatypes::DataType::UInt64)
                .expect("counts are integers");
            c.as_primitive::<arrow::datatypes::UInt64Type>()
                .iter()
                .map(|v| v.unwrap_or(1).max(1))
                .collect()
        }
        None => vec![1; b.num_rows()],
    }
}

/// State rows to bytes and back (Arrow's row format), and their keys' bytes.
struct Codec {
    all: RowConverter,
    keys: Option<RowConverter>,
    nk: usize,
}

impl Codec {
    fn new(schema: &SchemaRef, nk: usize) -> Result<Codec, String> {
        let sort = |fs: &[arrow::datatypes::FieldRef]| {
            fs.iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect::<Vec<_>>()
        };
        let fields = schema.fields();
        Ok(Codec {
            all: RowConverter::new(sort(fields)).map_err(|e| e.to_string())?,
            keys: if nk == 0 {
                None
            } else {
                Some(RowConverter::new(sort(&fields[..nk])).map_err(|e| e.to_string())?)
            },
            nk,
        })
    }

    fn rows(&self, b: &RecordBatch) -> Result<Rows, String> {
        self.all
            .convert_columns(b.columns())
            .map_err(|e| e.to_string())
    }

    /// Key bytes of every row (empty for a global combine: one key).
    fn keys(&self, b: &RecordBatch) -> Result<KeyRows, String> {
        match &self.keys {
            Some(c) => c
                .convert_columns(&b.columns()[..self.nk])
                .map(KeyRows::Rows)
                .map_err(|e| e.to_string()),
            None => Ok(KeyRows::Global),
        }
    }

    fn decode(&self, schema: &SchemaRef, rows: &[Vec<u8>]) -> Result<RecordBatch, String> {
        let parser = self.all.parser();
        let parsed: Vec<_> = rows.iter().map(|r| parser.parse(r)).collect();
        let cols = self.all.convert_rows(parsed).map_err(|e| e.to_string())?;
        RecordBatch::try_new(schema.clone(), cols).map_err(|e| e.to_string())
    }
}

enum KeyRows {
    Rows(Rows),
    Global,
}

impl KeyRows {
    fn row(&self, i: usize) -> KeyRow<'_> {
        match self {
            KeyRows::Rows(r) => KeyRow(Some(r.row(i))),
            KeyRows::Global => KeyRow(None),
        }
    }
}

struct KeyRow<'a>(Option<arrow::row::Row<'a>>);

impl AsRef<[u8]> for KeyRow<'_> {
    fn as_ref(&self) -> &[u8] {
        match &self.0 {
            Some(r) => r.as_ref(),
            None => &[],
        }
    }
}
