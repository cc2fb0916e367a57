//! From a Beam YAML `pipeline:` mapping to a flat, validated graph of transforms.
//!
//! Expands the YAML forms (chains, `source`/`sink`, composites, list and map inputs, implicit
//! flattens, `windowing` on transforms and sources) into one list of transforms whose inputs
//! are canonical collection ids: `Producer` for a main output, `Producer.tag` for another.
use crate::config::{self, Class, TransformConfig};
use crate::error::Issue;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet};

/// One transform after expansion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transform {
    /// Unique name (composite members are `Composite/Member`).
    pub name: String,
    /// The Beam YAML `type`.
    pub type_name: String,
    pub config: TransformConfig,
    /// Input tag → canonical collection id. Tags are `input` for a single input, `input0..` for
    /// list inputs, or the user's keys for map inputs (Sql table names, Join input names).
    pub inputs: Vec<(String, String)>,
    /// Tag of the error output (`error_handling.output`).
    pub error_output: Option<String>,
}

impl Transform {
    /// Canonical ids of every collection this transform produces.
    pub fn outputs(&self) -> Vec<String> {
        let mut v = vec![];
        if self.config.has_main_output() && self.config.class() != Class::Sink {
            v.push(self.name.clone());
        }
        for tag in self
            .config
            .extra_outputs()
            .into_iter()
            .chain(self.error_output.clone())
        {
            v.push(format!("{}.{tag}", self.name));
        }
        v
    }
}

/// The expanded pipeline, in topological order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    pub transforms: Vec<Transform>,
}

impl Graph {
    pub fn get(&self, name: &str) -> Option<&Transform> {
        self.transforms.iter().find(|t| t.name == name)
    }
    /// The transform producing a collection id.
    pub fn producer(&self, collection: &str) -> Option<usize> {
        self.transforms
            .iter()
            .position(|t| t.outputs().iter().any(|o| o == collection))
    }
    /// Indices of transforms reading a collection.
    pub fn consumers(&self, collection: &str) -> Vec<usize> {
        (0..self.transforms.len())
            .filter(|&i| {
                self.transforms[i]
                    .inputs
                    .iter()
                    .any(|(_, c)| c == collection)
            })
            .collect()
    }
}

/// A transform's inputs waiting to be resolved: its index, raw inputs, scope, the scope's
/// composite inputs, and the windowing applied to its inputs.
type PendingInputs = (
    usize,
    Option<Vec<(String, String)>>,
    String,
    Option<Vec<(String, String)>>,
    Option<Value>,
);

/// A raw transform while expanding, before its inputs are resolved.
struct Raw {
    name: String,
    type_name: String,
    config: Map<String, Value>,
    windowing: Option<Value>,
    /// Raw input references with their tags; `None` means "not given".
    input: Option<Vec<(String, String)>>,
    /// Scope for resolving references (composite prefix).
    scope: String,
    /// Composite inputs visible as `input` / `input.tag` in this scope.
    scope_inputs: Option<Vec<(String, String)>>,
}

pub struct Builder {
    raws: Vec<Raw>,
    issues: Vec<Issue>,
    /// Composite outputs: composite name → inner reference, resolved like any input.
    composite_outputs: HashMap<String, Vec<(String, String, String)>>,
}

/// Expands and validates a `pipeline:` value. Collects every issue it can find.
pub fn build(pipeline: &Value) -> Result<Graph, Vec<Issue>> {
    let mut b = Builder {
        raws: vec![],
        issues: vec![],
        composite_outputs: HashMap::new(),
    };
    match pipeline {
        Value::Array(items) => {
            b.expand_block(items, None, None, "", false);
        }
        Value::Object(m) => {
            b.expand_composite_body(m, "", None);
        }
        _ => b.issues.push(Issue::new(
            "'pipeline' must be a mapping with 'transforms' (or a list of transforms)",
        )),
    }
    if !b.issues.is_empty() {
        return Err(b.issues);
    }
    b.resolve()
}

impl Builder {
    /// The body of a pipeline or composite: `type: chain|composite`, `transforms`, `source`, `sink`.
    fn expand_composite_body(
        &mut self,
        m: &Map<String, Value>,
        scope: &str,
        scope_inputs: Option<Vec<(String, String)>>,
    ) -> String {
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
            if ![
                "type",
                "transforms",
                "source",
                "sink",
                "windowing",
                "name",
                "input",
                "output",
                "extra_transforms",
            ]
            .contains(&k.as_str())
            {
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
        let last = self.expand_block(&items, scope_inputs.clone(), windowing, scope, is_chain);
        if let Some(extra) = m.get("extra_transforms").and_then(|v| v.as_array()) {
            self.expand_block(extra, scope_inputs, None, scope, false);
        }
        last
    }

    /// Expands a list of transforms. Returns the name of the last one (a chain's output).
    fn expand_block(
        &mut self,
        items: &[Value],
        scope_inputs: Option<Vec<(String, String)>>,
        windowing: Option<Value>,
        scope: &str,
        chain: bool,
    ) -> String {
        let mut prev: Option<String> = None;
        for (i, item) in items.iter().enumerate() {
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
                continue;
            };
            let Some(ty) = t.get("type").and_then(|v| v.as_str()) else {
                self.issues.push(Issue::new(format!(
                    "transform #{} ({}) has no 'type'",
                    i + 1,
                    t.get("name").and_then(|v| v.as_str()).unwrap_or("unnamed")
                )));
                continue;
            };
            let local = t
                .get("name")
                .and_then(|v| v.as_str())
                .unwrap_or(ty)
                .to_string();
            let name = format!("{scope}{local}");
            for k in t.keys() {
                if ![
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
                ]
                .contains(&k.as_str())
                {
                    self.issues.push(Issue::at(&name, format!("unknown key '{k}' (transform keys are type, name, input, config, windowing)")));
                }
            }
            let mut input = t
                .get("input")
                .map(|v| parse_input(v, &name, &mut self.issues));
            if input.is_none() && chain {
                if let Some(p) = &prev {
                    input = Some(vec![("input".into(), p.clone())]);
                } else if let Some(si) = &scope_inputs {
                    input = Some(
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
                            .collect(),
                    );
                }
            }
            if ty == "composite" || ty == "chain" {
                let inner_inputs = input.clone();
                let mut body = t.clone();
                body.insert("type".into(), Value::String(ty.into()));
                let inner_scope = format!("{name}/");
                // The composite's own inputs are resolved in the outer scope.
                let resolved_inputs = inner_inputs.map(|v| {
                    v.into_iter()
                        .map(|(tag, r)| (tag, self.qualify(&r, scope, scope_inputs.as_ref())))
                        .collect::<Vec<_>>()
                });
                let last = self.expand_composite_body(
                    &body,
                    &inner_scope,
                    resolved_inputs.or(Some(vec![])),
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
                            &name,
                            "output",
                            "must be a name or a mapping of tag to name",
                        ));
                        vec![]
                    }
                };
                self.composite_outputs.insert(name.clone(), outputs);
                prev = Some(local);
                continue;
            }
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
                tw = windowing.clone();
            }
            self.raws.push(Raw {
                name,
                type_name: ty.to_string(),
                config,
                windowing: tw,
                input,
                scope: scope.to_string(),
                scope_inputs: scope_inputs.clone(),
            });
            prev = Some(local);
        }
        prev.map(|p| format!("{scope}{p}")).unwrap_or_default()
    }

    /// A reference in `scope` → a scope-free reference (composite inputs substituted).
    fn qualify(
        &self,
        r: &str,
        scope: &str,
        scope_inputs: Option<&Vec<(String, String)>>,
    ) -> String {
        if let Some(si) = scope_inputs {
            if r == "input"
                && let Some((_, c)) = si.iter().find(|(t, _)| t == "input").or(si.first())
            {
                return c.clone();
            }
            if let Some(tag) = r.strip_prefix("input.")
                && let Some((_, c)) = si.iter().find(|(t, _)| t == tag)
            {
                return c.clone();
            }
        }
        if scope.is_empty() {
            return r.to_string();
        }
        // Prefer a sibling in the same composite; fall back to the outer name.
        let (head, _) = r.split_once('.').unwrap_or((r, ""));
        let local = format!("{scope}{head}");
        if self.raws.iter().any(|x| x.name == local) || self.composite_outputs.contains_key(&local)
        {
            format!("{scope}{r}")
        } else {
            r.to_string()
        }
    }

    fn resolve(mut self) -> Result<Graph, Vec<Issue>> {
        // Names must be unique to be referenced.
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for r in &self.raws {
            *counts.entry(r.name.as_str()).or_default() += 1;
        }
        let dups: HashSet<String> = counts
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(k, _)| k.to_string())
            .collect();
        let mut seen: HashMap<String, usize> = HashMap::new();
        // Transforms whose config is invalid (already reported).
        let mut failed: HashSet<String> = HashSet::new();
        let mut transforms: Vec<Transform> = vec![];
        let mut windowed_sources: Vec<(String, Value)> = vec![];
        let raws = std::mem::take(&mut self.raws);
        let mut pending_inputs: Vec<PendingInputs> = vec![];
        for r in raws {
            let name = if dups.contains(&r.name) {
                let k = seen.entry(r.name.clone()).or_default();
                *k += 1;
                format!("{}#{}", r.name, k)
            } else {
                r.name.clone()
            };
            let error_output = if r.config.contains_key("error_handling") {
                if !config::takes_error_handling(&r.type_name) {
                    self.issues.push(Issue::field(
                        &name,
                        "error_handling",
                        format!("{} does not take error_handling", r.type_name),
                    ));
                    None
                } else {
                    match r
                        .config
                        .get("error_handling")
                        .and_then(|e| e.get("output"))
                        .and_then(|o| o.as_str())
                    {
                        Some(o) => Some(o.to_string()),
                        None => {
                            self.issues.push(Issue::field(
                                &name,
                                "error_handling",
                                "needs 'output: NAME'",
                            ));
                            None
                        }
                    }
                }
            } else {
                None
            };
            let window_for_into = if r.type_name == "WindowInto" {
                r.windowing.as_ref()
            } else {
                None
            };
            let cfg = match config::parse_config(&r.type_name, &r.config, window_for_into) {
                Ok(c) => c,
                Err((field, msg)) => {
                    self.issues.push(Issue {
                        transform: Some(name.clone()),
                        field,
                        message: msg,
                    });
                    failed.insert(name.clone());
                    continue;
                }
            };
            let idx = transforms.len();
            let windowing = if r.type_name == "WindowInto" {
                None
            } else {
                r.windowing.clone()
            };
            if cfg.class() == Class::Source {
                if r.input.as_ref().is_some_and(|i| !i.is_empty()) {
                    self.issues.push(Issue::field(
                        &name,
                        "input",
                        format!("{} is a source and takes no input", r.type_name),
                    ));
                }
                if let Some(w) = windowing.clone() {
                    windowed_sources.push((name.clone(), w));
                }
            }
            transforms.push(Transform {
                name: name.clone(),
                type_name: r.type_name.clone(),
                config: cfg,
                inputs: vec![],
                error_output,
            });
            pending_inputs.push((
                idx,
                r.input,
                r.scope,
                r.scope_inputs,
                if transforms[idx].config.class() == Class::Source {
                    None
                } else {
                    windowing
                },
            ));
        }
        // Inputs are resolved even when some configs are invalid, so that one validation
        // reports every problem; references to the invalid transforms are not reported again.
        // Index of every collection id by the names users write.
        let mut produced: BTreeMap<String, String> = BTreeMap::new();
        for t in &transforms {
            for o in t.outputs() {
                produced.insert(o.clone(), o.clone());
            }
            if t.config.has_main_output() {
                produced.insert(format!("{}.output", t.name), t.name.clone());
            }
        }
        // Windowing on a source: a WindowInto right after it, which readers see instead.
        let mut alias: HashMap<String, String> = HashMap::new();
        let mut extra: Vec<Transform> = vec![];
        for (src, w) in windowed_sources {
            let wname = format!("{src}/Windowing");
            match window_into(&wname, &w, &src) {
                Ok(t) => {
                    alias.insert(src.clone(), wname.clone());
                    extra.push(t);
                }
                Err(i) => self.issues.push(i),
            }
        }
        for (idx, input, scope, scope_inputs, windowing) in pending_inputs {
            let name = transforms[idx].name.clone();
            let class = transforms[idx].config.class();
            let Some(input) = input else {
                if class != Class::Source {
                    self.issues.push(Issue::field(
                        &name,
                        "input",
                        "has no input (give 'input:', or put it in a chain)",
                    ));
                }
                continue;
            };
            let mut resolved = vec![];
            for (tag, r) in input {
                let q = self.qualify(&r, &scope, scope_inputs.as_ref());
                match self.lookup(&q, &produced, &dups) {
                    Ok(c) => resolved.push((tag, alias.get(&c).cloned().unwrap_or(c))),
                    Err(_) if failed.contains(q.split('.').next().unwrap_or(&q)) => {}
                    Err(msg) => self.issues.push(Issue::field(&name, "input", msg)),
                }
            }
            // A list of inputs to a one-input transform is an implicit Flatten, as in Beam YAML.
            let t = &transforms[idx];
            let multi_ok = matches!(
                t.config,
                TransformConfig::Flatten
                    | TransformConfig::Sql { .. }
                    | TransformConfig::Join { .. }
            );
            if resolved.len() > 1 && !multi_ok {
                let fname = format!("{name}/Flatten");
                extra.push(Transform {
                    name: fname.clone(),
                    type_name: "Flatten".into(),
                    config: TransformConfig::Flatten,
                    inputs: resolved,
                    error_output: None,
                });
                resolved = vec![("input".into(), fname)];
            }
            if let Some(w) = windowing {
                let mut windowed = vec![];
                for (i, (tag, c)) in resolved.into_iter().enumerate() {
                    let wname = if i == 0 {
                        format!("{name}/Windowing")
                    } else {
                        format!("{name}/Windowing{i}")
                    };
                    match window_into(&wname, &w, &c) {
                        Ok(t) => extra.push(t),
                        Err(issue) => self.issues.push(issue),
                    }
                    windowed.push((tag, wname));
                }
                resolved = windowed;
            }
            transforms[idx].inputs = resolved;
        }
        transforms.extend(extra);
        if !self.issues.is_empty() {
            return Err(self.issues);
        }
        let transforms = topo_sort(transforms).map_err(|i| vec![i])?;
        let graph = Graph { transforms };
        let issues = check(&graph);
        if issues.is_empty() {
            Ok(graph)
        } else {
            Err(issues)
        }
    }

    fn lookup(
        &self,
        r: &str,
        produced: &BTreeMap<String, String>,
        dups: &HashSet<String>,
    ) -> Result<String, String> {
        if let Some(c) = produced.get(r) {
            return Ok(c.clone());
        }
        // A composite's output(s).
        let (head, tag) = match r.split_once('.') {
            Some((h, t)) if self.composite_outputs.contains_key(h) => (h, t),
            _ => (r, "output"),
        };
        if let Some(outs) = self.composite_outputs.get(head) {
            let Some((_, inner, scope)) = outs.iter().find(|(t, _, _)| t == tag) else {
                return Err(format!("composite '{head}' has no output '{tag}'"));
            };
            let q = if inner.starts_with(scope.as_str()) {
                inner.clone()
            } else {
                format!("{scope}{inner}")
            };
            return self.lookup(&q, produced, dups);
        }
        let head = r.split('.').next().unwrap_or(r);
        if dups.contains(head) {
            return Err(format!(
                "'{r}' is ambiguous: more than one transform is named '{head}' (give them distinct names)"
            ));
        }
        if produced.keys().any(|k| k.split('.').next() == Some(head)) {
            let tags: Vec<&str> = produced
                .keys()
                .filter(|k| k.starts_with(&format!("{head}.")))
                .map(|k| k.as_str())
                .collect();
            return Err(format!(
                "'{r}' is not an output of '{head}' (its outputs: {})",
                tags.join(", ")
            ));
        }
        Err(format!("'{r}' does not name any transform or output"))
    }
}

fn window_into(name: &str, w: &Value, input: &str) -> Result<Transform, Issue> {
    let windowing = crate::windowing::WindowFn::parse(w).map_err(|e| {
        Issue::field(
            name.rsplit_once('/').map(|x| x.0).unwrap_or(name),
            "windowing",
            e,
        )
    })?;
    Ok(Transform {
        name: name.into(),
        type_name: "WindowInto".into(),
        config: TransformConfig::WindowInto { windowing },
        inputs: vec![("input".into(), input.into())],
        error_output: None,
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

fn topo_sort(ts: Vec<Transform>) -> Result<Vec<Transform>, Issue> {
    let n = ts.len();
    let producer: HashMap<String, usize> = ts
        .iter()
        .enumerate()
        .flat_map(|(i, t)| t.outputs().into_iter().map(move |o| (o, i)))
        .collect();
    let mut indeg = vec![0usize; n];
    let mut out: Vec<Vec<usize>> = vec![vec![]; n];
    for (i, t) in ts.iter().enumerate() {
        for (_, c) in &t.inputs {
            if let Some(&p) = producer.get(c) {
                indeg[i] += 1;
                out[p].push(i);
            }
        }
    }
    // Stable: among ready transforms, keep file order.
    let mut order = vec![];
    let mut ready: std::collections::BTreeSet<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &j in &out[i] {
            indeg[j] -= 1;
            if indeg[j] == 0 {
                ready.insert(j);
            }
        }
    }
    if order.len() != n {
        let stuck: Vec<&str> = (0..n)
            .filter(|i| !order.contains(i))
            .map(|i| ts[i].name.as_str())
            .collect();
        return Err(Issue::new(format!(
            "the pipeline has a cycle through: {}",
            stuck.join(", ")
        )));
    }
    let mut slots: Vec<Option<Transform>> = ts.into_iter().map(Some).collect();
    Ok(order
        .into_iter()
        .map(|i| slots[i].take().expect("each index once"))
        .collect())
}

/// Whole-graph checks that need every transform resolved.
fn check(g: &Graph) -> Vec<Issue> {
    let mut issues = vec![];
    for t in &g.transforms {
        // Beam YAML requires error outputs to be consumed, so failures are never silently dropped.
        if let Some(tag) = &t.error_output {
            if t.config.extra_outputs().contains(tag) {
                issues.push(Issue::field(
                    &t.name,
                    "error_handling",
                    format!("error output '{tag}' cannot also be one of the outputs"),
                ));
            }
            if g.consumers(&format!("{}.{tag}", t.name)).is_empty() {
                issues.push(Issue::field(&t.name, "error_handling", format!("error output '{tag}' is not consumed by any transform (read it, e.g. with a WriteToJson, so failed records are not lost)")));
            }
        }
        match &t.config {
            TransformConfig::Join {
                equalities,
                fields,
                join_type,
            } => {
                let names: Vec<&str> = t.inputs.iter().map(|(k, _)| k.as_str()).collect();
                // A list input is tagged input0, input1, ...; a mapping may well use names
                // like input1, input2 (Beam's own examples do).
                let from_list = names
                    .iter()
                    .enumerate()
                    .all(|(i, n)| *n == format!("input{i}"));
                if t.inputs.len() < 2 || from_list {
                    issues.push(Issue::field(
                        &t.name,
                        "input",
                        "Join needs a mapping of at least two named inputs",
                    ));
                }
                let mut referenced: Vec<&str> = equalities
                    .iter()
                    .flatten()
                    .map(|(k, _)| k.as_str())
                    .collect();
                referenced.extend(fields.iter().map(|(k, _)| k.as_str()));
                if let crate::config::JoinType::OuterInputs(v) = join_type {
                    referenced.extend(v.iter().map(|s| s.as_str()));
                }
                for r in referenced {
                    if r != "*" && !names.contains(&r) {
                        issues.push(Issue::at(
                            &t.name,
                            format!(
                                "Join refers to input '{r}', but its inputs are {}",
                                names.join(", ")
                            ),
                        ));
                    }
                }
            }
            TransformConfig::Sql { .. } if t.inputs.is_empty() => {
                issues.push(Issue::field(&t.name, "input", "Sql needs an input"));
            }
            _ => {}
        }
    }
    issues
}
