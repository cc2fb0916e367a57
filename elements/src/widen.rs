//! One schema for rows whose field types differ (Flatten's inputs, Create's elements), without
//! losing a value. Beam keeps each Python row as it is; a collection here has one Arrow schema,
//! so a field's types are widened to one that holds every value:
//! - integers of any width → `Int64`; integers and floats → `Float64` (as Python's arithmetic);
//! - nested rows field by field (a field missing on one side is null there), lists by item;
//! - a null-typed field takes the other type;
//! - any other two (a string and a number, a list and a row, ...) → Beam's `Any` (`crate::any`):
//!   each value kept as it was, `1` stays `1` and `"x"` stays `"x"`.
use crate::any;
use arrow::array::{Array, ArrayRef, AsArray, GenericListArray, StructArray, new_null_array};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Field, FieldRef, Fields};
use std::sync::Arc;

/// The type holding every value of `a` and `b`.
pub fn unify(a: &DataType, b: &DataType) -> DataType {
    use DataType::*;
    if a == b {
        return a.clone();
    }
    let wide_int = |t: &DataType| t.is_integer() && !matches!(t, UInt64);
    match (a, b) {
        (Null, t) | (t, Null) => t.clone(),
        (x, y) if wide_int(x) && wide_int(y) => Int64,
        // A UInt64 and a signed integer: no integer holds both, and a float would round.
        (x, y) if x.is_integer() && y.is_integer() => any::data_type(),
        (x, y) if is_number(x) && is_number(y) => Float64,
        (x, y) if is_string(x) && is_string(y) => Utf8,
        (x, y) if any::is_any(x) || any::is_any(y) => any::data_type(),
        (Struct(fa), Struct(fb)) => Struct(unify_fields(fa, fb)),
        (List(fa), List(fb)) => List(Arc::new(Field::new(
            fa.name(),
            unify(fa.data_type(), fb.data_type()),
            true,
        ))),
        _ => any::data_type(),
    }
}

/// The union of two field lists by name, in first-seen order, each field's types unified; a
/// field missing from one side is nullable.
pub fn unify_fields(a: &Fields, b: &Fields) -> Fields {
    let mut out: Vec<Field> = a.iter().map(|f| f.as_ref().clone()).collect();
    for f in b {
        match out.iter_mut().find(|x| x.name() == f.name()) {
            Some(x) => {
                let t = unify(x.data_type(), f.data_type());
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
    Fields::from(out)
}

fn is_number(t: &DataType) -> bool {
    t.is_integer() || t.is_floating()
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
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
        (_, to) if any::is_any(to) => any::from_array(array),
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{BooleanArray, Int64Array, ListArray};
    use arrow::datatypes::Int64Type;
    use serde_json::json;

    #[test]
    fn numbers_widen_and_anything_else_is_any() {
        use DataType::*;
        assert_eq!(unify(&Int32, &Int64), Int64);
        assert_eq!(unify(&Int64, &Float32), Float64);
        assert_eq!(unify(&Null, &Boolean), Boolean);
        assert_eq!(unify(&Utf8, &LargeUtf8), Utf8);
        assert_eq!(unify(&Utf8, &Boolean), any::data_type());
        assert_eq!(unify(&Float64, &LargeUtf8), any::data_type());
        assert_eq!(
            unify(&UInt64, &Int64),
            any::data_type(),
            "no integer holds both"
        );
        let list = List(Arc::new(Field::new("item", Int64, true)));
        assert_eq!(unify(&list, &Utf8), any::data_type());
        assert_eq!(unify(&any::data_type(), &list), any::data_type());
        let a = Struct(Fields::from(vec![Field::new("a", Int64, true)]));
        let b = Struct(Fields::from(vec![
            Field::new("a", list.clone(), true),
            Field::new("b", Utf8, false),
        ]));
        assert_eq!(
            unify(&a, &b),
            Struct(Fields::from(vec![
                Field::new("a", any::data_type(), true),
                Field::new("b", Utf8, true),
            ]))
        );
    }

    #[test]
    fn values_are_kept_not_rendered_or_nulled() {
        let ints: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None, Some(-7)]));
        let a = conform_array(&ints, &any::data_type()).unwrap();
        assert_eq!(any::values(&a), [Some(json!(1)), None, Some(json!(-7))]);
        let bools: ArrayRef = Arc::new(BooleanArray::from(vec![true, false]));
        let a = conform_array(&bools, &any::data_type()).unwrap();
        assert_eq!(any::values(&a), [Some(json!(true)), Some(json!(false))]);
        let rows = conform_array(&ints, &DataType::Float64).unwrap();
        let rows = Arc::new(
            StructArray::try_new(
                vec![Arc::new(Field::new("x", DataType::Float64, true))].into(),
                vec![rows],
                None,
            )
            .unwrap(),
        ) as ArrayRef;
        let a = conform_array(&rows, &any::data_type()).unwrap();
        assert_eq!(
            any::values(&a)[0],
            Some(json!({"x": 1.0})),
            "a row is kept whole"
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
