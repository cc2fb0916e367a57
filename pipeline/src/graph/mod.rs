//! From a Beam YAML `pipeline:` mapping to a flat, validated graph of transforms.
//!
//! Expands the YAML forms (chains, `source`/`sink`, composites, list and map inputs, implicit
//! flattens, `windowing` on transforms and sources) into one list of transforms whose inputs
//! are canonical collection ids: `Producer` for a main output, `Producer.tag` for another.
//!
//! `expand.rs` turns the YAML into raw transforms, `resolve.rs` types their configs and
//! resolves their inputs; the whole-graph checks are here.

mod expand;
mod resolve;

use crate::config::{JoinType, TransformConfig};
use crate::error::Issue;
use crate::resources::ResourceHints;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::{BTreeSet, HashMap, HashSet};

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
    /// `config.dependencies`: the Python packages (pip requirement specifiers or archive
    /// paths) its `language: python` UDFs need, as Beam YAML takes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<String>,
    /// Its `resource_hints`, merged with those of the composites (and pipeline) around it.
    #[serde(default, skip_serializing_if = "ResourceHints::is_empty")]
    pub resource_hints: ResourceHints,
}

impl Transform {
    /// Canonical ids of every collection this transform produces.
    pub fn outputs(&self) -> Vec<String> {
        let mut v = vec![];
        if self.config.has_main_output() {
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
    /// For each transform, the sources (transforms that read no collection) upstream of it,
    /// itself when it is one: in a streaming job, the sources whose watermarks its windows
    /// wait for. One pass, the graph being in topological order.
    pub fn upstream_sources(&self) -> Vec<BTreeSet<usize>> {
        let mut out: Vec<BTreeSet<usize>> = Vec::with_capacity(self.transforms.len());
        for (i, t) in self.transforms.iter().enumerate() {
            let mut up = BTreeSet::new();
            if t.inputs.is_empty() {
                up.insert(i);
            }
            for (_, c) in &t.inputs {
                if let Some(p) = self.producer(c).filter(|&p| p < i) {
                    up.extend(out[p].iter().copied());
                }
            }
            out.push(up);
        }
        out
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
    resource_hints: ResourceHints,
}

pub struct Builder {
    raws: Vec<Raw>,
    issues: Vec<Issue>,
    /// Composite outputs: composite name → inner reference, resolved like any input.
    composite_outputs: HashMap<String, Vec<(String, String, String)>>,
    /// The full name of every transform and composite of every scope, known before any of
    /// them is expanded, so that a reference resolves to a sibling wherever it is written.
    declared: HashSet<String>,
}

/// Expands and validates a `pipeline:` value. Collects every issue it can find.
pub fn build(pipeline: &Value) -> Result<Graph, Vec<Issue>> {
    let mut b = Builder {
        raws: vec![],
        issues: vec![],
        composite_outputs: HashMap::new(),
        declared: HashSet::new(),
    };
    match pipeline {
        Value::Array(items) => {
            b.expand_block(items, None, None, "", false, &ResourceHints::default());
        }
        Value::Object(m) => {
            b.expand_composite_body(m, "", None, &ResourceHints::default());
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
        check_error_output(g, t, &mut issues);
        match &t.config {
            TransformConfig::Join {
                equalities,
                fields,
                join_type,
            } => check_join(t, equalities, fields, join_type, &mut issues),
            TransformConfig::Sql { .. } if t.inputs.is_empty() => {
                issues.push(Issue::field(&t.name, "input", "Sql needs an input"));
            }
            _ => {}
        }
    }
    issues
}

/// Beam YAML requires error outputs to be consumed, so failures are never silently dropped.
fn check_error_output(g: &Graph, t: &Transform, issues: &mut Vec<Issue>) {
    let Some(tag) = &t.error_output else {
        return;
    };
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

/// A Join has named inputs, and refers to no other.
fn check_join(
    t: &Transform,
    equalities: &[Vec<(String, String)>],
    fields: &[(String, Vec<(String, String)>)],
    join_type: &JoinType,
    issues: &mut Vec<Issue>,
) {
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
    if let JoinType::OuterInputs(v) = join_type {
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
