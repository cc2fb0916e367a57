//! Element-wise operators: each takes a batch of one collection and produces batches of its
//! output collections. They are fused into stages and run once per bundle.
use crate::error::RunError;
use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int64Array, ListArray, RecordBatch,
    StringArray, StructArray, TimestampMicrosecondArray, UInt32Array,
};
use arrow::compute::{cast, filter_record_batch, take};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use riverbank_elements::columns::{
    MIN_TIMESTAMP_US, TS, WINDOW_END, WINDOW_START, hidden_columns, user_batch, user_schema,
};
use riverbank_elements::json_rows::row_to_string;
use riverbank_pipeline::windowing::WindowFn;
use riverbank_udf::expr::Compiled;
use std::sync::Arc;

/// What an element-wise op computes.
#[derive(Debug)]
pub enum Kind {
    MapToFields {
        keep: Vec<usize>,
        fields: Vec<(String, Compiled)>,
    },
    Filter {
        keep: Compiled,
    },
    Explode {
        fields: Vec<usize>,
        cross_product: bool,
    },
    Partition {
        by: Compiled,
        outputs: Vec<(String, String)>,
        unknown: Option<String>,
    },
    AssignTimestamps {
        timestamp: Compiled,
    },
    WindowInto {
        window: WindowFn,
    },
    /// (output field, windowing parameter).
    ExtractWindowingInfo {
        fields: Vec<(String, String)>,
    },
    Flatten,
    /// Rows (as JSON) that do not satisfy the schema fail (to the error output, if any).
    ValidateWithSchema {
        schema: Box<riverbank_pipeline::config::json_schema::JsonSchema>,
    },
    LogForTesting {
        level: String,
        prefix: String,
    },
    /// Beam's `MatchAll`: the files the pattern in `field` matches (`match_all`).
    MatchAll {
        field: String,
        empty: riverbank_pipeline::config::EmptyMatch,
    },
}

/// A compiled element-wise op.
#[derive(Debug)]
pub struct ElementOp {
    pub transform: String,
    pub kind: Kind,
    /// Collection id of the main output.
    pub output: String,
    /// Collection id of the error output (`error_handling`).
    pub error_output: Option<String>,
    /// Full output schema (with hidden columns).
    pub output_schema: SchemaRef,
}

pub type Emit = Vec<(String, RecordBatch)>;

impl ElementOp {
    /// Runs the op on one batch. With an error output, failing records go there and the rest
    /// go on; without one, the first failing record fails the bundle.
    pub fn apply(&self, batch: &RecordBatch, out: &mut Emit) -> Result<(), RunError> {
        match self.apply_batch(batch) {
            Ok(v) => {
                out.extend(v);
                Ok(())
            }
            Err(msg) => {
                // Find the failing records row by row: slow, but only on the failure path.
                let mut good: Vec<usize> = vec![];
                let mut bad: Vec<(usize, String)> = vec![];
                for i in 0..batch.num_rows() {
                    match self.apply_batch(&batch.slice(i, 1)) {
                        Ok(_) => good.push(i),
                        Err(m) => bad.push((i, m)),
                    }
                }
                let Some(err_out) = &self.error_output else {
                    let (row, m) = bad
                        .first()
                        .map(|(i, m)| (Some(row_to_string(batch, *i)), m.clone()))
                        .unwrap_or((None, msg));
                    return Err(RunError::Transform {
                        transform: self.transform.clone(),
                        message: m,
                        record: row,
                    });
                };
                if bad.is_empty() {
                    return Err(RunError::transform(&self.transform, msg));
                }
                let idx = UInt32Array::from(good.iter().map(|&i| i as u32).collect::<Vec<_>>());
                let good_batch = take_batch(batch, &idx)?;
                if good_batch.num_rows() > 0 {
                    out.extend(
                        self.apply_batch(&good_batch)
                            .map_err(|m| RunError::transform(&self.transform, m))?,
                    );
                }
                out.push((err_out.clone(), error_rows(&self.transform, batch, &bad)?));
                Ok(())
            }
        }
    }

    fn apply_batch(&self, batch: &RecordBatch) -> Result<Emit, String> {
        let main = |b: RecordBatch| vec![(self.output.clone(), b)];
        Ok(match &self.kind {
            Kind::MapToFields { keep, fields } => {
                let user = user_batch(batch);
                let mut cols: Vec<ArrayRef> =
                    keep.iter().map(|&i| user.column(i).clone()).collect();
                for (_, c) in fields {
                    cols.push(c.eval(&user)?);
                }
                cols.extend(hidden_columns(batch).into_iter().map(|(_, c)| c));
                main(
                    RecordBatch::try_new(self.output_schema.clone(), cols)
                        .map_err(|e| e.to_string())?,
                )
            }
            Kind::Filter { keep } => {
                let mask = keep.eval(&user_batch(batch))?;
                let mask = mask.as_boolean_opt().ok_or_else(|| {
                    format!(
                        "keep expression '{}' must be boolean, got {}",
                        keep.text,
                        mask.data_type()
                    )
                })?;
                let mask = if mask.null_count() > 0 {
                    arrow::compute::prep_null_mask_filter(mask)
                } else {
                    mask.clone()
                };
                main(filter_record_batch(batch, &mask).map_err(|e| e.to_string())?)
            }
            Kind::Explode {
                fields,
                cross_product,
            } => main(explode(batch, fields, *cross_product, &self.output_schema)?),
            Kind::Partition {
                by,
                outputs,
                unknown,
            } => {
                let v = by.eval(&user_batch(batch))?;
                let v = cast(&v, &DataType::Utf8).map_err(|e| e.to_string())?;
                let v = v.as_string::<i32>();
                let mut res = vec![];
                let mut matched = vec![false; batch.num_rows()];
                for (name, coll) in outputs {
                    let mask: BooleanArray =
                        v.iter().map(|x| Some(x == Some(name.as_str()))).collect();
                    for (i, m) in mask.iter().enumerate() {
                        if m == Some(true) {
                            matched[i] = true;
                        }
                    }
                    let b = filter_record_batch(batch, &mask).map_err(|e| e.to_string())?;
                    if b.num_rows() > 0 {
                        res.push((coll.clone(), b));
                    }
                }
                if let Some(i) = matched.iter().position(|m| !m) {
                    match unknown {
                        Some(coll) => {
                            let mask: BooleanArray = matched.iter().map(|m| Some(!m)).collect();
                            res.push((
                                coll.clone(),
                                filter_record_batch(batch, &mask).map_err(|e| e.to_string())?,
                            ));
                        }
                        None => {
                            let got = if v.is_null(i) {
                                "null".to_string()
                            } else {
                                format!("'{}'", v.value(i))
                            };
                            return Err(format!(
                                "partition {got} is not one of the outputs [{}] and no unknown_output is set",
                                outputs
                                    .iter()
                                    .map(|o| o.0.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ));
                        }
                    }
                }
                res
            }
            Kind::AssignTimestamps { timestamp } => {
                let v = timestamp.eval(&user_batch(batch))?;
                let ts = to_timestamp_us(&v)
                    .map_err(|e| format!("timestamp '{}': {e}", timestamp.text))?;
                if ts.null_count() > 0 {
                    return Err(format!("timestamp '{}' is null", timestamp.text));
                }
                main(set_column(batch, &self.output_schema, TS, Arc::new(ts))?)
            }
            Kind::WindowInto { window } => main(window_into(batch, window, &self.output_schema)?),
            Kind::ExtractWindowingInfo { fields } => {
                main(extract_windowing_info(batch, fields, &self.output_schema)?)
            }
            Kind::Flatten => main(conform(batch, &self.output_schema)?),
            Kind::MatchAll { field, empty } => main(crate::match_all::apply(
                batch,
                field,
                *empty,
                &self.output_schema,
            )?),
            Kind::ValidateWithSchema { schema } => {
                // As Beam: each row as JSON, its null fields left out.
                for row in riverbank_elements::json_rows::batch_to_rows(batch) {
                    schema.validate(&row)?;
                }
                main(batch.clone())
            }
            Kind::LogForTesting { level, prefix } => {
                for row in riverbank_elements::json_rows::batch_to_rows(batch) {
                    match level.to_uppercase().as_str() {
                        "DEBUG" => tracing::debug!(target: "LogForTesting", "{prefix}{row}"),
                        "WARNING" | "WARN" => {
                            tracing::warn!(target: "LogForTesting", "{prefix}{row}")
                        }
                        "ERROR" => tracing::error!(target: "LogForTesting", "{prefix}{row}"),
                        _ => tracing::info!(target: "LogForTesting", "{prefix}{row}"),
                    }
                }
                main(batch.clone())
            }
        })
    }
}

fn take_batch(batch: &RecordBatch, idx: &UInt32Array) -> Result<RecordBatch, RunError> {
    let cols = batch
        .columns()
        .iter()
        .map(|c| take(c.as_ref(), idx, None))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RunError::Internal(e.to_string()))?;
    RecordBatch::try_new(batch.schema(), cols).map_err(|e| RunError::Internal(e.to_string()))
}

/// Error output rows, as Beam YAML shapes them: `element` (the failed record), `msg` and `stack`.
pub fn error_schema(input: &Schema) -> SchemaRef {
    let user = user_schema(input);
    Arc::new(Schema::new(vec![
        Field::new("element", DataType::Struct(user.fields().clone()), false),
        Field::new("msg", DataType::Utf8, false),
        // Beam puts the Python traceback here: a UDF's stack, or where native code failed.
        Field::new("stack", DataType::Utf8, false),
    ]))
}

fn error_rows(
    transform: &str,
    batch: &RecordBatch,
    bad: &[(usize, String)],
) -> Result<RecordBatch, RunError> {
    let idx = UInt32Array::from(bad.iter().map(|(i, _)| *i as u32).collect::<Vec<_>>());
    let user = take_batch(&user_batch(batch), &idx)?;
    let element = StructArray::from(user);
    // A UDF's failure carries its stack; native code has none, so: where it failed.
    let (msgs, stacks): (Vec<&str>, Vec<String>) = bad
        .iter()
        .map(|(_, m)| match riverbank_udf::split_stack(m) {
            (m, Some(stack)) => (m, stack.to_string()),
            (m, None) => (m, format!("in transform '{transform}'")),
        })
        .unzip();
    let msg = StringArray::from(msgs);
    let stack = StringArray::from(stacks);
    RecordBatch::try_new(
        error_schema(&batch.schema()),
        vec![Arc::new(element), Arc::new(msg), Arc::new(stack)],
    )
    .map_err(|e| RunError::Internal(e.to_string()))
}

/// Replaces (or appends) a column, producing `schema`.
fn set_column(
    batch: &RecordBatch,
    schema: &SchemaRef,
    name: &str,
    col: ArrayRef,
) -> Result<RecordBatch, String> {
    let mut cols = vec![];
    for f in schema.fields() {
        if f.name() == name {
            cols.push(col.clone());
        } else {
            let i = batch
                .schema()
                .index_of(f.name())
                .map_err(|e| e.to_string())?;
            cols.push(batch.column(i).clone());
        }
    }
    RecordBatch::try_new(schema.clone(), cols).map_err(|e| e.to_string())
}

/// Event timestamps from what users have: timestamps of any unit (naive ones are UTC), dates,
/// numbers (seconds since the epoch, as Beam), or strings (RFC 3339 / ISO 8601).
pub fn to_timestamp_us(v: &ArrayRef) -> Result<TimestampMicrosecondArray, String> {
    let casted = match v.data_type() {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Float32
        | DataType::Float64 => {
            let secs = cast(v, &DataType::Float64).map_err(|e| e.to_string())?;
            let micros: Int64Array = secs
                .as_primitive::<arrow::datatypes::Float64Type>()
                .iter()
                .map(|s| s.map(|s| (s * 1e6).round() as i64))
                .collect();
            Arc::new(TimestampMicrosecondArray::from(micros.values().to_vec()).with_timezone("UTC"))
                as ArrayRef
        }
        // Same instants, without time-zone arithmetic: zoned timestamps already count from the
        // UTC epoch and naive ones are taken as UTC; only the unit may change.
        DataType::Timestamp(_, tz) => {
            cast(v, &DataType::Timestamp(TimeUnit::Microsecond, tz.clone()))
                .map_err(|e| e.to_string())?
        }
        DataType::Date32
        | DataType::Date64
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View => {
            cast(v, &DataType::Timestamp(TimeUnit::Microsecond, None)).map_err(|e| e.to_string())?
        }
        t if riverbank_elements::any::is_any(t) => return any_to_timestamp_us(v),
        other => return Err(format!("cannot use a {other} as a timestamp")),
    };
    let out = casted
        .as_primitive::<arrow::datatypes::TimestampMicrosecondType>()
        .clone();
    Ok(out.with_timezone("UTC"))
}

/// Beam's `Any` values as timestamps, each as its own type reads: a number as seconds since the
/// epoch, a string as a date-time.
fn any_to_timestamp_us(v: &ArrayRef) -> Result<TimestampMicrosecondArray, String> {
    let one = |x: serde_json::Value| -> Result<i64, String> {
        let a: ArrayRef = match &x {
            serde_json::Value::Number(n) => Arc::new(Float64Array::from(vec![n.as_f64()])),
            serde_json::Value::String(s) => Arc::new(StringArray::from(vec![s.as_str()])),
            other => return Err(format!("cannot use {other} as a timestamp")),
        };
        let t = to_timestamp_us(&a).map_err(|e| format!("{x}: {e}"))?;
        if t.is_null(0) {
            return Err(format!("{x} is not a timestamp"));
        }
        Ok(t.value(0))
    };
    let micros = riverbank_elements::any::values(v.as_ref())
        .into_iter()
        .map(|x| x.map(one).transpose())
        .collect::<Result<Vec<_>, String>>()?;
    Ok(TimestampMicrosecondArray::from(micros).with_timezone("UTC"))
}

fn window_into(
    batch: &RecordBatch,
    window: &WindowFn,
    schema: &SchemaRef,
) -> Result<RecordBatch, String> {
    let base = |b: &RecordBatch| -> Vec<ArrayRef> {
        schema
            .fields()
            .iter()
            .filter(|f| f.name() != WINDOW_START && f.name() != WINDOW_END)
            .map(|f| {
                b.column(b.schema().index_of(f.name()).expect("carried column"))
                    .clone()
            })
            .collect()
    };
    if *window == WindowFn::Global {
        return RecordBatch::try_new(schema.clone(), base(batch)).map_err(|e| e.to_string());
    }
    // Elements without an event timestamp have Beam's minimum one (a source's, a Create's).
    let ts: Vec<i64> = match batch.schema().index_of(TS) {
        Ok(i) => batch
            .column(i)
            .as_primitive::<arrow::datatypes::TimestampMicrosecondType>()
            .values()
            .to_vec(),
        Err(_) => vec![MIN_TIMESTAMP_US; batch.num_rows()],
    };
    // Window bounds are computed wide: near the minimum timestamp a window may start before
    // the first representable instant, which is where it is clamped.
    let clamp = |v: i128| v.clamp(i64::MIN as i128, i64::MAX as i128) as i64;
    let utc = |v: Vec<i64>| -> ArrayRef {
        Arc::new(TimestampMicrosecondArray::from(v).with_timezone("UTC"))
    };
    let with_bounds = |b: &RecordBatch, ws: Vec<i64>, we: Vec<i64>| {
        let mut cols = base(b);
        cols.push(utc(ws));
        cols.push(utc(we));
        RecordBatch::try_new(schema.clone(), cols).map_err(|e| e.to_string())
    };
    match *window {
        WindowFn::Global => unreachable!("handled above"),
        WindowFn::Fixed { size_us, offset_us } => {
            if let Some((ws, we)) = fixed_bounds_i64(&ts, size_us, offset_us) {
                return with_bounds(batch, ws, we);
            }
            let (size, offset) = (size_us as i128, offset_us as i128);
            let starts: Vec<i128> = ts
                .iter()
                .map(|&t| (t as i128 - offset).div_euclid(size) * size + offset)
                .collect();
            with_bounds(
                batch,
                starts.iter().map(|&s| clamp(s)).collect(),
                starts.iter().map(|&s| clamp(s + size)).collect(),
            )
        }
        WindowFn::Sessions { gap_us } => with_bounds(
            batch,
            ts.clone(),
            ts.iter()
                .map(|&t| clamp(t as i128 + gap_us as i128))
                .collect(),
        ),
        WindowFn::Sliding {
            size_us,
            period_us,
            offset_us,
        } => {
            // Each element belongs to every window [s, s+size) with s ≡ offset (mod period) and s <= t < s+size.
            let (size, period, offset) = (size_us as i128, period_us as i128, offset_us as i128);
            let (mut idx, mut ws, mut we) = (vec![], vec![], vec![]);
            for (row, &t) in ts.iter().enumerate() {
                let t = t as i128;
                let mut s = (t - offset).div_euclid(period) * period + offset;
                while s > t - size {
                    idx.push(row as u32);
                    ws.push(clamp(s));
                    we.push(clamp(s + size));
                    s -= period;
                }
            }
            let taken = take_batch(batch, &UInt32Array::from(idx)).map_err(|e| e.to_string())?;
            with_bounds(&taken, ws, we)
        }
    }
}

/// Fixed-window bounds in 64-bit arithmetic (the common case, several times cheaper than the
/// 128-bit path); None when some bound would leave the i64 range, which the wide path clamps.
fn fixed_bounds_i64(ts: &[i64], size: i64, offset: i64) -> Option<(Vec<i64>, Vec<i64>)> {
    let (lo, hi) = ts
        .iter()
        .fold((i64::MAX, i64::MIN), |(lo, hi), &t| (lo.min(t), hi.max(t)));
    // Every intermediate below stays in range when the extremes do.
    lo.checked_sub(offset)?;
    hi.checked_sub(offset)?
        .checked_add(size)?
        .checked_add(offset)?;
    lo.checked_sub(offset)?.checked_sub(size)?;
    lo.checked_sub(size)?;
    // Neighbouring elements mostly share a window (time-ordered input): divide only when an
    // element falls outside the previous one's window.
    let (mut start, mut end) = (i64::MAX, i64::MIN);
    let starts: Vec<i64> = ts
        .iter()
        .map(|&t| {
            if t < start || t >= end {
                start = (t - offset).div_euclid(size) * size + offset;
                end = start + size;
            }
            start
        })
        .collect();
    let ends = starts.iter().map(|&s| s + size).collect();
    Some((starts, ends))
}

fn extract_windowing_info(
    batch: &RecordBatch,
    fields: &[(String, String)],
    schema: &SchemaRef,
) -> Result<RecordBatch, String> {
    let n = batch.num_rows();
    let get = |name: &str| {
        batch
            .schema()
            .index_of(name)
            .ok()
            .map(|i| batch.column(i).clone())
    };
    let ts = get(TS);
    let (ws, we) = (get(WINDOW_START), get(WINDOW_END));
    let nulls_ts =
        || -> ArrayRef { Arc::new(TimestampMicrosecondArray::new_null(n).with_timezone("UTC")) };
    let mut cols: Vec<ArrayRef> = user_batch(batch).columns().to_vec();
    for (_, param) in fields {
        cols.push(match param.as_str() {
            // An element without a timestamp column has Beam's minimum timestamp (a Create's).
            "timestamp" => ts.clone().unwrap_or_else(|| {
                Arc::new(
                    TimestampMicrosecondArray::from(vec![MIN_TIMESTAMP_US; n]).with_timezone("UTC"),
                )
            }),
            "window_start" => ws.clone().unwrap_or_else(nulls_ts),
            "window_end" => we.clone().unwrap_or_else(nulls_ts),
            "pane_info" => get(riverbank_elements::columns::PANE).unwrap_or_else(|| {
                riverbank_elements::columns::pane_array(&vec![
                    riverbank_elements::columns::NO_FIRING;
                    n
                ])
            }),
            "window_type" => Arc::new(StringArray::from(vec![
                if ws.is_some() {
                    "IntervalWindow"
                } else {
                    "GlobalWindow"
                };
                n
            ])),
            _ => {
                // window_string: as Beam (Python) prints an interval window, in seconds since
                // the epoch: `[1705312800.0, 1705312860.0)`.
                let s: Vec<String> = match (&ws, &we) {
                    (Some(a), Some(b)) => {
                        let (a, b) = (
                            a.as_primitive::<arrow::datatypes::TimestampMicrosecondType>(),
                            b.as_primitive::<arrow::datatypes::TimestampMicrosecondType>(),
                        );
                        (0..n)
                            .map(|i| {
                                format!("[{}, {})", fmt_secs(a.value(i)), fmt_secs(b.value(i)))
                            })
                            .collect()
                    }
                    _ => vec!["GlobalWindow".to_string(); n],
                };
                Arc::new(StringArray::from(s))
            }
        });
    }
    cols.extend(hidden_columns(batch).into_iter().map(|(_, c)| c));
    RecordBatch::try_new(schema.clone(), cols).map_err(|e| e.to_string())
}

/// Seconds as Python's `float` prints them: shortest round trip, with `.0` when integral.
fn fmt_secs(us: i64) -> String {
    format!("{:?}", us as f64 / 1e6)
}

/// A batch as `schema`, by field name: each column widened to the type [`riverbank_elements::widen`] chose
/// (no value lost), a field the batch lacks null, or for the event timestamp the minimum.
pub fn conform(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, String> {
    if batch.schema().as_ref() == schema.as_ref() {
        return Ok(batch.clone());
    }
    let mut cols = vec![];
    for f in schema.fields() {
        match batch.schema().index_of(f.name()) {
            Ok(i) => cols.push(
                riverbank_elements::widen::conform_array(batch.column(i), f.data_type())
                    .map_err(|e| format!("field '{}': {e}", f.name()))?,
            ),
            Err(_) if f.name() == TS => cols.push(Arc::new(
                TimestampMicrosecondArray::from(vec![MIN_TIMESTAMP_US; batch.num_rows()])
                    .with_timezone("UTC"),
            )),
            Err(_) => cols.push(arrow::array::new_null_array(
                f.data_type(),
                batch.num_rows(),
            )),
        }
    }
    let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(schema.clone(), cols, &options).map_err(|e| e.to_string())
}

fn explode(
    batch: &RecordBatch,
    fields: &[usize],
    cross_product: bool,
    schema: &SchemaRef,
) -> Result<RecordBatch, String> {
    let batch = &strings_as_char_lists(batch, fields)?;
    let user = user_batch(batch);
    if cross_product || fields.len() == 1 {
        // Explode one field at a time: the cross product of all of them.
        let mut cur = batch.clone();
        for &f in fields {
            let name = user.schema().field(f).name().clone();
            cur = explode_one(&cur, &[name])?;
        }
        conform(&cur, schema)
    } else {
        let names: Vec<String> = fields
            .iter()
            .map(|&f| user.schema().field(f).name().clone())
            .collect();
        conform(&explode_one(batch, &names)?, schema)
    }
}

/// `batch` with its string columns among the user fields `fields` turned into lists of their
/// characters (Unicode code points, as Python iterates a `str`); a null string stays null.
fn strings_as_char_lists(batch: &RecordBatch, fields: &[usize]) -> Result<RecordBatch, String> {
    let user = user_schema(&batch.schema());
    let mut cols = batch.columns().to_vec();
    let mut schema_fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    for &f in fields {
        let name = user.field(f).name();
        let i = batch.schema().index_of(name).map_err(|e| e.to_string())?;
        if !matches!(
            cols[i].data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        ) {
            continue;
        }
        let s = cast(&cols[i], &DataType::Utf8).map_err(|e| e.to_string())?;
        let mut b = arrow::array::ListBuilder::new(arrow::array::StringBuilder::new());
        for v in s.as_string::<i32>() {
            match v {
                Some(v) => {
                    let mut buf = [0u8; 4];
                    for c in v.chars() {
                        b.values().append_value(c.encode_utf8(&mut buf));
                    }
                    b.append(true);
                }
                None => b.append(false),
            }
        }
        let list: ArrayRef = Arc::new(b.finish());
        schema_fields[i] = Field::new(name, list.data_type().clone(), true);
        cols[i] = list;
    }
    RecordBatch::try_new(Arc::new(Schema::new(schema_fields)), cols).map_err(|e| e.to_string())
}

/// Explodes list columns `names` in lockstep, like Beam's `itertools.zip_longest`: a row gives
/// as many rows as its longest list, shorter lists padded with nulls. Null lists count as empty.
fn explode_one(batch: &RecordBatch, names: &[String]) -> Result<RecordBatch, String> {
    let bs = batch.schema();
    let lists: Vec<&ListArray> = names
        .iter()
        .map(|n| {
            bs.index_of(n)
                .ok()
                .and_then(|i| batch.column(i).as_list_opt::<i32>())
                .ok_or_else(|| format!("field '{n}' is not a list"))
        })
        .collect::<Result<_, _>>()?;
    let mut idx = vec![];
    let mut value_idx = vec![];
    for row in 0..batch.num_rows() {
        let len = |l: &ListArray| {
            if l.is_null(row) {
                0
            } else {
                l.value_length(row) as usize
            }
        };
        let n = lists.iter().map(|l| len(l)).max().unwrap_or(0);
        for k in 0..n {
            idx.push(row as u32);
            value_idx.push(k);
        }
    }
    let idx = UInt32Array::from(idx);
    let (mut cols, mut fields) = (vec![], vec![]);
    for (i, f) in bs.fields().iter().enumerate() {
        if let Some(pos) = names.iter().position(|n| n == f.name()) {
            let l = lists[pos];
            let starts: UInt32Array = idx
                .values()
                .iter()
                .zip(&value_idx)
                .map(|(&r, &k)| {
                    let r = r as usize;
                    let present = !l.is_null(r) && k < l.value_length(r) as usize;
                    present.then(|| (l.value_offsets()[r] as usize + k) as u32)
                })
                .collect();
            let v = take(l.values().as_ref(), &starts, None).map_err(|e| e.to_string())?;
            fields.push(Field::new(f.name(), v.data_type().clone(), true));
            cols.push(v);
        } else {
            fields.push(f.as_ref().clone());
            cols.push(take(batch.column(i).as_ref(), &idx, None).map_err(|e| e.to_string())?);
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(|e| e.to_string())
}
