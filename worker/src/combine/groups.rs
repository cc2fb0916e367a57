//! Group-key hash table: key columns → arrow row bytes → dense group index.

use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, Field};
use arrow::row::{RowConverter, Rows, SortField};
use hashbrown::HashTable;

use super::CombineError;
use super::aggregate::cast_to;

/// Seed of the in-memory group table hash (independent of the partition seed
/// so that the keys of one shuffle partition still spread over the table).
const TABLE_SEED: u64 = 0x243f_6a88_85a3_08d3;

/// Seed of [`super::hash_partition`]. Never change it: every process of a job
/// must agree on it.
pub(crate) const PARTITION_SEED: u64 = 0x1319_8a2e_0370_7344;

/// A fast 64-bit hash of a byte string that is stable across processes,
/// platforms and releases (no random state, no CPU-feature dependent paths):
/// FxHash-style word mixing finished with MurmurHash3's `fmix64`.
#[inline]
pub(crate) fn stable_hash(seed: u64, bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = seed ^ (bytes.len() as u64).wrapping_mul(K);
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().expect("8-byte chunk"));
        h = (h.rotate_left(5) ^ w).wrapping_mul(K);
    }
    let rem = chunks.remainder();
    if !rem.is_empty() {
        let mut buf = [0u8; 8];
        buf[..rem.len()].copy_from_slice(rem);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(buf)).wrapping_mul(K);
    }
    // fmix64
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

pub(crate) fn key_converter(key_fields: &[Field]) -> Result<RowConverter, CombineError> {
    RowConverter::new(
        key_fields
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect(),
    )
    .map_err(CombineError::UnsupportedKey)
}

/// Check/cast the key columns of a batch to the declared key types (the row
/// converter panics on a type mismatch).
pub(crate) fn prepare_keys(
    key_fields: &[Field],
    columns: &[ArrayRef],
) -> Result<Vec<ArrayRef>, CombineError> {
    key_fields
        .iter()
        .zip(columns)
        .map(|(f, c)| cast_to(c, f.data_type(), || format!("casting key `{}`", f.name())))
        .collect()
}

/// Interns group keys. Group indices are dense, in first-seen order.
pub(crate) struct GroupTable {
    key_types: Vec<DataType>,
    converter: RowConverter,
    /// Row bytes of group `i` are `rows.row(i)`.
    rows: Rows,
    /// (hash, group index).
    map: HashTable<(u64, u32)>,
    /// Reused buffer for the rows of the batch being interned.
    scratch: Rows,
}

impl GroupTable {
    pub fn new(key_fields: &[Field]) -> Result<Self, CombineError> {
        let converter = key_converter(key_fields)?;
        Ok(GroupTable {
            key_types: key_fields.iter().map(|f| f.data_type().clone()).collect(),
            rows: converter.empty_rows(0, 0),
            scratch: converter.empty_rows(0, 0),
            converter,
            map: HashTable::new(),
        })
    }

    pub fn num_groups(&self) -> usize {
        self.rows.num_rows()
    }

    pub fn is_global(&self) -> bool {
        self.key_types.is_empty()
    }

    /// Approximate bytes held.
    pub fn size(&self) -> usize {
        self.rows.size() + self.scratch.size() + self.map.allocation_size()
    }

    /// Group index of every row of `keys` (already prepared, `num_rows` long)
    /// written to `out` (cleared first); new keys get new groups.
    pub fn intern(
        &mut self,
        keys: &[ArrayRef],
        num_rows: usize,
        out: &mut Vec<usize>,
    ) -> Result<(), CombineError> {
        out.clear();
        if self.is_global() {
            if num_rows > 0 && self.rows.num_rows() == 0 {
                let parser = self.converter.parser();
                self.rows.push(parser.parse(&[]));
            }
            out.resize(num_rows, 0);
            return Ok(());
        }
        self.scratch.clear();
        self.converter
            .append(&mut self.scratch, keys)
            .map_err(CombineError::arrow("encoding keys"))?;
        let GroupTable {
            rows, map, scratch, ..
        } = self;
        out.reserve(scratch.num_rows());
        for row in scratch.iter() {
            let bytes = row.data();
            let h = stable_hash(TABLE_SEED, bytes);
            let found = map
                .find(h, |&(hh, g)| {
                    hh == h && rows.row(g as usize).data() == bytes
                })
                .map(|&(_, g)| g);
            let g = match found {
                Some(g) => g,
                None => {
                    let g = rows.num_rows() as u32;
                    rows.push(row);
                    map.insert_unique(h, (h, g), |&(hh, _)| hh);
                    g
                }
            };
            out.push(g as usize);
        }
        Ok(())
    }

    /// Row bytes of group `g`.
    pub fn row_bytes(&self, g: usize) -> &[u8] {
        self.rows.row(g).data()
    }

    /// Group indices ordered by their key row bytes.
    pub fn sorted_groups(&self) -> Vec<u32> {
        let mut idx: Vec<u32> = (0..self.rows.num_rows() as u32).collect();
        let rows = &self.rows;
        idx.sort_unstable_by(|&a, &b| rows.row(a as usize).data().cmp(rows.row(b as usize).data()));
        idx
    }

    /// Decode the keys of all groups, in group order.
    pub fn key_columns(&self) -> Result<Vec<ArrayRef>, CombineError> {
        decode_keys(&self.converter, &self.key_types, &self.rows)
    }

    /// Forget all groups (keeps allocations small again).
    pub fn clear(&mut self) {
        self.rows = self.converter.empty_rows(0, 0);
        self.map = HashTable::new();
    }
}

/// Decode row bytes back to key columns of the declared key types.
pub(crate) fn decode_keys(
    converter: &RowConverter,
    key_types: &[DataType],
    rows: &Rows,
) -> Result<Vec<ArrayRef>, CombineError> {
    if key_types.is_empty() {
        return Ok(Vec::new());
    }
    let cols = converter
        .convert_rows(rows)
        .map_err(CombineError::arrow("decoding keys"))?;
    cols.iter()
        .zip(key_types)
        .map(|(c, t)| cast_to(c, t, || "decoding keys".to_string()))
        .collect()
}

pub(crate) fn key_types(key_fields: &[Field]) -> Arc<[DataType]> {
    key_fields.iter().map(|f| f.data_type().clone()).collect()
}
