//! UDF expressions (`generic` field references and `sql` expressions) compiled to DataFusion
//! physical expressions, evaluated on whole Arrow arrays; other languages compile in `udf`.
pub use crate::Role;
use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::DFSchema;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::{SessionConfig, SessionContext};
use riverbank_pipeline::config::{Expr, Language};
use std::sync::Arc;

/// A compiled expression bound to a (user-visible) input schema.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub text: String,
    pub expr: Arc<dyn PhysicalExpr>,
    pub data_type: DataType,
}

impl Compiled {
    /// Evaluates on a batch with the schema it was compiled for.
    pub fn eval(&self, batch: &RecordBatch) -> Result<ArrayRef, String> {
        self.expr
            .evaluate(batch)
            .and_then(|v| v.into_array(batch.num_rows()))
            .map_err(|e| crate::record_error(&e).unwrap_or_else(|| clean_error(&e.to_string())))
    }
}

/// A SQL session used only to parse, type and plan expressions.
pub struct ExprCompiler {
    ctx: SessionContext,
}

impl Default for ExprCompiler {
    fn default() -> Self {
        Self::new()
    }
}

impl ExprCompiler {
    pub fn new() -> Self {
        ExprCompiler {
            ctx: SessionContext::new_with_config(session_config(1)),
        }
    }

    /// Compiles `e` against `schema`. Errors are plain messages naming the expression.
    pub fn compile(&self, e: &Expr, schema: &SchemaRef) -> Result<Compiled, String> {
        self.compile_as(e, schema, Role::Value)
    }

    /// Compiles `e` for a `role`, which UDF languages need to know (`crate`).
    pub fn compile_as(&self, e: &Expr, schema: &SchemaRef, role: Role) -> Result<Compiled, String> {
        let sql = match e.language {
            Language::Sql => e.text.clone(),
            Language::Generic => crate::generic::to_sql(&e.text, schema)?,
            Language::Javascript | Language::Python => {
                return crate::compile(self, e, schema, role);
            }
        };
        let df_schema = DFSchema::try_from(schema.as_ref().clone()).map_err(|x| x.to_string())?;
        let logical = self.ctx.parse_sql_expr(&sql, &df_schema).map_err(|x| {
            format!(
                "cannot compile '{}': {}",
                e.text,
                clean_error(&x.to_string())
            )
        })?;
        let expr = self
            .ctx
            .create_physical_expr(logical, &df_schema)
            .map_err(|x| {
                format!(
                    "cannot compile '{}': {}",
                    e.text,
                    clean_error(&x.to_string())
                )
            })?;
        let data_type = expr.data_type(schema.as_ref()).map_err(|x| x.to_string())?;
        Ok(Compiled {
            text: e.text.clone(),
            expr,
            data_type,
        })
    }
}

/// Session settings shared by expression compilation and the Sql transform: identifiers keep
/// their case (Beam field names such as `PULocationID` are case-sensitive).
pub fn session_config(partitions: usize) -> SessionConfig {
    let mut c = SessionConfig::new()
        .with_target_partitions(partitions.max(1))
        .with_information_schema(false);
    c.options_mut().sql_parser.enable_ident_normalization = false;
    c
}

/// DataFusion prefixes errors with its own layers ("Error during planning: ..."); keep the message.
fn clean_error(s: &str) -> String {
    let mut s = s.trim();
    for p in [
        "Schema error: ",
        "Error during planning: ",
        "Arrow error: ",
        "Execution error: ",
        "Compute error: ",
        "Optimizer rule 'simplify_expressions' failed\ncaused by\n",
    ] {
        while let Some(rest) = s.strip_prefix(p) {
            s = rest.trim();
        }
    }
    // `SQL error: ParserError("...")`: keep the parser's words.
    let unwrapped;
    if let Some(inner) = s
        .strip_prefix("SQL error: ParserError(\"")
        .and_then(|r| r.strip_suffix("\")"))
    {
        unwrapped = format!("syntax error: {}", inner.replace("\\\"", "\""));
        s = &unwrapped;
    }
    // DataFusion's hint about its own config knob does not apply to Beam YAML users; the rest
    // stays on one line, so that a list of issues keeps one issue per line.
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Column names are case sensitive"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int32Array};
    use arrow::datatypes::{Field, Schema};

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("PULocationID", DataType::Int32, false),
            Field::new("total_amount", DataType::Float64, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int32Array::from(vec![132, 138])),
                Arc::new(Float64Array::from(vec![10.5, -1.0])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn sql_keeps_identifier_case() {
        let b = batch();
        let c = ExprCompiler::new()
            .compile(
                &Expr::new(Language::Sql, "total_amount > 0 AND PULocationID = 132"),
                &b.schema(),
            )
            .unwrap();
        let out = c.eval(&b).unwrap();
        let out = out
            .as_any()
            .downcast_ref::<arrow::array::BooleanArray>()
            .unwrap();
        assert!(out.value(0) && !out.value(1));
    }

    #[test]
    fn generic_is_a_field_reference_and_errors_name_the_expression() {
        let b = batch();
        let ec = ExprCompiler::new();
        let c = ec
            .compile(&Expr::new(Language::Generic, "PULocationID"), &b.schema())
            .unwrap();
        assert_eq!(c.data_type, DataType::Int32);
        let e = ec
            .compile(&Expr::new(Language::Sql, "nope + 1"), &b.schema())
            .unwrap_err();
        assert!(e.contains("nope"), "{e}");
    }
}
