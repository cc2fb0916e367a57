//! Values between Arrow and Python, as Beam passes them to Python UDFs: integers as `int`,
//! floats and decimals as `float`, strings `str`, bytes `bytes`, timestamps and dates Beam's
//! `Timestamp`, lists `list`, rows `Row` (attribute access), maps `dict`, nulls `None`, an
//! `Any` field's values as they were (`Row`s for objects).
//! Results become the output type's Arrow array, each checked against it (as Beam checks an
//! `output_type`); `shape` infers that type from the results on sample rows.
use crate::values::Output;
use arrow::array::{
    Array, ArrayRef, AsArray, BooleanBuilder, Float64Builder, Int64Builder, LargeStringArray,
    ListArray, StringBuilder, StructArray, TimestampMicrosecondArray, new_null_array,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Fields, TimeUnit};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use riverbank_elements::any;
use std::sync::Arc;

/// The runtime's helpers conversions need (from `runtime.py`), looked up once per batch.
pub struct Helpers<'py> {
    pub row: Bound<'py, PyAny>,
    pub timestamp: Bound<'py, PyAny>,
    pub micros: Bound<'py, PyAny>,
    /// JSON text of an `Any` field → the value, and back.
    pub any_value: Bound<'py, PyAny>,
    pub any_text: Bound<'py, PyAny>,
}

fn cast_to(a: &ArrayRef, to: &DataType) -> Result<ArrayRef, String> {
    cast(a, to).map_err(|e| e.to_string())
}

fn err(e: PyErr) -> String {
    e.to_string()
}

// ---------------------------------------------------------------- Arrow → Python

/// The rows of a column as Python objects.
pub fn to_py<'py>(
    py: Python<'py>,
    h: &Helpers<'py>,
    a: &ArrayRef,
) -> Result<Vec<Bound<'py, PyAny>>, String> {
    use DataType::*;
    let none = || py.None().into_bound(py);
    let n = a.len();
    let mut out: Vec<Bound<'py, PyAny>> = Vec::with_capacity(n);
    macro_rules! each {
        ($arr:expr, |$v:ident| $make:expr) => {{
            let arr = $arr;
            for i in 0..n {
                out.push(if arr.is_null(i) {
                    none()
                } else {
                    let $v = arr.value(i);
                    $make
                });
            }
        }};
    }
    match a.data_type() {
        t if any::is_any(t) => {
            for text in any::texts(a.as_ref()) {
                out.push(match text {
                    None => none(),
                    Some(t) => h.any_value.call1((t,)).map_err(err)?,
                });
            }
        }
        Null => out.extend((0..n).map(|_| none())),
        Boolean => each!(a.as_boolean(), |v| PyBool::new(py, v).to_owned().into_any()),
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 => {
            let c = cast_to(a, &Int64)?;
            each!(c.as_primitive::<arrow::datatypes::Int64Type>(), |v| {
                PyInt::new(py, v).into_any()
            })
        }
        UInt64 => each!(a.as_primitive::<arrow::datatypes::UInt64Type>(), |v| {
            PyInt::new(py, v).into_any()
        }),
        Float16 | Float32 | Float64 | Decimal32(..) | Decimal64(..) | Decimal128(..)
        | Decimal256(..) => {
            let c = cast_to(a, &Float64)?;
            each!(c.as_primitive::<arrow::datatypes::Float64Type>(), |v| {
                PyFloat::new(py, v).into_any()
            })
        }
        Utf8 => each!(a.as_string::<i32>(), |v| PyString::new(py, v).into_any()),
        LargeUtf8 | Utf8View => {
            let c = cast_to(a, &LargeUtf8)?;
            let c: &LargeStringArray = c.as_string::<i64>();
            each!(c, |v| PyString::new(py, v).into_any())
        }
        Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => {
            let c = cast_to(a, &LargeBinary)?;
            each!(c.as_binary::<i64>(), |v| PyBytes::new(py, v).into_any())
        }
        Timestamp(..) | Date32 | Date64 => {
            let c = cast_to(a, &Timestamp(TimeUnit::Microsecond, None))?;
            let c: &TimestampMicrosecondArray = c.as_primitive();
            for i in 0..n {
                out.push(if c.is_null(i) {
                    none()
                } else {
                    h.timestamp.call1((0, c.value(i))).map_err(err)?
                });
            }
        }
        List(_) | LargeList(_) | FixedSizeList(..) | ListView(_) | LargeListView(_) => {
            let item = match a.data_type() {
                List(f) | LargeList(f) | FixedSizeList(f, _) | ListView(f) | LargeListView(f) => {
                    f.clone()
                }
                _ => unreachable!(),
            };
            let l = cast_to(a, &List(item))?;
            let l: &ListArray = l.as_list();
            let items = to_py(py, h, l.values())?;
            let offsets = l.value_offsets();
            for i in 0..n {
                out.push(if l.is_null(i) {
                    none()
                } else {
                    let (s, e) = (offsets[i] as usize, offsets[i + 1] as usize);
                    PyList::new(py, &items[s..e]).map_err(err)?.into_any()
                });
            }
        }
        Struct(fields) => {
            let s = a.as_struct();
            let children = s
                .columns()
                .iter()
                .map(|c| to_py(py, h, c))
                .collect::<Result<Vec<_>, _>>()?;
            let names: Vec<Bound<PyString>> =
                fields.iter().map(|f| PyString::new(py, f.name())).collect();
            for i in 0..n {
                if s.is_null(i) {
                    out.push(none());
                    continue;
                }
                let kw = PyDict::new(py);
                for (name, c) in names.iter().zip(&children) {
                    kw.set_item(name, &c[i]).map_err(err)?;
                }
                out.push(h.row.call((), Some(&kw)).map_err(err)?);
            }
        }
        Map(..) => {
            let m = a.as_map();
            let keys = to_py(py, h, m.keys())?;
            let values = to_py(py, h, m.values())?;
            let offsets = m.value_offsets();
            for i in 0..n {
                if m.is_null(i) {
                    out.push(none());
                    continue;
                }
                let d = PyDict::new(py);
                for j in offsets[i] as usize..offsets[i + 1] as usize {
                    d.set_item(&keys[j], &values[j]).map_err(err)?;
                }
                out.push(d.into_any());
            }
        }
        other => return Err(format!("Riverbank cannot pass {other} values to Python")),
    }
    Ok(out)
}

// ---------------------------------------------------------------- Python → Arrow

/// The results of a UDF as an array of what `output` wants.
pub fn from_py(
    h: &Helpers<'_>,
    values: &[Bound<'_, PyAny>],
    output: &Output,
) -> Result<ArrayRef, String> {
    match output {
        Output::Predicate => {
            let mut b = BooleanBuilder::with_capacity(values.len());
            for v in values {
                b.append_value(v.is_truthy().map_err(err)?);
            }
            Ok(Arc::new(b.finish()))
        }
        Output::Name => {
            let mut b = StringBuilder::with_capacity(values.len(), values.len() * 8);
            for v in values {
                // None: no output's name (Partition's `unknown_output`).
                if v.is_none() {
                    b.append_null();
                } else if v.is_instance_of::<PyString>() || v.is_instance_of::<PyInt>() {
                    b.append_value(v.str().map_err(err)?.to_str().map_err(err)?);
                } else {
                    return Err(format!("returned {}, not an output's name", type_name(v)));
                }
            }
            Ok(Arc::new(b.finish()))
        }
        Output::Value { data_type, .. } => {
            let refs: Vec<Option<&Bound<PyAny>>> =
                values.iter().map(|v| (!v.is_none()).then_some(v)).collect();
            build(h, &refs, data_type)
        }
    }
}

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

fn mismatch(v: &Bound<'_, PyAny>, want: &str) -> String {
    format!("returned {} {}, not {want}", type_name(v), repr(v))
}

fn repr(v: &Bound<'_, PyAny>) -> String {
    let r = v.repr().map(|r| r.to_string()).unwrap_or_default();
    if r.len() > 60 {
        format!("{}…", &r[..r.floor_char_boundary(60)])
    } else {
        r
    }
}

/// An array of type `t` from values (None for null).
fn build(
    h: &Helpers<'_>,
    values: &[Option<&Bound<'_, PyAny>>],
    t: &DataType,
) -> Result<ArrayRef, String> {
    use DataType::*;
    let n = values.len();
    Ok(match t {
        t if any::is_any(t) => {
            let texts = values
                .iter()
                .map(|v| {
                    v.map(|v| {
                        h.any_text
                            .call1((v,))
                            .and_then(|t| t.extract::<String>())
                            .map_err(|e| format!("returned {} that is not JSON: {e}", repr(v)))
                    })
                    .transpose()
                })
                .collect::<Result<Vec<_>, String>>()?;
            any::from_texts(texts)
        }
        Null => new_null_array(t, n),
        Boolean => {
            let mut b = BooleanBuilder::with_capacity(n);
            for v in values {
                match v {
                    None => b.append_null(),
                    Some(v) if v.is_instance_of::<PyBool>() => {
                        b.append_value(v.is_truthy().map_err(err)?)
                    }
                    Some(v) => return Err(mismatch(v, "a boolean")),
                }
            }
            Arc::new(b.finish())
        }
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => {
            let mut b = Int64Builder::with_capacity(n);
            for v in values {
                match v {
                    None => b.append_null(),
                    Some(v) if v.is_instance_of::<PyInt>() => b.append_value(
                        v.extract::<i64>()
                            .map_err(|_| mismatch(v, "a 64-bit integer"))?,
                    ),
                    Some(v) => return Err(mismatch(v, "an integer")),
                }
            }
            let a: ArrayRef = Arc::new(b.finish());
            if t == &Int64 {
                a
            } else {
                arrow::compute::cast_with_options(
                    &a,
                    t,
                    &arrow::compute::CastOptions {
                        safe: false,
                        ..Default::default()
                    },
                )
                .map_err(|e| format!("a result does not fit {t}: {e}"))?
            }
        }
        Float16 | Float32 | Float64 | Decimal128(..) | Decimal256(..) => {
            let mut b = Float64Builder::with_capacity(n);
            for v in values {
                match v {
                    None => b.append_null(),
                    Some(v)
                        if v.is_instance_of::<PyFloat>()
                            || (v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>()) =>
                    {
                        b.append_value(v.extract::<f64>().map_err(err)?)
                    }
                    Some(v) => return Err(mismatch(v, "a number")),
                }
            }
            let a: ArrayRef = Arc::new(b.finish());
            if t == &Float64 { a } else { cast_to(&a, t)? }
        }
        Utf8 | LargeUtf8 | Utf8View => {
            let mut b = StringBuilder::with_capacity(n, n * 8);
            for v in values {
                match v {
                    None => b.append_null(),
                    Some(v) => match v.cast::<PyString>() {
                        Ok(s) => b.append_value(s.to_str().map_err(err)?),
                        Err(_) => return Err(mismatch(v, "a string")),
                    },
                }
            }
            let a: ArrayRef = Arc::new(b.finish());
            if t == &Utf8 { a } else { cast_to(&a, t)? }
        }
        Binary | LargeBinary | BinaryView => {
            let mut b = arrow::array::BinaryBuilder::with_capacity(n, n * 8);
            for v in values {
                match v {
                    None => b.append_null(),
                    Some(v) => match v.cast::<PyBytes>() {
                        Ok(s) => b.append_value(s.as_bytes()),
                        Err(_) => return Err(mismatch(v, "bytes")),
                    },
                }
            }
            cast_to(&(Arc::new(b.finish()) as ArrayRef), t)?
        }
        Timestamp(_, tz) => {
            let mut b = Vec::with_capacity(n);
            for v in values {
                b.push(match v {
                    None => None,
                    Some(v) => Some(
                        h.micros
                            .call1((v,))
                            .and_then(|m| m.extract::<i64>())
                            .map_err(|_| mismatch(v, "a timestamp"))?,
                    ),
                });
            }
            let a = TimestampMicrosecondArray::from(b).with_timezone_opt(tz.clone());
            cast_to(&(Arc::new(a) as ArrayRef), t)?
        }
        Date32 | Date64 => {
            let ts = build(h, values, &Timestamp(TimeUnit::Microsecond, None))?;
            cast_to(&ts, t)?
        }
        List(f) | LargeList(f) => {
            let mut items: Vec<Option<&Bound<PyAny>>> = vec![];
            let mut lengths = Vec::with_capacity(n);
            let mut valid = Vec::with_capacity(n);
            // The items are borrowed from the lists, kept alive here.
            let mut lists: Vec<Vec<Bound<PyAny>>> = Vec::with_capacity(n);
            for v in values {
                match v {
                    None => lists.push(vec![]),
                    Some(v) if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() => {
                        lists.push(
                            v.try_iter()
                                .map_err(err)?
                                .collect::<PyResult<Vec<_>>>()
                                .map_err(err)?,
                        );
                    }
                    Some(v) => return Err(mismatch(v, "a list")),
                }
                valid.push(v.is_some());
            }
            for l in &lists {
                lengths.push(l.len());
                items.extend(l.iter().map(|x| (!x.is_none()).then_some(x)));
            }
            let child = build(h, &items, f.data_type())?;
            let list = ListArray::try_new(
                Arc::new(Field::new(f.name(), child.data_type().clone(), true)),
                OffsetBuffer::from_lengths(lengths),
                child,
                Some(NullBuffer::from(valid)),
            )
            .map_err(|e| e.to_string())?;
            cast_to(&(Arc::new(list) as ArrayRef), t)?
        }
        Struct(fields) => {
            // Each result: a Row (or any object with the fields as attributes) or a dict.
            let mut columns: Vec<Vec<Option<Bound<PyAny>>>> =
                vec![Vec::with_capacity(n); fields.len()];
            for v in values {
                for (k, f) in fields.iter().enumerate() {
                    let x = match v {
                        None => None,
                        Some(v) => {
                            let got = match v.cast::<PyDict>() {
                                Ok(d) => d.get_item(f.name()).map_err(err)?,
                                Err(_) => v.getattr(f.name().as_str()).ok(),
                            };
                            got.filter(|x| !x.is_none())
                        }
                    };
                    columns[k].push(x);
                }
            }
            let children = fields
                .iter()
                .zip(&columns)
                .map(|(f, c)| {
                    let refs: Vec<Option<&Bound<PyAny>>> = c.iter().map(Option::as_ref).collect();
                    build(h, &refs, f.data_type()).map_err(|m| format!("field '{}': {m}", f.name()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let fields: Fields = fields
                .iter()
                .zip(&children)
                .map(|(f, c)| Field::new(f.name(), c.data_type().clone(), true))
                .collect();
            let valid: Vec<bool> = values.iter().map(Option::is_some).collect();
            Arc::new(
                StructArray::try_new(fields, children, Some(NullBuffer::from(valid)))
                    .map_err(|e| e.to_string())?,
            )
        }
        other => return Err(format!("Riverbank cannot make {other} values from Python")),
    })
}

// ---------------------------------------------------------------- output types

/// The Arrow type of a result (`None` for `None`, which says nothing).
pub fn shape(v: &Bound<'_, PyAny>) -> Result<Option<DataType>, String> {
    if v.is_none() {
        return Ok(None);
    }
    if v.is_instance_of::<PyBool>() {
        return Ok(Some(DataType::Boolean));
    }
    if v.is_instance_of::<PyInt>() {
        return Ok(Some(DataType::Int64));
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(Some(DataType::Float64));
    }
    if v.is_instance_of::<PyString>() {
        return Ok(Some(DataType::Utf8));
    }
    if v.is_instance_of::<PyBytes>() {
        return Ok(Some(DataType::Binary));
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let mut item = None;
        for x in v.try_iter().map_err(err)? {
            item = union(item, shape(&x.map_err(err)?)?);
        }
        let item = item.unwrap_or(DataType::Null);
        return Ok(Some(DataType::new_list(item, true)));
    }
    let name = type_name(v);
    if name == "Timestamp" || name == "datetime" || name == "date" {
        return Ok(Some(riverbank_elements::columns::ts_type()));
    }
    let entries: Vec<(String, Bound<PyAny>)> = if let Ok(d) = v.cast::<PyDict>() {
        d.iter()
            .map(|(k, x)| Ok((k.extract::<String>().map_err(err)?, x)))
            .collect::<Result<_, String>>()?
    } else if name == "Row" {
        let d = v.getattr("__dict__").map_err(err)?;
        let d = d.cast::<PyDict>().map_err(|e| e.to_string())?;
        d.iter()
            .map(|(k, x)| Ok((k.extract::<String>().map_err(err)?, x)))
            .collect::<Result<_, String>>()?
    } else {
        return Err(format!("Riverbank cannot store a {name}"));
    };
    let fields = entries
        .iter()
        .map(|(k, x)| Ok(Field::new(k, shape(x)?.unwrap_or(DataType::Null), true)))
        .collect::<Result<Fields, String>>()?;
    Ok(Some(DataType::Struct(fields)))
}

/// One type for the results of two rows: ints widen to floats; unknowns take the other's;
/// results of different types are Beam's `Any`, each kept as it is.
pub fn union(a: Option<DataType>, b: Option<DataType>) -> Option<DataType> {
    use DataType::*;
    match (a, b) {
        (None, x) | (x, None) => x,
        (Some(Null), x) | (x, Some(Null)) => x,
        (Some(a), Some(b)) if a == b => Some(a),
        (Some(a), Some(b)) if any::is_any(&a) || any::is_any(&b) => Some(any::data_type()),
        (Some(Int64), Some(Float64)) | (Some(Float64), Some(Int64)) => Some(Float64),
        (Some(List(a)), Some(List(b))) => {
            let item = union(Some(a.data_type().clone()), Some(b.data_type().clone()));
            Some(DataType::new_list(item.unwrap_or(Null), true))
        }
        (Some(Struct(a)), Some(Struct(b))) => {
            let mut fields: Vec<Field> = a.iter().map(|f| f.as_ref().clone()).collect();
            for f in b.iter() {
                match fields.iter_mut().find(|x| x.name() == f.name()) {
                    Some(x) => {
                        let t = union(Some(x.data_type().clone()), Some(f.data_type().clone()));
                        *x = Field::new(f.name(), t.unwrap_or(Null), true);
                    }
                    None => fields.push(f.as_ref().clone()),
                }
            }
            Some(Struct(fields.into()))
        }
        (Some(_), Some(_)) => Some(any::data_type()),
    }
}
