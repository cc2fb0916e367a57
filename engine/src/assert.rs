//! `AssertEqual`: the collection must hold exactly the expected elements, in any order.
use crate::error::RunError;
use serde_json::Value;

/// Canonical text of a row: keys sorted, numbers compared as numbers (1 == 1.0).
fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let inner: Vec<String> = keys
                .iter()
                .filter(|k| !m[k.as_str()].is_null())
                .map(|k| format!("{k:?}:{}", canonical(&m[k.as_str()])))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        Value::Number(n) => n
            .as_f64()
            .map(|f| format!("{f}"))
            .unwrap_or_else(|| n.to_string()),
        other => other.to_string(),
    }
}

pub fn assert_equal(
    transform: &str,
    expected: &[Value],
    actual: Vec<Value>,
) -> Result<(), RunError> {
    let wrap = |v: &Value| {
        if v.is_object() {
            v.clone()
        } else {
            serde_json::json!({ "element": v })
        }
    };
    let mut want: Vec<String> = expected.iter().map(|v| canonical(&wrap(v))).collect();
    let mut got: Vec<String> = actual.iter().map(canonical).collect();
    want.sort();
    got.sort();
    if want == got {
        return Ok(());
    }
    let (mut missing, mut unexpected) = (vec![], vec![]);
    let (mut i, mut j) = (0, 0);
    while i < want.len() || j < got.len() {
        match (want.get(i), got.get(j)) {
            (Some(a), Some(b)) if a == b => {
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a < b => {
                missing.push(a.clone());
                i += 1;
            }
            (Some(_), Some(b)) => {
                unexpected.push(b.clone());
                j += 1;
            }
            (Some(a), None) => {
                missing.push(a.clone());
                i += 1;
            }
            (None, Some(b)) => {
                unexpected.push(b.clone());
                j += 1;
            }
            (None, None) => break,
        }
    }
    let show = |v: &[String]| {
        v.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
            + if v.len() > 5 { ", …" } else { "" }
    };
    Err(RunError::Assertion {
        transform: transform.to_string(),
        message: format!(
            "expected {} elements, got {}; missing {} [{}]; unexpected {} [{}]",
            want.len(),
            got.len(),
            missing.len(),
            show(&missing),
            unexpected.len(),
            show(&unexpected)
        ),
    })
}
