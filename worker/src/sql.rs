//! The `Sql` and `Join` transforms, run by DataFusion over the streamed (gathered) inputs.
use crate::expr::session_config;
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::datasource::MemTable;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion::prelude::SessionContext;
use riverbank_pipeline::config::JoinType;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::UnboundedReceiver;

/// Plans `query` over empty tables of the given schemas, to learn its output schema and report
/// SQL errors before anything runs.
pub async fn plan_schema(query: &str, tables: &[(String, String, SchemaRef)]) -> Result<SchemaRef, String> {
    let ctx = SessionContext::new_with_config(session_config(1));
    for (name, _, schema) in tables {
        let t = MemTable::try_new(schema.clone(), vec![vec![]]).map_err(|e| e.to_string())?;
        ctx.register_table(quote_free(name), Arc::new(t)).map_err(|e| e.to_string())?;
    }
    let df = ctx.sql(query).await.map_err(|e| e.to_string())?;
    Ok(Arc::new(df.schema().as_arrow().clone()))
}

/// Table names are registered verbatim (case kept: identifier normalization is off).
fn quote_free(name: &str) -> String {
    name.to_string()
}

/// One input partition, consumed once by the query.
struct ChannelPartition {
    schema: SchemaRef,
    rx: Mutex<Option<UnboundedReceiver<RecordBatch>>>,
}

impl std::fmt::Debug for ChannelPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChannelPartition")
    }
}

impl PartitionStream for ChannelPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }
    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let rx = self.rx.lock().ok().and_then(|mut g| g.take());
        let stream = futures::stream::unfold(rx, |rx| async move {
            let mut rx = rx?;
            let b = rx.recv().await?;
            Some((Ok(b), Some(rx)))
        });
        Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), stream))
    }
}

/// Runs `query` with each table fed by its channels; returns the output partitions.
pub async fn run_query(query: &str, tables: Vec<(String, SchemaRef, Vec<UnboundedReceiver<RecordBatch>>)>, partitions: usize, memory_limit: usize) -> Result<Vec<SendableRecordBatchStream>, String> {
    let runtime = RuntimeEnvBuilder::new().with_memory_limit(memory_limit, 1.0).build_arc().map_err(|e| e.to_string())?;
    let ctx = SessionContext::new_with_config_rt(session_config(partitions), runtime);
    for (name, schema, rxs) in tables {
        let parts: Vec<Arc<dyn PartitionStream>> = rxs.into_iter().map(|rx| Arc::new(ChannelPartition { schema: schema.clone(), rx: Mutex::new(Some(rx)) }) as Arc<dyn PartitionStream>).collect();
        let t = StreamingTable::try_new(schema.clone(), parts).map_err(|e| e.to_string())?;
        ctx.register_table(quote_free(&name), Arc::new(t)).map_err(|e| e.to_string())?;
    }
    let df = ctx.sql(query).await.map_err(|e| e.to_string())?;
    df.execute_stream_partitioned().await.map_err(|e| e.to_string())
}

/// Beam YAML's Join as SQL over the named inputs.
/// Output fields: those listed in `fields` per input, else every field of every input, the
/// first input's field winning when names repeat (so an equality key appears once).
pub fn join_query(inputs: &[(String, SchemaRef)], join_type: &JoinType, equalities: &[Vec<(String, String)>], fields: &[(String, Vec<String>)]) -> Result<String, String> {
    let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let field_of = |eq: &Vec<(String, String)>, input: &str| -> Option<String> { eq.iter().find(|(k, _)| k == input || k == "*").map(|(_, f)| f.clone()) };
    for eq in equalities {
        for (name, schema) in inputs {
            let Some(f) = field_of(eq, name) else {
                return Err(format!("equality {eq:?} names no field for input '{name}'"));
            };
            if schema.index_of(&f).is_err() {
                return Err(format!("equality field '{f}' is not a field of input '{name}'"));
            }
        }
    }
    let mut select = vec![];
    let mut seen = std::collections::HashSet::new();
    for (name, schema) in inputs {
        let listed = fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let names: Vec<String> = match listed {
            Some(v) => {
                for f in &v {
                    if schema.index_of(f).is_err() {
                        return Err(format!("fields: '{f}' is not a field of input '{name}'"));
                    }
                }
                v
            }
            None if !fields.is_empty() => vec![],
            None => schema.fields().iter().map(|f| f.name().clone()).collect(),
        };
        for f in names {
            if seen.insert(f.clone()) {
                select.push(format!("{}.{}", q(name), q(&f)));
            } else if fields.iter().any(|(k, _)| k == name) {
                return Err(format!("field '{f}' is selected from more than one input"));
            }
        }
    }
    let mut sql = format!("SELECT {} FROM {}", select.join(", "), q(&inputs[0].0));
    for (k, (name, _)) in inputs.iter().enumerate().skip(1) {
        let kind = match join_type {
            JoinType::Inner => "INNER JOIN",
            JoinType::Left => "LEFT JOIN",
            JoinType::Right => "RIGHT JOIN",
            JoinType::Outer => "FULL OUTER JOIN",
            JoinType::OuterInputs(v) => {
                let left_kept = inputs[..k].iter().any(|(n, _)| v.contains(n));
                match (left_kept, v.contains(name)) {
                    (true, true) => "FULL OUTER JOIN",
                    (true, false) => "LEFT JOIN",
                    (false, true) => "RIGHT JOIN",
                    (false, false) => "INNER JOIN",
                }
            }
        };
        let on: Vec<String> = equalities
            .iter()
            .map(|eq| format!("{}.{} = {}.{}", q(&inputs[0].0), q(&field_of(eq, &inputs[0].0).unwrap_or_default()), q(name), q(&field_of(eq, name).unwrap_or_default())))
            .collect();
        sql.push_str(&format!(" {kind} {} ON {}", q(name), on.join(" AND ")));
    }
    Ok(sql)
}

