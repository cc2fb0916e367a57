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
use super::panes::{Arrival, Panes};
use super::session_merge::{self, StoreChange};
use super::shard_open as open;
use super::sources::END_OF_TIME;
use super::state::ShardStore;
use super::trigger::Clock;
use crate::combine::FinalCombiner;
use crate::compile::CombineOp;
use crate::engine::work::CheckpointCtx;
use crate::error::RunError;
use arrow::array::{ArrayRef, AsArray, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::{SchemaRef, TimestampMicrosecondType};
use arrow::row::{RowConverter, Rows, SortField};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

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
    pub shard: u32,
    /// Memory the shard's store may cache; the rest of its state stays on disk.
    pub cache_bytes: usize,
}

/// A checkpoint's two clocks: at the watermark before it (what arrivals are judged late
/// against) and after it (what fires), both at the checkpoint's processing time.
pub(super) fn clocks(ctx: &CheckpointCtx) -> (Clock, Clock) {
    let at = |watermark| Clock {
        watermark,
        now: ctx.now_us,
    };
    (at(ctx.watermark_in), at(ctx.watermark))
}

/// Runs checkpoint `ctx.id` of shard `shard` of the Combine `name`, keeping
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
        shard,
        cache_bytes,
    } = which;
    let serr = |source| RunError::State {
        transform: name.to_string(),
        source: Box::new(source),
    };
    let cerr = |source| RunError::Combine {
        transform: name.to_string(),
        source,
    };
    // Named after the Combine, not its stage: an updated pipeline finds its state by name.
    let dir = state_dir.join(state_name(name));
    let prefix = format!("{}/{}/shard-{shard}", ctx.state_prefix, state_name(name));
    let mut store = match open::take(&dir, shard, ctx.id - 1) {
        Some(s) => s,
        None => open_at(&dir, shard, cache_bytes, &prefix, ctx.id - 1)
            .await
            .map_err(serr)?,
    };

    // The checkpoint's new data, merged per key and window.
    let spill = std::env::temp_dir();
    let mut delta = FinalCombiner::new(op.spec.clone(), usize::MAX, &spill).map_err(cerr)?;
    for b in &inputs {
        delta.merge(b).map_err(cerr)?;
    }
    let delta = delta.into_states().map_err(cerr)?;
    let codec = Codec::new(&delta.schema(), op.spec.key_fields.len())
        .map_err(|e| RunError::transform(name, format!("state rows: {e}")))?;
    let ns = Namespaces::new();
    let triggering = &op.triggering;
    let (clock_in, clock) = clocks(ctx);
    let mut out = ShardOutput::default();
    // Session windows: the checkpoint's windows merge with each other and with the stored
    // sessions of their keys first (see `session_merge`).
    let (delta, mut sessions) = if op.sessions {
        session_merge::merge(op, name, &store, &ns, &codec, delta, &clock_in)?
    } else {
        (delta, session_merge::Merged::default())
    };
    out.late_dropped += sessions.late_dropped;

    // Arrivals: late data is judged against the watermark before this checkpoint.
    let delta_keys = codec
        .keys(&delta)
        .map_err(|e| RunError::transform(name, e))?;
    let ends = window_ends(op, &delta);
    let mut panes: BTreeMap<Vec<u8>, Panes> = BTreeMap::new();
    // Windows already in the store (the rest are new): the shard's window count moves by
    // the difference, without a scan of its state.
    let mut stored_panes = std::collections::BTreeSet::new();
    let mut taken = vec![];
    let arrivals = element_counts(&delta);
    let keys: Vec<Vec<u8>> = (0..delta.num_rows())
        .map(|i| delta_keys.row(i).as_ref().to_vec())
        .collect();
    let stored = store.get_many(&ns.panes, &keys).map_err(serr)?;
    for (i, (key, stored)) in keys.into_iter().zip(stored).enumerate() {
        let mut p = match (sessions.panes.remove(&key), stored) {
            (Some(merged), _) => merged,
            (None, Some(json)) => {
                stored_panes.insert(key.clone());
                serde_json::from_slice(&json)
                    .map_err(|e| RunError::transform(name, format!("pane state: {e}")))?
            }
            (None, None) => Panes::new(triggering, ends[i]),
        };
        let kept = match p.add_elements(arrivals[i], &clock_in) {
            Arrival::Taken => true,
            Arrival::TooLate | Arrival::Closed => {
                out.late_dropped += arrivals[i];
                false
            }
        };
        if kept {
            taken.push(i as u32);
        }
        panes.insert(key, p);
    }
    let delta = take_record_batch(&delta, &UInt32Array::from(taken))
        .map_err(|e| RunError::Internal(e.to_string()))?;

    // Windows due without new data: their end, expiry or processing-time deadline passed.
    let mut changes: Vec<StoreChange> = std::mem::take(&mut sessions.deleted);
    let mut due = vec![];
    for (ns_t, bound) in [(&ns.timers, ctx.watermark), (&ns.ptimers, ctx.now_us)] {
        let hi = timer_key(bound.saturating_add(1), &[]);
        for (k, _) in store.scan_range(ns_t, &[], &hi).map_err(serr)? {
            let key = k[8..].to_vec();
            changes.push((ns_t.clone(), k, None));
            if !panes.contains_key(&key) && !sessions.removed.contains(&key) {
                due.push(key);
            }
        }
    }
    due.sort();
    due.dedup();
    let found = store.get_many(&ns.panes, &due).map_err(serr)?;
    for (key, json) in due.into_iter().zip(found) {
        if let Some(json) = json {
            let p = serde_json::from_slice(&json)
                .map_err(|e| RunError::transform(name, format!("pane state: {e}")))?;
            stored_panes.insert(key.clone());
            panes.insert(key, p);
        }
    }

    // The accumulators of every window in play: stored ones and the new data, merged.
    let mut merged = FinalCombiner::new(op.spec.clone(), usize::MAX, &spill).map_err(cerr)?;
    let in_play: Vec<Vec<u8>> = panes.keys().cloned().collect();
    let stored: Vec<Vec<u8>> = store
        .get_many(&ns.acc, &in_play)
        .map_err(serr)?
        .into_iter()
        .flatten()
        .collect();
    if !stored.is_empty() {
        let b = codec
            .decode(&delta.schema(), &stored)
            .map_err(|e| RunError::transform(name, e))?;
        merged.merge(&b).map_err(cerr)?;
    }
    if let Some(carried) = &sessions.carried {
        merged.merge(carried).map_err(cerr)?;
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
    let mut windows =
        store.count(&ns.windows).map_err(serr)? as i64 - sessions.removed.len() as i64;
    let mut fire = vec![];
    let mut fired_panes = vec![];
    for (key, p) in panes.iter_mut() {
        // One evaluation per checkpoint: its elements share a pane.
        let firing = p.on_clock(&clock);
        let row = in_merged.get(key).copied();
        let fired = firing.is_some();
        let clear = firing.is_some_and(|f| f.clear);
        if let (Some(f), Some(j)) = (firing, row) {
            fire.push(j as u32);
            fired_panes.push(pane_row(&f.pane));
        }
        match row {
            Some(j) if !(fired && clear) => changes.push((
                ns.acc.clone(),
                key.clone(),
                Some(rows.row(j).as_ref().to_vec()),
            )),
            _ => changes.push((ns.acc.clone(), key.clone(), None)),
        }
        let was = stored_panes.contains(key);
        if p.is_expired(ctx.watermark) {
            changes.push((ns.panes.clone(), key.clone(), None));
            windows -= i64::from(was);
            continue;
        }
        windows += i64::from(!was);
        let json = serde_json::to_vec(p).map_err(|e| RunError::Internal(e.to_string()))?;
        changes.push((ns.panes.clone(), key.clone(), Some(json)));
        // Look again at the window's end and at its expiry (set once, when the window is
        // new: they never move); sooner for processing time.
        if !was {
            for t in [p.end(), p.expiry()] {
                if t > ctx.watermark {
                    changes.push((ns.timers.clone(), timer_key(t, key), Some(vec![])));
                }
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
        // The combiner emits groups in the order they came (one row per window here), so
        // the panes line up with its output rows.
        let mut at = 0;
        for b in fc.finish(batch_size).map_err(cerr)? {
            let b = b.map_err(cerr)?;
            let n = b.num_rows();
            out.fired.push(with_panes(&b, &fired_panes[at..at + n]));
            at += n;
        }
    }

    store
        .apply(
            changes
                .iter()
                .map(|(ns, k, v)| (ns.as_str(), k.as_slice(), v.as_deref())),
        )
        .map_err(serr)?;
    out.keys = windows.max(0) as u64;
    store.set_count(&ns.windows, out.keys).map_err(serr)?;
    store.set_version(ctx.id).map_err(serr)?;
    let manifest = store.checkpoint(ctx.id, &prefix).await.map_err(serr)?;
    out.checkpoint_bytes = manifest.uploaded_bytes;
    out.state_bytes = store.disk_bytes();
    // Only a store whose checkpoint succeeded stays open (a failed one is reopened from disk
    // or restored, by its version).
    open::keep(&dir, store);
    Ok(out)
}

fn pane_row(p: &super::panes::PaneInfo) -> crate::columns::PaneRow {
    use super::panes::Timing;
    (
        p.index as i64,
        p.nonspeculative_index,
        match p.timing {
            Timing::Early => "EARLY",
            Timing::OnTime => "ON_TIME",
            Timing::Late => "LATE",
        },
        p.is_first,
        p.is_last,
    )
}

/// A fired batch with the pane of each row as the hidden pane column.
fn with_panes(b: &RecordBatch, panes: &[crate::columns::PaneRow]) -> RecordBatch {
    let mut fields: Vec<_> = b.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(arrow::datatypes::Field::new(
        crate::columns::PANE,
        crate::columns::pane_type(),
        false,
    )));
    let mut cols = b.columns().to_vec();
    cols.push(crate::columns::pane_array(panes));
    RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(fields)), cols)
        .expect("one more column of the same length")
}

/// The shard as of checkpoint `id`: the local store if it is there already (the usual case: a
/// shard stays on its worker), else restored from `tempLocation` (it moved, or the worker
/// lost its disk), or empty before the first checkpoint.
pub(super) async fn open_at(
    dir: &Path,
    shard: u32,
    cache: usize,
    prefix: &str,
    id: u64,
) -> Result<ShardStore, super::state::StateError> {
    if id == 0 {
        let _ = std::fs::remove_file(dir.join(format!("shard-{shard}.redb")));
        return ShardStore::open(dir, shard, cache);
    }
    if dir.join(format!("shard-{shard}.redb")).exists() {
        let local = ShardStore::open(dir, shard, cache)?;
        if local.version()? == id {
            return Ok(local);
        }
        drop(local);
    }
    ShardStore::restore(dir, shard, cache, prefix, id).await
}

pub(super) struct Namespaces {
    pub acc: String,
    pub panes: String,
    pub timers: String,
    pub ptimers: String,
    /// The number of windows held (a counter in the store's own keys).
    pub windows: String,
}

impl Namespaces {
    /// One store per Combine: the namespaces need no name of their own, so a renamed
    /// transform (an update's `transformNameMapping`) keeps its store as it is.
    pub(super) fn new() -> Namespaces {
        Namespaces {
            acc: "a".into(),
            panes: "p".into(),
            timers: "t".into(),
            ptimers: "q".into(),
            windows: "windows".into(),
        }
    }
}

/// The directory name of a Combine's state: its name, with anything but letters, digits,
/// `-` and `_` escaped (names hold `/` and spaces).
pub fn state_name(transform: &str) -> String {
    let mut out = String::from("c-");
    for c in transform.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            out.push(c);
        } else {
            for b in c.to_string().bytes() {
                out.push_str(&format!("~{b:02x}"));
            }
        }
    }
    out
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
pub(super) fn element_counts(b: &RecordBatch) -> Vec<u64> {
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
pub(super) struct Codec {
    all: RowConverter,
    keys: Option<RowConverter>,
    nk: usize,
}

impl Codec {
    pub(super) fn new(schema: &SchemaRef, nk: usize) -> Result<Codec, String> {
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
    pub(super) fn keys(&self, b: &RecordBatch) -> Result<KeyRows, String> {
        match &self.keys {
            Some(c) => c
                .convert_columns(&b.columns()[..self.nk])
                .map(KeyRows::Rows)
                .map_err(|e| e.to_string()),
            None => Ok(KeyRows::Global),
        }
    }

    pub(super) fn decode(
        &self,
        schema: &SchemaRef,
        rows: &[Vec<u8>],
    ) -> Result<RecordBatch, String> {
        let parser = self.all.parser();
        let parsed: Vec<_> = rows.iter().map(|r| parser.parse(r)).collect();
        let cols = self.all.convert_rows(parsed).map_err(|e| e.to_string())?;
        RecordBatch::try_new(schema.clone(), cols).map_err(|e| e.to_string())
    }

    /// The key columns of state keys (a windowed key's window among them).
    pub(super) fn decode_keys(&self, keys: &[Vec<u8>]) -> Result<Vec<ArrayRef>, String> {
        let Some(conv) = &self.keys else {
            return Ok(vec![]);
        };
        let parser = conv.parser();
        conv.convert_rows(keys.iter().map(|k| parser.parse(k)))
            .map_err(|e| e.to_string())
    }
}

pub(super) enum KeyRows {
    Rows(Rows),
    Global,
}

impl KeyRows {
    pub(super) fn row(&self, i: usize) -> KeyRow<'_> {
        match self {
            KeyRows::Rows(r) => KeyRow(Some(r.row(i))),
            KeyRows::Global => KeyRow(None),
        }
    }
}

pub(super) struct KeyRow<'a>(Option<arrow::row::Row<'a>>);

impl AsRef<[u8]> for KeyRow<'_> {
    fn as_ref(&self) -> &[u8] {
        match &self.0 {
            Some(r) => r.as_ref(),
            None => &[],
        }
    }
}
