//! Expanding the YAML forms (chains, `source`/`sink`, composites, list and map inputs) into
//! raw transforms whose inputs are still references as written.

use serde_json::{Map, Value};

use super::{Builder, Raw};
use crate::error::Issue;
use crate::resources::ResourceHints;

/// Keys a pipeline or composite body may have.
const BODY_KEYS: &[&str] = &[
    "type",
    "transforms",
    "source",
    "sink",
    "windowing",
    "name",
    "input",
    "output",
    "extra_transforms",
    "resource_hints",
];

/// Keys a transform may have.
const TRANSFORM_KEYS: &[&str] = &[
    "type",
    "name",
    "input",
    "config",
    "windowing",
    "transforms",
    "output",
    "source",
    "sink",
    "resource_hints",
    "__line__",
];

/// Where a block of transforms is expanded: its scope (composite prefix), the composite's
/// inputs, the block's windowing, and whether it is a chain.
struct Block<'a> {
    scope: &'a str,
    scope_inputs: Option<Vec<(String, String)>>,
    windowing: Option<Value>,
    chain: bool,
    /// The hints of the composites around the block, merged.
    resource_hints: &'a ResourceHints,
}

impl Builder {
    /// The body of a pipeline or composite: `type: chain|composite`, `transforms`, `source`, `sink`.
    pub(super) fn expand_composite_body(
        &mut self,
        m: &Map<String, Value>,
        scope: &str,
        scope_inputs: Option<Vec<(String, String)>>,
        outer_hints: &ResourceHints,
    ) -> String {
        let hints = self.resource_hints(m, scope.trim_end_matches('/'), outer_hints);
        let is_chain = match m.get("type").and_then(|t| t.as_str()) {
            Some("chain") => true,
            Some("composite") | None => false,
            Some(other) => {
                self.issues.push(Issue::new(format!(
                    "pipeline type must be 'chain' or 'composite', not '{other}'"
                )));
                false
            }
        };
        for k in m.keys() {
            if !BODY_KEYS.contains(&k.as_str()) {
                self.issues.push(Issue::new(format!(
                    "unknown key '{k}' in {}",
                    if scope.is_empty() {
                        "pipeline".to_string()
                    } else {
                        format!("composite '{}'", scope.trim_end_matches('/'))
                    }
                )));
            }
        }
        let mut items: Vec<Value> = vec![];
        let has_source_sink = m.contains_key("source") || m.contains_key("sink");
        if has_source_sink && !is_chain {
            self.issues.push(Issue::new(
                "'source' and 'sink' are only allowed with 'type: chain'",
            ));
        }
        if let Some(s) = m.get("source") {
            items.push(s.clone());
        }
        match m.get("transforms") {
            Some(Value::Array(a)) => items.extend(a.iter().cloned()),
            None if has_source_sink => {}
            _ => self.issues.push(Issue::new("'transforms' must be a list")),
        }
        if let Some(s) = m.get("sink") {
            items.push(s.clone());
        }
        let windowing = m.get("windowing").cloned();
        if let Some(extra) = m.get("extra_transforms").and_then(|v| v.as_array()) {
            self.declare(extra, scope);
        }
        let last = self.expand_block(
            &items,
            scope_inputs.clone(),
            windowing,
            scope,
            is_chain,
            &hints,
        );
        if let Some(extra) = m.get("extra_transforms").and_then(|v| v.as_array()) {
            self.expand_block(extra, scope_inputs, None, scope, false, &hints);
        }
        last
    }

    /// Expands a list of transforms. Returns the name of the last one (a chain's output).
    pub(super) fn expand_block(
        &mut self,
        items: &[Value],
        scope_inputs: Option<Vec<(String, String)>>,
        windowing: Option<Value>,
        scope: &str,
        chain: bool,
        resource_hints: &ResourceHints,
    ) -> String {
        self.declare(items, scope);
        let block = Block {
            scope,
            scope_inputs,
            windowing,
            chain,
            resource_hints,
        };
        // The previous member: how the block's output and the next member of a chain refer
        // to it.
        let mut prev: Option<(String, String)> = None;
        for (i, item) in items.iter().enumerate() {
            let prev_ref = prev.as_ref().map(|(_, r)| r.as_str());
            if let Some(next) = self.expand_item(&block, i, item, prev_ref) {
                prev = Some(next);
            }
        }
        prev.map(|(output, _)| output).unwrap_or_default()
    }

    /// Records the full names of a block's items before any is expanded: a reference may
    /// name a sibling written after it, as in Beam.
    fn declare(&mut self, items: &[Value], scope: &str) {
        for t in items.iter().filter_map(|i| i.as_object()) {
            if let Some(local) = t
                .get("name")
                .or_else(|| t.get("type"))
                .and_then(|v| v.as_str())
            {
                self.declared.insert(format!("{scope}{local}"));
            }
        }
    }

    /// Expands the `i`th item of a block (after `prev`, in a chain). Returns how the block's
    /// output and the next member of a chain refer to it, or `None` when it is not a
    /// transform (reported).
    fn expand_item(
        &mut self,
        block: &Block,
        i: usize,
        item: &Value,
        prev: Option<&str>,
    ) -> Option<(String, String)> {
        let scope = block.scope;
        let Some(t) = item.as_object() else {
            self.issues.push(Issue::new(format!(
                "transform #{} in {} is not a mapping",
                i + 1,
                if scope.is_empty() {
                    "the pipeline"
                } else {
                    scope
                }
            )));
            return None;
        };
        let Some(ty) = t.get("type").and_then(|v| v.as_str()) else {
            self.issues.push(Issue::new(format!(
                "transform #{} ({}) has no 'type'",
                i + 1,
                t.get("name").and_then(|v| v.as_str()).unwrap_or("unnamed")
            )));
            return None;
        };
        let local = t
            .get("name")
            .and_then(|v| v.as_str())
            .unwrap_or(ty)
            .to_string();
        let name = format!("{scope}{local}");
        for k in t.keys() {
            if !TRANSFORM_KEYS.contains(&k.as_str()) {
                self.issues.push(Issue::at(&name, format!("unknown key '{k}' (transform keys are type, name, input, config, windowing, resource_hints)")));
            }
        }
        let mut input = t
            .get("input")
            .map(|v| parse_input(v, &name, &mut self.issues));
        if input.is_none() && block.chain {
            input = chain_input(prev, block.scope_inputs.as_ref());
        }
        if ty == "composite" || ty == "chain" {
            self.expand_nested(block, t, ty, &name, input);
            Some((name, local))
        } else {
            // This very transform, even when others have its name (a chain of two unnamed
            // Filters): Beam links chain members by identity, not by name.
            let nth = self.raws.iter().filter(|r| r.name == name).count() + 1;
            let exact = exact_ref(&name, nth);
            self.push_raw(block, t, ty, name, input);
            Some((exact.clone(), exact))
        }
    }

    /// A composite or chain inside a block: its body in its own scope, and its outputs.
    fn expand_nested(
        &mut self,
        block: &Block,
        t: &Map<String, Value>,
        ty: &str,
        name: &str,
        input: Option<Vec<(String, String)>>,
    ) {
        let mut body = t.clone();
        body.insert("type".into(), Value::String(ty.into()));
        let inner_scope = format!("{name}/");
        // The composite's own inputs are resolved in the outer scope.
        let resolved_inputs = input.map(|v| {
            v.into_iter()
                .map(|(tag, r)| {
                    (
                        tag,
                        self.qualify(&r, block.scope, block.scope_inputs.as_ref()),
                    )
                })
                .collect::<Vec<_>>()
        });
        let last = self.expand_composite_body(
            &body,
            &inner_scope,
            resolved_inputs.or(Some(vec![])),
            block.resource_hints,
        );
        let outputs = match t.get("output") {
            None => vec![("output".to_string(), last.clone(), inner_scope.clone())],
            Some(Value::String(s)) => {
                vec![("output".to_string(), s.clone(), inner_scope.clone())]
            }
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_str().unwrap_or_default().to_string(),
                        inner_scope.clone(),
                    )
                })
                .collect(),
            Some(_) => {
                self.issues.push(Issue::field(
                    name,
                    "output",
                    "must be a name or a mapping of tag to name",
                ));
                vec![]
            }
        };
        self.composite_outputs.insert(name.to_string(), outputs);
    }

    /// A leaf transform: its config and windowing kept raw until every name is known.
    fn push_raw(
        &mut self,
        block: &Block,
        t: &Map<String, Value>,
        ty: &str,
        name: String,
        input: Option<Vec<(String, String)>>,
    ) {
        let config = match t.get("config") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => {
                self.issues
                    .push(Issue::field(&name, "config", "must be a mapping"));
                Map::new()
            }
        };
        let mut tw = t.get("windowing").cloned();
        // Windowing on a chain or composite applies where elements enter the block: to
        // its sources' outputs and to the inputs of transforms reading the block's input.
        let enters_block = input.as_ref().is_none_or(|v| {
            v.iter()
                .any(|(_, r)| r == "input" || r.starts_with("input."))
        });
        if tw.is_none() && enters_block {
            tw = block.windowing.clone();
        }
        let resource_hints = self.resource_hints(t, &name, block.resource_hints);
        self.raws.push(Raw {
            name,
            type_name: ty.to_string(),
            config,
            windowing: tw,
            input,
            scope: block.scope.to_string(),
            scope_inputs: block.scope_inputs.clone(),
            resource_hints,
        });
    }

    /// `m`'s own `resource_hints` merged into `outer`'s (an invalid one is reported).
    fn resource_hints(
        &mut self,
        m: &Map<String, Value>,
        name: &str,
        outer: &ResourceHints,
    ) -> ResourceHints {
        match m.get("resource_hints") {
            None | Some(Value::Null) => outer.clone(),
            Some(v) => match ResourceHints::parse(v) {
                Ok(own) => ResourceHints::merged(outer, &own),
                Err(msg) => {
                    self.issues.push(if name.is_empty() {
                        Issue {
                            transform: None,
                            field: Some("resource_hints".into()),
                            message: msg,
                        }
                    } else {
                        Issue::field(name, "resource_hints", msg)
                    });
                    outer.clone()
                }
            },
        }
    }
}

/// Marks a reference to the `nth` transform named `name` (a full name), whatever other
/// transforms share the name: see [`parse_exact_ref`].
const EXACT: char = '\u{1}';

fn exact_ref(name: &str, nth: usize) -> String {
    format!("{EXACT}{nth}{EXACT}{name}")
}

/// A reference made by [`exact_ref`]: (full name, which of the transforms so named).
pub(super) fn parse_exact_ref(r: &str) -> Option<(&str, usize)> {
    let (nth, name) = r.strip_prefix(EXACT)?.split_once(EXACT)?;
    Some((name, nth.parse().ok()?))
}

/// The implicit input of a chain member: the previous member, or for the first one the
/// chain's own inputs.
fn chain_input(
    prev: Option<&str>,
    scope_inputs: Option<&Vec<(String, String)>>,
) -> Option<Vec<(String, String)>> {
    if let Some(p) = prev {
        return Some(vec![("input".into(), p.to_string())]);
    }
    scope_inputs.map(|si| {
        si.iter()
            .map(|(tag, _)| {
                (
                    tag.clone(),
                    if tag == "input" {
                        "input".to_string()
                    } else {
                        format!("input.{tag}")
                    },
                )
            })
            .collect()
    })
}

fn parse_input(v: &Value, name: &str, issues: &mut Vec<Issue>) -> Vec<(String, String)> {
    match v {
        Value::String(s) => vec![("input".into(), s.clone())],
        Value::Array(a) => a
            .iter()
            .enumerate()
            .filter_map(|(i, x)| match x.as_str() {
                Some(s) => Some((format!("input{i}"), s.to_string())),
                None => {
                    issues.push(Issue::field(name, "input", "list entries must be names"));
                    None
                }
            })
            .collect(),
        Value::Object(m) => m
            .iter()
            .filter_map(|(k, x)| match x {
                Value::String(s) => Some((k.clone(), s.clone())),
                Value::Array(list) => {
                    // `{tag: [A, B]}` is itself an implicit flatten; keep the first and report others.
                    if list.len() == 1 {
                        list[0].as_str().map(|s| (k.clone(), s.to_string()))
                    } else {
                        issues.push(Issue::field(
                            name,
                            &format!("input.{k}"),
                            "a tagged input takes one collection (add a Flatten)",
                        ));
                        None
                    }
                }
                _ => {
                    issues.push(Issue::field(name, &format!("input.{k}"), "must be a name"));
                    None
                }
            })
            .collect(),
        _ => {
            issues.push(Issue::field(
                name,
                "input",
                "must be a name, a list or a mapping",
            ));
            vec![]
        }
    }
}
