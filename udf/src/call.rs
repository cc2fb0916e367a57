//! A UDF call as a DataFusion expression, whatever its language: the language's compiled
//! [`Program`] applied to the argument columns a batch at a time, its result typed by the
//! [`Output`] found at compile time. A language supplies the program; the expression is this.
use crate::values::Output;
use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Schema};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

/// What a UDF language compiles a UDF to: a function of the argument columns, positionally.
pub trait Program: fmt::Debug + Clone + Eq + Hash + Send + Sync + 'static {
    /// The language, as the expression shows itself: `javascript(label)`.
    const LANGUAGE: &'static str;
    type Error: std::error::Error + Send + Sync + 'static;

    /// Runs the program on `rows` rows of `columns`, building `output`.
    fn run(
        &self,
        output: &Output,
        label: &str,
        columns: &[ArrayRef],
        rows: usize,
    ) -> Result<ArrayRef, Self::Error>;
}

/// A UDF as a DataFusion expression over its argument columns.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct UdfExpr<P: Program> {
    pub(crate) program: P,
    pub(crate) label: String,
    pub(crate) args: Vec<Arc<dyn PhysicalExpr>>,
    pub(crate) output: Output,
}

impl<P: Program> fmt::Display for UdfExpr<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", P::LANGUAGE, self.label)
    }
}

/// The argument columns of a call, evaluated on `batch`.
pub(crate) fn arg_columns(
    args: &[Arc<dyn PhysicalExpr>],
    batch: &RecordBatch,
) -> datafusion::error::Result<Vec<ArrayRef>> {
    let rows = batch.num_rows();
    args.iter()
        .map(|a| a.evaluate(batch).and_then(|v| v.into_array(rows)))
        .collect()
}

impl<P: Program> PhysicalExpr for UdfExpr<P> {
    fn data_type(&self, _input_schema: &Schema) -> datafusion::error::Result<DataType> {
        Ok(self.output.data_type())
    }

    fn nullable(&self, _input_schema: &Schema) -> datafusion::error::Result<bool> {
        Ok(true)
    }

    fn evaluate(&self, batch: &RecordBatch) -> datafusion::error::Result<ColumnarValue> {
        let columns = arg_columns(&self.args, batch)?;
        self.program
            .run(&self.output, &self.label, &columns, batch.num_rows())
            .map(ColumnarValue::Array)
            .map_err(|e| DataFusionError::External(Box::new(e)))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        self.args.iter().collect()
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> datafusion::error::Result<Arc<dyn PhysicalExpr>> {
        Ok(Arc::new(UdfExpr {
            program: self.program.clone(),
            label: self.label.clone(),
            args: children,
            output: self.output.clone(),
        }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}
