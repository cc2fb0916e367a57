//! Custom `Combine` fns in Python (`language: python`, `fn: {type: <CombineFn>, config: {..}}`),
//! as a DataFusion `GroupsAccumulator` so the lifted combine runs them like its built-ins: the
//! partial combine calls `add_input` per value, its state is each group's accumulator pickled
//! (one Binary column, shuffled like any state), and the final combine unpickles,
//! `merge_accumulators` and `extract_output`. One call into the interpreter per batch; the
//! accumulators live in a Python list. Runs in this process's interpreter (not the UDF hosts:
//! accumulators are per-key state that must stay in one place).
use super::{PyUdfError, convert, helpers, runtime};
use crate::values::{Output, sample_column};
use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, BooleanArray};
use arrow::datatypes::DataType;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

/// Rows of sample values a fn is tried on to infer its output type.
const SAMPLE_ROWS: usize = 4;

pub use crate::CustomFn as PyCombine;

fn load<'py>(py: Python<'py>, source: &str, config: Option<&str>) -> PyResult<Bound<'py, PyAny>> {
    let rt = runtime(py)?;
    super::env::add_to_path(&super::env::site_dirs())
        .map_err(pyo3::exceptions::PyRuntimeError::new_err)?;
    rt.getattr("combine_fn")?.call1((source, config))
}

fn message(py: Python<'_>, e: PyErr) -> String {
    let e = PyUdfError::from_py(py, e);
    super::one_line(&e)
}

/// Loads the fn (so a bad name or config fails at validation) and infers its output type from
/// its result on sample values of `input`.
pub fn compile(source: &str, config: Option<&str>, input: &DataType) -> Result<PyCombine, String> {
    super::available()?;
    let output_type = Python::attach(|py| -> Result<DataType, String> {
        let f = load(py, source, config).map_err(|e| message(py, e))?;
        let rt = runtime(py).map_err(|e| message(py, e))?;
        let h = helpers(&rt).map_err(|e| message(py, e))?;
        let sample = convert::to_py(py, &h, &sample_column(input, SAMPLE_ROWS, 0))?;
        let out = rt
            .getattr("combine_sample")
            .and_then(|s| s.call1((&f, PyList::new(py, sample)?)))
            .map_err(|e| format!("it failed on sample values: {}", message(py, e)))?;
        convert::shape(&out)?.ok_or_else(|| {
            "it returned None on sample values; its output type cannot be told".into()
        })
    })?;
    Ok(PyCombine {
        source: source.to_string(),
        config: config.map(str::to_string),
        output_type,
    })
}

/// The accumulators of one combine fn, per group.
#[derive(Debug)]
pub struct PyAccumulator {
    spec: PyCombine,
    label: String,
    fn_: Py<PyAny>,
    accs: Py<PyList>,
    groups: usize,
}

fn external(e: impl Into<String>) -> DataFusionError {
    DataFusionError::External(Box::new(PyUdfError::plain(e.into())))
}

impl PyAccumulator {
    pub fn new(spec: &PyCombine, label: &str) -> Result<PyAccumulator> {
        super::available().map_err(external)?;
        Python::attach(|py| {
            let f = load(py, &spec.source, spec.config.as_deref())
                .map_err(|e| DataFusionError::External(Box::new(PyUdfError::from_py(py, e))))?;
            Ok(PyAccumulator {
                spec: spec.clone(),
                label: label.to_string(),
                fn_: f.unbind(),
                accs: PyList::empty(py).unbind(),
                groups: 0,
            })
        })
    }

    fn py_err(&self, py: Python<'_>, e: PyErr) -> DataFusionError {
        let mut e = PyUdfError::from_py(py, e);
        e.message = format!("python CombineFn {}: {}", self.label, e.message);
        DataFusionError::External(Box::new(e))
    }

    /// `n` of EmitTo, and the groups left.
    fn take(&mut self, emit_to: EmitTo) -> usize {
        let n = match emit_to {
            EmitTo::All => self.groups,
            EmitTo::First(n) => n.min(self.groups),
        };
        self.groups -= n;
        n
    }

    /// Group indices of the rows the filter lets through, and the rows.
    fn selected(
        group_indices: &[usize],
        filter: Option<&BooleanArray>,
    ) -> (Vec<usize>, Vec<usize>) {
        (0..group_indices.len())
            .filter(|&i| filter.is_none_or(|f| f.is_valid(i) && f.value(i)))
            .map(|i| (group_indices[i], i))
            .unzip()
    }
}

impl GroupsAccumulator for PyAccumulator {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.groups = self.groups.max(total_num_groups);
        let (groups, rows) = Self::selected(group_indices, opt_filter);
        Python::attach(|py| {
            let rt = runtime(py).map_err(|e| self.py_err(py, e))?;
            let h = helpers(&rt).map_err(|e| self.py_err(py, e))?;
            let all = convert::to_py(py, &h, &values[0]).map_err(external)?;
            let vals: Vec<_> = rows.iter().map(|&r| all[r].clone()).collect();
            rt.getattr("combine_add")
                .and_then(|f| {
                    f.call1((
                        self.fn_.bind(py),
                        self.accs.bind(py),
                        groups,
                        PyList::new(py, vals)?,
                        total_num_groups,
                    ))
                })
                .map_err(|e| self.py_err(py, e))?;
            Ok(())
        })
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        self.groups = self.groups.max(total_num_groups);
        let states = values[0].as_binary::<i32>();
        let (groups, rows) = Self::selected(group_indices, None);
        // A null state is a group the producer never saw a value for: nothing to merge.
        let (groups, rows): (Vec<usize>, Vec<usize>) = groups
            .into_iter()
            .zip(rows)
            .filter(|&(_, r)| states.is_valid(r))
            .unzip();
        Python::attach(|py| {
            let rt = runtime(py).map_err(|e| self.py_err(py, e))?;
            let bytes: Vec<_> = rows
                .iter()
                .map(|&r| PyBytes::new(py, states.value(r)))
                .collect();
            rt.getattr("combine_merge")
                .and_then(|f| {
                    f.call1((
                        self.fn_.bind(py),
                        self.accs.bind(py),
                        groups,
                        PyList::new(py, bytes)?,
                        total_num_groups,
                    ))
                })
                .map_err(|e| self.py_err(py, e))?;
            Ok(())
        })
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let n = self.take(emit_to);
        Python::attach(|py| {
            let rt = runtime(py).map_err(|e| self.py_err(py, e))?;
            let h = helpers(&rt).map_err(|e| self.py_err(py, e))?;
            let out = rt
                .getattr("combine_extract")
                .and_then(|f| f.call1((self.fn_.bind(py), self.accs.bind(py), n)))
                .map_err(|e| self.py_err(py, e))?;
            let results: Vec<_> = out
                .try_iter()
                .and_then(|it| it.collect::<PyResult<Vec<_>>>())
                .map_err(|e| self.py_err(py, e))?;
            let output = Output::Value {
                data_type: self.spec.output_type.clone(),
                declared: false,
            };
            convert::from_py(&h, &results, &output).map_err(|m| {
                external(format!(
                    "python CombineFn {} {m} (the type its output on sample values has)",
                    self.label
                ))
            })
        })
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let n = self.take(emit_to);
        Python::attach(|py| {
            let rt = runtime(py).map_err(|e| self.py_err(py, e))?;
            let out = rt
                .getattr("combine_state")
                .and_then(|f| f.call1((self.accs.bind(py), n)))
                .map_err(|e| self.py_err(py, e))?;
            let states: Vec<Vec<u8>> = out.extract().map_err(|e| self.py_err(py, e))?;
            let array: BinaryArray = states.iter().map(|s| Some(s.as_slice())).collect();
            Ok(vec![std::sync::Arc::new(array) as ArrayRef])
        })
    }

    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        // Each row its own group: one accumulator per row, pickled.
        let rows = values[0].len();
        let (_, selected) = Self::selected(&(0..rows).collect::<Vec<_>>(), opt_filter);
        Python::attach(|py| {
            let rt = runtime(py).map_err(|e| self.py_err(py, e))?;
            let h = helpers(&rt).map_err(|e| self.py_err(py, e))?;
            let all = convert::to_py(py, &h, &values[0]).map_err(external)?;
            let vals: Vec<_> = selected.iter().map(|&r| all[r].clone()).collect();
            let accs = PyList::empty(py);
            rt.getattr("combine_add")
                .and_then(|f| {
                    f.call1((
                        self.fn_.bind(py),
                        &accs,
                        (0..selected.len()).collect::<Vec<_>>(),
                        PyList::new(py, vals)?,
                        selected.len(),
                    ))
                })
                .map_err(|e| self.py_err(py, e))?;
            let states: Vec<Vec<u8>> = rt
                .getattr("combine_state")
                .and_then(|f| f.call1((&accs, selected.len())))
                .and_then(|o| o.extract())
                .map_err(|e| self.py_err(py, e))?;
            let mut out: Vec<Option<&[u8]>> = vec![None; rows];
            for (k, &r) in selected.iter().enumerate() {
                out[r] = Some(states[k].as_slice());
            }
            Ok(vec![std::sync::Arc::new(BinaryArray::from(out)) as ArrayRef])
        })
    }

    fn size(&self) -> usize {
        // Python objects: a rough figure per group, so memory limits still flush partials.
        self.groups * 256
    }
}
