//! A streaming Sql or Join over the global window: its state shard, for one checkpoint. The
//! rows are sharded by the query's key (a Join's equalities, a Sql's GROUP BY: see
//! `SqlKeys`), so the query over a shard's rows is the query's result for the shard's keys.
//! Rows are kept in the shard's store until the job ends or their input's `state_ttl` passes;
//! when the global window's trigger fires:
//! - accumulating: the query runs over every kept row of the keys that got rows since the last
//!   firing, and again over those keys' rows without the new ones; the firing emits the rows
//!   of the first result that the second has not (the changes: a Join's new pairs, a group's
//!   new aggregate), as Flink's regular join and group aggregation emit them, without
//!   retractions; an inner Join of two inputs (`SqlKeys::inner_pair`) gets its new pairs
//!   directly instead: each side's new rows joined with the other side's kept rows of their
//!   keys, so the old pairs are never made again; a group aggregate that merges with itself (`SqlKeys::merge`: MAX, MIN, SUM, COUNT by
//!   plain fields) keeps each group's aggregate instead of its rows: a checkpoint's rows are
//!   aggregated as they come, and a firing merges the new aggregates into the kept row of
//!   their groups (one row per group, moved into the firing's block) and emits the rows that
//!   changed;
//! - discarding: the query runs over the rows since the last firing only (Beam's discarding
//!   pane), and nothing is kept after it but a side input's rows (a bounded source's beside the
//!   stream: a lookup table), which every firing's query reads whole, as a Beam side input is
//!   in every pane.
//!
//! Like the windowed shards, the store is checkpointed before the item reports, so the output
//! commits once with the checkpoint and a moved or restarted shard resumes from its last one.
//!
//! Namespaces (one store per transform):
//! - `r`: input ++ checkpoint → that checkpoint's rows of that input (an Arrow IPC stream,
//!   with the event-time column when the input has a TTL);
//! - `t`: the same key → the rows' (oldest, newest event time, row count), so the TTL and the
//!   state's size are known without reading the rows;
//! - `k`: the same key → the distinct key hashes of its rows, so a firing reads only the blocks
//!   holding a key that got rows (the rest cannot change the keys' results), found through
//!   an index of the lists kept in memory beside the open store (`block_index`);
//! - `m`: `panes` → the global window's [`Panes`] (JSON); `fired` → the last checkpoint whose
//!   rows a firing has taken; `form` → the merge query of a shard that keeps aggregates
//!   (empty: one that began keeping rows before its query could keep aggregates); `replaced` ++ input → the last checkpoint that brought a new read
//!   of that input's refreshed file read.
//!
//! A side input read again every `refresh_interval` (a lookup table kept up to date): each new
//! read replaces the input's kept rows, in every shard (whether or not its keys are in the new
//! read). The rows it replaces stay until a firing has taken the new ones, as the state that
//! firing compares with: it emits the pairs the new rows make that the old did not (a changed
//! row's new pairs with the events kept), nothing for unchanged rows.
mod block_index;

use super::shard::{ShardOutput, clocks, ms};
use super::shard_open as open;
use super::sql_shard::{Change, from_ipc, ipc};
use super::state::{ShardStore, StateError};
use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef, TimestampMicrosecondType};
use block_index::BlockIndex;
use riverbank_elements::columns::{TS, user_batch};
use riverbank_engine::compile::{SqlKeys, SqlOp};
use riverbank_engine::error::RunError;
use riverbank_engine::shards::SqlShard;
use riverbank_engine::sql::NestedAggregate;
use riverbank_engine::work::CheckpointCtx;
use riverbank_io::unbounded::END_OF_TIME;
use riverbank_pipeline::trigger::AccumulationMode;
use riverbank_windowing::panes::{Arrival, Panes};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

const ROWS: &str = "r";
const TIMES: &str = "t";
const KEYS: &str = "k";
const META: &str = "m";
/// `META` key: the merge query of a shard that keeps aggregates (`SqlKeys::merge`).
const FORM: &[u8] = b"form";
/// The rows kept, in the store's own counters.
const KEPT: &str = "rows";

/// One stored block of rows: (input, checkpoint) and its (oldest, newest, rows).
#[derive(Clone, Copy)]
struct Block {
    input: usize,
    checkpoint: u64,
    oldest: i64,
    newest: i64,
    rows: u64,
}

/// Runs checkpoint `ctx.id` of the shard: keeps `inputs` (one list of batches per distinct
/// input collection, in `collections` order), fires the global window if its trigger says so,
/// and lets rows past their TTL go.
pub async fn run(
    which: SqlShard<'_>,
    keys: &SqlKeys,
    ctx: &CheckpointCtx,
    state_dir: &Path,
) -> Result<ShardOutput, RunError> {
    let SqlShard {
        op,
        name,
        shard,
        schemas,
        cache_bytes,
        collections,
        inputs,
    } = which;
    let collections = collections.as_slice();
    let serr = open::state_err(name);
    let terr = |m: String| RunError::transform(name, m);
    let started = std::time::Instant::now();
    let mut at = open::ShardAt::open(state_dir, name, shard, cache_bytes, ctx).await?;
    let store = &mut at.store;
    let (clock_in, clock) = clocks(ctx);
    let mut out = ShardOutput::default();
    let mut panes: Panes = match store.get(META, b"panes").map_err(&serr)? {
        Some(json) => {
            serde_json::from_slice(&json).map_err(|e| terr(format!("pane state: {e}")))?
        }
        None => Panes::new(&op.triggering, END_OF_TIME - 1),
    };
    let mut fired_through = match store.get(META, b"fired").map_err(&serr)? {
        Some(b) => u64::from_be_bytes(b.try_into().map_err(|_| terr("a bad fired mark".into()))?),
        None => 0,
    };
    let mut changes: Vec<Change> = vec![];
    let kept_as = aggregate_form(store, keys, name, &mut changes)?;
    let inner_types = match kept_as {
        Kept::Nested(n) => group_types(n).map_err(terr)?,
        _ => vec![],
    };
    // Per input: the checkpoint of its refreshed read's latest read; rows kept from before it
    // are replaced.
    let mut replaced: Vec<Option<u64>> = vec![None; collections.len()];
    for (i, c) in collections.iter().enumerate() {
        if !op.refreshing.contains_key(c) {
            continue;
        }
        if op.refreshed(c, ctx) {
            replaced[i] = Some(ctx.id);
            changes.push((META, replaced_key(i), Some(ctx.id.to_be_bytes().to_vec())));
        } else if let Some(b) = store.get(META, &replaced_key(i)).map_err(&serr)? {
            let b: [u8; 8] = b
                .try_into()
                .map_err(|_| terr("a bad replaced mark".into()))?;
            replaced[i] = Some(u64::from_be_bytes(b));
        }
    }
    // (A nested aggregate's sums are blocks of an input beyond the collections.)
    let superseded = |b: &Block| {
        replaced
            .get(b.input)
            .copied()
            .flatten()
            .is_some_and(|r| b.checkpoint < r)
    };
    // Inputs of a bounded source's rows beside the stream: kept by a discarding firing too.
    let is_side = |input: usize| op.bounded_inputs.contains(&collections[input]);

    // Inputs are per collection, TTLs per table: a collection's is its table's.
    let ttl: Vec<Option<i64>> = collections
        .iter()
        .map(|c| {
            let t = op.tables.iter().position(|(_, coll)| coll == c)?;
            keys.ttl_us.get(t).copied().flatten()
        })
        .collect();

    // This checkpoint's rows, one block per input, held until the firing is done.
    let mut fresh = Fresh::default();
    let arrived: u64 = inputs.iter().flatten().map(|b| b.num_rows() as u64).sum();
    if arrived > 0 {
        match panes.add_elements(arrived, &clock_in) {
            Arrival::Taken => {
                for (i, batches) in inputs.iter().enumerate() {
                    let batches: Vec<RecordBatch> = batches
                        .iter()
                        .filter(|b| b.num_rows() > 0)
                        .cloned()
                        .collect();
                    // Kept as the groups' aggregates: the query over this checkpoint's rows
                    // (a nested aggregate's inner query).
                    let batches = match kept_as {
                        _ if batches.is_empty() => batches,
                        Kept::Rows => batches,
                        Kept::Merged(_) => query(op, &schemas, collections, &[batches])
                            .await
                            .map_err(terr)?,
                        Kept::Nested(n) => {
                            let sql = (n.inner.as_str(), &n.inner_schema);
                            query_as(op, sql, &schemas, collections, &[batches])
                                .await
                                .map_err(terr)?
                        }
                    };
                    if batches.is_empty() {
                        continue;
                    }
                    let block = block_of(i, ctx.id, &batches);
                    // The event time is kept for the TTL only (the query never reads it).
                    let batches = match ttl[i] {
                        Some(_) => batches,
                        None => batches.iter().map(without_event_time).collect(),
                    };
                    // Keyed by the inner groups when that is what the firing merges.
                    let (fields, types) = match kept_as {
                        Kept::Nested(n) => (n.inner_groups.as_slice(), inner_types.as_slice()),
                        _ => (
                            keys.of_collection(op, &collections[i]).unwrap_or_default(),
                            keys.types.as_slice(),
                        ),
                    };
                    let mut hashes = vec![];
                    for b in &batches {
                        let h = riverbank_engine::shards::key_hashes(b, fields, types);
                        hashes.extend(h.map_err(terr)?);
                    }
                    hashes.sort_unstable();
                    hashes.dedup();
                    let hashes: Vec<u8> = hashes.iter().flat_map(|h| h.to_be_bytes()).collect();
                    fresh.0.insert(block.key(), (block, batches, hashes));
                }
            }
            // Only after the drain's last pane: nothing can be taken any more.
            Arrival::TooLate | Arrival::Closed => out.late_dropped += arrived,
        }
    }
    let mut index = BlockIndex::of(store).map_err(&serr)?;
    apply(store, &mut index, std::mem::take(&mut changes)).map_err(&serr)?;

    let mut blocks = blocks(store).map_err(&serr)?;
    blocks.extend(fresh.0.values().map(|(b, _, _)| *b));
    let t_keep = started.elapsed();
    let mut query_time = std::time::Duration::ZERO;
    // The blocks after an aggregate firing, which rewrites them.
    let mut replacement = None;
    if panes.on_clock(&clock).is_some() {
        let q = std::time::Instant::now();
        let (pending, kept): (Vec<&Block>, Vec<&Block>) =
            blocks.iter().partition(|b| b.checkpoint > fired_through);
        // A read replaced before any firing took it is never seen.
        let pending: Vec<&Block> = pending.into_iter().filter(|b| !superseded(b)).collect();
        let read = |fresh: &Fresh, list: &[&Block]| -> Result<Vec<Vec<RecordBatch>>, RunError> {
            let mut per_input = vec![vec![]; collections.len()];
            for b in list {
                per_input[b.input].extend(fresh.rows(store, b).map_err(terr)?);
            }
            Ok(per_input)
        };
        // By the mode, not the firing's `clear`: the drain's last pane clears in both modes,
        // and an accumulating one still emits its changes.
        let discarding = op.triggering.accumulation == AccumulationMode::Discarding;
        let fired = if discarding {
            // The stream's rows since the last firing, with every side input's rows kept (a
            // side input is not the stream's: it is in every pane, as Beam's).
            let side: Vec<&Block> = kept
                .iter()
                .filter(|b| is_side(b.input) && !superseded(b))
                .copied()
                .collect();
            let mut rows = read(&fresh, &pending)?;
            for (all, kept) in rows.iter_mut().zip(read(&fresh, &side)?) {
                all.extend(kept);
            }
            query(op, &schemas, collections, &rows)
                .await
                .map_err(terr)?
        } else if let Kept::Merged(merge) = kept_as {
            let table = Groups {
                input: 0,
                fields: keys.of_collection(op, &collections[0]).unwrap_or_default(),
                types: &keys.types,
                schema: &op.output_schema,
                merge,
            };
            let (new, touched) =
                take_pending(store, &mut fresh, &pending, &mut changes).map_err(terr)?;
            let (before, now, next) = merge_groups(
                (store, &index),
                &table,
                new,
                &touched,
                (&kept, ctx.id),
                &mut changes,
            )
            .await
            .map_err(terr)?;
            replacement = Some(next);
            riverbank_engine::sql::changed_rows(now, &before).map_err(terr)?
        } else if let Kept::Nested(n) = kept_as {
            let (fired, next) = fire_nested(
                (store, &mut fresh, &index),
                (op, keys, &collections[0]),
                (n, &inner_types),
                (&pending, &kept),
                ctx.id,
                &mut changes,
            )
            .await
            .map_err(terr)?;
            replacement = Some(next);
            fired
        } else if keys.inner_pair && collections.len() == 2 && op.refreshing.is_empty() {
            // Each side's new keys: their blocks' key lists.
            let mut new_keys = [HashSet::new(), HashSet::new()];
            for b in &pending {
                let list = fresh.key_list(store, b).map_err(&serr)?;
                let list = list.ok_or_else(|| terr("a block's key list went missing".into()))?;
                new_keys[b.input].extend(key_list(&list));
            }
            // Side `s`'s kept rows of the other side's new keys.
            let old_of = |s: usize| -> Result<Vec<RecordBatch>, RunError> {
                let found = index.holding(&new_keys[1 - s]);
                let holding: Vec<&Block> = kept
                    .iter()
                    .filter(|b| b.input == s && found.holds(b))
                    .copied()
                    .collect();
                let rows = read(&fresh, &holding)?;
                let rows = only_keys(op, keys, collections, rows, &new_keys[1 - s]);
                Ok(rows.map_err(terr)?.swap_remove(s))
            };
            let [new_a, new_b]: [Vec<RecordBatch>; 2] = read(&fresh, &pending)?
                .try_into()
                .map_err(|_| RunError::Internal(format!("{name}: not two inputs")))?;
            let mut fired = vec![];
            // A's new rows with all of B's (kept and new), then A's kept rows with B's new:
            // every new pair once, as Flink's regular join probes the other side's state.
            if !new_a.is_empty() {
                let mut b = old_of(1)?;
                b.extend(new_b.iter().cloned());
                fired.extend(
                    inner_join(op, &schemas, collections, [new_a, b])
                        .await
                        .map_err(terr)?,
                );
            }
            if !new_b.is_empty() {
                let a = old_of(0)?;
                fired.extend(
                    inner_join(op, &schemas, collections, [a, new_b])
                        .await
                        .map_err(terr)?,
                );
            }
            fired
        } else {
            // The kept rows of the keys that got rows: the query over them before and after.
            // The new rows' keys: their blocks' key lists, hashed when they were kept.
            let mut touched = HashSet::new();
            for b in &pending {
                let list = fresh.key_list(store, b).map_err(&serr)?;
                let list = list.ok_or_else(|| terr("a block's key list went missing".into()))?;
                touched.extend(key_list(&list));
            }
            let found = index.holding(&touched);
            let mut holding: Vec<&Block> = kept.into_iter().filter(|b| found.holds(b)).collect();
            let before = only_keys(op, keys, collections, read(&fresh, &holding)?, &touched)
                .map_err(terr)?;
            // Without the rows replaced since the last firing (a refreshed read's older ones).
            let mut after = match holding.iter().any(|b| superseded(b)) {
                true => {
                    holding.retain(|b| !superseded(b));
                    let rows = read(&fresh, &holding)?;
                    only_keys(op, keys, collections, rows, &touched).map_err(terr)?
                }
                false => before.clone(),
            };
            for (a, n) in after.iter_mut().zip(read(&fresh, &pending)?) {
                a.extend(n);
            }
            let now = query(op, &schemas, collections, &after).await;
            let was = query(op, &schemas, collections, &before).await;
            riverbank_engine::sql::changed_rows(now.map_err(terr)?, &was.map_err(terr)?)
                .map_err(terr)?
        };
        query_time = q.elapsed();
        if let Some(next) = replacement.take() {
            blocks = next;
        }
        out.fired.extend(fired);
        fired_through = ctx.id;
        changes.push((META, b"fired".to_vec(), Some(ctx.id.to_be_bytes().to_vec())));
        if discarding {
            blocks.retain(|b| {
                let side = is_side(b.input);
                if !side {
                    fresh.drop(b, &mut changes);
                }
                side
            });
        }
        // The rows replaced by a newer read: this firing took the newer ones.
        blocks.retain(|b| {
            if superseded(b) {
                fresh.drop(b, &mut changes);
            }
            !superseded(b)
        });
    }
    // The window ends only when the job drains: everything goes.
    if panes.is_expired(ctx.watermark) {
        for b in blocks.drain(..) {
            fresh.drop(&b, &mut changes);
        }
    }
    // The new blocks no firing took are kept.
    fresh.write_into(&mut changes).map_err(terr)?;
    let line = |input: usize| {
        ttl.get(input)
            .copied()
            .flatten()
            .map(|t| ctx.watermark.saturating_sub(t))
    };
    expire(
        (store, &fresh),
        line,
        fired_through,
        &mut blocks,
        &mut changes,
    )
    .map_err(terr)?;
    let json = serde_json::to_vec(&panes).map_err(|e| RunError::Internal(e.to_string()))?;
    changes.push((META, b"panes".to_vec(), Some(json)));
    let t_fire = started.elapsed();
    apply(store, &mut index, std::mem::take(&mut changes)).map_err(&serr)?;
    store.keep_memo(index);
    let kept: u64 = blocks.iter().map(|b| b.rows).sum();
    out.keys = kept;
    store.set_count(KEPT, kept).map_err(&serr)?;
    at.checkpoint(ctx, &mut out).await?;
    tracing::debug!(
        transform = name,
        shard,
        checkpoint = ctx.id,
        rows_kept = kept,
        keep_ms = ms(t_keep),
        query_ms = ms(query_time),
        apply_ms = ms(started.elapsed() - t_fire),
        uploaded = out.checkpoint_bytes,
        "keyed sql shard checkpoint"
    );
    Ok(out)
}

/// Applies `changes` to the store, and to the index of its key lists: every change goes
/// through here, so the index never misses one (it follows them first, while the store still
/// holds the lists they replace).
fn apply(
    store: &mut ShardStore,
    index: &mut BlockIndex,
    changes: Vec<Change>,
) -> Result<(), StateError> {
    index.follow(store, &changes)?;
    store.apply_owned(changes)
}

/// How a shard keeps its rows.
#[derive(Clone, Copy)]
enum Kept<'k> {
    /// Every row; a firing runs the query over them.
    Rows,
    /// One row of the query's result per group, merged by this query (`SqlKeys::merge`).
    Merged(&'k str),
    /// An inner aggregate's rows and the sums over them (`SqlKeys::nested`).
    Nested(&'k NestedAggregate),
}

/// How the shard keeps its rows: a shard that began keeping aggregates goes on so; one that
/// began keeping rows (written before the query could keep aggregates) goes on with rows. A
/// shard whose aggregates another query merged is refused (an update's state check refuses
/// it first). The form is recorded (`FORM`: `SqlKeys::aggregate_form`, or empty for rows) by
/// the first checkpoint that decides it, so later ones read one key.
fn aggregate_form<'k>(
    store: &super::state::ShardStore,
    keys: &'k SqlKeys,
    name: &str,
    changes: &mut Vec<Change>,
) -> Result<Kept<'k>, RunError> {
    let serr = open::state_err(name);
    let form = store.get(META, FORM).map_err(&serr)?;
    let mut record = |f: &[u8]| changes.push((META, FORM.to_vec(), Some(f.to_vec())));
    let aggregates = match (&keys.merge, &keys.nested) {
        (Some(m), _) => Kept::Merged(m),
        (None, Some(n)) => Kept::Nested(n),
        (None, None) => Kept::Rows,
    };
    match (keys.aggregate_form(), form) {
        (_, Some(f)) if f.is_empty() => Ok(Kept::Rows),
        (Some(m), Some(f)) if f == m.as_bytes() => Ok(aggregates),
        (_, Some(f)) => Err(RunError::transform(
            name,
            format!(
                "its state holds aggregates merged by `{}`, which this query cannot take: \
                 drain the job and start it without that state",
                String::from_utf8_lossy(&f)
            ),
        )),
        (Some(m), None) => match store.scan(TIMES).map_err(&serr)?.is_empty() {
            true => {
                record(m.as_bytes());
                Ok(aggregates)
            }
            false => {
                record(b"");
                Ok(Kept::Rows)
            }
        },
        (None, None) => Ok(Kept::Rows),
    }
}

/// The types of a nested aggregate's inner group fields, which key its inner rows.
fn group_types(n: &NestedAggregate) -> Result<Vec<DataType>, String> {
    n.inner_groups
        .iter()
        .map(|g| {
            let f = n.inner_schema.field_with_name(g);
            Ok(f.map_err(|e| e.to_string())?.data_type().clone())
        })
        .collect()
}

/// A table of kept aggregate rows, one per group: the blocks of `input`, keyed by `fields`
/// (hashed as `types`), in `schema`, merged by `merge` (over `PCOLLECTION`).
struct Groups<'a> {
    input: usize,
    fields: &'a [String],
    types: &'a [DataType],
    schema: &'a SchemaRef,
    merge: &'a str,
}

impl Groups<'_> {
    /// The distinct key hashes of `batches`, sorted.
    fn hashes(&self, batches: &[RecordBatch]) -> Result<Vec<u64>, String> {
        let mut hashes = vec![];
        for b in batches {
            let h = riverbank_engine::shards::key_hashes(b, self.fields, self.types)?;
            hashes.extend(h);
        }
        hashes.sort_unstable();
        hashes.dedup();
        Ok(hashes)
    }
}

/// The rows of the blocks a firing takes and their keys (the blocks' key lists); the blocks
/// go.
fn take_pending(
    store: &super::state::ShardStore,
    fresh: &mut Fresh,
    pending: &[&Block],
    changes: &mut Vec<Change>,
) -> Result<(Vec<RecordBatch>, HashSet<u64>), String> {
    let (mut rows, mut touched) = (vec![], HashSet::new());
    for b in pending {
        let list = fresh.key_list(store, b).map_err(|e| e.to_string())?;
        touched.extend(key_list(&list.ok_or("a block's key list went missing")?));
        rows.extend(fresh.rows(store, b)?);
        fresh.drop(b, changes);
    }
    Ok((rows, touched))
}

/// A block's rows.
fn rows_of(store: &super::state::ShardStore, b: &Block) -> Result<Vec<RecordBatch>, String> {
    let bytes = store
        .get(ROWS, &b.key())
        .map_err(|e| e.to_string())?
        .ok_or("a block of rows went missing")?;
    from_ipc(&bytes)
}

/// Merges `new` rows (of the groups whose key hashes are `touched`) into `table`'s kept rows
/// (its blocks among `kept`): the touched groups' kept rows are taken out of their blocks (a
/// block rewritten without them) and merged with the new ones into one block of
/// `checkpoint`, so a group has one kept row. The touched groups' rows before and after,
/// and the table's blocks after.
async fn merge_groups(
    (store, index): (&super::state::ShardStore, &BlockIndex),
    table: &Groups<'_>,
    new: Vec<RecordBatch>,
    touched: &HashSet<u64>,
    (kept, checkpoint): (&[&Block], u64),
    changes: &mut Vec<Change>,
) -> Result<(Vec<RecordBatch>, Vec<RecordBatch>, Vec<Block>), String> {
    let mut next = vec![];
    let mut before = vec![];
    let found = index.holding(touched);
    for b in kept.iter().filter(|b| b.input == table.input) {
        if !found.holds(b) {
            next.push(**b);
            continue;
        }
        // The block without the touched groups' rows, which move to this checkpoint's block.
        let mut rest = vec![];
        for batch in rows_of(store, b)? {
            let hashes = riverbank_engine::shards::key_hashes(&batch, table.fields, table.types)?;
            let theirs: arrow::array::BooleanArray =
                hashes.iter().map(|h| Some(touched.contains(h))).collect();
            let others = arrow::compute::not(&theirs).map_err(|e| e.to_string())?;
            let f = |mask| arrow::compute::filter_record_batch(&batch, mask);
            before.push(f(&theirs).map_err(|e| e.to_string())?);
            rest.push(f(&others).map_err(|e| e.to_string())?);
        }
        rest.retain(|r| r.num_rows() > 0);
        b.drop_into(changes);
        if !rest.is_empty() {
            next.push(keep_block(
                b.input,
                b.checkpoint,
                rest,
                |r| table.hashes(r),
                changes,
            )?);
        }
    }
    before.retain(|r| r.num_rows() > 0);
    let mut rows = before.clone();
    rows.extend(new);
    let now = match rows.is_empty() {
        true => vec![],
        false => {
            let pc = ("PCOLLECTION".to_string(), table.schema.clone(), rows);
            run_in_schema(table.schema, table.merge, vec![pc]).await?
        }
    };
    if !now.is_empty() {
        let hashes = |r: &[RecordBatch]| table.hashes(r);
        next.push(keep_block(
            table.input,
            checkpoint,
            now.clone(),
            hashes,
            changes,
        )?);
    }
    Ok((before, now, next))
}

/// An accumulating firing of a nested aggregate (`SqlKeys::nested`): the new inner rows are
/// merged into the kept ones of their inner groups (input 0's blocks); each changed inner
/// row's part of its outer group's sums (the new row's added, the old one's taken out) is
/// merged into the kept sums (input 1's blocks, keyed as the shard); the outer groups whose
/// result changed are emitted. The firing's rows and the blocks after it.
async fn fire_nested(
    (store, fresh, index): (&super::state::ShardStore, &mut Fresh, &BlockIndex),
    (op, keys, collection): (&SqlOp, &SqlKeys, &String),
    (n, inner_types): (&NestedAggregate, &[DataType]),
    (pending, kept): (&[&Block], &[&Block]),
    checkpoint: u64,
    changes: &mut Vec<Change>,
) -> Result<(Vec<RecordBatch>, Vec<Block>), String> {
    let inner = Groups {
        input: 0,
        fields: &n.inner_groups,
        types: inner_types,
        schema: &n.inner_schema,
        merge: &n.inner_merge,
    };
    let sums = Groups {
        input: 1,
        fields: keys.of_collection(op, collection).unwrap_or_default(),
        types: &keys.types,
        schema: &n.sums_schema,
        merge: &n.sums,
    };
    let (new, touched) = take_pending(store, fresh, pending, changes)?;
    let (before, now, mut next) = merge_groups(
        (store, index),
        &inner,
        new,
        &touched,
        (kept, checkpoint),
        changes,
    )
    .await?;
    let rows = |name: &str, rows| (name.to_string(), n.inner_schema.clone(), rows);
    let parts = run_in_schema(
        &n.sums_schema,
        &n.parts,
        vec![rows("NOW", now), rows("BEFORE", before)],
    )
    .await?;
    let touched: HashSet<u64> = sums.hashes(&parts)?.into_iter().collect();
    let (before, now, rest) = merge_groups(
        (store, index),
        &sums,
        parts,
        &touched,
        (kept, checkpoint),
        changes,
    )
    .await?;
    next.extend(rest);
    let finish = |rows: Vec<RecordBatch>| async move {
        if rows.is_empty() {
            return Ok(vec![]);
        }
        let pc = ("PCOLLECTION".to_string(), n.sums_schema.clone(), rows);
        run_in_schema(&op.output_schema, &n.finish, vec![pc]).await
    };
    let fired = riverbank_engine::sql::changed_rows(finish(now).await?, &finish(before).await?)?;
    Ok((fired, next))
}

/// Stores `rows` as block (`input`, `checkpoint`): rows, times and key list.
fn keep_block(
    input: usize,
    checkpoint: u64,
    rows: Vec<RecordBatch>,
    hashes_of: impl Fn(&[RecordBatch]) -> Result<Vec<u64>, String>,
    changes: &mut Vec<Change>,
) -> Result<Block, String> {
    let block = block_of(input, checkpoint, &rows);
    let list: Vec<u8> = hashes_of(&rows)?
        .iter()
        .flat_map(|h| h.to_be_bytes())
        .collect();
    changes.push((ROWS, block.key(), Some(ipc(&rows)?)));
    changes.push((TIMES, block.key(), Some(block.times())));
    changes.push((KEYS, block.key(), Some(list)));
    Ok(block)
}

/// `query` over `tables`, its non-empty batches in `schema`.
async fn run_in_schema(
    schema: &SchemaRef,
    query: &str,
    tables: Vec<(String, SchemaRef, Vec<RecordBatch>)>,
) -> Result<Vec<RecordBatch>, String> {
    riverbank_engine::sql::run_once(query, tables)
        .await?
        .into_iter()
        .filter(|b| b.num_rows() > 0)
        .map(|b| {
            RecordBatch::try_new(schema.clone(), b.columns().to_vec()).map_err(|e| e.to_string())
        })
        .collect()
}

/// `b` without its event-time column.
fn without_event_time(b: &RecordBatch) -> RecordBatch {
    let keep: Vec<usize> = (0..b.num_columns())
        .filter(|&c| b.schema().field(c).name() != TS)
        .collect();
    b.project(&keep).expect("columns of the batch")
}

/// Where the checkpoint of input `i`'s latest refreshed read is kept.
fn replaced_key(i: usize) -> Vec<u8> {
    let mut k = b"replaced".to_vec();
    k.extend_from_slice(&(i as u16).to_be_bytes());
    k
}

impl Block {
    /// Deletes the block: its rows, times and keys.
    fn drop_into(&self, changes: &mut Vec<Change>) {
        for ns in [ROWS, TIMES, KEYS] {
            changes.push((ns, self.key(), None));
        }
    }

    fn key(&self) -> Vec<u8> {
        let mut k = (self.input as u16).to_be_bytes().to_vec();
        k.extend_from_slice(&self.checkpoint.to_be_bytes());
        k
    }

    fn times(&self) -> Vec<u8> {
        let mut v = self.oldest.to_be_bytes().to_vec();
        v.extend_from_slice(&self.newest.to_be_bytes());
        v.extend_from_slice(&self.rows.to_be_bytes());
        v
    }

    fn parse(k: &[u8], v: &[u8]) -> Option<Block> {
        let n = |s: &[u8]| -> Option<[u8; 8]> { s.try_into().ok() };
        Some(Block {
            input: u16::from_be_bytes(k.get(..2)?.try_into().ok()?) as usize,
            checkpoint: u64::from_be_bytes(n(k.get(2..10)?)?),
            oldest: i64::from_be_bytes(n(v.get(..8)?)?),
            newest: i64::from_be_bytes(n(v.get(8..16)?)?),
            rows: u64::from_be_bytes(n(v.get(16..24)?)?),
        })
    }
}

/// This checkpoint's new blocks (their rows and key lists), held in memory until its firing
/// is done: a firing that takes them (a kept aggregate's, a discarding pane's) never writes
/// them, and one that keeps them (a join's rows) reads them without decoding them again.
/// (In key order, so a checkpoint's delta is written the same way each time.)
#[derive(Default)]
struct Fresh(BTreeMap<Vec<u8>, (Block, Vec<RecordBatch>, Vec<u8>)>);

impl Fresh {
    /// A block's rows: held here, or read from the store.
    fn rows(&self, store: &ShardStore, b: &Block) -> Result<Vec<RecordBatch>, String> {
        match self.0.get(&b.key()) {
            Some((_, rows, _)) => Ok(rows.clone()),
            None => rows_of(store, b),
        }
    }

    /// A block's key list (absent: unknown).
    fn key_list(&self, store: &ShardStore, b: &Block) -> Result<Option<Vec<u8>>, StateError> {
        match self.0.get(&b.key()) {
            Some((_, _, list)) => Ok(Some(list.clone())),
            None => store.get(KEYS, &b.key()),
        }
    }

    /// Deletes a block: one held here is never written.
    fn drop(&mut self, b: &Block, changes: &mut Vec<Change>) {
        if self.0.remove(&b.key()).is_none() {
            b.drop_into(changes);
        }
    }

    /// Writes the blocks still held (kept after the firing, or waiting for one).
    fn write_into(&self, changes: &mut Vec<Change>) -> Result<(), String> {
        for (key, (block, rows, list)) in &self.0 {
            changes.push((ROWS, key.clone(), Some(ipc(rows)?)));
            changes.push((TIMES, key.clone(), Some(block.times())));
            changes.push((KEYS, key.clone(), Some(list.clone())));
        }
        Ok(())
    }
}

/// The block of `batches`: their event times' span (rows without one have the minimum).
fn block_of(input: usize, checkpoint: u64, batches: &[RecordBatch]) -> Block {
    let (mut oldest, mut newest, mut rows) = (i64::MAX, i64::MIN, 0u64);
    for b in batches {
        rows += b.num_rows() as u64;
        match b.column_by_name(TS) {
            Some(ts) => {
                let ts = ts.as_primitive::<TimestampMicrosecondType>();
                for t in ts.values().iter() {
                    oldest = oldest.min(*t);
                    newest = newest.max(*t);
                }
            }
            None => (oldest, newest) = (i64::MIN, i64::MIN),
        }
    }
    Block {
        input,
        checkpoint,
        oldest,
        newest,
        rows,
    }
}

fn blocks(store: &super::state::ShardStore) -> Result<Vec<Block>, super::state::StateError> {
    Ok(store
        .scan(TIMES)?
        .iter()
        .filter_map(|(k, v)| Block::parse(k, v))
        .collect())
}

/// Rows past their input's TTL go: a block whose newest row is older than the watermark less
/// the TTL whole, a block straddling that line rewritten without its old rows. Only blocks a
/// firing has taken: a row not yet in any pane is kept until it is.
fn expire(
    (store, fresh): (&super::state::ShardStore, &Fresh),
    line: impl Fn(usize) -> Option<i64>,
    fired_through: u64,
    blocks: &mut Vec<Block>,
    changes: &mut Vec<Change>,
) -> Result<(), String> {
    let mut kept = vec![];
    for mut b in std::mem::take(blocks) {
        let Some(line) = line(b.input).filter(|_| b.checkpoint <= fired_through) else {
            kept.push(b);
            continue;
        };
        if b.newest < line {
            b.drop_into(changes);
            continue;
        }
        if b.oldest < line {
            let batches = fresh.rows(store, &b)?;
            // Kept without event times (its input had no TTL then): whole, until its newest
            // row passes the line.
            if batches.iter().any(|b| b.column_by_name(TS).is_none()) {
                kept.push(b);
                continue;
            }
            let mut young = vec![];
            for batch in batches {
                let Some(ts) = batch.column_by_name(TS) else {
                    continue;
                };
                let ts = ts.as_primitive::<TimestampMicrosecondType>();
                let keep: arrow::array::BooleanArray =
                    ts.values().iter().map(|t| Some(*t >= line)).collect();
                let y = arrow::compute::filter_record_batch(&batch, &keep)
                    .map_err(|e| e.to_string())?;
                if y.num_rows() > 0 {
                    young.push(y);
                }
            }
            if young.is_empty() {
                b.drop_into(changes);
                continue;
            }
            // Its key list stays: a superset only makes a firing read the block needlessly.
            let nb = block_of(b.input, b.checkpoint, &young);
            changes.push((ROWS, b.key(), Some(ipc(&young)?)));
            changes.push((TIMES, b.key(), Some(nb.times())));
            b = nb;
        }
        kept.push(b);
    }
    *blocks = kept;
    Ok(())
}

/// The key hashes of a block's stored key list.
fn key_list(list: &[u8]) -> impl Iterator<Item = u64> + '_ {
    list.chunks_exact(8)
        .map(|h| u64::from_be_bytes(h.try_into().expect("8 bytes")))
}

/// The rows whose key hash is in `touched` (a hash shared by another key only adds rows
/// whose results are the same before and after, so the changes stay exact).
fn only_keys(
    op: &SqlOp,
    keys: &SqlKeys,
    collections: &[String],
    rows: Vec<Vec<RecordBatch>>,
    touched: &HashSet<u64>,
) -> Result<Vec<Vec<RecordBatch>>, String> {
    let mut out = vec![];
    for (c, batches) in collections.iter().zip(rows) {
        let fields = keys.of_collection(op, c).unwrap_or_default();
        let mut kept = vec![];
        for b in batches {
            let hashes = riverbank_engine::shards::key_hashes(&b, fields, &keys.types)?;
            let mask: arrow::array::BooleanArray =
                hashes.iter().map(|h| Some(touched.contains(h))).collect();
            let f = arrow::compute::filter_record_batch(&b, &mask).map_err(|e| e.to_string())?;
            if f.num_rows() > 0 {
                kept.push(f);
            }
        }
        out.push(kept);
    }
    Ok(out)
}

/// An inner join's query over two inputs' rows (none when either has none).
async fn inner_join(
    op: &SqlOp,
    schemas: &[SchemaRef],
    collections: &[String],
    rows: [Vec<RecordBatch>; 2],
) -> Result<Vec<RecordBatch>, String> {
    if rows.iter().any(|r| r.iter().all(|b| b.num_rows() == 0)) {
        return Ok(vec![]);
    }
    query(op, schemas, collections, &rows).await
}

/// The query over the given rows of each input collection, in the op's output schema.
async fn query(
    op: &SqlOp,
    schemas: &[SchemaRef],
    collections: &[String],
    rows: &[Vec<RecordBatch>],
) -> Result<Vec<RecordBatch>, String> {
    let sql = (op.query.as_str(), &op.output_schema);
    query_as(op, sql, schemas, collections, rows).await
}

/// `sql` over the op's tables, holding the given rows of each input collection, in `schema`.
async fn query_as(
    op: &SqlOp,
    (sql, schema): (&str, &SchemaRef),
    schemas: &[SchemaRef],
    collections: &[String],
    rows: &[Vec<RecordBatch>],
) -> Result<Vec<RecordBatch>, String> {
    let tables = op
        .tables
        .iter()
        .zip(schemas)
        .map(|((table, coll), schema)| {
            let batches = collections
                .iter()
                .position(|c| c == coll)
                .map(|i| rows[i].iter().map(user_batch).collect())
                .unwrap_or_default();
            (table.clone(), schema.clone(), batches)
        })
        .collect();
    run_in_schema(schema, sql, tables).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, Int64Array, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use riverbank_elements::columns::ts_field;
    use riverbank_pipeline::trigger::Triggering;
    use std::sync::Arc;

    const S: i64 = 1_000_000;

    fn user() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("v", DataType::Int64, false),
        ]))
    }

    /// Rows (key, value, event time) in the global window: no window columns.
    fn rows(rows: &[(&str, i64, i64)]) -> RecordBatch {
        let mut fields: Vec<Field> = user().fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(ts_field(TS));
        let ts: ArrayRef = Arc::new(
            TimestampMicrosecondArray::from_iter_values(rows.iter().map(|r| r.2))
                .with_timezone("UTC"),
        );
        RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                ts,
            ],
        )
        .unwrap()
    }

    fn triggering(accumulation: &str) -> Triggering {
        every(1, accumulation)
    }

    /// A global window firing after every `n` rows.
    fn every(n: u64, accumulation: &str) -> Triggering {
        Triggering::parse(
            serde_json::json!({
                "trigger": {"repeatedly": {"after_count": n}},
                "accumulation_mode": accumulation
            })
            .as_object()
            .unwrap(),
        )
        .unwrap()
    }

    /// A query's shard 0, with its state directories (a worker's, `remote` for checkpoints).
    struct Query {
        op: SqlOp,
        keys: SqlKeys,
        collections: Vec<String>,
        dir: tempfile::TempDir,
    }

    fn query(sql: &str, tables: &[(&str, &str)], t: Triggering, ttl: Option<i64>) -> Query {
        let out = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("n", DataType::Int64, true),
        ]));
        let op = SqlOp {
            query: sql.into(),
            tables: tables
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            windowed: false,
            side_tables: vec![],
            triggering: t,
            output_schema: out,
            session_keys: None,
            keyed: None,
            columns: None,
            bounded_inputs: Default::default(),
            refreshing: Default::default(),
            extreme: None,
            set_tables: vec![],
        };
        let keys = SqlKeys {
            fields: vec![vec!["k".to_string()]; tables.len()],
            types: vec![DataType::Utf8],
            ttl_us: vec![ttl; tables.len()],
            inner_pair: false,
            merge: None,
            nested: None,
        };
        let collections = tables.iter().map(|(_, c)| c.to_string()).collect();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("remote")).unwrap();
        Query {
            op,
            keys,
            collections,
            dir,
        }
    }

    impl Query {
        /// Checkpoint `id` on the usual worker.
        async fn checkpoint(
            &self,
            id: u64,
            watermark: i64,
            inputs: Vec<Vec<RecordBatch>>,
        ) -> ShardOutput {
            self.checkpoint_on("w1", id, watermark, inputs).await
        }

        async fn checkpoint_on(
            &self,
            worker: &str,
            id: u64,
            watermark: i64,
            inputs: Vec<Vec<RecordBatch>>,
        ) -> ShardOutput {
            self.checkpoint_refreshing(worker, id, watermark, inputs, &[])
                .await
        }

        /// A checkpoint that brings a new read of the file reads `refreshed`.
        async fn checkpoint_refreshing(
            &self,
            worker: &str,
            id: u64,
            watermark: i64,
            inputs: Vec<Vec<RecordBatch>>,
            refreshed: &[&str],
        ) -> ShardOutput {
            self.try_checkpoint_on(worker, id, watermark, inputs, refreshed)
                .await
                .unwrap()
        }

        /// Checkpoint `id` on the usual worker, its error kept.
        async fn try_checkpoint(
            &self,
            id: u64,
            inputs: Vec<Vec<RecordBatch>>,
        ) -> Result<ShardOutput, RunError> {
            self.try_checkpoint_on("w1", id, S, inputs, &[]).await
        }

        async fn try_checkpoint_on(
            &self,
            worker: &str,
            id: u64,
            watermark: i64,
            inputs: Vec<Vec<RecordBatch>>,
            refreshed: &[&str],
        ) -> Result<ShardOutput, RunError> {
            let remote = self.dir.path().join("remote");
            let ctx = CheckpointCtx {
                id,
                watermark_in: watermark,
                watermark,
                now_us: 0,
                start_us: 0,
                state_prefix: remote.display().to_string(),
                new_states: vec![],
                refreshed: refreshed.iter().map(|s| s.to_string()).collect(),
            };
            let which = SqlShard {
                op: &self.op,
                name: "Q",
                shard: 0,
                schemas: vec![user(); self.op.tables.len()],
                cache_bytes: 1 << 20,
                collections: self.collections.clone(),
                inputs,
            };
            let dir = self.dir.path().join(worker);
            run(which, &self.keys, &ctx, &dir).await
        }
    }

    /// Every fired row as (k, n), sorted.
    fn fired(out: &ShardOutput) -> Vec<(String, i64)> {
        let mut v = vec![];
        for b in &out.fired {
            for i in 0..b.num_rows() {
                v.push((
                    b.column(0).as_string::<i32>().value(i).to_string(),
                    b.column(1).as_primitive::<Int64Type>().value(i),
                ));
            }
        }
        v.sort();
        v
    }

    /// Discarding, with `b` a side input (a bounded source's rows beside the stream): each
    /// firing joins the events since the last with the whole lookup table, which stays while
    /// the events go; a new read of it (refreshed) replaces it for the events after.
    #[tokio::test]
    async fn a_discarding_join_keeps_its_side_input_and_discards_the_stream() {
        let mut q = query(
            "SELECT a.k AS k, a.v + b.v AS n FROM a JOIN b ON a.k = b.k",
            &[("a", "A"), ("b", "B")],
            triggering("discarding"),
            None,
        );
        q.op.bounded_inputs.insert("B".into());
        q.op.refreshing.insert("B".into(), "Dim".into());
        let read = |rows_: &[(&str, i64)]| {
            let r: Vec<(&str, i64, i64)> = rows_.iter().map(|(k, v)| (*k, *v, i64::MIN)).collect();
            rows(&r)
        };
        let table = q
            .checkpoint_refreshing(
                "w1",
                1,
                0,
                vec![vec![], vec![read(&[("x", 100), ("y", 200)])]],
                &["Dim"],
            )
            .await;
        assert!(fired(&table).is_empty());
        let one = q
            .checkpoint(2, 0, vec![vec![rows(&[("x", 1, 1)])], vec![]])
            .await;
        assert_eq!(fired(&one), [("x".into(), 101)]);
        let two = q
            .checkpoint(3, 0, vec![vec![rows(&[("x", 2, 2), ("y", 3, 2)])], vec![]])
            .await;
        assert_eq!(fired(&two), [("x".into(), 102), ("y".into(), 203)]);
        assert_eq!(two.keys, 2, "the lookup table's two rows, no event");
        let again = q
            .checkpoint_refreshing(
                "w1",
                4,
                0,
                vec![vec![rows(&[("y", 4, 3)])], vec![read(&[("x", 1000)])]],
                &["Dim"],
            )
            .await;
        assert!(fired(&again).is_empty(), "y is gone: {:?}", fired(&again));
        let after = q
            .checkpoint_on("w2", 5, 0, vec![vec![rows(&[("x", 5, 4)])], vec![]])
            .await;
        assert_eq!(fired(&after), [("x".into(), 1005)]);
    }

    /// A lookup table read again and again (`b`, from the refreshed read `Dim`): each read
    /// replaces the last whole, in the shard whether or not its keys are in it; a firing emits
    /// the pairs a changed row makes with the events kept, nothing for an unchanged row, and
    /// events join only the latest read; a restored shard knows which read is the latest.
    #[tokio::test]
    async fn a_refreshed_side_input_replaces_its_last_read_and_emits_what_changed() {
        let mut q = query(
            "SELECT a.k AS k, a.v + b.v AS n FROM a JOIN b ON a.k = b.k",
            &[("a", "A"), ("b", "B")],
            triggering("accumulating"),
            None,
        );
        q.op.refreshing.insert("B".into(), "Dim".into());
        let read = |rows_: &[(&str, i64)]| {
            let r: Vec<(&str, i64, i64)> = rows_.iter().map(|(k, v)| (*k, *v, i64::MIN)).collect();
            rows(&r)
        };
        let first = q
            .checkpoint_refreshing(
                "w1",
                1,
                0,
                vec![vec![], vec![read(&[("x", 100), ("y", 200)])]],
                &["Dim"],
            )
            .await;
        assert!(fired(&first).is_empty());
        let events = q
            .checkpoint(2, 0, vec![vec![rows(&[("x", 1, 1), ("y", 2, 1)])], vec![]])
            .await;
        assert_eq!(fired(&events), [("x".into(), 101), ("y".into(), 202)]);
        // y changed: its new pair with the event kept; x is as it was.
        let second = q
            .checkpoint_refreshing(
                "w1",
                3,
                0,
                vec![vec![], vec![read(&[("x", 100), ("y", 300)])]],
                &["Dim"],
            )
            .await;
        assert_eq!(fired(&second), [("y".into(), 302)]);
        // Events meet the second read only (200 is gone), on another worker from checkpoint 3.
        let more = q
            .checkpoint_on(
                "w2",
                4,
                0,
                vec![vec![rows(&[("x", 5, 2), ("y", 6, 2)])], vec![]],
            )
            .await;
        assert_eq!(fired(&more), [("x".into(), 105), ("y".into(), 306)]);
        // A read without y, in a shard that gets none of its rows: y's row goes all the same.
        let third = q
            .checkpoint_refreshing(
                "w2",
                5,
                0,
                vec![vec![rows(&[("y", 7, 3)])], vec![]],
                &["Dim"],
            )
            .await;
        assert!(fired(&third).is_empty(), "{:?}", fired(&third));
        assert_eq!(
            third.keys, 5,
            "the five events, and no row of the lookup table"
        );
    }

    /// Accumulating: each firing emits a Join's new pairs only, whichever side the new row
    /// is on and however long ago its partner came, as often as equal rows make them; a shard
    /// restored elsewhere from the last checkpoint emits the same. Both ways of finding them:
    /// the query before and after, and (an inner join of two inputs) new rows against the
    /// other side's.
    #[tokio::test]
    async fn a_join_over_the_global_window_emits_each_pair_once() {
        join_emits_each_pair_once(false).await;
        join_emits_each_pair_once(true).await;
    }

    async fn join_emits_each_pair_once(inner_pair: bool) {
        let mut q = query(
            "SELECT a.k AS k, a.v + b.v AS n FROM a JOIN b ON a.k = b.k",
            &[("a", "A"), ("b", "B")],
            triggering("accumulating"),
            None,
        );
        q.keys.inner_pair = inner_pair;
        let one = q
            .checkpoint(
                1,
                2 * S,
                vec![vec![rows(&[("x", 1, S), ("y", 2, 2 * S)])], vec![]],
            )
            .await;
        assert!(one.fired.is_empty(), "{:?}", fired(&one));
        assert_eq!(one.keys, 2, "rows kept");
        let two = q
            .checkpoint(2, 3 * S, vec![vec![], vec![rows(&[("x", 10, 3 * S)])]])
            .await;
        assert_eq!(fired(&two), [("x".into(), 11)]);
        let third = || {
            vec![
                vec![rows(&[("x", 100, 4 * S)])],
                vec![rows(&[("y", 20, 4 * S)])],
            ]
        };
        let three = q.checkpoint(3, 4 * S, third()).await;
        assert_eq!(fired(&three), [("x".into(), 110), ("y".into(), 22)]);
        assert_eq!(three.keys, 5);
        let moved = q.checkpoint_on("w2", 3, 4 * S, third()).await;
        assert_eq!(fired(&moved), fired(&three));
        // New rows on both sides of one key, one of them twice.
        let four = q
            .checkpoint_on(
                "w2",
                4,
                5 * S,
                vec![
                    vec![rows(&[("x", 1000, 5 * S)])],
                    vec![rows(&[("x", 30, 5 * S), ("x", 30, 5 * S)])],
                ],
            )
            .await;
        let want = [(1010, 1), (1030, 2), (31, 2), (130, 2)];
        let mut want: Vec<(String, i64)> = want
            .iter()
            .flat_map(|(n, times)| std::iter::repeat_n(("x".to_string(), *n), *times))
            .collect();
        want.sort();
        assert_eq!(fired(&four), want, "inner_pair: {inner_pair}");
    }

    /// Accumulating: a GROUP BY emits the new value of each group that changed, not the
    /// groups that did not; rows past the TTL go (from the state and the counts) once fired.
    #[tokio::test]
    async fn a_grouped_sql_emits_changed_groups_and_forgets_rows_past_the_ttl() {
        let q = query(
            "SELECT k, COUNT(*) AS n FROM PCOLLECTION GROUP BY k",
            &[("PCOLLECTION", "C")],
            triggering("accumulating"),
            Some(10 * S),
        );
        let one = q
            .checkpoint(1, S, vec![vec![rows(&[("x", 1, S), ("y", 1, S)])]])
            .await;
        assert_eq!(fired(&one), [("x".into(), 1), ("y".into(), 1)]);
        let two = q
            .checkpoint(2, 5 * S, vec![vec![rows(&[("x", 1, 5 * S)])]])
            .await;
        assert_eq!(fired(&two), [("x".into(), 2)], "y did not change");
        // Watermark 14 s: the rows of 1 s are past the 10-s TTL; x keeps its row of 5 s.
        let three = q
            .checkpoint(3, 14 * S, vec![vec![rows(&[("x", 1, 14 * S)])]])
            .await;
        assert_eq!(fired(&three), [("x".into(), 3)]);
        assert_eq!(three.keys, 2, "the rows of 1 s went");
        let four = q
            .checkpoint(4, 15 * S, vec![vec![rows(&[("x", 1, 15 * S)])]])
            .await;
        assert_eq!(fired(&four), [("x".into(), 3)], "x's row of 1 s is gone");
        assert!(four.state_bytes > 0);
    }

    /// Accumulating, rows still waiting for their trigger when the job drains: the drain's last
    /// pane emits their changes (the group's new value), not the query over them alone.
    #[tokio::test]
    async fn the_drain_fires_the_changes_of_the_rows_still_waiting() {
        let q = query(
            "SELECT k, COUNT(*) AS n FROM PCOLLECTION GROUP BY k",
            &[("PCOLLECTION", "C")],
            every(2, "accumulating"),
            None,
        );
        let one = q
            .checkpoint(1, S, vec![vec![rows(&[("x", 1, S), ("y", 1, S)])]])
            .await;
        assert_eq!(fired(&one), [("x".into(), 1), ("y".into(), 1)]);
        let two = q
            .checkpoint(2, 2 * S, vec![vec![rows(&[("x", 1, 2 * S)])]])
            .await;
        assert!(two.fired.is_empty(), "one row of two: not yet");
        let drained = q.checkpoint(3, END_OF_TIME, vec![vec![]]).await;
        assert_eq!(fired(&drained), [("x".into(), 2)]);
        assert_eq!(drained.keys, 0);
    }

    /// Discarding: each firing is the query over the rows since the last one, and nothing is
    /// kept; the drain's checkpoint leaves the shard empty.
    #[tokio::test]
    async fn discarding_fires_over_the_new_rows_only() {
        let q = query(
            "SELECT k, SUM(v) AS n FROM PCOLLECTION GROUP BY k",
            &[("PCOLLECTION", "C")],
            triggering("discarding"),
            None,
        );
        let one = q
            .checkpoint(1, S, vec![vec![rows(&[("x", 1, S), ("x", 2, S)])]])
            .await;
        assert_eq!(fired(&one), [("x".into(), 3)]);
        assert_eq!(one.keys, 0);
        let two = q
            .checkpoint(2, 2 * S, vec![vec![rows(&[("x", 5, 2 * S)])]])
            .await;
        assert_eq!(fired(&two), [("x".into(), 5)]);
        let drained = q.checkpoint(3, END_OF_TIME, vec![vec![]]).await;
        assert!(drained.fired.is_empty());
        assert_eq!(drained.keys, 0);
    }

    /// Rows (key, value, event time).
    type Rows<'a> = &'a [(&'a str, i64, i64)];

    /// A grouped query kept as its groups' aggregates (`SqlKeys::merge`) or as their rows.
    fn grouped(sql: &str, merge: Option<&str>, t: Triggering) -> Query {
        let mut q = query(sql, &[("PCOLLECTION", "C")], t, None);
        q.keys.merge = merge.map(str::to_string);
        q
    }

    /// Kept as aggregates, a MAX or a COUNT per group fires what it fires when kept as rows
    /// (each firing the groups whose value changed), through a trigger that waits for two
    /// checkpoints and a shard restored elsewhere, while keeping one row per group; the drain
    /// empties it.
    #[tokio::test]
    async fn aggregates_kept_per_group_fire_what_the_rows_would() {
        let max = "SELECT k, MAX(v) AS n FROM PCOLLECTION GROUP BY k";
        let count = "SELECT k, COUNT(*) AS n FROM PCOLLECTION GROUP BY k";
        let merge =
            |f: &str| format!(r#"SELECT "k", {f}("n") AS "n" FROM PCOLLECTION GROUP BY "k""#);
        for (sql, merge) in [(max, merge("MAX")), (count, merge("SUM"))] {
            let rows_kept = grouped(sql, None, every(2, "accumulating"));
            let aggregates = grouped(sql, Some(&merge), every(2, "accumulating"));
            // (worker, rows) of each checkpoint.
            let steps: [(&str, Rows); 5] = [
                ("w1", &[("x", 1, S), ("x", 5, S), ("y", 2, S)]),
                ("w1", &[("x", 3, S), ("z", 7, S)]),
                ("w2", &[("x", 9, S)]),
                ("w2", &[("y", 1, S), ("y", 4, S), ("w", 1, S)]),
                ("w1", &[("w", 2, S)]),
            ];
            let mut outs = vec![];
            for (id, (worker, r)) in steps.iter().enumerate() {
                let id = id as u64 + 1;
                let a = rows_kept
                    .checkpoint_on(worker, id, S, vec![vec![rows(r)]])
                    .await;
                let b = aggregates
                    .checkpoint_on(worker, id, S, vec![vec![rows(r)]])
                    .await;
                assert_eq!(fired(&b), fired(&a), "{sql}, checkpoint {id}");
                outs.push(b);
            }
            if sql == max {
                // A firing per two rows or more; x's 3 does not change its MAX.
                let want: [&[(&str, i64)]; 5] = [
                    &[("x", 5), ("y", 2)],
                    &[("z", 7)],
                    &[],
                    &[("w", 1), ("x", 9), ("y", 4)],
                    &[],
                ];
                for (out, want) in outs.iter().zip(want) {
                    let want: Vec<(String, i64)> =
                        want.iter().map(|(k, n)| (k.to_string(), *n)).collect();
                    assert_eq!(fired(out), want);
                }
            }
            // One row per group (w, x, y, z) after a firing, where rows_kept keeps them all.
            assert_eq!((outs[3].keys, outs[4].keys), (4, 5), "{sql}");
            let drained = aggregates.checkpoint(6, END_OF_TIME, vec![vec![]]).await;
            let want = rows_kept.checkpoint(6, END_OF_TIME, vec![vec![]]).await;
            assert_eq!(fired(&drained), [("w".into(), 2)], "{sql}: w's waiting row");
            assert_eq!(fired(&drained), fired(&want));
            assert_eq!(drained.keys, 0);
        }
    }

    /// Every fired row as text, sorted.
    fn fired_rows(out: &ShardOutput) -> Vec<String> {
        let mut v = vec![];
        for b in &out.fired {
            for r in 0..b.num_rows() {
                let cells: Vec<String> = b
                    .columns()
                    .iter()
                    .map(|c| arrow::util::display::array_value_to_string(c, r).unwrap())
                    .collect();
                v.push(cells.join("|"));
            }
        }
        v.sort();
        v
    }

    /// Kept as an inner aggregate's rows and their sums (`SqlKeys::nested`), an AVG, SUM or
    /// COUNT over a group aggregate fires what it fires when kept as rows, through a trigger
    /// that waits for two checkpoints, a shard restored elsewhere and the drain, while keeping
    /// one row per inner group and one of sums per key.
    #[tokio::test]
    async fn an_aggregate_of_aggregates_kept_as_sums_fires_what_the_rows_would() {
        let inner = "(SELECT k, v, COUNT(*) AS c FROM PCOLLECTION GROUP BY k, v)";
        let distinct = format!("SELECT k, COUNT(*) AS n FROM {inner} GROUP BY k");
        let sums = format!("SELECT SUM(c) AS total, k, AVG(c) AS mean FROM {inner} t GROUP BY k");
        let table = [("PCOLLECTION".to_string(), "C".to_string(), user())];
        for sql in [distinct, sums] {
            let nested = riverbank_engine::sql::nested_query(&sql, &table)
                .await
                .unwrap()
                .expect("kept as sums");
            let output = riverbank_engine::sql::plan_schema(&sql, &table)
                .await
                .unwrap();
            let make = |nested: Option<riverbank_engine::sql::NestedAggregate>| {
                let mut q = query(
                    &sql,
                    &[("PCOLLECTION", "C")],
                    every(2, "accumulating"),
                    None,
                );
                q.op.output_schema = output.clone();
                q.keys.nested = nested.map(Box::new);
                q
            };
            let rows_kept = make(None);
            let sums_kept = make(Some(nested));
            let steps: [(&str, Rows); 5] = [
                ("w1", &[("x", 1, S), ("x", 5, S), ("y", 2, S)]),
                ("w1", &[("x", 1, S), ("z", 7, S)]),
                ("w2", &[("x", 9, S)]),
                ("w2", &[("y", 2, S), ("y", 4, S), ("w", 1, S)]),
                ("w1", &[("w", 3, S)]),
            ];
            let mut outs = vec![];
            for (id, (worker, r)) in steps.iter().enumerate() {
                let id = id as u64 + 1;
                let a = rows_kept
                    .checkpoint_on(worker, id, S, vec![vec![rows(r)]])
                    .await;
                let b = sums_kept
                    .checkpoint_on(worker, id, S, vec![vec![rows(r)]])
                    .await;
                assert_eq!(fired_rows(&b), fired_rows(&a), "{sql}, checkpoint {id}");
                outs.push(b);
            }
            assert!(outs.iter().any(|o| !o.fired.is_empty()));
            // After the fourth checkpoint's firing: inner groups (w 1), (x 1), (x 5), (x 9),
            // (y 2), (y 4), (z 7), and sums of w, x, y, z; then w's waiting row.
            assert_eq!((outs[3].keys, outs[4].keys), (11, 12), "{sql}");
            let drained = sums_kept.checkpoint(6, END_OF_TIME, vec![vec![]]).await;
            let want = rows_kept.checkpoint(6, END_OF_TIME, vec![vec![]]).await;
            assert_eq!(fired_rows(&drained), fired_rows(&want), "{sql}");
            assert!(!want.fired.is_empty(), "{sql}: w's waiting row");
            assert_eq!(drained.keys, 0);
        }
    }

    /// A shard that began keeping rows goes on with rows when its query can keep aggregates
    /// (state written before that could); one holding aggregates of another merge is refused,
    /// naming the transform.
    #[tokio::test]
    async fn a_shard_keeps_the_form_it_began_with() {
        let max = "SELECT k, MAX(v) AS n FROM PCOLLECTION GROUP BY k";
        let merge = r#"SELECT "k", MAX("n") AS "n" FROM PCOLLECTION GROUP BY "k""#;
        let mut q = grouped(max, None, triggering("accumulating"));
        let one = q.try_checkpoint(1, vec![vec![rows(&[("x", 1, S), ("x", 2, S)])]]);
        assert_eq!(one.await.unwrap().keys, 2);
        q.keys.merge = Some(merge.into());
        let two = q.try_checkpoint(2, vec![vec![rows(&[("x", 5, S)])]]).await;
        let two = two.unwrap();
        assert_eq!(fired(&two), [("x".into(), 5)]);
        assert_eq!(two.keys, 3, "still rows");

        let mut q = grouped(max, Some(merge), triggering("accumulating"));
        let one = q.try_checkpoint(1, vec![vec![rows(&[("x", 1, S), ("x", 2, S)])]]);
        assert_eq!(one.await.unwrap().keys, 1);
        q.keys.merge = Some(merge.replace("MAX", "MIN"));
        let e = q
            .try_checkpoint(2, vec![vec![]])
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("'Q'") && e.contains(merge), "{e}");
    }
}
