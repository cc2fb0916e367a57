//! One schema for rows whose field types differ (Flatten's inputs, Create's elements), without
//! losing a value. Beam keeps each Python row as it is; a collection here has one Arrow schema,
//! so a field's types are widened to one that holds every value:
//! - integers of any width → `Int64`; integers and floats → `Float64` (as Python's arithmetic);
//! - any other two of strings, numbers, booleans, decimals and dates → `Utf8`, the values
//!   rendered as Python's `str` renders them (`1`, `2.5`, `1e+20`, `True`), as arrow's schema
//!   inference does for Create's elements;
//! - nested rows field by field (a field missing on one side is null there), lists by item;
//! - a null-typed field takes the other type.
//!
//! Anything else (a list and a number, a timestamp and a string, ...) has no lossless common
//! type and is an error naming the field and both types.
use arrow::array::{
    Array, ArrayRef, AsArray, GenericListArray, StringArray, StructArray, new_null_array,
};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Field, FieldRef, Fields};
use std::sync::Arc;

/// The type holding every value of `a` and `b` (`path` names the field in errors).
pub fn unify(path: &str, a: &DataType, b: &DataType) -> Result<DataType, String> {
    use DataType::*;
    if a == b {
        return Ok(a.clone());
    }
    Ok(match (a, b) {
        (Null, t) | (t, Null) => t.clone(),
        (x, y) if is_integer(x) && is_integer(y) => {
            if matches!(x, UInt64) || matches!(y, UInt64) {
                return Err(disagree(path, a, b));
            }
            Int64
        }
        (x, y) if is_number(x) && is_number(y) => Float64,
        (x, y) if renders_as_str(x) && renders_as_str(y) => Utf8,
        (Struct(fa), Struct(fb)) => Struct(unify_fields(path, fa, fb)?),
        (List(fa), List(fb)) => {
            let item = unify(&format!("{path}[]"), fa.data_type(), fb.data_type())?;
            List(Arc::new(Field::new(fa.name(), item, true)))
        }
        _ => return Err(disagree(path, a, b)),
    })
}

/// The union of two field lists by name, in first-seen order, each field's types unified; a
/// field missing from one side is nullable.
pub fn unify_fields(path: &str, a: &Fields, b: &Fields) -> Result<Fields, String> {
    let mut out: Vec<Field> = a.iter().map(|f| f.as_ref().clone()).collect();
    for f in b {
        let child = if path.is_empty() {
            f.name().clone()
        } else {
            format!("{path}.{}", f.name())
        };
        match out.iter_mut().find(|x| x.name() == f.name()) {
            Some(x) => {
                let t = unify(&child, x.data_type(), f.data_type())?;
                let nullable = x.is_nullable() || f.is_nullable();
                *x = Field::new(f.name(), t, nullable);
            }
            None => out.push(f.as_ref().clone().with_nullable(true)),
        }
    }
    for x in out.iter_mut() {
        if !b.iter().any(|f| f.name() == x.name()) {
            *x = x.clone().with_nullable(true);
        }
    }
    Ok(Fields::from(out))
}

fn disagree(path: &str, a: &DataType, b: &DataType) -> String {
    format!(
        "inputs disagree on field '{path}': {a} vs {b}, and no type holds both without losing values (convert one with MapToFields first)"
    )
}

fn is_integer(t: &DataType) -> bool {
    t.is_integer()
}

fn is_number(t: &DataType) -> bool {
    t.is_integer() || t.is_floating()
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// Types whose values have a Python `str` rendering we reproduce exactly.
fn renders_as_str(t: &DataType) -> bool {
    is_number(t)
        || is_string(t)
        || matches!(
            t,
            DataType::Boolean
                | DataType::Decimal128(..)
                | DataType::Decimal256(..)
                | DataType::Date32
        )
}

/// `array` as `to`, a type [`unify`] chose for it: every value kept (a cast that would turn
/// a value into null is an error instead).
pub fn conform_array(array: &ArrayRef, to: &DataType) -> Result<ArrayRef, String> {
    if array.data_type() == to {
        return Ok(array.clone());
    }
    if array.data_type() == &DataType::Null {
        return Ok(new_null_array(to, array.len()));
    }
    match (array.data_type(), to) {
        (DataType::Struct(_), DataType::Struct(fields)) => conform_struct(array, fields),
        (DataType::List(_), DataType::List(item)) => {
            let list = array.as_list::<i32>();
            let values = conform_array(list.values(), item.data_type())?;
            Ok(Arc::new(
                GenericListArray::<i32>::try_new(
                    item.clone(),
                    list.offsets().clone(),
                    values,
                    list.nulls().cloned(),
                )
                .map_err(|e| e.to_string())?,
            ))
        }
        (from, DataType::Utf8) if from.is_floating() => {
            let f = cast_with_options(array, &DataType::Float64, &strict())
                .map_err(|e| e.to_string())?;
            let f = f.as_primitive::<arrow::datatypes::Float64Type>();
            Ok(Arc::new(
                f.iter()
                    .map(|v| v.map(python_float))
                    .collect::<StringArray>(),
            ))
        }
        (DataType::Boolean, DataType::Utf8) => Ok(Arc::new(
            array
                .as_boolean()
                .iter()
                .map(|v| v.map(|b| if b { "True" } else { "False" }))
                .collect::<StringArray>(),
        )),
        _ => cast_with_options(array, to, &strict()).map_err(|e| e.to_string()),
    }
}

fn conform_struct(array: &ArrayRef, fields: &Fields) -> Result<ArrayRef, String> {
    let s = array.as_struct();
    let mut cols = Vec::with_capacity(fields.len());
    for f in fields {
        cols.push(match s.column_by_name(f.name()) {
            Some(c) => conform_array(c, f.data_type())?,
            None => new_null_array(f.data_type(), s.len()),
        });
    }
    let fields: Vec<FieldRef> = fields.iter().cloned().collect();
    Ok(Arc::new(
        StructArray::try_new(fields.into(), cols, s.nulls().cloned()).map_err(|e| e.to_string())?,
    ))
}

/// Casts that fail rather than turn a value into null.
fn strict() -> CastOptions<'static> {
    CastOptions {
        safe: false,
        ..Default::default()
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{BooleanArray, Float64Array, Int64Array, ListArray};
    use arrow::datatypes::Int64Type;

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
    fn numbers_widen_and_strings_take_everything_they_can_render() {
        use DataType::*;
        assert_eq!(unify("x", &Int32, &Int64).unwrap(), Int64);
        assert_eq!(unify("x", &Int64, &Float32).unwrap(), Float64);
        assert_eq!(unify("x", &Null, &Boolean).unwrap(), Boolean);
        assert_eq!(unify("x", &Utf8, &Boolean).unwrap(), Utf8);
        assert_eq!(unify("x", &Float64, &LargeUtf8).unwrap(), Utf8);
        assert_eq!(unify("x", &Boolean, &Int64).unwrap(), Utf8);
        let list = List(Arc::new(Field::new("item", Int64, true)));
        let e = unify("x", &list, &Utf8).unwrap_err();
        assert!(e.contains("'x'") && e.contains("List"), "{e}");
        let a = Struct(Fields::from(vec![Field::new("a", Int64, true)]));
        let b = Struct(Fields::from(vec![Field::new("a", list.clone(), true)]));
        let e = unify("pos", &a, &b).unwrap_err();
        assert!(e.contains("'pos.a'") && e.contains("Int64 vs List"), "{e}");
    }

    #[test]
    fn values_are_rendered_not_nulled() {
        let ints: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None, Some(-7)]));
        let s = conform_array(&ints, &DataType::Utf8).unwrap();
        let s = s.as_string::<i32>();
        assert_eq!(s.iter().collect::<Vec<_>>(), [Some("1"), None, Some("-7")]);
        let floats: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 1e20]));
        let s = conform_array(&floats, &DataType::Utf8).unwrap();
        assert_eq!(
            s.as_string::<i32>().iter().collect::<Vec<_>>(),
            [Some("1.0"), Some("1e+20")]
        );
        let bools: ArrayRef = Arc::new(BooleanArray::from(vec![true, false]));
        let s = conform_array(&bools, &DataType::Utf8).unwrap();
        assert_eq!(
            s.as_string::<i32>().iter().collect::<Vec<_>>(),
            [Some("True"), Some("False")]
        );
        let lists: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
            Some(vec![Some(1), Some(2)]),
            None,
        ]));
        let to = DataType::List(Arc::new(Field::new("item", DataType::Float64, true)));
        let l = conform_array(&lists, &to).unwrap();
        assert_eq!(l.data_type(), &to);
        assert!(l.is_null(1));
        let l = l.as_list::<i32>();
        assert_eq!(
            l.value(0)
                .as_primitive::<arrow::datatypes::Float64Type>()
                .values()
                .to_vec(),
            [1.0, 2.0]
        );
    }
}
