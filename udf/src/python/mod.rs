//! `language: python`, run by CPython embedded through PyO3, with Beam YAML's semantics:
//! - `expression:` — the row's fields are variables (those whose names occur in the text, as
//!   Beam binds them); a plain string naming a field is that field;
//! - `callable:` — a lambda or a `def` taking the row (a `Row`: fields as attributes);
//! - `path:` + `name:` — the function `name` of a `.py` file (inlined into the plan by the
//!   process that plans the job; see `super::inline_files`).
//!
//! Two paths (`riverbank plan` shows which each UDF took):
//! - an expression that means the same in SQL is translated (`runtime.py`'s `to_sql`, by
//!   Python's own `ast`) and runs vectorized in DataFusion (`Translated`); batches where Python
//!   could differ (a null or NaN in an argument, or an error) run in Python instead, so results
//!   and failures stay Python's;
//! - the rest runs in Python a batch at a time (`PyExpr`): Arrow → Python objects → one call
//!   into the interpreter per batch → Arrow. Beyond the first slot, batches go to `riverbank
//!   udf-host` processes (`hosts`), so the GIL does not hold a worker to one core.
pub mod combine;
mod convert;
pub mod env;
pub mod hosts;

use crate::call::{UdfExpr, arg_columns};
use crate::expr::{Compiled, ExprCompiler};
use crate::values::{Output, declared_type, sample_column};
use crate::{Kind, Role, what};
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Schema, SchemaRef};
use convert::Helpers;
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyModule, PyTuple};
use riverbank_pipeline::config::{Expr, Language};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// Rows of sample data a UDF is tried on to infer its output type.
const SAMPLE_ROWS: usize = 4;

/// How the function a UDF compiles to is made: it takes the argument columns positionally.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Program {
    kind: Kind,
    /// The user's source: the expression, the callable, or the file's text.
    source: String,
    /// Parameter names (an expression's variables) or the row's fields (a callable's `Row`),
    /// in argument order.
    names: Vec<String>,
    /// The job's venv `site-packages` (its `dependencies:`), put on `sys.path` first: a UDF
    /// host learns them from the program it is sent.
    #[serde(default)]
    site: Vec<String>,
}

// ---------------------------------------------------------------- the interpreter

/// Where the interpreter PyO3 was built against keeps its standard library (build.rs).
const STDLIB: &str = env!("RIVERBANK_PYTHON_STDLIB");

/// Whether an interpreter can start here: without its standard library, CPython would abort
/// the process when it starts, so this is checked first, with a message saying what is missing.
pub fn available() -> Result<(), String> {
    static CHECKED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let stdlib = std::path::Path::new(STDLIB);
            // PYTHONHOME moves the whole installation: its lib/python3.X.
            let stdlib = match (std::env::var_os("PYTHONHOME"), stdlib.file_name()) {
                (Some(home), Some(version)) => std::path::Path::new(&home).join("lib").join(version),
                _ => stdlib.to_path_buf(),
            };
            if stdlib.join("os.py").is_file() {
                Ok(())
            } else {
                Err(format!(
                    "language: python needs the Python {} standard library, not found at {} (install that Python, or set PYTHONHOME to where it is)",
                    STDLIB.rsplit("python").next().unwrap_or("3"),
                    stdlib.display()
                ))
            }
        })
        .clone()
}

/// `runtime.py`, loaded once per process.
fn runtime(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    static MODULE: Mutex<Option<Py<PyModule>>> = Mutex::new(None);
    if let Some(m) = MODULE.lock().expect("not poisoned").as_ref() {
        return Ok(m.bind(py).clone());
    }
    // Not under the lock: running Python code may let another thread take the GIL.
    let m = PyModule::from_code(
        py,
        c"import sys\nsys.dont_write_bytecode = True\n",
        c"<riverbank-init>",
        c"_riverbank_init",
    )
    .and_then(|_| {
        PyModule::from_code(
            py,
            &std::ffi::CString::new(include_str!("runtime.py")).expect("no NUL in runtime.py"),
            c"<riverbank>",
            c"riverbank_udf",
        )
    })?;
    *MODULE.lock().expect("not poisoned") = Some(m.clone().unbind());
    Ok(m)
}

fn helpers<'py>(rt: &Bound<'py, PyModule>) -> PyResult<Helpers<'py>> {
    Ok(Helpers {
        row: rt.getattr("Row")?,
        timestamp: rt.getattr("Timestamp")?,
        micros: rt.getattr("micros")?,
        any_value: rt.getattr("any_value")?,
        any_text: rt.getattr("any_text")?,
    })
}

/// Functions compiled in this process, by program.
static FUNCTIONS: Mutex<Option<HashMap<Program, Py<PyAny>>>> = Mutex::new(None);
/// Compiled functions kept before the cache starts over.
const MAX_FUNCTIONS: usize = 256;

impl Program {
    /// The program's function in this process's interpreter, compiled on first use.
    fn function<'py>(
        &self,
        py: Python<'py>,
        rt: &Bound<'py, PyModule>,
    ) -> Result<Bound<'py, PyAny>, PyUdfError> {
        if let Some(f) = FUNCTIONS
            .lock()
            .expect("not poisoned")
            .as_ref()
            .and_then(|m| m.get(self))
        {
            return Ok(f.bind(py).clone());
        }
        env::add_to_path(&self.site).map_err(PyUdfError::plain)?;
        let (kind, path, name) = match &self.kind {
            Kind::Expression => ("expression", "", ""),
            Kind::Callable => ("callable", "", ""),
            Kind::File { path, name } => ("file", path.as_str(), name.as_str()),
        };
        let f = rt
            .getattr("compile_udf")
            .and_then(|c| c.call1((kind, &self.source, self.names.clone(), path, name)))
            .map_err(|e| PyUdfError::from_py(py, e))?;
        let mut guard = FUNCTIONS.lock().expect("not poisoned");
        let map = guard.get_or_insert_with(HashMap::new);
        if map.len() >= MAX_FUNCTIONS {
            map.clear();
        }
        map.insert(self.clone(), f.clone().unbind());
        Ok(f)
    }
}

/// Runs a program on argument columns in this process's interpreter, the GIL taken once.
pub fn run_local(
    program: &Program,
    output: &Output,
    label: &str,
    columns: &[ArrayRef],
    rows: usize,
) -> Result<ArrayRef, PyUdfError> {
    available().map_err(PyUdfError::plain)?;
    Python::attach(|py| {
        let rt = runtime(py).map_err(|e| PyUdfError::from_py(py, e))?;
        let f = program.function(py, &rt)?;
        let h = helpers(&rt).map_err(|e| PyUdfError::from_py(py, e))?;
        let results = call_batch(py, &rt, &h, &f, columns, rows)?;
        convert::from_py(&h, &results, output).map_err(|m| {
            let hint = match output {
                Output::Value {
                    declared: false, ..
                } => {
                    " (the type its results on sample rows have; give an output_type to change it)"
                }
                _ => "",
            };
            PyUdfError::plain(format!("python {label} {m}{hint}"))
        })
    })
}

/// The function's results on every row, or the first row's failure.
fn call_batch<'py>(
    py: Python<'py>,
    rt: &Bound<'py, PyModule>,
    h: &Helpers<'py>,
    f: &Bound<'py, PyAny>,
    columns: &[ArrayRef],
    rows: usize,
) -> Result<Vec<Bound<'py, PyAny>>, PyUdfError> {
    let lists = columns
        .iter()
        .map(|c| {
            let values = convert::to_py(py, h, c).map_err(PyUdfError::plain)?;
            PyList::new(py, values).map_err(|e| PyUdfError::from_py(py, e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let out = rt
        .getattr("run_batch")
        .and_then(|run| run.call1((f, PyList::new(py, lists)?, rows)))
        .map_err(|e| PyUdfError::from_py(py, e))?;
    let out = out
        .cast::<PyTuple>()
        .map_err(|e| PyUdfError::plain(e.to_string()))?;
    let failure = out.get_item(1).map_err(|e| PyUdfError::from_py(py, e))?;
    if !failure.is_none() {
        let (message, stack): (String, String) =
            failure.extract().map_err(|e| PyUdfError::from_py(py, e))?;
        return Err(PyUdfError {
            message,
            stack: Some(stack),
        });
    }
    let results = out.get_item(0).map_err(|e| PyUdfError::from_py(py, e))?;
    results
        .try_iter()
        .and_then(|it| it.collect::<PyResult<Vec<_>>>())
        .map_err(|e| PyUdfError::from_py(py, e))
}

// ---------------------------------------------------------------- failures

/// A record's failure in a Python UDF: the exception (`Type: message`) and its traceback.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PyUdfError {
    pub message: String,
    pub stack: Option<String>,
}

impl PyUdfError {
    pub fn plain(message: impl Into<String>) -> PyUdfError {
        PyUdfError {
            message: message.into(),
            stack: None,
        }
    }

    fn from_py(py: Python<'_>, e: PyErr) -> PyUdfError {
        let tb = e
            .traceback(py)
            .and_then(|t| t.format().ok())
            .filter(|t| !t.trim().is_empty());
        PyUdfError {
            message: e.to_string(),
            stack: tb,
        }
    }
}

impl fmt::Display for PyUdfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(s) = &self.stack {
            write!(f, "{}{s}", super::TRACEBACK)?;
        }
        Ok(())
    }
}

impl std::error::Error for PyUdfError {}

// ---------------------------------------------------------------- compiling a UDF

/// Compiles a python UDF against `schema`. Syntax errors, missing functions and output types
/// that cannot be told are reported here, before anything runs.
pub fn compile(
    ec: &ExprCompiler,
    e: &Expr,
    schema: &SchemaRef,
    role: Role,
) -> Result<Compiled, String> {
    if let Some(field) = crate::plain_field(ec, e, schema, role) {
        return field;
    }
    available()?;
    let label = what(e);
    let (kind, source, text) = crate::source_of(e)?;
    // The arguments: an expression's variables, or the fields a callable reads of its row
    // (every field, unless it only reads `row.<field>`).
    let visible: Vec<usize> = (0..schema.fields().len())
        .filter(|&i| !riverbank_elements::columns::is_hidden(schema.field(i).name()))
        .collect();
    let fields: Vec<usize> = match &kind {
        Kind::Expression => visible
            .into_iter()
            .filter(|&i| {
                let n = schema.field(i).name();
                is_variable(n) && source.contains(n.as_str())
            })
            .collect(),
        Kind::Callable | Kind::File { .. } => {
            let names: Vec<String> = visible
                .iter()
                .map(|&i| schema.field(i).name().clone())
                .collect();
            let (k, name) = match &kind {
                Kind::File { name, .. } => ("file", name.as_str()),
                _ => ("callable", ""),
            };
            let read: Option<Vec<String>> = Python::attach(|py| -> PyResult<_> {
                runtime(py)?
                    .getattr("row_fields")?
                    .call1((k, &source, name, names))?
                    .extract()
            })
            .map_err(|e| format!("cannot compile python {label}: {e}"))?;
            match read {
                Some(read) => visible
                    .into_iter()
                    .filter(|&i| read.contains(schema.field(i).name()))
                    .collect(),
                None => visible,
            }
        }
    };
    let program = Program {
        site: env::site_dirs(),
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
    Python::attach(|py| {
        let rt = runtime(py).map_err(|e| PyUdfError::from_py(py, e))?;
        program.function(py, &rt).map(|_| ())
    })
    .map_err(|m| format!("cannot compile python {label}: {}", one_line(&m)))?;
    let translated = match program.kind {
        Kind::Expression => translate(ec, &program, schema, &fields, role, e)?,
        _ => None,
    };
    let output = match role {
        Role::Predicate => Output::Predicate,
        Role::Name => {
            // As Beam refuses a Partition function it can type as other than a string: here
            // when the sample rows all give one non-string type (an expression that
            // translates to SQL typed as a string needs no look).
            if translated.is_none()
                && let Ok(t) = infer(&program, schema, &fields)
                && !matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Null)
                && !riverbank_elements::any::is_any(&t)
            {
                return Err(format!(
                    "a Partition function must return a string (an output's name), and python \
                     {label} returns {t} on sample rows"
                ));
            }
            Output::Name
        }
        Role::Value | Role::Timestamp => match (&e.output_type, &translated) {
            (Some(t), _) => Output::Value {
                data_type: declared_type(t)?,
                declared: true,
            },
            (None, Some(fast)) => Output::Value {
                data_type: fast.data_type.clone(),
                declared: false,
            },
            (None, None) if crate::reads_any(role, schema, &fields) => Output::Value {
                data_type: riverbank_elements::any::data_type(),
                declared: false,
            },
            (None, None) => Output::Value {
                // When the sample rows tell nothing (they all raise, or return None), Beam
                // types the field `Any` and runs; so does Riverbank, each value kept as it is
                // and rows that raise sent to the error output (or failing the job) as in Beam.
                data_type: match infer(&program, schema, &fields) {
                    Ok(t) => t,
                    Err(Untold::Samples(m)) if role == Role::Timestamp => {
                        tracing::info!(
                            "python {label}: no output type from sample rows ({m}); a timestamp"
                        );
                        riverbank_elements::columns::ts_type()
                    }
                    Err(Untold::Samples(m)) => {
                        tracing::info!(
                            "python {label}: no output type from sample rows ({m}); typed Any"
                        );
                        riverbank_elements::any::data_type()
                    }
                    Err(Untold::Other(m)) => {
                        return Err(format!(
                            "cannot tell the output type of python {label}: {m}; give it an \
                             output_type"
                        ));
                    }
                },
                declared: false,
            },
        },
    };
    let data_type = output.data_type();
    let slow = Arc::new(PyExpr {
        program,
        label,
        args,
        output,
    });
    let expr: Arc<dyn PhysicalExpr> = match translated {
        Some(fast) => Arc::new(Translated {
            sql: fast.text,
            parts: vec![fast.expr, slow],
        }),
        None => slow,
    };
    Ok(Compiled {
        text,
        expr,
        data_type,
    })
}

/// The expression's SQL form compiled to DataFusion, when it has one that means the same for
/// this role (`runtime.py`'s `to_sql` decides what translates).
fn translate(
    ec: &ExprCompiler,
    program: &Program,
    schema: &Schema,
    fields: &[usize],
    role: Role,
    e: &Expr,
) -> Result<Option<Compiled>, String> {
    let kinds: Vec<(String, &str)> = fields
        .iter()
        .filter_map(|&i| {
            let f = schema.field(i);
            let k = match f.data_type() {
                DataType::Boolean => "bool",
                DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::UInt8
                | DataType::UInt16
                | DataType::UInt32 => "int",
                DataType::Float32 | DataType::Float64 => "float",
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "str",
                _ => return None,
            };
            Some((f.name().clone(), k))
        })
        .collect();
    let sql: Option<(String, String)> = Python::attach(|py| -> PyResult<_> {
        let rt = runtime(py)?;
        let kinds = kinds.into_py_dict(py)?;
        rt.getattr("to_sql")?
            .call1((&program.source, kinds))?
            .extract()
    })
    .map_err(|e| format!("cannot translate python expression: {e}"))?;
    let Some((sql, kind)) = sql else {
        return Ok(None);
    };
    let fits = match role {
        Role::Predicate => kind == "bool",
        Role::Name => kind == "str",
        Role::Value | Role::Timestamp => true,
    };
    if !fits {
        return Ok(None);
    }
    // SQL that DataFusion refuses stays in Python: the translator is conservative, not perfect.
    let Ok(fast) = ec.compile(
        &Expr::new(Language::Sql, sql.clone()),
        &Arc::new(schema.clone()),
    ) else {
        return Ok(None);
    };
    if let Some(t) = &e.output_type
        && declared_type(t)? != fast.data_type
    {
        return Ok(None);
    }
    Ok(Some(Compiled { text: sql, ..fast }))
}

trait IntoPyDict {
    fn into_py_dict<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>>;
}

impl IntoPyDict for Vec<(String, &str)> {
    fn into_py_dict<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self {
            d.set_item(k, v)?;
        }
        Ok(d)
    }
}

fn one_line(e: &PyUdfError) -> String {
    // The last traceback line says where (`File "<callable>", line 2`), when there is one.
    let at = e
        .stack
        .as_deref()
        .and_then(|s| s.lines().rfind(|l| l.trim_start().starts_with("File ")))
        .map(|l| format!(" ({})", l.trim()))
        .unwrap_or_default();
    format!("{}{at}", e.message)
}

/// A field name usable as a Python variable (others are reached through a callable's row).
fn is_variable(n: &str) -> bool {
    const KEYWORDS: &[&str] = &[
        "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
        "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global",
        "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return",
        "try", "while", "with", "yield",
    ];
    let mut chars = n.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !KEYWORDS.contains(&n)
        && !riverbank_elements::columns::is_hidden(n)
}

/// Why no output type could be inferred.
enum Untold {
    /// The sample rows raised or returned None (Beam's `Any`).
    Samples(String),
    /// Anything else (the program does not load, a result Riverbank cannot store).
    Other(String),
}

/// The output type, from the results on sample rows of the input's types.
fn infer(program: &Program, schema: &Schema, fields: &[usize]) -> Result<DataType, Untold> {
    let columns: Vec<ArrayRef> = fields
        .iter()
        .enumerate()
        .map(|(k, &i)| sample_column(schema.field(i).data_type(), SAMPLE_ROWS, k))
        .collect();
    Python::attach(|py| {
        let rt = runtime(py).map_err(|e| Untold::Other(e.to_string()))?;
        let f = program
            .function(py, &rt)
            .map_err(|e| Untold::Other(e.message))?;
        let h = helpers(&rt).map_err(|e| Untold::Other(e.to_string()))?;
        let (mut t, mut first_error) = (None, None);
        for row in 0..SAMPLE_ROWS {
            let one: Vec<ArrayRef> = columns.iter().map(|c| c.slice(row, 1)).collect();
            match call_batch(py, &rt, &h, &f, &one, 1) {
                Ok(v) => {
                    let shape = convert::shape(&v[0]).map_err(Untold::Other)?;
                    t = convert::union(t, shape);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match (t, first_error) {
            (Some(t), _) => Ok(t),
            (None, Some(e)) => Err(Untold::Samples(format!(
                "it failed on sample rows ({})",
                e.message
            ))),
            (None, None) => Err(Untold::Samples("it returned None on sample rows".into())),
        }
    })
}

// ---------------------------------------------------------------- the expressions

/// A python UDF as a DataFusion expression over its argument columns.
pub type PyExpr = UdfExpr<Program>;

impl crate::call::Program for Program {
    const LANGUAGE: &'static str = "python";
    type Error = PyUdfError;

    fn run(
        &self,
        output: &Output,
        label: &str,
        columns: &[ArrayRef],
        rows: usize,
    ) -> Result<ArrayRef, PyUdfError> {
        hosts::run(self, output, label, columns, rows)
    }
}

/// A python expression translated to SQL: vectorized in DataFusion, except on batches where
/// Python's meaning could differ — an argument with a null (Python raises or compares `None`)
/// or a NaN (SQL orders NaN above every number), or an error (Python's message is the one to
/// report) — which run in Python.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Translated {
    sql: String,
    /// The DataFusion expression, then the `PyExpr`.
    parts: Vec<Arc<dyn PhysicalExpr>>,
}

impl Translated {
    /// Whether the fast path means what Python means on these argument columns.
    fn same_as_python(&self, batch: &RecordBatch) -> datafusion::error::Result<bool> {
        for c in arg_columns(
            &self.parts[1]
                .children()
                .into_iter()
                .cloned()
                .collect::<Vec<_>>(),
            batch,
        )? {
            if c.null_count() > 0 {
                return Ok(false);
            }
            let nan = match c.data_type() {
                DataType::Float64 => c
                    .as_primitive::<arrow::datatypes::Float64Type>()
                    .values()
                    .iter()
                    .any(|v| v.is_nan()),
                DataType::Float32 => c
                    .as_primitive::<arrow::datatypes::Float32Type>()
                    .values()
                    .iter()
                    .any(|v| v.is_nan()),
                _ => false,
            };
            if nan {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl fmt::Display for Translated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} as sql({})", self.parts[1], self.sql)
    }
}

impl PhysicalExpr for Translated {
    fn data_type(&self, input_schema: &Schema) -> datafusion::error::Result<DataType> {
        self.parts[1].data_type(input_schema)
    }

    fn nullable(&self, _input_schema: &Schema) -> datafusion::error::Result<bool> {
        Ok(true)
    }

    fn evaluate(&self, batch: &RecordBatch) -> datafusion::error::Result<ColumnarValue> {
        if self.same_as_python(batch)?
            && let Ok(v) = self.parts[0].evaluate(batch)
        {
            return Ok(v);
        }
        self.parts[1].evaluate(batch)
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        self.parts.iter().collect()
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> datafusion::error::Result<Arc<dyn PhysicalExpr>> {
        Ok(Arc::new(Translated {
            sql: self.sql.clone(),
            parts: children,
        }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// How a compiled UDF runs, for `riverbank plan`: `None` when it is not a python UDF.
pub fn path_of(e: &Arc<dyn PhysicalExpr>) -> Option<String> {
    if let Some(t) = e.downcast_ref::<Translated>() {
        return Some(format!("vectorized, as SQL: {}", t.sql));
    }
    if e.downcast_ref::<PyExpr>().is_some() {
        return Some("in the Python interpreter, a batch at a time".into());
    }
    None
}

#[cfg(test)]
mod tests;
