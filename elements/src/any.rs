//! Beam's `Any`: a field whose values have several types — Flatten of `{id: 1}` and
//! `{id: "x"}`, a Create of `[3, 'a']`, a Python callable whose results differ. Beam keeps each
//! value as it was; so does Riverbank, each value as its JSON text (`3`, `"a"`, `{"k": [1]}`).
//!
//! The text sits in a one-field struct `{__rb_any: Utf8}` rather than in a `Utf8` field
//! marked by metadata (Arrow's `arrow.json` extension): a `DataType` is what travels through
//! schemas, UDF signatures and shuffle files, and field metadata would be lost on the way.
//! JSON out (sinks, AssertEqual, error rows, logs) writes the value itself (`encoders`); the
//! UDF languages hand their interpreters the value itself.
use arrow::array::{Array, ArrayRef, AsArray, StringArray, StructArray};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field, FieldRef, Fields, TimeUnit, TimestampMicrosecondType};
use arrow::error::ArrowError;
use arrow::json::writer::{Encoder, EncoderFactory, EncoderOptions, NullableEncoder, make_encoder};
use serde_json::Value;
use std::sync::Arc;

/// The name of the struct's one field, the value's JSON text.
pub const FIELD: &str = "__rb_any";

/// The type of an `Any` field.
pub fn data_type() -> DataType {
    DataType::Struct(Fields::from(vec![Field::new(FIELD, DataType::Utf8, true)]))
}

/// Whether `t` is the type of an `Any` field.
pub fn is_any(t: &DataType) -> bool {
    matches!(t, DataType::Struct(f) if f.len() == 1 && f[0].name() == FIELD)
}

/// An `Any` column from JSON texts (`None` for null).
pub fn from_texts<S: AsRef<str>>(texts: impl IntoIterator<Item = Option<S>>) -> ArrayRef {
    let texts: StringArray = texts.into_iter().collect();
    let nulls = texts.nulls().cloned();
    let fields = Fields::from(vec![Field::new(FIELD, DataType::Utf8, true)]);
    Arc::new(StructArray::new(fields, vec![Arc::new(texts)], nulls))
}

/// An `Any` column from JSON values (`None` and JSON `null` are null).
pub fn from_values<'a>(values: impl IntoIterator<Item = Option<&'a Value>>) -> ArrayRef {
    from_texts(
        values
            .into_iter()
            .map(|v| v.filter(|v| !v.is_null()).map(|v| v.to_string())),
    )
}

/// The JSON texts of an `Any` column (`None` for null).
pub fn texts(array: &dyn Array) -> impl Iterator<Item = Option<&str>> + '_ {
    let s = array.as_struct();
    let texts = s.column(0).as_string::<i32>();
    (0..s.len()).map(move |i| (!s.is_null(i) && texts.is_valid(i)).then(|| texts.value(i)))
}

/// The values of an `Any` column (`None` for null).
pub fn values(array: &dyn Array) -> Vec<Option<Value>> {
    texts(array)
        .map(|t| t.map(|t| serde_json::from_str(t).unwrap_or(Value::Null)))
        .collect()
}

/// A column of any type as `Any`: each value as its JSON text, as `encoders` writes it (a null
/// row's object fields written as `null`, as Beam's JSON sinks write a row's None).
pub fn from_array(array: &ArrayRef) -> Result<ArrayRef, String> {
    if is_any(array.data_type()) {
        return Ok(array.clone());
    }
    let field: FieldRef = Arc::new(Field::new("v", array.data_type().clone(), true));
    let options = EncoderOptions::default()
        .with_explicit_nulls(true)
        .with_encoder_factory(encoders());
    let mut encoder = make_encoder(&field, array.as_ref(), &options).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let texts: Vec<Option<String>> = (0..array.len())
        .map(|i| {
            (!encoder.is_null(i)).then(|| {
                buf.clear();
                encoder.encode(i, &mut buf);
                String::from_utf8_lossy(&buf).into_owned()
            })
        })
        .collect();
    Ok(from_texts(texts))
}

/// A value as Python's `str` shows it (strings bare, `True`, `None`, `[1, 'a']`), for text and
/// CSV sinks.
pub fn python_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => python_repr(other),
    }
}

fn python_repr(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        Value::Number(n) if n.is_f64() => python_float(n.as_f64().unwrap_or(f64::NAN)),
        Value::Number(n) => n.to_string(),
        // Python's repr quotes with ' unless the string holds one and no ".
        Value::String(s) if s.contains('\'') && !s.contains('"') => format!("\"{s}\""),
        Value::String(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(python_repr).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, x)| format!(
                    "{}: {}",
                    python_repr(&Value::String(k.clone())),
                    python_repr(x)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A float as Python's `repr`/`str` prints it: the shortest digits that round-trip, positional
/// from 1e-4 up to 1e16 (with `.0` when integral), scientific otherwise (`1e+20`, `1.5e-07`).
pub fn python_float(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits: `-1.2345e15`.
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let s = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            let (a, b) = digits.split_at(point as usize);
            format!("{a}.{b}")
        };
        format!("{sign}{s}")
    } else {
        let (first, rest) = digits.split_at(1);
        let m = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let es = if exp < 0 { "-" } else { "+" };
        format!("{sign}{m}e{es}{:02}", exp.abs())
    }
}

/// An `Any` column as strings, each value as Python's `str` shows it.
pub fn to_python_strs(array: &dyn Array) -> ArrayRef {
    Arc::new(
        values(array)
            .iter()
            .map(|v| v.as_ref().map(python_str))
            .collect::<StringArray>(),
    )
}

/// Arrow's JSON writer, told to write an `Any` value as the value itself, and a UTC timestamp
/// as Arrow would, only faster (`utc_json`).
pub fn encoders() -> Arc<dyn EncoderFactory> {
    Arc::new(AnyEncoders)
}

#[derive(Debug)]
struct AnyEncoders;

impl EncoderFactory for AnyEncoders {
    fn make_default_encoder<'a>(
        &self,
        _field: &'a FieldRef,
        array: &'a dyn Array,
        options: &'a EncoderOptions,
    ) -> Result<Option<NullableEncoder<'a>>, ArrowError> {
        if let DataType::Timestamp(TimeUnit::Microsecond, Some(tz)) = array.data_type()
            && tz.as_ref() == "UTC"
            && options.timestamp_tz_format().is_none()
        {
            let values = array.as_primitive::<TimestampMicrosecondType>();
            let encoder = Box::new(crate::utc_json::UtcMicros::new(values)?);
            return Ok(Some(NullableEncoder::new(encoder, values.nulls().cloned())));
        }
        if !is_any(array.data_type()) {
            return Ok(None);
        }
        let s = array.as_struct();
        let texts = s.column(0).as_string::<i32>();
        let nulls = NullBuffer::union(s.nulls(), texts.nulls());
        Ok(Some(NullableEncoder::new(Box::new(Raw(texts)), nulls)))
    }
}

struct Raw<'a>(&'a StringArray);

impl Encoder for Raw<'_> {
    fn encode(&mut self, idx: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(self.0.value(idx).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::RecordBatch;
    use arrow::array::{Float64Array, Int64Array, ListArray};
    use arrow::datatypes::Int64Type;
    use serde_json::json;

    #[test]
    fn floats_print_as_python_prints_them() {
        for (v, s) in [
            (0.0, "0.0"),
            (100.0, "100.0"),
            (2.5, "2.5"),
            (-2.5, "-2.5"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (123.456, "123.456"),
            (1234567890123456.0, "1234567890123456.0"),
            (1e16, "1e+16"),
            (1.5e20, "1.5e+20"),
            (-1e100, "-1e+100"),
            (f64::NAN, "nan"),
            (f64::NEG_INFINITY, "-inf"),
        ] {
            assert_eq!(python_float(v), s, "{v:e}");
        }
    }

    #[test]
    fn values_keep_their_own_types() {
        let vals = [json!(3), json!("a"), json!(null), json!({"k": [1, 2.5]})];
        let a = from_values(vals.iter().map(Some));
        assert!(is_any(a.data_type()));
        assert!(a.is_null(2));
        assert_eq!(
            values(&a),
            [
                Some(json!(3)),
                Some(json!("a")),
                None,
                Some(json!({"k": [1, 2.5]}))
            ]
        );
        // Written as JSON, each value is itself, not a string or a struct.
        let batch = RecordBatch::try_new(
            Arc::new(arrow::datatypes::Schema::new(vec![Field::new(
                "x",
                data_type(),
                true,
            )])),
            vec![a],
        )
        .unwrap();
        let mut buf = Vec::new();
        let mut w = arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .with_encoder_factory(encoders())
            .build::<_, arrow::json::writer::LineDelimited>(&mut buf);
        w.write(&batch).unwrap();
        w.finish().unwrap();
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "{\"x\":3}\n{\"x\":\"a\"}\n{\"x\":null}\n{\"x\":{\"k\":[1,2.5]}}\n"
        );
    }

    #[test]
    fn typed_columns_become_their_json_values() {
        let ints: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None]));
        assert_eq!(values(&from_array(&ints).unwrap()), [Some(json!(1)), None]);
        let floats: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 0.5]));
        let texts: Vec<_> = texts(&from_array(&floats).unwrap())
            .map(|t| t.unwrap().to_string())
            .collect();
        assert_eq!(texts, ["1.0", "0.5"], "a float stays a float");
        let lists: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
            Some(vec![Some(1), None]),
        ]));
        assert_eq!(
            values(&from_array(&lists).unwrap()),
            [Some(json!([1, null]))]
        );
        assert_eq!(python_str(&json!("a")), "a");
        assert_eq!(python_str(&json!(true)), "True");
        assert_eq!(
            python_str(&json!([1, "a", 2.0, null])),
            "[1, 'a', 2.0, None]"
        );
        assert_eq!(python_str(&json!({"k": "it's"})), "{'k': \"it's\"}");
    }
}
