//! Typed configs of the built-in Beam YAML transforms, parsed and checked up front so that the
//! runtime never sees a malformed one. Expression strings stay strings here: they are compiled
//! where the schema is known (the worker), but their language is checked now.
use crate::windowing::WindowFn;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// UDF languages. Only `generic` (field references) and `sql` run today.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    Generic,
    Sql,
}

/// An expression in the transform's language: a field name for `generic`, a SQL expression for `sql`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Expr {
    pub language: Language,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorHandling {
    /// Tag of the output that receives failed records: the collection `Transform.<output>`.
    pub output: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileFormat {
    Csv,
    Json,
    Parquet,
    Text,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadConfig {
    pub format: FileFormat,
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<Vec<String>>,
    /// CSV field delimiter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delimiter: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteConfig {
    pub format: FileFormat,
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_shards: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_name_template: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_name_suffix: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AggregateConfig {
    pub output: String,
    /// Beam YAML built-in name: sum, max, min, all, any, mean, count, group, concat.
    pub func: String,
    /// The field or expression combined; `None` for `count` of elements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Expr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JoinType {
    Inner,
    /// The first input keeps unmatched rows.
    Left,
    /// The last input keeps unmatched rows.
    Right,
    Outer,
    /// These inputs keep unmatched rows.
    OuterInputs(Vec<String>),
}

/// The typed config of every supported transform.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TransformConfig {
    Create {
        elements: Vec<Value>,
    },
    Read(ReadConfig),
    Write(WriteConfig),
    MapToFields {
        append: bool,
        drop: Vec<String>,
        fields: Vec<(String, Expr)>,
    },
    Filter {
        keep: Expr,
    },
    Explode {
        fields: Vec<String>,
        cross_product: bool,
    },
    Flatten,
    Partition {
        by: Expr,
        outputs: Vec<String>,
        unknown_output: Option<String>,
    },
    Combine {
        group_by: Vec<String>,
        aggregates: Vec<AggregateConfig>,
    },
    AssignTimestamps {
        timestamp: Expr,
    },
    WindowInto {
        windowing: WindowFn,
    },
    /// (output field name, windowing parameter), as Beam's `fields` mapping; a list names
    /// each field after its parameter.
    ExtractWindowingInfo {
        fields: Vec<(String, String)>,
    },
    Sql {
        query: String,
    },
    /// `equalities`: each entry maps input name (or `*` for all inputs) to a field.
    /// `fields`: input name → (output name, input field) pairs; unlisted inputs give all fields.
    Join {
        join_type: JoinType,
        equalities: Vec<Vec<(String, String)>>,
        fields: Vec<(String, Vec<(String, String)>)>,
    },
    Reshuffle,
    LogForTesting {
        level: String,
        prefix: String,
    },
    AssertEqual {
        elements: Vec<Value>,
    },
}

/// How a transform class behaves for fusion (seed 000, "Fusion optimization").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Produces a collection from outside: starts a stage.
    Source,
    /// One element in, zero or more out, no state: fused.
    ElementWise,
    /// Writes out: fused into the producing stage; committed at the end.
    Sink,
    /// Grouping aggregation: lifted into partial + final around a shuffle.
    Combine,
    /// Needs all of its inputs: starts a stage after a shuffle (Sql, Join, AssertEqual).
    Gather,
    /// Redistributes elements across workers: starts a stage after a shuffle.
    Reshuffle,
}

impl TransformConfig {
    pub fn class(&self) -> Class {
        use TransformConfig::*;
        match self {
            Create { .. } | Read(_) => Class::Source,
            Write(_) => Class::Sink,
            Combine { .. } => Class::Combine,
            Sql { .. } | Join { .. } | AssertEqual { .. } => Class::Gather,
            Reshuffle => Class::Reshuffle,
            _ => Class::ElementWise,
        }
    }

    /// Output tags this transform produces besides its main output.
    pub fn extra_outputs(&self) -> Vec<String> {
        match self {
            TransformConfig::Partition {
                outputs,
                unknown_output,
                ..
            } => {
                let mut v = outputs.clone();
                v.extend(unknown_output.clone());
                v
            }
            _ => vec![],
        }
    }

    /// Whether the main output exists (Partition and sinks have none users can read).
    pub fn has_main_output(&self) -> bool {
        !matches!(
            self,
            TransformConfig::Partition { .. } | TransformConfig::AssertEqual { .. }
        )
    }
}

/// Names of the transform types Riverbank knows, for "did you mean" and docs.
pub const KNOWN_TYPES: &[&str] = &[
    "Create",
    "ReadFromCsv",
    "ReadFromJson",
    "ReadFromParquet",
    "ReadFromText",
    "WriteToCsv",
    "WriteToJson",
    "WriteToParquet",
    "WriteToText",
    "MapToFields",
    "Filter",
    "Explode",
    "Flatten",
    "Partition",
    "Combine",
    "AssignTimestamps",
    "WindowInto",
    "ExtractWindowingInfo",
    "Sql",
    "Join",
    "Reshuffle",
    "LogForTesting",
    "AssertEqual",
];

/// Transforms that accept Beam YAML's `error_handling: {output: NAME}`.
pub fn takes_error_handling(ty: &str) -> bool {
    matches!(
        ty,
        "MapToFields" | "Filter" | "Explode" | "Partition" | "AssignTimestamps"
    )
}

/// Reads a config mapping into a typed config. `windowing` is the transform's own windowing
/// (used by WindowInto). Errors are `(field, message)`.
pub fn parse_config(
    ty: &str,
    cfg: &Map<String, Value>,
    windowing: Option<&Value>,
) -> Result<TransformConfig, (Option<String>, String)> {
    let p = Fields { cfg };
    let lang = p.language(ty)?;
    let c = match ty {
        "Create" => {
            p.only(&["elements", "reshuffle"])?;
            let elements = p
                .req("elements")?
                .as_array()
                .ok_or(p.err("elements", "must be a list"))?
                .clone();
            TransformConfig::Create { elements }
        }
        "ReadFromCsv" | "ReadFromJson" | "ReadFromParquet" | "ReadFromText" => {
            let format = match ty {
                "ReadFromCsv" => FileFormat::Csv,
                "ReadFromJson" => FileFormat::Json,
                "ReadFromParquet" => FileFormat::Parquet,
                _ => FileFormat::Text,
            };
            p.only(match format {
                FileFormat::Csv => &["path", "delimiter", "columns"],
                FileFormat::Parquet | FileFormat::Json => &["path", "columns"],
                FileFormat::Text => &["path"],
            })?;
            let delimiter = p.opt_str("delimiter")?;
            if let Some(d) = &delimiter
                && d.len() != 1
            {
                return Err(p.err("delimiter", "must be one character"));
            }
            TransformConfig::Read(ReadConfig {
                format,
                path: p.req_str("path")?,
                columns: p.opt_str_list("columns")?,
                delimiter,
            })
        }
        "WriteToCsv" | "WriteToJson" | "WriteToParquet" | "WriteToText" => {
            let format = match ty {
                "WriteToCsv" => FileFormat::Csv,
                "WriteToJson" => FileFormat::Json,
                "WriteToParquet" => FileFormat::Parquet,
                _ => FileFormat::Text,
            };
            p.only(&[
                "path",
                "num_shards",
                "shard_name_template",
                "file_name_suffix",
            ])?;
            let num_shards = match cfg.get("num_shards") {
                None | Some(Value::Null) => None,
                Some(v) => match v.as_u64() {
                    Some(n) if n >= 1 => Some(n as usize),
                    _ => return Err(p.err("num_shards", "must be a positive integer")),
                },
            };
            TransformConfig::Write(WriteConfig {
                format,
                path: p.req_str("path")?,
                num_shards,
                shard_name_template: p.opt_str("shard_name_template")?,
                file_name_suffix: p.opt_str("file_name_suffix")?,
            })
        }
        "MapToFields" => {
            p.only(&["language", "append", "drop", "fields", "error_handling"])?;
            let append = p.opt_bool("append")?.unwrap_or(false);
            let drop = p.opt_str_list("drop")?.unwrap_or_default();
            let mut fields = vec![];
            if let Some(v) = cfg.get("fields") {
                let m = v
                    .as_object()
                    .ok_or(p.err("fields", "must be a mapping of field name to expression"))?;
                for (name, e) in m {
                    fields.push((name.clone(), p.expr(&format!("fields.{name}"), e, lang)?));
                }
            }
            if fields.is_empty() && !append {
                return Err(p.err(
                    "fields",
                    "MapToFields needs 'fields' (or 'append: true' with 'drop')",
                ));
            }
            if !drop.is_empty() && !append {
                return Err(p.err("drop", "can only drop fields if append is true"));
            }
            TransformConfig::MapToFields {
                append,
                drop,
                fields,
            }
        }
        "Filter" => {
            p.only(&["language", "keep", "error_handling"])?;
            TransformConfig::Filter {
                keep: p.expr("keep", p.req("keep")?, lang)?,
            }
        }
        "Explode" => {
            p.only(&["fields", "cross_product", "error_handling"])?;
            let fields = p.str_or_list("fields")?;
            if fields.is_empty() {
                return Err(p.err("fields", "name at least one field to explode"));
            }
            // As Beam: required when exploding several fields (it changes the result).
            let cross_product = match p.opt_bool("cross_product")? {
                Some(b) => b,
                None if fields.len() > 1 => {
                    return Err(p.err(
                        "cross_product",
                        "must be set to true or false when exploding several fields",
                    ));
                }
                None => true,
            };
            TransformConfig::Explode {
                fields,
                cross_product,
            }
        }
        "Flatten" => {
            p.only(&[])?;
            TransformConfig::Flatten
        }
        "Partition" => {
            p.only(&[
                "language",
                "by",
                "outputs",
                "unknown_output",
                "error_handling",
            ])?;
            let outputs = p
                .opt_str_list("outputs")?
                .ok_or(p.err("outputs", "Partition needs the list of 'outputs'"))?;
            if outputs.is_empty() {
                return Err(p.err("outputs", "name at least one output"));
            }
            TransformConfig::Partition {
                by: p.expr("by", p.req("by")?, lang)?,
                outputs,
                unknown_output: p.opt_str("unknown_output")?,
            }
        }
        "Combine" => {
            p.only(&["language", "group_by", "combine"])?;
            let group_by = if cfg.contains_key("group_by") {
                p.str_or_list("group_by")?
            } else {
                return Err(p.err(
                    "group_by",
                    "Combine needs 'group_by' (use [] for a global combine)",
                ));
            };
            let m = p
                .req("combine")?
                .as_object()
                .ok_or(p.err("combine", "must be a mapping of output field to combine fn"))?;
            if m.is_empty() {
                return Err(p.err("combine", "name at least one aggregation"));
            }
            let mut aggregates = vec![];
            for (out, spec) in m {
                aggregates.push(p.aggregate(out, spec, lang)?);
            }
            TransformConfig::Combine {
                group_by,
                aggregates,
            }
        }
        "AssignTimestamps" => {
            p.only(&["language", "timestamp", "error_handling"])?;
            TransformConfig::AssignTimestamps {
                timestamp: p.expr("timestamp", p.req("timestamp")?, lang)?,
            }
        }
        "WindowInto" => {
            p.only(&["windowing"])?;
            let w = cfg.get("windowing").or(windowing).ok_or((
                Some("windowing".into()),
                "WindowInto needs 'windowing'".into(),
            ))?;
            TransformConfig::WindowInto {
                windowing: WindowFn::parse(w).map_err(|e| (Some("windowing".into()), e))?,
            }
        }
        "ExtractWindowingInfo" => {
            p.only(&["fields"])?;
            const ALLOWED: &[&str] = &[
                "timestamp",
                "window_start",
                "window_end",
                "window_string",
                "window_type",
            ];
            let fields: Vec<(String, String)> = match cfg.get("fields") {
                None => ["timestamp", "window_start", "window_end"]
                    .iter()
                    .map(|f| (f.to_string(), f.to_string()))
                    .collect(),
                Some(Value::Object(m)) => m
                    .iter()
                    .map(|(name, v)| {
                        v.as_str()
                            .map(|param| (name.clone(), param.to_string()))
                            .ok_or_else(|| {
                                p.err("fields", "must map field names to windowing parameters")
                            })
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => p
                    .str_or_list("fields")?
                    .into_iter()
                    .map(|f| (f.clone(), f))
                    .collect(),
            };
            if let Some((_, f)) = fields.iter().find(|(_, f)| !ALLOWED.contains(&f.as_str())) {
                return Err(p.err(
                    "fields",
                    &format!(
                        "unknown windowing field '{f}' (allowed: {})",
                        ALLOWED.join(", ")
                    ),
                ));
            }
            TransformConfig::ExtractWindowingInfo { fields }
        }
        "Sql" => {
            p.only(&["query", "dialect"])?;
            TransformConfig::Sql {
                query: p.req_str("query")?,
            }
        }
        "Join" => {
            p.only(&["type", "equalities", "fields"])?;
            let join_type = match cfg.get("type") {
                None => JoinType::Inner,
                Some(Value::String(s)) => {
                    join_type(s).ok_or(p.err("type", "must be inner, left, right or outer"))?
                }
                // `{outer: [a, b]}`: those inputs keep their unmatched rows.
                Some(Value::Object(m)) if m.len() == 1 && m.contains_key("outer") => {
                    let names = match &m["outer"] {
                        Value::String(s) => vec![s.clone()],
                        Value::Array(a) => a
                            .iter()
                            .filter_map(|x| x.as_str().map(String::from))
                            .collect(),
                        _ => return Err(p.err("type", "outer must list input names")),
                    };
                    JoinType::OuterInputs(names)
                }
                _ => {
                    return Err(p.err(
                        "type",
                        "must be inner, left, right, outer or {outer: [inputs]}",
                    ));
                }
            };
            let equalities = match p.req("equalities")? {
                Value::String(field) => vec![vec![("*".into(), field.clone())]],
                Value::Array(items) => {
                    let mut out = vec![];
                    for item in items {
                        match item {
                            Value::String(field) => out.push(vec![("*".into(), field.clone())]),
                            Value::Object(m) if m.values().all(|v| v.is_string()) => out.push(
                                m.iter()
                                    .map(|(k, v)| {
                                        (k.clone(), v.as_str().unwrap_or_default().to_string())
                                    })
                                    .collect(),
                            ),
                            _ => return Err(p.err(
                                "equalities",
                                "each equality is a field name or a mapping of input name to field",
                            )),
                        }
                    }
                    out
                }
                _ => return Err(p.err("equalities", "must be a field name or a list")),
            };
            // As Beam: per input, a list of fields, a mapping `new_name: field`, or `'*'`;
            // inputs not listed contribute all of their fields.
            let mut fields = vec![];
            if let Some(v) = cfg.get("fields") {
                const MSG: &str = "must map input names to a list of fields, a mapping of new name to field, or '*'";
                let m = v.as_object().ok_or(p.err("fields", MSG))?;
                for (k, v) in m {
                    let field = format!("fields.{k}");
                    let list: Vec<(String, String)> = match v {
                        Value::String(s) if s == "*" => continue,
                        Value::String(s) => vec![(s.clone(), s.clone())],
                        Value::Array(a) => a
                            .iter()
                            .map(|x| {
                                x.as_str()
                                    .map(|s| (s.to_string(), s.to_string()))
                                    .ok_or_else(|| p.err(&field, "field names must be strings"))
                            })
                            .collect::<Result<_, _>>()?,
                        Value::Object(o) => o
                            .iter()
                            .map(|(new, x)| {
                                x.as_str()
                                    .map(|s| (new.clone(), s.to_string()))
                                    .ok_or_else(|| p.err(&field, "field names must be strings"))
                            })
                            .collect::<Result<_, _>>()?,
                        _ => return Err(p.err(&field, MSG)),
                    };
                    fields.push((k.clone(), list));
                }
            }
            TransformConfig::Join {
                join_type,
                equalities,
                fields,
            }
        }
        "Reshuffle" => {
            p.only(&["num_buckets"])?;
            TransformConfig::Reshuffle
        }
        "LogForTesting" => {
            p.only(&["level", "prefix"])?;
            let level = p.opt_str("level")?.unwrap_or_else(|| "INFO".into());
            if !["DEBUG", "INFO", "WARNING", "WARN", "ERROR"]
                .contains(&level.to_uppercase().as_str())
            {
                return Err(p.err("level", "must be DEBUG, INFO, WARNING or ERROR"));
            }
            TransformConfig::LogForTesting {
                level,
                prefix: p.opt_str("prefix")?.unwrap_or_default(),
            }
        }
        "AssertEqual" => {
            p.only(&["elements"])?;
            TransformConfig::AssertEqual {
                elements: p
                    .req("elements")?
                    .as_array()
                    .ok_or(p.err("elements", "must be a list"))?
                    .clone(),
            }
        }
        other => return Err((None, unknown_type_message(other))),
    };
    Ok(c)
}

fn join_type(s: &str) -> Option<JoinType> {
    Some(match s {
        "inner" => JoinType::Inner,
        "left" => JoinType::Left,
        "right" => JoinType::Right,
        "outer" => JoinType::Outer,
        _ => return None,
    })
}

pub fn unknown_type_message(ty: &str) -> String {
    let close: Vec<&str> = KNOWN_TYPES
        .iter()
        .copied()
        .filter(|k| similar(k, ty))
        .collect();
    if close.is_empty() {
        format!("unknown transform type '{ty}'")
    } else {
        format!(
            "unknown transform type '{ty}' (did you mean {}?)",
            close.join(" or ")
        )
    }
}

fn similar(a: &str, b: &str) -> bool {
    let (a, b) = (a.to_lowercase(), b.to_lowercase());
    a.contains(&b) || b.contains(&a) || levenshtein(&a, &b) <= 2
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push(
                (prev[j] + usize::from(ca != *cb))
                    .min(prev[j + 1] + 1)
                    .min(cur[j] + 1),
            );
        }
        prev = cur;
    }
    prev[b.len()]
}

type FieldErr = (Option<String>, String);

/// Small helpers to read a config mapping with errors that name the field.
struct Fields<'a> {
    cfg: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn err(&self, field: &str, msg: &str) -> FieldErr {
        (Some(field.to_string()), msg.to_string())
    }
    fn only(&self, allowed: &[&str]) -> Result<(), FieldErr> {
        for k in self.cfg.keys() {
            if !allowed.contains(&k.as_str()) {
                let hint = if allowed.is_empty() {
                    "this transform takes no config".to_string()
                } else {
                    format!("allowed: {}", allowed.join(", "))
                };
                return Err((Some(k.clone()), format!("unknown config field ({hint})")));
            }
        }
        Ok(())
    }
    fn req(&self, f: &str) -> Result<&Value, FieldErr> {
        self.cfg
            .get(f)
            .filter(|v| !v.is_null())
            .ok_or_else(|| self.err(f, "is required"))
    }
    fn req_str(&self, f: &str) -> Result<String, FieldErr> {
        match self.req(f)? {
            Value::String(s) if !s.trim().is_empty() => Ok(s.clone()),
            Value::String(_) => Err(self.err(f, "must not be empty")),
            _ => Err(self.err(f, "must be a string")),
        }
    }
    fn opt_str(&self, f: &str) -> Result<Option<String>, FieldErr> {
        match self.cfg.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.err(f, "must be a string")),
        }
    }
    fn opt_bool(&self, f: &str) -> Result<Option<bool>, FieldErr> {
        match self.cfg.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.err(f, "must be true or false")),
        }
    }
    fn opt_str_list(&self, f: &str) -> Result<Option<Vec<String>>, FieldErr> {
        match self.cfg.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.str_or_list(f).map(Some),
        }
    }
    fn str_or_list(&self, f: &str) -> Result<Vec<String>, FieldErr> {
        match self.cfg.get(f) {
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(String::from)
                        .ok_or_else(|| self.err(f, "must be a list of field names"))
                })
                .collect(),
            _ => Err(self.err(f, "must be a field name or a list of field names")),
        }
    }
    fn language(&self, ty: &str) -> Result<Language, FieldErr> {
        match self.cfg.get("language") {
            None | Some(Value::Null) => Ok(Language::Generic),
            Some(Value::String(s)) => match s.as_str() {
                "generic" => Ok(Language::Generic),
                "sql" | "calcite" => Ok(Language::Sql),
                other => Err(self.err("language", &format!("language {other} is not supported yet in transform {ty} (supported: generic, sql)"))),
            },
            Some(_) => Err(self.err("language", "must be a string")),
        }
    }
    /// An expression: `"text"`, `{expression: "text"}`, or a literal scalar (SQL literal).
    fn expr(&self, field: &str, v: &Value, lang: Language) -> Result<Expr, FieldErr> {
        let text = match v {
            Value::String(s) => s.clone(),
            Value::Object(m) => {
                if m.contains_key("callable") || m.contains_key("path") {
                    return Err(self.err(field, "callables need a python or javascript UDF; only expressions in 'generic' or 'sql' are supported yet"));
                }
                match m.get("expression") {
                    Some(Value::String(s)) => s.clone(),
                    _ => {
                        return Err(
                            self.err(field, "must be an expression string or {expression: ...}")
                        );
                    }
                }
            }
            Value::Number(n) if lang == Language::Sql => n.to_string(),
            Value::Bool(b) if lang == Language::Sql => b.to_string(),
            _ => return Err(self.err(field, "must be an expression string")),
        };
        if text.trim().is_empty() {
            return Err(self.err(field, "expression must not be empty"));
        }
        if lang == Language::Generic && !is_field_path(&text) {
            return Err(self.err(field, &format!("'{text}' is not a field name; the generic language only references fields (set language: sql for expressions)")));
        }
        Ok(Expr {
            language: lang,
            text,
        })
    }
    fn aggregate(
        &self,
        out: &str,
        spec: &Value,
        lang: Language,
    ) -> Result<AggregateConfig, FieldErr> {
        let field = format!("combine.{out}");
        let (func, value) = match spec {
            Value::String(f) => (f.clone(), Some(Value::String(out.to_string()))),
            Value::Object(m) => {
                if let Some(k) = m.keys().find(|k| *k != "fn" && *k != "value") {
                    return Err(self.err(
                        &field,
                        &format!("unknown key '{k}' (expected fn and value)"),
                    ));
                }
                let func = match m.get("fn") {
                    Some(Value::String(f)) => f.clone(),
                    Some(Value::Object(o)) => match o.get("type") {
                        Some(Value::String(f)) => f.clone(),
                        _ => return Err(self.err(&field, "fn needs a 'type'")),
                    },
                    _ => return Err(self.err(&field, "needs 'fn'")),
                };
                (func, m.get("value").cloned())
            }
            _ => return Err(self.err(&field, "must be a combine fn name or {fn, value}")),
        };
        const FNS: &[&str] = &[
            "sum", "max", "min", "all", "any", "mean", "count", "group", "concat",
        ];
        if !FNS.contains(&func.as_str()) {
            return Err(self.err(
                &field,
                &format!(
                    "unknown combine fn '{func}' (built-ins: {})",
                    FNS.join(", ")
                ),
            ));
        }
        let value = match value {
            None if func == "count" => None,
            None => return Err(self.err(&field, &format!("'{func}' needs a 'value'"))),
            Some(v) => Some(self.expr(&format!("{field}.value"), &v, lang)?),
        };
        Ok(AggregateConfig {
            output: out.to_string(),
            func,
            value,
        })
    }
}

/// `a`, `a.b`, `"quoted"`: what the generic language accepts.
pub fn is_field_path(s: &str) -> bool {
    !s.is_empty()
        && s.split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_alphanumeric() || c == '_'))
}
