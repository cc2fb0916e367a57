//! A streaming Sql or Join over session windows: its state shard, for one checkpoint. Rows
//! are sharded by the sessions' key (a Sql's GROUP BY, a Join's equalities), so every row of a
//! key's sessions meets in one shard. The shard keeps the rows of the sessions still open;
//! each checkpoint merges them per key with the new ones (`sessions::merge_across`, as a batch
//! run merges them), and every merged session the watermark has passed fires: the query runs
//! over its rows (`sql::run_windowed`). With `allowed_lateness`, a fired session's rows stay
//! until the watermark passes its end plus the lateness: a late row merges into it (growing or
//! joining sessions as Beam's merging windows do) and the merged session fires again, a late
//! pane over all of its rows (`accumulating`) or over the rows that had not fired
//! (`discarding`). A row whose own session window is further behind the watermark than the
//! lateness when it arrives is dropped and counted.
//!
//! An unwindowed side input beside the sessions (a Join's lookup table) is routed by its key
//! like the sessions' rows, kept for the job's life, and in every firing's query: its rows meet
//! every session of their key.
//!
//! Namespaces (one store per transform): `r`: input ++ checkpoint → the kept sessions' rows of
//! that input (Arrow IPC, window columns kept: each row carries its merged session so far, and
//! a hidden column saying whether its session has fired); `s`: input ++ checkpoint → a side
//! input's rows.
use super::shard::{ShardOutput, clocks, ms};
use super::shard_open as open;
use super::sql_shard::{Change, from_ipc, ipc};
use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use riverbank_elements::columns::window_bounds;
use riverbank_engine::error::RunError;
use riverbank_engine::shards::SqlShard;
use riverbank_engine::work::CheckpointCtx;
use riverbank_pipeline::trigger::AccumulationMode;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

const ROWS: &str = "r";
const SIDE: &str = "s";
/// Hidden column of the kept rows: whether their session has fired.
const FIRED: &str = "__rb_fired";
/// The open sessions' rows held, in the store's own counters.
const OPEN: &str = "rows";

/// Runs checkpoint `ctx.id` of the shard: merges its inputs (one list of batches per distinct
/// input collection) into the open sessions, by `keys` (each table's), fires those the
/// watermark has passed.
pub async fn run(
    which: SqlShard<'_>,
    keys: &[Vec<String>],
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
    let lateness = op.triggering.allowed_lateness_us;
    let accumulating = op.triggering.accumulation == AccumulationMode::Accumulating;

    // Each input: the open sessions' rows kept, then this checkpoint's rows on time.
    let mut changes: Vec<Change> = vec![];
    let mut rows: Vec<Vec<RecordBatch>> = vec![vec![]; collections.len()];
    for (k, bytes) in store.scan(ROWS).map_err(&serr)? {
        let i = k
            .get(..2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
            .filter(|i| *i < collections.len())
            .ok_or_else(|| terr("kept rows of an unknown input".into()))?;
        for b in from_ipc(&bytes).map_err(terr)? {
            // Rows kept before sessions had lateness carry no flag: they had not fired.
            rows[i].push(with_fired(&b, None).map_err(terr)?);
        }
        changes.push((ROWS, k, None));
    }
    let mut side: Vec<Vec<RecordBatch>> = vec![vec![]; collections.len()];
    for (i, batches) in inputs.into_iter().enumerate() {
        for b in batches {
            let Some((_, ends)) = window_bounds(&b) else {
                // Unwindowed: a side input's rows, kept.
                side[i].push(b);
                continue;
            };
            let on_time: BooleanArray = ends
                .iter()
                .map(|e| Some(e.saturating_add(lateness) > clock_in.watermark))
                .collect();
            out.late_dropped += (b.num_rows() - on_time.true_count()) as u64;
            let b = arrow::compute::filter_record_batch(&b, &on_time)
                .map_err(|e| terr(e.to_string()))?;
            if b.num_rows() > 0 {
                rows[i].push(with_fired(&b, None).map_err(terr)?);
            }
        }
    }
    for (i, batches) in side.iter().enumerate().filter(|(_, b)| !b.is_empty()) {
        let mut k = (i as u16).to_be_bytes().to_vec();
        k.extend_from_slice(&ctx.id.to_be_bytes());
        changes.push((SIDE, k, Some(ipc(batches).map_err(terr)?)));
    }
    let t_read = started.elapsed();

    // Merge per key across the inputs, fire the sessions that ended, keep the others.
    let by_input: Vec<Vec<String>> = collections
        .iter()
        .map(|c| {
            let t = op.tables.iter().position(|(_, coll)| coll == c);
            t.map(|t| keys[t].clone()).unwrap_or_default()
        })
        .collect();
    let (merged, sessions) =
        riverbank_engine::sessions::merge_across_sessions(rows, &by_input).map_err(terr)?;
    // Each merged session's end, and whether it holds a row that has not fired.
    let mut ends: HashMap<u64, i64> = HashMap::new();
    let mut unfired: HashMap<u64, bool> = HashMap::new();
    for (batches, ids) in merged.iter().zip(&sessions) {
        for b in batches {
            let (_, we) =
                window_bounds(b).ok_or_else(|| terr("merged rows lost their window".into()))?;
            let fired = fired_of(b).map_err(terr)?;
            for (r, id) in ids.iter().enumerate() {
                ends.insert(*id, we[r]);
                *unfired.entry(*id).or_default() |= !fired.value(r);
            }
        }
    }
    // A session fires once the watermark passes its end, if it holds rows that have not fired
    // (the first time, or late ones since); it goes once the lateness is over too.
    let fires = |id: &u64| ends[id] <= clock.watermark && unfired[id];
    let expired = |id: &u64| ends[id].saturating_add(lateness) <= clock.watermark;
    let mut due: Vec<Vec<RecordBatch>> = vec![vec![]; collections.len()];
    let mut open_rows = 0u64;
    for (i, (batches, ids)) in merged.into_iter().zip(&sessions).enumerate() {
        let mut keep = vec![];
        for b in batches {
            let fired = fired_of(&b).map_err(terr)?;
            let fire: BooleanArray = ids
                .iter()
                .enumerate()
                .map(|(r, id)| Some(fires(id) && (accumulating || !fired.value(r))))
                .collect();
            let stays: BooleanArray = ids.iter().map(|id| Some(!expired(id))).collect();
            let now_fired: BooleanArray = ids
                .iter()
                .enumerate()
                .map(|(r, id)| Some(fired.value(r) || fires(id)))
                .collect();
            let filter = |b: &RecordBatch, mask: &BooleanArray| {
                arrow::compute::filter_record_batch(b, mask).map_err(|e| terr(e.to_string()))
            };
            let fire = filter(&b, &fire)?;
            let stay = filter(&with_fired(&b, Some(now_fired)).map_err(terr)?, &stays)?;
            if fire.num_rows() > 0 {
                due[i].push(fire);
            }
            if stay.num_rows() > 0 {
                open_rows += stay.num_rows() as u64;
                keep.push(stay);
            }
        }
        if !keep.is_empty() {
            let mut k = (i as u16).to_be_bytes().to_vec();
            k.extend_from_slice(&ctx.id.to_be_bytes());
            // A key written this checkpoint replaces its delete above.
            changes.retain(|(_, old, _)| *old != k);
            changes.push((ROWS, k, Some(ipc(&keep).map_err(terr)?)));
        }
    }
    let q = std::time::Instant::now();
    if due.iter().any(|d| !d.is_empty()) {
        // The side inputs' rows kept before, and this checkpoint's.
        if !op.side_tables.is_empty() {
            for (k, bytes) in store.scan(SIDE).map_err(&serr)? {
                let i = u16::from_be_bytes([k[0], k[1]]) as usize;
                if k[2..] != ctx.id.to_be_bytes() {
                    due.get_mut(i)
                        .ok_or_else(|| terr("side rows of an unknown input".into()))?
                        .extend(from_ipc(&bytes).map_err(terr)?);
                }
            }
            for (i, batches) in side.into_iter().enumerate() {
                due[i].extend(batches);
            }
        }
        let tables = op
            .tables
            .iter()
            .zip(&schemas)
            .map(|((table, coll), schema)| {
                let i = collections.iter().position(|c| c == coll);
                (
                    table.clone(),
                    schema.clone(),
                    i.map(|i| due[i].clone()).unwrap_or_default(),
                )
            })
            .collect();
        out.fired =
            riverbank_engine::sql::run_windowed(&op.query, tables, op.output_schema.clone())
                .await
                .map_err(terr)?;
    }
    let query_time = q.elapsed();
    store.apply_owned(&changes).map_err(&serr)?;
    out.keys = open_rows;
    store.set_count(OPEN, open_rows).map_err(&serr)?;
    at.checkpoint(ctx, &mut out).await?;
    tracing::debug!(
        transform = name,
        shard,
        checkpoint = ctx.id,
        open_rows,
        read_ms = ms(t_read),
        query_ms = ms(query_time),
        uploaded = out.checkpoint_bytes,
        "session sql shard checkpoint"
    );
    Ok(out)
}

/// `b` with its [`FIRED`] column set to `fired` (or, when None, kept, or added as all false).
fn with_fired(b: &RecordBatch, fired: Option<BooleanArray>) -> Result<RecordBatch, String> {
    let at = b.schema().index_of(FIRED).ok();
    let column: ArrayRef = match (fired, at) {
        (Some(f), _) => Arc::new(f),
        (None, Some(_)) => return Ok(b.clone()),
        (None, None) => Arc::new(BooleanArray::from(vec![false; b.num_rows()])),
    };
    let mut fields: Vec<Arc<Field>> = b.schema().fields().iter().cloned().collect();
    let mut cols = b.columns().to_vec();
    match at {
        Some(i) => cols[i] = column,
        None => {
            fields.push(Arc::new(Field::new(FIRED, DataType::Boolean, false)));
            cols.push(column);
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(|e| e.to_string())
}

/// The [`FIRED`] column of a kept or new row batch (`with_fired` gave every one).
fn fired_of(b: &RecordBatch) -> Result<&BooleanArray, String> {
    b.column_by_name(FIRED)
        .and_then(|c| c.as_boolean_opt())
        .filter(|c| c.null_count() == 0)
        .ok_or_else(|| "session rows without their fired flag".to_string())
}
