//! A streaming Combine's state shard, for one checkpoint: the keyed, windowed accumulators and
//! their panes live in the shard's store on the worker's disk; the checkpoint's partial states
//! merge into them, the trigger of every window touched or due decides which panes fire, and
//! the store is checkpointed to `tempLocation` before the item reports, so whichever worker
//! runs the shard's next checkpoint can restore it.
//!
//! Namespaces (one store per Combine):
//! - `s`: big-endian window end ++ key bytes (group-by keys and window) → the window's
//!   [`Panes`] (binary, [`Panes::encode`]) followed by its accumulator row (Arrow row format of
//!   the state batch: keys, then state columns; none once a pane cleared it). One value per
//!   window and key, in window-end order: the keys of a window are one range;
//! - `e`: event-time timers, big-endian deadline ++ window end: every window ending there is
//!   looked at (its end and its expiry; all keys of a window share them, so a timer per
//!   window end rather than per key);
//! - `r`: processing-time timers, big-endian deadline ++ the window's `s` key;
//! - `u` (session windows only): key bytes → big-endian window end, so that a key's sessions
//!   are one range (key bytes begin with the group-by keys' bytes).
//!
//! Stores of the earlier layout (four keys per window and key: `a` accumulator, `p` panes as
//! JSON, `t` and `q` timers per key) are converted when first opened ([`upgrade`]).
use super::session_merge;
use super::shard_layout::{
    Change, Codec, NS, decode_window, element_counts, encode_window, state_key, time_of, timer_key,
    upgrade,
};
use super::shard_open as open;
use arrow::array::{AsArray, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::TimestampMicrosecondType;
use riverbank_engine::combine::FinalCombiner;
use riverbank_engine::compile::CombineOp;
use riverbank_engine::error::RunError;
use riverbank_engine::work::CheckpointCtx;
use riverbank_io::unbounded::END_OF_TIME;
use riverbank_windowing::panes::{Arrival, Panes};
use riverbank_windowing::trigger::Clock;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

pub use riverbank_engine::shards::{ShardOutput, state_name};

/// Which shard of which Combine.
pub struct Shard<'a> {
    pub op: &'a CombineOp,
    /// The Combine's transform name (its state's namespace).
    pub name: &'a str,
    pub shard: u32,
    /// Memory the shard's store may cache; the rest of its state stays on disk.
    pub cache_bytes: usize,
}

/// A checkpoint's two clocks: at the watermark before it (what arrivals are judged late
/// against) and after it (what fires), both at the checkpoint's processing time.
pub(super) fn clocks(ctx: &CheckpointCtx) -> (Clock, Clock) {
    let at = |watermark| Clock {
        watermark,
        now: ctx.now_us,
    };
    (at(ctx.watermark_in), at(ctx.watermark))
}

/// Runs checkpoint `ctx.id` of shard `shard` of the Combine `name`, keeping
/// the shard under `state_dir` (the worker's disk).
pub async fn run(
    which: Shard<'_>,
    ctx: &CheckpointCtx,
    inputs: Vec<RecordBatch>,
    state_dir: &Path,
    batch_size: usize,
) -> Result<ShardOutput, RunError> {
    if let Some(slices) = which.op.slices {
        return super::slices::run(which, slices, ctx, inputs, state_dir, batch_size).await;
    }
    let Shard {
        op,
        name,
        shard,
        cache_bytes,
    } = which;
    let serr = open::state_err(name);
    let cerr = |source| RunError::Combine {
        transform: name.to_string(),
        source,
    };
    let started = std::time::Instant::now();
    let mut at = open::ShardAt::open(state_dir, name, shard, cache_bytes, ctx).await?;
    let store = &mut at.store;

    // The checkpoint's new data, merged per key and window.
    let spill = std::env::temp_dir();
    let mut delta = FinalCombiner::new(op.spec.clone(), usize::MAX, &spill).map_err(cerr)?;
    for b in &inputs {
        delta.merge(b).map_err(cerr)?;
    }
    let inputs_rows: usize = inputs.iter().map(RecordBatch::num_rows).sum();
    let delta = delta.into_states().map_err(cerr)?;
    let t_delta = started.elapsed();
    let codec = Codec::new(&delta.schema(), op.spec.key_fields.len())
        .map_err(|e| RunError::transform(name, format!("state rows: {e}")))?;
    let ns = NS;
    let triggering = &op.triggering;
    let (clock_in, clock) = clocks(ctx);
    let mut out = ShardOutput::default();

    upgrade(store).map_err(|e| RunError::transform(name, e))?;
    // Session windows: the checkpoint's windows merge with each other and with the stored
    // sessions of their keys first (see `session_merge`).
    let (delta, mut sessions) = if op.sessions {
        session_merge::merge(op, name, store, &codec, delta, &clock_in)?
    } else {
        (delta, session_merge::Merged::default())
    };
    out.late_dropped += sessions.late_dropped;
    // Arrivals: late data is judged against the watermark before this checkpoint.
    let delta_keys = codec
        .keys(&delta)
        .map_err(|e| RunError::transform(name, e))?;
    let ends = window_ends(op, &delta);
    let mut panes: BTreeMap<Vec<u8>, Panes> = BTreeMap::new();
    // Windows not in the store yet (the rest were stored): the shard's window count moves
    // by the difference, without a scan of its state, and they get their end's timers. A
    // window put in `panes` from elsewhere (a merged session) belongs here; a window's store
    // key is `state_key(its end, its key)`. And the stored accumulators.
    let mut new_panes: Vec<Vec<u8>> = vec![];
    let mut stored_accs: Vec<Vec<u8>> = vec![];
    let mut stored_window = |key: &[u8], value: &[u8], panes: &mut BTreeMap<Vec<u8>, Panes>| {
        let (p, acc) = decode_window(value).map_err(|e| RunError::transform(name, e))?;
        if !acc.is_empty() {
            stored_accs.push(acc.to_vec());
        }
        panes.insert(key.to_vec(), p);
        Ok::<_, RunError>(())
    };
    let mut taken = vec![];
    let arrivals = element_counts(&delta);
    let state_keys: Vec<Vec<u8>> = (0..delta.num_rows())
        .map(|i| state_key(ends[i], delta_keys.row(i).as_ref()))
        .collect();
    let found = store.get_many(ns.state, &state_keys).map_err(&serr)?;
    for (i, (skey, found)) in state_keys.iter().zip(found).enumerate() {
        let key = &skey[8..];
        match found {
            Some(v) => stored_window(key, &v, &mut panes)?,
            None => {
                new_panes.push(key.to_vec());
                let p = sessions.panes.remove(key);
                panes.insert(
                    key.to_vec(),
                    p.unwrap_or_else(|| Panes::new(triggering, ends[i])),
                );
            }
        }
        let p = panes.get_mut(key).expect("just inserted");
        match p.add_elements(arrivals[i], &clock_in) {
            Arrival::Taken => taken.push(i as u32),
            Arrival::TooLate | Arrival::Closed => out.late_dropped += arrivals[i],
        }
    }
    let delta = take_record_batch(&delta, &UInt32Array::from(taken))
        .map_err(|e| RunError::Internal(e.to_string()))?;

    // Windows due without new data: their end or expiry passed (every key of the window, one
    // range), or a processing-time deadline.
    let mut changes: Vec<Change> = std::mem::take(&mut sessions.deleted);
    let mut due = vec![];
    let hi = timer_key(ctx.now_us.saturating_add(1), &[]);
    for (k, _) in store.scan_range(ns.ptimers, &[], &hi).map_err(&serr)? {
        if !panes.contains_key(&k[16..]) && !sessions.removed.contains(&k[16..]) {
            due.push(k[8..].to_vec());
        }
        changes.push((ns.ptimers, k, None));
    }
    due.sort();
    due.dedup();
    let mut windows =
        store.count(ns.windows).map_err(&serr)? as i64 - sessions.removed.len() as i64;
    let mut quiet = Quiet::default();
    let mut due_ends = std::collections::BTreeSet::new();
    let hi = timer_key(ctx.watermark.saturating_add(1), &[]);
    for (k, _) in store.scan_range(ns.timers, &[], &hi).map_err(&serr)? {
        due_ends.insert(k[8..16].to_vec());
        changes.push((ns.timers, k, None));
    }
    // Due ends whose windows all expire now (they share the expiry): deleted as ranges.
    let mut expired_ends = vec![];
    for end in due_ends {
        let mut hi = end.clone();
        hi.push(0xff);
        let e = time_of(&end);
        if ctx.watermark >= e.saturating_add(triggering.allowed_lateness_us) {
            expired_ends.push((e, end.clone(), hi.clone()));
        }
        let range_deleted = expired_ends.last().is_some_and(|x| x.1 == end);
        store
            .for_each_in_range(ns.state, &end, &hi, |skey, v| {
                // (Sessions merged away in this checkpoint are stored until it applies.)
                let key = &skey[8..];
                if panes.contains_key(key) || sessions.removed.contains(key) {
                    return Ok(());
                }
                // A window with no new data and no other reason to be looked at (most of
                // those a watermark fires) is fired from its stored accumulator as it is.
                if op.sessions || due.binary_search_by(|d| d.as_slice().cmp(skey)).is_ok() {
                    return stored_window(key, v, &mut panes);
                }
                let (p, acc) = decode_window(v).map_err(|e| RunError::transform(name, e))?;
                windows -= quiet.look(skey, p, acc, &clock, range_deleted, &mut changes);
                Ok(())
            })
            .map_err(&serr)??;
    }
    let found = store.get_many(ns.state, &due).map_err(&serr)?;
    for (skey, v) in due.iter().zip(found) {
        if let Some(v) = v {
            stored_window(&skey[8..], &v, &mut panes)?;
        }
    }

    let t_read = started.elapsed();
    // The accumulators of every window in play: stored ones and the new data, merged.
    let mut merged = FinalCombiner::new(op.spec.clone(), usize::MAX, &spill).map_err(cerr)?;
    if !stored_accs.is_empty() {
        let b = codec
            .decode(&delta.schema(), &stored_accs)
            .map_err(|e| RunError::transform(name, e))?;
        merged.merge(&b).map_err(cerr)?;
    }
    drop(stored_accs);
    if let Some(carried) = &sessions.carried {
        merged.merge(carried).map_err(cerr)?;
    }
    merged.merge(&delta).map_err(cerr)?;
    let merged = merged.into_states().map_err(cerr)?;
    let merged_keys = codec
        .keys(&merged)
        .map_err(|e| RunError::transform(name, e))?;
    let rows = codec
        .rows(&merged)
        .map_err(|e| RunError::transform(name, e))?;
    // Both in key order, as `panes` is: the loop below walks them alongside (no lookups).
    let mut in_merged: Vec<usize> = (0..merged.num_rows()).collect();
    in_merged.sort_unstable_by(|a, b| {
        merged_keys
            .row(*a)
            .as_ref()
            .cmp(merged_keys.row(*b).as_ref())
    });
    let mut in_merged = in_merged.into_iter().peekable();
    new_panes.sort_unstable();
    let mut new_panes = new_panes.iter().peekable();

    // Triggers: which windows fire now, and what each keeps.
    let mut fire = vec![];
    let mut fired_panes = vec![];
    let mut timers = std::collections::BTreeSet::new();
    for (key, p) in panes.iter_mut() {
        // One evaluation per checkpoint: its elements share a pane.
        let firing = p.on_clock(&clock);
        let row = in_merged.next_if(|j| merged_keys.row(*j).as_ref() == key.as_slice());
        let fired = firing.is_some();
        let clear = firing.is_some_and(|f| f.clear);
        if let (Some(f), Some(j)) = (firing, row) {
            fire.push(j as u32);
            fired_panes.push(pane_row(&f.pane));
        }
        let skey = state_key(p.end(), key);
        let was = new_panes.next_if(|k| *k == key).is_none();
        if p.is_expired(ctx.watermark) {
            let range_deleted = expired_ends.iter().any(|(e, _, _)| *e == p.end());
            if was && !range_deleted {
                changes.push((ns.state, skey, None));
            }
            if was && op.sessions {
                changes.push((ns.sessions, key.clone(), None));
            }
            windows -= i64::from(was);
            continue;
        }
        windows += i64::from(!was);
        // Look again at the window's end and at its expiry (set once, when the window is
        // new: they never move); sooner for processing time.
        if !was {
            for t in [p.end(), p.expiry()] {
                if t > ctx.watermark {
                    timers.insert(timer_key(t, &skey[..8]));
                }
            }
            if op.sessions {
                changes.push((ns.sessions, key.clone(), Some(skey[..8].to_vec())));
            }
        }
        if let Some(d) = p.next_deadline() {
            changes.push((ns.ptimers, timer_key(d, &skey), Some(vec![])));
        }
        let value = match row {
            Some(j) if !(fired && clear) => encode_window(p, rows.row(j).as_ref()),
            _ => encode_window(p, &[]),
        };
        changes.push((ns.state, skey, Some(value)));
    }
    if in_merged.peek().is_some() {
        return Err(RunError::Internal(format!(
            "{name}: an accumulator of a window not in play"
        )));
    }
    changes.extend(timers.into_iter().map(|t| (ns.timers, t, Some(vec![]))));
    let t_trigger = started.elapsed();
    let fire_n = fire.len() + quiet.panes.len();
    if fire_n > 0 {
        let firing = take_record_batch(&merged, &UInt32Array::from(fire))
            .map_err(|e| RunError::Internal(e.to_string()))?;
        let mut fc = FinalCombiner::new(op.spec.clone(), usize::MAX, &spill).map_err(cerr)?;
        fc.merge(&firing).map_err(cerr)?;
        if !quiet.accs.is_empty() {
            let b = codec
                .decode(&delta.schema(), &quiet.accs)
                .map_err(|e| RunError::transform(name, e))?;
            fc.merge(&b).map_err(cerr)?;
        }
        fired_panes.append(&mut quiet.panes);
        // The combiner emits groups in the order they came (one row per window here: the
        // quiet windows are not among the others), so the panes line up with its output rows.
        let mut at = 0;
        for b in fc.finish(batch_size).map_err(cerr)? {
            let b = b.map_err(cerr)?;
            let n = b.num_rows();
            out.fired.push(with_panes(&b, &fired_panes[at..at + n]));
            at += n;
        }
    }

    let t_fire = started.elapsed();
    for (_, lo, hi) in &expired_ends {
        store.delete_range(ns.state, lo, hi).map_err(&serr)?;
    }
    let changed = changes.len();
    store.apply_owned(changes).map_err(&serr)?;
    let t_apply = started.elapsed();
    out.keys = windows.max(0) as u64;
    store.set_count(ns.windows, out.keys).map_err(&serr)?;
    at.checkpoint(ctx, &mut out).await?;
    // Where a shard's checkpoint goes (`RIVERBANK_LOG=riverbank_streaming=debug`).
    tracing::debug!(
        transform = name,
        shard,
        checkpoint = ctx.id,
        delta_rows = inputs_rows,
        windows_in_play = panes.len() + quiet.looked,
        fired = fire_n,
        changes = changed,
        delta_ms = ms(t_delta),
        read_ms = ms(t_read - t_delta),
        merge_trigger_ms = ms(t_trigger - t_read),
        fire_ms = ms(t_fire - t_trigger),
        apply_ms = ms(t_apply - t_fire),
        checkpoint_ms = ms(started.elapsed() - t_apply),
        uploaded = out.checkpoint_bytes,
        "combine shard checkpoint"
    );
    Ok(out)
}

/// The windows a checkpoint looks at only because the clock moved (no new data, no session
/// merge, no processing-time deadline): their triggers run on their stored panes, and those
/// that fire are fired from their stored accumulators, with no merge or re-encoding.
#[derive(Default)]
struct Quiet {
    /// Stored accumulator rows of the windows that fire, in firing order.
    accs: Vec<Vec<u8>>,
    panes: Vec<riverbank_elements::columns::PaneRow>,
    looked: usize,
}

impl Quiet {
    /// Runs the trigger of the window stored at `skey`; the changes to its state go to
    /// `changes`. 1 when the window expired (its state is gone), else 0.
    fn look(
        &mut self,
        skey: &[u8],
        mut p: Panes,
        acc: &[u8],
        clock: &Clock,
        range_deleted: bool,
        changes: &mut Vec<Change>,
    ) -> i64 {
        self.looked += 1;
        let firing = p.on_clock(clock);
        let clear = firing.as_ref().is_some_and(|f| f.clear);
        if let Some(f) = &firing
            && !acc.is_empty()
        {
            self.accs.push(acc.to_vec());
            self.panes.push(pane_row(&f.pane));
        }
        if p.is_expired(clock.watermark) {
            if !range_deleted {
                changes.push((NS.state, skey.to_vec(), None));
            }
            return 1;
        }
        if let Some(d) = p.next_deadline() {
            changes.push((NS.ptimers, timer_key(d, skey), Some(vec![])));
        }
        let kept = if clear { &[][..] } else { acc };
        changes.push((NS.state, skey.to_vec(), Some(encode_window(&p, kept))));
        0
    }
}

pub(super) fn pane_row(
    p: &riverbank_windowing::panes::PaneInfo,
) -> riverbank_elements::columns::PaneRow {
    use riverbank_windowing::panes::Timing;
    (
        p.index as i64,
        p.nonspeculative_index,
        match p.timing {
            Timing::Early => "EARLY",
            Timing::OnTime => "ON_TIME",
            Timing::Late => "LATE",
        },
        p.is_first,
        p.is_last,
    )
}

/// A fired batch with the pane of each row as the hidden pane column.
pub(super) fn with_panes(
    b: &RecordBatch,
    panes: &[riverbank_elements::columns::PaneRow],
) -> RecordBatch {
    let mut fields: Vec<_> = b.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(arrow::datatypes::Field::new(
        riverbank_elements::columns::PANE,
        riverbank_elements::columns::pane_type(),
        false,
    )));
    let mut cols = b.columns().to_vec();
    cols.push(riverbank_elements::columns::pane_array(panes));
    RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(fields)), cols)
        .expect("one more column of the same length")
}

/// Milliseconds, for the timings logged.
pub(super) fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Each state row's window end (exclusive); the global window ends at the end of time.
fn window_ends(op: &CombineOp, b: &RecordBatch) -> Vec<i64> {
    if !op.windowed {
        return vec![END_OF_TIME - 1; b.num_rows()];
    }
    let nk = op.spec.key_fields.len();
    b.column(nk - 1)
        .as_primitive::<TimestampMicrosecondType>()
        .values()
        .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ShardStore;
    use riverbank_pipeline::trigger::Triggering;

    /// A store of the first layout (four keys per window and key) is converted once: one
    /// value per window with its panes and accumulator, a timer per window end, the
    /// processing-time timers kept per window; the old keys are gone.
    #[test]
    fn a_store_of_the_first_layout_is_converted_to_one_value_per_window() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = ShardStore::open(dir.path(), 0, 1 << 20).unwrap();
        let t = Triggering::default();
        let (p1, p2) = (Panes::new(&t, 10), Panes::new(&t, 20));
        let json = |p: &Panes| serde_json::to_vec(p).unwrap();
        let old: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
            ("p", b"k1".to_vec(), json(&p1)),
            ("a", b"k1".to_vec(), b"acc1".to_vec()),
            ("p", b"k2".to_vec(), json(&p2)),
            ("a", b"k2".to_vec(), b"acc2".to_vec()),
            ("t", timer_key(10, b"k1"), vec![]),
            ("t", timer_key(20, b"k2"), vec![]),
            ("q", timer_key(15, b"k2"), vec![]),
        ];
        store
            .apply(
                old.iter()
                    .map(|(n, k, v)| (*n, k.as_slice(), Some(v.as_slice()))),
            )
            .unwrap();
        upgrade(&mut store).unwrap();
        for n in ["a", "p", "t", "q"] {
            assert!(store.scan(n).unwrap().is_empty(), "{n}");
        }
        let state = store.scan(NS.state).unwrap();
        let keys: Vec<&[u8]> = state.iter().map(|(k, _)| k.as_slice()).collect();
        assert_eq!(keys, [state_key(10, b"k1"), state_key(20, b"k2")]);
        let (p, acc) = decode_window(&state[1].1).unwrap();
        assert_eq!((p.end(), acc), (20, b"acc2".as_slice()));
        let end = |e: i64| (e as u64 ^ (1 << 63)).to_be_bytes();
        let timers: Vec<Vec<u8>> = store
            .scan(NS.timers)
            .unwrap()
            .into_iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(timers, [timer_key(10, &end(10)), timer_key(20, &end(20))]);
        let ptimers: Vec<Vec<u8>> = store
            .scan(NS.ptimers)
            .unwrap()
            .into_iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(ptimers, [timer_key(15, &state_key(20, b"k2"))]);
        // Once converted, never again: a new window stays as written.
        store
            .apply([("p", b"k3".as_slice(), Some(json(&p1).as_slice()))])
            .unwrap();
        upgrade(&mut store).unwrap();
        assert_eq!(store.scan("p").unwrap().len(), 1);
    }
}
