//! From a transform's `config:` mapping to its typed config: one function per transform type.

use serde_json::{Map, Value};

use super::fields::{FieldErr, Fields};
use super::{
    EmptyMatch, FileFormat, JoinType, Language, ReadConfig, TransformConfig, WriteConfig,
    unknown_type_message,
};
use crate::windowing::parse_windowing;

type Parsed = Result<TransformConfig, FieldErr>;
/// Join's `fields`: input name → (output name, input field) pairs.
type JoinFields = Vec<(String, Vec<(String, String)>)>;

/// Reads a config mapping into a typed config. `windowing` is the transform's own windowing
/// (used by WindowInto). Errors are `(field, message)`.
pub fn parse_config(
    ty: &str,
    cfg: &Map<String, Value>,
    windowing: Option<&Value>,
) -> Result<TransformConfig, (Option<String>, String)> {
    let p = Fields { cfg };
    let lang = p.language(ty)?;
    match ty {
        "Create" => create(&p),
        "ReadFromCsv" => read(&p, FileFormat::Csv),
        "ReadFromJson" => read(&p, FileFormat::Json),
        "ReadFromParquet" => read(&p, FileFormat::Parquet),
        "ReadFromText" => read(&p, FileFormat::Text),
        "ReadFromSynthetic" => super::stream_source::synthetic(&p),
        "ReadFromNexmark" => super::stream_source::nexmark(&p),
        "WriteToCsv" => write(&p, FileFormat::Csv),
        "WriteToJson" => write(&p, FileFormat::Json),
        "WriteToParquet" => write(&p, FileFormat::Parquet),
        "WriteToText" => write(&p, FileFormat::Text),
        "MapToFields" => map_to_fields(&p, lang),
        "Filter" => filter(&p, lang),
        "Explode" => explode(&p),
        "Flatten" => flatten(&p),
        "Partition" => partition(&p, lang),
        "Combine" => combine(&p, lang),
        "AssignTimestamps" => assign_timestamps(&p, lang),
        "WindowInto" => window_into(&p, windowing),
        "ExtractWindowingInfo" => extract_windowing_info(&p),
        "Sql" => sql(&p),
        "Join" => join(&p),
        "Reshuffle" => reshuffle(&p),
        "LogForTesting" => log_for_testing(&p),
        "AssertEqual" => assert_equal(&p),
        "ValidateWithSchema" => validate_with_schema(&p),
        "MatchAll" => match_all(&p),
        "ReadFromKafka" => super::connectors::read_kafka(&p),
        "WriteToKafka" => super::connectors::write_kafka(&p),
        "ReadFromNats" => super::connectors::read_nats(&p),
        "WriteToNats" => super::connectors::write_nats(&p),
        "PyTransform" => py_transform(&p),
        other => Err((None, unknown_type_message(other))),
    }
}

fn create(p: &Fields) -> Parsed {
    p.only(&["elements", "reshuffle"])?;
    Ok(TransformConfig::Create {
        elements: p.req_list("elements")?,
    })
}

fn read(p: &Fields, format: FileFormat) -> Parsed {
    p.only(match format {
        FileFormat::Csv => &["path", "delimiter", "columns", "refresh_interval"],
        FileFormat::Parquet | FileFormat::Json => &["path", "columns", "refresh_interval"],
        FileFormat::Text => &["path", "refresh_interval"],
    })?;
    let refresh_us = match p.cfg.get("refresh_interval") {
        None | Some(Value::Null) => None,
        Some(v) => match crate::duration::parse_duration(v) {
            Ok(us) if us >= 1_000_000 => Some(us),
            Ok(_) => return Err(p.err("refresh_interval", "must be at least 1s")),
            Err(e) => return Err(p.err("refresh_interval", &e)),
        },
    };
    let delimiter = p.opt_str("delimiter")?;
    if let Some(d) = &delimiter
        && d.len() != 1
    {
        return Err(p.err("delimiter", "must be one character"));
    }
    Ok(TransformConfig::Read(ReadConfig {
        format,
        path: p.req_str("path")?,
        columns: p.opt_str_list("columns")?,
        delimiter,
        refresh_us,
    }))
}

fn write(p: &Fields, format: FileFormat) -> Parsed {
    p.only(&[
        "path",
        "num_shards",
        "shard_name_template",
        "file_name_suffix",
    ])?;
    let num_shards = match p.cfg.get("num_shards") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Some(n as usize),
            _ => return Err(p.err("num_shards", "must be a positive integer")),
        },
    };
    Ok(TransformConfig::Write(WriteConfig {
        format,
        path: p.req_str("path")?,
        num_shards,
        shard_name_template: p.opt_str("shard_name_template")?,
        file_name_suffix: p.opt_str("file_name_suffix")?,
    }))
}

fn map_to_fields(p: &Fields, lang: Language) -> Parsed {
    p.only(&["language", "append", "drop", "fields", "error_handling"])?;
    let append = p.opt_bool("append")?.unwrap_or(false);
    let drop = p.opt_str_list("drop")?.unwrap_or_default();
    let mut fields = vec![];
    if let Some(v) = p.cfg.get("fields") {
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
    Ok(TransformConfig::MapToFields {
        append,
        drop,
        fields,
    })
}

fn filter(p: &Fields, lang: Language) -> Parsed {
    p.only(&["language", "keep", "error_handling"])?;
    Ok(TransformConfig::Filter {
        keep: p.req_expr("keep", lang)?,
    })
}

fn explode(p: &Fields) -> Parsed {
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
    Ok(TransformConfig::Explode {
        fields,
        cross_product,
    })
}

fn flatten(p: &Fields) -> Parsed {
    p.only(&[])?;
    Ok(TransformConfig::Flatten)
}

fn partition(p: &Fields, lang: Language) -> Parsed {
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
    Ok(TransformConfig::Partition {
        by: p.req_expr("by", lang)?,
        outputs,
        unknown_output: p.opt_str("unknown_output")?,
    })
}

fn combine(p: &Fields, lang: Language) -> Parsed {
    p.only(&["language", "group_by", "combine"])?;
    let group_by = if p.cfg.contains_key("group_by") {
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
    Ok(TransformConfig::Combine {
        group_by,
        aggregates,
    })
}

fn assign_timestamps(p: &Fields, lang: Language) -> Parsed {
    p.only(&["language", "timestamp", "error_handling"])?;
    Ok(TransformConfig::AssignTimestamps {
        timestamp: p.req_expr("timestamp", lang)?,
    })
}

fn window_into(p: &Fields, windowing: Option<&Value>) -> Parsed {
    p.only(&["windowing"])?;
    let w = p.cfg.get("windowing").or(windowing).ok_or((
        Some("windowing".into()),
        "WindowInto needs 'windowing'".into(),
    ))?;
    let (windowing, triggering) = parse_windowing(w).map_err(|e| (Some("windowing".into()), e))?;
    Ok(TransformConfig::WindowInto {
        windowing,
        triggering,
    })
}

fn extract_windowing_info(p: &Fields) -> Parsed {
    p.only(&["fields"])?;
    const ALLOWED: &[&str] = &[
        "timestamp",
        "window_start",
        "window_end",
        "window_string",
        "window_type",
        "pane_info",
    ];
    let fields: Vec<(String, String)> = match p.cfg.get("fields") {
        None => ["timestamp", "window_start", "window_end"]
            .iter()
            .map(|f| (f.to_string(), f.to_string()))
            .collect(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(name, v)| {
                v.as_str()
                    .map(|param| (name.clone(), param.to_string()))
                    .ok_or_else(|| p.err("fields", "must map field names to windowing parameters"))
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
    Ok(TransformConfig::ExtractWindowingInfo { fields })
}

fn sql(p: &Fields) -> Parsed {
    p.only(&["query", "dialect"])?;
    Ok(TransformConfig::Sql {
        query: p.req_str("query")?,
    })
}

fn join(p: &Fields) -> Parsed {
    p.only(&["type", "equalities", "fields"])?;
    Ok(TransformConfig::Join {
        join_type: join_type(p)?,
        equalities: join_equalities(p)?,
        fields: join_fields(p)?,
    })
}

/// `type`: inner (the default), left, right, outer, or `{outer: [a, b]}`.
fn join_type(p: &Fields) -> Result<JoinType, FieldErr> {
    Ok(match p.cfg.get("type") {
        None => JoinType::Inner,
        Some(Value::String(s)) => match s.as_str() {
            "inner" => JoinType::Inner,
            "left" => JoinType::Left,
            "right" => JoinType::Right,
            "outer" => JoinType::Outer,
            _ => return Err(p.err("type", "must be inner, left, right or outer")),
        },
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
    })
}

/// `equalities`: a field of every input, or a list of such fields and mappings of input
/// name to field.
fn join_equalities(p: &Fields) -> Result<Vec<Vec<(String, String)>>, FieldErr> {
    match p.req("equalities")? {
        Value::String(field) => Ok(vec![vec![("*".into(), field.clone())]]),
        Value::Array(items) => {
            let mut out = vec![];
            for item in items {
                match item {
                    Value::String(field) => out.push(vec![("*".into(), field.clone())]),
                    Value::Object(m) if m.values().all(|v| v.is_string()) => out.push(
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                            .collect(),
                    ),
                    _ => {
                        return Err(p.err(
                            "equalities",
                            "each equality is a field name or a mapping of input name to field",
                        ));
                    }
                }
            }
            Ok(out)
        }
        _ => Err(p.err("equalities", "must be a field name or a list")),
    }
}

/// As Beam: per input, a list of fields, a mapping `new_name: field`, or `'*'`;
/// inputs not listed contribute all of their fields.
fn join_fields(p: &Fields) -> Result<JoinFields, FieldErr> {
    let mut fields = vec![];
    if let Some(v) = p.cfg.get("fields") {
        const MSG: &str =
            "must map input names to a list of fields, a mapping of new name to field, or '*'";
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
    Ok(fields)
}

fn reshuffle(p: &Fields) -> Parsed {
    p.only(&["num_buckets"])?;
    Ok(TransformConfig::Reshuffle)
}

fn log_for_testing(p: &Fields) -> Parsed {
    p.only(&["level", "prefix"])?;
    let level = p.opt_str("level")?.unwrap_or_else(|| "INFO".into());
    if !["DEBUG", "INFO", "WARNING", "WARN", "ERROR"].contains(&level.to_uppercase().as_str()) {
        return Err(p.err("level", "must be DEBUG, INFO, WARNING or ERROR"));
    }
    Ok(TransformConfig::LogForTesting {
        level,
        prefix: p.opt_str("prefix")?.unwrap_or_default(),
    })
}

fn assert_equal(p: &Fields) -> Parsed {
    p.only(&["elements"])?;
    Ok(TransformConfig::AssertEqual {
        elements: p.req_list("elements")?,
    })
}

fn match_all(p: &Fields) -> Parsed {
    p.only(&["file_pattern", "empty_match_treatment"])?;
    let empty_match_treatment = match p.opt_str("empty_match_treatment")?.as_deref() {
        None | Some("ALLOW") => EmptyMatch::Allow,
        Some("DISALLOW") => EmptyMatch::Disallow,
        Some("ALLOW_IF_WILDCARD") => EmptyMatch::AllowIfWildcard,
        Some(_) => {
            return Err(p.err(
                "empty_match_treatment",
                "must be ALLOW, DISALLOW or ALLOW_IF_WILDCARD",
            ));
        }
    };
    Ok(TransformConfig::MatchAll {
        file_pattern: p.opt_str("file_pattern")?,
        empty_match_treatment,
    })
}

fn validate_with_schema(p: &Fields) -> Parsed {
    p.only(&["schema", "error_handling"])?;
    let schema = p.req("schema")?.clone();
    super::json_schema::JsonSchema::compile(&schema).map_err(|e| p.err("schema", &e))?;
    Ok(TransformConfig::ValidateWithSchema { schema })
}

/// Beam YAML's `PyTransform` applies a Beam Python `PTransform` (a dotted constructor, or inline
/// `__constructor__`/`__callable__` source) to whole PCollections. The engine runs it as a
/// stage of its own on Beam's Python SDK; here only its config's shape is checked (the
/// constructor itself is found when Beam's SDK builds it, at compile time).
fn py_transform(p: &Fields) -> Parsed {
    p.only(&["constructor", "args", "kwargs"])?;
    let constructor = p.req_str("constructor")?;
    if matches!(constructor.as_str(), "__constructor__" | "__callable__")
        && p.cfg.get("kwargs").and_then(|k| k.get("source")).is_none()
    {
        return Err(p.err(
            "kwargs",
            &format!("an inline {constructor} PTransform needs its Python in kwargs.source"),
        ));
    }
    if p.cfg.get("args").is_some_and(|a| !a.is_array()) {
        return Err(p.err(
            "args",
            "must be a list (the constructor's positional arguments)",
        ));
    }
    if p.cfg.get("kwargs").is_some_and(|k| !k.is_object()) {
        return Err(p.err(
            "kwargs",
            "must be a mapping (the constructor's keyword arguments)",
        ));
    }
    Ok(TransformConfig::PyTransform {
        config: p.cfg.clone(),
    })
}
