//! A streaming Sql or Join over session windows: its state shard, for one checkpoint. Rows
//! are sharded by the sessions' key (a Sql's GROUP BY, a Join's equalities), so every row of a
//! key's sessions meets in one shard. The shard keeps the rows of the sessions still open;
//! each checkpoint merges them per key with the new ones (`sessions::merge_across`, as a batch
//! run merges them), and every merged session the watermark has passed fires once: the query
//! runs over its rows (`sql::run_windowed`), and they go. A row whose own session window is
//! already behind the watermark when it arrives is late: dropped and counted.
//!
//! Namespace (one store per transform): `r`: input ++ checkpoint → the open sessions' rows of
//! that input (Arrow IPC, window columns kept: each row carries its merged session so far).
use super::shard::{ShardOutput, clocks, ms};
use super::shard_open as open;
use super::sql_shard::{Change, from_ipc, ipc};
use arrow::array::{BooleanArray, RecordBatch};
use riverbank_elements::columns::window_bounds;
use riverbank_engine::error::RunError;
use riverbank_engine::shards::SqlShard;
use riverbank_engine::work::CheckpointCtx;
use std::path::Path;

const ROWS: &str = "r";
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

    // Each input: the open sessions' rows kept, then this checkpoint's rows on time.
    let mut changes: Vec<Change> = vec![];
    let mut rows: Vec<Vec<RecordBatch>> = vec![vec![]; collections.len()];
    for (k, bytes) in store.scan(ROWS).map_err(&serr)? {
        let i = k
            .get(..2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
            .filter(|i| *i < collections.len())
            .ok_or_else(|| terr("kept rows of an unknown input".into()))?;
        rows[i].extend(from_ipc(&bytes).map_err(terr)?);
        changes.push((ROWS, k, None));
    }
    for (i, batches) in inputs.into_iter().enumerate() {
        for b in batches {
            let (_, ends) = window_bounds(&b)
                .ok_or_else(|| terr("a session input without window columns".into()))?;
            let on_time: BooleanArray =
                ends.iter().map(|e| Some(*e > clock_in.watermark)).collect();
            out.late_dropped += (b.num_rows() - on_time.true_count()) as u64;
            let b = arrow::compute::filter_record_batch(&b, &on_time)
                .map_err(|e| terr(e.to_string()))?;
            if b.num_rows() > 0 {
                rows[i].push(b);
            }
        }
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
    let merged = riverbank_engine::sessions::merge_across(rows, &by_input).map_err(terr)?;
    let mut due: Vec<Vec<RecordBatch>> = vec![vec![]; collections.len()];
    let mut open_rows = 0u64;
    for (i, batches) in merged.into_iter().enumerate() {
        let mut keep = vec![];
        for b in batches {
            let (_, ends) =
                window_bounds(&b).ok_or_else(|| terr("merged rows lost their window".into()))?;
            let ended: BooleanArray = ends.iter().map(|e| Some(clock.watermark >= *e)).collect();
            let split = |mask: &BooleanArray| {
                arrow::compute::filter_record_batch(&b, mask).map_err(|e| terr(e.to_string()))
            };
            let fire = split(&ended)?;
            let stay = split(&arrow::compute::not(&ended).map_err(|e| terr(e.to_string()))?)?;
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
