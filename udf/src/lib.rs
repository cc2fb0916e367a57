//! Riverbank's expression languages, each compiled to a DataFusion `PhysicalExpr` on Arrow
//! arrays: `sql` and `generic` (`expr`, `generic`), and the UDF languages `javascript`
//! (`javascript.rs`, on QuickJS), with the Arrow ⇄ JS conversions and output types in
//! `values.rs`, and `python` (`python/`, embedded CPython, behind the `python` feature). A new
//! language is a module here and an arm in `compile`.
//!
//! A UDF compiles to a `Compiled` expression like any other, so the ops that evaluate
//! expressions need not know the language. Two things differ and are handled here: what the
//! transform wants of the result (`Role`), and a record's failure, which carries the UDF's
//! stack for the `stack` field of error outputs.
mod call;
pub mod expr;
pub mod generic;
mod javascript;
#[cfg(feature = "python")]
pub mod python;
mod values;

pub use javascript::UdfError;

use crate::expr::{Compiled, ExprCompiler};
use arrow::datatypes::SchemaRef;
use datafusion::error::DataFusionError;
use riverbank_pipeline::Plan;
use riverbank_pipeline::config::{Expr, Language, TransformConfig, UdfForm};

/// A custom combine fn (`language: python`): its source (a dotted name such as
/// `apache_beam.transforms.combiners.TopCombineFn`, or code defining it), its keyword arguments
/// (`fn.config`, as JSON) and its output type (from its output on sample values). Its state is
/// one Binary column: each group's accumulator, pickled.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CustomFn {
    pub source: String,
    pub config: Option<String>,
    pub output_type: arrow::datatypes::DataType,
}

/// What a transform makes of a UDF's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A value (MapToFields fields, Combine values): its type is the `output_type`, or
    /// inferred.
    Value,
    /// AssignTimestamps' timestamp: a value whose type, when the sample rows tell nothing
    /// (Beam's `Any`), is the timestamp type.
    Timestamp,
    /// Filter's `keep`: any result, taken for its truthiness as Beam does.
    Predicate,
    /// Partition's `by`: an output's name.
    Name,
}

/// Whether a UDF reading `fields` of `schema` as a value gives Beam's `Any` without a look at
/// sample rows: it reads an `Any` field, and Beam's type inference gives `Any` for that.
pub(crate) fn reads_any(role: Role, schema: &arrow::datatypes::Schema, fields: &[usize]) -> bool {
    role == Role::Value
        && fields
            .iter()
            .any(|&i| riverbank_elements::any::is_any(schema.field(i).data_type()))
}

/// What a UDF's program is made from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub(crate) enum Kind {
    Expression,
    Callable,
    File { path: String, name: String },
}

/// A UDF's kind, its source (a `path:` file read) and the text messages show of it.
pub(crate) fn source_of(e: &Expr) -> Result<(Kind, String, String), String> {
    Ok(match &e.form {
        UdfForm::Expression => (Kind::Expression, e.text.clone(), e.text.clone()),
        UdfForm::Callable => (Kind::Callable, e.text.clone(), first_line(&e.text)),
        UdfForm::File { path, source } => (
            Kind::File {
                path: path.clone(),
                name: e.text.clone(),
            },
            match source {
                Some(s) => s.clone(),
                None => std::fs::read_to_string(path)
                    .map_err(|err| format!("cannot read {path}: {err}"))?,
            },
            format!("{} in {path}", e.text),
        ),
    })
}

/// As Beam: a plain string naming an input field is that field (for a predicate, a boolean
/// one), whatever the language.
pub(crate) fn plain_field(
    ec: &ExprCompiler,
    e: &Expr,
    schema: &SchemaRef,
    role: Role,
) -> Option<Result<Compiled, String>> {
    let f = schema.field_with_name(e.text.trim()).ok()?;
    (e.form == UdfForm::Expression
        && e.output_type.is_none()
        && (role != Role::Predicate || f.data_type() == &arrow::datatypes::DataType::Boolean))
        .then(|| ec.compile(&Expr::new(Language::Generic, f.name().as_str()), schema))
}

/// How messages name a UDF.
pub(crate) fn what(e: &Expr) -> String {
    match &e.form {
        UdfForm::Expression => format!("expression '{}'", e.text),
        UdfForm::Callable => format!("callable '{}'", first_line(&e.text)),
        UdfForm::File { path, .. } => format!("function '{}' of {path}", e.text),
    }
}

/// A callable's first line, enough to recognize it.
pub(crate) fn first_line(source: &str) -> String {
    let source = source.trim();
    match source.split_once('\n') {
        Some((first, _)) => format!("{}…", first.trim_end()),
        None => source.to_string(),
    }
}

/// Compiles a UDF of a language other than `generic` and `sql`.
pub fn compile(
    ec: &ExprCompiler,
    e: &Expr,
    schema: &SchemaRef,
    role: Role,
) -> Result<Compiled, String> {
    match e.language {
        Language::Javascript => javascript::compile(ec, e, schema, role),
        #[cfg(feature = "python")]
        Language::Python => python::compile(ec, e, schema, role),
        #[cfg(not(feature = "python"))]
        Language::Python => Err(format!(
            "cannot compile python {}: this riverbank was built without Python (the `python` feature)",
            e.text
        )),
        other => Err(format!("{other:?} is not a UDF language")),
    }
}

/// Separates a failure's message from the UDF's stack in its text.
pub const STACK: &str = "\nJavaScript stack:\n";
/// The same for a Python UDF's traceback.
pub const TRACEBACK: &str = "\nPython traceback:\n";

/// The text of a record's failure in a UDF (message, then the stack), if `e` is one.
pub fn record_error(e: &DataFusionError) -> Option<String> {
    match e {
        DataFusionError::External(x) => {
            #[cfg(feature = "python")]
            if let Some(u) = x.downcast_ref::<python::PyUdfError>() {
                return Some(u.to_string());
            }
            x.downcast_ref::<UdfError>().map(|u| u.to_string())
        }
        _ => None,
    }
}

/// A failure's message and the UDF's stack, when the failure has one.
pub fn split_stack(message: &str) -> (&str, Option<&str>) {
    match message
        .split_once(STACK)
        .or_else(|| message.split_once(TRACEBACK))
    {
        Some((m, s)) => (m, Some(s)),
        None => (message, None),
    }
}

/// Reads the files of `path:` UDFs into the plan, so that the plan shipped to workers carries
/// them and only the process that plans the job needs the files. A file that cannot be read is
/// left out: compiling the UDF reports it, with the other issues.
pub fn inline_files(mut plan: Plan) -> Plan {
    for t in plan.graph.transforms.iter_mut() {
        for e in exprs_mut(&mut t.config) {
            if let UdfForm::File { path, source } = &mut e.form
                && source.is_none()
            {
                *source = std::fs::read_to_string(&*path).ok();
            }
        }
    }
    plan
}

/// Installs (or finds installed) the venv of the plan's python `dependencies:` — one per job,
/// their union — and puts it on the interpreter's path. Errors name the transforms that declare
/// them and say why the install failed.
pub fn prepare_dependencies(plan: &Plan) -> Result<(), riverbank_pipeline::error::Issue> {
    let declaring: Vec<&str> = plan
        .graph
        .transforms
        .iter()
        .filter(|t| !t.dependencies.is_empty())
        .map(|t| t.name.as_str())
        .collect();
    let Some(first) = declaring.first() else {
        return Ok(());
    };
    let reqs: Vec<String> = plan
        .graph
        .transforms
        .iter()
        .flat_map(|t| t.dependencies.iter().cloned())
        .collect();
    #[cfg(feature = "python")]
    let result = python::env::prepare(&reqs).map(|_| ());
    #[cfg(not(feature = "python"))]
    let result: Result<(), String> = Err(format!(
        "python dependencies [{}]: this riverbank was built without Python (the `python` feature)",
        reqs.join(", ")
    ));
    result.map_err(|m| {
        let also = if declaring.len() > 1 {
            format!(" (dependencies of {})", declaring.join(", "))
        } else {
            String::new()
        };
        riverbank_pipeline::error::Issue::field(first, "dependencies", format!("{m}{also}"))
    })
}

/// Whether any UDF of the plan is written in `language`.
pub fn uses(plan: &Plan, language: Language) -> bool {
    let mut plan = plan.clone();
    plan.graph.transforms.iter_mut().any(|t| {
        exprs_mut(&mut t.config)
            .iter()
            .any(|e| e.language == language)
    })
}

/// The expressions of a transform's config.
fn exprs_mut(config: &mut TransformConfig) -> Vec<&mut Expr> {
    match config {
        TransformConfig::MapToFields { fields, .. } => fields.iter_mut().map(|(_, e)| e).collect(),
        TransformConfig::Filter { keep } => vec![keep],
        TransformConfig::Partition { by, .. } => vec![by],
        TransformConfig::AssignTimestamps { timestamp } => vec![timestamp],
        TransformConfig::Combine { aggregates, .. } => aggregates
            .iter_mut()
            .filter_map(|a| a.value.as_mut())
            .collect(),
        _ => vec![],
    }
}
