//! YAML read the way Beam reads it: PyYAML's safe loader, i.e. YAML 1.1 scalars resolved with
//! PyYAML's own implicit resolvers (`lib/yaml/resolver.py`) and built by its `SafeConstructor`
//! (`lib/yaml/constructor.py`), then mapped onto JSON, the pipeline model's values.
//!
//! The text is parsed into events by `granit-parser` (which reports each scalar's style), and
//! a plain scalar's tag is decided by the resolver regexes, so:
//! - `n`, `y` stay strings; `yes`/`no`/`on`/`off`/`true`/`false` (lower, Capitalised or UPPER
//!   case) are booleans; `~`, `null`/`Null`/`NULL` and the empty scalar are null;
//! - ints: `0x10` = 16, `010` = 8 (octal), `0b11` = 3, `1_000` = 1000, `1:30` = 90 (base 60);
//!   `0o10`, `08` are strings (YAML 1.1 has no `0o`, and `8` is no octal digit);
//! - floats need a dot: `.5`, `1.5`, `1.0e+3`, `1:30.5`, `.inf`, `.nan`; `1e3` and `1.0e3`
//!   (PyYAML wants a sign in the exponent) are strings;
//! - quoted and block scalars are always strings; explicit core tags (`!!str`, `!!int`, …)
//!   are honoured, other tags are refused as PyYAML's safe loader refuses them;
//! - anchors, aliases and merge keys (`<<`, a mapping or a list of them) as PyYAML merges them:
//!   the mapping's own keys win, and among merged mappings the earlier one wins; a key given
//!   twice keeps its last value.
//!
//! Where JSON cannot hold what PyYAML builds, the choice is documented on the case:
//! - timestamps (`2024-01-01`, `2024-01-01 10:00:00Z`) are a `datetime.date`/`datetime` in
//!   PyYAML, which Beam 2.77 then refuses in a transform's config ("Invalid transform
//!   specification …: Object of type date is not JSON serializable", e.g. in a Create
//!   element); here they stay the text as written (JSON has no date), which every Riverbank
//!   field that takes a time parses;
//! - `.inf`/`-.inf`/`.nan` are refused with the place they were found: JSON numbers are finite;
//! - mapping keys are strings in the model: a key PyYAML reads as something else is written
//!   the way `json.dumps` writes such a key (`on:` → `"true"`, `1:` → `"1"`, `~:` → `"null"`).
//!   (Beam itself keeps the non-string key, and then fails where it becomes a keyword argument
//!   or a row field, so no working Beam pipeline depends on it.)
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::LazyLock;

use granit_parser::{Event, Options, Parser, ScalarStyle, Span, Tag};
use regex::Regex;
use serde_json::{Map, Number, Value};

const CORE: &str = "tag:yaml.org,2002:";

/// What a scalar resolves to (PyYAML's implicit resolvers; exposed for tests and callers that
/// want the tag rather than the JSON value).
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    /// A date or date-time, kept as written.
    Timestamp(String),
    Str(String),
}

// PyYAML's resolver regexes (compiled there with re.X, so the whitespace is dropped here).
static BOOL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$")
        .expect("a valid regex")
});
static FLOAT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?",
        r"|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?",
        r"|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*",
        r"|[-+]?\.(?:inf|Inf|INF)",
        r"|\.(?:nan|NaN|NAN))$"
    ))
    .expect("a valid regex")
});
static INT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"^(?:[-+]?0b[0-1_]+",
        r"|[-+]?0[0-7_]+",
        r"|[-+]?(?:0|[1-9][0-9_]*)",
        r"|[-+]?0x[0-9a-fA-F_]+",
        r"|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$"
    ))
    .expect("a valid regex")
});
static NULL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(?:~|null|Null|NULL|)$").expect("a valid regex"));
static TIMESTAMP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"^(?:[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]",
        r"|[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?",
        r"(?:[Tt]|[ \t]+)[0-9][0-9]?",
        r":[0-9][0-9]:[0-9][0-9](?:\.[0-9]*)?",
        r"(?:[ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?)$"
    ))
    .expect("a valid regex")
});

/// The tag PyYAML's resolver gives a plain scalar (`None`: `str`).
fn implicit_tag(text: &str) -> Option<&'static str> {
    // The resolvers never overlap, so their order (bool, float, int, merge, null, timestamp,
    // value) does not matter here.
    if BOOL.is_match(text) {
        Some("bool")
    } else if FLOAT.is_match(text) {
        Some("float")
    } else if INT.is_match(text) {
        Some("int")
    } else if text == "<<" {
        Some("merge")
    } else if NULL.is_match(text) {
        Some("null")
    } else if TIMESTAMP.is_match(text) {
        Some("timestamp")
    } else if text == "=" {
        Some("value")
    } else {
        None
    }
}

/// Resolves and builds a plain (unquoted) scalar as PyYAML's safe loader does.
pub fn resolve_plain(text: &str) -> Result<Scalar, String> {
    match implicit_tag(text) {
        None | Some("merge") => Ok(Scalar::Str(text.to_string())),
        Some("value") => Err(format!(
            "'{text}' is YAML 1.1's value key; PyYAML cannot build it as a value (quote it)"
        )),
        Some(tag) => construct(tag, text),
    }
}

/// PyYAML's `SafeConstructor` for a core scalar tag.
fn construct(tag: &str, text: &str) -> Result<Scalar, String> {
    match tag {
        "str" => Ok(Scalar::Str(text.to_string())),
        "null" => Ok(Scalar::Null),
        "bool" => match text.to_lowercase().as_str() {
            "yes" | "true" | "on" => Ok(Scalar::Bool(true)),
            "no" | "false" | "off" => Ok(Scalar::Bool(false)),
            _ => Err(format!("'{text}' is not a YAML boolean")),
        },
        "int" => construct_int(text).ok_or_else(|| format!("'{text}' is not a YAML int")),
        "float" => construct_float(text).ok_or_else(|| format!("'{text}' is not a YAML float")),
        "timestamp" => Ok(Scalar::Timestamp(text.to_string())),
        other => Err(format!(
            "could not determine a constructor for the tag '{}' (Beam reads YAML with PyYAML's \
             safe loader; a pipeline holds no binary, set or ordered-map values)",
            if other.starts_with('!') {
                other.to_string()
            } else {
                format!("!!{other}")
            }
        )),
    }
}

fn split_sign(text: &str) -> (i128, &str) {
    match text.as_bytes().first() {
        Some(b'-') => (-1, &text[1..]),
        Some(b'+') => (1, &text[1..]),
        _ => (1, text),
    }
}

fn construct_int(text: &str) -> Option<Scalar> {
    let cleaned = text.replace('_', "");
    let (sign, v) = split_sign(&cleaned);
    let magnitude = if v == "0" {
        0
    } else if let Some(b) = v.strip_prefix("0b") {
        i128::from_str_radix(b, 2).ok()?
    } else if let Some(h) = v.strip_prefix("0x") {
        i128::from_str_radix(h, 16).ok()?
    } else if v.starts_with('0') {
        i128::from_str_radix(v, 8).ok()?
    } else if v.contains(':') {
        let mut value: i128 = 0;
        for part in v.split(':') {
            value = value
                .checked_mul(60)?
                .checked_add(part.parse::<i128>().ok()?)?;
        }
        value
    } else {
        v.parse::<i128>().ok()?
    };
    Some(Scalar::Int(sign * magnitude))
}

fn construct_float(text: &str) -> Option<Scalar> {
    let cleaned = text.replace('_', "").to_lowercase();
    let (sign, v) = split_sign(&cleaned);
    let sign = sign as f64;
    let value = if v == ".inf" {
        f64::INFINITY
    } else if v == ".nan" {
        return Some(Scalar::Float(f64::NAN));
    } else if v.contains(':') {
        let mut value = 0.0;
        for part in v.split(':') {
            value = value * 60.0 + python_float(part)?;
        }
        value
    } else {
        python_float(v)?
    };
    Some(Scalar::Float(sign * value))
}

/// Python's `float()` of what the float regex lets through (`1.`, `.5`, `1.e+3`).
fn python_float(s: &str) -> Option<f64> {
    if let Ok(v) = s.parse::<f64>() {
        return Some(v);
    }
    // Rust wants a digit after the dot before an exponent; Python does not.
    let fixed = s.replacen(".e", ".0e", 1);
    fixed.parse::<f64>().ok()
}

/// A mapping's key–value nodes, in order.
type Pairs = Vec<(Rc<Node>, Rc<Node>)>;

/// A node of the document, shared by its anchor's aliases.
#[derive(Debug)]
enum Node {
    Scalar {
        value: String,
        style: ScalarStyle,
        tag: Option<String>,
        at: Span,
    },
    Seq(Vec<Rc<Node>>),
    Map(Pairs, Span),
}

enum Open {
    Seq(Vec<Rc<Node>>, usize),
    Map(Vec<Rc<Node>>, usize, Span),
}

fn where_(span: &Span) -> String {
    format!("line {} column {}", span.start.line(), span.start.col() + 1)
}

/// The tag's name in the core schema (`str`, `int`, …), or the tag as written.
fn tag_name(tag: &Tag) -> String {
    match tag.suffix_in_namespace(CORE) {
        Some(s) => s.into_owned(),
        None => tag.original(),
    }
}

/// The non-specific tag `!`.
fn is_non_specific(tag: &Tag) -> bool {
    tag.parts() == ("", "!")
}

/// Parses one YAML document (the only one in `text`) into JSON as Beam's loader reads it.
pub fn from_str(text: &str) -> Result<Value, String> {
    let mut options = Options::default();
    options.set_emit_comments(false);
    let parser = Parser::new_from_str_with_options(text, options);
    let mut anchors: HashMap<usize, Rc<Node>> = HashMap::new();
    let mut stack: Vec<Open> = Vec::new();
    let mut documents: Vec<Option<Rc<Node>>> = Vec::new();
    let mut root: Option<Rc<Node>> = None;
    for event in parser {
        let (event, span) = event.map_err(|e| e.to_string())?;
        let done: Rc<Node> = match event {
            Event::StreamStart | Event::StreamEnd => continue,
            Event::DocumentStart(..) => {
                if !documents.is_empty() {
                    return Err(format!(
                        "expected a single document in the stream, but found another at {}",
                        where_(&span)
                    ));
                }
                root = None;
                continue;
            }
            Event::DocumentEnd => {
                documents.push(root.take());
                continue;
            }
            Event::Alias(id) => anchors.get(&id).cloned().ok_or_else(|| {
                format!(
                    "the alias at {} refers to a node that contains it (a recursive node)",
                    where_(&span)
                )
            })?,
            Event::Scalar(value, style, anchor, tag) => {
                // PyYAML resolves a scalar with the non-specific tag `!` as if it were plain,
                // quoted or not (`! '12'` is 12).
                let non_specific = tag.as_deref().is_some_and(is_non_specific);
                let node = Rc::new(Node::Scalar {
                    value: value.into_owned(),
                    style: if non_specific {
                        ScalarStyle::Plain
                    } else {
                        style
                    },
                    tag: tag.filter(|t| !is_non_specific(t)).map(|t| tag_name(&t)),
                    at: span,
                });
                if anchor != 0 {
                    anchors.insert(anchor, node.clone());
                }
                node
            }
            Event::SequenceStart(_, anchor, tag) => {
                check_collection_tag(tag.as_deref(), "seq", &span)?;
                stack.push(Open::Seq(Vec::new(), anchor));
                continue;
            }
            Event::MappingStart(_, anchor, tag) => {
                check_collection_tag(tag.as_deref(), "map", &span)?;
                stack.push(Open::Map(Vec::new(), anchor, span));
                continue;
            }
            Event::SequenceEnd => match stack.pop() {
                Some(Open::Seq(items, anchor)) => {
                    let node = Rc::new(Node::Seq(items));
                    if anchor != 0 {
                        anchors.insert(anchor, node.clone());
                    }
                    node
                }
                _ => return Err("unbalanced sequence end".into()),
            },
            Event::MappingEnd => match stack.pop() {
                Some(Open::Map(items, anchor, at)) => {
                    if items.len() % 2 != 0 {
                        return Err(format!("a mapping at {} lacks a value", where_(&at)));
                    }
                    let mut it = items.into_iter();
                    let mut pairs = Vec::new();
                    while let (Some(k), Some(v)) = (it.next(), it.next()) {
                        pairs.push((k, v));
                    }
                    let node = Rc::new(Node::Map(pairs, at));
                    if anchor != 0 {
                        anchors.insert(anchor, node.clone());
                    }
                    node
                }
                _ => return Err("unbalanced mapping end".into()),
            },
            // Comments (not asked for), anchor metadata and unresolved aliases (not enabled).
            _ => continue,
        };
        match stack.last_mut() {
            Some(Open::Seq(items, _)) | Some(Open::Map(items, _, _)) => items.push(done),
            None => root = Some(done),
        }
    }
    match documents.pop().flatten() {
        None => Ok(Value::Null),
        Some(node) => build(&node, false),
    }
}

fn check_collection_tag(tag: Option<&Tag>, kind: &str, span: &Span) -> Result<(), String> {
    match tag.filter(|t| !is_non_specific(t)).map(tag_name) {
        None => Ok(()),
        Some(t) if t == kind => Ok(()),
        Some(t) => Err(format!(
            "could not determine a constructor for the tag '{t}' at {} (Beam reads YAML with \
             PyYAML's safe loader)",
            where_(span)
        )),
    }
}

/// The scalar PyYAML builds from a scalar node.
fn scalar_of(
    value: &str,
    style: ScalarStyle,
    tag: Option<&str>,
    at: &Span,
) -> Result<Scalar, String> {
    let r = match tag {
        Some(t) => construct(t, value),
        None if style == ScalarStyle::Plain => resolve_plain(value),
        None => Ok(Scalar::Str(value.to_string())),
    };
    r.map_err(|e| format!("{e} (at {})", where_(at)))
}

/// PyYAML's `flatten_mapping`: merged pairs first (a list of mappings: the earlier wins),
/// then the mapping's own, so that inserting them in order lets the right one win.
fn flattened(pairs: &[(Rc<Node>, Rc<Node>)], at: &Span) -> Result<Pairs, String> {
    let is_merge = |k: &Node| {
        matches!(k, Node::Scalar { value, style: ScalarStyle::Plain, tag: None, .. } if value == "<<")
            || matches!(k, Node::Scalar { tag: Some(t), .. } if t == "merge")
    };
    let mut merge = Vec::new();
    let mut own = Vec::new();
    for (k, v) in pairs {
        if !is_merge(k) {
            own.push((k.clone(), v.clone()));
            continue;
        }
        match &**v {
            Node::Map(sub, sub_at) => merge.extend(flattened(sub, sub_at)?),
            Node::Seq(items) => {
                let mut subs = Vec::new();
                for item in items {
                    match &**item {
                        Node::Map(sub, sub_at) => subs.push(flattened(sub, sub_at)?),
                        _ => {
                            return Err(format!(
                                "expected a mapping for merging at {}, but found a {}",
                                where_(at),
                                kind(item)
                            ));
                        }
                    }
                }
                for sub in subs.into_iter().rev() {
                    merge.extend(sub);
                }
            }
            other => {
                return Err(format!(
                    "expected a mapping or list of mappings for merging at {}, but found a {}",
                    where_(at),
                    kind(other)
                ));
            }
        }
    }
    merge.extend(own);
    Ok(merge)
}

fn kind(n: &Node) -> &'static str {
    match n {
        Node::Scalar { .. } => "scalar",
        Node::Seq(_) => "sequence",
        Node::Map(..) => "mapping",
    }
}

fn build(node: &Node, key: bool) -> Result<Value, String> {
    match node {
        Node::Scalar {
            value,
            style,
            tag,
            at,
        } => {
            // A `=` key is a string key (PyYAML's flatten_mapping retags it).
            if key && tag.is_none() && *style == ScalarStyle::Plain && value == "=" {
                return Ok(Value::String(value.clone()));
            }
            Ok(match scalar_of(value, *style, tag.as_deref(), at)? {
                Scalar::Null => Value::Null,
                Scalar::Bool(b) => Value::Bool(b),
                Scalar::Int(i) => {
                    if let Ok(v) = i64::try_from(i) {
                        Value::from(v)
                    } else if let Ok(v) = u64::try_from(i) {
                        Value::from(v)
                    } else {
                        return Err(format!(
                            "the integer '{value}' at {} does not fit in 64 bits",
                            where_(at)
                        ));
                    }
                }
                Scalar::Float(f) => Value::Number(Number::from_f64(f).ok_or_else(|| {
                    format!(
                        "'{value}' at {} is a float JSON cannot hold (pipelines carry finite \
                         numbers only)",
                        where_(at)
                    )
                })?),
                Scalar::Timestamp(s) | Scalar::Str(s) => Value::String(s),
            })
        }
        Node::Seq(items) => Ok(Value::Array(
            items
                .iter()
                .map(|i| build(i, false))
                .collect::<Result<_, _>>()?,
        )),
        Node::Map(pairs, at) => {
            let mut out = Map::new();
            for (k, v) in flattened(pairs, at)? {
                let key = match build(&k, true)? {
                    Value::String(s) => s,
                    Value::Null => "null".into(),
                    Value::Bool(b) => b.to_string(),
                    Value::Number(n) => n.to_string(),
                    _ => {
                        return Err(format!(
                            "a mapping at {} has a {} as a key; pipelines take scalar keys",
                            where_(at),
                            kind(&k)
                        ));
                    }
                };
                out.insert(key, build(&v, false)?);
            }
            Ok(Value::Object(out))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn value(text: &str) -> Value {
        from_str(&format!("v: {text}\n")).unwrap()["v"].clone()
    }

    #[test]
    fn booleans_are_yaml_1_1s() {
        for t in [
            "yes", "Yes", "YES", "on", "On", "ON", "true", "True", "TRUE",
        ] {
            assert_eq!(value(t), json!(true), "{t}");
        }
        for f in [
            "no", "No", "NO", "off", "Off", "OFF", "false", "False", "FALSE",
        ] {
            assert_eq!(value(f), json!(false), "{f}");
        }
        // Not booleans in PyYAML: single letters and odd cases.
        for s in ["n", "y", "N", "Y", "yEs", "oN", "tRUE"] {
            assert_eq!(value(s), json!(s), "{s}");
        }
    }

    #[test]
    fn ints_are_yaml_1_1s() {
        assert_eq!(value("0x10"), json!(16));
        assert_eq!(value("-0x1_0"), json!(-16));
        assert_eq!(value("010"), json!(8));
        assert_eq!(value("0b101"), json!(5));
        assert_eq!(value("1_000"), json!(1000));
        assert_eq!(value("+12"), json!(12));
        assert_eq!(value("-0"), json!(0));
        assert_eq!(value("1:30"), json!(90));
        assert_eq!(value("-1:00:00"), json!(-3600));
        assert_eq!(value("18446744073709551615"), json!(u64::MAX));
        // No 0o in YAML 1.1; 8 and 9 are no octal digits; base 60 starts at 1.
        for s in ["0o10", "08", "09:30", "1__a"] {
            assert_eq!(value(s), json!(s), "{s}");
        }
        assert!(from_str("v: 99999999999999999999999\n").is_err());
    }

    #[test]
    fn floats_need_a_dot() {
        assert_eq!(value(".5"), json!(0.5));
        assert_eq!(value("-.5"), Value::String("-.5".into()));
        assert_eq!(value("1.5"), json!(1.5));
        assert_eq!(value("1."), json!(1.0));
        assert_eq!(value("1_0.2_5"), json!(10.25));
        assert_eq!(value("1.0e+3"), json!(1000.0));
        assert_eq!(value("1.e-1"), json!(0.1));
        assert_eq!(value("1:30.5"), json!(90.5));
        // PyYAML's float regex wants a dot and a signed exponent.
        for s in ["1e3", "1.0e3", "1E5", "inf", "nan"] {
            assert_eq!(value(s), json!(s), "{s}");
        }
        assert_eq!(resolve_plain(".inf"), Ok(Scalar::Float(f64::INFINITY)));
        assert_eq!(resolve_plain("-.Inf"), Ok(Scalar::Float(f64::NEG_INFINITY)));
        assert_eq!(resolve_plain("+.INF"), Ok(Scalar::Float(f64::INFINITY)));
        assert!(matches!(resolve_plain(".NaN"), Ok(Scalar::Float(f)) if f.is_nan()));
        // JSON holds no infinity: refused, naming the place.
        let err = from_str("a: 1\nv: .inf\n").unwrap_err();
        assert!(err.contains("'.inf' at line 2"), "{err}");
    }

    #[test]
    fn nulls() {
        for s in ["~", "null", "Null", "NULL", ""] {
            assert_eq!(value(s), Value::Null, "{s:?}");
        }
        assert_eq!(value("nULL"), json!("nULL"));
        assert_eq!(
            from_str("[a, ~, b, {x: }]\n").unwrap(),
            json!(["a", null, "b", {"x": null}])
        );
    }

    #[test]
    fn timestamps_keep_their_text() {
        assert_eq!(
            resolve_plain("2024-01-01"),
            Ok(Scalar::Timestamp("2024-01-01".into()))
        );
        assert_eq!(
            resolve_plain("2001-12-14t21:59:43.10-05:00"),
            Ok(Scalar::Timestamp("2001-12-14t21:59:43.10-05:00".into()))
        );
        assert_eq!(value("2024-01-01"), json!("2024-01-01"));
        assert_eq!(value("2024-1-1 10:00:00Z"), json!("2024-1-1 10:00:00Z"));
        assert_eq!(
            resolve_plain("2024-1-1"),
            Ok(Scalar::Str("2024-1-1".into()))
        );
    }

    #[test]
    fn quoted_and_block_scalars_are_strings() {
        for s in [
            "'yes'", "\"on\"", "'010'", "\"0x10\"", "'~'", "''", "'1_000'", "\"1:30\"",
        ] {
            let inner = &s[1..s.len() - 1];
            assert_eq!(value(s), json!(inner), "{s}");
        }
        assert_eq!(from_str("v: |\n  yes\n").unwrap()["v"], json!("yes\n"));
        assert_eq!(from_str("v: >-\n  10\n").unwrap()["v"], json!("10"));
    }

    #[test]
    fn explicit_tags() {
        assert_eq!(value("!!str yes"), json!("yes"));
        assert_eq!(value("!!str 010"), json!("010"));
        assert_eq!(value("!!int '010'"), json!(8));
        assert_eq!(value("!!float '1'"), json!(1.0));
        assert_eq!(value("!!bool 'on'"), json!(true));
        assert_eq!(value("!!null ''"), Value::Null);
        // The non-specific tag resolves as plain, even on a quoted scalar (PyYAML).
        assert_eq!(value("! 12"), json!(12));
        assert_eq!(value("! '12'"), json!(12));
        assert_eq!(value("! [1]"), json!([1]));
        assert!(from_str("v: !Custom 1\n").unwrap_err().contains("Custom"));
        assert!(from_str("v: !!binary aGk=\n").is_err());
        assert!(from_str("v: !!bool maybe\n").is_err());
    }

    #[test]
    fn keys_resolve_like_values() {
        let doc = from_str("n: 1\ny: 2\non: 3\n1: 4\n~: 5\n'yes': 6\n=: 7\n0x10: 8\n").unwrap();
        assert_eq!(
            doc,
            json!({"n": 1, "y": 2, "true": 3, "1": 4, "null": 5, "yes": 6, "=": 7, "16": 8})
        );
        assert!(from_str("v: =\n").is_err());
        assert!(from_str("[a]: 1\n").is_err());
    }

    #[test]
    fn anchors_aliases_and_merge_keys() {
        let doc = from_str(
            "base: &b {x: 1, y: 2}\n\
             other: &o {y: 20, z: 30}\n\
             one:\n  <<: *b\n  y: 3\n\
             both:\n  <<: [*b, *o]\n\
             list: [*b, *b]\n\
             quoted:\n  '<<': 1\n",
        )
        .unwrap();
        assert_eq!(doc["one"], json!({"x": 1, "y": 3}));
        // The earlier mapping of a merge list wins.
        assert_eq!(doc["both"], json!({"x": 1, "y": 2, "z": 30}));
        assert_eq!(doc["list"], json!([{"x": 1, "y": 2}, {"x": 1, "y": 2}]));
        assert_eq!(doc["quoted"], json!({"<<": 1}));
        assert!(from_str("a: {<<: 1}\n").is_err());
        // The last of a repeated key wins, as in PyYAML.
        assert_eq!(from_str("a: 1\na: 2\n").unwrap(), json!({"a": 2}));
    }

    #[test]
    fn documents() {
        assert_eq!(from_str("").unwrap(), Value::Null);
        assert_eq!(from_str("---\na: 1\n...\n").unwrap(), json!({"a": 1}));
        assert!(
            from_str("a: 1\n---\nb: 2\n")
                .unwrap_err()
                .contains("single document")
        );
        assert!(from_str("a: [1\n").is_err());
    }
}
