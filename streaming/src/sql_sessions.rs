//! A streaming Sql or Join over session windows: its state shard, for one checkpoint. Rows
//! are sharded by the sessions' key (a Sql's GROUP BY, a Join's equalities), so every row of a
//! key's sessions meets in one shard. The shard keeps the rows of the sessions still open;
//! each checkpoint merges them per key with the new ones (`sessions::merge_across`, as a batch
//! run merges them), and every merged session whose trigger fires ([`Panes`], as a Combine's
//! windows) runs the query over its rows (`sql::run_windowed`): all of them (`accumulating`)
//! or those not in an earlier pane (`discarding`). A session's panes travel with its rows, so
//! they merge as the sessions do (`Panes::merged`). A session's rows stay until the watermark
//! passes its end plus the allowed lateness: a late row merges into it (growing or joining
//! sessions as Beam's merging windows do) and may fire it again. A row whose own session
//! window is further behind the watermark than the lateness when it arrives, or that joins a
//! session whose trigger finished, is dropped and counted.
//!
//! An unwindowed side input beside the sessions (a Join's lookup table) is routed by its key
//! like the sessions' rows, kept for the job's life, and in every firing's query: its rows meet
//! every session of their key.
//!
//! An unwindowed side input read again every `refresh_interval` replaces its last read.
//!
//! Namespaces (one store per transform): `r`: input ++ checkpoint → the kept sessions' rows of
//! that input (Arrow IPC, window columns kept: each row carries its merged session so far, and
//! hidden columns saying whether it has been in a pane and its session's number); `p`:
//! `panes` → the kept sessions' panes by that number, rewritten with the rows each checkpoint
//! (a number per row, not the panes: the rows' bytes stay as they were); `s`: input ++
//! checkpoint → a side input's rows.
use super::shard::{ShardOutput, clocks, ms};
use super::shard_open as open;
use super::sql_shard::{Change, from_ipc, ipc};
use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema};
use riverbank_elements::columns::window_bounds;
use riverbank_engine::compile::SqlOp;
use riverbank_engine::error::RunError;
use riverbank_engine::shards::SqlShard;
use riverbank_engine::work::CheckpointCtx;
use riverbank_pipeline::trigger::AccumulationMode;
use riverbank_windowing::panes::{Arrival, Panes};
use riverbank_windowing::trigger::Clock;
use std::path::Path;
use std::sync::Arc;

const ROWS: &str = "r";
const SIDE: &str = "s";
/// Hidden column of the kept rows: whether their session has fired.
const FIRED: &str = "__rb_fired";
/// Hidden column of the kept rows: their session's number in the panes the checkpoint that
/// kept them wrote ([`PANES`]); null on rows that arrived since.
const SESSION: &str = "__rb_session";
/// Namespace and key of the kept sessions' panes, one after another ([`Panes::encode`]).
const PANES: (&str, &[u8]) = ("p", b"panes");
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

    // The kept sessions' panes, by the number their rows carry.
    let kept_panes = match store.get(PANES.0, PANES.1).map_err(&serr)? {
        Some(bytes) => decode_panes(&bytes).map_err(terr)?,
        None => vec![],
    };
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
            rows[i].push(with_hidden(&b, None, None).map_err(terr)?);
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
                rows[i].push(with_hidden(&b, None, None).map_err(terr)?);
            }
        }
    }
    // A refreshed read's rows replace those kept of it.
    super::sql_shard::drop_replaced_side_rows(store, op, collections, ctx, name)?;
    for (i, batches) in side.iter().enumerate().filter(|(_, b)| !b.is_empty()) {
        let mut k = (i as u16).to_be_bytes().to_vec();
        k.extend_from_slice(&ctx.id.to_be_bytes());
        changes.push((SIDE, k, Some(ipc(batches).map_err(terr)?)));
    }
    let t_read = started.elapsed();

    // Merge per key across the inputs; each merged session's panes from those of the sessions
    // it took in, fed its new rows. A session that took in a closed one (its trigger finished)
    // refuses its new rows: they are dropped and counted, and the rest merged again without
    // them (once: dropping rows only splits sessions, never joins one to a closed one).
    let by_input: Vec<Vec<String>> = collections
        .iter()
        .map(|c| {
            let t = op.tables.iter().position(|(_, coll)| coll == c);
            t.map(|t| keys[t].clone()).unwrap_or_default()
        })
        .collect();
    let (merged, sessions, mut panes) = loop {
        let (merged, sessions) =
            riverbank_engine::sessions::merge_across_sessions(rows.clone(), &by_input)
                .map_err(terr)?;
        let panes = session_panes(&merged, &sessions, &kept_panes, op, &clock_in).map_err(terr)?;
        if panes.iter().all(Option::is_some) {
            let panes: Vec<Panes> = panes.into_iter().flatten().collect();
            break (merged, sessions, panes);
        }
        // Each input's rows in merge order (its batches one after another), less the refused.
        for (i, (batches, ids)) in merged.iter().zip(&sessions).enumerate() {
            let Some(b) = batches.first() else { continue };
            let (fired, kept) = (fired_of(b).map_err(terr)?, session_of(b).map_err(terr)?);
            let take: BooleanArray = ids
                .iter()
                .enumerate()
                .map(|(r, id)| {
                    let new = kept.is_null(r) && !fired.value(r);
                    Some(!(new && panes[*id as usize].is_none()))
                })
                .collect();
            out.late_dropped += (ids.len() - take.true_count()) as u64;
            let all = arrow::compute::concat_batches(&rows[i][0].schema(), &rows[i])
                .map_err(|e| terr(e.to_string()))?;
            rows[i] = vec![
                arrow::compute::filter_record_batch(&all, &take)
                    .map_err(|e| terr(e.to_string()))?,
            ];
        }
    };
    // Fire the sessions whose trigger says so; keep every session until it expires (a fired
    // or closed one still bounds the sessions late rows may join). By session number.
    let firing: Vec<bool> = panes
        .iter_mut()
        .map(|p| p.on_clock(&clock).is_some())
        .collect();
    let expired: Vec<bool> = panes
        .iter()
        .map(|p| p.is_expired(clock.watermark))
        .collect();
    let mut due: Vec<Vec<RecordBatch>> = vec![vec![]; collections.len()];
    let mut open_rows = 0u64;
    for (i, (batches, ids)) in merged.into_iter().zip(&sessions).enumerate() {
        let mut keep = vec![];
        for b in batches {
            let fired = fired_of(&b).map_err(terr)?;
            // A pane holds the session's rows not in an earlier one, or all of them.
            let fire: BooleanArray = ids
                .iter()
                .enumerate()
                .map(|(r, id)| Some(firing[*id as usize] && (accumulating || !fired.value(r))))
                .collect();
            let stays: BooleanArray = ids.iter().map(|id| Some(!expired[*id as usize])).collect();
            let now_fired: BooleanArray = ids
                .iter()
                .enumerate()
                .map(|(r, id)| Some(fired.value(r) || firing[*id as usize]))
                .collect();
            let now_session = UInt32Array::from_iter_values(ids.iter().map(|id| *id as u32));
            let filter = |b: &RecordBatch, mask: &BooleanArray| {
                arrow::compute::filter_record_batch(b, mask).map_err(|e| terr(e.to_string()))
            };
            let fire = filter(&b, &fire)?;
            let b = with_hidden(&b, Some(now_fired), Some(now_session)).map_err(terr)?;
            let stay = filter(&b, &stays)?;
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
            changes.retain(|(ns, old, _)| !(*ns == ROWS && *old == k));
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
    // The panes the kept rows' session numbers point to.
    let mut encoded = vec![];
    if open_rows > 0 {
        for p in &panes {
            p.encode(&mut encoded);
        }
    }
    changes.push((
        PANES.0,
        PANES.1.to_vec(),
        (open_rows > 0).then_some(encoded),
    ));
    store.apply_owned(changes).map_err(&serr)?;
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

/// Each merged session's panes, by its number: the one session it was, or the merge of those
/// it took in ([`Panes::merged`]: its trigger starts over for the merged end), fed its new
/// rows; None for a session that refuses its new rows, having taken in a closed one.
fn session_panes(
    merged: &[Vec<RecordBatch>],
    sessions: &[Vec<u64>],
    kept_panes: &[Panes],
    op: &SqlOp,
    clock_in: &Clock,
) -> Result<Vec<Option<Panes>>, String> {
    /// A merged session: its end, the kept sessions in it (by their number; a row's is mostly
    /// the row before's: a few to compare), its new rows.
    #[derive(Default, Clone)]
    struct Parts {
        end: i64,
        kept: Vec<u32>,
        new: u64,
    }
    let mut of: Vec<Parts> = vec![Parts::default(); session_count(sessions)];
    for (batches, ids) in merged.iter().zip(sessions) {
        let Some(b) = batches.first() else { continue };
        let (_, ends) = window_bounds(b).ok_or("merged rows lost their window")?;
        let (fired, kept) = (fired_of(b)?, session_of(b)?);
        for (r, id) in ids.iter().enumerate() {
            let s = &mut of[*id as usize];
            s.end = ends[r];
            if kept.is_valid(r) {
                let n = kept.value(r);
                if s.kept.last() != Some(&n) && !s.kept.contains(&n) {
                    s.kept.push(n);
                }
            } else if !fired.value(r) {
                // Rows kept before sessions had panes carry none: new only if never fired.
                s.new += 1;
            }
        }
    }
    let mut panes = Vec::with_capacity(of.len());
    for s in of {
        let parts = s
            .kept
            .iter()
            .map(|n| {
                kept_panes
                    .get(*n as usize)
                    .cloned()
                    .ok_or_else(|| format!("kept rows of session {n}, which has no panes"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if s.new > 0 && parts.iter().any(Panes::is_closed) {
            panes.push(None);
            continue;
        }
        let mut p = match parts.as_slice() {
            [] => Panes::new(&op.triggering, s.end),
            [one] if one.end() == s.end => one.clone(),
            _ => Panes::merged(&parts, &op.triggering, s.end, clock_in.now),
        };
        if s.new > 0 && p.add_elements(s.new, clock_in) != Arrival::Taken {
            panes.push(None);
            continue;
        }
        panes.push(Some(p));
    }
    Ok(panes)
}

/// How many merged sessions there are: `merge_across_sessions` numbers them from 0.
fn session_count(sessions: &[Vec<u64>]) -> usize {
    sessions
        .iter()
        .flatten()
        .max()
        .map_or(0, |m| *m as usize + 1)
}

/// Every [`Panes`] of `bytes`, one after another.
fn decode_panes(mut bytes: &[u8]) -> Result<Vec<Panes>, String> {
    let mut all = vec![];
    while !bytes.is_empty() {
        let (p, used) = Panes::decode(bytes)?;
        all.push(p);
        bytes = &bytes[used..];
    }
    Ok(all)
}

/// `b` with its hidden [`FIRED`] and [`SESSION`] columns set to `fired` and `session` (when
/// None, kept, or added as all false and all null).
fn with_hidden(
    b: &RecordBatch,
    fired: Option<BooleanArray>,
    session: Option<UInt32Array>,
) -> Result<RecordBatch, String> {
    let b = with_column(
        b,
        FIRED,
        DataType::Boolean,
        fired.map(|f| Arc::new(f) as ArrayRef),
        || Arc::new(BooleanArray::from(vec![false; b.num_rows()])),
    )?;
    with_column(
        &b,
        SESSION,
        DataType::UInt32,
        session.map(|s| Arc::new(s) as ArrayRef),
        || arrow::array::new_null_array(&DataType::UInt32, b.num_rows()),
    )
}

/// `b` with column `name` set to `value`, or if None kept, or added as `absent()`.
fn with_column(
    b: &RecordBatch,
    name: &str,
    ty: DataType,
    value: Option<ArrayRef>,
    absent: impl FnOnce() -> ArrayRef,
) -> Result<RecordBatch, String> {
    let at = b.schema().index_of(name).ok();
    let column = match (value, at) {
        (Some(v), _) => v,
        (None, Some(_)) => return Ok(b.clone()),
        (None, None) => absent(),
    };
    let mut fields: Vec<Arc<Field>> = b.schema().fields().iter().cloned().collect();
    let mut cols = b.columns().to_vec();
    match at {
        Some(i) => cols[i] = column,
        None => {
            // Nullable: rows arrived since the last checkpoint have no session yet.
            fields.push(Arc::new(Field::new(name, ty, name == SESSION)));
            cols.push(column);
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(|e| e.to_string())
}

/// The [`SESSION`] column of a kept or new row batch (`with_hidden` gave every one).
fn session_of(b: &RecordBatch) -> Result<&UInt32Array, String> {
    b.column_by_name(SESSION)
        .and_then(|c| c.as_primitive_opt::<arrow::datatypes::UInt32Type>())
        .ok_or_else(|| "session rows without their session column".to_string())
}

/// The [`FIRED`] column of a kept or new row batch (`with_fired` gave every one).
fn fired_of(b: &RecordBatch) -> Result<&BooleanArray, String> {
    b.column_by_name(FIRED)
        .and_then(|c| c.as_boolean_opt())
        .filter(|c| c.null_count() == 0)
        .ok_or_else(|| "session rows without their fired flag".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::{Int64Type, SchemaRef, TimestampMicrosecondType};
    use riverbank_elements::columns::{TS, WINDOW_END, WINDOW_START, ts_field};
    use riverbank_pipeline::trigger::Triggering;

    const S: i64 = 1_000_000;
    const GAP: i64 = 3 * S;

    fn user() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, false)]))
    }

    /// Rows (key, event time) each in its own session window `[t, t + 3 s)`.
    fn rows(rows: &[(&str, i64)]) -> RecordBatch {
        let mut fields: Vec<Field> = user().fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.extend([ts_field(TS), ts_field(WINDOW_START), ts_field(WINDOW_END)]);
        let ts = |f: &dyn Fn(i64) -> i64| -> ArrayRef {
            Arc::new(
                TimestampMicrosecondArray::from_iter_values(rows.iter().map(|r| f(r.1)))
                    .with_timezone("UTC"),
            )
        };
        RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                ts(&|t| t),
                ts(&|t| t),
                ts(&|t| t + GAP),
            ],
        )
        .unwrap()
    }

    /// A count per key and session under `windowing` (a `windowing:` mapping's trigger fields).
    fn op(windowing: serde_json::Value) -> SqlOp {
        let mut fields = vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("n", DataType::Int64, false),
        ];
        fields.extend([ts_field(WINDOW_START), ts_field(WINDOW_END), ts_field(TS)]);
        SqlOp {
            query: "SELECT k, COUNT(*) AS n FROM PCOLLECTION GROUP BY k".into(),
            tables: vec![("PCOLLECTION".into(), "C".into())],
            windowed: true,
            side_tables: vec![],
            triggering: Triggering::parse(windowing.as_object().unwrap()).unwrap(),
            output_schema: Arc::new(Schema::new(fields)),
            session_keys: Some(vec![vec!["k".into()]]),
            keyed: None,
            columns: None,
            bounded_inputs: Default::default(),
            refreshing: Default::default(),
            extreme: None,
            set_tables: vec![],
        }
    }

    struct Shard {
        op: SqlOp,
        dir: tempfile::TempDir,
    }

    impl Shard {
        fn new(windowing: serde_json::Value) -> Shard {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("remote")).unwrap();
            Shard {
                op: op(windowing),
                dir,
            }
        }

        /// Checkpoint `id` with these rows, the watermark moving from `from` to `to`: the
        /// (key, count, session start s, session end s) of every row fired, and the output.
        async fn checkpoint(
            &self,
            id: u64,
            (from, to): (i64, i64),
            input: &[(&str, i64)],
        ) -> (Vec<(String, i64, i64, i64)>, ShardOutput) {
            let ctx = CheckpointCtx {
                id,
                watermark_in: from,
                watermark: to,
                now_us: id as i64 * S,
                start_us: 0,
                state_prefix: self.dir.path().join("remote").display().to_string(),
                new_states: vec![],
                refreshed: vec![],
            };
            let which = SqlShard {
                op: &self.op,
                name: "PerSession",
                shard: 0,
                schemas: vec![user()],
                cache_bytes: 1 << 20,
                collections: vec!["C".into()],
                inputs: vec![if input.is_empty() {
                    vec![]
                } else {
                    vec![rows(input)]
                }],
            };
            let keys = [vec!["k".to_string()]];
            let out = run(which, &keys, &ctx, &self.dir.path().join("w"))
                .await
                .unwrap();
            let mut fired = vec![];
            for b in &out.fired {
                let bound = |name: &str| {
                    b.column_by_name(name)
                        .unwrap()
                        .as_primitive::<TimestampMicrosecondType>()
                        .clone()
                };
                let (ws, we) = (bound(WINDOW_START), bound(WINDOW_END));
                for r in 0..b.num_rows() {
                    fired.push((
                        b.column(0).as_string::<i32>().value(r).to_string(),
                        b.column(1).as_primitive::<Int64Type>().value(r),
                        ws.value(r) / S,
                        we.value(r) / S,
                    ));
                }
            }
            fired.sort();
            (fired, out)
        }
    }

    fn row(k: &str, n: i64, start: i64, end: i64) -> (String, i64, i64, i64) {
        (k.to_string(), n, start, end)
    }

    /// An early count trigger, accumulating: a session fires early once it holds 2 rows, again
    /// (over all of its rows, under its grown bounds) once a third grew it, and on time when
    /// the watermark passes its end; then it goes.
    #[tokio::test]
    async fn an_early_trigger_fires_a_session_before_the_watermark_and_as_it_grows() {
        let shard = Shard::new(serde_json::json!({
            "trigger": {"after_watermark": {"early": {"after_count": 2}}},
            "accumulation_mode": "accumulating"
        }));
        let (fired, _) = shard.checkpoint(1, (0, S), &[("a", S)]).await;
        assert!(fired.is_empty(), "one row: not yet");
        let (fired, _) = shard.checkpoint(2, (S, 2 * S), &[("a", 2 * S)]).await;
        assert_eq!(fired, [row("a", 2, 1, 5)]);
        // One new row: the grown session's trigger starts over, fed it, and waits for another.
        let (fired, _) = shard.checkpoint(3, (2 * S, 3 * S), &[("a", 4 * S)]).await;
        assert!(fired.is_empty(), "{fired:?}");
        let (fired, _) = shard
            .checkpoint(4, (3 * S, 4 * S), &[("a", 4 * S), ("b", 4 * S)])
            .await;
        assert_eq!(fired, [row("a", 4, 1, 7)]);
        let (fired, out) = shard.checkpoint(5, (4 * S, 8 * S), &[]).await;
        assert_eq!(fired, [row("a", 4, 1, 7), row("b", 1, 4, 7)]);
        assert_eq!(out.keys, 0, "both sessions expired");
    }

    /// A trigger that finishes (one count of 2, discarding) closes its session: rows that merge
    /// into it later, directly or through each other, are dropped and counted (as a Combine per
    /// session drops them); a session of another key, or a later one, fires alone.
    #[tokio::test]
    async fn rows_joining_a_closed_session_are_dropped_and_counted() {
        let shard = Shard::new(serde_json::json!({
            "trigger": {"after_count": 2},
            "allowed_lateness": "60s"
        }));
        let (fired, _) = shard
            .checkpoint(1, (0, S), &[("a", S), ("a", 2 * S), ("b", S)])
            .await;
        assert_eq!(fired, [row("a", 2, 1, 5)]);
        // 4 s joins the closed [1, 5), and 6 s joins it through 4 s.
        let (fired, out) = shard
            .checkpoint(2, (S, 2 * S), &[("a", 4 * S), ("a", 6 * S), ("b", 2 * S)])
            .await;
        assert_eq!(out.late_dropped, 2);
        assert_eq!(fired, [row("b", 2, 1, 5)]);
        // The closed session kept its bounds: 5 s starts a session of its own.
        let (fired, out) = shard
            .checkpoint(3, (2 * S, 3 * S), &[("a", 5 * S), ("a", 7 * S)])
            .await;
        assert_eq!((fired, out.late_dropped), (vec![row("a", 2, 5, 10)], 0));
        // Once closed sessions expire (end + lateness), their rows go.
        let (_, out) = shard.checkpoint(4, (3 * S, 80 * S), &[]).await;
        assert_eq!(out.keys, 0);
    }

    /// The default trigger still fires each merged session once, at the watermark.
    #[tokio::test]
    async fn the_default_trigger_fires_each_merged_session_once_at_the_watermark() {
        let shard = Shard::new(serde_json::json!({}));
        let (fired, out) = shard.checkpoint(1, (0, S), &[("a", S), ("a", 3 * S)]).await;
        assert!(fired.is_empty());
        assert_eq!(out.keys, 2);
        let (fired, _) = shard.checkpoint(2, (S, 7 * S), &[("a", 5 * S)]).await;
        assert!(fired.is_empty(), "[1, 8) is open: {fired:?}");
        let (fired, out) = shard.checkpoint(3, (7 * S, 9 * S), &[]).await;
        assert_eq!((fired, out.keys), (vec![row("a", 3, 1, 8)], 0));
    }

    /// A lookup table beside sessions, from a file read again every `refresh_interval`: a
    /// session fired after a new read joins the new rows only, and a read that brings this
    /// shard none of its rows still takes the old ones away.
    #[tokio::test]
    async fn a_refreshed_side_input_replaces_the_last_read_for_the_sessions_fired_after_it() {
        let zones = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("zone", DataType::Utf8, false),
        ]));
        let mut out = vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("zone", DataType::Utf8, false),
        ];
        out.extend([ts_field(WINDOW_START), ts_field(WINDOW_END), ts_field(TS)]);
        let mut refreshing = std::collections::BTreeMap::new();
        refreshing.insert("Z".to_string(), "Zones".to_string());
        let op = SqlOp {
            query: "SELECT e.k AS k, z.zone AS zone FROM e JOIN z ON e.k = z.k".into(),
            tables: vec![("e".into(), "C".into()), ("z".into(), "Z".into())],
            windowed: true,
            side_tables: vec!["z".into()],
            triggering: Triggering::default(),
            output_schema: Arc::new(Schema::new(out)),
            session_keys: Some(vec![vec!["k".into()], vec!["k".into()]]),
            keyed: None,
            columns: None,
            bounded_inputs: Default::default(),
            refreshing,
            extreme: None,
            set_tables: vec![],
        };
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("remote")).unwrap();
        let zone_rows = |rows: &[(&str, &str)]| {
            RecordBatch::try_new(
                zones.clone(),
                vec![
                    Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                    Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
                ],
            )
            .unwrap()
        };
        let checkpoint =
            |id: u64, to: i64, events: &[(&str, i64)], read: Option<&[(&str, &str)]>| {
                let ctx = CheckpointCtx {
                    id,
                    watermark_in: to - S,
                    watermark: to,
                    now_us: 0,
                    start_us: 0,
                    state_prefix: dir.path().join("remote").display().to_string(),
                    new_states: vec![],
                    refreshed: read.map_or(vec![], |_| vec!["Zones".to_string()]),
                };
                let inputs = vec![
                    if events.is_empty() {
                        vec![]
                    } else {
                        vec![rows(events)]
                    },
                    read.filter(|r| !r.is_empty())
                        .map_or(vec![], |r| vec![zone_rows(r)]),
                ];
                let (op, dir) = (&op, dir.path().join("w"));
                let zones = zones.clone();
                async move {
                    let which = SqlShard {
                        op,
                        name: "Zoned",
                        shard: 0,
                        schemas: vec![user(), zones],
                        cache_bytes: 1 << 20,
                        collections: vec!["C".into(), "Z".into()],
                        inputs,
                    };
                    let keys = [vec!["k".to_string()], vec!["k".to_string()]];
                    let out = run(which, &keys, &ctx, &dir).await.unwrap();
                    let mut fired = vec![];
                    for b in &out.fired {
                        for r in 0..b.num_rows() {
                            let text =
                                |c: usize| b.column(c).as_string::<i32>().value(r).to_string();
                            fired.push((text(0), text(1)));
                        }
                    }
                    fired
                }
            };
        let pair = |k: &str, z: &str| (k.to_string(), z.to_string());
        assert!(
            checkpoint(1, S, &[("a", S)], Some(&[("a", "north")]))
                .await
                .is_empty()
        );
        assert_eq!(checkpoint(2, 5 * S, &[], None).await, [pair("a", "north")]);
        assert!(
            checkpoint(3, 6 * S, &[("a", 10 * S)], Some(&[("a", "east")]))
                .await
                .is_empty()
        );
        assert_eq!(checkpoint(4, 14 * S, &[], None).await, [pair("a", "east")]);
        // A read without key a's row (none of its rows for this shard): a goes unmatched.
        assert!(
            checkpoint(5, 15 * S, &[("a", 20 * S)], Some(&[]))
                .await
                .is_empty()
        );
        assert!(checkpoint(6, 24 * S, &[], None).await.is_empty());
    }
}
