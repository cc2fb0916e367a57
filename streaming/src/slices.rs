//! A streaming Combine's state shard kept per slice ([`Slices`]): sliding windows fired once
//! each, at the watermark. An element reaches the shard in the one period-long slice it falls
//! in (merged per key and slice by the producers), the slice's accumulator is kept, and when
//! the watermark passes a window's end the window fires as the merge of its key's slices, as
//! Flink slices hop windows. A slice goes once its last window has fired. Each element is
//! merged into one accumulator instead of `size / period`.
//!
//! Namespaces (one store per Combine; a store of this layout says so in its counters, and the
//! per-window shard, `shard`, refuses it):
//! - `v`: big-endian slice end ++ key bytes (group-by keys, then the slice's start and end) →
//!   the slice's accumulator row (Arrow row format of the state batch);
//! - `w`: big-endian slice end → nothing: the ends of the slices held, from which the windows
//!   due are found without reading the slices.
use super::shard::{Shard, clocks, ms, pane_row, with_panes};
use super::shard_layout::{Change, Codec, LAYOUT, NS, state_key, time_of, timer_key};
use super::shard_open as open;
use arrow::array::{ArrayRef, AsArray, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::TimestampMicrosecondType;
use riverbank_engine::combine::FinalCombiner;
use riverbank_engine::compile::Slices;
use riverbank_engine::error::RunError;
use riverbank_engine::shards::ShardOutput;
use riverbank_engine::work::CheckpointCtx;
use riverbank_windowing::panes::Panes;
use riverbank_windowing::trigger::Clock;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

/// This layout's number in the store's counters (the per-window layout's is
/// [`super::shard_layout::LAYOUT_VERSION`]).
pub(crate) const SLICED: u64 = 3;
const SLICE: &str = "v";
const ENDS: &str = "w";

/// Runs checkpoint `ctx.id` of shard `shard` of the sliced Combine `name`.
pub(crate) async fn run(
    which: Shard<'_>,
    slices: Slices,
    ctx: &CheckpointCtx,
    inputs: Vec<RecordBatch>,
    state_dir: &Path,
    batch_size: usize,
) -> Result<ShardOutput, RunError> {
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
    let terr = |e: String| RunError::transform(name, format!("state rows: {e}"));
    let started = std::time::Instant::now();
    let mut at = open::ShardAt::open(state_dir, name, shard, cache_bytes, ctx).await?;
    let store = &mut at.store;
    claim(store, name)?;

    // The checkpoint's slices, merged with the same slices kept.
    let spill = std::env::temp_dir();
    let mut delta = FinalCombiner::new(op.spec.clone(), usize::MAX, &spill).map_err(cerr)?;
    for b in &inputs {
        delta.merge(b).map_err(cerr)?;
    }
    let delta = delta.into_states().map_err(cerr)?;
    let schema = delta.schema();
    let nk = op.spec.key_fields.len();
    let codec = Codec::new(&schema, nk).map_err(terr)?;
    let skeys = slice_keys(&codec, &delta, nk).map_err(terr)?;
    let found = store.get_many(SLICE, &skeys).map_err(&serr)?;
    let stored: Vec<Vec<u8>> = found.iter().flatten().cloned().collect();
    let new_slices = (found.len() - stored.len()) as u64;
    let mut merged = FinalCombiner::new(op.spec.clone(), usize::MAX, &spill).map_err(cerr)?;
    if !stored.is_empty() {
        merged
            .merge(&codec.decode(&schema, &stored).map_err(terr)?)
            .map_err(cerr)?;
    }
    merged.merge(&delta).map_err(cerr)?;
    let merged = merged.into_states().map_err(cerr)?;
    let rows = codec.rows(&merged).map_err(terr)?;
    let mut changes: Vec<Change> = vec![];
    let mut new_ends = BTreeSet::new();
    for (j, key) in slice_keys(&codec, &merged, nk)
        .map_err(terr)?
        .into_iter()
        .enumerate()
    {
        new_ends.insert(key[..8].to_vec());
        changes.push((SLICE, key, Some(rows.row(j).as_ref().to_vec())));
    }
    changes.extend(new_ends.into_iter().map(|e| (ENDS, e, Some(vec![]))));
    store.apply_owned(changes).map_err(&serr)?;
    let t_merge = started.elapsed();

    // The windows whose end the watermark passed in this checkpoint, from the slices held.
    let (_, clock) = clocks(ctx);
    let held: Vec<i64> = store
        .scan(ENDS)
        .map_err(&serr)?
        .into_iter()
        .map(|(k, _)| time_of(&k))
        .collect();
    let due: BTreeSet<i64> = held
        .iter()
        .flat_map(|s| slices.window_ends(*s))
        .filter(|e| *e > ctx.watermark_in && *e <= ctx.watermark)
        .collect();
    let mut out = ShardOutput::default();
    let mut fired_windows = 0;
    if !due.is_empty() {
        let (fired, n) = fire(
            (op, name),
            &slices,
            store,
            &codec,
            &schema,
            &due,
            &clock,
            batch_size,
        )?;
        out.fired = fired;
        fired_windows = n;
    }
    let t_fire = started.elapsed();

    // Slices whose last window has fired are not needed any more.
    let cut = timer_key(
        ctx.watermark
            .saturating_sub(slices.size_us - slices.period_us)
            .saturating_add(1),
        &[],
    );
    let gone = store.delete_range(SLICE, &[], &cut).map_err(&serr)? as u64;
    store.delete_range(ENDS, &[], &cut).map_err(&serr)?;
    out.keys = (store.count(NS.windows).map_err(&serr)? + new_slices).saturating_sub(gone);
    store.set_count(NS.windows, out.keys).map_err(&serr)?;
    at.checkpoint(ctx, &mut out).await?;
    tracing::debug!(
        transform = name,
        shard,
        checkpoint = ctx.id,
        delta_slices = delta.num_rows(),
        new_slices,
        slices_held = out.keys,
        windows_due = due.len(),
        fired = fired_windows,
        expired_slices = gone,
        merge_ms = ms(t_merge),
        fire_ms = ms(t_fire - t_merge),
        checkpoint_ms = ms(started.elapsed() - t_fire),
        uploaded = out.checkpoint_bytes,
        "sliced combine shard checkpoint"
    );
    Ok(out)
}

const PER_WINDOW: &str = "this Combine's state was kept per window by an earlier version of \
     the job (or of Riverbank), and is now kept per slice of its sliding windows: it cannot \
     be carried over; drain the job and start it again";

/// Makes the store of Combine `name` a sliced one: an empty store becomes one; a store
/// holding windows refuses.
fn claim(store: &mut super::state::ShardStore, name: &str) -> Result<(), RunError> {
    let serr = open::state_err(name);
    if store.count(LAYOUT).map_err(&serr)? == SLICED {
        return Ok(());
    }
    for ns in [NS.state, "p", "a"] {
        if !store.is_empty(ns).map_err(&serr)? {
            return Err(RunError::transform(name, PER_WINDOW));
        }
    }
    store.set_count(LAYOUT, SLICED).map_err(&serr)
}

/// Each state row's store key: its slice's end, then its key bytes.
fn slice_keys(codec: &Codec, b: &RecordBatch, nk: usize) -> Result<Vec<Vec<u8>>, String> {
    let keys = codec.keys(b)?;
    let ends = b
        .column(nk - 1)
        .as_primitive::<TimestampMicrosecondType>()
        .values();
    Ok(ends
        .iter()
        .enumerate()
        .map(|(i, e)| state_key(*e, keys.row(i).as_ref()))
        .collect())
}

/// Fires the windows ending at `due`: each key's slices of a window merged, in the window's
/// bounds, with the pane a window kept on its own would have (on time, its only one).
#[allow(clippy::too_many_arguments)]
fn fire(
    (op, name): (&riverbank_engine::compile::CombineOp, &str),
    slices: &Slices,
    store: &super::state::ShardStore,
    codec: &Codec,
    schema: &arrow::datatypes::SchemaRef,
    due: &BTreeSet<i64>,
    clock: &Clock,
    batch_size: usize,
) -> Result<(Vec<RecordBatch>, usize), RunError> {
    let serr = open::state_err(name);
    let cerr = |source| RunError::Combine {
        transform: name.to_string(),
        source,
    };
    let rerr = |e: String| RunError::transform(name, format!("state rows: {e}"));
    let nk = op.spec.key_fields.len();
    let mut accs: Vec<Vec<u8>> = vec![];
    let mut window_ends: Vec<i64> = vec![];
    for &e in due {
        for s in slices.slice_ends(e) {
            let (lo, hi) = (timer_key(s, &[]), timer_key(s.saturating_add(1), &[]));
            store
                .for_each_in_range(SLICE, &lo, &hi, |_, v| {
                    accs.push(v.to_vec());
                    window_ends.push(e);
                    Ok::<_, ()>(())
                })
                .map_err(&serr)?
                .expect("never stops");
        }
    }
    if accs.is_empty() {
        return Ok((vec![], 0));
    }
    let b = codec.decode(schema, &accs).map_err(rerr)?;
    drop(accs);
    let bound = |f: &dyn Fn(i64) -> i64, at: usize| -> ArrayRef {
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(window_ends.iter().map(|e| f(*e)))
                .with_data_type(schema.field(at).data_type().clone()),
        )
    };
    let mut cols = b.columns().to_vec();
    cols[nk - 2] = bound(&|e| e.saturating_sub(slices.size_us), nk - 2);
    cols[nk - 1] = bound(&|e| e, nk - 1);
    let windows = RecordBatch::try_new(schema.clone(), cols).map_err(|e| rerr(e.to_string()))?;
    let mut fc =
        FinalCombiner::new(op.spec.clone(), usize::MAX, &std::env::temp_dir()).map_err(cerr)?;
    fc.merge(&windows).map_err(cerr)?;
    // Every window here fires once, on time, as its own `Panes` would.
    let panes: BTreeMap<i64, _> = due
        .iter()
        .map(|&e| {
            let mut p = Panes::new(&op.triggering, e);
            let before = Clock {
                watermark: i64::MIN,
                now: clock.now,
            };
            p.add_elements(1, &before);
            let f = p.on_clock(clock).ok_or_else(|| {
                rerr(format!(
                    "window ending at {e} due but its trigger did not fire"
                ))
            })?;
            Ok((e, pane_row(&f.pane)))
        })
        .collect::<Result<_, RunError>>()?;
    let mut out = vec![];
    let mut n = 0;
    for b in fc.finish(batch_size).map_err(cerr)? {
        let b = b.map_err(cerr)?;
        let ends = b.column(nk - 1).as_primitive::<TimestampMicrosecondType>();
        let rows: Vec<_> = ends.values().iter().map(|e| panes[e]).collect();
        n += b.num_rows();
        out.push(with_panes(&b, &rows));
    }
    Ok((out, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard_layout::upgrade;
    use crate::state::ShardStore;

    /// A store holds windows or slices, never both: a sliced Combine refuses a store of
    /// windows (an update from a job that kept them), and the per-window shard a sliced one.
    #[test]
    fn a_store_of_windows_and_one_of_slices_refuse_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let mut windows = ShardStore::open(dir.path(), 0, 1 << 20).unwrap();
        upgrade(&mut windows).unwrap();
        // An empty store of either kind may become the other.
        claim(&mut windows, "C").unwrap();
        assert_eq!(windows.count(LAYOUT).unwrap(), SLICED);
        let err = upgrade(&mut windows).unwrap_err();
        assert!(err.contains("kept per slice"), "{err}");

        let mut windows = ShardStore::open(dir.path(), 1, 1 << 20).unwrap();
        upgrade(&mut windows).unwrap();
        windows
            .apply([(NS.state, state_key(10, b"k").as_slice(), Some(&b"v"[..]))])
            .unwrap();
        let err = claim(&mut windows, "C").unwrap_err().to_string();
        assert!(err.contains(PER_WINDOW), "{err}");
        assert!(PER_WINDOW.contains("drain the job"));
    }
}
