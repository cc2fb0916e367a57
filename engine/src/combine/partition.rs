//! Deterministic hash partitioning of partial-state batches for the shuffle.

use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::Field;

use super::CombineError;
use super::groups::{PARTITION_SEED, key_converter, stable_hash};

/// Split `state` into `partitions` batches (same schema, some possibly empty)
/// by a hash of its first `num_keys` columns.
///
/// The hash is computed over the arrow row encoding of the key columns with
/// a fixed-seed, platform-independent hash function, so every process and
/// every run agrees on the partition of a key (as long as the key column
/// *types* agree — `Int32` 1 and `Int64` 1 are different keys). Null keys all
/// go to the same partition; with `num_keys == 0` every row goes to one
/// partition. Row order is preserved within a partition.
pub fn hash_partition(
    state: &RecordBatch,
    num_keys: usize,
    partitions: usize,
) -> Result<Vec<RecordBatch>, CombineError> {
    if partitions == 0 {
        return Err(CombineError::BadBatch {
            what: "state",
            detail: "hash_partition needs at least one partition".to_string(),
        });
    }
    if num_keys > state.num_columns() {
        return Err(CombineError::BadBatch {
            what: "state",
            detail: format!(
                "hash_partition over {num_keys} key column(s) of a {}-column batch",
                state.num_columns()
            ),
        });
    }
    if partitions == 1 {
        return Ok(vec![state.clone()]);
    }
    let n = state.num_rows();
    let mut indices: Vec<Vec<u32>> = vec![Vec::new(); partitions];
    if num_keys == 0 {
        let p = partition_of(stable_hash(PARTITION_SEED, &[]), partitions);
        indices[p].extend(0..n as u32);
    } else {
        let schema = state.schema();
        let fields: Vec<Field> = schema.fields()[..num_keys]
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        let converter = key_converter(&fields)?;
        let rows = converter
            .convert_columns(&state.columns()[..num_keys])
            .map_err(CombineError::arrow("encoding keys for partitioning"))?;
        for (i, row) in rows.iter().enumerate() {
            let p = partition_of(stable_hash(PARTITION_SEED, row.data()), partitions);
            indices[p].push(i as u32);
        }
    }
    indices
        .into_iter()
        .map(|idx| {
            if idx.len() == n {
                return Ok(state.clone());
            }
            take_record_batch(state, &UInt32Array::from(idx))
                .map_err(CombineError::arrow("partitioning state batch"))
        })
        .collect()
}

/// Map a 64-bit hash onto `0..partitions` using its high bits.
#[inline]
fn partition_of(hash: u64, partitions: usize) -> usize {
    ((hash as u128 * partitions as u128) >> 64) as usize
}
