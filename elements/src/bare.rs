//! Values that are not rows (`3`, `"a"`) as Beam gives them from a Python PTransform: a row of
//! one field `element`, as Beam YAML's Create and Riverbank's hold such values, marked so that a
//! JSON sink writes the value itself, as Beam's WriteToJson does. The mark is the field's
//! metadata, so it lasts while rows pass through unchanged (Filter, a shuffle) and ends where
//! a transform makes rows of the values.
use arrow::datatypes::{Field, Schema};

/// The metadata key marking the field, and its value.
pub const KEY: &str = "riverbank.value";
pub const BARE: &str = "bare";

/// The one field of such values, of type `t`.
pub fn field(t: arrow::datatypes::DataType) -> Field {
    Field::new("element", t, true).with_metadata([(KEY.to_string(), BARE.to_string())].into())
}

/// Whether rows of `schema` are values that are not rows (its hidden columns aside).
pub fn is_bare(schema: &Schema) -> bool {
    let mut user = schema
        .fields()
        .iter()
        .filter(|f| !crate::columns::is_hidden(f.name()));
    match (user.next(), user.next()) {
        (Some(f), None) => {
            f.name() == "element" && f.metadata().get(KEY).is_some_and(|v| v == BARE)
        }
        _ => false,
    }
}
