//! Typed configs of the built-in Beam YAML transforms, parsed and checked up front so that the
//! runtime never sees a malformed one. Expression strings stay strings here: they are compiled
//! where the schema is known (the worker), but their language is checked now.
//!
//! The parsing is in `parse.rs` (a function per transform type), over the field reader in
//! `fields.rs`.

pub mod connectors;
mod fields;
pub mod generic;
pub mod json_schema;
mod parse;
mod stream_source;

use crate::trigger::Triggering;
use crate::windowing::WindowFn;

fn is_default_triggering(t: &Triggering) -> bool {
    *t == Triggering::default()
}
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use connectors::{ConnectorSinkConfig, ConnectorSourceConfig, Endpoint, RecordFormat, StartAt};
pub use parse::parse_config;

/// UDF languages: `generic` (field references), `sql`, `python` and `javascript` run; `java`
/// is refused when the config is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    Generic,
    Sql,
    Javascript,
    Python,
}

impl Language {
    /// A language whose UDFs may be callables and files (`UdfForm`), run by an interpreter.
    pub fn is_udf(self) -> bool {
        matches!(self, Language::Javascript | Language::Python)
    }
}

/// How a UDF is written, as Beam YAML takes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UdfForm {
    /// An expression over the row's fields (`expression:`, or a plain string).
    #[default]
    Expression,
    /// `callable:`: the source of a function that takes the row.
    Callable,
    /// `path:` + `name:`: the function `name` (the expression's `text`) of the file at `path`.
    /// `source` is the file's text once read: the worker inlines it before the plan is shipped
    /// to other workers, so that only the process that plans the job reads the file.
    File {
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<String>,
    },
}

impl UdfForm {
    pub fn is_expression(&self) -> bool {
        *self == UdfForm::Expression
    }
}

/// An expression in the transform's language: a field name for `generic`, a SQL expression for
/// `sql`; for `javascript`, an expression, a callable's source or a file's function name (`form`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Expr {
    pub language: Language,
    pub text: String,
    #[serde(default, skip_serializing_if = "UdfForm::is_expression")]
    pub form: UdfForm,
    /// Beam's `output_type` (JSON schema notation, or a basic type's name), when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_type: Option<Value>,
}

impl Expr {
    /// An expression (the `expression:` form) without a declared output type.
    pub fn new(language: Language, text: impl Into<String>) -> Self {
        Expr {
            language,
            text: text.into(),
            form: UdfForm::Expression,
            output_type: None,
        }
    }
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
    /// Riverbank's `refresh_interval` (streaming jobs): the files are listed and read again this
    /// often (microseconds), each read replacing the last in the Sql and Join that take it as
    /// a side input (Beam's slowly updating side input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_us: Option<i64>,
}

/// An unbounded source's config (Riverbank's own generators; Kafka and NATS come with the
/// connectors). Offsets are per partition; a source with `count` ends after that many elements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum StreamSourceConfig {
    /// `ReadFromSynthetic`: keyed elements `key`, `value`, `seq`, `event_time`.
    Synthetic {
        /// Elements per second (all partitions together).
        rate: f64,
        keys: u64,
        /// `uniform`, `zipf` (with `zipf_exponent`) or `hot_key` (with `hot_key_fraction`).
        distribution: KeyDistributionConfig,
        /// Event times lag the element's nominal time by up to this much (microseconds).
        skew_us: i64,
        partitions: u32,
        /// Stop after this many elements (a finite stream: the job ends by itself).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        count: Option<u64>,
        /// Nominal time of element 0 (microseconds since the epoch); default: the job's start.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        start_us: Option<i64>,
        seed: u64,
        /// This fraction of elements arrives `late_by_us` behind the watermark (late data).
        #[serde(default)]
        late_fraction: f64,
        #[serde(default)]
        late_by_us: i64,
        /// Load steps: (microseconds after the start, the rate from then on).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        rate_steps: Vec<(i64, f64)>,
    },
    /// `ReadFromNexmark`: one event kind (`person`, `auction` or `bid`) of the Nexmark stream.
    Nexmark {
        /// Serialized as `event_kind`: a plan's transform config is tagged by `kind` already
        /// (a duplicate field: a coordinator could not read a Nexmark job's plan).
        #[serde(rename = "event_kind")]
        kind: String,
        /// Events per second (all kinds together).
        rate: f64,
        partitions: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        count: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        start_us: Option<i64>,
        seed: u64,
        /// The fields the pipeline uses, in the kind's order (`None`: all). Set by projection
        /// pushdown, not by users: the reader makes only these (and `dateTime`, its event time).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        columns: Option<Vec<String>>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KeyDistributionConfig {
    Uniform,
    Zipf { exponent: f64 },
    HotKey { fraction: f64 },
}

impl StreamSourceConfig {
    /// Partitions the source is read in (each with its own offsets and watermark).
    pub fn partitions(&self) -> u32 {
        match self {
            StreamSourceConfig::Synthetic { partitions, .. }
            | StreamSourceConfig::Nexmark { partitions, .. } => (*partitions).max(1),
        }
    }
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
    /// Beam YAML built-in name: sum, max, min, all, any, mean, count, group, concat; with
    /// `language: python`, else a CombineFn as Beam loads one (a dotted name such as
    /// `apache_beam.transforms.combiners.TopCombineFn`, or source defining it).
    pub func: String,
    /// `fn.config`: keyword arguments a python CombineFn is constructed with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fn_config: Option<serde_json::Map<String, Value>>,
    /// The field or expression combined; `None` for `count` of elements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Expr>,
}

/// What `MatchAll` does with a pattern that matches no file (Beam's `EmptyMatchTreatment`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EmptyMatch {
    /// Nothing comes out for it.
    Allow,
    /// The row fails.
    Disallow,
    /// Allowed when the pattern has a wildcard, else the row fails.
    AllowIfWildcard,
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
    /// An unbounded source: the job runs in streaming mode.
    ReadStream(StreamSourceConfig),
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
        /// Riverbank's extension of `windowing:` (trigger, allowed lateness, accumulation).
        #[serde(default, skip_serializing_if = "is_default_triggering")]
        triggering: Triggering,
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
    /// A JSON schema every row must satisfy (checked by `json_schema::JsonSchema::compile`).
    ValidateWithSchema {
        schema: Value,
    },
    /// Beam's `MatchAll`: the files each row's pattern matches, as rows of `path`,
    /// `size_in_bytes` and `last_updated_in_seconds`.
    MatchAll {
        /// The field holding the pattern; `None`: the input's only field.
        file_pattern: Option<String>,
        empty_match_treatment: EmptyMatch,
    },
    /// Beam YAML's `PyTransform`: a Beam Python `PTransform` applied to whole inputs, run on
    /// Beam's Python SDK (`config`: `constructor`, `args`, `kwargs`, as Beam's
    /// `fully_qualified_named_transform` takes them).
    PyTransform {
        config: Map<String, Value>,
    },
    /// An unbounded source in an external log (Kafka, NATS JetStream): `connectors.rs`.
    ReadConnector(ConnectorSourceConfig),
    /// A sink into Kafka or NATS JetStream, committed exactly once per checkpoint.
    WriteConnector(ConnectorSinkConfig),
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
    /// Needs all of its inputs: starts a stage after a shuffle (Sql, Join, AssertEqual,
    /// PyTransform).
    Gather,
    /// Redistributes elements across workers: starts a stage after a shuffle.
    Reshuffle,
}

impl TransformConfig {
    /// Whether this is a source that never ends by itself (the job streams).
    pub fn is_unbounded(&self) -> bool {
        matches!(
            self,
            TransformConfig::ReadStream(_) | TransformConfig::ReadConnector(_)
        )
    }

    pub fn class(&self) -> Class {
        use TransformConfig::*;
        match self {
            Create { .. } | Read(_) | ReadStream(_) | ReadConnector(_) => Class::Source,
            Write(_) | WriteConnector(_) => Class::Sink,
            Combine { .. } => Class::Combine,
            Sql { .. } | Join { .. } | AssertEqual { .. } | PyTransform { .. } => Class::Gather,
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

    /// Whether the main output exists. Partition, AssertEqual and the Kafka/NATS sinks have
    /// none users can read; a file sink's is the files it wrote (Beam's `FileResult`s), once
    /// committed.
    pub fn has_main_output(&self) -> bool {
        !matches!(
            self,
            TransformConfig::Partition { .. }
                | TransformConfig::AssertEqual { .. }
                | TransformConfig::WriteConnector(_)
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
    "ReadFromSynthetic",
    "ReadFromNexmark",
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
    "ValidateWithSchema",
    "MatchAll",
    "PyTransform",
    "ReadFromKafka",
    "WriteToKafka",
    "ReadFromNats",
    "WriteToNats",
];

/// Transforms that accept Beam YAML's `error_handling: {output: NAME}`.
pub fn takes_error_handling(ty: &str) -> bool {
    matches!(
        ty,
        "MapToFields"
            | "Filter"
            | "Explode"
            | "Partition"
            | "AssignTimestamps"
            | "ValidateWithSchema"
            | "ReadFromKafka"
            | "WriteToKafka"
            | "ReadFromNats"
            | "WriteToNats"
    )
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

/// `a`, `a.b`, `"quoted"`: what the generic language accepts.
pub fn is_field_path(s: &str) -> bool {
    !s.is_empty()
        && s.split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_alphanumeric() || c == '_'))
}
