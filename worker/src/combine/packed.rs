//! Group keys of fixed-width integer-like columns (integers, dates, times, timestamps, at most
//! 16 bytes in all) packed into one `u128`: the producer-side partial combine's fast path. It
//! skips the row encoding [`super::groups::GroupTable`] needs for arbitrary keys, and hashes and
//! compares two words. Floats (whose row encoding normalises values), booleans and wider keys
//! are not packed; a batch with null keys moves the combine to the row table.
use arrow::array::{ArrayData, ArrayRef, make_array};
use arrow::buffer::Buffer;
use arrow::datatypes::{DataType, Field};
use hashbrown::HashTable;

use super::CombineError;

/// Bytes of one value of `t` when it can be packed.
fn packed_width(t: &DataType) -> Option<usize> {
    use DataType::*;
    match t {
        Int8 | UInt8 => Some(1),
        Int16 | UInt16 => Some(2),
        Int32 | UInt32 | Date32 | Time32(_) => Some(4),
        Int64 | UInt64 | Date64 | Time64(_) | Timestamp(_, _) | Duration(_) => Some(8),
        _ => None,
    }
}

/// Two multiply-folds over the key's halves; the table's own hash, never persisted.
#[inline(always)]
fn hash(k: u128) -> u64 {
    const P0: u64 = 0xa076_1d64_78bd_642f;
    const P1: u64 = 0xe703_7ed1_a0b4_28db;
    let fold = |a: u64, b: u64| {
        let r = u128::from(a).wrapping_mul(u128::from(b));
        (r as u64) ^ ((r >> 64) as u64)
    };
    fold((k as u64) ^ P0, ((k >> 64) as u64) ^ P1)
}

pub(crate) struct PackedTable {
    types: Vec<DataType>,
    widths: Vec<usize>,
    /// Group `g`'s key.
    keys: Vec<u128>,
    /// (hash, group index).
    map: HashTable<(u64, u32)>,
    /// The batch being interned, packed.
    scratch: Vec<u128>,
}

impl PackedTable {
    /// None when the keys cannot be packed.
    pub fn new(key_fields: &[Field]) -> Option<PackedTable> {
        let widths = key_fields
            .iter()
            .map(|f| packed_width(f.data_type()))
            .collect::<Option<Vec<usize>>>()?;
        let fits = !widths.is_empty() && widths.iter().sum::<usize>() <= 16;
        fits.then(|| PackedTable {
            types: key_fields.iter().map(|f| f.data_type().clone()).collect(),
            widths,
            keys: Vec::new(),
            map: HashTable::new(),
            scratch: Vec::new(),
        })
    }

    pub fn num_groups(&self) -> usize {
        self.keys.len()
    }

    /// Approximate bytes held.
    pub fn size(&self) -> usize {
        (self.keys.capacity() + self.scratch.capacity()) * size_of::<u128>()
            + self.map.allocation_size()
    }

    /// Like [`super::groups::GroupTable::intern`] for key columns of the declared types.
    /// Returns false, having done nothing, when a key column has nulls.
    pub fn intern(&mut self, keys: &[ArrayRef], num_rows: usize, out: &mut Vec<usize>) -> bool {
        if keys.iter().any(|k| k.null_count() > 0) {
            return false;
        }
        let PackedTable {
            widths,
            keys: groups,
            map,
            scratch,
            ..
        } = self;
        scratch.clear();
        scratch.resize(num_rows, 0);
        let mut shift = 0;
        for (column, &width) in keys.iter().zip(widths.iter()) {
            let data = column.to_data();
            let start = data.offset() * width;
            let bytes = &data.buffers()[0].as_slice()[start..start + num_rows * width];
            for (k, v) in scratch.iter_mut().zip(bytes.chunks_exact(width)) {
                let mut word = [0u8; 8];
                word[..width].copy_from_slice(v);
                *k |= u128::from(u64::from_le_bytes(word)) << shift;
            }
            shift += width * 8;
        }
        out.clear();
        out.reserve(num_rows);
        for &k in scratch.iter() {
            let h = hash(k);
            let g = match map.find(h, |&(hh, g)| hh == h && groups[g as usize] == k) {
                Some(&(_, g)) => g,
                None => {
                    let g = groups.len() as u32;
                    groups.push(k);
                    map.insert_unique(h, (h, g), |&(hh, _)| hh);
                    g
                }
            };
            out.push(g as usize);
        }
        true
    }

    /// The keys of all groups as columns of the declared types, in group order.
    pub fn key_columns(&self) -> Result<Vec<ArrayRef>, CombineError> {
        let mut shift = 0;
        let mut columns = Vec::with_capacity(self.types.len());
        for (t, &width) in self.types.iter().zip(&self.widths) {
            let values = self.keys.iter().map(|&k| (k >> shift) as u64);
            // A buffer of the value width, so it is aligned as arrow requires.
            let buffer = match width {
                1 => Buffer::from_vec(values.map(|v| v as u8).collect::<Vec<_>>()),
                2 => Buffer::from_vec(values.map(|v| v as u16).collect::<Vec<_>>()),
                4 => Buffer::from_vec(values.map(|v| v as u32).collect::<Vec<_>>()),
                _ => Buffer::from_vec(values.collect::<Vec<_>>()),
            };
            shift += width * 8;
            let data = ArrayData::builder(t.clone())
                .len(self.keys.len())
                .add_buffer(buffer)
                .build()
                .map_err(CombineError::arrow("decoding packed keys"))?;
            columns.push(make_array(data));
        }
        Ok(columns)
    }

    /// Forget all groups (and release their memory).
    pub fn clear(&mut self) {
        self.keys = Vec::new();
        self.map = HashTable::new();
    }
}
