//! Values between Arrow and JavaScript: `Reader` turns a column's rows into JS values,
//! `Builder` turns a UDF's results into an Arrow array of the output type (checking each result
//! against it, as Beam checks an `output_type`), and `Shape` infers that type from the results
//! on sample rows when no `output_type` is given.
//!
//! JavaScript has one number type (a double). Inputs: integers and decimals become numbers
//! (integers beyond 2^53 lose precision, as in any JS engine), dates and timestamps become
//! `Date`s, lists arrays, rows and maps objects, nulls `null`. Results: a number is an integer
//! when it is integral, as Beam's js2py conversion makes it; see `Shape`.
use arrow::array::{
    Array, ArrayBuilder, ArrayRef, AsArray, BinaryArray, BooleanArray, BooleanBuilder,
    Float64Array, Float64Builder, Int64Array, Int64Builder, LargeListArray, ListArray, MapArray,
    StringArray, StringBuilder, StructArray, TimestampMicrosecondArray, TimestampMillisecondArray,
    TimestampSecondArray, UInt64Array, new_null_array,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, FieldRef, Fields, TimeUnit};
use riverbank_elements::any;
use rquickjs::convert::Coerced;
use rquickjs::{Array as JsArray, Constructor, Ctx, Object, Type, Value};
use std::sync::Arc;

/// What a UDF's results become.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Output {
    /// Filter's `keep`: kept when the result is truthy as Beam (Python) sees it.
    Predicate,
    /// Partition's `by`: an output's name (numbers and booleans are spelled out).
    Name,
    /// A value of this type; `declared` when it is the `output_type`, not inferred.
    Value { data_type: DataType, declared: bool },
}

impl Output {
    pub fn data_type(&self) -> DataType {
        match self {
            Output::Predicate => DataType::Boolean,
            Output::Name => DataType::Utf8,
            Output::Value { data_type, .. } => data_type.clone(),
        }
    }
}

/// The JS constructors conversions need, looked up once per batch.
pub struct Helpers<'js> {
    pub date: Constructor<'js>,
}

impl<'js> Helpers<'js> {
    pub fn new(ctx: &Ctx<'js>) -> rquickjs::Result<Self> {
        Ok(Helpers {
            date: ctx.globals().get("Date")?,
        })
    }
}

// ---------------------------------------------------------------- Arrow → JS

/// Reads the rows of one column as JS values. Leaf types are first cast to one representative
/// per JS type, so that the per-row work is one match and one value.
pub enum Reader {
    Null,
    Bool(BooleanArray),
    Int(Int64Array),
    UInt(UInt64Array),
    Float(Float64Array),
    Str(StringArray),
    Bytes(BinaryArray),
    /// Milliseconds since the epoch (UTC), as `Date` holds them.
    Date(TimestampMillisecondArray),
    List(ListArray, Box<Reader>),
    Struct(StructArray, Vec<(String, Reader)>),
    Map(MapArray, Box<Reader>, Box<Reader>),
    /// Beam's `Any`: each value's JSON text, parsed into the value itself.
    Any(StringArray),
}

fn cast_to(a: &ArrayRef, to: &DataType) -> Result<ArrayRef, String> {
    cast(a, to).map_err(|e| e.to_string())
}

impl Reader {
    pub fn new(a: &ArrayRef) -> Result<Reader, String> {
        use DataType::*;
        Ok(match a.data_type() {
            t if any::is_any(t) => Reader::Any(any::texts(a.as_ref()).collect()),
            Null => Reader::Null,
            Boolean => Reader::Bool(a.as_boolean().clone()),
            Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 => {
                Reader::Int(cast_to(a, &Int64)?.as_primitive().clone())
            }
            UInt64 => Reader::UInt(a.as_primitive().clone()),
            Float16 | Float32 | Float64 | Decimal32(..) | Decimal64(..) | Decimal128(..)
            | Decimal256(..) => Reader::Float(cast_to(a, &Float64)?.as_primitive().clone()),
            Utf8 | LargeUtf8 | Utf8View => Reader::Str(cast_to(a, &Utf8)?.as_string().clone()),
            Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => {
                Reader::Bytes(cast_to(a, &Binary)?.as_binary().clone())
            }
            // Keep the zone: Arrow stores instants as UTC either way; only the unit changes.
            Timestamp(_, tz) => Reader::Date(
                cast_to(a, &Timestamp(TimeUnit::Millisecond, tz.clone()))?
                    .as_primitive()
                    .clone(),
            ),
            Date32 | Date64 => Reader::Date(
                cast_to(a, &Timestamp(TimeUnit::Millisecond, None))?
                    .as_primitive()
                    .clone(),
            ),
            List(_) => {
                let l = a.as_list::<i32>().clone();
                let items = Reader::new(l.values())?;
                Reader::List(l, Box::new(items))
            }
            LargeList(f) | FixedSizeList(f, _) | ListView(f) | LargeListView(f) => {
                let l = cast_to(a, &List(f.clone()))?.as_list::<i32>().clone();
                let items = Reader::new(l.values())?;
                Reader::List(l, Box::new(items))
            }
            Struct(fields) => {
                let s = a.as_struct().clone();
                let children = fields
                    .iter()
                    .zip(s.columns())
                    .map(|(f, c)| Ok((f.name().clone(), Reader::new(c)?)))
                    .collect::<Result<_, String>>()?;
                Reader::Struct(s, children)
            }
            Map(..) => {
                let m = a.as_map().clone();
                let keys = cast_to(m.keys(), &Utf8).map_err(|_| {
                    format!("map keys of type {} cannot be object keys", m.key_type())
                })?;
                let keys = Reader::new(&keys)?;
                let values = Reader::new(m.values())?;
                Reader::Map(m, Box::new(keys), Box::new(values))
            }
            Dictionary(_, v) => Reader::new(&cast_to(a, v)?)?,
            other => {
                return Err(format!(
                    "javascript UDFs cannot take values of type {other}"
                ));
            }
        })
    }

    fn is_null(&self, i: usize) -> bool {
        match self {
            Reader::Null => true,
            Reader::Bool(a) => a.is_null(i),
            Reader::Int(a) => a.is_null(i),
            Reader::UInt(a) => a.is_null(i),
            Reader::Float(a) => a.is_null(i),
            Reader::Str(a) => a.is_null(i),
            Reader::Bytes(a) => a.is_null(i),
            Reader::Date(a) => a.is_null(i),
            Reader::List(a, _) => a.is_null(i),
            Reader::Struct(a, _) => a.is_null(i),
            Reader::Map(a, _, _) => a.is_null(i),
            Reader::Any(a) => a.is_null(i),
        }
    }

    /// Row `i` as a JS value.
    pub fn value<'js>(
        &self,
        ctx: &Ctx<'js>,
        h: &Helpers<'js>,
        i: usize,
    ) -> rquickjs::Result<Value<'js>> {
        if self.is_null(i) {
            return Ok(Value::new_null(ctx.clone()));
        }
        Ok(match self {
            Reader::Null => Value::new_null(ctx.clone()),
            Reader::Bool(a) => Value::new_bool(ctx.clone(), a.value(i)),
            Reader::Int(a) => {
                let v = a.value(i);
                match i32::try_from(v) {
                    Ok(v) => Value::new_int(ctx.clone(), v),
                    Err(_) => Value::new_float(ctx.clone(), v as f64),
                }
            }
            Reader::UInt(a) => Value::new_number(ctx.clone(), a.value(i) as f64),
            Reader::Float(a) => Value::new_number(ctx.clone(), a.value(i)),
            Reader::Str(a) => rquickjs::String::from_str(ctx.clone(), a.value(i))?.into_value(),
            Reader::Bytes(a) => {
                let arr = JsArray::new(ctx.clone())?;
                for (k, b) in a.value(i).iter().enumerate() {
                    arr.set(k, *b as i32)?;
                }
                arr.into_value()
            }
            Reader::Date(a) => h.date.construct::<_, Value>((a.value(i) as f64,))?,
            Reader::List(l, items) => {
                let arr = JsArray::new(ctx.clone())?;
                let (start, end) = (l.value_offsets()[i], l.value_offsets()[i + 1]);
                for (k, j) in (start..end).enumerate() {
                    arr.set(k, items.value(ctx, h, j as usize)?)?;
                }
                arr.into_value()
            }
            Reader::Struct(_, children) => {
                let obj = Object::new(ctx.clone())?;
                for (name, r) in children {
                    obj.set(name.as_str(), r.value(ctx, h, i)?)?;
                }
                obj.into_value()
            }
            Reader::Map(m, keys, values) => {
                let obj = Object::new(ctx.clone())?;
                let (start, end) = (m.value_offsets()[i], m.value_offsets()[i + 1]);
                for j in start as usize..end as usize {
                    let Reader::Str(k) = keys.as_ref() else {
                        unreachable!("map keys are read as strings")
                    };
                    obj.set(k.value(j), values.value(ctx, h, j)?)?;
                }
                obj.into_value()
            }
            Reader::Any(a) => ctx.json_parse(a.value(i))?,
        })
    }
}

// ---------------------------------------------------------------- JS → Arrow

/// How a result is named in messages: its JS type, and the value itself when short.
pub fn describe<'js>(v: &Value<'js>, h: &Helpers<'js>) -> String {
    match v.type_of() {
        Type::Int | Type::Float => format!(
            "the number {}",
            js_number(v.as_number().unwrap_or(f64::NAN))
        ),
        Type::String => {
            let s = v
                .as_string()
                .and_then(|s| s.to_string().ok())
                .unwrap_or_default();
            let short: String = s.chars().take(40).collect();
            let more = if short.len() < s.len() { "…" } else { "" };
            format!("the string {short:?}{more}")
        }
        Type::Bool => format!("the boolean {}", v.as_bool().unwrap_or_default()),
        Type::Array => "an array".into(),
        Type::Function | Type::Constructor => "a function".into(),
        Type::BigInt => "a BigInt".into(),
        Type::Symbol => "a symbol".into(),
        Type::Object if is_date(v, h) => "a Date".into(),
        Type::Object => "an object".into(),
        t => format!("a value of type {t}"),
    }
}

/// A JS number as JS prints it (`3`, `2.5`, `NaN`).
fn js_number(f: f64) -> String {
    if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e21 {
        format!("{}", f as i64)
    } else if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        format!("{f}")
    }
}

fn is_date<'js>(v: &Value<'js>, h: &Helpers<'js>) -> bool {
    v.as_object().is_some_and(|o| o.is_instance_of(&h.date))
}

fn is_void(v: &Value<'_>) -> bool {
    v.is_null() || v.is_undefined()
}

/// A number that is an integer, as js2py hands one to Beam (`12.0` is the int `12`).
fn as_integer(v: &Value<'_>) -> Option<i64> {
    if let Some(i) = v.as_int() {
        return Some(i as i64);
    }
    let f = v.as_float()?;
    (f.is_finite() && f.fract() == 0.0 && f.abs() < 9.2e18).then_some(f as i64)
}

/// Python's truthiness of what Beam makes of a JS value: like JS's, except that empty arrays
/// are false (an empty list) and `NaN` is true (a float).
pub fn truthy(v: &Value<'_>) -> bool {
    match v.type_of() {
        Type::Array => v.as_array().is_some_and(|a| !a.is_empty()),
        Type::Float => v.as_float().is_some_and(|f| f.is_nan() || f != 0.0),
        _ => v.get::<Coerced<bool>>().map(|b| b.0).unwrap_or(true),
    }
}

/// Accumulates results into an array of the output type, refusing results that do not fit.
pub enum Builder {
    Predicate(BooleanBuilder),
    Name(StringBuilder),
    Bool(BooleanBuilder),
    Int(Int64Builder),
    Float(Float64Builder),
    Str(StringBuilder),
    /// Microseconds since the epoch, UTC (Riverbank's timestamp type).
    Timestamp(Vec<Option<i64>>),
    List {
        field: FieldRef,
        offsets: Vec<i32>,
        valid: Vec<bool>,
        items: Box<Builder>,
    },
    Struct {
        fields: Fields,
        valid: Vec<bool>,
        children: Vec<Builder>,
    },
    /// Beam's `Any`: each result as its JSON text.
    Any(Vec<Option<String>>),
}

impl Builder {
    pub fn new(output: &Output, capacity: usize) -> Result<Builder, String> {
        match output {
            Output::Predicate => Ok(Builder::Predicate(BooleanBuilder::with_capacity(capacity))),
            Output::Name => Ok(Builder::Name(StringBuilder::with_capacity(
                capacity,
                8 * capacity,
            ))),
            Output::Value { data_type, .. } => Builder::of(data_type, capacity),
        }
    }

    fn of(t: &DataType, capacity: usize) -> Result<Builder, String> {
        Ok(match t {
            t if any::is_any(t) => Builder::Any(Vec::with_capacity(capacity)),
            DataType::Boolean => Builder::Bool(BooleanBuilder::with_capacity(capacity)),
            DataType::Int64 => Builder::Int(Int64Builder::with_capacity(capacity)),
            DataType::Float64 => Builder::Float(Float64Builder::with_capacity(capacity)),
            DataType::Utf8 => Builder::Str(StringBuilder::with_capacity(capacity, 8 * capacity)),
            DataType::Timestamp(TimeUnit::Microsecond, _) => {
                Builder::Timestamp(Vec::with_capacity(capacity))
            }
            DataType::List(f) => Builder::List {
                field: f.clone(),
                offsets: vec![0],
                valid: vec![],
                items: Box::new(Builder::of(f.data_type(), capacity)?),
            },
            DataType::Struct(fields) => Builder::Struct {
                fields: fields.clone(),
                valid: vec![],
                children: fields
                    .iter()
                    .map(|f| Builder::of(f.data_type(), capacity))
                    .collect::<Result<_, _>>()?,
            },
            other => return Err(format!("javascript UDFs cannot produce {other}")),
        })
    }

    /// Appends one result; `Err` says why it does not fit (the path names a nested field).
    pub fn push<'js>(&mut self, v: &Value<'js>, h: &Helpers<'js>) -> Result<(), String> {
        let mismatch = |want: &str| {
            Err(format!(
                "returned {} where {want} is expected",
                describe(v, h)
            ))
        };
        match self {
            Builder::Predicate(b) => b.append_value(truthy(v)),
            Builder::Name(b) => match v.type_of() {
                _ if is_void(v) => b.append_null(),
                Type::String | Type::Int | Type::Float | Type::Bool => {
                    b.append_value(v.get::<Coerced<String>>().map_err(|e| e.to_string())?.0)
                }
                _ => return mismatch("an output's name (a string)"),
            },
            Builder::Bool(b) => match v.as_bool() {
                _ if is_void(v) => b.append_null(),
                Some(x) => b.append_value(x),
                None => return mismatch("a boolean"),
            },
            Builder::Int(b) => {
                if is_void(v) {
                    b.append_null()
                } else if let Some(i) = as_integer(v) {
                    b.append_value(i)
                } else if v.is_big_int() {
                    let i = v
                        .clone()
                        .into_big_int()
                        .and_then(|i| i.to_i64().ok())
                        .ok_or("returned a BigInt beyond 64 bits")?;
                    b.append_value(i)
                } else {
                    return mismatch("an integer");
                }
            }
            Builder::Float(b) => match v.as_number() {
                _ if is_void(v) => b.append_null(),
                Some(x) => b.append_value(x),
                None => return mismatch("a number"),
            },
            Builder::Str(b) => match v.as_string() {
                _ if is_void(v) => b.append_null(),
                Some(s) => b.append_value(s.to_string().map_err(|e| e.to_string())?),
                None => return mismatch("a string"),
            },
            Builder::Timestamp(b) => {
                if is_void(v) {
                    b.push(None)
                } else if is_date(v, h) {
                    let ms = v.get::<Coerced<f64>>().map_err(|e| e.to_string())?.0;
                    if !ms.is_finite() {
                        return Err("returned an invalid Date".into());
                    }
                    b.push(Some((ms * 1000.0).round() as i64))
                } else {
                    return mismatch("a Date");
                }
            }
            Builder::List {
                offsets,
                valid,
                items,
                ..
            } => {
                if is_void(v) {
                    valid.push(false);
                } else if let Some(a) = v.as_array() {
                    for (k, item) in a.iter::<Value>().enumerate() {
                        let item = item.map_err(|e| e.to_string())?;
                        items.push(&item, h).map_err(|e| format!("[{k}]: {e}"))?;
                    }
                    valid.push(true);
                } else {
                    return mismatch("an array");
                }
                let len = items.len() as i32;
                offsets.push(len);
            }
            Builder::Struct {
                fields,
                valid,
                children,
            } => {
                if is_void(v) {
                    valid.push(false);
                    for c in children.iter_mut() {
                        c.push(v, h)?;
                    }
                    return Ok(());
                }
                let obj = match v.as_object() {
                    Some(o) if v.type_of() == Type::Object && !is_date(v, h) => o,
                    _ => return mismatch("an object"),
                };
                let mut found = 0;
                for (f, c) in fields.iter().zip(children.iter_mut()) {
                    let x: Value = obj.get(f.name().as_str()).map_err(|e| e.to_string())?;
                    found += usize::from(!x.is_undefined());
                    c.push(&x, h).map_err(|e| format!(".{}: {e}", f.name()))?;
                }
                if obj.len() > found {
                    let extra = obj
                        .keys::<String>()
                        .filter_map(|k| k.ok())
                        .find(|k| fields.find(k).is_none())
                        .unwrap_or_default();
                    return Err(format!(
                        "returned an object with a field '{extra}' that its type does not have"
                    ));
                }
                valid.push(true);
            }
            Builder::Any(b) => {
                if is_void(v) {
                    b.push(None)
                } else {
                    let text = v
                        .ctx()
                        .json_stringify(v.clone())
                        .map_err(|e| e.to_string())?
                        .map(|t| t.to_string())
                        .transpose()
                        .map_err(|e| e.to_string())?;
                    match text {
                        Some(t) => b.push(Some(t)),
                        None => return mismatch("a value JSON can hold"),
                    }
                }
            }
        }
        Ok(())
    }

    fn len(&self) -> usize {
        match self {
            Builder::Predicate(b) | Builder::Bool(b) => b.len(),
            Builder::Name(b) | Builder::Str(b) => b.len(),
            Builder::Int(b) => b.len(),
            Builder::Float(b) => b.len(),
            Builder::Timestamp(b) => b.len(),
            Builder::List { valid, .. } | Builder::Struct { valid, .. } => valid.len(),
            Builder::Any(b) => b.len(),
        }
    }

    pub fn finish(self) -> ArrayRef {
        match self {
            Builder::Predicate(mut b) | Builder::Bool(mut b) => Arc::new(b.finish()),
            Builder::Name(mut b) | Builder::Str(mut b) => Arc::new(b.finish()),
            Builder::Int(mut b) => Arc::new(b.finish()),
            Builder::Float(mut b) => Arc::new(b.finish()),
            Builder::Timestamp(b) => {
                Arc::new(TimestampMicrosecondArray::from(b).with_timezone("UTC"))
            }
            Builder::List {
                field,
                offsets,
                valid,
                items,
            } => Arc::new(ListArray::new(
                field,
                OffsetBuffer::new(offsets.into()),
                items.finish(),
                Some(NullBuffer::from(valid)),
            )),
            Builder::Struct {
                fields,
                valid,
                children,
            } => {
                let len = valid.len();
                let cols: Vec<ArrayRef> = children.into_iter().map(Builder::finish).collect();
                if fields.is_empty() {
                    Arc::new(StructArray::new_empty_fields(
                        len,
                        Some(NullBuffer::from(valid)),
                    ))
                } else {
                    Arc::new(StructArray::new(
                        fields,
                        cols,
                        Some(NullBuffer::from(valid)),
                    ))
                }
            }
            Builder::Any(b) => any::from_texts(b),
        }
    }
}

// ---------------------------------------------------------------- types

/// The type of a result, inferred from a sample. Numbers are integers while every sampled
/// result is integral (as js2py hands Beam `12` for `11 + 1`) and doubles otherwise; a
/// non-finite number (`NaN`) says nothing about which.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    Unknown,
    Bool,
    Int,
    NonFinite,
    Float,
    Str,
    Date,
    List(Box<Shape>),
    Struct(Vec<(String, Shape)>),
    /// Results of several types (Beam's `Any`).
    Any,
}

impl Shape {
    pub fn of<'js>(v: &Value<'js>, h: &Helpers<'js>) -> Result<Shape, String> {
        Ok(match v.type_of() {
            _ if is_void(v) => Shape::Unknown,
            Type::Bool => Shape::Bool,
            Type::Int | Type::BigInt => Shape::Int,
            Type::Float => match v.as_float() {
                Some(f) if !f.is_finite() => Shape::NonFinite,
                _ if as_integer(v).is_some() => Shape::Int,
                _ => Shape::Float,
            },
            Type::String => Shape::Str,
            Type::Array => {
                let mut s = Shape::Unknown;
                for item in v.as_array().expect("an array").iter::<Value>() {
                    let item = item.map_err(|e| e.to_string())?;
                    s = s.union(Shape::of(&item, h)?);
                }
                Shape::List(Box::new(s))
            }
            Type::Object if is_date(v, h) => Shape::Date,
            Type::Object => {
                let obj = v.as_object().expect("an object");
                let mut fields = vec![];
                for p in obj.props::<String, Value>() {
                    let (k, x) = p.map_err(|e| e.to_string())?;
                    fields.push((k, Shape::of(&x, h)?));
                }
                Shape::Struct(fields)
            }
            _ => {
                return Err(format!(
                    "returned {}, which has no column type",
                    describe(v, h)
                ));
            }
        })
    }

    pub fn union(self, other: Shape) -> Shape {
        use Shape::*;
        match (self, other) {
            (Unknown, x) | (x, Unknown) => x,
            (NonFinite, x @ (Int | Float | NonFinite)) | (x @ (Int | Float), NonFinite) => x,
            (Int, Float) | (Float, Int) => Float,
            (List(a), List(b)) => List(Box::new(a.union(*b))),
            (Struct(mut a), Struct(b)) => {
                for (k, s) in b {
                    match a.iter_mut().find(|(n, _)| *n == k) {
                        Some((_, t)) => *t = std::mem::replace(t, Unknown).union(s),
                        None => a.push((k, s)),
                    }
                }
                Struct(a)
            }
            (a, b) if a == b => a,
            _ => Any,
        }
    }

    /// The Arrow type; `Err` names what could not be told (always null, an empty array).
    pub fn data_type(&self) -> Result<DataType, String> {
        Ok(match self {
            Shape::Unknown => {
                return Err("it returns only null or undefined on sample rows".into());
            }
            Shape::Bool => DataType::Boolean,
            Shape::Int => DataType::Int64,
            Shape::NonFinite | Shape::Float => DataType::Float64,
            Shape::Str => DataType::Utf8,
            Shape::Date => riverbank_elements::columns::ts_type(),
            Shape::Any => any::data_type(),
            Shape::List(item) => DataType::List(Arc::new(Field::new(
                "item",
                item.data_type().map_err(|e| {
                    if **item == Shape::Unknown {
                        "it returns arrays that are empty or hold only nulls on sample rows"
                            .to_string()
                    } else {
                        format!("[]: {e}")
                    }
                })?,
                true,
            ))),
            Shape::Struct(fields) => DataType::Struct(
                fields
                    .iter()
                    .map(|(k, s)| {
                        Ok(Field::new(
                            k,
                            s.data_type().map_err(|e| format!(".{k}: {e}"))?,
                            true,
                        ))
                    })
                    .collect::<Result<Fields, String>>()?,
            ),
        })
    }
}

/// Beam's `output_type`: a JSON schema (`{type: array, items: ...}`, `{type: object,
/// properties: {...}}`), or a basic type's name (`string`, `integer`, `number`, `boolean`).
pub fn declared_type(t: &serde_json::Value) -> Result<DataType, String> {
    use serde_json::Value as J;
    let (name, schema) = match t {
        J::String(s) => (s.as_str(), None),
        J::Object(m) => match m.get("type") {
            Some(J::String(s)) => (s.as_str(), Some(m)),
            _ => return Err(format!("output_type {t} has no 'type'")),
        },
        _ => {
            return Err(format!(
                "output_type {t} must be a type name or a JSON schema"
            ));
        }
    };
    Ok(match name {
        "string" => DataType::Utf8,
        "integer" => DataType::Int64,
        "number" => DataType::Float64,
        "boolean" => DataType::Boolean,
        "array" => {
            let items = schema
                .and_then(|m| m.get("items"))
                .ok_or("output_type array needs 'items'")?;
            DataType::List(Arc::new(Field::new("item", declared_type(items)?, true)))
        }
        "object" => {
            let props = schema
                .and_then(|m| m.get("properties"))
                .and_then(|p| p.as_object())
                .ok_or("output_type object needs 'properties'")?;
            DataType::Struct(
                props
                    .iter()
                    .map(|(k, v)| Ok(Field::new(k, declared_type(v)?, true)))
                    .collect::<Result<Fields, String>>()?,
            )
        }
        other => {
            return Err(format!(
                "unknown output_type '{other}' (types: string, integer, number, boolean, array, object)"
            ));
        }
    })
}

// ---------------------------------------------------------------- sample rows

/// Sample values of a column type, for inferring a UDF's output type before any data is read:
/// varied enough that integral and fractional results, and string shapes, show; each column
/// (`seed`) starts at a different value, so that `a / b` is not always `1`.
pub fn sample_column(t: &DataType, rows: usize, seed: usize) -> ArrayRef {
    use DataType::*;
    let pick = |values: &'static [i64]| (0..rows).map(move |i| values[(i + seed) % values.len()]);
    let fallback = || new_null_array(t, rows);
    let cast_from = |a: ArrayRef| cast(&a, t).unwrap_or_else(|_| fallback());
    match t {
        // Beam's `Any`: numbers and strings in turn.
        t if riverbank_elements::any::is_any(t) => {
            const VALUES: [&str; 4] = ["7", "\"Abc de\"", "2.5", "\"x,y z\""];
            riverbank_elements::any::from_texts((0..rows).map(|i| Some(VALUES[(i + seed) % 4])))
        }
        Boolean => Arc::new(BooleanArray::from(
            (0..rows)
                .map(|i| (i + seed).is_multiple_of(2))
                .collect::<Vec<_>>(),
        )),
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => {
            cast_from(Arc::new(Int64Array::from_iter_values(pick(&[7, 3, 12, 5]))))
        }
        Float16 | Float32 | Float64 | Decimal32(..) | Decimal64(..) | Decimal128(..)
        | Decimal256(..) => cast_from(Arc::new(Float64Array::from_iter_values(
            pick(&[20, 6, 9, 24]).map(|v| v as f64 / 8.0),
        ))),
        Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView => {
            const STRINGS: [&str; 4] = ["7", "Abc de", "2.5", "x,y z"];
            cast_from(Arc::new(StringArray::from_iter_values(
                (0..rows).map(|i| STRINGS[(i + seed) % STRINGS.len()]),
            )))
        }
        Timestamp(..) | Date32 | Date64 => cast_from(Arc::new(
            TimestampSecondArray::from_iter_values(pick(&[
                1_700_000_000,
                1_600_000_123,
                1_650_000_456,
                1_710_000_789,
            ]))
            .with_timezone("UTC"),
        )),
        List(f) => Arc::new(ListArray::new(
            f.clone(),
            OffsetBuffer::from_lengths(vec![2; rows]),
            sample_column(f.data_type(), 2 * rows, seed),
            None,
        )),
        LargeList(f) => Arc::new(LargeListArray::new(
            f.clone(),
            OffsetBuffer::from_lengths(vec![2; rows]),
            sample_column(f.data_type(), 2 * rows, seed),
            None,
        )),
        Struct(fields) => StructArray::try_new(
            fields.clone(),
            fields
                .iter()
                .enumerate()
                .map(|(k, f)| sample_column(f.data_type(), rows, seed + k + 1))
                .collect(),
            None,
        )
        .map(|s| Arc::new(s) as ArrayRef)
        .unwrap_or_else(|_| fallback()),
        _ => fallback(),
    }
}
