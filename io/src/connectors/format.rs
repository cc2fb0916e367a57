//! Records ⇄ Arrow for the connectors' formats. RAW: one `payload` bytes column; STRING: one
//! `payload` string column; JSON: one object a record, typed by a JSON schema; AVRO: one
//! binary datum a record (no container), typed by an Avro schema. Decoding never fails on a
//! bad record: it comes back as a `BadRecord` naming its partition and offset, for the
//! runtime's `error_handling`. The event time of each row is the record's timestamp, or the
//! source's `timestamp` field.

use std::io::Cursor;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryArray, Int64Array, LargeBinaryArray, LargeStringArray, RecordBatch,
    StringArray, StringViewArray, TimestampMicrosecondArray, TimestampMillisecondArray,
    TimestampNanosecondArray, TimestampSecondArray,
};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use riverbank_pipeline::config::{ConnectorSinkConfig, ConnectorSourceConfig, RecordFormat};
use serde_json::Value;

use super::{ConnectorError, LogRecord, OutRecord};

/// The column RAW and STRING records decode into.
pub const PAYLOAD: &str = "payload";

/// The Arrow schema rows of a source have, from its config alone (no connection), so that
/// `riverbank validate` works offline.
pub fn output_schema(cfg: &ConnectorSourceConfig) -> Result<SchemaRef, String> {
    let schema = match &cfg.format {
        RecordFormat::Raw => Schema::new(vec![Field::new(PAYLOAD, DataType::Binary, true)]),
        RecordFormat::String => Schema::new(vec![Field::new(PAYLOAD, DataType::Utf8, true)]),
        RecordFormat::Json { schema } => {
            let s = schema.as_ref().ok_or("format JSON needs a schema")?;
            match json_type(s)? {
                (DataType::Struct(fields), _) => Schema::new(fields),
                _ => return Err("the JSON schema must be of type object".into()),
            }
        }
        RecordFormat::Avro { schema } => {
            let s = avro_schema(schema.as_ref())?;
            match avro_type(&s)? {
                (DataType::Struct(fields), _) => Schema::new(fields),
                _ => return Err("the Avro schema must be a record".into()),
            }
        }
    };
    if let Some(ts) = &cfg.timestamp {
        let f = schema
            .field_with_name(ts)
            .map_err(|_| format!("timestamp field '{ts}' is not a field of the records"))?;
        if !timestamp_type(f.data_type()) {
            return Err(format!(
                "timestamp field '{ts}' is {}: it must be a timestamp, an integer (epoch milliseconds) or a string (RFC 3339)",
                f.data_type()
            ));
        }
    }
    Ok(Arc::new(schema))
}

fn timestamp_type(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int64
            | DataType::Int32
            | DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Timestamp(_, _)
    )
}

/// A JSON schema as Arrow: (type, nullable). `required` properties are not nullable.
fn json_type(s: &Value) -> Result<(DataType, bool), String> {
    let (name, nullable) = match s.get("type") {
        Some(Value::String(t)) => (t.as_str(), false),
        // `[T, "null"]`: a nullable T.
        Some(Value::Array(ts)) => {
            let names: Vec<&str> = ts.iter().filter_map(Value::as_str).collect();
            let non_null: Vec<&str> = names.iter().copied().filter(|t| *t != "null").collect();
            match non_null.as_slice() {
                [t] => (*t, names.contains(&"null")),
                _ => return Err(format!("type {s} must be one type, or one type and null")),
            }
        }
        _ => return Err(format!("schema {s} has no 'type'")),
    };
    let t = match name {
        "string" => match s.get("format").and_then(Value::as_str) {
            Some("date-time") => DataType::Timestamp(TimeUnit::Microsecond, None),
            _ => DataType::Utf8,
        },
        "integer" => DataType::Int64,
        "number" => DataType::Float64,
        "boolean" => DataType::Boolean,
        "array" => {
            let items = s.get("items").ok_or("an array schema needs 'items'")?;
            let (it, _) = json_type(items)?;
            DataType::List(Arc::new(Field::new("item", it, true)))
        }
        "object" => {
            let props = s
                .get("properties")
                .and_then(Value::as_object)
                .ok_or("an object schema needs 'properties'")?;
            let required: Vec<&str> = s
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let fields = props
                .iter()
                .map(|(k, v)| {
                    let (t, nullable) = json_type(v).map_err(|e| format!("{k}: {e}"))?;
                    Ok(Field::new(
                        k,
                        t,
                        nullable || !required.contains(&k.as_str()),
                    ))
                })
                .collect::<Result<Vec<_>, String>>()?;
            DataType::Struct(Fields::from(fields))
        }
        other => return Err(format!("unsupported JSON schema type '{other}'")),
    };
    Ok((t, nullable))
}

fn avro_schema(s: Option<&Value>) -> Result<apache_avro::Schema, String> {
    let s = s.ok_or("format AVRO needs a schema")?;
    apache_avro::Schema::parse(s).map_err(|e| format!("invalid Avro schema: {e}"))
}

/// An Avro schema as Arrow: (type, nullable). `bytes`/`fixed` are not supported yet.
fn avro_type(s: &apache_avro::Schema) -> Result<(DataType, bool), String> {
    use apache_avro::Schema as A;
    Ok(match s {
        A::Boolean => (DataType::Boolean, false),
        A::Int | A::Date | A::TimeMillis => (DataType::Int32, false),
        A::Long | A::TimeMicros => (DataType::Int64, false),
        A::TimestampMillis | A::LocalTimestampMillis => {
            (DataType::Timestamp(TimeUnit::Millisecond, None), false)
        }
        A::TimestampMicros | A::LocalTimestampMicros => {
            (DataType::Timestamp(TimeUnit::Microsecond, None), false)
        }
        A::Float => (DataType::Float32, false),
        A::Double => (DataType::Float64, false),
        A::String | A::Uuid | A::Enum(_) => (DataType::Utf8, false),
        A::Array(a) => {
            let (t, n) = avro_type(&a.items)?;
            (DataType::List(Arc::new(Field::new("item", t, n))), false)
        }
        A::Record(r) => {
            let fields = r
                .fields
                .iter()
                .map(|f| {
                    let (t, n) = avro_type(&f.schema).map_err(|e| format!("{}: {e}", f.name))?;
                    Ok(Field::new(&f.name, t, n))
                })
                .collect::<Result<Vec<_>, String>>()?;
            (DataType::Struct(Fields::from(fields)), false)
        }
        A::Union(u) => {
            let non_null: Vec<&A> = u.variants().iter().filter(|v| **v != A::Null).collect();
            match non_null.as_slice() {
                [one] => (avro_type(one)?.0, true),
                _ => return Err("only unions of one type and null are supported".into()),
            }
        }
        other => return Err(format!("Avro type {other:?} is not supported yet")),
    })
}

/// A bad record: it could not be decoded (or gave no event time).
#[derive(Debug, Clone, PartialEq)]
pub struct BadRecord {
    pub partition: u32,
    pub offset: u64,
    pub value: Option<Vec<u8>>,
    pub message: String,
}

/// The error output of a connector source (`error_handling`), shaped as every error output
/// (`element`, `msg`, `stack`): the element is the record where it was (partition, offset)
/// and its value as text (lossy UTF-8; null for a record without one).
pub fn bad_record_schema() -> arrow::datatypes::SchemaRef {
    use arrow::datatypes::{DataType, Field, Fields, Schema};
    let element = Fields::from(vec![
        Field::new("partition", DataType::Int64, false),
        Field::new("offset", DataType::Int64, false),
        Field::new("value", DataType::Utf8, true),
    ]);
    std::sync::Arc::new(Schema::new(vec![
        Field::new("element", DataType::Struct(element), false),
        Field::new("msg", DataType::Utf8, false),
        Field::new("stack", DataType::Utf8, false),
    ]))
}

/// Bad records of source `transform` as rows of [`bad_record_schema`].
pub fn bad_record_batch(transform: &str, bad: &[BadRecord]) -> RecordBatch {
    use arrow::array::{ArrayRef, Int64Array, StringArray, StructArray};
    let schema = bad_record_schema();
    let arrow::datatypes::DataType::Struct(fields) = schema.field(0).data_type().clone() else {
        unreachable!("element is a struct")
    };
    let element = StructArray::new(
        fields,
        vec![
            std::sync::Arc::new(Int64Array::from_iter_values(
                bad.iter().map(|b| i64::from(b.partition)),
            )) as ArrayRef,
            std::sync::Arc::new(Int64Array::from_iter_values(
                bad.iter().map(|b| b.offset as i64),
            )),
            std::sync::Arc::new(StringArray::from_iter(bad.iter().map(|b| {
                b.value
                    .as_ref()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            }))),
        ],
        None,
    );
    let stack = format!("in transform '{transform}'");
    RecordBatch::try_new(
        schema,
        vec![
            std::sync::Arc::new(element),
            std::sync::Arc::new(StringArray::from_iter_values(
                bad.iter().map(|b| &b.message),
            )),
            std::sync::Arc::new(StringArray::from_iter_values(bad.iter().map(|_| &stack))),
        ],
    )
    .expect("columns of the schema")
}

/// A decoded batch: rows in record order, their event times, and the records that failed.
#[derive(Debug)]
pub struct Decoded {
    pub batch: RecordBatch,
    /// Event time of each row, microseconds since the epoch.
    pub event_time_us: Int64Array,
    /// Offset of each row's record.
    pub offsets: Vec<u64>,
    pub bad: Vec<BadRecord>,
}

/// Decodes records of one source into rows.
pub struct Decoder {
    transform: String,
    format: RecordFormat,
    schema: SchemaRef,
    avro: Option<apache_avro::Schema>,
    timestamp: Option<usize>,
}

impl Decoder {
    /// `transform` names the source in errors.
    pub fn new(transform: &str, cfg: &ConnectorSourceConfig) -> Result<Decoder, ConnectorError> {
        let err = |message| ConnectorError::Format {
            transform: transform.to_string(),
            message,
        };
        let schema = output_schema(cfg).map_err(err)?;
        let avro = match &cfg.format {
            RecordFormat::Avro { schema } => Some(avro_schema(schema.as_ref()).map_err(err)?),
            _ => None,
        };
        let timestamp = cfg.timestamp.as_ref().and_then(|t| schema.index_of(t).ok());
        Ok(Decoder {
            transform: transform.to_string(),
            format: cfg.format.clone(),
            schema,
            avro,
            timestamp,
        })
    }

    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Decodes `records` of `partition`; a record that does not decode is a `BadRecord`.
    pub fn decode(&self, partition: u32, records: &[LogRecord]) -> Result<Decoded, ConnectorError> {
        let mut bad = vec![];
        let bad_record = |r: &LogRecord, message: String| BadRecord {
            partition,
            offset: r.offset,
            value: r.value.clone(),
            message,
        };
        let (good, batch): (Vec<&LogRecord>, RecordBatch) = match &self.format {
            RecordFormat::Raw => {
                let col = BinaryArray::from_iter(records.iter().map(|r| r.value.as_deref()));
                (records.iter().collect(), self.batch(vec![Arc::new(col)])?)
            }
            RecordFormat::String => {
                let mut good = vec![];
                let mut strings = vec![];
                for r in records {
                    match r.value.as_deref().map(std::str::from_utf8).transpose() {
                        Ok(s) => {
                            good.push(r);
                            strings.push(s);
                        }
                        Err(e) => bad.push(bad_record(r, format!("not UTF-8: {e}"))),
                    }
                }
                let col = StringArray::from(strings);
                (good, self.batch(vec![Arc::new(col)])?)
            }
            RecordFormat::Json { .. } | RecordFormat::Avro { .. } => {
                let mut good = vec![];
                let mut rows = vec![];
                for r in records {
                    match self.to_json(r.value.as_deref().unwrap_or_default()) {
                        Ok(v) => {
                            good.push(r);
                            rows.push(v);
                        }
                        Err(m) => bad.push(bad_record(r, m)),
                    }
                }
                // The whole batch at once; if any row does not fit the schema, row by row to
                // find which.
                match self.rows_to_batch(&rows) {
                    Ok(b) => (good, b),
                    Err(_) => {
                        let mut kept = vec![];
                        let mut batches = vec![];
                        for (r, row) in good.into_iter().zip(rows) {
                            match self.rows_to_batch(std::slice::from_ref(&row)) {
                                Ok(b) => {
                                    kept.push(r);
                                    batches.push(b);
                                }
                                Err(m) => bad.push(bad_record(r, m)),
                            }
                        }
                        let b = arrow::compute::concat_batches(&self.schema, &batches)
                            .map_err(|e| self.err(e.to_string()))?;
                        (kept, b)
                    }
                }
            }
        };
        // Event times; a row without one is a bad record too.
        let times = self.event_times(&good, &batch)?;
        let keep: Vec<bool> = times.iter().map(Result::is_ok).collect();
        let mut event_time_us = vec![];
        let mut offsets = vec![];
        for (r, t) in good.iter().zip(times) {
            match t {
                Ok(t) => {
                    event_time_us.push(t);
                    offsets.push(r.offset);
                }
                Err(m) => bad.push(bad_record(r, m)),
            }
        }
        let batch = if keep.iter().all(|k| *k) {
            batch
        } else {
            arrow::compute::filter_record_batch(&batch, &keep.into())
                .map_err(|e| self.err(e.to_string()))?
        };
        bad.sort_by_key(|b| b.offset);
        Ok(Decoded {
            batch,
            event_time_us: Int64Array::from(event_time_us),
            offsets,
            bad,
        })
    }

    fn err(&self, message: String) -> ConnectorError {
        ConnectorError::Format {
            transform: self.transform.clone(),
            message,
        }
    }

    fn batch(&self, columns: Vec<ArrayRef>) -> Result<RecordBatch, ConnectorError> {
        RecordBatch::try_new(self.schema.clone(), columns).map_err(|e| self.err(e.to_string()))
    }

    /// One record's value as a JSON object (Avro datums go through their JSON form).
    fn to_json(&self, bytes: &[u8]) -> Result<Value, String> {
        let v = match &self.avro {
            None => serde_json::from_slice::<Value>(bytes).map_err(|e| format!("bad JSON: {e}"))?,
            Some(schema) => {
                let mut cur = Cursor::new(bytes);
                let datum = apache_avro::from_avro_datum(schema, &mut cur, None)
                    .map_err(|e| format!("bad Avro datum: {e}"))?;
                if cur.position() as usize != bytes.len() {
                    return Err(format!(
                        "bad Avro datum: {} bytes left after the record",
                        bytes.len() - cur.position() as usize
                    ));
                }
                avro_to_json(datum)?
            }
        };
        if !v.is_object() {
            return Err("the record is not a JSON object".into());
        }
        Ok(v)
    }

    fn rows_to_batch(&self, rows: &[Value]) -> Result<RecordBatch, String> {
        let mut d = arrow::json::ReaderBuilder::new(self.schema.clone())
            .with_batch_size(rows.len().max(1))
            .build_decoder()
            .map_err(|e| e.to_string())?;
        d.serialize(rows).map_err(|e| e.to_string())?;
        Ok(d.flush()
            .map_err(|e| e.to_string())?
            .unwrap_or_else(|| RecordBatch::new_empty(self.schema.clone())))
    }

    fn event_times(
        &self,
        good: &[&LogRecord],
        batch: &RecordBatch,
    ) -> Result<Vec<Result<i64, String>>, ConnectorError> {
        let Some(i) = self.timestamp else {
            return Ok(good.iter().map(|r| Ok(r.timestamp_ms * 1000)).collect());
        };
        let col = batch.column(i);
        let name = self.schema.field(i).name();
        let missing = || Err(format!("no event time: field '{name}' is null"));
        let any = col.as_any();
        let out = (0..col.len())
            .map(|row| {
                if col.is_null(row) {
                    return missing();
                }
                if let Some(a) = any.downcast_ref::<Int64Array>() {
                    Ok(a.value(row) * 1000)
                } else if let Some(a) = any.downcast_ref::<arrow::array::Int32Array>() {
                    Ok(i64::from(a.value(row)) * 1000)
                } else if let Some(a) = any.downcast_ref::<StringArray>() {
                    parse_time(a.value(row))
                } else if let Some(a) = any.downcast_ref::<LargeStringArray>() {
                    parse_time(a.value(row))
                } else if let Some(a) = any.downcast_ref::<TimestampMicrosecondArray>() {
                    Ok(a.value(row))
                } else if let Some(a) = any.downcast_ref::<TimestampMillisecondArray>() {
                    Ok(a.value(row) * 1000)
                } else if let Some(a) = any.downcast_ref::<TimestampSecondArray>() {
                    Ok(a.value(row) * 1_000_000)
                } else if let Some(a) = any.downcast_ref::<TimestampNanosecondArray>() {
                    Ok(a.value(row) / 1000)
                } else {
                    Err(format!("field '{name}' is not a time"))
                }
            })
            .collect();
        Ok(out)
    }
}

fn parse_time(s: &str) -> Result<i64, String> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.timestamp_micros())
        .map_err(|e| format!("no event time: '{s}' is not an RFC 3339 time: {e}"))
}

/// An Avro value in the JSON form arrow's JSON decoder reads (unions unwrapped, times as
/// numbers in their own unit).
fn avro_to_json(v: apache_avro::types::Value) -> Result<Value, String> {
    use apache_avro::types::Value as A;
    Ok(match v {
        A::Null => Value::Null,
        A::Boolean(b) => Value::Bool(b),
        A::Int(i) | A::Date(i) | A::TimeMillis(i) => Value::from(i),
        A::Long(i)
        | A::TimeMicros(i)
        | A::TimestampMillis(i)
        | A::TimestampMicros(i)
        | A::LocalTimestampMillis(i)
        | A::LocalTimestampMicros(i) => Value::from(i),
        A::Float(f) => Value::from(f64::from(f)),
        A::Double(f) => Value::from(f),
        A::String(s) | A::Enum(_, s) => Value::String(s),
        A::Uuid(u) => Value::String(u.to_string()),
        A::Union(_, inner) => avro_to_json(*inner)?,
        A::Array(items) => Value::Array(
            items
                .into_iter()
                .map(avro_to_json)
                .collect::<Result<_, _>>()?,
        ),
        A::Record(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(k, v)| Ok((k, avro_to_json(v)?)))
                .collect::<Result<_, String>>()?,
        ),
        other => return Err(format!("Avro value {other:?} is not supported yet")),
    })
}

/// Encodes rows into records for a sink.
pub struct Encoder {
    transform: String,
    format: RecordFormat,
    avro: Option<apache_avro::Schema>,
}

impl Encoder {
    pub fn new(transform: &str, cfg: &ConnectorSinkConfig) -> Result<Encoder, ConnectorError> {
        let avro = match &cfg.format {
            RecordFormat::Avro { schema } => Some(avro_schema(schema.as_ref()).map_err(
                |message| ConnectorError::Format {
                    transform: transform.to_string(),
                    message,
                },
            )?),
            _ => None,
        };
        Ok(Encoder {
            transform: transform.to_string(),
            format: cfg.format.clone(),
            avro,
        })
    }

    fn err(&self, message: String) -> ConnectorError {
        ConnectorError::Format {
            transform: self.transform.clone(),
            message,
        }
    }

    /// The records of a batch's rows, in row order. RAW and STRING write the one column (or
    /// the `payload` column) as is; JSON one object a row; AVRO one datum a row.
    pub fn encode(&self, batch: &RecordBatch) -> Result<Vec<OutRecord>, ConnectorError> {
        match &self.format {
            RecordFormat::Raw | RecordFormat::String => self.payloads(batch),
            RecordFormat::Json { .. } => Ok(self
                .json_rows(batch)?
                .into_iter()
                .map(|v| OutRecord {
                    key: None,
                    value: v.to_string().into_bytes(),
                })
                .collect()),
            RecordFormat::Avro { .. } => {
                let schema = self.avro.as_ref().expect("AVRO has its schema");
                self.json_rows(batch)?
                    .into_iter()
                    .enumerate()
                    .map(|(row, v)| {
                        let datum = apache_avro::types::Value::from(v)
                            .resolve(schema)
                            .and_then(|d| apache_avro::to_avro_datum(schema, d))
                            .map_err(|e| {
                                self.err(format!("row {row} does not fit the Avro schema: {e}"))
                            })?;
                        Ok(OutRecord {
                            key: None,
                            value: datum,
                        })
                    })
                    .collect()
            }
        }
    }

    fn payloads(&self, batch: &RecordBatch) -> Result<Vec<OutRecord>, ConnectorError> {
        let col = match batch.schema().index_of(PAYLOAD) {
            Ok(i) => batch.column(i).clone(),
            Err(_) if batch.num_columns() == 1 => batch.column(0).clone(),
            Err(_) => {
                return Err(self.err(format!(
                    "format {} writes one column: name it '{PAYLOAD}' (the rows have {})",
                    self.format.name(),
                    batch.schema().fields().len()
                )));
            }
        };
        let any = col.as_any();
        let get = |row: usize| -> Option<&[u8]> {
            if let Some(a) = any.downcast_ref::<BinaryArray>() {
                Some(a.value(row))
            } else if let Some(a) = any.downcast_ref::<LargeBinaryArray>() {
                Some(a.value(row))
            } else if let Some(a) = any.downcast_ref::<StringArray>() {
                Some(a.value(row).as_bytes())
            } else if let Some(a) = any.downcast_ref::<LargeStringArray>() {
                Some(a.value(row).as_bytes())
            } else if let Some(a) = any.downcast_ref::<StringViewArray>() {
                Some(a.value(row).as_bytes())
            } else {
                None
            }
        };
        (0..col.len())
            .map(|row| {
                let value = get(row)
                    .ok_or_else(|| {
                        self.err(format!(
                            "the payload column is {}: bytes or a string",
                            col.data_type()
                        ))
                    })?
                    .to_vec();
                Ok(OutRecord { key: None, value })
            })
            .collect()
    }

    fn json_rows(&self, batch: &RecordBatch) -> Result<Vec<Value>, ConnectorError> {
        let mut buf = vec![];
        {
            // Nulls explicit: an Avro record needs every field. An `Any` field is its value.
            let mut w = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .with_encoder_factory(riverbank_elements::any::encoders())
                .build::<_, arrow::json::writer::LineDelimited>(&mut buf);
            w.write(batch).map_err(|e| self.err(e.to_string()))?;
            w.finish().map_err(|e| self.err(e.to_string()))?;
        }
        // JSON escapes newlines inside strings: each line is one row.
        buf.split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).map_err(|e| self.err(e.to_string())))
            .collect()
    }
}
