//! A streaming Sql or Join's state shard, for one checkpoint. Rows are sharded by window (every
//! input's rows of a window meet in one shard), buffered in the shard's store until the
//! window's trigger fires, then the query runs over the window's rows exactly as a batch run
//! evaluates it for one window (`sql::run_windowed`). Like a Combine's shard, the store is
//! checkpointed before the item reports, so the output commits once with the checkpoint and a
//! restarted or moved shard resumes from its last checkpoint.
//!
//! Namespaces (one store per transform):
//! - `b`: window ++ input ++ checkpoint → that checkpoint's rows of the window from that input
//!   (an Arrow IPC stream, hidden columns kept: the query needs the window bounds);
//! - `p`: window → the window's [`Panes`] (JSON). A shard holds few windows (windows, not
//!   keys), so every checkpoint looks at all of them instead of keeping timers;
//! - `s`: input ++ checkpoint → that checkpoint's rows of an unwindowed side input beside the
//!   windowed ones (a `Create`, a file read). Every shard gets all of them and keeps them for
//!   the job's life: every window's query reads them whole. A side input is read once, so
//!   the windows wait for it: their watermark is its until it is read.
use super::shard::{ShardOutput, clocks, ms};
use super::shard_open as open;
use arrow::array::{Array, RecordBatch};
use riverbank_engine::error::RunError;
use riverbank_engine::shards::SqlShard;
use riverbank_engine::sql::Extreme;
use riverbank_engine::work::CheckpointCtx;
use riverbank_windowing::panes::{Arrival, Panes};
use std::collections::BTreeMap;
use std::path::Path;

const BUFFER: &str = "b";
const PANES: &str = "p";
const SIDE: &str = "s";
/// The number of windows held, in the store's own counters.
const WINDOWS: &str = "windows";

pub(crate) use super::state::OwnedChange as Change;

/// Runs checkpoint `ctx.id` of the shard: buffers `inputs` (one list of batches per distinct
/// input collection, in `collections` order), fires the windows whose trigger says so.
pub async fn run(
    which: SqlShard<'_>,
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
    let started = std::time::Instant::now();
    let mut at = open::ShardAt::open(state_dir, name, shard, cache_bytes, ctx).await?;
    let store = &mut at.store;
    let (clock_in, clock) = clocks(ctx);
    let mut out = ShardOutput::default();

    // Every window the shard holds, then this checkpoint's rows by window and input.
    let mut panes: BTreeMap<[u8; 16], Panes> = BTreeMap::new();
    for (k, json) in store.scan(PANES).map_err(&serr)? {
        let w: [u8; 16] = k
            .as_slice()
            .try_into()
            .map_err(|_| RunError::transform(name, "a window key of the wrong length"))?;
        let p = serde_json::from_slice(&json)
            .map_err(|e| RunError::transform(name, format!("pane state: {e}")))?;
        panes.insert(w, p);
    }
    let mut arrived: BTreeMap<[u8; 16], Vec<Vec<RecordBatch>>> = BTreeMap::new();
    let mut side: BTreeMap<usize, Vec<RecordBatch>> = BTreeMap::new();
    for (i, batches) in inputs.into_iter().enumerate() {
        for b in batches {
            let Some(groups) = riverbank_elements::columns::split_by_window(&b) else {
                // Unwindowed: a side input's rows, in every window.
                side.entry(i).or_default().push(b);
                continue;
            };
            for ((ws, we), rows) in groups {
                arrived
                    .entry(window_key(ws, we))
                    .or_insert_with(|| vec![vec![]; collections.len()])[i]
                    .push(rows);
            }
        }
    }
    drop_replaced_side_rows(store, op, collections, ctx, name)?;
    let mut changes: Vec<Change> = vec![];
    for (i, batches) in &side {
        let bytes = ipc(batches).map_err(|e| RunError::transform(name, e))?;
        changes.push((SIDE, side_key(*i, ctx.id), Some(bytes)));
    }
    for (w, per_input) in arrived {
        let n: usize = per_input.iter().flatten().map(RecordBatch::num_rows).sum();
        let p = panes
            .entry(w)
            .or_insert_with(|| Panes::new(&op.triggering, window_of(&w).1));
        match p.add_elements(n as u64, &clock_in) {
            Arrival::Taken => {}
            Arrival::TooLate | Arrival::Closed => {
                out.late_dropped += n as u64;
                continue;
            }
        }
        for (i, batches) in per_input.iter().enumerate() {
            if batches.is_empty() {
                continue;
            }
            let bytes = match &op.extreme {
                // Only the rows that can still be in the result: the window's kept ones and
                // these, cut to those with the greatest (least) value, in one buffer.
                Some(x) if per_input.len() == 1 => {
                    let kept = store
                        .scan_range(BUFFER, &w, &window_key_next(&w))
                        .map_err(&serr)?;
                    let mut all = vec![];
                    for (k, bytes) in kept {
                        all.extend(from_ipc(&bytes).map_err(|e| RunError::transform(name, e))?);
                        changes.push((BUFFER, k, None));
                    }
                    all.extend(batches.iter().cloned());
                    let best = extremes(&all, x).map_err(|e| RunError::transform(name, e))?;
                    match best.is_empty() {
                        true => continue,
                        false => ipc(&best),
                    }
                }
                // A table read only as a set: this checkpoint's rows without repeats.
                _ if reads_as_set(op, &collections[i]) => {
                    let rows = distinct_rows(batches).map_err(|e| RunError::transform(name, e))?;
                    ipc(&rows)
                }
                _ => ipc(batches),
            };
            let bytes = bytes.map_err(|e| RunError::transform(name, e))?;
            changes.push((BUFFER, buffer_key(&w, i, ctx.id), Some(bytes)));
        }
    }
    // Rows of this checkpoint are read back with the stored ones when a window fires.
    store
        .apply_owned(std::mem::take(&mut changes))
        .map_err(&serr)?;

    // Every side input row, read once a window fires (few rows: a lookup table).
    let mut side_tables: Option<Vec<Vec<RecordBatch>>> = None;

    let t_buffer = started.elapsed();
    let (mut fired_rows, mut query_time) = (0usize, std::time::Duration::ZERO);
    let mut windows = 0u64;
    for (w, p) in panes.iter_mut() {
        let firing = p.on_clock(&clock);
        let (ws, we) = window_of(w);
        let mut cleared = false;
        if let Some(f) = firing {
            let rows = store
                .scan_range(BUFFER, w, &window_key_next(w))
                .map_err(&serr)?;
            let mut tables = match &side_tables {
                Some(t) => t.clone(),
                None if op.side_tables.is_empty() => vec![vec![]; collections.len()],
                None => side_tables
                    .insert(side_rows(store, collections.len(), name)?)
                    .clone(),
            };
            for (k, bytes) in &rows {
                let i = u16::from_be_bytes([k[16], k[17]]) as usize;
                let batches = from_ipc(bytes).map_err(|e| RunError::transform(name, e))?;
                tables
                    .get_mut(i)
                    .ok_or_else(|| RunError::transform(name, "buffered rows of an unknown input"))?
                    .extend(batches);
            }
            let full = op
                .tables
                .iter()
                .zip(&schemas)
                .map(|((table, coll), schema)| {
                    let i = collections.iter().position(|c| c == coll);
                    let batches = i.map(|i| tables[i].clone()).unwrap_or_default();
                    (table.clone(), schema.clone(), batches)
                })
                .collect();
            tracing::debug!(
                transform = name,
                shard,
                ws,
                we,
                pane = f.pane.index,
                "window fires"
            );
            fired_rows += rows.len();
            let q = std::time::Instant::now();
            let fired =
                riverbank_engine::sql::run_windowed(&op.query, full, op.output_schema.clone())
                    .await
                    .map_err(|m| RunError::transform(name, m))?;
            query_time += q.elapsed();
            out.fired.extend(fired);
            if f.clear {
                changes.extend(rows.into_iter().map(|(k, _)| (BUFFER, k, None)));
                cleared = true;
            }
        }
        if p.is_expired(ctx.watermark) {
            // Its last pane fired above: nothing of it can come any more.
            changes.push((PANES, w.to_vec(), None));
            if !cleared {
                let left = store
                    .scan_range(BUFFER, w, &window_key_next(w))
                    .map_err(&serr)?;
                changes.extend(left.into_iter().map(|(k, _)| (BUFFER, k, None)));
            }
            continue;
        }
        windows += 1;
        let json = serde_json::to_vec(p).map_err(|e| RunError::Internal(e.to_string()))?;
        changes.push((PANES, w.to_vec(), Some(json)));
    }
    let t_fire = started.elapsed();
    store.apply_owned(changes).map_err(&serr)?;
    let t_apply = started.elapsed();
    out.keys = windows;
    store.set_count(WINDOWS, windows).map_err(&serr)?;
    at.checkpoint(ctx, &mut out).await?;
    tracing::debug!(
        transform = name,
        shard,
        checkpoint = ctx.id,
        windows,
        fired_buffers = fired_rows,
        buffer_ms = ms(t_buffer),
        fire_ms = ms(t_fire - t_buffer),
        query_ms = ms(query_time),
        apply_ms = ms(t_apply - t_fire),
        checkpoint_ms = ms(started.elapsed() - t_apply),
        uploaded = out.checkpoint_bytes,
        "sql shard checkpoint"
    );
    Ok(out)
}

pub use riverbank_engine::shards::{shard_of_window, window_key};

fn window_of(k: &[u8; 16]) -> (i64, i64) {
    let b = |s: &[u8]| (u64::from_be_bytes(s.try_into().expect("8 bytes")) ^ (1 << 63)) as i64;
    (b(&k[..8]), b(&k[8..]))
}

/// The first key after every buffer key of window `w`.
fn window_key_next(w: &[u8; 16]) -> Vec<u8> {
    let mut k = w.to_vec();
    k.push(0xff);
    k
}

/// The rows of `batches` whose field `x` names holds the greatest (least) value of them all,
/// never a null one (a NULL is no row's MAX). Values compare in Arrow's row format, which
/// orders every type `sql::extreme_rows` takes as SQL does.
fn extremes(batches: &[RecordBatch], x: &Extreme) -> Result<Vec<RecordBatch>, String> {
    use arrow::row::{RowConverter, SortField};
    let column = |b: &RecordBatch| {
        b.column_by_name(&x.field)
            .cloned()
            .ok_or_else(|| format!("no field '{}' in the window's rows", x.field))
    };
    let Some(first) = batches.first() else {
        return Ok(vec![]);
    };
    let conv = RowConverter::new(vec![SortField::new(column(first)?.data_type().clone())])
        .map_err(|e| e.to_string())?;
    let mut converted = vec![];
    let mut best: Option<arrow::row::OwnedRow> = None;
    for b in batches {
        let c = column(b)?;
        let rows = conv
            .convert_columns(std::slice::from_ref(&c))
            .map_err(|e| e.to_string())?;
        for i in (0..b.num_rows()).filter(|i| c.is_valid(*i)) {
            let r = rows.row(i);
            let better = best.as_ref().is_none_or(|b| match x.max {
                true => r > b.row(),
                false => r < b.row(),
            });
            if better {
                best = Some(r.owned());
            }
        }
        converted.push((c, rows));
    }
    let Some(best) = best else {
        return Ok(vec![]);
    };
    let mut out = vec![];
    for (b, (c, rows)) in batches.iter().zip(converted) {
        let keep: arrow::array::BooleanArray = (0..b.num_rows())
            .map(|i| Some(c.is_valid(i) && rows.row(i) == best.row()))
            .collect();
        let f = arrow::compute::filter_record_batch(b, &keep).map_err(|e| e.to_string())?;
        if f.num_rows() > 0 {
            out.push(f);
        }
    }
    Ok(out)
}

/// Whether every table of collection `c` is one the query reads only as a set.
fn reads_as_set(op: &riverbank_engine::compile::SqlOp, c: &str) -> bool {
    let mut tables = op.tables.iter().filter(|(_, coll)| coll == c).peekable();
    tables.peek().is_some() && tables.all(|(t, _)| op.set_tables.contains(t))
}

/// The rows of `batches` (of one window) whose user fields no earlier row has, each with its
/// first occurrence's hidden columns.
fn distinct_rows(batches: &[RecordBatch]) -> Result<Vec<RecordBatch>, String> {
    use arrow::row::{RowConverter, SortField};
    let Some(first) = batches.first() else {
        return Ok(vec![]);
    };
    let user = riverbank_elements::columns::user_batch(first);
    let conv = RowConverter::new(
        user.schema()
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect(),
    )
    .map_err(|e| e.to_string())?;
    let converted = batches
        .iter()
        .map(|b| conv.convert_columns(riverbank_elements::columns::user_batch(b).columns()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let mut seen: std::collections::HashSet<&[u8]> = std::collections::HashSet::new();
    let mut out = vec![];
    for (b, rows) in batches.iter().zip(&converted) {
        let keep: arrow::array::BooleanArray =
            rows.iter().map(|r| Some(seen.insert(r.data()))).collect();
        let f = arrow::compute::filter_record_batch(b, &keep).map_err(|e| e.to_string())?;
        if f.num_rows() > 0 {
            out.push(f);
        }
    }
    Ok(out)
}

/// The side inputs' rows the shard keeps, per input.
fn side_rows(
    store: &super::state::ShardStore,
    inputs: usize,
    name: &str,
) -> Result<Vec<Vec<RecordBatch>>, RunError> {
    let mut tables = vec![vec![]; inputs];
    for (k, bytes) in store.scan(SIDE).map_err(open::state_err(name))? {
        let i = u16::from_be_bytes([k[0], k[1]]) as usize;
        let batches = from_ipc(&bytes).map_err(|e| RunError::transform(name, e))?;
        tables
            .get_mut(i)
            .ok_or_else(|| RunError::transform(name, "side rows of an unknown input"))?
            .extend(batches);
    }
    Ok(tables)
}

/// Deletes the side rows kept of each input this checkpoint brings a new read of (a file read
/// with a `refresh_interval`): the new read's rows, kept under this checkpoint, replace them,
/// in every shard. One range deletion per input, the rows not read.
pub(crate) fn drop_replaced_side_rows(
    store: &mut super::state::ShardStore,
    op: &riverbank_engine::compile::SqlOp,
    collections: &[String],
    ctx: &CheckpointCtx,
    name: &str,
) -> Result<(), RunError> {
    for (i, c) in collections.iter().enumerate() {
        if op.refreshed(c, ctx) {
            store
                .delete_range(SIDE, &side_key(i, 0), &side_key(i, ctx.id))
                .map_err(open::state_err(name))?;
        }
    }
    Ok(())
}

fn side_key(input: usize, checkpoint: u64) -> Vec<u8> {
    let mut k = (input as u16).to_be_bytes().to_vec();
    k.extend_from_slice(&checkpoint.to_be_bytes());
    k
}

fn buffer_key(w: &[u8; 16], input: usize, checkpoint: u64) -> Vec<u8> {
    let mut k = w.to_vec();
    k.extend_from_slice(&(input as u16).to_be_bytes());
    k.extend_from_slice(&checkpoint.to_be_bytes());
    k
}

pub(crate) fn ipc(batches: &[RecordBatch]) -> Result<Vec<u8>, String> {
    let schema = batches[0].schema();
    let mut w = arrow::ipc::writer::StreamWriter::try_new_with_options(
        Vec::new(),
        &schema,
        riverbank_engine::shuffle::ipc_write_options(),
    )
    .map_err(|e| e.to_string())?;
    for b in batches {
        w.write(b).map_err(|e| e.to_string())?;
    }
    w.into_inner().map_err(|e| e.to_string())
}

pub(crate) fn from_ipc(bytes: &[u8]) -> Result<Vec<RecordBatch>, String> {
    arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)
        .map_err(|e| e.to_string())?
        .map(|b| b.map_err(|e| e.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, AsArray, Int64Array, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::SchemaRef;
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use riverbank_elements::columns::{TS, WINDOW_END, WINDOW_START, ts_field};
    use riverbank_engine::compile::SqlOp;
    use riverbank_pipeline::trigger::{AccumulationMode, Triggering};
    use std::sync::Arc;

    const S: i64 = 1_000_000;

    fn user() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("v", DataType::Int64, false),
        ]))
    }

    /// Rows (key, value, event time) in 10-s fixed windows, with the hidden columns.
    fn rows(rows: &[(&str, i64, i64)]) -> RecordBatch {
        let mut fields: Vec<Field> = user().fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.extend([ts_field(TS), ts_field(WINDOW_START), ts_field(WINDOW_END)]);
        let ts = |f: &dyn Fn(i64) -> i64| -> ArrayRef {
            Arc::new(
                TimestampMicrosecondArray::from_iter_values(rows.iter().map(|r| f(r.2)))
                    .with_timezone("UTC"),
            )
        };
        let start = |t: i64| t - t.rem_euclid(10 * S);
        RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                ts(&|t| t),
                ts(&start),
                ts(&|t| start(t) + 10 * S),
            ],
        )
        .unwrap()
    }

    fn op(query: &str, tables: &[(&str, &str)], out: Vec<Field>, t: Triggering) -> SqlOp {
        let mut fields = out;
        fields.extend([ts_field(WINDOW_START), ts_field(WINDOW_END), ts_field(TS)]);
        SqlOp {
            query: query.into(),
            tables: tables
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            windowed: true,
            side_tables: vec![],
            triggering: t,
            output_schema: Arc::new(Schema::new(fields)),
            session_keys: None,
            keyed: None,
            columns: None,
            bounded_inputs: Default::default(),
            refreshing: Default::default(),
            extreme: None,
            set_tables: vec![],
        }
    }

    struct Run<'a> {
        op: &'a SqlOp,
        prefix: String,
        collections: Vec<String>,
    }

    impl Run<'_> {
        async fn checkpoint(
            &self,
            dir: &Path,
            id: u64,
            watermarks: (i64, i64),
            inputs: Vec<Vec<RecordBatch>>,
        ) -> ShardOutput {
            let ctx = CheckpointCtx {
                id,
                watermark_in: watermarks.0,
                watermark: watermarks.1,
                now_us: 0,
                start_us: 0,
                state_prefix: self.prefix.clone(),
                new_states: vec![],
                refreshed: vec![],
            };
            let which = SqlShard {
                op: self.op,
                name: "Pairs",
                shard: 0,
                schemas: vec![user(); self.op.tables.len()],
                cache_bytes: 1 << 20,
                collections: self.collections.clone(),
                inputs,
            };
            run(which, &ctx, dir).await.unwrap()
        }
    }

    /// (output column 0 as text, column 1) of every fired row, and each row's window start.
    fn fired(out: &ShardOutput) -> Vec<(String, i64, i64)> {
        let mut v = vec![];
        for b in &out.fired {
            let ws = b.column_by_name(WINDOW_START).unwrap();
            let ws = ws.as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
            let a = arrow::compute::cast(b.column(0), &DataType::Utf8).unwrap();
            for i in 0..b.num_rows() {
                v.push((
                    a.as_string::<i32>().value(i).to_string(),
                    b.column(1).as_primitive::<Int64Type>().value(i),
                    ws.value(i) / S,
                ));
            }
        }
        v.sort();
        v
    }

    /// One checkpoint: the worker it runs on, each input collection's rows, and the
    /// watermarks in and out.
    type Step = (&'static str, Vec<Vec<RecordBatch>>, (i64, i64));

    /// `steps` on a new shard of `op`: every row fired, and the bytes of state its
    /// checkpoints uploaded.
    async fn run_steps(
        op: &SqlOp,
        collections: &[&str],
        steps: &[Step],
    ) -> (Vec<(String, i64, i64)>, u64) {
        let dir = tempfile::tempdir().unwrap();
        let remote = dir.path().join("remote");
        std::fs::create_dir_all(&remote).unwrap();
        let r = Run {
            op,
            prefix: remote.display().to_string(),
            collections: collections.iter().map(|c| c.to_string()).collect(),
        };
        let (mut all, mut bytes) = (vec![], 0);
        for (id, (worker, inputs, marks)) in steps.iter().enumerate() {
            let here = dir.path().join(worker);
            let done = r
                .checkpoint(&here, id as u64 + 1, *marks, inputs.clone())
                .await;
            bytes += done.checkpoint_bytes;
            all.extend(fired(&done));
        }
        all.sort();
        (all, bytes)
    }

    /// A query of the rows with a window's greatest value keeps only those as they arrive
    /// (`SqlOp::extreme`) and fires what it fires over every row: ties, a later greater value,
    /// NULLs (never the greatest), a shard restored elsewhere.
    #[tokio::test]
    async fn a_window_of_the_greatest_rows_keeps_only_those_and_fires_the_same() {
        let q = "SELECT k, v FROM PCOLLECTION WHERE v = (SELECT MAX(v) FROM PCOLLECTION)";
        let out = vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("v", DataType::Int64, true),
        ];
        let plain = op(
            q,
            &[("PCOLLECTION", "C")],
            out.clone(),
            Triggering::default(),
        );
        let mut keeping = op(q, &[("PCOLLECTION", "C")], out, Triggering::default());
        keeping.extreme = Some(Extreme {
            field: "v".into(),
            max: true,
        });
        let many: Vec<(String, i64, i64)> =
            (0..20_000).map(|i| (format!("low{i}"), i % 7, S)).collect();
        let many: Vec<(&str, i64, i64)> =
            many.iter().map(|(k, v, t)| (k.as_str(), *v, *t)).collect();
        let steps: [Step; 4] = [
            (
                "a",
                vec![vec![rows(&many), rows(&[("x", 9, S), ("y", 9, 2 * S)])]],
                (i64::MIN, 2 * S),
            ),
            (
                "a",
                vec![vec![rows(&[("z", 9, 3 * S), ("late", 12, 11 * S)])]],
                (2 * S, 4 * S),
            ),
            (
                "b",
                vec![vec![rows(&[("w", 3, 4 * S), ("q", 9, 5 * S)])]],
                (4 * S, 6 * S),
            ),
            ("b", vec![vec![rows(&[("m", 12, 15 * S)])]], (6 * S, 25 * S)),
        ];
        let (all_rows, all_bytes) = run_steps(&plain, &["C"], &steps).await;
        let (kept_rows, kept_bytes) = run_steps(&keeping, &["C"], &steps).await;
        let want: Vec<(String, i64, i64)> = [
            ("late", 12, 10),
            ("m", 12, 10),
            ("q", 9, 0),
            ("x", 9, 0),
            ("y", 9, 0),
            ("z", 9, 0),
        ]
        .iter()
        .map(|(k, v, w)| (k.to_string(), *v, *w))
        .collect();
        assert_eq!(all_rows, want);
        assert_eq!(kept_rows, want);
        assert!(
            kept_bytes * 4 < all_bytes,
            "kept {kept_bytes} bytes of state against {all_bytes}"
        );
    }

    /// A join of two tables read only as sets (`SqlOp::set_tables`, Nexmark Q8's DISTINCT
    /// people and sellers) keeps each checkpoint's rows without repeats and fires what it
    /// fires over every row.
    #[tokio::test]
    async fn tables_read_as_sets_keep_no_repeats_and_fire_the_same() {
        let q = "SELECT a.k, b.v FROM (SELECT DISTINCT k FROM a) a JOIN (SELECT DISTINCT k, v FROM b) b ON a.k = b.k";
        let out = vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("v", DataType::Int64, false),
        ];
        let tables = [("a", "A"), ("b", "B")];
        let plain = op(q, &tables, out.clone(), Triggering::default());
        let mut sets = op(q, &tables, out, Triggering::default());
        sets.set_tables = vec!["a".into(), "b".into()];
        let repeated = |k: &str, v: i64, n: usize, t: i64| vec![(k.to_string(), v, t); n];
        let batch = |given: Vec<(String, i64, i64)>| {
            let r: Vec<(&str, i64, i64)> =
                given.iter().map(|(k, v, t)| (k.as_str(), *v, *t)).collect();
            rows(&r)
        };
        let steps: [Step; 2] = [
            (
                "a",
                vec![
                    vec![
                        batch(repeated("x", 0, 30_000, S)),
                        batch(repeated("y", 0, 10, 2 * S)),
                    ],
                    vec![batch(repeated("x", 5, 30_000, S))],
                ],
                (i64::MIN, 3 * S),
            ),
            (
                "a",
                vec![
                    vec![batch(repeated("x", 1, 10, 4 * S))],
                    vec![batch(
                        [
                            repeated("x", 5, 10, 4 * S),
                            repeated("x", 6, 2, 5 * S),
                            repeated("z", 1, 1, 5 * S),
                        ]
                        .concat(),
                    )],
                ],
                (3 * S, 25 * S),
            ),
        ];
        let (all_rows, all_bytes) = run_steps(&plain, &["A", "B"], &steps).await;
        let (set_rows, set_bytes) = run_steps(&sets, &["A", "B"], &steps).await;
        let want: Vec<(String, i64, i64)> = vec![("x".into(), 5, 0), ("x".into(), 6, 0)];
        assert_eq!(all_rows, want);
        assert_eq!(set_rows, want);
        assert!(
            set_bytes * 2 < all_bytes,
            "kept {set_bytes} bytes of state against {all_bytes}"
        );
    }

    /// A Join's two inputs of one window arrive in different checkpoints: the window fires
    /// once, at the watermark, over both; a shard restored elsewhere from the checkpoint does
    /// the same; a row of the closed window is dropped and counted.
    #[tokio::test]
    async fn a_window_fires_once_over_the_rows_of_every_checkpoint_and_input() {
        let dir = tempfile::tempdir().unwrap();
        let remote = dir.path().join("remote");
        std::fs::create_dir_all(&remote).unwrap();
        let op = op(
            "SELECT a.k, a.v + b.v AS s FROM a JOIN b ON a.k = b.k",
            &[("a", "A"), ("b", "B")],
            vec![
                Field::new("k", DataType::Utf8, false),
                Field::new("s", DataType::Int64, false),
            ],
            Triggering::default(),
        );
        let r = Run {
            op: &op,
            prefix: remote.display().to_string(),
            collections: vec!["A".into(), "B".into()],
        };
        let here = dir.path().join("worker-a");
        let first = r
            .checkpoint(
                &here,
                1,
                (i64::MIN, 5 * S),
                vec![vec![rows(&[("x", 1, S), ("y", 2, 2 * S)])], vec![]],
            )
            .await;
        assert!(first.fired.is_empty());
        assert_eq!(first.keys, 1);
        let second_in = || {
            vec![
                vec![rows(&[("x", 100, 11 * S)])],
                vec![rows(&[("x", 10, 3 * S), ("x", 20, 12 * S)])],
            ]
        };
        let second = r.checkpoint(&here, 2, (5 * S, 12 * S), second_in()).await;
        assert_eq!(fired(&second), [("x".to_string(), 11, 0)]);
        // Window [10 s, 20 s) is still open; [0, 10 s) is gone.
        assert_eq!(second.keys, 1);
        // The same checkpoint on another worker, restored from checkpoint 1.
        let moved = r
            .checkpoint(
                &dir.path().join("worker-b"),
                2,
                (5 * S, 12 * S),
                second_in(),
            )
            .await;
        assert_eq!(fired(&moved), fired(&second));
        let third = r
            .checkpoint(
                &here,
                3,
                (12 * S, 25 * S),
                vec![vec![rows(&[("y", 5, 4 * S)])], vec![]],
            )
            .await;
        assert_eq!(third.late_dropped, 1);
        assert_eq!(fired(&third), [("x".to_string(), 120, 10)]);
        assert_eq!(third.keys, 0);
    }

    /// With allowed lateness, accumulating: a late row re-fires its window over all of its
    /// rows; once the watermark passes the lateness the window goes.
    #[tokio::test]
    async fn late_rows_within_the_lateness_refire_the_whole_window() {
        let dir = tempfile::tempdir().unwrap();
        let remote = dir.path().join("remote");
        std::fs::create_dir_all(&remote).unwrap();
        let op = op(
            "SELECT MAX(k) AS k, COUNT(*) AS n FROM PCOLLECTION",
            &[("PCOLLECTION", "C")],
            vec![
                Field::new("k", DataType::Utf8, true),
                Field::new("n", DataType::Int64, false),
            ],
            Triggering {
                allowed_lateness_us: 30 * S,
                accumulation: AccumulationMode::Accumulating,
                ..Triggering::default()
            },
        );
        let r = Run {
            op: &op,
            prefix: remote.display().to_string(),
            collections: vec!["C".into()],
        };
        let here = dir.path().join("w");
        let on_time = r
            .checkpoint(
                &here,
                1,
                (i64::MIN, 12 * S),
                vec![vec![rows(&[("a", 1, S)])]],
            )
            .await;
        assert_eq!(fired(&on_time), [("a".to_string(), 1, 0)]);
        let late = r
            .checkpoint(
                &here,
                2,
                (12 * S, 15 * S),
                vec![vec![rows(&[("b", 1, 2 * S)])]],
            )
            .await;
        assert_eq!(late.late_dropped, 0);
        assert_eq!(fired(&late), [("b".to_string(), 2, 0)]);
        let expired = r.checkpoint(&here, 3, (15 * S, 50 * S), vec![vec![]]).await;
        assert!(expired.fired.is_empty());
        assert_eq!(expired.keys, 0);
        let too_late = r
            .checkpoint(
                &here,
                4,
                (50 * S, 60 * S),
                vec![vec![rows(&[("c", 1, 3 * S)])]],
            )
            .await;
        assert_eq!((too_late.late_dropped, too_late.fired.len()), (1, 0));
    }
    /// An early trigger on a Sql's input (after 2 rows, accumulating) fires the window early
    /// over what it has, then on time over all of it.
    #[tokio::test]
    async fn an_early_count_trigger_fires_the_query_before_the_watermark() {
        let dir = tempfile::tempdir().unwrap();
        let remote = dir.path().join("remote");
        std::fs::create_dir_all(&remote).unwrap();
        let triggering = Triggering::parse(
            serde_json::json!({
                "trigger": {"after_watermark": {"early": {"after_count": 2}}},
                "accumulation_mode": "accumulating"
            })
            .as_object()
            .unwrap(),
        )
        .unwrap();
        let op = op(
            "SELECT MAX(k) AS k, COUNT(*) AS n FROM PCOLLECTION",
            &[("PCOLLECTION", "C")],
            vec![
                Field::new("k", DataType::Utf8, true),
                Field::new("n", DataType::Int64, false),
            ],
            triggering,
        );
        let r = Run {
            op: &op,
            prefix: remote.display().to_string(),
            collections: vec!["C".into()],
        };
        let here = dir.path().join("w");
        let one = r
            .checkpoint(&here, 1, (i64::MIN, S), vec![vec![rows(&[("a", 1, S)])]])
            .await;
        assert!(one.fired.is_empty(), "one row: not yet");
        let early = r
            .checkpoint(&here, 2, (S, 2 * S), vec![vec![rows(&[("b", 1, 2 * S)])]])
            .await;
        assert_eq!(fired(&early), [("b".to_string(), 2, 0)]);
        let on_time = r
            .checkpoint(
                &here,
                3,
                (2 * S, 11 * S),
                vec![vec![rows(&[("c", 1, 3 * S)])]],
            )
            .await;
        assert_eq!(fired(&on_time), [("c".to_string(), 3, 0)]);
        assert_eq!(on_time.keys, 0);
    }
}
