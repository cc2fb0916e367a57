//! Resolving raw transforms into the graph: unique names, typed configs, error outputs, and
//! inputs as canonical collection ids (with the implicit Flattens and WindowIntos they need).

use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet};

use super::{Builder, Graph, Raw, Transform, check, topo_sort};
use crate::config::{self, Class, TransformConfig};
use crate::error::Issue;

/// A transform whose inputs wait to be resolved: its index, raw inputs, scope, the scope's
/// composite inputs, and the windowing applied to its inputs.
struct Pending {
    idx: usize,
    input: Option<Vec<(String, String)>>,
    scope: String,
    scope_inputs: Option<Vec<(String, String)>>,
    windowing: Option<Value>,
}

/// The transforms with valid configs, before their inputs are resolved.
#[derive(Default)]
struct Parsed {
    transforms: Vec<Transform>,
    pending: Vec<Pending>,
    /// Sources with their own windowing.
    windowed_sources: Vec<(String, Value)>,
    /// Transforms whose config is invalid (already reported).
    failed: HashSet<String>,
    /// Transforms with an `output_schema`: name, schema, error output tag.
    output_schemas: Vec<(String, Value, Option<String>)>,
}

/// What input references resolve against.
struct Names {
    /// Every collection id by the names users write.
    produced: BTreeMap<String, String>,
    /// Names given to more than one transform.
    dups: HashSet<String>,
    /// Transforms whose config is invalid: references to them are not reported again.
    failed: HashSet<String>,
    /// A windowed source → the WindowInto its readers see instead.
    alias: HashMap<String, String>,
    /// The broker sinks, which give no collection to read.
    broker_sinks: HashSet<String>,
}

impl Builder {
    pub(super) fn resolve(mut self) -> Result<Graph, Vec<Issue>> {
        let dups = self.duplicate_names();
        let Parsed {
            mut transforms,
            pending,
            windowed_sources,
            failed,
            output_schemas,
        } = self.parse_configs(&dups);
        // Inputs are resolved even when some configs are invalid, so that one validation
        // reports every problem; references to the invalid transforms are not reported again.
        let produced = produced_ids(&transforms);
        // Windowing on a source: a WindowInto right after it, which readers see instead.
        let mut alias: HashMap<String, String> = HashMap::new();
        let mut extra: Vec<Transform> = vec![];
        // `output_schema`: a ValidateWithSchema on the main output, which readers see instead
        // (its failures joining the transform's error output).
        let mut schema_errors = vec![];
        for (name, schema, error_output) in output_schemas {
            let (validate, errors) = enforce_output_schema(&name, schema, error_output.as_deref());
            alias.insert(name.clone(), validate.name.clone());
            extra.push(validate);
            if let Some(errors) = errors {
                let tag = error_output.unwrap_or_default();
                alias.insert(format!("{name}.{tag}"), errors.name.clone());
                schema_errors.push((name, tag, errors.name.clone()));
                extra.push(errors);
            }
        }
        for (src, w) in windowed_sources {
            let wname = format!("{src}/Windowing");
            let input = alias.get(&src).cloned().unwrap_or_else(|| src.clone());
            match window_into(&wname, &w, &input) {
                Ok(t) => {
                    alias.insert(src.clone(), wname.clone());
                    extra.push(t);
                }
                Err(i) => self.issues.push(i),
            }
        }
        let broker_sinks = transforms
            .iter()
            .filter(|t| matches!(t.config, TransformConfig::WriteConnector(_)))
            .map(|t| t.name.clone())
            .collect();
        let names = Names {
            produced,
            dups,
            failed,
            alias,
            broker_sinks,
        };
        for p in pending {
            self.resolve_inputs(&mut transforms, p, &names, &mut extra);
        }
        // The error output, read through the Flatten with the schema's failures, must still
        // be read (as Beam wants every error output consumed).
        for (name, tag, errors) in schema_errors {
            let read = transforms
                .iter()
                .chain(&extra)
                .any(|t| t.inputs.iter().any(|(_, c)| *c == errors));
            if !read {
                self.issues.push(Issue::field(&name, "error_handling", format!("error output '{tag}' is not consumed by any transform (read it, e.g. with a WriteToJson, so failed records are not lost)")));
            }
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

    /// Names must be unique to be referenced.
    fn duplicate_names(&self) -> HashSet<String> {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for r in &self.raws {
            *counts.entry(r.name.as_str()).or_default() += 1;
        }
        counts
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(k, _)| k.to_string())
            .collect()
    }

    /// Types every raw transform's config; duplicate names get `#1`, `#2`, ...
    fn parse_configs(&mut self, dups: &HashSet<String>) -> Parsed {
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut out = Parsed::default();
        for r in std::mem::take(&mut self.raws) {
            let name = if dups.contains(&r.name) {
                let k = seen.entry(r.name.clone()).or_default();
                *k += 1;
                format!("{}#{}", r.name, k)
            } else {
                r.name.clone()
            };
            self.parse_one(r, name, &mut out);
        }
        out
    }

    fn parse_one(&mut self, mut r: Raw, name: String, out: &mut Parsed) {
        let error_output = self.error_output(&r, &name);
        let dependencies = match dependencies(&mut r.config) {
            Ok(d) => d,
            Err(msg) => {
                self.issues
                    .push(Issue::field(&name, "dependencies", msg.to_string()));
                out.failed.insert(name);
                return;
            }
        };
        let output_schema = match self.output_schema(&mut r, &name) {
            Ok(s) => s,
            Err(()) => {
                out.failed.insert(name);
                return;
            }
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
                out.failed.insert(name);
                return;
            }
        };
        let idx = out.transforms.len();
        let windowing = if r.type_name == "WindowInto" {
            None
        } else {
            r.windowing.clone()
        };
        let is_source = cfg.class() == Class::Source;
        if let Some(schema) = output_schema {
            if !cfg.has_main_output() {
                self.issues.push(Issue::field(
                    &name,
                    "output_schema",
                    format!(
                        "{} has no main output to check (Beam checks the output named \
                         'output' or 'good', or the only one)",
                        r.type_name
                    ),
                ));
                out.failed.insert(name);
                return;
            }
            out.output_schemas
                .push((name.clone(), schema, error_output.clone()));
        }
        if is_source {
            if r.input.as_ref().is_some_and(|i| !i.is_empty()) {
                self.issues.push(Issue::field(
                    &name,
                    "input",
                    format!("{} is a source and takes no input", r.type_name),
                ));
            }
            if let Some(w) = windowing.clone() {
                out.windowed_sources.push((name.clone(), w));
            }
        }
        out.transforms.push(Transform {
            name,
            type_name: r.type_name,
            config: cfg,
            inputs: vec![],
            error_output,
            dependencies,
            resource_hints: r.resource_hints,
        });
        out.pending.push(Pending {
            idx,
            input: r.input,
            scope: r.scope,
            scope_inputs: r.scope_inputs,
            windowing: if is_source { None } else { windowing },
        });
    }

    /// Takes `output_schema` out of a config, as Beam does before the transform sees it: a
    /// JSON schema its main output's rows are checked against.
    fn output_schema(&mut self, r: &mut Raw, name: &str) -> Result<Option<Value>, ()> {
        let Some(schema) = r.config.remove("output_schema") else {
            return Ok(None);
        };
        let mut fail = |msg: String| {
            self.issues.push(Issue::field(name, "output_schema", msg));
            Err(())
        };
        if schema.get("error_handling").is_some() {
            return fail(
                "error_handling config is not supported directly in the output_schema: put \
                 error_handling in the transform's config, or use a ValidateWithSchema"
                    .into(),
            );
        }
        match config::json_schema::JsonSchema::compile(&schema) {
            Ok(_) => Ok(Some(schema)),
            Err(e) => fail(e),
        }
    }

    /// The tag of `error_handling.output`, for the transforms that take one.
    fn error_output(&mut self, r: &Raw, name: &str) -> Option<String> {
        if !r.config.contains_key("error_handling") {
            return None;
        }
        if !config::takes_error_handling(&r.type_name) {
            self.issues.push(Issue::field(
                name,
                "error_handling",
                format!("{} does not take error_handling", r.type_name),
            ));
            return None;
        }
        match r
            .config
            .get("error_handling")
            .and_then(|e| e.get("output"))
            .and_then(|o| o.as_str())
        {
            Some(o) => Some(o.to_string()),
            None => {
                self.issues
                    .push(Issue::field(name, "error_handling", "needs 'output: NAME'"));
                None
            }
        }
    }

    /// Resolves one transform's inputs to collection ids; several inputs to a one-input
    /// transform go through a Flatten, and windowing on the transform through a WindowInto
    /// per input (both added to `extra`).
    fn resolve_inputs(
        &mut self,
        transforms: &mut [Transform],
        p: Pending,
        names: &Names,
        extra: &mut Vec<Transform>,
    ) {
        let name = transforms[p.idx].name.clone();
        let class = transforms[p.idx].config.class();
        let Some(input) = p.input else {
            if class != Class::Source {
                // As Beam: a PyTransform applied to the pipeline's start says so.
                let py = matches!(
                    transforms[p.idx].config,
                    TransformConfig::PyTransform { .. }
                );
                let hint = if py {
                    " ('input: {}' applies a PyTransform to the pipeline's start)"
                } else {
                    ""
                };
                self.issues.push(Issue::field(
                    &name,
                    "input",
                    format!("has no input (give 'input:', or put it in a chain){hint}"),
                ));
            }
            return;
        };
        let mut resolved = vec![];
        for (tag, r) in input {
            let q = self.qualify(&r, &p.scope, p.scope_inputs.as_ref());
            let q = exact_name(&q, &names.dups).unwrap_or(q);
            match self.lookup(&q, &names.produced, &names.dups) {
                Ok(c) => resolved.push((tag, names.alias.get(&c).cloned().unwrap_or(c))),
                Err(_) if names.failed.contains(q.split('.').next().unwrap_or(&q)) => {}
                Err(_)
                    if names
                        .broker_sinks
                        .contains(q.split('.').next().unwrap_or(&q)) =>
                {
                    self.issues.push(Issue::field(
                        &name,
                        "input",
                        format!(
                            "'{}' writes to a broker, which gives nothing to read (file sinks \
                             give the files they wrote)",
                            q.split('.').next().unwrap_or(&q)
                        ),
                    ))
                }
                Err(msg) => self.issues.push(Issue::field(&name, "input", msg)),
            }
        }
        // A list of inputs to a one-input transform is an implicit Flatten, as in Beam YAML; so
        // is one to a PyTransform, which Beam gives a mapping of inputs as a dict.
        let listed = resolved.iter().any(|(tag, _)| {
            tag.strip_prefix("input")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        });
        let multi_ok = match transforms[p.idx].config {
            TransformConfig::Flatten
            | TransformConfig::Sql { .. }
            | TransformConfig::Join { .. } => true,
            TransformConfig::PyTransform { .. } => !listed,
            _ => false,
        };
        if resolved.len() > 1 && !multi_ok {
            let fname = format!("{name}/Flatten");
            extra.push(Transform {
                name: fname.clone(),
                type_name: "Flatten".into(),
                config: TransformConfig::Flatten,
                inputs: resolved,
                error_output: None,
                dependencies: vec![],
                resource_hints: Default::default(),
            });
            resolved = vec![("input".into(), fname)];
        }
        if let Some(w) = p.windowing {
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
        transforms[p.idx].inputs = resolved;
    }

    /// A reference in `scope` → a scope-free reference (composite inputs substituted).
    pub(super) fn qualify(
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
        // The nearest scope that declares the name: a sibling first, then the enclosing
        // composites' members, then the top level.
        let (head, _) = r.split_once('.').unwrap_or((r, ""));
        let mut scope = scope;
        while !scope.is_empty() {
            if self.declared.contains(&format!("{scope}{head}")) {
                return format!("{scope}{r}");
            }
            scope = enclosing(scope);
        }
        r.to_string()
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
            let q = if let Some(n) = exact_name(inner, dups) {
                n
            } else if inner.starts_with(scope.as_str()) {
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

/// The scope enclosing `scope` (`A/B/` → `A/`, `A/` → the top level).
fn enclosing(scope: &str) -> &str {
    let inner = scope.strip_suffix('/').unwrap_or(scope);
    inner.rfind('/').map(|i| &inner[..=i]).unwrap_or("")
}

/// Every collection id by the names users write: its id, and `Name.output` for a main output.
fn produced_ids(transforms: &[Transform]) -> BTreeMap<String, String> {
    let mut produced = BTreeMap::new();
    for t in transforms {
        for o in t.outputs() {
            produced.insert(o.clone(), o.clone());
        }
        if t.config.has_main_output() {
            produced.insert(format!("{}.output", t.name), t.name.clone());
            // With error_handling, Beam's transforms name their main output `good`.
            if t.error_output.as_deref().is_some_and(|e| e != "good") {
                produced.insert(format!("{}.good", t.name), t.name.clone());
            }
        }
    }
    produced
}

/// What Beam adds for a transform's `output_schema`: a ValidateWithSchema of its main output
/// (`NAME/EnforceOutputSchema`), whose failures go to the transform's error output when it has
/// one, flattened with its own (`NAME/EnforceOutputSchema/Errors`); without one, a row that
/// does not match fails the job.
fn enforce_output_schema(
    name: &str,
    schema: Value,
    error_output: Option<&str>,
) -> (Transform, Option<Transform>) {
    let vname = format!("{name}/EnforceOutputSchema");
    let validate = Transform {
        name: vname.clone(),
        type_name: "ValidateWithSchema".into(),
        config: TransformConfig::ValidateWithSchema { schema },
        inputs: vec![("input".into(), name.to_string())],
        error_output: error_output.map(String::from),
        dependencies: vec![],
        resource_hints: Default::default(),
    };
    let errors = error_output.map(|tag| Transform {
        name: format!("{vname}/Errors"),
        type_name: "Flatten".into(),
        config: TransformConfig::Flatten,
        inputs: vec![
            ("input0".into(), format!("{name}.{tag}")),
            ("input1".into(), format!("{vname}.{tag}")),
        ],
        error_output: None,
        dependencies: vec![],
        resource_hints: Default::default(),
    });
    (validate, errors)
}

fn window_into(name: &str, w: &Value, input: &str) -> Result<Transform, Issue> {
    let (windowing, triggering) = crate::windowing::parse_windowing(w).map_err(|e| {
        Issue::field(
            name.rsplit_once('/').map(|x| x.0).unwrap_or(name),
            "windowing",
            e,
        )
    })?;
    Ok(Transform {
        name: name.into(),
        type_name: "WindowInto".into(),
        config: TransformConfig::WindowInto {
            windowing,
            triggering,
        },
        inputs: vec![("input".into(), input.into())],
        error_output: None,
        dependencies: vec![],
        resource_hints: Default::default(),
    })
}

/// Takes `dependencies` out of a config, as Beam YAML does before the transform sees it: a list
/// of pip requirements for `language: python` UDFs (Riverbank installs no other language's).
fn dependencies(config: &mut Map<String, Value>) -> Result<Vec<String>, &'static str> {
    let Some(v) = config.remove("dependencies") else {
        return Ok(vec![]);
    };
    if config.get("language").and_then(Value::as_str) != Some("python") {
        return Err("dependencies are installed for language: python UDFs only");
    }
    let list = v
        .as_array()
        .ok_or("must be a list of pip requirements ('scipy>=1.15', or a path to an sdist/wheel)")?;
    list.iter()
        .map(|d| match d.as_str().map(str::trim) {
            Some(s) if !s.is_empty() => Ok(s.to_string()),
            _ => Err("each dependency must be a non-empty string (a pip requirement)"),
        })
        .collect()
}

/// The name of the transform an exact reference (a chain member's previous one) means:
/// numbered as [`Builder::parse_configs`] numbers transforms that share a name.
fn exact_name(r: &str, dups: &HashSet<String>) -> Option<String> {
    let (name, nth) = super::expand::parse_exact_ref(r)?;
    Some(if dups.contains(name) {
        format!("{name}#{nth}")
    } else {
        name.to_string()
    })
}
