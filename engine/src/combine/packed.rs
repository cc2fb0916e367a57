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

/// Keys below this are found by direct index instead of hashing: small integer domains (zone
/// ids, enum-like codes) are the common case, and an array of this many `u32`s (256 KiB at
/// most, grown to the largest key seen) stays in cache.
const DIRECT_KEYS: u128 = 1 << 16;
/// Marks an unused slot of the direct index.
const NONE: u32 = u32::MAX;
/// A table holding more groups than this gives its memory back when cleared; smaller ones
/// keep it for the next bundle (the producer clears once per bundle).
const KEEP_GROUPS: usize = 1 << 16;

pub(crate) struct PackedTable {
    types: Vec<DataType>,
    widths: Vec<usize>,
    /// Group `g`'s key.
    keys: Vec<u128>,
    /// (hash, group index), for keys of at least [`DIRECT_KEYS`].
    map: HashTable<(u64, u32)>,
    /// Group of key `k` for `k` < [`DIRECT_KEYS`], or [`NONE`].
    direct: Vec<u32>,
    /// The batch being interned, packed.
    scratch: Vec<u128>,
}

/// Packs a column of `width`-byte little-endian values into `scratch` at bit `shift`; the
/// first column (`shift` 0) fills the empty `scratch`, so it is never zeroed first.
fn pack_column(scratch: &mut Vec<u128>, bytes: &[u8], width: usize, shift: usize) {
    // One loop per width, so each value is a single load (not a call to memcpy).
    macro_rules! pack {
        ($t:ty) => {{
            let values = bytes
                .chunks_exact(width)
                .map(|v| u128::from(<$t>::from_le_bytes(v.try_into().expect("width"))));
            if shift == 0 {
                scratch.extend(values);
            } else {
                for (k, v) in scratch.iter_mut().zip(values) {
                    *k |= v << shift;
                }
            }
        }};
    }
    match width {
        1 => pack!(u8),
        2 => pack!(u16),
        4 => pack!(u32),
        _ => pack!(u64),
    }
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
            direct: Vec::new(),
            scratch: Vec::new(),
        })
    }

    pub fn num_groups(&self) -> usize {
        self.keys.len()
    }

    /// Approximate bytes held.
    pub fn size(&self) -> usize {
        (self.keys.capacity() + self.scratch.capacity()) * size_of::<u128>()
            + self.direct.capacity() * size_of::<u32>()
            + self.map.allocation_size()
    }

    /// Like [`super::groups::GroupTable::intern`] for key columns of the declared types.
    /// Returns false, having done nothing, when a key column has nulls.
    pub fn intern(&mut self, keys: &[ArrayRef], num_rows: usize, out: &mut Vec<usize>) -> bool {
        if keys.iter().any(|k| k.null_count() > 0) {
            return false;
        }
        out.clear();
        // One narrow key (zone ids and the like): the direct index alone, when it covers the
        // batch; no packing, no hashing, no run check.
        if let [column] = keys {
            let data = column.to_data();
            let bytes =
                |w: usize| &data.buffers()[0].as_slice()[data.offset() * w..][..num_rows * w];
            let done = match self.widths[0] {
                1 => self.intern_direct::<1>(bytes(1), out),
                2 => self.intern_direct::<2>(bytes(2), out),
                4 => self.intern_direct::<4>(bytes(4), out),
                _ => false,
            };
            if done {
                return true;
            }
        }
        let PackedTable {
            widths,
            keys: groups,
            map,
            direct,
            scratch,
            ..
        } = self;
        scratch.clear();
        let mut shift = 0;
        for (column, &width) in keys.iter().zip(widths.iter()) {
            let data = column.to_data();
            let start = data.offset() * width;
            let bytes = &data.buffers()[0].as_slice()[start..start + num_rows * width];
            pack_column(scratch, bytes, width, shift);
            shift += width * 8;
        }
        let Some(&first) = scratch.first() else {
            return true;
        };
        // Runs of equal keys (sorted or clustered input: time windows of time-ordered rows)
        // cost one comparison each.
        let (mut last_k, mut last_g) = (!first, 0usize);
        out.extend(scratch.iter().map(|&k| {
            if k != last_k {
                last_k = k;
                last_g = if k < DIRECT_KEYS {
                    let i = k as usize;
                    if i >= direct.len() {
                        direct.resize((i + 1).next_power_of_two(), NONE);
                    }
                    if direct[i] == NONE {
                        direct[i] = groups.len() as u32;
                        groups.push(k);
                    }
                    direct[i] as usize
                } else {
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
                    g as usize
                };
            }
            last_g
        }));
        true
    }

    /// Interns one column of `W`-byte keys by direct index; false, having done nothing, when
    /// some key is beyond [`DIRECT_KEYS`].
    fn intern_direct<const W: usize>(&mut self, bytes: &[u8], out: &mut Vec<usize>) -> bool {
        let values = || {
            bytes.chunks_exact(W).map(|c| {
                let mut word = [0u8; 4];
                word[..W].copy_from_slice(c);
                u32::from_le_bytes(word)
            })
        };
        let Some(max) = values().max() else {
            return true;
        };
        if u128::from(max) >= DIRECT_KEYS {
            return false;
        }
        let PackedTable {
            keys: groups,
            direct,
            ..
        } = self;
        if max as usize >= direct.len() {
            direct.resize((max as usize + 1).next_power_of_two(), NONE);
        }
        out.extend(values().map(|v| {
            let slot = &mut direct[v as usize];
            if *slot == NONE {
                *slot = groups.len() as u32;
                groups.push(u128::from(v));
            }
            *slot as usize
        }));
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

    /// Forget all groups; a large table also gives its memory back.
    pub fn clear(&mut self) {
        if self.keys.len() > KEEP_GROUPS {
            self.keys = Vec::new();
            self.map = HashTable::new();
            self.direct = Vec::new();
            self.scratch = Vec::new();
            return;
        }
        for &k in &self.keys {
            if k < DIRECT_KEYS {
                self.direct[k as usize] = NONE;
            }
        }
        self.keys.clear();
        self.map.clear();
    }
}
