//! The JSON schemas `ValidateWithSchema` checks rows against. Beam validates each row, as
//! JSON (null fields left out), with Python's `jsonschema` (its latest draft when `$schema`
//! is absent). Supported here: `type` (one or a list), `properties`, `required`,
//! `additionalProperties`, `items`, `enum`, `const`, `minimum`, `maximum`, `exclusiveMinimum`,
//! `exclusiveMaximum`, `minLength`, `maxLength`, `pattern`, `minItems`, `maxItems`, and `true`
//! / `false` schemas; annotations (`title`, `description`, `format`, ...) are ignored, as
//! `jsonschema` ignores them. Any other keyword is refused rather than ignored, so a row is
//! never accepted that Beam would reject.

use regex::Regex;
use serde_json::{Map, Value};

/// A compiled schema.
#[derive(Debug, Clone, Default)]
pub struct JsonSchema {
    /// `false` schema: nothing is valid.
    never: bool,
    types: Option<Vec<String>>,
    properties: Vec<(String, JsonSchema)>,
    required: Vec<String>,
    /// `additionalProperties`: `None` allows any.
    additional: Option<Box<JsonSchema>>,
    items: Option<Box<JsonSchema>>,
    one_of_values: Option<Vec<Value>>,
    constant: Option<Value>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    exclusive_minimum: Option<f64>,
    exclusive_maximum: Option<f64>,
    min_length: Option<usize>,
    max_length: Option<usize>,
    min_items: Option<usize>,
    max_items: Option<usize>,
    pattern: Option<(String, Regex)>,
}

const TYPES: &[&str] = &[
    "null", "boolean", "integer", "number", "string", "array", "object",
];
/// Keywords that only annotate: `jsonschema` does not validate them (`format` included, as
/// Beam passes no format checker).
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "title",
    "description",
    "default",
    "examples",
    "format",
    "readOnly",
    "writeOnly",
    "deprecated",
];

impl JsonSchema {
    /// Compiles a schema; errors name the keyword's place (`properties.x.type`).
    pub fn compile(v: &Value) -> Result<JsonSchema, String> {
        compile_at(v, "")
    }

    /// Checks one row (as JSON, null fields left out); the error names the field.
    pub fn validate(&self, row: &Value) -> Result<(), String> {
        self.check(row, "")
    }

    fn check(&self, v: &Value, at: &str) -> Result<(), String> {
        let fail = |m: String| {
            Err(if at.is_empty() {
                m
            } else {
                format!("field '{at}': {m}")
            })
        };
        if self.never {
            return fail(format!("{v} is not allowed"));
        }
        if let Some(types) = &self.types
            && !types.iter().any(|t| is_type(v, t))
        {
            let names: Vec<String> = types.iter().map(|t| format!("'{t}'")).collect();
            return fail(format!("{v} is not of type {}", names.join(", ")));
        }
        if let Some(values) = &self.one_of_values
            && !values.iter().any(|x| json_eq(x, v))
        {
            return fail(format!(
                "{v} is not one of {}",
                Value::Array(values.clone())
            ));
        }
        if let Some(c) = &self.constant
            && !json_eq(c, v)
        {
            return fail(format!("{c} was expected"));
        }
        if let Some(x) = v.as_f64().filter(|_| v.is_number()) {
            let bound = |b: f64| {
                Value::from(b)
                    .to_string()
                    .trim_end_matches(".0")
                    .to_string()
            };
            if let Some(m) = self.minimum.filter(|m| x < *m) {
                return fail(format!("{v} is less than the minimum of {}", bound(m)));
            }
            if let Some(m) = self.maximum.filter(|m| x > *m) {
                return fail(format!("{v} is greater than the maximum of {}", bound(m)));
            }
            if let Some(m) = self.exclusive_minimum.filter(|m| x <= *m) {
                return fail(format!(
                    "{v} is less than or equal to the minimum of {}",
                    bound(m)
                ));
            }
            if let Some(m) = self.exclusive_maximum.filter(|m| x >= *m) {
                return fail(format!(
                    "{v} is greater than or equal to the maximum of {}",
                    bound(m)
                ));
            }
        }
        if let Value::String(s) = v {
            let n = s.chars().count();
            if self.min_length.is_some_and(|m| n < m) {
                return fail(format!("{v} is too short"));
            }
            if self.max_length.is_some_and(|m| n > m) {
                return fail(format!("{v} is too long"));
            }
            if let Some((p, re)) = &self.pattern
                && !re.is_match(s)
            {
                return fail(format!("{v} does not match {}", Value::from(p.as_str())));
            }
        }
        if let Value::Array(a) = v {
            if self.min_items.is_some_and(|m| a.len() < m) {
                return fail(format!("{v} is too short"));
            }
            if self.max_items.is_some_and(|m| a.len() > m) {
                return fail(format!("{v} is too long"));
            }
            if let Some(items) = &self.items {
                for (i, x) in a.iter().enumerate() {
                    items.check(x, &format!("{at}[{i}]"))?;
                }
            }
        }
        if let Value::Object(m) = v {
            for r in &self.required {
                if !m.contains_key(r) {
                    return fail(format!("'{r}' is a required property"));
                }
            }
            for (k, x) in m {
                let child = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                match self.properties.iter().find(|(p, _)| p == k) {
                    Some((_, s)) => s.check(x, &child)?,
                    None => match &self.additional {
                        Some(s) if s.never => {
                            return fail(format!(
                                "additional properties are not allowed ('{k}' was unexpected)"
                            ));
                        }
                        Some(s) => s.check(x, &child)?,
                        None => {}
                    },
                }
            }
        }
        Ok(())
    }
}

fn compile_at(v: &Value, at: &str) -> Result<JsonSchema, String> {
    let here = |k: &str| {
        if at.is_empty() {
            k.to_string()
        } else {
            format!("{at}.{k}")
        }
    };
    let m: &Map<String, Value> = match v {
        Value::Bool(b) => {
            return Ok(JsonSchema {
                never: !b,
                ..Default::default()
            });
        }
        Value::Object(m) => m,
        _ => {
            let at = if at.is_empty() { "the schema" } else { at };
            return Err(format!("{at} must be a mapping (a JSON schema)"));
        }
    };
    let mut s = JsonSchema::default();
    let number = |k: &str, x: &Value| {
        x.as_f64()
            .ok_or_else(|| format!("{} must be a number", here(k)))
    };
    let count = |k: &str, x: &Value| {
        x.as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| format!("{} must be a non-negative integer", here(k)))
    };
    for (k, x) in m {
        match k.as_str() {
            "type" => {
                let types: Vec<String> = match x {
                    Value::String(t) => vec![t.clone()],
                    Value::Array(a) => a
                        .iter()
                        .map(|t| t.as_str().map(String::from))
                        .collect::<Option<_>>()
                        .ok_or_else(|| format!("{} must be a type name or a list", here(k)))?,
                    _ => return Err(format!("{} must be a type name or a list", here(k))),
                };
                if let Some(t) = types.iter().find(|t| !TYPES.contains(&t.as_str())) {
                    return Err(format!(
                        "{}: unknown type '{t}' (types: {})",
                        here(k),
                        TYPES.join(", ")
                    ));
                }
                s.types = Some(types);
            }
            "properties" => {
                let props = x
                    .as_object()
                    .ok_or_else(|| format!("{} must map field names to schemas", here(k)))?;
                for (name, p) in props {
                    s.properties
                        .push((name.clone(), compile_at(p, &here(&format!("{k}.{name}")))?));
                }
            }
            "required" => {
                s.required = x
                    .as_array()
                    .and_then(|a| {
                        a.iter()
                            .map(|n| n.as_str().map(String::from))
                            .collect::<Option<_>>()
                    })
                    .ok_or_else(|| format!("{} must be a list of field names", here(k)))?;
            }
            "additionalProperties" => s.additional = Some(Box::new(compile_at(x, &here(k))?)),
            "items" => s.items = Some(Box::new(compile_at(x, &here(k))?)),
            "enum" => {
                s.one_of_values = Some(
                    x.as_array()
                        .cloned()
                        .ok_or_else(|| format!("{} must be a list", here(k)))?,
                )
            }
            "const" => s.constant = Some(x.clone()),
            "minimum" => s.minimum = Some(number(k, x)?),
            "maximum" => s.maximum = Some(number(k, x)?),
            "exclusiveMinimum" => s.exclusive_minimum = Some(number(k, x)?),
            "exclusiveMaximum" => s.exclusive_maximum = Some(number(k, x)?),
            "minLength" => s.min_length = Some(count(k, x)?),
            "maxLength" => s.max_length = Some(count(k, x)?),
            "minItems" => s.min_items = Some(count(k, x)?),
            "maxItems" => s.max_items = Some(count(k, x)?),
            "pattern" => {
                let p = x
                    .as_str()
                    .ok_or_else(|| format!("{} must be a string", here(k)))?;
                // `jsonschema` searches (unanchored), as `Regex::is_match` does.
                let re = Regex::new(p).map_err(|e| {
                    format!(
                        "{}: {p:?} is not a supported regular expression: {e}",
                        here(k)
                    )
                })?;
                s.pattern = Some((p.to_string(), re));
            }
            a if ANNOTATIONS.contains(&a) => {}
            other => {
                return Err(format!(
                    "{}: keyword '{other}' is not supported (supported: type, properties, required, additionalProperties, items, enum, const, minimum, maximum, exclusiveMinimum, exclusiveMaximum, minLength, maxLength, pattern, minItems, maxItems)",
                    here(other)
                ));
            }
        }
    }
    Ok(s)
}

/// `jsonschema`'s type checks: an integral float is an integer; a boolean is not a number.
fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "number" => v.is_number(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        _ => false,
    }
}

/// JSON equality with `1 == 1.0`, as `jsonschema` compares for `enum` and `const`.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, a)| y.get(k).is_some_and(|b| json_eq(a, b)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(v: Value) -> JsonSchema {
        JsonSchema::compile(&v).unwrap()
    }

    #[test]
    fn types_follow_jsonschema() {
        let s = schema(
            json!({"properties": {"n": {"type": "integer"}, "x": {"type": ["number", "null"]}}}),
        );
        assert_eq!(s.validate(&json!({"n": 2, "x": 1.5})), Ok(()));
        assert_eq!(s.validate(&json!({"n": 2.0, "x": null})), Ok(()));
        assert_eq!(
            s.validate(&json!({"n": 2.5})),
            Err("field 'n': 2.5 is not of type 'integer'".into())
        );
        assert_eq!(
            s.validate(&json!({"n": true})),
            Err("field 'n': true is not of type 'integer'".into())
        );
        assert_eq!(
            s.validate(&json!({"x": "a"})),
            Err("field 'x': \"a\" is not of type 'number', 'null'".into())
        );
    }

    #[test]
    fn additional_properties_and_nested_rows_are_checked() {
        let s = schema(json!({
            "type": "object",
            "properties": {"pos": {"type": "object", "properties": {"lat": {"maximum": 90}}}},
            "additionalProperties": false
        }));
        assert_eq!(s.validate(&json!({"pos": {"lat": 90}})), Ok(()));
        assert_eq!(
            s.validate(&json!({"pos": {"lat": 91}})),
            Err("field 'pos.lat': 91 is greater than the maximum of 90".into())
        );
        assert_eq!(
            s.validate(&json!({"pos": {}, "x": 1})),
            Err("additional properties are not allowed ('x' was unexpected)".into())
        );
        let s = schema(json!({"items": {"type": "string", "maxLength": 2}}));
        assert_eq!(
            s.validate(&json!(["ab", "abc"])),
            Err("field '[1]': \"abc\" is too long".into())
        );
        assert_eq!(
            schema(json!(false)).validate(&json!({})),
            Err("{} is not allowed".into())
        );
        assert_eq!(schema(json!({"const": 1})).validate(&json!(1.0)), Ok(()));
    }
}
