//! Conversions between JSON-like elements (Create, AssertEqual, error records, logs) and
//! Arrow record batches (an `Any` value is the JSON value itself both ways).
use crate::any;
use crate::columns::user_batch;
use crate::widen::unify;
use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use arrow::json::reader::ReaderBuilder;
use serde_json::Value;
use std::sync::Arc;

/// Builds one batch from elements, inferring the schema as Beam YAML's Create does: each
/// element's own types, widened to one schema (`widen`; a field whose values have several
/// types is `Any` and keeps them).
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
    let fields = match rows.iter().map(type_of).reduce(|a, b| unify(&a, &b)) {
        Some(DataType::Struct(fields)) => fields,
        _ => Fields::empty(),
    };
    batch_from_rows(&rows, Arc::new(Schema::new(fields)))
}

/// The type of one JSON value as Create gives it: integers `Int64`, other numbers `Float64`,
/// arrays by their items, objects field by field (all nullable).
fn type_of(v: &Value) -> DataType {
    match v {
        Value::Null => DataType::Null,
        Value::Bool(_) => DataType::Boolean,
        Value::Number(n) if n.is_i64() => DataType::Int64,
        Value::Number(_) => DataType::Float64,
        Value::String(_) => DataType::Utf8,
        Value::Array(a) => DataType::new_list(
            a.iter()
                .map(type_of)
                .reduce(|a, b| unify(&a, &b))
                .unwrap_or(DataType::Null),
            true,
        ),
        Value::Object(m) => DataType::Struct(
            m.iter()
                .map(|(k, x)| Field::new(k, type_of(x), true))
                .collect(),
        ),
    }
}

/// `v` made what arrow's decoder reads for type `t`: a value in an `Any` place becomes the
/// struct holding its JSON text.
fn fit(v: &Value, t: &DataType) -> Value {
    match (v, t) {
        (Value::Null, _) => Value::Null,
        (v, t) if any::is_any(t) => serde_json::json!({ any::FIELD: v.to_string() }),
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
        _ => v.clone(),
    }
}

/// Builds one batch of `schema` from JSON objects.
pub fn batch_from_rows(rows: &[Value], schema: SchemaRef) -> Result<RecordBatch, String> {
    let mut decoder = ReaderBuilder::new(schema.clone())
        .with_batch_size(rows.len().max(1))
        .build_decoder()
        .map_err(|e| e.to_string())?;
    let row_type = DataType::Struct(schema.fields().clone());
    let rows: Vec<Value> = rows.iter().map(|r| fit(r, &row_type)).collect();
    decoder.serialize(&rows).map_err(|e| e.to_string())?;
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
        let mut w = arrow::json::WriterBuilder::new()
            .with_encoder_factory(any::encoders())
            .build::<_, arrow::json::writer::LineDelimited>(&mut buf);
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
