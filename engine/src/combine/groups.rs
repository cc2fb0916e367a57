//! Group-key hash table: key columns → arrow row bytes → dense group index.

use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, Field};
use arrow::row::{Row, RowConverter, Rows, SortField};
use hashbrown::HashTable;

use super::CombineError;
use super::aggregate::cast_to;

/// Seed of the in-memory group table hash (independent of the partition seed
/// so that the keys of one shuffle partition still spread over the table).
const TABLE_SEED: u64 = 0x243f_6a88_85a3_08d3;

/// Seed of [`super::hash_partition`]. Never change it: every process of a job
/// must agree on it.
pub(crate) const PARTITION_SEED: u64 = 0x1319_8a2e_0370_7344;

const P0: u64 = 0xa076_1d64_78bd_642f;
const P1: u64 = 0xe703_7ed1_a0b4_28db;

/// 64x64→128 bit multiply, folded to 64 bits.
#[inline(always)]
fn mum(a: u64, b: u64) -> u64 {
    let r = (a as u128).wrapping_mul(b as u128);
    (r as u64) ^ ((r >> 64) as u64)
}

#[inline(always)]
fn read8(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

#[inline(always)]
fn read4(b: &[u8], i: usize) -> u64 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes")) as u64
}

/// A fast 64-bit hash of a byte string that is stable across processes,
/// platforms and releases (no random state, no CPU-feature dependent paths):
/// a wyhash-style folded-multiply hash, one multiply per 16 bytes plus one.
#[inline]
pub(crate) fn stable_hash(seed: u64, bytes: &[u8]) -> u64 {
    let len = bytes.len();
    let mut seed = seed ^ P0;
    let (a, b) = if len <= 16 {
        if len >= 8 {
            (read8(bytes, 0), read8(bytes, len - 8))
        } else if len >= 4 {
            (read4(bytes, 0), read4(bytes, len - 4))
        } else if len > 0 {
            (
                ((bytes[0] as u64) << 16) | ((bytes[len / 2] as u64) << 8) | bytes[len - 1] as u64,
                0,
            )
        } else {
            (0, 0)
        }
    } else {
        let mut i = 0;
        while len - i > 16 {
            seed = mum(read8(bytes, i) ^ P1, read8(bytes, i + 8) ^ seed);
            i += 16;
        }
        (read8(bytes, len - 16), read8(bytes, len - 8))
    };
    mum(P1 ^ len as u64, mum(a ^ P1, b ^ seed))
}

/// Equality of two byte strings, with a branch-light path for short ones.
#[inline(always)]
fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    let len = a.len();
    if len != b.len() {
        return false;
    }
    if (8..=16).contains(&len) {
        read8(a, 0) == read8(b, 0) && read8(a, len - 8) == read8(b, len - 8)
    } else {
        a == b
    }
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
    /// Row bytes of group `g` are `data[offsets[g]..offsets[g + 1]]`.
    data: Vec<u8>,
    offsets: Vec<usize>,
    /// (hash, group index).
    map: HashTable<(u64, u32)>,
    /// Reused buffers for the batch being interned.
    scratch: Rows,
    hashes: Vec<u64>,
}

impl GroupTable {
    pub fn new(key_fields: &[Field]) -> Result<Self, CombineError> {
        let converter = key_converter(key_fields)?;
        Ok(GroupTable {
            key_types: key_fields.iter().map(|f| f.data_type().clone()).collect(),
            data: Vec::new(),
            offsets: vec![0],
            scratch: converter.empty_rows(0, 0),
            converter,
            map: HashTable::new(),
            hashes: Vec::new(),
        })
    }

    pub fn num_groups(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn is_global(&self) -> bool {
        self.key_types.is_empty()
    }

    /// Approximate bytes held.
    pub fn size(&self) -> usize {
        self.data.capacity()
            + self.offsets.capacity() * size_of::<usize>()
            + self.scratch.size()
            + self.hashes.capacity() * size_of::<u64>()
            + self.map.allocation_size()
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
            if num_rows > 0 && self.num_groups() == 0 {
                self.offsets.push(0);
            }
            out.resize(num_rows, 0);
            return Ok(());
        }
        self.scratch.clear();
        self.converter
            .append(&mut self.scratch, keys)
            .map_err(CombineError::arrow("encoding keys"))?;
        let GroupTable {
            data,
            offsets,
            map,
            scratch,
            hashes,
            ..
        } = self;
        // Hash everything first: independent iterations pipeline well.
        hashes.clear();
        hashes.extend(scratch.iter().map(|r| stable_hash(TABLE_SEED, r.data())));
        out.reserve(hashes.len());
        for (row, &h) in scratch.iter().zip(hashes.iter()) {
            let bytes = row.data();
            let found = map
                .find(h, |&(hh, g)| {
                    hh == h && {
                        let g = g as usize;
                        bytes_eq(&data[offsets[g]..offsets[g + 1]], bytes)
                    }
                })
                .map(|&(_, g)| g);
            let g = match found {
                Some(g) => g,
                None => {
                    let g = (offsets.len() - 1) as u32;
                    data.extend_from_slice(bytes);
                    offsets.push(data.len());
                    map.insert_unique(h, (h, g), |&(hh, _)| hh);
                    g
                }
            };
            out.push(g as usize);
        }
        Ok(())
    }

    /// Row bytes of group `g`.
    #[inline]
    pub fn row_bytes(&self, g: usize) -> &[u8] {
        &self.data[self.offsets[g]..self.offsets[g + 1]]
    }

    /// Group indices ordered by their key row bytes.
    pub fn sorted_groups(&self) -> Vec<u32> {
        let mut idx: Vec<u32> = (0..self.num_groups() as u32).collect();
        idx.sort_unstable_by(|&a, &b| self.row_bytes(a as usize).cmp(self.row_bytes(b as usize)));
        idx
    }

    /// Decode the keys of all groups, in group order.
    pub fn key_columns(&self) -> Result<Vec<ArrayRef>, CombineError> {
        let parser = self.converter.parser();
        decode_keys(
            &self.converter,
            &self.key_types,
            (0..self.num_groups()).map(|g| parser.parse(self.row_bytes(g))),
        )
    }

    /// Forget all groups (and release their memory).
    pub fn clear(&mut self) {
        self.data = Vec::new();
        self.offsets = vec![0];
        self.map = HashTable::new();
    }
}

/// Decode row bytes back to key columns of the declared key types.
pub(crate) fn decode_keys<'a>(
    converter: &RowConverter,
    key_types: &[DataType],
    rows: impl IntoIterator<Item = Row<'a>>,
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
