//! Queries run again and again over new rows (a streaming shard's, at every checkpoint),
//! planned once. Making a DataFusion context, parsing the SQL and optimizing its logical plan
//! cost about as much as running the query over a checkpoint's rows of one shard (Nexmark
//! Q4's keyed stages run ten queries per shard and checkpoint), and none of it depends on the
//! rows: the optimized plan is kept per query and table schemas, its tables read the rows of
//! the run at hand (`RunRows`, in the run's session), and each run makes only its physical
//! plan.
//!
//! Not kept: a plan whose query calls a function DataFusion folds to a constant when it
//! optimizes (`now()`, `current_date`: stable, not volatile), which would stay the time of
//! the first run.
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result as DfResult, TableReference};
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::execution::SessionState;
use datafusion::logical_expr::{Expr, LogicalPlan, Volatility};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use riverbank_udf::expr::session_config;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

/// Plans kept at most; past it the cache starts again (a process runs a few queries).
const MOST: usize = 256;

/// A session as `SessionContext::new_with_config` makes it, made once: each run clones it
/// (its catalog, shared by the clones, stays empty: a kept plan holds its tables).
static TEMPLATE: LazyLock<SessionState> =
    LazyLock::new(|| SessionContext::new_with_config(session_config(1)).state());

/// The optimized plans, by query and its tables' names and schemas.
type Key = (String, Vec<(String, SchemaRef)>);
static PLANS: LazyLock<Mutex<HashMap<Key, LogicalPlan>>> = LazyLock::new(Default::default);

/// Runs `query` over in-memory tables (name, schema, batches in that schema), its plan kept
/// for the next run over tables of the same schemas.
pub async fn run(
    query: &str,
    tables: Vec<(String, SchemaRef, Vec<RecordBatch>)>,
) -> Result<Vec<RecordBatch>, String> {
    let key: Key = (
        query.to_string(),
        tables
            .iter()
            .map(|(n, s, _)| (n.clone(), s.clone()))
            .collect(),
    );
    let rows = RunRows(
        tables
            .into_iter()
            .map(|(name, _, batches)| (name, batches))
            .collect(),
    );
    let mut state = TEMPLATE.clone();
    state.config_mut().set_extension(Arc::new(rows));
    let known = PLANS.lock().expect("plans").get(&key).cloned();
    let plan = match known {
        Some(plan) => plan,
        None => {
            let (plan, keep) = optimized(&key).await?;
            if keep {
                let mut plans = PLANS.lock().expect("plans");
                if plans.len() >= MOST {
                    plans.clear();
                }
                plans.insert(key, plan.clone());
            }
            plan
        }
    };
    let physical = state
        .query_planner()
        .create_physical_plan(&plan, &state)
        .await
        .map_err(|e| e.to_string())?;
    datafusion::physical_plan::collect(physical, state.task_ctx())
        .await
        .map_err(|e| e.to_string())
}

/// The query's optimized plan over `RunTable`s, and whether it may be kept (nothing in it is
/// folded to a constant of this moment). In a context of its own: a clone of `TEMPLATE` would
/// share its catalog.
async fn optimized((query, tables): &Key) -> Result<(LogicalPlan, bool), String> {
    let ctx = SessionContext::new_with_config(session_config(1));
    for (name, schema) in tables {
        let table = RunTable {
            name: name.clone(),
            schema: schema.clone(),
        };
        ctx.register_table(TableReference::bare(name.as_str()), Arc::new(table))
            .map_err(|e| e.to_string())?;
    }
    let plan = ctx
        .sql(query)
        .await
        .map_err(|e| e.to_string())?
        .into_unoptimized_plan();
    let keep = !calls_stable_functions(&plan);
    let plan = ctx.state().optimize(&plan).map_err(|e| e.to_string())?;
    Ok((plan, keep))
}

/// Whether any expression of `plan` calls a stable function (one the optimizer evaluates once).
fn calls_stable_functions(plan: &LogicalPlan) -> bool {
    let mut stable = false;
    let _ = plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|e| {
                if let Expr::ScalarFunction(f) = e
                    && f.func.signature().volatility == Volatility::Stable
                {
                    stable = true;
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    });
    stable
}

/// The rows of one run's tables, by name: the session extension its `RunTable`s read.
struct RunRows(HashMap<String, Vec<RecordBatch>>);

/// A table of a kept plan: its rows are the run's (`RunRows`).
#[derive(Debug)]
struct RunTable {
    name: String,
    schema: SchemaRef,
}

#[async_trait]
impl TableProvider for RunTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let rows = state.config().get_extension::<RunRows>();
        let batches = rows
            .as_ref()
            .and_then(|r| r.0.get(&self.name))
            .ok_or_else(|| DataFusionError::Internal(format!("no rows for table {}", self.name)))?;
        Ok(MemorySourceConfig::try_new_exec(
            std::slice::from_ref(batches),
            self.schema.clone(),
            projection.cloned(),
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, TimestampNanosecondArray};
    use arrow::datatypes::{DataType, Field, Schema};

    fn table(values: &[i64]) -> (String, SchemaRef, Vec<RecordBatch>) {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let b = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from(values.to_vec()))],
        )
        .unwrap();
        ("t".into(), schema, vec![b])
    }

    fn sum(out: &[RecordBatch]) -> i64 {
        let a = out[0].column(0).as_any().downcast_ref::<Int64Array>();
        a.expect("an Int64 sum").value(0)
    }

    #[tokio::test]
    async fn a_kept_plan_reads_the_rows_of_each_run() {
        let q = "SELECT SUM(x) AS s FROM t WHERE x > 1";
        let first = run(q, vec![table(&[1, 2, 3])]).await.unwrap();
        let second = run(q, vec![table(&[5, 7])]).await.unwrap();
        assert_eq!((sum(&first), sum(&second)), (5, 12));
        let key = (q.to_string(), vec![("t".to_string(), table(&[]).1)]);
        assert!(PLANS.lock().unwrap().contains_key(&key));
    }

    #[tokio::test]
    async fn a_query_of_the_time_now_is_planned_at_each_run() {
        let q = "SELECT now() AS at, SUM(x) AS s FROM t";
        let first = run(q, vec![table(&[1])]).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let second = run(q, vec![table(&[1])]).await.unwrap();
        let at = |out: &[RecordBatch]| {
            let a = out[0].column(0).as_any();
            a.downcast_ref::<TimestampNanosecondArray>()
                .expect("now() as nanoseconds")
                .value(0)
        };
        assert!(
            at(&second) > at(&first),
            "now() was kept from the first run"
        );
        let key = (q.to_string(), vec![("t".to_string(), table(&[]).1)]);
        assert!(!PLANS.lock().unwrap().contains_key(&key));
    }

    #[tokio::test]
    async fn a_sql_error_names_what_is_wrong() {
        let err = run("SELECT nope FROM t", vec![table(&[1])])
            .await
            .unwrap_err();
        assert!(err.contains("nope"), "{err}");
    }
}
