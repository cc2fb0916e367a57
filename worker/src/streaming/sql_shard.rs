//! A streaming Sql or Join's state shard, for one checkpoint. Rows are sharded by window (every
//! input's rows of a window meet in one shard), buffered in the shard's store until the
//! window's trigger fires, then the query runs over the window's rows exactly as a batch run
//! evaluates it for one window (`sql::run_windowed`). Like a Combine's shard, the store is
//! checkpointed before the item reports, so the output commits once with the checkpoint and a
//! restarted or moved shard resumes from its last checkpoint.
//!
//! Namespaces (one store per transform):
//! - `b`: window ++ input ++ checkpoint → that checkpoint's rows of the window from that input
//!   (an Arrow IPC stream, hidden columns kept: the query needs the window bounds);
//! - `p`: window → the window's [`Panes`] (JSON). A shard holds few windows (windows, not
//!   keys), so every checkpoint looks at all of them instead of keeping timers.
use super::panes::{Arrival, Panes};
use super::shard::{ShardOutput, open_at, state_name};
use super::shard_open as open;
use super::trigger::Clock;
use crate::compile::SqlOp;
use crate::engine::work::CheckpointCtx;
use crate::error::RunError;
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use std::collections::BTreeMap;
use std::path::Path;

const BUFFER: &str = "b";
const PANES: &str = "p";
/// The number of windows held, in the store's own counters.
const WINDOWS: &str = "windows";

/// Which shard of which Sql or Join.
pub struct SqlShard<'a> {
    pub op: &'a SqlOp,
    /// The transform's name (its state's directory).
    pub name: &'a str,
    pub shard: u32,
    /// The user schema of each table of the query, by the op's table order.
    pub schemas: Vec<SchemaRef>,
    pub cache_bytes: usize,
}

/// Runs checkpoint `ctx.id` of the shard: buffers `inputs` (one list of batches per distinct
/// input collection, in `collections` order), fires the windows whose trigger says so.
pub async fn run(
    which: SqlShard<'_>,
    ctx: &CheckpointCtx,
    collections: &[String],
    inputs: Vec<Vec<RecordBatch>>,
    state_dir: &Path,
) -> Result<ShardOutput, RunError> {
    let SqlShard {
        op,
        name,
        shard,
        schemas,
        cache_bytes,
    } = which;
    let serr = |source| RunError::State {
        transform: name.to_string(),
        source: Box::new(source),
    };
    let dir = state_dir.join(state_name(name));
    let prefix = format!("{}/{}/shard-{shard}", ctx.state_prefix, state_name(name));
    let mut store = match open::take(&dir, shard, ctx.id - 1) {
        Some(s) => s,
        None => open_at(&dir, shard, cache_bytes, &prefix, ctx.id - 1)
            .await
            .map_err(serr)?,
    };
    let clock_in = Clock {
        watermark: ctx.watermark_in,
        now: ctx.now_us,
    };
    let clock = Clock {
        watermark: ctx.watermark,
        now: ctx.now_us,
    };
    let mut out = ShardOutput::default();

    // Every window the shard holds, then this checkpoint's rows by window and input.
    let mut panes: BTreeMap<[u8; 16], Panes> = BTreeMap::new();
    for (k, json) in store.scan(PANES).map_err(serr)? {
        let w: [u8; 16] = k
            .as_slice()
            .try_into()
            .map_err(|_| RunError::transform(name, "a window key of the wrong length"))?;
        let p = serde_json::from_slice(&json)
            .map_err(|e| RunError::transform(name, format!("pane state: {e}")))?;
        panes.insert(w, p);
    }
    let mut arrived: BTreeMap<[u8; 16], Vec<Vec<RecordBatch>>> = BTreeMap::new();
    for (i, batches) in inputs.into_iter().enumerate() {
        for b in batches {
            let groups = crate::columns::split_by_window(&b).ok_or_else(|| {
                RunError::transform(name, "a streaming Sql input without window columns")
            })?;
            for ((ws, we), rows) in groups {
                arrived
                    .entry(window_key(ws, we))
                    .or_insert_with(|| vec![vec![]; collections.len()])[i]
                    .push(rows);
            }
        }
    }
    let mut changes: Vec<(&str, Vec<u8>, Option<Vec<u8>>)> = vec![];
    for (w, per_input) in arrived {
        let n: usize = per_input.iter().flatten().map(RecordBatch::num_rows).sum();
        let p = panes
            .entry(w)
            .or_insert_with(|| Panes::new(&op.triggering, window_of(&w).1));
        match p.add_elements(n as u64, &clock_in) {
            Arrival::Taken => {}
            Arrival::TooLate | Arrival::Closed => {
                out.late_dropped += n as u64;
                continue;
            }
        }
        for (i, batches) in per_input.iter().enumerate() {
            if batches.is_empty() {
                continue;
            }
            let bytes = ipc(batches).map_err(|e| RunError::transform(name, e))?;
            changes.push((BUFFER, buffer_key(&w, i, ctx.id), Some(bytes)));
        }
    }
    // Rows of this checkpoint are read back with the stored ones when a window fires.
    store
        .apply(
            changes
                .drain(..)
                .collect::<Vec<_>>()
                .iter()
                .map(|(ns, k, v)| (*ns, k.as_slice(), v.as_deref())),
        )
        .map_err(serr)?;

    let mut windows = 0u64;
    for (w, p) in panes.iter_mut() {
        let firing = p.on_clock(&clock);
        let (ws, we) = window_of(w);
        let mut cleared = false;
        if let Some(f) = firing {
            let rows = store
                .scan_range(BUFFER, w, &window_key_next(w))
                .map_err(serr)?;
            let mut tables: Vec<Vec<RecordBatch>> = vec![vec![]; collections.len()];
            for (k, bytes) in &rows {
                let i = u16::from_be_bytes([k[16], k[17]]) as usize;
                let batches = from_ipc(bytes).map_err(|e| RunError::transform(name, e))?;
                tables
                    .get_mut(i)
                    .ok_or_else(|| RunError::transform(name, "buffered rows of an unknown input"))?
                    .extend(batches);
            }
            let full = op
                .tables
                .iter()
                .zip(&schemas)
                .map(|((table, coll), schema)| {
                    let i = collections.iter().position(|c| c == coll);
                    let batches = i.map(|i| tables[i].clone()).unwrap_or_default();
                    (table.clone(), schema.clone(), batches)
                })
                .collect();
            tracing::debug!(transform = name, shard, ws, we, pane = f.pane.index, "window fires");
            let fired = crate::sql::run_windowed(&op.query, full, op.output_schema.clone())
                .await
                .map_err(|m| RunError::transform(name, m))?;
            out.fired.extend(fired);
            if f.clear {
                changes.extend(rows.into_iter().map(|(k, _)| (BUFFER, k, None)));
                cleared = true;
            }
        }
        if p.is_expired(ctx.watermark) {
            // Its last pane fired above: nothing of it can come any more.
            changes.push((PANES, w.to_vec(), None));
            if !cleared {
                let left = store
                    .scan_range(BUFFER, w, &window_key_next(w))
                    .map_err(serr)?;
                changes.extend(left.into_iter().map(|(k, _)| (BUFFER, k, None)));
            }
            continue;
        }
        windows += 1;
        let json = serde_json::to_vec(p).map_err(|e| RunError::Internal(e.to_string()))?;
        changes.push((PANES, w.to_vec(), Some(json)));
    }
    store
        .apply(
            changes
                .iter()
                .map(|(ns, k, v)| (*ns, k.as_slice(), v.as_deref())),
        )
        .map_err(serr)?;
    out.keys = windows;
    store.set_count(WINDOWS, windows).map_err(serr)?;
    store.set_version(ctx.id).map_err(serr)?;
    let manifest = store.checkpoint(ctx.id, &prefix).await.map_err(serr)?;
    out.checkpoint_bytes = manifest.uploaded_bytes;
    out.state_bytes = store.disk_bytes();
    open::keep(&dir, store);
    Ok(out)
}

/// The state shard of a window's rows: all of a window, from every input, in one shard.
pub fn shard_of_window(ws: i64, we: i64, shards: u32) -> u32 {
    super::state::shard_of(&window_key(ws, we), shards)
}

/// A window's key: both bounds as order-preserving big-endian bytes (time order = key order).
fn window_key(ws: i64, we: i64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&((ws as u64) ^ (1 << 63)).to_be_bytes());
    k[8..].copy_from_slice(&((we as u64) ^ (1 << 63)).to_be_bytes());
    k
}

fn window_of(k: &[u8; 16]) -> (i64, i64) {
    let b = |s: &[u8]| (u64::from_be_bytes(s.try_into().expect("8 bytes")) ^ (1 << 63)) as i64;
    (b(&k[..8]), b(&k[8..]))
}

/// The first key after every buffer key of window `w`.
fn window_key_next(w: &[u8; 16]) -> Vec<u8> {
    let mut k = w.to_vec();
    k.push(0xff);
    k
}

fn buffer_key(w: &[u8; 16], input: usize, checkpoint: u64) -> Vec<u8> {
    let mut k = w.to_vec();
    k.extend_from_slice(&(input as u16).to_be_bytes());
    k.extend_from_slice(&checkpoint.to_be_bytes());
    k
}

fn ipc(batches: &[RecordBatch]) -> Result<Vec<u8>, String> {
    let schema = batches[0].schema();
    let mut w = arrow::ipc::writer::StreamWriter::try_new(Vec::new(), &schema)
        .map_err(|e| e.to_string())?;
    for b in batches {
        w.write(b).map_err(|e| e.to_string())?;
    }
    w.into_inner().map_err(|e| e.to_string())
}

fn from_ipc(bytes: &[u8]) -> Result<Vec<RecordBatch>, String> {
    arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)
        .map_err(|e| e.to_string())?
        .map(|b| b.map_err(|e| e.to_string()))
        .collect()
}
