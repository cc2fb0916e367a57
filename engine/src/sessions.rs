//! Session windows: each element starts as its own window `[t, t+gap)`; at the grouping step,
//! overlapping windows of the same key merge into one session (Beam's merging WindowFn).
use arrow::array::{ArrayRef, AsArray, RecordBatch, TimestampMicrosecondArray};
use arrow::compute::concat_batches;
use arrow::datatypes::TimestampMicrosecondType;
use arrow::row::{RowConverter, SortField};
use riverbank_elements::columns::{WINDOW_END, WINDOW_START};
use std::sync::Arc;

/// Rewrites the window columns of partial-combine states so that each row carries its merged
/// session. `num_keys` user key columns come first, then the window bounds.
pub fn merge_windows(states: &[RecordBatch], num_keys: usize) -> Result<Vec<RecordBatch>, String> {
    if states.is_empty() {
        return Ok(vec![]);
    }
    let all = concat_batches(&states[0].schema(), states).map_err(|e| e.to_string())?;
    let schema = all.schema();
    let (si, ei) = (
        schema.index_of(WINDOW_START).map_err(|e| e.to_string())?,
        schema.index_of(WINDOW_END).map_err(|e| e.to_string())?,
    );
    let ws = all
        .column(si)
        .as_primitive::<TimestampMicrosecondType>()
        .values()
        .to_vec();
    let we = all
        .column(ei)
        .as_primitive::<TimestampMicrosecondType>()
        .values()
        .to_vec();
    let fields: Vec<SortField> = (0..num_keys)
        .map(|i| SortField::new(schema.field(i).data_type().clone()))
        .collect();
    let conv = RowConverter::new(fields).map_err(|e| e.to_string())?;
    let rows = conv
        .convert_columns(&all.columns()[..num_keys])
        .map_err(|e| e.to_string())?;
    let mut order: Vec<usize> = (0..all.num_rows()).collect();
    order.sort_by(|&a, &b| rows.row(a).cmp(&rows.row(b)).then(ws[a].cmp(&ws[b])));
    let (mut new_ws, mut new_we) = (ws.clone(), we.clone());
    let mut i = 0;
    while i < order.len() {
        // One run of overlapping windows of one key.
        let (start, mut end) = (ws[order[i]], we[order[i]]);
        let mut j = i + 1;
        while j < order.len() && rows.row(order[j]) == rows.row(order[i]) && ws[order[j]] < end {
            end = end.max(we[order[j]]);
            j += 1;
        }
        for &k in &order[i..j] {
            new_ws[k] = start;
            new_we[k] = end;
        }
        i = j;
    }
    let mut cols: Vec<ArrayRef> = all.columns().to_vec();
    cols[si] = Arc::new(TimestampMicrosecondArray::from(new_ws).with_timezone("UTC"));
    cols[ei] = Arc::new(TimestampMicrosecondArray::from(new_we).with_timezone("UTC"));
    Ok(vec![
        RecordBatch::try_new(schema, cols).map_err(|e| e.to_string())?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};

    #[test]
    fn overlapping_windows_of_a_key_merge_and_other_keys_do_not() {
        let ts = riverbank_elements::columns::ts_type();
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", arrow::datatypes::DataType::Utf8, false),
            Field::new(WINDOW_START, ts.clone(), false),
            Field::new(WINDOW_END, ts, false),
            Field::new("n", arrow::datatypes::DataType::Int64, false),
        ]));
        let t = |v: Vec<i64>| {
            Arc::new(TimestampMicrosecondArray::from(v).with_timezone("UTC")) as ArrayRef
        };
        let b = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec!["a", "a", "a", "b"])),
                t(vec![0, 5, 100, 3]),
                t(vec![10, 15, 110, 13]),
                Arc::new(Int64Array::from(vec![1, 1, 1, 1])),
            ],
        )
        .unwrap();
        let out = &merge_windows(&[b], 1).unwrap()[0];
        let ws = out
            .column(1)
            .as_primitive::<TimestampMicrosecondType>()
            .values()
            .to_vec();
        let we = out
            .column(2)
            .as_primitive::<TimestampMicrosecondType>()
            .values()
            .to_vec();
        assert_eq!(ws, vec![0, 0, 100, 3]);
        assert_eq!(we, vec![15, 15, 110, 13]);
    }
}
