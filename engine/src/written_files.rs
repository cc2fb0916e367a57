//! A file sink's output: the files it wrote, as Beam's file sinks give them (`FileResult`'s
//! `file_name`, `shard_index` and `total_shards`; batch jobs have one window and pane, and
//! Riverbank's sinks no dynamic destinations, so the other fields would say nothing). The
//! files exist once the sink is committed: the planner gives a read sink a commit stage after
//! the stages writing it, whose one item commits the parts and emits these rows.
use crate::error::RunError;
use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use riverbank_io::{self as io, TempPart};
use std::sync::Arc;

/// The schema of a file sink's output.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("file_name", DataType::Utf8, false),
        Field::new("shard_index", DataType::Int64, false),
        Field::new("total_shards", DataType::Int64, false),
    ]))
}

/// Commits sink `name`'s parts (again, if an earlier attempt did: committing is idempotent, and
/// the job's end commits every sink once more) and gives the files written, in shard order.
pub async fn commit(
    name: &str,
    options: &io::WriteOptions,
    schema: &SchemaRef,
    parts: Vec<TempPart>,
) -> Result<RecordBatch, RunError> {
    let files = io::commit_sink(options, Some(schema.clone()), parts)
        .await
        .map_err(|e| RunError::transform(name, format!("committing {}: {e}", options.path)))?;
    Ok(batch(&files))
}

fn batch(files: &[String]) -> RecordBatch {
    let total = files.len() as i64;
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(StringArray::from_iter_values(files)),
            Arc::new(Int64Array::from_iter_values(0..total)),
            Arc::new(Int64Array::from_iter_values(files.iter().map(|_| total))),
        ],
    )
    .expect("columns match the schema")
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_row_per_file_in_shard_order() {
        let b = super::batch(&[
            "/o/x.json-00000-of-00002".into(),
            "/o/x.json-00001-of-00002".into(),
        ]);
        let rows = riverbank_elements::json_rows::batch_to_rows(&b);
        assert_eq!(
            rows,
            vec![
                serde_json::json!({"file_name": "/o/x.json-00000-of-00002", "shard_index": 0, "total_shards": 2}),
                serde_json::json!({"file_name": "/o/x.json-00001-of-00002", "shard_index": 1, "total_shards": 2}),
            ]
        );
    }
}
