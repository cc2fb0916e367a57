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
    use arrow::array::AsArray;
    use arrow::datatypes::Int64Type;
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
    // One Int64 key without nulls (an id, Nexmark's auction): its row encoding written
    // directly, without a RowConverter; the same bytes, so the same hashes and shards.
    if let [c] = cols.as_slice()
        && c.null_count() == 0
        && let Some(ids) = c.as_primitive_opt::<Int64Type>()
    {
        return Ok(ids
            .values()
            .iter()
            .map(|v| crate::combine::stable_hash(SHARD_SEED, &int64_row(*v)))
            .collect());
    }
    let conv = RowConverter::new(types.iter().map(|t| SortField::new(t.clone())).collect())
        .map_err(|e| e.to_string())?;
    let rows = conv.convert_columns(&cols).map_err(|e| e.to_string())?;
    Ok(rows
        .iter()
        .map(|r| crate::combine::stable_hash(SHARD_SEED, r.as_ref()))
        .collect())
}

/// A valid Int64's row as `arrow_row` encodes it: a valid-value byte, then the value
/// big-endian with its sign bit flipped (so the bytes sort as the numbers).
fn int64_row(v: i64) -> [u8; 9] {
    let mut row = [1u8; 9];
    row[1..].copy_from_slice(&((v as u64) ^ (1 << 63)).to_be_bytes());
    row
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
    // Row numbers per shard, in shard order (a shard's index: cheaper than a map per row).
    let mut rows: Vec<Vec<u32>> = vec![vec![]; shards.max(1) as usize];
    for (i, h) in hashes.into_iter().enumerate() {
        rows[shard_of_hash(h, shards) as usize].push(i as u32);
    }
    let cut: Vec<(u32, Vec<u32>)> = rows
        .into_iter()
        .enumerate()
        .filter(|(_, idx)| !idx.is_empty())
        .map(|(p, idx)| (p as u32, idx))
        .collect();
    // All in one shard: the batch as it is.
    if let [(p, _)] = cut.as_slice() {
        return Ok(vec![(*p, b.clone())]);
    }
    cut.into_iter()
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, Int64Array};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::row::{RowConverter, SortField};
    use std::sync::Arc;

    #[test]
    fn an_int64_key_hashes_as_its_row_encoding_does() {
        let values = vec![0, 1, -1, 42, -42, i64::MIN, i64::MAX, 1 << 40, -(1 << 40)];
        let column: ArrayRef = Arc::new(Int64Array::from(values.clone()));
        let conv = RowConverter::new(vec![SortField::new(DataType::Int64)]).unwrap();
        let rows = conv.convert_columns(std::slice::from_ref(&column)).unwrap();
        for (v, r) in values.iter().zip(rows.iter()) {
            assert_eq!(&int64_row(*v)[..], r.as_ref(), "{v}");
        }
        let schema = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
        let b = RecordBatch::try_new(Arc::new(schema), vec![column]).unwrap();
        let fast = key_hashes(&b, &["id".into()], &[DataType::Int64]).unwrap();
        let general: Vec<u64> = rows
            .iter()
            .map(|r| crate::combine::stable_hash(SHARD_SEED, r.as_ref()))
            .collect();
        assert_eq!(fast, general);
        // Every row in exactly one shard, in row order within it.
        let cut = split_by_key(&b, &["id".into()], &[DataType::Int64], 4).unwrap();
        assert_eq!(
            cut.iter().map(|(_, r)| r.num_rows()).sum::<usize>(),
            values.len()
        );
        for (shard, rows) in &cut {
            let ids = rows
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            for (i, id) in ids.values().iter().enumerate() {
                let at = values.iter().position(|v| v == id).unwrap();
                assert_eq!(shard_of_hash(fast[at], 4), *shard);
                if i > 0 {
                    let before = values.iter().position(|v| *v == ids.value(i - 1)).unwrap();
                    assert!(before < at);
                }
            }
        }
    }
}
