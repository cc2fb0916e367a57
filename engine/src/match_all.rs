//! Beam's `MatchAll`: each row's pattern → a row per file it matches (`path`, `size_in_bytes`,
//! `last_updated_in_seconds`), the row's timestamp and window carried to each. Files are
//! listed through `riverbank_io` (local paths and object stores alike).
use arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, Int64Array, RecordBatch, StringArray, UInt32Array,
};
use arrow::compute::{cast, take};
use arrow::datatypes::{DataType, Field, SchemaRef};
use riverbank_elements::columns::hidden_columns;
use riverbank_pipeline::config::EmptyMatch;
use std::future::Future;
use std::sync::Arc;

/// The user fields `MatchAll` gives.
pub fn output_fields() -> Vec<Field> {
    vec![
        Field::new("path", DataType::Utf8, false),
        Field::new("size_in_bytes", DataType::Int64, false),
        Field::new("last_updated_in_seconds", DataType::Float64, true),
    ]
}

/// The matches of every row of `batch` (its user field `field` holds the pattern), in
/// `schema`.
pub fn apply(
    batch: &RecordBatch,
    field: &str,
    empty: EmptyMatch,
    schema: &SchemaRef,
) -> Result<RecordBatch, String> {
    let user = riverbank_elements::columns::user_batch(batch);
    let column = user
        .column_by_name(field)
        .ok_or_else(|| format!("no field '{field}'"))?;
    let patterns = cast(column, &DataType::Utf8).map_err(|e| e.to_string())?;
    let patterns = patterns.as_string::<i32>();
    let (mut rows, mut paths, mut sizes, mut updated) = (vec![], vec![], vec![], vec![]);
    for i in 0..patterns.len() {
        if patterns.is_null(i) {
            return Err("the pattern is null".into());
        }
        let pattern = patterns.value(i);
        let (files, wildcard) = block_on(riverbank_io::match_files(pattern))
            .map_err(|e| format!("cannot match '{pattern}': {e}"))?;
        let allowed = match empty {
            EmptyMatch::Allow => true,
            EmptyMatch::Disallow => false,
            EmptyMatch::AllowIfWildcard => wildcard,
        };
        if files.is_empty() && !allowed {
            return Err(format!(
                "no file matches '{pattern}' (empty_match_treatment: {empty:?})"
            ));
        }
        for f in files {
            rows.push(i as u32);
            paths.push(f.location);
            sizes.push(f.size as i64);
            updated.push(f.last_modified.timestamp_micros() as f64 / 1e6);
        }
    }
    let rows = UInt32Array::from(rows);
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(paths)),
        Arc::new(Int64Array::from(sizes)),
        Arc::new(Float64Array::from(updated)),
    ];
    for (_, c) in hidden_columns(batch) {
        columns.push(take(&c, &rows, None).map_err(|e| e.to_string())?);
    }
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string())
}

/// Runs a listing from the synchronous op: on the worker's runtime when it has threads to
/// spare, else on a runtime of its own in a scoped thread.
fn block_on<F: Future + Send>(f: F) -> F::Output
where
    F::Output: Send,
{
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| h.block_on(f))
        }
        _ => std::thread::scope(|s| {
            s.spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for a file listing")
                    .block_on(f)
            })
            .join()
            .expect("the listing thread does not panic")
        }),
    }
}
