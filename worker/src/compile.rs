//! Binds a plan to its data: reads source schemas, propagates schemas through every
//! transform, and compiles expressions. This is where schema-aware validation happens
//! (`riverbank validate`, and the start of every run); every problem found is reported.
use crate::columns::{self, TS, WINDOW_END, WINDOW_START, has_window, ts_field, user_schema};
use crate::combine::{AggregateSpec, CombineFn, CombineSpec};
use crate::elements::batch_from_elements;
use crate::error::RunError;
use crate::expr::{Compiled, ExprCompiler};
use crate::io;
use crate::ops::{ElementOp, Kind, error_schema};
use crate::sql;
use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use riverbank_pipeline::config::{FileFormat, TransformConfig};
use riverbank_pipeline::windowing::WindowFn;
use riverbank_pipeline::{Issue, Plan, Transform};
use std::collections::HashMap;
use std::sync::Arc;

/// A compiled Combine: how to project its input, and the spec of both halves.
#[derive(Debug)]
pub struct CombineOp {
    pub spec: Arc<CombineSpec>,
    /// Group-by columns, by index in the user-visible input.
    pub keys: Vec<usize>,
    /// Value expressions, one per aggregate that has a value.
    pub values: Vec<Compiled>,
    /// Whether window bounds are part of the key.
    pub windowed: bool,
    /// Session windows merge per key before the final combine.
    pub sessions: bool,
    pub output_schema: SchemaRef,
}

#[derive(Debug)]
pub struct SqlOp {
    pub query: String,
    /// Table name → input collection id.
    pub tables: Vec<(String, String)>,
    /// Windowed input: the query runs once per window, as Beam SQL aggregates per window.
    pub windowed: bool,
    pub output_schema: SchemaRef,
}

/// Every transform, ready to run.
#[derive(Debug)]
pub enum CompiledTransform {
    Read {
        options: io::ReadOptions,
        source: io::SourcePlan,
    },
    Create {
        batch: RecordBatch,
    },
    Write {
        options: io::WriteOptions,
        schema: SchemaRef,
    },
    Element(ElementOp),
    Combine(CombineOp),
    Sql(SqlOp),
    Reshuffle,
    AssertEqual {
        expected: Vec<serde_json::Value>,
    },
}

pub struct CompiledPlan {
    pub plan: Plan,
    pub transforms: Vec<CompiledTransform>,
    /// Collection id → schema (with hidden columns).
    pub schemas: HashMap<String, SchemaRef>,
}

/// Target size of a source split: big enough to amortize, small enough to balance 2–64 cores.
pub const TARGET_SPLIT_BYTES: u64 = 16 * 1024 * 1024;

/// Compiles `plan`, reporting every problem found (not just the first). Sources are then
/// narrowed to the fields the pipeline uses (projection pushdown) and compiled again.
pub async fn compile(plan: Plan, batch_size: usize) -> Result<CompiledPlan, RunError> {
    // The second pass lists the input again but reuses the Parquet footers the first read.
    let footers = io::FooterMemo::default();
    let first = compile_pass(plan, batch_size, None, &footers).await?;
    match crate::pushdown::narrow_sources(&first) {
        Some(narrow) => compile_pass(narrow, batch_size, None, &footers).await,
        None => Ok(first),
    }
}

/// Compiles a plan whose sources were planned elsewhere: a worker compiles its coordinator's
/// (already narrowed) plan with the coordinator's source schemas (by transform index), without
/// listing the input again. The sources' splits stay empty: work items carry their own.
pub async fn compile_known_sources(
    plan: Plan,
    batch_size: usize,
    sources: &HashMap<usize, SchemaRef>,
) -> Result<CompiledPlan, RunError> {
    compile_pass(plan, batch_size, Some(sources), &io::FooterMemo::default()).await
}

async fn compile_pass(
    plan: Plan,
    batch_size: usize,
    known: Option<&HashMap<usize, SchemaRef>>,
    footers: &io::FooterMemo,
) -> Result<CompiledPlan, RunError> {
    let ec = ExprCompiler::new();
    let mut schemas: HashMap<String, SchemaRef> = HashMap::new();
    let mut out = vec![];
    let mut issues: Vec<Issue> = vec![];
    // The window fn of each collection, statically: sessions need merging at the Combine.
    let mut windows: HashMap<String, WindowFn> = HashMap::new();
    for (i, t) in plan.graph.transforms.iter().enumerate() {
        let input_window = t
            .inputs
            .first()
            .and_then(|(_, c)| windows.get(c).copied())
            .unwrap_or(WindowFn::Global);
        let window = match &t.config {
            TransformConfig::WindowInto { windowing } => *windowing,
            TransformConfig::Sql { .. }
            | TransformConfig::Join { .. }
            | TransformConfig::Create { .. }
            | TransformConfig::Read(_) => WindowFn::Global,
            _ => input_window,
        };
        for c in t.outputs() {
            windows.insert(c, window);
        }
        // Inputs whose producer failed to compile have no schema: skip quietly, the producer's
        // error is already reported.
        let inputs: Option<Vec<SchemaRef>> = t
            .inputs
            .iter()
            .map(|(_, c)| schemas.get(c).cloned())
            .collect();
        let Some(inputs) = inputs else {
            out.push(CompiledTransform::Reshuffle);
            continue;
        };
        let known = known.and_then(|k| k.get(&i));
        match compile_one(
            t,
            &inputs,
            &ec,
            batch_size,
            input_window.is_merging(),
            known,
            footers,
        )
        .await
        {
            Ok((ct, outs)) => {
                for (c, s) in outs {
                    schemas.insert(c, s);
                }
                out.push(ct);
            }
            Err(e) => {
                issues.extend(e);
                out.push(CompiledTransform::Reshuffle);
            }
        }
    }
    if !issues.is_empty() {
        return Err(RunError::Plan(issues));
    }
    Ok(CompiledPlan {
        plan,
        transforms: out,
        schemas,
    })
}

type Outs = Vec<(String, SchemaRef)>;

async fn compile_one(
    t: &Transform,
    inputs: &[SchemaRef],
    ec: &ExprCompiler,
    batch_size: usize,
    sessions: bool,
    known_source: Option<&SchemaRef>,
    footers: &io::FooterMemo,
) -> Result<(CompiledTransform, Outs), Vec<Issue>> {
    let name = t.name.as_str();
    let err = |field: &str, m: String| {
        vec![if field.is_empty() {
            Issue::at(name, m)
        } else {
            Issue::field(name, field, m)
        }]
    };
    let main = |s: SchemaRef| vec![(t.name.clone(), s)];
    let input = inputs
        .first()
        .cloned()
        .unwrap_or_else(|| Arc::new(Schema::empty()));
    let user = user_schema(&input);
    let hidden: Vec<Arc<Field>> = input
        .fields()
        .iter()
        .filter(|f| columns::is_hidden(f.name()))
        .cloned()
        .collect();
    let with_hidden = |mut fields: Vec<Field>| -> SchemaRef {
        fields.extend(hidden.iter().map(|f| f.as_ref().clone()));
        Arc::new(Schema::new(fields))
    };
    let compile = |field: &str, e: &riverbank_pipeline::config::Expr| {
        ec.compile(e, &user).map_err(|m| err(field, m))
    };
    let field_index = |field: &str, f: &str| {
        user.index_of(f).map_err(|_| {
            err(
                field,
                format!(
                    "no field '{f}' in the input (fields: {})",
                    field_list(&user)
                ),
            )
        })
    };
    let element = |kind: Kind, schema: SchemaRef| -> (CompiledTransform, Outs) {
        let mut outs = main(schema.clone());
        let error_output = t
            .error_output
            .as_ref()
            .map(|tag| format!("{}.{tag}", t.name));
        if let Some(e) = &error_output {
            outs.push((e.clone(), error_schema(&input)));
        }
        (
            CompiledTransform::Element(ElementOp {
                transform: t.name.clone(),
                kind,
                output: t.name.clone(),
                error_output,
                output_schema: schema,
            }),
            outs,
        )
    };

    Ok(match &t.config {
        TransformConfig::Read(rc) => {
            let options = io::ReadOptions {
                format: match rc.format {
                    FileFormat::Csv => io::FileFormat::Csv,
                    FileFormat::Json => io::FileFormat::Json,
                    FileFormat::Parquet => io::FileFormat::Parquet,
                    FileFormat::Text => io::FileFormat::Text,
                },
                path: rc.path.clone(),
                columns: rc.columns.clone(),
                csv_delimiter: rc
                    .delimiter
                    .as_ref()
                    .and_then(|d| d.bytes().next())
                    .unwrap_or(b','),
                csv_has_header: true,
                batch_size,
            };
            let source = match known_source {
                Some(schema) => io::SourcePlan {
                    schema: schema.clone(),
                    splits: vec![],
                },
                None => io::plan_source_with(&options, TARGET_SPLIT_BYTES, footers)
                    .await
                    .map_err(|e| err("path", e.to_string()))?,
            };
            let schema = source.schema.clone();
            (CompiledTransform::Read { options, source }, main(schema))
        }
        TransformConfig::Create { elements } => {
            let batch = batch_from_elements(elements).map_err(|m| err("elements", m))?;
            let schema = batch.schema();
            (CompiledTransform::Create { batch }, main(schema))
        }
        TransformConfig::Write(wc) => {
            let options = io::WriteOptions {
                format: match wc.format {
                    FileFormat::Csv => io::FileFormat::Csv,
                    FileFormat::Json => io::FileFormat::Json,
                    FileFormat::Parquet => io::FileFormat::Parquet,
                    FileFormat::Text => io::FileFormat::Text,
                },
                path: wc.path.clone(),
                num_shards: wc.num_shards,
                shard_name_template: wc.shard_name_template.clone(),
                file_name_suffix: wc.file_name_suffix.clone(),
            };
            if wc.format == FileFormat::Text
                && (user.fields().len() != 1
                    || !matches!(
                        user.field(0).data_type(),
                        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                    ))
            {
                return Err(err(
                    "",
                    format!(
                        "WriteToText needs rows with one string field; got fields [{}] (use MapToFields to format a line)",
                        field_list(&user)
                    ),
                ));
            }
            if wc.format == FileFormat::Csv
                && let Some(f) = user.fields().iter().find(|f| f.data_type().is_nested())
            {
                return Err(err(
                    "",
                    format!(
                        "WriteToCsv cannot write nested field '{}' ({})",
                        f.name(),
                        f.data_type()
                    ),
                ));
            }
            (
                CompiledTransform::Write {
                    options,
                    schema: user.clone(),
                },
                vec![],
            )
        }
        TransformConfig::MapToFields {
            append,
            drop,
            fields,
        } => {
            for d in drop {
                field_index("drop", d)?;
            }
            if *append {
                // As Beam: appending may not silently replace an input field (drop it first).
                if let Some((n, _)) = fields
                    .iter()
                    .find(|(n, _)| user.index_of(n).is_ok() && !drop.contains(n))
                {
                    return Err(err(
                        &format!("fields.{n}"),
                        format!(
                            "cannot append field '{n}': the input already has a field '{n}' (drop it to redefine it)"
                        ),
                    ));
                }
            }
            let mut compiled = vec![];
            let mut errs = vec![];
            for (n, e) in fields {
                match compile(&format!("fields.{n}"), e) {
                    Ok(c) => compiled.push((n.clone(), c)),
                    Err(e) => errs.extend(e),
                }
            }
            if !errs.is_empty() {
                return Err(errs);
            }
            let keep: Vec<usize> = if *append {
                (0..user.fields().len())
                    .filter(|&i| {
                        let n = user.field(i).name();
                        !drop.contains(n) && !fields.iter().any(|(f, _)| f == n)
                    })
                    .collect()
            } else {
                vec![]
            };
            let mut out: Vec<Field> = keep.iter().map(|&i| user.field(i).clone()).collect();
            out.extend(
                compiled
                    .iter()
                    .map(|(n, c)| Field::new(n, c.data_type.clone(), true)),
            );
            element(
                Kind::MapToFields {
                    keep,
                    fields: compiled,
                },
                with_hidden(out),
            )
        }
        TransformConfig::Filter { keep } => {
            let c = compile("keep", keep)?;
            if c.data_type != DataType::Boolean {
                return Err(err(
                    "keep",
                    format!(
                        "'{}' must be a boolean expression, it is {}",
                        keep.text, c.data_type
                    ),
                ));
            }
            element(Kind::Filter { keep: c }, input.clone())
        }
        TransformConfig::Explode {
            fields,
            cross_product,
        } => {
            let mut idx = vec![];
            let mut out: Vec<Field> = user.fields().iter().map(|f| f.as_ref().clone()).collect();
            for f in fields {
                let i = field_index("fields", f)?;
                match user.field(i).data_type() {
                    DataType::List(item) => out[i] = Field::new(f, item.data_type().clone(), true),
                    other => {
                        return Err(err(
                            "fields",
                            format!("field '{f}' is a {other}, not a list"),
                        ));
                    }
                }
                idx.push(i);
            }
            element(
                Kind::Explode {
                    fields: idx,
                    cross_product: *cross_product,
                },
                with_hidden(out),
            )
        }
        TransformConfig::Partition {
            by,
            outputs,
            unknown_output,
        } => {
            let c = compile("by", by)?;
            let outs: Vec<(String, String)> = outputs
                .iter()
                .map(|o| (o.clone(), format!("{}.{o}", t.name)))
                .collect();
            let unknown = unknown_output.as_ref().map(|u| format!("{}.{u}", t.name));
            let (ct, mut o) = element(
                Kind::Partition {
                    by: c,
                    outputs: outs.clone(),
                    unknown: unknown.clone(),
                },
                input.clone(),
            );
            // Partition has no main output: one collection per named output.
            o.retain(|(c, _)| c != &t.name);
            for c in outs.iter().map(|(_, c)| c).chain(unknown.as_ref()) {
                o.push((c.clone(), input.clone()));
            }
            (ct, o)
        }
        TransformConfig::AssignTimestamps { timestamp } => {
            let c = compile("timestamp", timestamp)?;
            let mut fields: Vec<Field> = input
                .fields()
                .iter()
                .filter(|f| f.name() != TS)
                .map(|f| f.as_ref().clone())
                .collect();
            fields.push(ts_field(TS));
            element(
                Kind::AssignTimestamps { timestamp: c },
                Arc::new(Schema::new(fields)),
            )
        }
        TransformConfig::WindowInto { windowing } => {
            if input.index_of(TS).is_err() && *windowing != WindowFn::Global {
                return Err(err(
                    "windowing",
                    "elements have no event timestamps: add AssignTimestamps before windowing"
                        .into(),
                ));
            }
            let mut fields: Vec<Field> = input
                .fields()
                .iter()
                .filter(|f| f.name() != WINDOW_START && f.name() != WINDOW_END)
                .map(|f| f.as_ref().clone())
                .collect();
            if *windowing != WindowFn::Global {
                fields.push(ts_field(WINDOW_START));
                fields.push(ts_field(WINDOW_END));
            }
            element(
                Kind::WindowInto { window: *windowing },
                Arc::new(Schema::new(fields)),
            )
        }
        TransformConfig::ExtractWindowingInfo { fields } => {
            let mut out: Vec<Field> = user.fields().iter().map(|f| f.as_ref().clone()).collect();
            for (f, param) in fields {
                if user.index_of(f).is_ok() {
                    return Err(err(
                        "fields",
                        format!("the input already has a field '{f}'"),
                    ));
                }
                out.push(match param.as_str() {
                    "window_type" | "window_string" => Field::new(f, DataType::Utf8, false),
                    _ => Field::new(f, columns::ts_type(), true),
                });
            }
            element(
                Kind::ExtractWindowingInfo {
                    fields: fields.clone(),
                },
                with_hidden(out),
            )
        }
        TransformConfig::Flatten => {
            // The union of the inputs' fields; same-named fields must share a type.
            let mut fields: Vec<Field> = vec![];
            for s in inputs {
                for f in s.fields() {
                    match fields.iter().find(|x| x.name() == f.name()) {
                        Some(x)
                            if x.data_type() != f.data_type()
                                && arrow::compute::can_cast_types(f.data_type(), x.data_type()) => {
                        }
                        Some(x) if x.data_type() != f.data_type() => {
                            return Err(err(
                                "input",
                                format!(
                                    "inputs disagree on field '{}': {} vs {}",
                                    f.name(),
                                    x.data_type(),
                                    f.data_type()
                                ),
                            ));
                        }
                        Some(_) => {}
                        None => fields.push(f.as_ref().clone().with_nullable(true)),
                    }
                }
            }
            let windowed: Vec<bool> = inputs.iter().map(|s| has_window(s)).collect();
            if windowed.iter().any(|w| *w != windowed[0]) {
                return Err(err(
                    "input",
                    "inputs have different windowing; window them the same way before Flatten"
                        .into(),
                ));
            }
            element(Kind::Flatten, Arc::new(Schema::new(fields)))
        }
        TransformConfig::LogForTesting { level, prefix } => element(
            Kind::LogForTesting {
                level: level.clone(),
                prefix: prefix.clone(),
            },
            input.clone(),
        ),
        TransformConfig::Combine {
            group_by,
            aggregates,
        } => {
            let mut key_fields = vec![];
            let mut keys = vec![];
            for g in group_by {
                let i = field_index("group_by", g)?;
                keys.push(i);
                key_fields.push(user.field(i).clone());
            }
            let windowed = has_window(&input);
            if windowed {
                key_fields.push(ts_field(WINDOW_START));
                key_fields.push(ts_field(WINDOW_END));
            }
            let mut specs = vec![];
            let mut values = vec![];
            for a in aggregates {
                let func: CombineFn =
                    a.func.parse().map_err(|e: crate::combine::CombineError| {
                        err(&format!("combine.{}", a.output), e.to_string())
                    })?;
                let input_type = match &a.value {
                    Some(v) => {
                        let c = compile(&format!("combine.{}.value", a.output), v)?;
                        let ty = c.data_type.clone();
                        values.push(c);
                        Some(ty)
                    }
                    None => None,
                };
                specs.push(AggregateSpec::new(a.output.clone(), func, input_type));
            }
            let spec = Arc::new(CombineSpec {
                key_fields,
                aggregates: specs,
            });
            let out = spec
                .output_schema()
                .map_err(|e| err("combine", e.to_string()))?;
            spec.state_schema()
                .map_err(|e| err("combine", e.to_string()))?;
            // Output: user keys and aggregates, then the window and the end-of-window timestamp.
            let mut fields: Vec<Field> = out
                .fields()
                .iter()
                .filter(|f| !columns::is_hidden(f.name()))
                .map(|f| f.as_ref().clone())
                .collect();
            if windowed {
                fields.push(ts_field(WINDOW_START));
                fields.push(ts_field(WINDOW_END));
                fields.push(ts_field(TS));
            }
            let output_schema: SchemaRef = Arc::new(Schema::new(fields));
            (
                CompiledTransform::Combine(CombineOp {
                    spec,
                    keys,
                    values,
                    windowed,
                    sessions,
                    output_schema: output_schema.clone(),
                }),
                main(output_schema),
            )
        }
        TransformConfig::Sql { query } => {
            // An unnamed input (`input: X` or `input: [X]`, tags `input` / `input0`) is PCOLLECTION;
            // a named one (`input: {rows: X}`) keeps its name.
            let unnamed = |tag: &str| {
                tag.strip_prefix("input")
                    .is_some_and(|rest| rest.chars().all(|c| c.is_ascii_digit()))
            };
            let tables: Vec<(String, String, SchemaRef)> =
                if t.inputs.len() == 1 && unnamed(&t.inputs[0].0) {
                    vec![(
                        "PCOLLECTION".into(),
                        t.inputs[0].1.clone(),
                        user_schema(&inputs[0]),
                    )]
                } else {
                    t.inputs
                        .iter()
                        .zip(inputs)
                        .map(|((tag, c), s)| (tag.clone(), c.clone(), user_schema(s)))
                        .collect()
                };
            let schema = sql::plan_schema(query, &tables)
                .await
                .map_err(|m| err("query", m))?;
            let (ct, schema) =
                sql_op(query.clone(), tables, schema, inputs).map_err(|m| err("input", m))?;
            (ct, main(schema))
        }
        TransformConfig::Join {
            join_type,
            equalities,
            fields,
        } => {
            let named: Vec<(String, SchemaRef)> = t
                .inputs
                .iter()
                .zip(inputs)
                .map(|((tag, _), s)| (tag.clone(), user_schema(s)))
                .collect();
            let query =
                sql::join_query(&named, join_type, equalities, fields).map_err(|m| err("", m))?;
            let tables: Vec<(String, String, SchemaRef)> = t
                .inputs
                .iter()
                .zip(inputs)
                .map(|((tag, c), s)| (tag.clone(), c.clone(), user_schema(s)))
                .collect();
            let schema = sql::plan_schema(&query, &tables)
                .await
                .map_err(|m| err("", m))?;
            let (ct, schema) =
                sql_op(query, tables, schema, inputs).map_err(|m| err("input", m))?;
            (ct, main(schema))
        }
        TransformConfig::Reshuffle => (CompiledTransform::Reshuffle, main(input.clone())),
        TransformConfig::AssertEqual { elements } => (
            CompiledTransform::AssertEqual {
                expected: elements.clone(),
            },
            vec![],
        ),
    })
}

/// A Sql/Join op. On windowed inputs (all of them, alike) the output carries the window and
/// Beam's end-of-window timestamp, as a grouping step's output does.
fn sql_op(
    query: String,
    tables: Vec<(String, String, SchemaRef)>,
    schema: SchemaRef,
    inputs: &[SchemaRef],
) -> Result<(CompiledTransform, SchemaRef), String> {
    let windowed: Vec<bool> = inputs.iter().map(|s| has_window(s)).collect();
    if windowed.iter().any(|w| *w != windowed[0]) {
        return Err("some inputs are windowed and some are not; window them alike".into());
    }
    let windowed = windowed.first().copied().unwrap_or(false);
    let output_schema: SchemaRef = if windowed {
        let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.extend([ts_field(WINDOW_START), ts_field(WINDOW_END), ts_field(TS)]);
        Arc::new(Schema::new(fields))
    } else {
        schema
    };
    Ok((
        CompiledTransform::Sql(SqlOp {
            query,
            tables: tables.into_iter().map(|(n, c, _)| (n, c)).collect(),
            windowed,
            output_schema: output_schema.clone(),
        }),
        output_schema,
    ))
}

fn field_list(s: &Schema) -> String {
    s.fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
