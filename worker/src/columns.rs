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

pub fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

pub fn ts_field(name: &str) -> Field {
    Field::new(name, ts_type(), false)
}

pub fn is_hidden(name: &str) -> bool {
    name.starts_with("__rb_")
}

/// The schema users see: hidden columns removed.
pub fn user_schema(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new(schema.fields().iter().filter(|f| !is_hidden(f.name())).cloned().collect::<Vec<_>>()))
}

/// The batch users see: hidden columns removed.
pub fn user_batch(batch: &RecordBatch) -> RecordBatch {
    let keep: Vec<usize> = batch.schema().fields().iter().enumerate().filter(|(_, f)| !is_hidden(f.name())).map(|(i, _)| i).collect();
    if keep.len() == batch.num_columns() {
        return batch.clone();
    }
    batch.project(&keep).expect("projection of existing columns")
}

/// The hidden columns of a batch, with their fields, to carry over to an op's output.
pub fn hidden_columns(batch: &RecordBatch) -> Vec<(Arc<Field>, ArrayRef)> {
    batch.schema().fields().iter().zip(batch.columns()).filter(|(f, _)| is_hidden(f.name())).map(|(f, c)| (f.clone(), c.clone())).collect()
}

pub fn has_window(schema: &Schema) -> bool {
    schema.index_of(WINDOW_START).is_ok()
}
