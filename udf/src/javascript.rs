//! `language: javascript`, run by QuickJS (rquickjs) with Beam YAML's semantics (Beam runs them
//! with js2py):
//! - `expression:` — the row's fields are variables: those whose names occur in the text, as
//!   Beam binds them; a plain string naming a field is that field;
//! - `callable:` — a function taking the row (an object of its fields);
//! - `path:` + `name:` — the function `name` defined in a `.js` file (read once, by the process
//!   that plans the job; see `super::inline_files`).
//!
//! A UDF is compiled once per thread: a QuickJS runtime is not `Send`, so each thread that runs
//! bundles keeps one (thread-local), with the functions it compiled, by program. A batch is
//! converted and called row by row inside that runtime, in one `Context::with`.
//!
//! A UDF compiles to a DataFusion `PhysicalExpr` over its argument columns, so that everything
//! that handles compiled expressions (ops, Combine values, projection pushdown) handles it.
use super::values::{Builder, Helpers, Output, Reader, Shape, declared_type, sample_column};
use crate::call::UdfExpr;
use crate::expr::{Compiled, ExprCompiler};
use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use riverbank_pipeline::config::Expr;
use rquickjs::function::Args;
use rquickjs::{CatchResultExt, CaughtError, Context, Ctx, Function, Persistent, Runtime, Value};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::Role;
use crate::{Kind, what};

/// Rows of sample data a UDF is tried on to infer its output type.
const SAMPLE_ROWS: usize = 4;

/// How the function a UDF compiles to is made: it takes the argument columns positionally.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Program {
    kind: Kind,
    /// The user's source: the expression, the callable, or the file's text.
    source: String,
    /// Parameter names (an expression's variables) or row keys (a callable's row object), in
    /// argument order.
    names: Vec<String>,
}

impl Program {
    /// Compiles the program to its function.
    fn compile<'js>(&self, ctx: &Ctx<'js>) -> Result<Function<'js>, String> {
        let eval = |src: String, file: &str| -> Result<Value<'js>, String> {
            let mut opts = rquickjs::context::EvalOptions::default();
            opts.strict = false;
            opts.filename = Some(file.to_string());
            ctx.eval_with_options::<Value, _>(src, opts)
                .catch(ctx)
                .map_err(|e| failure(e).one_line())
        };
        let user = match &self.kind {
            Kind::Expression => {
                // On one line with the expression, so that positions in errors are its own.
                let src = format!(
                    "(function({}) {{ return ({}\n); }})",
                    self.names.join(", "),
                    self.source
                );
                return as_function(eval(src, "expression")?, "the expression");
            }
            Kind::Callable => as_function(
                eval(format!("({}\n)", self.source), "callable")?,
                "callable",
            )?,
            Kind::File { path, name } => {
                // The file runs in its own scope: two files may define the same names.
                let src = format!(
                    "(function() {{ {}\n; return typeof {name} === 'function' ? {name} : undefined; }})()",
                    self.source
                );
                as_function(eval(src, path)?, &format!("'{name}' in {path}"))?
            }
        };
        // The row object, built in JS from positional arguments: one call per row from Rust.
        let params: Vec<String> = (0..self.names.len()).map(|i| format!("a{i}")).collect();
        let keys: Vec<String> = self
            .names
            .iter()
            .zip(&params)
            .map(|(n, p)| format!("{}: {p}", serde_json::Value::from(n.as_str())))
            .collect();
        let wrap = format!(
            "(function(f) {{ return function({}) {{ return f({{{}}}); }}; }})",
            params.join(", "),
            keys.join(", ")
        );
        let wrap: Function = as_function(eval(wrap, WRAPPER)?, "wrapper")?;
        let f = wrap
            .call::<_, Value>((user,))
            .catch(ctx)
            .map_err(|e| failure(e).one_line())?;
        as_function(f, "wrapper")
    }
}

/// The file name of Riverbank's own JS, left out of stacks.
const WRAPPER: &str = "<riverbank>";

fn as_function<'js>(v: Value<'js>, what: &str) -> Result<Function<'js>, String> {
    match v.clone().into_function() {
        Some(f) => Ok(f),
        None if v.is_undefined() && what.starts_with('\'') => Err(format!("no function {what}")),
        None => Err(format!(
            "{what} is not a function (it is {})",
            v.type_name()
        )),
    }
}

// ---------------------------------------------------------------- the per-thread engine

struct Engine {
    // Field order is drop order: compiled functions before their context, the context
    // before its runtime.
    functions: RefCell<HashMap<Program, Persistent<Function<'static>>>>,
    context: Context,
    _runtime: Runtime,
}

/// Compiled functions kept per thread before the cache starts over.
const MAX_FUNCTIONS: usize = 256;

impl Engine {
    fn new() -> Result<Engine, String> {
        let runtime = Runtime::new().map_err(|e| e.to_string())?;
        // A runaway UDF fails its record instead of the worker (and the thread's stack).
        runtime.set_memory_limit(1 << 30);
        runtime.set_max_stack_size(512 * 1024);
        // A UDF stuck on one record (an endless loop) fails that record instead of holding its
        // slot forever. QuickJS asks every few thousand steps; a new record resets the clock.
        let (mut seen, mut since) = (u64::MAX, Instant::now());
        runtime.set_interrupt_handler(Some(Box::new(move || {
            let record = RECORDS.with(Cell::get);
            if record != seen {
                (seen, since) = (record, Instant::now());
                return false;
            }
            since.elapsed() > record_time_limit()
        })));
        let context = Context::full(&runtime).map_err(|e| e.to_string())?;
        Ok(Engine {
            functions: RefCell::new(HashMap::new()),
            context,
            _runtime: runtime,
        })
    }

    /// The program's function in this thread's runtime, compiled on first use.
    fn function<'js>(&self, ctx: &Ctx<'js>, p: &Program) -> Result<Function<'js>, String> {
        if let Some(f) = self.functions.borrow().get(p) {
            return f.clone().restore(ctx).map_err(|e| e.to_string());
        }
        let f = p.compile(ctx)?;
        let mut functions = self.functions.borrow_mut();
        if functions.len() >= MAX_FUNCTIONS {
            functions.clear();
        }
        functions.insert(p.clone(), Persistent::save(ctx, f.clone()));
        Ok(f)
    }
}

thread_local! {
    static ENGINE: RefCell<Option<Engine>> = const { RefCell::new(None) };
    /// Counts the calls into JS on this thread, for the interrupt handler.
    static RECORDS: Cell<u64> = const { Cell::new(0) };
}

/// How long a UDF may run on one record.
static RECORD_TIME_LIMIT_MS: AtomicU64 = AtomicU64::new(60_000);

fn record_time_limit() -> Duration {
    Duration::from_millis(RECORD_TIME_LIMIT_MS.load(Ordering::Relaxed))
}

/// Runs `f` in this thread's JavaScript engine (created on first use).
fn with_engine<R>(
    f: impl for<'js> FnOnce(&Engine, Ctx<'js>) -> Result<R, UdfError>,
) -> Result<R, UdfError> {
    ENGINE.with(|cell| {
        if cell.borrow().is_none() {
            let engine = Engine::new().map_err(UdfError::plain)?;
            *cell.borrow_mut() = Some(engine);
        }
        let guard = cell.borrow();
        let engine = guard.as_ref().expect("created above");
        engine.context.with(|ctx| f(engine, ctx))
    })
}

// ---------------------------------------------------------------- failures

/// A record's failure in a UDF: Beam's message and, for an exception, the JS stack.
#[derive(Debug, Clone)]
pub struct UdfError {
    pub message: String,
    pub stack: Option<String>,
}

impl UdfError {
    fn plain(message: impl Into<String>) -> UdfError {
        UdfError {
            message: message.into(),
            stack: None,
        }
    }

    /// The message and where it happened (for errors found when compiling).
    fn one_line(&self) -> String {
        let at = self
            .stack
            .as_deref()
            .and_then(|s| s.lines().next())
            .map(|l| format!(" ({})", l.trim()))
            .unwrap_or_default();
        format!("{}{at}", self.message)
    }
}

impl fmt::Display for UdfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(s) = &self.stack {
            write!(f, "{}{s}", super::STACK)?;
        }
        Ok(())
    }
}

impl std::error::Error for UdfError {}

/// What was thrown: `Name: message` and the stack of an `Error`, the value of anything else.
fn failure(e: CaughtError<'_>) -> UdfError {
    match e {
        CaughtError::Exception(ex) => {
            let name: Option<String> = ex.as_object().get("name").ok();
            let message = ex.message().unwrap_or_default();
            let message = match name {
                Some(n) if !n.is_empty() => format!("{n}: {message}"),
                _ => message,
            };
            let stack = ex.stack().map(|s| {
                s.lines()
                    .filter(|l| !l.contains(WRAPPER))
                    .collect::<Vec<_>>()
                    .join("\n")
            });
            UdfError {
                message,
                stack: stack.filter(|s| !s.trim().is_empty()),
            }
        }
        CaughtError::Value(v) => UdfError::plain(format!(
            "uncaught {}",
            v.get::<rquickjs::convert::Coerced<String>>()
                .map(|s| s.0)
                .unwrap_or_else(|_| v.type_name().to_string())
        )),
        CaughtError::Error(e) => UdfError::plain(e.to_string()),
    }
}

// ---------------------------------------------------------------- compiling a UDF

/// Compiles a javascript UDF against `schema`. Syntax errors, missing functions and output
/// types that cannot be told are reported here, before anything runs.
pub fn compile(
    ec: &ExprCompiler,
    e: &Expr,
    schema: &SchemaRef,
    role: Role,
) -> Result<Compiled, String> {
    if let Some(field) = crate::plain_field(ec, e, schema, role) {
        return field;
    }
    let (kind, source, text) = crate::source_of(e)?;
    let label = what(e);
    // The arguments: an expression's variables, or every field of the row.
    let fields: Vec<usize> = (0..schema.fields().len())
        .filter(|&i| match kind {
            Kind::Expression => {
                let n = schema.field(i).name();
                is_variable(n) && source.contains(n.as_str())
            }
            _ => true,
        })
        .collect();
    let program = Program {
        kind,
        source,
        names: fields
            .iter()
            .map(|&i| schema.field(i).name().clone())
            .collect(),
    };
    let args: Vec<Arc<dyn PhysicalExpr>> = fields
        .iter()
        .map(|&i| Arc::new(Column::new(schema.field(i).name(), i)) as Arc<dyn PhysicalExpr>)
        .collect();
    // Each argument must be convertible; then the program must compile.
    let readers = fields
        .iter()
        .map(|&i| {
            let f = schema.field(i);
            Reader::new(&arrow::array::new_empty_array(f.data_type()))
                .map(|_| ())
                .map_err(|m| format!("field '{}': {m}", f.name()))
        })
        .collect::<Result<Vec<()>, String>>();
    readers?;
    with_engine(|engine, ctx| {
        engine
            .function(&ctx, &program)
            .map(|_| ())
            .map_err(UdfError::plain)
    })
    .map_err(|m| format!("cannot compile javascript {}: {}", what(e), m.message))?;
    let output = match role {
        Role::Predicate => Output::Predicate,
        Role::Name => Output::Name,
        Role::Value | Role::Timestamp => match &e.output_type {
            Some(t) => Output::Value {
                data_type: declared_type(t)?,
                declared: true,
            },
            None if crate::reads_any(role, schema, &fields) => Output::Value {
                data_type: riverbank_elements::any::data_type(),
                declared: false,
            },
            None => Output::Value {
                data_type: match infer(&program, schema, &fields) {
                    Ok(t) => t,
                    // The sample rows tell nothing (they all fail, or give null): Beam types
                    // the field `Any` and runs, and so does Riverbank (a timestamp stays one).
                    Err(Untold::Samples(m)) => {
                        tracing::info!("javascript {}: {m}; typed Any", what(e));
                        if role == Role::Timestamp {
                            riverbank_elements::columns::ts_type()
                        } else {
                            riverbank_elements::any::data_type()
                        }
                    }
                    Err(Untold::Other(m)) => {
                        return Err(format!(
                            "cannot tell the output type of javascript {}: {m}; give it an \
                             output_type",
                            what(e)
                        ));
                    }
                },
                declared: false,
            },
        },
    };
    let data_type = output.data_type();
    Ok(Compiled {
        text,
        expr: Arc::new(JsExpr {
            program,
            label,
            args,
            output,
        }),
        data_type,
    })
}

/// A field name usable as a JS variable (others are reached through a callable's row).
fn is_variable(n: &str) -> bool {
    const RESERVED: &[&str] = &[
        "arguments",
        "await",
        "break",
        "case",
        "catch",
        "class",
        "const",
        "continue",
        "debugger",
        "default",
        "delete",
        "do",
        "else",
        "enum",
        "eval",
        "export",
        "extends",
        "false",
        "finally",
        "for",
        "function",
        "if",
        "implements",
        "import",
        "in",
        "instanceof",
        "interface",
        "let",
        "new",
        "null",
        "package",
        "private",
        "protected",
        "public",
        "return",
        "static",
        "super",
        "switch",
        "this",
        "throw",
        "true",
        "try",
        "typeof",
        "undefined",
        "var",
        "void",
        "while",
        "with",
        "yield",
    ];
    let mut chars = n.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        && !RESERVED.contains(&n)
}

/// Why no output type could be inferred.
enum Untold {
    /// The sample rows failed or gave only null (Beam's `Any`).
    Samples(String),
    /// Anything else (the program does not load, a result with no column type).
    Other(String),
}

/// The output type, from the results on sample rows of the input's types.
fn infer(program: &Program, schema: &Schema, fields: &[usize]) -> Result<DataType, Untold> {
    let columns: Vec<ArrayRef> = fields
        .iter()
        .enumerate()
        .map(|(k, &i)| sample_column(schema.field(i).data_type(), SAMPLE_ROWS, k))
        .collect();
    let (shape, first_error) = with_engine(|engine, ctx| {
        let f = engine.function(&ctx, program).map_err(UdfError::plain)?;
        let h = Helpers::new(&ctx).map_err(|e| UdfError::plain(e.to_string()))?;
        let readers = readers(&columns)?;
        let (mut shape, mut first_error) = (Shape::Unknown, None);
        for row in 0..SAMPLE_ROWS {
            match call(&ctx, &f, &h, &readers, row) {
                Ok(v) => shape = shape.union(Shape::of(&v, &h).map_err(UdfError::plain)?),
                Err(e) => {
                    first_error.get_or_insert(e.message);
                }
            }
        }
        Ok((shape, first_error))
    })
    .map_err(|e| Untold::Other(e.message))?;
    match (shape, first_error) {
        (Shape::Unknown, Some(e)) => {
            Err(Untold::Samples(format!("it failed on sample rows ({e})")))
        }
        (Shape::Unknown, None) => Err(Untold::Samples(
            "it returns only null or undefined on sample rows".into(),
        )),
        (s, _) => s.data_type().map_err(Untold::Other),
    }
}

fn readers(columns: &[ArrayRef]) -> Result<Vec<Reader>, UdfError> {
    columns
        .iter()
        .map(|c| Reader::new(c).map_err(UdfError::plain))
        .collect()
}

/// Calls the function on row `row` of the argument columns.
fn call<'js>(
    ctx: &Ctx<'js>,
    f: &Function<'js>,
    h: &Helpers<'js>,
    readers: &[Reader],
    row: usize,
) -> Result<Value<'js>, UdfError> {
    let mut args = Args::new(ctx.clone(), readers.len());
    for r in readers {
        let v = r.value(ctx, h, row).catch(ctx).map_err(failure)?;
        args.push_arg(v)
            .map_err(|e| UdfError::plain(e.to_string()))?;
    }
    RECORDS.with(|r| r.set(r.get().wrapping_add(1)));
    f.call_arg::<Value>(args).catch(ctx).map_err(|e| {
        let mut e = failure(e);
        if e.message == "InternalError: interrupted" {
            e.message = format!(
                "ran for more than {} s on one record",
                record_time_limit().as_secs_f64()
            );
        }
        e.message = format!("Error evaluating javascript expression: {}", e.message);
        e
    })
}

// ---------------------------------------------------------------- the expression

/// A javascript UDF as a DataFusion expression over its argument columns.
pub(crate) type JsExpr = UdfExpr<Program>;

impl crate::call::Program for Program {
    const LANGUAGE: &'static str = "javascript";
    type Error = UdfError;

    fn run(
        &self,
        output: &Output,
        label: &str,
        columns: &[ArrayRef],
        rows: usize,
    ) -> Result<ArrayRef, UdfError> {
        with_engine(|engine, ctx| {
            let f = engine.function(&ctx, self).map_err(UdfError::plain)?;
            let h = Helpers::new(&ctx).map_err(|e| UdfError::plain(e.to_string()))?;
            let readers = readers(columns)?;
            let mut out = Builder::new(output, rows).map_err(UdfError::plain)?;
            for row in 0..rows {
                let v = call(&ctx, &f, &h, &readers, row)?;
                out.push(&v, &h).map_err(|m| {
                    let hint = match output {
                        Output::Value {
                            declared: false, ..
                        } => " (the type its results on sample rows have; give an output_type to change it)",
                        _ => "",
                    };
                    UdfError::plain(format!("javascript {} {m}{hint}", label))
                })?;
            }
            Ok(out.finish())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, Float64Array, Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{Field, Float64Type, Int64Type};
    use riverbank_pipeline::config::{Language, UdfForm};

    fn batch(rows: usize) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Float64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(0..rows as i64)),
                Arc::new(Float64Array::from_iter_values(
                    (0..rows).map(|i| i as f64 * 0.5),
                )),
                Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|i| format!("s{}", i % 100)),
                )),
            ],
        )
        .unwrap()
    }

    fn js(text: &str) -> Expr {
        Expr::new(Language::Javascript, text)
    }

    #[test]
    fn an_expression_binds_the_fields_it_names_and_types_its_results() {
        let b = batch(4);
        let ec = ExprCompiler::new();
        let c = ec.compile(&js("a * 2 + 1"), &b.schema()).unwrap();
        assert_eq!(c.data_type, DataType::Int64);
        let JsExpr { program, args, .. } = c.expr.downcast_ref::<JsExpr>().unwrap();
        assert_eq!(program.names, ["a"], "only the fields the text names");
        assert_eq!(args.len(), 1);
        let out = c.eval(&b).unwrap();
        assert_eq!(out.as_primitive::<Int64Type>().values(), &[1, 3, 5, 7]);

        let c = ec.compile(&js("b + a"), &b.schema()).unwrap();
        assert_eq!(c.data_type, DataType::Float64, "fractional on sample rows");
        let out = c.eval(&b).unwrap();
        assert_eq!(
            out.as_primitive::<Float64Type>().values(),
            &[0.0, 1.5, 3.0, 4.5]
        );

        let c = ec.compile(&js("s + '!'"), &b.schema()).unwrap();
        assert_eq!(c.eval(&b).unwrap().as_string::<i32>().value(3), "s3!");
        // A plain field name is the field itself, typed as it is.
        let c = ec.compile(&js("a"), &b.schema()).unwrap();
        assert!(c.expr.downcast_ref::<JsExpr>().is_none());
    }

    #[test]
    fn sample_rows_differ_per_column_so_quotients_are_doubles() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("x", DataType::Int32, true),
            Field::new("y", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let ec = ExprCompiler::new();
        let ty = |text: &str| ec.compile(&js(text), &schema).unwrap().data_type;
        assert_eq!(ty("x / y"), DataType::Float64);
        assert_eq!(ty("x * y - 1"), DataType::Int64);
        assert_eq!(ty("parseInt(s)"), DataType::Int64, "NaN says nothing");
        assert_eq!(ty("parseFloat(s)"), DataType::Float64);
        assert_eq!(ty("s.split(',')"), DataType::new_list(DataType::Utf8, true));
        assert_eq!(
            ty("({n: x, tags: [s], when: new Date(0)})"),
            DataType::Struct(
                vec![
                    Field::new("n", DataType::Int64, true),
                    Field::new("tags", DataType::new_list(DataType::Utf8, true), true),
                    Field::new("when", riverbank_elements::columns::ts_type(), true),
                ]
                .into()
            )
        );
    }

    #[test]
    fn predicates_follow_beams_truthiness() {
        let b = batch(4);
        let ec = ExprCompiler::new();
        let keep = |text: &str| {
            let c = ec
                .compile_as(&js(text), &b.schema(), Role::Predicate)
                .unwrap();
            let out = c.eval(&b).unwrap();
            out.as_boolean()
                .iter()
                .map(|x| x.unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            keep("a % 2"),
            [false, true, false, true],
            "numbers: non-zero"
        );
        assert_eq!(
            keep("a > 1 ? 'x' : ''"),
            [false, false, true, true],
            "strings: non-empty"
        );
        assert_eq!(
            keep("a > 2 ? [a] : []"),
            [false, false, false, true],
            "lists: non-empty"
        );
        assert_eq!(
            keep("a ? null : undefined"),
            [false; 4],
            "null and undefined"
        );
        assert_eq!(keep("NaN"), [true; 4], "NaN is a true float in Python");
    }

    #[test]
    fn a_record_failure_carries_message_and_stack() {
        let b = batch(3);
        let ec = ExprCompiler::new();
        let c = ec
            .compile(
                &Expr {
                    form: UdfForm::Callable,
                    ..js("function (row) {\n  if (row.a == 2) throw new TypeError('two');\n  return row.a;\n}")
                },
                &b.schema(),
            )
            .unwrap();
        let e = c.eval(&b).unwrap_err();
        let (msg, stack) = super::super::split_stack(&e);
        assert_eq!(
            msg,
            "Error evaluating javascript expression: TypeError: two"
        );
        assert!(stack.is_some_and(|s| s.contains("callable:2:")), "{e}");
    }

    #[test]
    fn a_udf_stuck_on_a_record_fails_it() {
        let b = batch(2);
        let ec = ExprCompiler::new();
        let c = ec
            .compile_as(
                &js("a == 1 ? (function () { while (true) {} })() : true"),
                &b.schema(),
                Role::Predicate,
            )
            .unwrap();
        RECORD_TIME_LIMIT_MS.store(200, Ordering::Relaxed);
        let e = c.eval(&b).unwrap_err();
        RECORD_TIME_LIMIT_MS.store(60_000, Ordering::Relaxed);
        assert!(
            e.starts_with(
                "Error evaluating javascript expression: ran for more than 0.2 s on one record"
            ),
            "{e}"
        );
        // The runtime is still usable afterwards.
        assert_eq!(c.eval(&b.slice(0, 1)).unwrap().len(), 1);
    }

    /// The figure the README quotes: `cargo test --release -p riverbank-udf --lib
    /// throughput -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn throughput_of_a_simple_expression_on_a_million_rows() {
        let rows = 1_000_000;
        let b = batch(rows);
        let ec = ExprCompiler::new();
        for (text, form) in [
            ("a * 2 + b", UdfForm::Expression),
            ("s.toUpperCase()", UdfForm::Expression),
            (
                "function (row) { return row.a + row.b; }",
                UdfForm::Callable,
            ),
        ] {
            let c = ec.compile(&Expr { form, ..js(text) }, &b.schema()).unwrap();
            c.eval(&b.slice(0, 10)).unwrap();
            let t = Instant::now();
            let out = c.eval(&b).unwrap();
            let secs = t.elapsed().as_secs_f64();
            assert_eq!(out.len(), rows);
            println!("{text:45} {:>10.0} rows/s", rows as f64 / secs);
        }
        // One runtime per bundle instead of per thread: what creating and compiling costs.
        let p = Program {
            kind: Kind::Expression,
            source: "a * 2 + b".into(),
            names: vec!["a".into(), "b".into()],
        };
        let t = Instant::now();
        for _ in 0..100 {
            let engine = Engine::new().unwrap();
            engine
                .context
                .with(|ctx| engine.function(&ctx, &p).map(|_| ()).unwrap());
        }
        println!(
            "a fresh runtime + compile: {:.0} µs",
            t.elapsed().as_secs_f64() * 1e4
        );
        let t = Instant::now();
        for _ in 0..100 {
            with_engine(|engine, ctx| {
                engine
                    .function(&ctx, &p)
                    .map(|_| ())
                    .map_err(UdfError::plain)
            })
            .unwrap();
        }
        println!(
            "the thread's cached function: {:.1} µs",
            t.elapsed().as_secs_f64() * 1e4
        );
    }
}
