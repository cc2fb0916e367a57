//! The seam between the engine and the state of a streaming job. In a streaming checkpoint a
//! Combine or a windowed Sql/Join runs as *state-shard* items: the engine gathers a shard's
//! input and hands it to a [`StateShards`] (the streaming runtime's), which merges it into the
//! shard's stored state, fires what is due and checkpoints the store; the engine runs the fired
//! rows on through the rest of the stage. Which shard a key or a window belongs to is decided
//! here, so the shuffle that feeds a shard and the store that keeps it agree.
use crate::compiled::{CombineOp, SqlOp};
use crate::error::RunError;
use crate::work::CheckpointCtx;
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use futures::future::BoxFuture;

/// What a shard's checkpoint produced.
#[derive(Debug, Default)]
pub struct ShardOutput {
    /// Fired panes: a Combine's evaluated to its merged-state form, a Sql's query output.
    pub fired: Vec<RecordBatch>,
    pub late_dropped: u64,
    /// Windows (key and window) held after the checkpoint.
    pub keys: u64,
    pub state_bytes: u64,
    pub checkpoint_bytes: u64,
}

/// Which shard of which Combine, and its input for this checkpoint (partial states).
pub struct CombineShard<'a> {
    pub op: &'a CombineOp,
    /// The Combine's transform name (its state's namespace).
    pub name: &'a str,
    pub shard: u32,
    /// Memory the shard's store may cache; the rest of its state stays on disk.
    pub cache_bytes: usize,
    pub batch_size: usize,
    pub inputs: Vec<RecordBatch>,
}

/// Which shard of which streaming Sql or Join, and its rows for this checkpoint.
pub struct SqlShard<'a> {
    pub op: &'a SqlOp,
    /// The transform's name (its state's directory).
    pub name: &'a str,
    pub shard: u32,
    /// The user schema of each table of the query, by the op's table order.
    pub schemas: Vec<SchemaRef>,
    pub cache_bytes: usize,
    /// One list of batches per distinct input collection, in `collections` order.
    pub collections: Vec<String>,
    pub inputs: Vec<Vec<RecordBatch>>,
}

/// Runs state-shard items: implemented by the streaming runtime, one per process and job.
pub trait StateShards: Send + Sync {
    fn combine<'a>(
        &'a self,
        shard: CombineShard<'a>,
        ctx: &'a CheckpointCtx,
    ) -> BoxFuture<'a, Result<ShardOutput, RunError>>;

    fn sql<'a>(
        &'a self,
        shard: SqlShard<'a>,
        ctx: &'a CheckpointCtx,
    ) -> BoxFuture<'a, Result<ShardOutput, RunError>>;
}

const SHARD_SEED: u64 = 0x5ba7_e5a1_7c0d_e0f1;

/// The state shard of a key: stable across processes, versions and machines.
pub fn shard_of(key: &[u8], shards: u32) -> u32 {
    shard_of_hash(crate::combine::stable_hash(SHARD_SEED, key), shards)
}

/// A window's key: both bounds as order-preserving big-endian bytes (time order = key order).
pub fn window_key(ws: i64, we: i64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&((ws as u64) ^ (1 << 63)).to_be_bytes());
    k[8..].copy_from_slice(&((we as u64) ^ (1 << 63)).to_be_bytes());
    k
}

/// The shard of a windowed Sql's window: all of a window's rows meet in one shard.
pub fn shard_of_window(ws: i64, we: i64, shards: u32) -> u32 {
    shard_of(&window_key(ws, we), shards)
}

/// Each row's key hash for a streaming query over the global window: the key columns
/// conformed to the key's types and hashed in Arrow's row format, so equal keys of any input
/// hash alike. No key columns: every row hashes alike.
pub fn key_hashes(
    b: &RecordBatch,
    fields: &[String],
    types: &[arrow::datatypes::DataType],
) -> Result<Vec<u64>, String> {
    use arrow::row::{RowConverter, SortField};
    if fields.is_empty() {
        return Ok(vec![0; b.num_rows()]);
    }
    let cols = fields
        .iter()
        .zip(types)
        .map(|(name, t)| {
            let c = b
                .column_by_name(name)
                .ok_or_else(|| format!("no key field '{name}'"))?;
            riverbank_elements::widen::conform_array(c, t)
        })
        .collect::<Result<Vec<_>, String>>()?;
    let conv = RowConverter::new(types.iter().map(|t| SortField::new(t.clone())).collect())
        .map_err(|e| e.to_string())?;
    let rows = conv.convert_columns(&cols).map_err(|e| e.to_string())?;
    Ok(rows
        .iter()
        .map(|r| crate::combine::stable_hash(SHARD_SEED, r.as_ref()))
        .collect())
}

/// The shard of a key hash from [`key_hashes`].
pub fn shard_of_hash(h: u64, shards: u32) -> u32 {
    ((u128::from(h) * u128::from(shards.max(1))) >> 64) as u32
}

/// A batch cut by the state shard of each row's key (see [`key_hashes`]).
pub fn split_by_key(
    b: &RecordBatch,
    fields: &[String],
    types: &[arrow::datatypes::DataType],
    shards: u32,
) -> Result<Vec<(u32, RecordBatch)>, String> {
    let hashes = key_hashes(b, fields, types)?;
    let mut rows: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
    for (i, h) in hashes.into_iter().enumerate() {
        rows.entry(shard_of_hash(h, shards))
            .or_default()
            .push(i as u32);
    }
    if rows.len() == 1 {
        let (p, _) = rows.pop_first().expect("one");
        return Ok(vec![(p, b.clone())]);
    }
    rows.into_iter()
        .map(|(p, idx)| {
            let idx = arrow::array::UInt32Array::from(idx);
            arrow::compute::take_record_batch(b, &idx)
                .map(|t| (p, t))
                .map_err(|e| e.to_string())
        })
        .collect()
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
