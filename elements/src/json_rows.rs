//! Conversions between JSON-like elements (Create, AssertEqual, error records, logs) and
//! Arrow record batches.
use crate::columns::user_batch;
use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::json::reader::{ReaderBuilder, infer_json_schema_from_iterator};
use serde_json::Value;
use std::sync::Arc;

/// Builds one batch from elements, inferring the schema as Beam YAML's Create does.
pub fn batch_from_elements(elements: &[Value]) -> Result<RecordBatch, String> {
    let rows: Vec<Value> = elements
        .iter()
        .map(|e| {
            if e.is_object() {
                e.clone()
            } else {
                serde_json::json!({ "element": e })
            }
        })
        .collect();
    let schema = infer_json_schema_from_iterator(rows.iter().map(|v| Ok(v.clone())))
        .map_err(|e| e.to_string())?;
    // Inference widens a field holding strings and numbers (or booleans) to a string, which
    // the decoder then refuses a number for: render those as Python's `str` would.
    let row_type = DataType::Struct(schema.fields().clone());
    let rows: Vec<Value> = rows.iter().map(|r| fit(r, &row_type)).collect();
    batch_from_rows(&rows, Arc::new(schema))
}

/// `v` with every number or boolean in a string-typed place rendered as a string.
fn fit(v: &Value, t: &DataType) -> Value {
    match (v, t) {
        (Value::Object(m), DataType::Struct(fields)) => Value::Object(
            m.iter()
                .map(|(k, x)| {
                    let x = match fields.find(k) {
                        Some((_, f)) => fit(x, f.data_type()),
                        None => x.clone(),
                    };
                    (k.clone(), x)
                })
                .collect(),
        ),
        (Value::Array(a), DataType::List(f)) => {
            Value::Array(a.iter().map(|x| fit(x, f.data_type())).collect())
        }
        (Value::Number(n), DataType::Utf8) => Value::String(match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.to_string(),
            (_, Some(u)) => u.to_string(),
            _ => crate::widen::python_float(n.as_f64().unwrap_or(f64::NAN)),
        }),
        (Value::Bool(b), DataType::Utf8) => {
            Value::String(if *b { "True" } else { "False" }.to_string())
        }
        _ => v.clone(),
    }
}

/// Builds one batch of `schema` from JSON objects.
pub fn batch_from_rows(rows: &[Value], schema: SchemaRef) -> Result<RecordBatch, String> {
    let mut decoder = ReaderBuilder::new(schema.clone())
        .with_batch_size(rows.len().max(1))
        .build_decoder()
        .map_err(|e| e.to_string())?;
    decoder.serialize(rows).map_err(|e| e.to_string())?;
    Ok(decoder
        .flush()
        .map_err(|e| e.to_string())?
        .unwrap_or_else(|| RecordBatch::new_empty(schema)))
}

/// The rows of a batch as JSON objects (hidden columns removed).
pub fn batch_to_rows(batch: &RecordBatch) -> Vec<Value> {
    let b = user_batch(batch);
    let mut buf = Vec::new();
    {
        let mut w = arrow::json::LineDelimitedWriter::new(&mut buf);
        if w.write(&b).is_err() {
            return (0..b.num_rows()).map(|_| Value::Null).collect();
        }
        let _ = w.finish();
    }
    buf.split(|c| *c == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap_or(Value::Null))
        .collect()
}

/// One row as compact JSON, for error messages.
pub fn row_to_string(batch: &RecordBatch, row: usize) -> String {
    batch_to_rows(&batch.slice(row, 1))
        .into_iter()
        .next()
        .map(|v| v.to_string())
        .unwrap_or_default()
}
