//! Session windows: each element starts as its own window `[t, t+gap)`; at the grouping step,
//! overlapping windows of the same key merge into one session (Beam's merging WindowFn): a
//! Combine's partial states (`merge_windows`), a Sql's or Join's inputs (`merge_across`).
use arrow::array::{ArrayRef, RecordBatch, TimestampMicrosecondArray};
use arrow::compute::concat_batches;
use arrow::row::{RowConverter, SortField};
use riverbank_elements::columns::{WINDOW_END, WINDOW_START, window_bounds};
use std::sync::Arc;

/// Rewrites the window columns of partial-combine states so that each row carries its merged
/// session. `num_keys` user key columns come first, then the window bounds.
pub fn merge_windows(states: &[RecordBatch], num_keys: usize) -> Result<Vec<RecordBatch>, String> {
    let Some(first) = states.first() else {
        return Ok(vec![]);
    };
    let keys: Vec<String> = first.schema().fields()[..num_keys]
        .iter()
        .map(|f| f.name().clone())
        .collect();
    Ok(merge_across(vec![states.to_vec()], &[keys])?
        .pop()
        .unwrap_or_default())
}

/// Sessions merged across the inputs of a Sql or Join, by key: rows of any input whose keys are
/// equal and whose windows overlap all get the one merged session, as a CoGroupByKey with a
/// merging window fn merges them. `keys[i]` names input `i`'s key columns, part by part in the
/// same order for every input (their types are widened to one, as Flatten widens).
pub fn merge_across(
    inputs: Vec<Vec<RecordBatch>>,
    keys: &[Vec<String>],
) -> Result<Vec<Vec<RecordBatch>>, String> {
    Ok(merge_across_sessions(inputs, keys)?.0)
}

/// [`merge_across`], and which merged session each row is in: per input, one batch of its rows
/// (in order) and their session numbers (equal for rows of one session, whichever input).
#[allow(clippy::type_complexity)]
pub fn merge_across_sessions(
    inputs: Vec<Vec<RecordBatch>>,
    keys: &[Vec<String>],
) -> Result<(Vec<Vec<RecordBatch>>, Vec<Vec<u64>>), String> {
    use riverbank_elements::widen::{conform_array, unify};
    let inputs: Vec<Option<RecordBatch>> = inputs
        .iter()
        .map(|batches| match batches.first() {
            None => Ok(None),
            Some(b) => concat_batches(&b.schema(), batches)
                .map(Some)
                .map_err(|e| e.to_string()),
        })
        .collect::<Result<_, String>>()?;
    // Each key part's type: every input's, widened to one. No key part (a global aggregate):
    // one key for every row, a constant.
    let parts = keys.first().map_or(0, Vec::len);
    let mut types: Vec<arrow::datatypes::DataType> = match parts {
        0 => vec![arrow::datatypes::DataType::Boolean],
        n => vec![arrow::datatypes::DataType::Null; n],
    };
    let column = |b: &RecordBatch, name: &str| {
        b.column_by_name(name)
            .cloned()
            .ok_or_else(|| format!("no key field '{name}'"))
    };
    for (b, k) in inputs.iter().zip(keys) {
        if let Some(b) = b {
            for (t, name) in types.iter_mut().zip(k) {
                *t = unify(t, column(b, name)?.data_type());
            }
        }
    }
    let conv = RowConverter::new(types.iter().map(|t| SortField::new(t.clone())).collect())
        .map_err(|e| e.to_string())?;
    // (input, row, window start, window end) of every row
    let mut all = vec![];
    let mut rows_of = vec![];
    for (i, (b, k)) in inputs.iter().zip(keys).enumerate() {
        let Some(b) = b else {
            rows_of.push(None);
            continue;
        };
        let cols = match parts {
            0 => vec![arrow::array::new_null_array(&types[0], b.num_rows())],
            _ => k
                .iter()
                .zip(&types)
                .map(|(name, t)| conform_array(&column(b, name)?, t))
                .collect::<Result<Vec<_>, String>>()?,
        };
        let rows = conv.convert_columns(&cols).map_err(|e| e.to_string())?;
        let (ws, we) = window_bounds(b).ok_or("input is not windowed")?;
        for r in 0..b.num_rows() {
            all.push((i, r, ws[r], we[r]));
        }
        rows_of.push(Some(rows));
    }
    let key = |&(i, r, _, _): &(usize, usize, i64, i64)| {
        rows_of[i]
            .as_ref()
            .expect("rows of a non-empty input")
            .row(r)
    };
    all.sort_by(|a, b| key(a).cmp(&key(b)).then(a.2.cmp(&b.2)));
    let mut merged: Vec<Vec<(i64, i64)>> = inputs
        .iter()
        .map(|b| b.as_ref().map_or(vec![], |b| vec![(0, 0); b.num_rows()]))
        .collect();
    let mut sessions: Vec<Vec<u64>> = merged.iter().map(|m| vec![0; m.len()]).collect();
    let mut session = 0u64;
    let mut i = 0;
    while i < all.len() {
        // One run of overlapping windows of one key, across the inputs.
        let (start, mut end) = (all[i].2, all[i].3);
        let mut j = i + 1;
        while j < all.len() && key(&all[j]) == key(&all[i]) && all[j].2 < end {
            end = end.max(all[j].3);
            j += 1;
        }
        for &(input, row, _, _) in &all[i..j] {
            merged[input][row] = (start, end);
            sessions[input][row] = session;
        }
        session += 1;
        i = j;
    }
    let batches = inputs
        .into_iter()
        .zip(merged)
        .map(|(b, windows)| match b {
            None => Ok(vec![]),
            Some(b) => with_windows(&b, &windows).map(|b| vec![b]),
        })
        .collect::<Result<_, String>>()?;
    Ok((batches, sessions))
}

/// `b` with its window columns set to `windows`.
fn with_windows(b: &RecordBatch, windows: &[(i64, i64)]) -> Result<RecordBatch, String> {
    let schema = b.schema();
    let mut cols: Vec<ArrayRef> = b.columns().to_vec();
    for (name, pick) in [
        (
            WINDOW_START,
            (|w: &(i64, i64)| w.0) as fn(&(i64, i64)) -> i64,
        ),
        (WINDOW_END, |w| w.1),
    ] {
        let i = schema.index_of(name).map_err(|e| e.to_string())?;
        cols[i] = Arc::new(
            TimestampMicrosecondArray::from(windows.iter().map(pick).collect::<Vec<_>>())
                .with_timezone("UTC"),
        );
    }
    RecordBatch::try_new(schema, cols).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::AsArray;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::TimestampMicrosecondType;
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
