//! Binds a plan to its data: reads source schemas, propagates schemas through every
//! transform, and compiles expressions. This is where schema-aware validation happens
//! (`riverbank validate`, and the start of every run); every problem found is reported.
//!
//! One function per transform, by class: `source.rs`, `element.rs`, `combine.rs`,
//! `gather.rs` (Sql, Join, AssertEqual), `py_transform.rs` and `sink.rs`; `side_inputs.rs`
//! after them all (which inputs of a streaming Sql/Join carry a bounded source's rows, and
//! where the rows of a file read again and again may go).

mod combine;
mod element;
mod gather;
mod py_transform;
mod side_inputs;
mod sink;
mod source;

use crate::error::RunError;
use crate::ops::{ElementOp, Kind, error_schema};
use crate::python_sdk::PyOutput;
use arrow::datatypes::{Field, Schema, SchemaRef};
use riverbank_elements::columns::{self, user_schema};
use riverbank_io as io;
use riverbank_pipeline::config::{Expr, FileFormat, TransformConfig};
use riverbank_pipeline::trigger::Triggering;
use riverbank_pipeline::windowing::WindowFn;
use riverbank_pipeline::{Issue, Plan, Transform};
use riverbank_udf::expr::{Compiled, ExprCompiler, Role};
use std::collections::HashMap;
use std::sync::Arc;

pub use crate::compiled::*;

/// Target size of a source split: big enough to amortize, small enough to balance 2–64 cores.
pub const TARGET_SPLIT_BYTES: u64 = 16 * 1024 * 1024;

/// Compiles `plan`, reporting every problem found (not just the first). Sources are then
/// narrowed to the fields the pipeline uses (projection pushdown) and compiled again.
pub async fn compile(plan: Plan, batch_size: usize) -> Result<CompiledPlan, RunError> {
    // The second pass lists the input again but reuses the Parquet footers the first read.
    let footers = io::FooterMemo::default();
    let plan = riverbank_udf::inline_files(plan);
    let first = compile_pass(plan, batch_size, None, &footers).await?;
    match crate::pushdown::narrow_sources(&first) {
        Some(narrow) => compile_pass(narrow, batch_size, None, &footers).await,
        None => Ok(first),
    }
}

/// What a coordinator compiled already, by transform index, that a worker compiling the same
/// plan need not find out again: its sources' schemas (no second listing of the input) and its
/// PyTransforms' outputs (no second trip through Beam's Python SDK).
#[derive(Debug, Clone, Default)]
pub struct Known {
    pub sources: HashMap<usize, SchemaRef>,
    pub py_outputs: HashMap<usize, PyOutput>,
}

/// Compiles a plan whose sources were planned elsewhere: a worker compiles its coordinator's
/// (already narrowed) plan with what the coordinator compiled (`Known`). The sources' splits
/// stay empty: work items carry their own.
pub async fn compile_with_known(
    plan: Plan,
    batch_size: usize,
    known: &Known,
) -> Result<CompiledPlan, RunError> {
    compile_pass(plan, batch_size, Some(known), &io::FooterMemo::default()).await
}

async fn compile_pass(
    plan: Plan,
    batch_size: usize,
    known: Option<&Known>,
    footers: &io::FooterMemo,
) -> Result<CompiledPlan, RunError> {
    riverbank_udf::prepare_dependencies(&plan).map_err(|i| RunError::Plan(vec![i]))?;
    let ec = ExprCompiler::new();
    let staging = riverbank_io::connectors::staging_root(&plan);
    let mut schemas: HashMap<String, SchemaRef> = HashMap::new();
    let mut out = vec![];
    let mut issues: Vec<Issue> = vec![];
    // The window fn of each collection, statically: sessions need merging at the Combine.
    let mut windows: HashMap<String, (WindowFn, Triggering)> = HashMap::new();
    for (i, t) in plan.graph.transforms.iter().enumerate() {
        let gathers = matches!(
            t.config,
            TransformConfig::Sql { .. } | TransformConfig::Join { .. }
        );
        let (input_window, mut input_triggering) = t
            .inputs
            .iter()
            .map(|(_, c)| windows.get(c).cloned().unwrap_or_default())
            // A Sql or Join of a windowed input with unwindowed ones (side inputs, in every
            // window) runs per window of the windowed one, whichever is named first.
            .find(|w| gathers && w.0 != WindowFn::Global)
            .or_else(|| t.inputs.first().and_then(|(_, c)| windows.get(c).cloned()))
            .unwrap_or_default();
        // In the global window, a Join of a stream with a bounded side input fires by the
        // stream's trigger, whichever input is named first.
        if input_window == WindowFn::Global
            && let Some(fires) = t.inputs.iter().find_map(|(_, c)| {
                windows
                    .get(c)
                    .filter(|w| w.0 == WindowFn::Global && w.1.trigger.fires_before_end())
            })
        {
            input_triggering = fires.1.clone();
        }
        let window = match &t.config {
            TransformConfig::WindowInto {
                windowing,
                triggering,
            } => (*windowing, triggering.clone()),
            // A Sql or Join runs per window, and its output stays in it (as Beam SQL's does);
            // rows of merged sessions are in no window fn's windows any more.
            TransformConfig::Sql { .. } | TransformConfig::Join { .. }
                if !input_window.is_merging() =>
            {
                (input_window, input_triggering.clone())
            }
            // A batch job commits a sink once: its files are in the global window. A
            // PyTransform's is Beam's (set below, once compiled).
            TransformConfig::PyTransform { .. }
            | TransformConfig::Sql { .. }
            | TransformConfig::Join { .. }
            | TransformConfig::Write(_)
            | TransformConfig::Create { .. }
            | TransformConfig::Read(_)
            | TransformConfig::ReadStream(_)
            | TransformConfig::ReadConnector(_) => Default::default(),
            _ => (input_window, input_triggering.clone()),
        };
        for c in t.outputs() {
            windows.insert(c, window.clone());
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
        if let Some(why) = window_refusal(&plan, t, &input_window, &input_triggering)
            .or_else(|| sink_read_in_streaming(&plan, t))
        {
            issues.push(Issue::at(&t.name, why));
        }
        // A streaming Sql/Join over the global window or sessions keeps state per key: each
        // input's TTL (the global window's only).
        let keyed_state = (plan.is_streaming()
            && (input_window == WindowFn::Global || input_window.is_merging()))
        .then(|| {
            t.inputs
                .iter()
                .map(|(_, c)| windows.get(c).and_then(|w| w.1.state_ttl_us))
                .collect::<Vec<_>>()
        });
        let pass = Pass {
            batch_size,
            known_source: known.and_then(|k| k.sources.get(&i)),
            known_py_output: known.and_then(|k| k.py_outputs.get(&i)),
            footers,
            staging: &staging,
            keyed_state: keyed_state.as_deref(),
            streaming: plan.is_streaming(),
        };
        match compile_one(t, &inputs, &ec, &(input_window, input_triggering), &pass).await {
            Ok((ct, outs)) => {
                // A streaming job reads its bounded sources once, as streams that end.
                let ct = match (plan.is_streaming(), &t.config) {
                    (true, TransformConfig::Read(rc)) => {
                        source::bounded_as_stream(ct, rc.refresh_us)
                    }
                    (true, _) => source::bounded_as_stream(ct, None),
                    (false, _) => ct,
                };
                for (c, s) in outs {
                    schemas.insert(c, s);
                }
                if let CompiledTransform::PyTransform { output_window, .. } = &ct {
                    windows.insert(t.name.clone(), (*output_window, Default::default()));
                }
                out.push(ct);
            }
            Err(e) => {
                issues.extend(e);
                out.push(CompiledTransform::Reshuffle);
            }
        }
    }
    issues.extend(side_inputs::mark(&plan, &mut out));
    if !issues.is_empty() {
        return Err(RunError::Plan(issues));
    }
    if plan.is_streaming() {
        slice_at_window_into(&plan, &mut out);
    }
    Ok(CompiledPlan {
        plan,
        transforms: out,
        schemas,
    })
}

/// A WindowInto of sliding windows read only by Combines that keep them as slices
/// ([`Slices`]) assigns each element its slice (a fixed window of the period, same offset)
/// rather than one row per window, which those Combines would only cut back to the slice.
fn slice_at_window_into(plan: &Plan, out: &mut [CompiledTransform]) {
    let graph = &plan.graph;
    for (i, t) in graph.transforms.iter().enumerate() {
        let CompiledTransform::Element(e) = &out[i] else {
            continue;
        };
        let crate::ops::Kind::WindowInto {
            window:
                WindowFn::Sliding {
                    size_us,
                    period_us,
                    offset_us,
                },
        } = e.kind
        else {
            continue;
        };
        let outputs = t.outputs();
        let mut readers = graph
            .transforms
            .iter()
            .enumerate()
            .filter(|(_, r)| r.inputs.iter().any(|(_, c)| outputs.contains(c)))
            .peekable();
        let sliced = readers.peek().is_some()
            && readers.all(|(j, _)| {
                matches!(&out[j], CompiledTransform::Combine(c)
                    if c.slices == Some(Slices { size_us, period_us }))
            });
        if sliced && let CompiledTransform::Element(e) = &mut out[i] {
            e.kind = crate::ops::Kind::WindowInto {
                window: WindowFn::Fixed {
                    size_us: period_us,
                    offset_us,
                },
            };
        }
    }
}

/// A file sink whose output is read, in a streaming job: its files are committed per
/// checkpoint and window by the driver, outside the stages, so there is nothing to read yet.
fn sink_read_in_streaming(plan: &Plan, t: &Transform) -> Option<String> {
    let read =
        matches!(t.config, TransformConfig::Write(_)) && !plan.graph.consumers(&t.name).is_empty();
    (read && plan.is_streaming()).then(|| {
        "the files a sink wrote can be read in a batch job only: a streaming job commits its \
         sinks per checkpoint and window, and gives no collection of the files"
            .to_string()
    })
}

/// What a Sql or Join cannot run on, refused before anything runs, in a streaming job: the
/// global window with a trigger that fires only when the job drains.
fn window_refusal(
    plan: &Plan,
    t: &Transform,
    input_window: &WindowFn,
    triggering: &Triggering,
) -> Option<String> {
    let kind = match &t.config {
        TransformConfig::Sql { .. } => "Sql",
        TransformConfig::Join { .. } => "Join",
        _ => return None,
    };
    match input_window {
        WindowFn::Global if plan.is_streaming() && !triggering.trigger.fires_before_end() => {
            Some(format!(
                "{kind} in a streaming job fires per window, and its input is in the global \
                 window with a trigger that fires only when the job drains: give the global \
                 window a trigger that fires as data comes (WindowInto with windowing: {{type: \
                 global, trigger: {{repeatedly: {{after_processing_time: 10s}}}}, \
                 accumulation_mode: accumulating}}), window the input (fixed or sliding \
                 windows), or run the pipeline as a batch job"
            ))
        }
        _ => None,
    }
}

type Outs = Vec<(String, SchemaRef)>;
/// One compiled transform and the schemas of the collections it produces.
type Step = Result<(CompiledTransform, Outs), Vec<Issue>>;

/// What every transform of a compile pass shares.
struct Pass<'a> {
    batch_size: usize,
    /// A source's schema known already (a worker compiling its coordinator's plan).
    known_source: Option<&'a SchemaRef>,
    /// A PyTransform's output known already (the same worker).
    known_py_output: Option<&'a PyOutput>,
    footers: &'a io::FooterMemo,
    /// Where connector sinks stage a checkpoint's rows until it commits them to the broker.
    staging: &'a str,
    /// A streaming transform over the global window or sessions, whose state is kept per key:
    /// each input's state TTL.
    keyed_state: Option<&'a [Option<i64>]>,
    streaming: bool,
}

async fn compile_one(
    t: &Transform,
    inputs: &[SchemaRef],
    ec: &ExprCompiler,
    input_windowing: &(WindowFn, Triggering),
    pass: &Pass<'_>,
) -> Step {
    let (batch_size, known_source, footers) = (pass.batch_size, pass.known_source, pass.footers);
    let cx = Cx::new(t, inputs, ec);
    match &t.config {
        TransformConfig::Read(rc) => source::read(&cx, rc, batch_size, known_source, footers).await,
        TransformConfig::ReadStream(sc) => Ok(source::read_stream(
            &cx,
            StreamSpec::Generator(sc.clone()),
            riverbank_io::unbounded::StreamSource::schema(sc),
        )),
        TransformConfig::Create { elements } => source::create(&cx, elements),
        TransformConfig::Write(wc) => sink::write(&cx, wc),
        TransformConfig::MapToFields {
            append,
            drop,
            fields,
        } => element::map_to_fields(&cx, *append, drop, fields),
        TransformConfig::Filter { keep } => element::filter(&cx, keep),
        TransformConfig::Explode {
            fields,
            cross_product,
        } => element::explode(&cx, fields, *cross_product),
        TransformConfig::Partition {
            by,
            outputs,
            unknown_output,
        } => element::partition(&cx, by, outputs, unknown_output.as_deref()),
        TransformConfig::AssignTimestamps { timestamp } => {
            element::assign_timestamps(&cx, timestamp)
        }
        TransformConfig::WindowInto { windowing, .. } => element::window_into(&cx, *windowing),
        TransformConfig::ExtractWindowingInfo { fields } => {
            element::extract_windowing_info(&cx, fields)
        }
        TransformConfig::Flatten => element::flatten(&cx),
        TransformConfig::MatchAll {
            file_pattern,
            empty_match_treatment,
        } => element::match_all(&cx, file_pattern.as_deref(), *empty_match_treatment),
        TransformConfig::LogForTesting { level, prefix } => {
            element::log_for_testing(&cx, level, prefix)
        }
        TransformConfig::Combine {
            group_by,
            aggregates,
        } => combine::combine(&cx, group_by, aggregates, input_windowing, pass.streaming),
        TransformConfig::Sql { query } => {
            gather::sql(
                &cx,
                query,
                input_windowing,
                (pass.keyed_state, pass.streaming),
            )
            .await
        }
        TransformConfig::Join {
            join_type,
            equalities,
            fields,
        } => {
            let eq = (join_type, equalities.as_slice(), fields.as_slice());
            gather::join(&cx, eq, input_windowing, pass.keyed_state).await
        }
        TransformConfig::Reshuffle => Ok((CompiledTransform::Reshuffle, cx.main(cx.input.clone()))),
        TransformConfig::AssertEqual { elements } => gather::assert_equal(elements),
        TransformConfig::PyTransform { config } => {
            let known = pass.known_py_output;
            py_transform::py_transform(&cx, config, &input_windowing.0, pass.streaming, known).await
        }
        // Kafka and NATS: the schema derives from the config, offline.
        TransformConfig::ReadConnector(sc) => {
            let user =
                riverbank_io::connectors::output_schema(sc).map_err(|m| cx.err("schema", m))?;
            let mut fields: Vec<Field> = user.fields().iter().map(|f| f.as_ref().clone()).collect();
            fields.push(riverbank_elements::columns::ts_field(
                riverbank_elements::columns::TS,
            ));
            Ok(source::read_stream(
                &cx,
                StreamSpec::Connector(sc.clone()),
                Arc::new(Schema::new(fields)),
            ))
        }
        TransformConfig::WriteConnector(_) => Ok(sink::write_connector(&cx, pass.staging)),
        TransformConfig::ValidateWithSchema { schema } => {
            let schema = riverbank_pipeline::config::json_schema::JsonSchema::compile(schema)
                .map_err(|m| cx.err("schema", m))?;
            Ok(cx.element(
                Kind::ValidateWithSchema {
                    schema: Box::new(schema),
                },
                cx.input.clone(),
            ))
        }
    }
}

/// What compiling one transform sees: the transform, its input schemas, and the first
/// input as users see it.
struct Cx<'a> {
    t: &'a Transform,
    inputs: &'a [SchemaRef],
    ec: &'a ExprCompiler,
    /// The first input (empty for a source), hidden columns included.
    input: SchemaRef,
    /// `input` without its hidden columns.
    user: SchemaRef,
    /// The hidden columns of `input`, which element-wise outputs carry on.
    hidden: Vec<Arc<Field>>,
}

impl<'a> Cx<'a> {
    fn new(t: &'a Transform, inputs: &'a [SchemaRef], ec: &'a ExprCompiler) -> Self {
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
        Cx {
            t,
            inputs,
            ec,
            input,
            user,
            hidden,
        }
    }

    /// An issue at `field` of this transform (at the transform itself when `field` is empty).
    fn err(&self, field: &str, m: String) -> Vec<Issue> {
        let name = self.t.name.as_str();
        vec![if field.is_empty() {
            Issue::at(name, m)
        } else {
            Issue::field(name, field, m)
        }]
    }

    /// The main output, alone.
    fn main(&self, s: SchemaRef) -> Outs {
        vec![(self.t.name.clone(), s)]
    }

    fn with_hidden(&self, mut fields: Vec<Field>) -> SchemaRef {
        fields.extend(self.hidden.iter().map(|f| f.as_ref().clone()));
        Arc::new(Schema::new(fields))
    }

    /// Compiles an expression over the user's fields.
    fn compile(&self, field: &str, e: &Expr) -> Result<Compiled, Vec<Issue>> {
        self.compile_as(field, e, Role::Value)
    }

    /// Compiles an expression whose result the transform takes as `role` (UDFs need to know).
    fn compile_as(&self, field: &str, e: &Expr, role: Role) -> Result<Compiled, Vec<Issue>> {
        self.ec
            .compile_as(e, &self.user, role)
            .map_err(|m| self.err(field, m))
    }

    fn field_index(&self, field: &str, f: &str) -> Result<usize, Vec<Issue>> {
        self.user.index_of(f).map_err(|_| {
            self.err(
                field,
                format!(
                    "no field '{f}' in the input (fields: {})",
                    field_list(&self.user)
                ),
            )
        })
    }

    /// An element-wise op writing `schema` to the main output, and its failures to the
    /// error output when there is one.
    fn element(&self, kind: Kind, schema: SchemaRef) -> (CompiledTransform, Outs) {
        let t = self.t;
        let mut outs = self.main(schema.clone());
        let error_output = t
            .error_output
            .as_ref()
            .map(|tag| format!("{}.{tag}", t.name));
        if let Some(e) = &error_output {
            outs.push((e.clone(), error_schema(&self.input)));
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
    }
}

fn io_format(format: FileFormat) -> io::FileFormat {
    match format {
        FileFormat::Csv => io::FileFormat::Csv,
        FileFormat::Json => io::FileFormat::Json,
        FileFormat::Parquet => io::FileFormat::Parquet,
        FileFormat::Text => io::FileFormat::Text,
    }
}

fn field_list(s: &Schema) -> String {
    s.fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
