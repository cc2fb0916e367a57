//! How a Combine shard's store lays out its state: the namespaces, a window's key (its end
//! first, so a due window is one range) and value (panes, then the accumulator row), timers,
//! the key columns as Arrow rows (`Codec`), and the upgrade from the first layout. The shard
//! (`shard`) and the session merge (`session_merge`) both read and write through it.
use crate::state::ShardStore;
use arrow::array::{ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, Rows, SortField};
use riverbank_windowing::panes::Panes;
use std::collections::BTreeMap;

pub(crate) struct Namespaces {
    pub state: &'static str,
    pub timers: &'static str,
    pub ptimers: &'static str,
    /// Session windows: a key's sessions.
    pub sessions: &'static str,
    /// The number of windows held (a counter in the store's own keys).
    pub windows: &'static str,
}

/// One store per Combine: the namespaces need no name of their own, so a renamed transform
/// (an update's `transformNameMapping`) keeps its store as it is.
pub(crate) const NS: Namespaces = Namespaces {
    state: "s",
    timers: "e",
    ptimers: "r",
    sessions: "u",
    windows: "windows",
};

/// The store's layout, in its own counters: 0 for the first one (four keys per window).
pub(crate) const LAYOUT: &str = "layout";

pub(crate) const LAYOUT_VERSION: u64 = 2;

/// A window's key in the store: its end first, so the keys of a window are one range.
pub(crate) fn state_key(end: i64, key: &[u8]) -> Vec<u8> {
    timer_key(end, key)
}

/// A window's value: its panes, then its accumulator row (empty: none).
pub(crate) fn encode_window(p: &Panes, acc: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(96 + acc.len());
    p.encode(&mut v);
    v.extend_from_slice(acc);
    v
}

pub(crate) fn decode_window(v: &[u8]) -> Result<(Panes, &[u8]), String> {
    let (p, used) = Panes::decode(v).map_err(|e| format!("pane state: {e}"))?;
    Ok((p, &v[used..]))
}

/// Converts a store of the first layout (`a` accumulators and `p` JSON panes by key, `t` and
/// `q` timers per key) to this one, once.
pub(crate) fn upgrade(store: &mut ShardStore) -> Result<(), String> {
    let e = |e: super::state::StateError| e.to_string();
    match store.count(LAYOUT).map_err(e)? {
        LAYOUT_VERSION => return Ok(()),
        super::slices::SLICED => {
            return Err(
                "this Combine's state is kept per slice of its sliding windows (fired \
                 once each, at the watermark), and the job's windowing now needs it per \
                 window: it cannot be carried over; drain the job and start it again"
                    .into(),
            );
        }
        _ => {}
    }
    let mut changes: Vec<Change> = vec![];
    let mut ends = BTreeMap::new();
    for (key, json) in store.scan("p").map_err(e)? {
        let (p, _) = decode_window(&json)?;
        let acc = store.get("a", &key).map_err(e)?.unwrap_or_default();
        changes.push((
            NS.state,
            state_key(p.end(), &key),
            Some(encode_window(&p, &acc)),
        ));
        ends.insert(key.clone(), p.end());
        changes.push(("p", key, None));
    }
    for (key, _) in store.scan("a").map_err(e)? {
        changes.push(("a", key, None));
    }
    for (old, new) in [("t", NS.timers), ("q", NS.ptimers)] {
        for (k, _) in store.scan(old).map_err(e)? {
            if let Some(end) = ends.get(&k[8..]) {
                let rest = if new == NS.timers {
                    (*end as u64 ^ (1 << 63)).to_be_bytes().to_vec()
                } else {
                    state_key(*end, &k[8..])
                };
                let mut t = k[..8].to_vec();
                t.extend_from_slice(&rest);
                changes.push((new, t, Some(vec![])));
            }
            changes.push((old, k, None));
        }
    }
    if !changes.is_empty() {
        tracing::info!(
            windows = ends.len(),
            "converting a Combine's state shard to one key per window"
        );
    }
    store
        .apply(
            changes
                .iter()
                .map(|(ns, k, v)| (*ns, k.as_slice(), v.as_deref())),
        )
        .map_err(e)?;
    store.set_count(LAYOUT, LAYOUT_VERSION).map_err(e)
}

pub(crate) use super::state::OwnedChange as Change;

/// A timer's key: the deadline, ordered as unsigned big-endian bytes, then the window's key.
pub(crate) fn timer_key(deadline: i64, key: &[u8]) -> Vec<u8> {
    let mut k = ((deadline as u64) ^ (1 << 63)).to_be_bytes().to_vec();
    k.extend_from_slice(key);
    k
}

/// The time at the start of a [`timer_key`] (or a [`state_key`]).
pub(crate) fn time_of(key: &[u8]) -> i64 {
    (u64::from_be_bytes(key[..8].try_into().expect("8 bytes")) ^ (1 << 63)) as i64
}

/// Elements behind each state row: the hidden element count when the trigger counts
/// elements, else one arrival per row (what every other trigger needs).
pub(crate) fn element_counts(b: &RecordBatch) -> Vec<u64> {
    let schema = b.schema();
    match schema.fields().iter().position(|f| {
        f.name()
            .starts_with(riverbank_engine::compile::ELEMENT_COUNT)
    }) {
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
pub(crate) struct Codec {
    all: RowConverter,
    keys: Option<RowConverter>,
    nk: usize,
}

impl Codec {
    pub(crate) fn new(schema: &SchemaRef, nk: usize) -> Result<Codec, String> {
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

    pub(crate) fn rows(&self, b: &RecordBatch) -> Result<Rows, String> {
        self.all
            .convert_columns(b.columns())
            .map_err(|e| e.to_string())
    }

    /// Key bytes of every row (empty for a global combine: one key).
    pub(crate) fn keys(&self, b: &RecordBatch) -> Result<KeyRows, String> {
        match &self.keys {
            Some(c) => c
                .convert_columns(&b.columns()[..self.nk])
                .map(KeyRows::Rows)
                .map_err(|e| e.to_string()),
            None => Ok(KeyRows::Global),
        }
    }

    pub(crate) fn decode(
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
    pub(crate) fn decode_keys(&self, keys: &[Vec<u8>]) -> Result<Vec<ArrayRef>, String> {
        let Some(conv) = &self.keys else {
            return Ok(vec![]);
        };
        let parser = conv.parser();
        conv.convert_rows(keys.iter().map(|k| parser.parse(k)))
            .map_err(|e| e.to_string())
    }
}

pub(crate) enum KeyRows {
    Rows(Rows),
    Global,
}

impl KeyRows {
    pub(crate) fn row(&self, i: usize) -> KeyRow<'_> {
        match self {
            KeyRows::Rows(r) => KeyRow(Some(r.row(i))),
            KeyRows::Global => KeyRow(None),
        }
    }
}

pub(crate) struct KeyRow<'a>(Option<arrow::row::Row<'a>>);

impl AsRef<[u8]> for KeyRow<'_> {
    fn as_ref(&self) -> &[u8] {
        match &self.0 {
            Some(r) => r.as_ref(),
            None => &[],
        }
    }
}
