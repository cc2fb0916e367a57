//! Session windows in a streaming Combine's state shard. Every element arrives in its own
//! window `[t, t+gap)`; a key's sessions are the unions of its overlapping windows, so a
//! checkpoint's windows merge with each other and with the key's stored sessions before the
//! trigger sees them:
//! - a stored session that new data only falls inside keeps its key, and the usual path
//!   adds the data to it;
//! - stored sessions that grow or join are re-keyed to the merged session: their accumulators
//!   are carried into it, their panes merged ([`Panes::merged`]) and their old keys deleted
//!   (their timers are left to fire on nothing);
//! - a key's stored sessions are found through the shard's `u` namespace (key bytes → window
//!   end), whose keys begin with the group-by keys' bytes;
//! - late data is judged on the element's own window before it merges, as Beam drops
//!   elements of expired windows; data joining a closed session is dropped and counted too.
use super::shard_layout::{Change, Codec, NS, decode_window, element_counts, state_key};
use super::state::ShardStore;
use arrow::array::{ArrayRef, AsArray, RecordBatch, TimestampMicrosecondArray, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::TimestampMicrosecondType;
use arrow::row::{RowConverter, SortField};
use riverbank_engine::combine::FinalCombiner;
use riverbank_engine::compile::CombineOp;
use riverbank_engine::error::RunError;
use riverbank_windowing::panes::Panes;
use riverbank_windowing::trigger::Clock;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What merging did besides rewriting the checkpoint's data.
#[derive(Default)]
pub(super) struct Merged {
    /// Stored accumulators of sessions merged away, re-keyed to the session they joined.
    pub carried: Option<RecordBatch>,
    /// The panes of sessions that absorbed stored ones, by their new key.
    pub panes: BTreeMap<Vec<u8>, Panes>,
    /// Deletions of the merged-away sessions: their state and their index entries.
    pub deleted: Vec<Change>,
    /// The keys of stored sessions merged away (their timers may still come due).
    pub removed: BTreeSet<Vec<u8>>,
    /// Elements dropped: their own window had expired, or they joined a closed session.
    pub late_dropped: u64,
}

/// One stored session of a key.
struct StoredSession {
    key: Vec<u8>,
    start: i64,
    end: i64,
    panes: Panes,
    /// Its accumulator row (empty: none, a discarding session that fired).
    acc: Vec<u8>,
}

/// Merges the checkpoint's windows (`delta`: one row per key and element window) with each
/// other and with the stored sessions of their keys. Returns the data re-keyed to its
/// merged sessions, and what became of the stored ones.
pub(super) fn merge(
    op: &CombineOp,
    name: &str,
    store: &ShardStore,
    codec: &Codec,
    delta: RecordBatch,
    clock_in: &Clock,
) -> Result<(RecordBatch, Merged), RunError> {
    let terr = |m: String| RunError::transform(name, m);
    let serr = |source| RunError::State {
        transform: name.to_string(),
        source: Box::new(source),
    };
    let nk = op.spec.key_fields.len();
    let (si, ei) = (nk - 2, nk - 1);
    let starts = bounds(&delta, si);
    let ends = bounds(&delta, ei);
    let arrivals = element_counts(&delta);
    let mut out = Merged::default();

    // Each row's user key (the key columns before the window), grouped.
    let user = user_keys(&delta, nk - 2).map_err(terr)?;
    let mut by_user: BTreeMap<&[u8], Vec<usize>> = BTreeMap::new();
    for (i, key) in user.iter().enumerate() {
        // An element whose own window expired is late, whatever it would have joined.
        if clock_in.watermark >= ends[i].saturating_add(op.triggering.allowed_lateness_us) {
            out.late_dropped += arrivals[i];
            continue;
        }
        by_user.entry(key.as_slice()).or_default().push(i);
    }

    // The stored sessions of those keys.
    let mut stored: BTreeMap<&[u8], Vec<StoredSession>> = BTreeMap::new();
    for &ukey in by_user.keys() {
        let found = store.scan_prefix(NS.sessions, ukey).map_err(serr)?;
        if found.is_empty() {
            continue;
        }
        let keys: Vec<Vec<u8>> = found.into_iter().map(|(k, _)| k).collect();
        let windows = codec.decode_keys(&keys).map_err(terr)?;
        let (ss, se) = (bounds_of(&windows[si]), bounds_of(&windows[ei]));
        let state_keys: Vec<Vec<u8>> = keys
            .iter()
            .zip(&se)
            .map(|(k, e)| state_key(*e, k))
            .collect();
        let values = store.get_many(NS.state, &state_keys).map_err(serr)?;
        let mut sessions = vec![];
        for (j, (key, value)) in keys.into_iter().zip(values).enumerate() {
            let value = value.ok_or_else(|| {
                RunError::Internal(format!("{name}: a session indexed but not stored"))
            })?;
            let (panes, acc) = decode_window(&value).map_err(terr)?;
            sessions.push(StoredSession {
                key,
                start: ss[j],
                end: se[j],
                panes,
                acc: acc.to_vec(),
            });
        }
        stored.insert(ukey, sessions);
    }

    // Per key, a sweep in start order: overlapping windows are one session.
    let (mut new_starts, mut new_ends) = (starts.clone(), ends.clone());
    let mut keep = vec![];
    // Sessions that absorbed stored ones: (user key, start) → their merged panes.
    let mut absorbed: BTreeMap<(Vec<u8>, i64), Panes> = BTreeMap::new();
    // Accumulators of stored sessions merged away, and their merged bounds.
    let (mut carried, mut carried_starts, mut carried_ends) = (vec![], vec![], vec![]);
    for (ukey, rows) in &by_user {
        let empty = vec![];
        let olds = stored.get(ukey).unwrap_or(&empty);
        // (start, end, Ok(row) | Err(stored index)).
        let mut parts: Vec<(i64, i64, Result<usize, usize>)> = rows
            .iter()
            .map(|&r| (starts[r], ends[r], Ok(r)))
            .chain(
                olds.iter()
                    .enumerate()
                    .map(|(j, s)| (s.start, s.end, Err(j))),
            )
            .collect();
        parts.sort_by_key(|p| (p.0, p.1));
        let mut i = 0;
        while i < parts.len() {
            let (start, mut end) = (parts[i].0, parts[i].1);
            let mut j = i + 1;
            while j < parts.len() && parts[j].0 < end {
                end = end.max(parts[j].1);
                j += 1;
            }
            let group = &parts[i..j];
            i = j;
            let new_rows: Vec<usize> = group.iter().filter_map(|p| p.2.ok()).collect();
            if new_rows.is_empty() {
                continue;
            }
            let olds_in: Vec<&StoredSession> = group
                .iter()
                .filter_map(|p| p.2.err())
                .map(|j| &olds[j])
                .collect();
            if olds_in.iter().any(|s| s.panes.is_closed()) {
                out.late_dropped += new_rows.iter().map(|&r| arrivals[r]).sum::<u64>();
                continue;
            }
            for &r in &new_rows {
                new_starts[r] = start;
                new_ends[r] = end;
                keep.push(r as u32);
            }
            let unchanged = matches!(olds_in.as_slice(), [s] if s.start == start && s.end == end);
            if olds_in.is_empty() || unchanged {
                continue;
            }
            let parts: Vec<Panes> = olds_in.iter().map(|s| s.panes.clone()).collect();
            absorbed.insert(
                (ukey.to_vec(), start),
                Panes::merged(&parts, &op.triggering, end, clock_in.now),
            );
            for s in olds_in {
                out.deleted.push((NS.state, state_key(s.end, &s.key), None));
                out.deleted.push((NS.sessions, s.key.clone(), None));
                out.removed.insert(s.key.clone());
                if !s.acc.is_empty() {
                    carried.push(s.acc.clone());
                    carried_starts.push(start);
                    carried_ends.push(end);
                }
            }
        }
    }

    // The checkpoint's data in its merged sessions, one row per key and session.
    keep.sort_unstable();
    let rekeyed = with_bounds(&delta, si, &new_starts, &new_ends).map_err(terr)?;
    let rekeyed = take_record_batch(&rekeyed, &UInt32Array::from(keep))
        .map_err(|e| RunError::Internal(e.to_string()))?;
    let cerr = |source| RunError::Combine {
        transform: name.to_string(),
        source,
    };
    // Unbounded memory, as the shard's own combines: a checkpoint's data is bounded by it.
    let mut fc =
        FinalCombiner::new(op.spec.clone(), usize::MAX, &std::env::temp_dir()).map_err(cerr)?;
    fc.merge(&rekeyed).map_err(cerr)?;
    let merged = fc.into_states().map_err(cerr)?;

    // The absorbed panes, under the merged sessions' keys.
    if !absorbed.is_empty() {
        let keys = codec.keys(&merged).map_err(terr)?;
        let user = user_keys(&merged, nk - 2).map_err(terr)?;
        let ms = bounds(&merged, si);
        for j in 0..merged.num_rows() {
            if let Some(p) = absorbed.remove(&(user[j].clone(), ms[j])) {
                out.panes.insert(keys.row(j).as_ref().to_vec(), p);
            }
        }
    }

    // The accumulators of the sessions merged away, re-keyed.
    if !carried.is_empty() {
        let b = codec.decode(&delta.schema(), &carried).map_err(terr)?;
        out.carried = Some(with_bounds(&b, si, &carried_starts, &carried_ends).map_err(terr)?);
    }
    Ok((merged, out))
}

fn bounds(b: &RecordBatch, i: usize) -> Vec<i64> {
    bounds_of(b.column(i))
}

fn bounds_of(a: &ArrayRef) -> Vec<i64> {
    a.as_primitive::<TimestampMicrosecondType>()
        .values()
        .to_vec()
}

/// Each row's user key columns (the first `n`) as bytes: a prefix of its state key, since
/// the row format encodes columns one after another, each self-delimiting.
fn user_keys(b: &RecordBatch, n: usize) -> Result<Vec<Vec<u8>>, String> {
    if n == 0 {
        return Ok(vec![vec![]; b.num_rows()]);
    }
    let fields = b.schema().fields()[..n]
        .iter()
        .map(|f| SortField::new(f.data_type().clone()))
        .collect();
    let conv = RowConverter::new(fields).map_err(|e| e.to_string())?;
    let rows = conv
        .convert_columns(&b.columns()[..n])
        .map_err(|e| e.to_string())?;
    Ok(rows.iter().map(|r| r.as_ref().to_vec()).collect())
}

/// `b` with its window columns (`si`, `si + 1`) replaced.
fn with_bounds(
    b: &RecordBatch,
    si: usize,
    starts: &[i64],
    ends: &[i64],
) -> Result<RecordBatch, String> {
    let mut cols = b.columns().to_vec();
    for (i, v) in [(si, starts), (si + 1, ends)] {
        let ty = b.schema().field(i).data_type().clone();
        cols[i] = Arc::new(TimestampMicrosecondArray::from(v.to_vec()).with_data_type(ty));
    }
    RecordBatch::try_new(b.schema(), cols).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_key_is_a_prefix_of_its_state_key() {
        use arrow::array::StringArray;
        use arrow::datatypes::{Field, Schema};
        let ts = riverbank_elements::columns::ts_type();
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", arrow::datatypes::DataType::Utf8, true),
            Field::new("ws", ts.clone(), false),
            Field::new("we", ts, false),
        ]));
        let t = |v: Vec<i64>| {
            Arc::new(TimestampMicrosecondArray::from(v).with_timezone("UTC")) as ArrayRef
        };
        let long = "x".repeat(70);
        let b = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(vec![
                    Some("a"),
                    Some("ab"),
                    None,
                    Some(&long),
                ])),
                t(vec![0, 5, 7, 9]),
                t(vec![10, 15, 17, 19]),
            ],
        )
        .unwrap();
        let codec = Codec::new(&schema, 3).unwrap();
        let full = codec.keys(&b).unwrap();
        let user = user_keys(&b, 1).unwrap();
        for (i, u) in user.iter().enumerate() {
            assert!(full.row(i).as_ref().starts_with(u), "row {i}");
            // And no other key's state key starts with it (encodings are self-delimiting).
            for j in (0..4).filter(|&j| j != i) {
                assert!(!full.row(j).as_ref().starts_with(u), "{i} in {j}");
            }
        }
    }
}
