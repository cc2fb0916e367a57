//! Element metadata travels as hidden columns of every record batch, so that timestamps and
//! windows cost nothing when unused and are vectorized when used.
//! - `__rb_ts`: the element's event timestamp (absent = the minimum timestamp),
//! - `__rb_ws` / `__rb_we`: its window's bounds (absent = the global window).
use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use std::sync::Arc;

pub const TS: &str = "__rb_ts";
pub const WINDOW_START: &str = "__rb_ws";
pub const WINDOW_END: &str = "__rb_we";
/// The pane a grouped element came out in (Beam's `PaneInfo`), on a windowed Combine's output.
pub const PANE: &str = "__rb_pane";

/// The timestamp of elements that have none, in microseconds: Beam's minimum timestamp
/// (`BoundedWindow.TIMESTAMP_MIN_VALUE`, -9223372036854775 ms), as its sources give them.
pub const MIN_TIMESTAMP_US: i64 = -9_223_372_036_854_775_000;

pub fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

pub fn ts_field(name: &str) -> Field {
    Field::new(name, ts_type(), false)
}

/// Beam's `PaneInfo` as a struct: index, nonspeculative_index, timing, is_first, is_last.
pub fn pane_type() -> DataType {
    DataType::Struct(pane_fields())
}

fn pane_fields() -> arrow::datatypes::Fields {
    arrow::datatypes::Fields::from(vec![
        Field::new("index", DataType::Int64, false),
        Field::new("nonspeculative_index", DataType::Int64, false),
        Field::new("timing", DataType::Utf8, false),
        Field::new("is_first", DataType::Boolean, false),
        Field::new("is_last", DataType::Boolean, false),
    ])
}

/// One pane's description: (index, nonspeculative index, timing, is first, is last).
pub type PaneRow = (i64, i64, &'static str, bool, bool);

/// A pane column of these rows.
pub fn pane_array(rows: &[PaneRow]) -> ArrayRef {
    use arrow::array::{BooleanArray, Int64Array, StringArray, StructArray};
    Arc::new(StructArray::new(
        pane_fields(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))),
            Arc::new(BooleanArray::from_iter(rows.iter().map(|r| Some(r.3)))),
            Arc::new(BooleanArray::from_iter(rows.iter().map(|r| Some(r.4)))),
        ],
        None,
    ))
}

/// The pane of a batch job's grouped output: each window fires once, on time.
pub const ON_TIME_ONLY: PaneRow = (0, 0, "ON_TIME", true, true);
/// The pane of elements never grouped (Beam's `PaneInfo.NO_FIRING`).
pub const NO_FIRING: PaneRow = (0, 0, "UNKNOWN", true, true);

pub fn is_hidden(name: &str) -> bool {
    name.starts_with("__rb_")
}

/// The schema users see: hidden columns removed.
pub fn user_schema(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .filter(|f| !is_hidden(f.name()))
            .cloned()
            .collect::<Vec<_>>(),
    ))
}

/// The batch with only the user fields named in `fields`, and every hidden column, in its own
/// order (what a stateful step keeps of rows it reads a few fields of).
pub fn with_user_fields<S: AsRef<str>>(batch: &RecordBatch, fields: &[S]) -> RecordBatch {
    columns_where(batch, |name| {
        is_hidden(name) || fields.iter().any(|n| n.as_ref() == name)
    })
}

/// The batch users see: hidden columns removed.
pub fn user_batch(batch: &RecordBatch) -> RecordBatch {
    columns_where(batch, |name| !is_hidden(name))
}

/// The columns of `batch` whose names `keep` takes (the batch itself when that is all).
fn columns_where(batch: &RecordBatch, keep: impl Fn(&str) -> bool) -> RecordBatch {
    let at: Vec<usize> = batch
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| keep(f.name()))
        .map(|(i, _)| i)
        .collect();
    if at.len() == batch.num_columns() {
        return batch.clone();
    }
    batch.project(&at).expect("projection of existing columns")
}

/// The hidden columns of a batch, with their fields, to carry over to an op's output.
pub fn hidden_columns(batch: &RecordBatch) -> Vec<(Arc<Field>, ArrayRef)> {
    batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .filter(|(f, _)| is_hidden(f.name()))
        .map(|(f, c)| (f.clone(), c.clone()))
        .collect()
}

/// The window bounds of a windowed batch's rows, (starts, ends) in µs; `None` when the batch has
/// no window columns (the global window).
pub fn window_bounds(batch: &RecordBatch) -> Option<(&[i64], &[i64])> {
    use arrow::array::AsArray;
    use arrow::datatypes::TimestampMicrosecondType as Us;
    let col = |n: &str| {
        batch
            .column_by_name(n)
            .map(|c| c.as_primitive::<Us>().values().as_ref())
    };
    Some((col(WINDOW_START)?, col(WINDOW_END)?))
}

/// A windowed batch's rows grouped by window, (start, end) in µs, in window order; `None`
/// when the batch has no window columns (the global window).
pub fn split_by_window(batch: &RecordBatch) -> Option<Vec<((i64, i64), RecordBatch)>> {
    let schema = batch.schema();
    let (ws, we) = window_bounds(batch)?;
    let mut rows: std::collections::BTreeMap<(i64, i64), Vec<u32>> = Default::default();
    for (i, w) in ws.iter().zip(we).enumerate() {
        rows.entry((*w.0, *w.1)).or_default().push(i as u32);
    }
    if rows.len() == 1 {
        let w = *rows.keys().next().expect("one window");
        return Some(vec![(w, batch.clone())]);
    }
    Some(
        rows.into_iter()
            .map(|(w, idx)| {
                let idx = arrow::array::UInt32Array::from(idx);
                let cols = batch
                    .columns()
                    .iter()
                    .map(|c| arrow::compute::take(c, &idx, None).expect("indices in range"))
                    .collect();
                (
                    w,
                    RecordBatch::try_new(schema.clone(), cols).expect("same schema"),
                )
            })
            .collect(),
    )
}

pub fn has_window(schema: &Schema) -> bool {
    schema.index_of(WINDOW_START).is_ok()
}

/// Elements of Beam SDK pipelines (arriving later through Beam's portable Job API) are opaque:
/// coder-encoded key and value bytes. They travel as ordinary batches of this schema, with the
/// same hidden timestamp and window columns, so shuffles, combines (GroupByKey is `group` keyed
/// by `key`) and sinks carry them unchanged.
pub fn encoded_schema(windowed: bool) -> SchemaRef {
    let mut fields = vec![
        Field::new("key", DataType::Binary, true),
        Field::new("value", DataType::Binary, false),
        ts_field(TS),
    ];
    if windowed {
        fields.push(ts_field(WINDOW_START));
        fields.push(ts_field(WINDOW_END));
    }
    Arc::new(Schema::new(fields))
}
