//! The `Sql` and `Join` transforms, run by DataFusion over the streamed (gathered) inputs.
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::common::{DataFusionError, TableReference};
use datafusion::datasource::MemTable;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion::prelude::SessionContext;
use riverbank_pipeline::config::JoinType;
use riverbank_udf::expr::session_config;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

/// Plans `query` over empty tables of the given schemas, to learn its output schema and report
/// SQL errors before anything runs.
pub async fn plan_schema(
    query: &str,
    tables: &[(String, String, SchemaRef)],
) -> Result<SchemaRef, String> {
    let df = planned(query, tables).await?;
    Ok(Arc::new(df.schema().as_arrow().clone()))
}

/// `query` planned over empty tables of the inputs' schemas, for what planning tells.
async fn planned(
    query: &str,
    tables: &[(String, String, SchemaRef)],
) -> Result<datafusion::dataframe::DataFrame, String> {
    let ctx = SessionContext::new_with_config(session_config(1));
    for (name, _, schema) in tables {
        let t = MemTable::try_new(schema.clone(), vec![vec![]]).map_err(|e| e.to_string())?;
        ctx.register_table(table_name(name), Arc::new(t))
            .map_err(|e| e.to_string())?;
    }
    ctx.sql(query).await.map_err(|e| e.to_string())
}

/// The key of a query over session windows: each table's GROUP BY fields, by which the tables'
/// sessions merge (Beam SQL aggregates with a GroupByKey, which merges sessions per key). A
/// query must group one table by plain fields, and join nothing (a Join transform merges by
/// its equalities).
pub async fn group_keys(
    query: &str,
    tables: &[(String, String, SchemaRef)],
) -> Result<Vec<Vec<String>>, String> {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    use datafusion::logical_expr::{Expr, LogicalPlan};
    let plan = planned(query, tables).await?.into_unoptimized_plan();
    let (mut groups, mut joins, mut scans) = (vec![], 0, vec![]);
    plan.apply(|node| {
        match node {
            LogicalPlan::Aggregate(a) => groups.push(a.group_expr.clone()),
            LogicalPlan::Join(_) => joins += 1,
            LogicalPlan::TableScan(s) => scans.push(s.table_name.table().to_string()),
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(|e| e.to_string())?;
    let refuse = |why: &str| {
        Err(format!(
            "a Sql over session windows merges sessions per key at its GROUP BY, so {why} \
             (or aggregate per session with a Combine)"
        ))
    };
    if joins > 0 || scans.len() != 1 || tables.len() != 1 {
        return refuse(
            "it must read one input and join nothing (a Join transform merges by its equalities)",
        );
    }
    let [group] = groups.as_slice() else {
        return refuse("it must have exactly one GROUP BY");
    };
    let mut fields = vec![];
    for e in group {
        match e {
            Expr::Column(c) => fields.push(c.name.clone()),
            other => return refuse(&format!("it must group by plain fields, not {other}")),
        }
    }
    Ok(vec![fields])
}

/// Table names are registered verbatim (case kept: identifier normalization is off). A plain
/// `&str` would be parsed, and lower-cased, by DataFusion, so `PCOLLECTION` could not be found.
fn table_name(name: &str) -> TableReference {
    TableReference::bare(name)
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
        if rx.is_none() {
            // The input is streamed once: a second scan would silently see no rows.
            let e = DataFusionError::Execution("the query reads one input table twice; give the Sql transform that input under two names (input: {a: X, b: X})".into());
            return Box::pin(RecordBatchStreamAdapter::new(
                self.schema.clone(),
                futures::stream::once(async move { Err(e) }),
            ));
        }
        let stream = futures::stream::unfold(rx, |rx| async move {
            let mut rx = rx?;
            let b = rx.recv().await?;
            Some((Ok(riverbank_elements::columns::user_batch(&b)), Some(rx)))
        });
        Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), stream))
    }
}

/// The feeds of `tables` (table name, collection), from the shuffled partitions of each
/// collection. A collection backing several table names (a self-join) is teed, so that every
/// table reads all of it. Must be called within the runtime.
pub fn table_feeds(
    mut by_collection: HashMap<String, Vec<UnboundedReceiver<RecordBatch>>>,
    tables: &[(String, String)],
    partitions: usize,
) -> Vec<Vec<UnboundedReceiver<RecordBatch>>> {
    let mut copies: HashMap<&str, Vec<Vec<UnboundedReceiver<RecordBatch>>>> = HashMap::new();
    for (_, coll) in tables {
        if copies.contains_key(coll.as_str()) {
            continue;
        }
        let n = tables.iter().filter(|(_, c)| c == coll).count();
        let rxs = by_collection
            .remove(coll)
            .unwrap_or_else(|| (0..partitions).map(|_| unbounded_channel().1).collect());
        let feeds = if n == 1 {
            vec![rxs]
        } else {
            let mut feeds: Vec<Vec<UnboundedReceiver<RecordBatch>>> =
                (0..n).map(|_| vec![]).collect();
            for mut rx in rxs {
                let (txs, outs): (Vec<_>, Vec<_>) =
                    (0..n).map(|_| unbounded_channel::<RecordBatch>()).unzip();
                for (f, out) in feeds.iter_mut().zip(outs) {
                    f.push(out);
                }
                tokio::spawn(async move {
                    while let Some(b) = rx.recv().await {
                        for tx in &txs {
                            let _ = tx.send(b.clone());
                        }
                    }
                });
            }
            feeds
        };
        copies.insert(coll, feeds);
    }
    tables
        .iter()
        .map(|(_, coll)| {
            copies
                .get_mut(coll.as_str())
                .and_then(|f| f.pop())
                .unwrap_or_default()
        })
        .collect()
}

/// Runs `query` with each table fed by its channels; returns the output partitions.
pub async fn run_query(
    query: &str,
    tables: Vec<(String, SchemaRef, Vec<UnboundedReceiver<RecordBatch>>)>,
    partitions: usize,
    memory_limit: usize,
) -> Result<Vec<SendableRecordBatchStream>, String> {
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(memory_limit, 1.0)
        .build_arc()
        .map_err(|e| e.to_string())?;
    let ctx = SessionContext::new_with_config_rt(session_config(partitions), runtime);
    for (name, schema, rxs) in tables {
        let parts: Vec<Arc<dyn PartitionStream>> = rxs
            .into_iter()
            .map(|rx| {
                Arc::new(ChannelPartition {
                    schema: schema.clone(),
                    rx: Mutex::new(Some(rx)),
                }) as Arc<dyn PartitionStream>
            })
            .collect();
        let t = StreamingTable::try_new(schema.clone(), parts).map_err(|e| e.to_string())?;
        ctx.register_table(table_name(&name), Arc::new(t))
            .map_err(|e| e.to_string())?;
    }
    let df = ctx.sql(query).await.map_err(|e| e.to_string())?;
    df.execute_stream_partitioned()
        .await
        .map_err(|e| e.to_string())
}

/// Beam YAML's Join as SQL over the named inputs, built the way Beam's `yaml_join` builds it.
///
/// Conditions: each equality relates the first input it names to each other input it names
/// (`*` names every input); a condition belongs to the join of the later of its two inputs.
/// Every input after the first must be related to an earlier one.
///
/// Output fields, as Beam: for each input listed in `fields`, its listed fields (renamed as
/// given), in the order listed; then every field of each input not listed. A name already
/// taken gets Calcite's numeric suffix (`name`, `name0`, `name1`, as Beam's yaml_join_test
/// expects), so both copies of an equality key are kept.
/// `name`, or Calcite's first free `name0`, `name1`, … (SqlValidatorUtil.uniquify), taken.
fn unique(seen: &mut std::collections::HashSet<String>, name: &str) -> String {
    let mut out = name.to_string();
    let mut k = 0;
    while !seen.insert(out.clone()) {
        out = format!("{name}{k}");
        k += 1;
    }
    out
}

pub fn join_query(
    inputs: &[(String, SchemaRef)],
    join_type: &JoinType,
    equalities: &[Vec<(String, String)>],
    fields: &[(String, Vec<(String, String)>)],
) -> Result<String, String> {
    let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let index = |name: &str| inputs.iter().position(|(n, _)| n == name);
    let has_field = |i: usize, f: &str| inputs[i].1.index_of(f).is_ok();
    // ON conditions per input index (0 never has any).
    let mut on: Vec<Vec<String>> = vec![vec![]; inputs.len()];
    for eq in equalities {
        // (input index, field) for every input this equality names.
        let mut named: Vec<(usize, String)> = vec![];
        for (k, f) in eq {
            if k == "*" {
                for (i, (name, _)) in inputs.iter().enumerate() {
                    if !has_field(i, f) {
                        return Err(format!(
                            "equality field '{f}' is not a field of input '{name}'"
                        ));
                    }
                    if !named.iter().any(|(j, _)| *j == i) {
                        named.push((i, f.clone()));
                    }
                }
            } else {
                let i = index(k).ok_or_else(|| {
                    format!("equality names input '{k}', which is not an input of the Join")
                })?;
                if !has_field(i, f) {
                    return Err(format!(
                        "equality field '{f}' is not a field of input '{k}'"
                    ));
                }
                named.push((i, f.clone()));
            }
        }
        if named.len() < 2 {
            return Err(format!("equality {eq:?} must relate at least two inputs"));
        }
        let (a, fa) = &named[0];
        for (b, fb) in &named[1..] {
            on[(*a).max(*b)].push(format!(
                "{}.{} = {}.{}",
                q(&inputs[*a].0),
                q(fa),
                q(&inputs[*b].0),
                q(fb)
            ));
        }
    }
    if let Some(k) = (1..inputs.len()).find(|&k| on[k].is_empty()) {
        return Err(format!(
            "the equalities do not relate input '{}' to any input before it ({})",
            inputs[k].0,
            inputs[..k]
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let mut select = vec![];
    let mut seen = std::collections::HashSet::new();
    for (name, list) in fields {
        let i =
            index(name).ok_or_else(|| format!("fields: '{name}' is not an input of the Join"))?;
        for (out, f) in list {
            if !has_field(i, f) {
                return Err(format!(
                    "fields: '{f}' is not a field of input '{name}' (its fields: {})",
                    inputs[i]
                        .1
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            let out = unique(&mut seen, out);
            select.push(format!("{}.{} AS {}", q(name), q(f), q(&out)));
        }
    }
    for (name, schema) in inputs
        .iter()
        .filter(|(n, _)| !fields.iter().any(|(k, _)| k == n))
    {
        for f in schema.fields() {
            let out = unique(&mut seen, f.name());
            select.push(format!("{}.{} AS {}", q(name), q(f.name()), q(&out)));
        }
    }
    if select.is_empty() {
        return Err("the Join selects no fields".into());
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
        sql.push_str(&format!(" {kind} {} ON {}", q(name), on[k].join(" AND ")));
    }
    Ok(sql)
}

/// The key of a streaming query over the global window, by which its rows are spread over
/// state shards: GROUP BY fields of the one table the query reads (once) that every aggregate
/// of the query groups by, and that every projection between them passes through unrenamed,
/// when nothing else compares groups (projections, filters and sorting around the
/// aggregates; no LIMIT, window function, join or subquery). An aggregate over another's
/// groups (`SELECT category, AVG(final) FROM (SELECT id, category, MAX(price) AS final ...
/// GROUP BY id, category) GROUP BY category`) is keyed by `category`: every row of a category
/// meets in one shard. Otherwise no key, and every row of the query meets in one shard
/// (always right, not parallel).
pub async fn state_keys(
    query: &str,
    tables: &[(String, String, SchemaRef)],
) -> Result<Vec<Vec<String>>, String> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    use datafusion::logical_expr::{Expr, LogicalPlan};
    let plan = planned(query, tables).await?.into_unoptimized_plan();
    let mut groups: Vec<Vec<Expr>> = vec![];
    let mut projections: Vec<Vec<Expr>> = vec![];
    let (mut per_group, mut scans) = (true, 0);
    // Subqueries' plans too: a second read of the table compares groups.
    plan.apply_with_subqueries(|node| {
        match node {
            LogicalPlan::Aggregate(a) => groups.push(a.group_expr.clone()),
            LogicalPlan::Projection(p) => projections.push(p.expr.clone()),
            LogicalPlan::TableScan(_) => scans += 1,
            LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) => {}
            LogicalPlan::Sort(s) if s.fetch.is_none() => {}
            _ => per_group = false,
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(|e| e.to_string())?;
    let one_shard = Ok(vec![vec![]; tables.len()]);
    let (Some(outer), true, 1, 1) = (groups.first(), per_group, scans, tables.len()) else {
        return one_shard;
    };
    let column = |e: &Expr| match e {
        Expr::Column(c) => Some(c.name.clone()),
        _ => None,
    };
    let fields: Vec<String> = outer
        .iter()
        .filter_map(column)
        // A field of the input itself, grouped by every aggregate, and never the name of
        // something else (`SELECT x AS k` makes another field `k`).
        .filter(|k| tables[0].2.field_with_name(k).is_ok())
        .filter(|k| {
            groups
                .iter()
                .all(|g| g.iter().any(|e| column(e).as_ref() == Some(k)))
        })
        .filter(|k| {
            projections.iter().flatten().all(|e| match e {
                Expr::Alias(a) if &a.name == k => column(&a.expr).as_ref() == Some(k),
                _ => true,
            })
        })
        .collect();
    match fields.is_empty() {
        true => one_shard,
        false => Ok(vec![fields]),
    }
}

/// Whether a streaming query over the global window can keep each group's aggregate rather
/// than its rows (Beam's combiner lifting; Flink's group aggregation keeps its accumulators):
/// one GROUP BY of plain fields over one table read row by row (filters and projections below
/// it; nothing over it: no HAVING, ORDER BY, LIMIT or expression of an aggregate), every
/// aggregate a MAX, MIN, SUM or COUNT without DISTINCT, FILTER or ORDER BY, and every group
/// field selected under its own name. Then the answer is the query that merges rows of the
/// query's own output by group (a MAX of MAXes, a SUM of COUNTs), read as `PCOLLECTION`, when
/// its result has the query's own schema; otherwise `None`.
pub async fn merge_query(
    query: &str,
    tables: &[(String, String, SchemaRef)],
) -> Result<Option<String>, String> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    use datafusion::logical_expr::{Expr, LogicalPlan};
    if tables.len() != 1 {
        return Ok(None);
    }
    let df = planned(query, tables).await?;
    let output = Arc::new(df.schema().as_arrow().clone());
    let plan = df.into_unoptimized_plan();
    let LogicalPlan::Projection(p) = &plan else {
        return Ok(None);
    };
    let LogicalPlan::Aggregate(a) = p.input.as_ref() else {
        return Ok(None);
    };
    let mut row_wise = true;
    a.input
        .apply_with_subqueries(|node| {
            match node {
                LogicalPlan::Filter(_)
                | LogicalPlan::Projection(_)
                | LogicalPlan::SubqueryAlias(_)
                | LogicalPlan::TableScan(_) => {}
                _ => row_wise = false,
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .map_err(|e| e.to_string())?;
    let groups: Option<Vec<&str>> = a
        .group_expr
        .iter()
        .map(|e| match e {
            Expr::Column(c) => Some(c.name.as_str()),
            _ => None,
        })
        .collect();
    let (true, Some(groups)) = (row_wise, groups) else {
        return Ok(None);
    };
    let merging = |e: &Expr| -> Option<&'static str> {
        let e = match e {
            Expr::Alias(a) => a.expr.as_ref(),
            e => e,
        };
        let Expr::AggregateFunction(f) = e else {
            return None;
        };
        let p = &f.params;
        if p.distinct || p.filter.is_some() || !p.order_by.is_empty() {
            return None;
        }
        match f.func.name() {
            "max" => Some("MAX"),
            "min" => Some("MIN"),
            "sum" | "count" => Some("SUM"),
            _ => None,
        }
    };
    let merges: Option<Vec<&str>> = a.aggr_expr.iter().map(merging).collect();
    let (false, Some(merges)) = (groups.is_empty(), merges) else {
        return Ok(None);
    };
    let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let mut select = vec![];
    let mut selected = vec![false; groups.len()];
    for (e, field) in p.expr.iter().zip(output.fields()) {
        // `COUNT(*) AS n` is `count(Int64(1)) AS count(*) AS n`: aliases of aliases.
        let mut e = e;
        while let Expr::Alias(al) = e {
            e = al.expr.as_ref();
        }
        let Expr::Column(column) = e else {
            return Ok(None);
        };
        let Ok(i) = a.schema.index_of_column(column) else {
            return Ok(None);
        };
        let name = field.name();
        match i.checked_sub(groups.len()) {
            None if groups[i] == name => {
                selected[i] = true;
                select.push(q(name));
            }
            None => return Ok(None),
            Some(j) => select.push(format!("{}({}) AS {}", merges[j], q(name), q(name))),
        }
    }
    if selected.contains(&false) {
        return Ok(None);
    }
    let by: Vec<String> = groups.iter().map(|g| q(g)).collect();
    let merge = format!(
        "SELECT {} FROM PCOLLECTION GROUP BY {}",
        select.join(", "),
        by.join(", ")
    );
    let merged = plan_schema(
        &merge,
        &[("PCOLLECTION".into(), String::new(), output.clone())],
    )
    .await?;
    Ok(same_fields(&merged, &output).then_some(merge))
}

/// Whether two schemas have the same fields by name and type, in order (nullability aside:
/// queries differ in what they call nullable).
fn same_fields(x: &arrow::datatypes::Schema, y: &arrow::datatypes::Schema) -> bool {
    x.fields().len() == y.fields().len()
        && x.fields()
            .iter()
            .zip(y.fields())
            .all(|(m, o)| m.name() == o.name() && m.data_type() == o.data_type())
}

/// Whether a query has nothing around its body: no WITH, ORDER BY, LIMIT, FETCH or pipe.
fn nothing_around(q: &datafusion::sql::sqlparser::ast::Query) -> bool {
    q.with.is_none()
        && q.order_by.is_none()
        && q.limit_clause.is_none()
        && q.fetch.is_none()
        && q.pipe_operators.is_empty()
}

/// The SELECT of a query with nothing around it (no WITH, ORDER BY, LIMIT, FETCH or pipe)
/// and nothing in it that picks among rows beyond its groups (no DISTINCT, TOP, QUALIFY,
/// named window or HAVING).
fn plain_select(
    q: &datafusion::sql::sqlparser::ast::Query,
) -> Option<&datafusion::sql::sqlparser::ast::Select> {
    use datafusion::sql::sqlparser::ast::SetExpr;
    let around = nothing_around(q);
    let SetExpr::Select(s) = q.body.as_ref() else {
        return None;
    };
    let within = s.having.is_none()
        && s.distinct.is_none()
        && s.top.is_none()
        && s.qualify.is_none()
        && s.named_window.is_empty();
    (around && within).then_some(s.as_ref())
}

/// How a streaming query over the global window that aggregates another group aggregate's
/// rows keeps its state incrementally (Flink's retracting group aggregation): Nexmark Q4's
/// `SELECT category, AVG(final) FROM (SELECT id, category, MAX(price) AS final FROM t GROUP BY
/// id, category) GROUP BY category`. Each shard keeps the inner query's rows, one per inner
/// group (merged as `merge_query` merges them), and per outer group the running sums and
/// counts of its aggregates; a firing replaces the touched inner groups' old rows by their new
/// ones in those sums (the old row's part taken out, the new one's added) rather than
/// running the query over every inner row of the touched outer groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NestedAggregate {
    /// The inner group aggregate, over the query's own table.
    pub inner: String,
    /// Merges the inner query's rows by its groups, over `PCOLLECTION` (`merge_query`).
    pub inner_merge: String,
    /// The inner query's group fields: its rows' key.
    pub inner_groups: Vec<String>,
    /// The inner query's rows.
    pub inner_schema: SchemaRef,
    /// Each inner row's part of its outer group's sums, over tables `NOW` (added) and `BEFORE`
    /// (taken out), both of inner rows: the outer group fields, then `n` (rows), then per
    /// aggregate its sum `s<j>` (AVG, SUM) and count `c<j>`.
    pub parts: String,
    /// Merges parts by outer group (sums of sums), over `PCOLLECTION`.
    pub sums: String,
    /// The parts' and the sums' rows.
    pub sums_schema: SchemaRef,
    /// The query's result from the summed parts, over `PCOLLECTION`: each outer group that
    /// has rows, with its aggregates.
    pub finish: String,
}

impl NestedAggregate {
    /// How the state is kept, as a snapshot's signature and a shard's recorded form name it.
    pub fn form(&self) -> String {
        format!("{} then {}", self.inner_merge, self.sums)
    }
}

/// Whether `query` (over one table) is an AVG, SUM or COUNT over another group aggregate's
/// rows that can be kept incrementally ([`NestedAggregate`]): `SELECT <outer groups and
/// aggregates> FROM (<inner>) [alias] GROUP BY <outer groups>`, nothing else at the outer level
/// (no WHERE, HAVING, ORDER BY, LIMIT, DISTINCT, expression of an aggregate), the inner query
/// one that [`merge_query`] merges, the outer groups among the inner's, every outer
/// aggregate an AVG, SUM or COUNT without DISTINCT, FILTER or ORDER BY of one of the inner
/// query's integer or floating-point fields (or COUNT(*)), and the result of the parts'
/// queries the query's own schema.
pub async fn nested_query(
    query: &str,
    tables: &[(String, String, SchemaRef)],
) -> Result<Option<NestedAggregate>, String> {
    use arrow::datatypes::DataType;
    use datafusion::logical_expr::{Expr, LogicalPlan};
    use datafusion::sql::sqlparser::ast::{GroupByExpr, Statement, TableFactor};
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    if tables.len() != 1 {
        return Ok(None);
    }
    // The inner query's text, from the outer's one FROM.
    let Ok(statements) = Parser::parse_sql(&GenericDialect {}, query) else {
        return Ok(None);
    };
    let [Statement::Query(q)] = statements.as_slice() else {
        return Ok(None);
    };
    let Some(select) = plain_select(q) else {
        return Ok(None);
    };
    let inner = match select.from.as_slice() {
        [t] if t.joins.is_empty() => match &t.relation {
            TableFactor::Derived {
                lateral: false,
                subquery,
                ..
            } => subquery.to_string(),
            _ => return Ok(None),
        },
        _ => return Ok(None),
    };
    let simple = select.selection.is_none()
        && matches!(&select.group_by, GroupByExpr::Expressions(g, m) if !g.is_empty() && m.is_empty());
    if !simple {
        return Ok(None);
    }
    let Some(inner_merge) = merge_query(&inner, tables).await? else {
        return Ok(None);
    };
    let inner_schema = plan_schema(&inner, tables).await?;
    let inner_groups = match planned(&inner, tables).await?.into_unoptimized_plan() {
        LogicalPlan::Projection(p) => match p.input.as_ref() {
            LogicalPlan::Aggregate(a) => a
                .group_expr
                .iter()
                .map(|e| match e {
                    Expr::Column(c) => Some(c.name.clone()),
                    _ => None,
                })
                .collect::<Option<Vec<String>>>(),
            _ => None,
        },
        _ => None,
    };
    let Some(inner_groups) = inner_groups else {
        return Ok(None);
    };

    // The outer level: a projection of one aggregate over the inner query's rows.
    let df = planned(query, tables).await?;
    let output = Arc::new(df.schema().as_arrow().clone());
    let LogicalPlan::Projection(p) = df.into_unoptimized_plan() else {
        return Ok(None);
    };
    let LogicalPlan::Aggregate(a) = p.input.as_ref() else {
        return Ok(None);
    };
    let column = |e: &Expr| match e {
        Expr::Column(c) => Some(c.name.clone()),
        _ => None,
    };
    let groups: Option<Vec<String>> = a.group_expr.iter().map(column).collect();
    let Some(groups) = groups.filter(|g| g.iter().all(|g| inner_groups.contains(g))) else {
        return Ok(None);
    };
    /// An outer aggregate: its function and the inner field it reads (`None`: COUNT(*)).
    enum Outer {
        Avg(String),
        Sum(String),
        Count(Option<String>),
    }
    let numeric = |name: &str| {
        inner_schema
            .field_with_name(name)
            .is_ok_and(|f| match f.data_type() {
                // Summed as a BIGINT: every integer but the unsigned ones past its range.
                DataType::UInt64 => false,
                t => t.is_integer() || t.is_floating(),
            })
    };
    let mut outers = vec![];
    for e in &a.aggr_expr {
        let e = match e {
            Expr::Alias(al) => al.expr.as_ref(),
            e => e,
        };
        let Expr::AggregateFunction(f) = e else {
            return Ok(None);
        };
        let params = &f.params;
        if params.distinct || params.filter.is_some() || !params.order_by.is_empty() {
            return Ok(None);
        }
        let arg = match params.args.as_slice() {
            [Expr::Column(c)] if numeric(&c.name) => Some(c.name.clone()),
            [Expr::Literal(..)] if f.func.name() == "count" => None,
            _ => return Ok(None),
        };
        outers.push(match (f.func.name(), arg) {
            ("avg", Some(c)) => Outer::Avg(c),
            ("sum", Some(c)) => Outer::Sum(c),
            ("count", c) => Outer::Count(c),
            _ => return Ok(None),
        });
    }
    let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let by: Vec<String> = groups.iter().map(|g| q(g)).collect();
    // Parts: `sign` is 1 for NOW's rows and -1 for BEFORE's.
    let parts_of = |table: &str, sign: &str| {
        let mut cols = by.clone();
        cols.push(format!("CAST({sign} AS BIGINT) AS \"n\""));
        for (j, o) in outers.iter().enumerate() {
            let (sum, count) = match o {
                Outer::Avg(c) | Outer::Sum(c) => (Some(c), Some(c)),
                Outer::Count(c) => (None, c.as_ref()),
            };
            if let Some(c) = sum {
                let t = match inner_schema
                    .field_with_name(c)
                    .map(|f| f.data_type().is_integer())
                {
                    Ok(true) => "BIGINT",
                    _ => "DOUBLE",
                };
                cols.push(format!("{sign} * CAST({} AS {t}) AS \"s{j}\"", q(c)));
            }
            cols.push(match count {
                Some(c) => format!(
                    "CAST(CASE WHEN {} IS NULL THEN 0 ELSE {sign} END AS BIGINT) AS \"c{j}\"",
                    q(c)
                ),
                None => format!("CAST({sign} AS BIGINT) AS \"c{j}\""),
            });
        }
        format!("SELECT {} FROM {table}", cols.join(", "))
    };
    let parts = format!(
        "{} UNION ALL {}",
        parts_of("NOW", "1"),
        parts_of("BEFORE", "-1")
    );
    let mut summed = by.clone();
    summed.push("SUM(\"n\") AS \"n\"".into());
    for (j, o) in outers.iter().enumerate() {
        if matches!(o, Outer::Avg(_) | Outer::Sum(_)) {
            summed.push(format!("SUM(\"s{j}\") AS \"s{j}\""));
        }
        summed.push(format!("SUM(\"c{j}\") AS \"c{j}\""));
    }
    let sums = format!(
        "SELECT {} FROM PCOLLECTION GROUP BY {}",
        summed.join(", "),
        by.join(", ")
    );
    // The result's fields in the query's order: a group under its own name, an aggregate
    // from its sums.
    let mut finish = vec![];
    for (e, field) in p.expr.iter().zip(output.fields()) {
        let mut e = e;
        while let Expr::Alias(al) = e {
            e = al.expr.as_ref();
        }
        let Expr::Column(c) = e else {
            return Ok(None);
        };
        let Ok(i) = a.schema.index_of_column(c) else {
            return Ok(None);
        };
        let name = q(field.name());
        finish.push(match i.checked_sub(groups.len()) {
            None if &groups[i] == field.name() => name,
            None => return Ok(None),
            Some(j) => match outers[j] {
                Outer::Avg(_) => format!(
                    "CASE WHEN \"c{j}\" = 0 THEN NULL ELSE CAST(\"s{j}\" AS DOUBLE) / CAST(\"c{j}\" AS DOUBLE) END AS {name}"
                ),
                Outer::Sum(_) => {
                    format!("CASE WHEN \"c{j}\" = 0 THEN NULL ELSE \"s{j}\" END AS {name}")
                }
                Outer::Count(_) => format!("\"c{j}\" AS {name}"),
            },
        });
    }
    let finish = format!(
        "SELECT {} FROM PCOLLECTION WHERE \"n\" > 0",
        finish.join(", ")
    );
    // Checked as planned: the parts merge into themselves, and finish gives the query's schema.
    let inner_table = |n: &str| (n.to_string(), String::new(), inner_schema.clone());
    let part_schema = plan_schema(&parts, &[inner_table("NOW"), inner_table("BEFORE")]).await?;
    let pc = |s: &SchemaRef| [("PCOLLECTION".to_string(), String::new(), s.clone())];
    let summed_schema = plan_schema(&sums, &pc(&part_schema)).await?;
    let finished = plan_schema(&finish, &pc(&summed_schema)).await?;
    let fits = same_fields(&summed_schema, &part_schema) && same_fields(&finished, &output);
    Ok(fits.then_some(NestedAggregate {
        inner,
        inner_merge,
        inner_groups,
        inner_schema,
        parts,
        sums,
        sums_schema: summed_schema,
        finish,
    }))
}

/// The rows a query keeps of its one table's: those whose `field` is the table's greatest
/// (`max`) or least. A windowed streaming query of that shape keeps only such rows of each
/// window as they arrive (`riverbank_streaming::sql_shard`): a row another row has beaten can
/// never be in the result, so the window's firing reads a few rows rather than all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extreme {
    pub field: String,
    pub max: bool,
}

/// Whether `query` is `SELECT <row-wise expressions> FROM t WHERE f = (SELECT MAX(f) FROM t)`
/// (or MIN, or the sides swapped) over its one table, `f` a field that is neither floating
/// point (SQL's equality of -0.0 and 0.0 is not the order's) nor nested; nothing else (no
/// other condition, grouping, DISTINCT, ORDER BY, LIMIT, window function): Nexmark Q7's
/// highest bids. Such a query over a set of rows gives what it gives over the rows with the
/// greatest `f` alone.
pub async fn extreme_rows(
    query: &str,
    tables: &[(String, String, SchemaRef)],
) -> Result<Option<Extreme>, String> {
    use datafusion::logical_expr::LogicalPlan;
    use datafusion::sql::sqlparser::ast::{
        BinaryOperator, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr, Query,
        SelectItem, Statement, TableFactor,
    };
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    let [(table, _, schema)] = tables else {
        return Ok(None);
    };
    let Ok(statements) = Parser::parse_sql(&GenericDialect {}, query) else {
        return Ok(None);
    };
    let [Statement::Query(q)] = statements.as_slice() else {
        return Ok(None);
    };
    // One plain SELECT over the table alone, and its WHERE.
    fn select_of<'q>(
        q: &'q Query,
        table: &str,
    ) -> Option<&'q datafusion::sql::sqlparser::ast::Select> {
        let s = plain_select(q)?;
        let one_table = matches!(s.from.as_slice(), [t] if t.joins.is_empty()
            && matches!(&t.relation, TableFactor::Table { name, args: None, .. }
                if name.to_string().eq_ignore_ascii_case(table)));
        let ungrouped =
            matches!(&s.group_by, GroupByExpr::Expressions(g, m) if g.is_empty() && m.is_empty());
        (one_table && ungrouped).then_some(s)
    }
    let Some(outer) = select_of(q, table) else {
        return Ok(None);
    };
    let Some(Expr::BinaryOp {
        left,
        op: BinaryOperator::Eq,
        right,
    }) = &outer.selection
    else {
        return Ok(None);
    };
    let (field, sub) = match (left.as_ref(), right.as_ref()) {
        (Expr::Identifier(f), Expr::Subquery(sub)) | (Expr::Subquery(sub), Expr::Identifier(f)) => {
            (f, sub)
        }
        _ => return Ok(None),
    };
    // The subquery: MAX or MIN of that field over the whole table.
    let Some(inner) = select_of(sub, table).filter(|s| s.selection.is_none()) else {
        return Ok(None);
    };
    let [SelectItem::UnnamedExpr(Expr::Function(f))] = inner.projection.as_slice() else {
        return Ok(None);
    };
    let max = match f.name.to_string().to_ascii_uppercase().as_str() {
        "MAX" => true,
        "MIN" => false,
        _ => return Ok(None),
    };
    let FunctionArguments::List(args) = &f.args else {
        return Ok(None);
    };
    // Names as written: Riverbank's SQL does not fold unquoted names (`session_config`).
    let norm = |i: &datafusion::sql::sqlparser::ast::Ident| i.value.clone();
    let same_field = args.duplicate_treatment.is_none()
        && args.clauses.is_empty()
        && f.filter.is_none()
        && f.over.is_none()
        && f.within_group.is_empty()
        && matches!(args.args.as_slice(), [FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Identifier(a)))]
            if norm(a) == norm(field));
    if !same_field {
        return Ok(None);
    }
    let name = norm(field);
    let ordered = schema.field_with_name(&name).is_ok_and(|f| {
        let t = f.data_type();
        !t.is_floating() && !t.is_nested()
    });
    // Row-wise above the filter: a projection, no aggregate, window function or other
    // subquery.
    let subqueries = query.to_ascii_uppercase().matches("SELECT").count();
    let row_wise = subqueries == 2
        && match planned(query, tables).await?.into_unoptimized_plan() {
            LogicalPlan::Projection(p) => matches!(p.input.as_ref(), LogicalPlan::Filter(_)),
            _ => false,
        };
    Ok((ordered && row_wise).then_some(Extreme { field: name, max }))
}

/// The tables `query` reads only as sets of distinct rows: every read of them is under a
/// DISTINCT, or a GROUP BY whose aggregates are MIN and MAX, through nothing but projections,
/// filters and aliases (Nexmark Q8's `SELECT DISTINCT seller FROM A`), so rows repeated in
/// them cannot change its result. None when an expression holds a subquery.
pub async fn set_tables(
    query: &str,
    tables: &[(String, String, SchemaRef)],
) -> Result<Vec<String>, String> {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    use datafusion::logical_expr::{Distinct, Expr, LogicalPlan};
    /// Whether each scan is read as a set: `set` says the nodes above made it one.
    fn visit(plan: &LogicalPlan, set: bool, scans: &mut Vec<(String, bool)>) {
        let duplicate_blind = |e: &Expr| {
            let e = match e {
                Expr::Alias(a) => a.expr.as_ref(),
                e => e,
            };
            matches!(e, Expr::AggregateFunction(f)
                if matches!(f.func.name(), "max" | "min") && f.params.filter.is_none())
        };
        let below = match plan {
            LogicalPlan::TableScan(t) => {
                scans.push((t.table_name.table().to_string(), set));
                return;
            }
            LogicalPlan::Distinct(Distinct::All(_)) => true,
            LogicalPlan::Aggregate(a) => a.aggr_expr.iter().all(duplicate_blind),
            LogicalPlan::Projection(_) | LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) => {
                set
            }
            _ => false,
        };
        for input in plan.inputs() {
            visit(input, below, scans);
        }
    }
    let plan = planned(query, tables).await?.into_unoptimized_plan();
    let mut subqueries = false;
    plan.apply(|node| {
        node.apply_expressions(|e| {
            subqueries |= e
                .exists(|e| {
                    Ok(matches!(
                        e,
                        Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_)
                    ))
                })
                .unwrap_or(true);
            Ok(TreeNodeRecursion::Continue)
        })
    })
    .map_err(|e| e.to_string())?;
    if subqueries {
        return Ok(vec![]);
    }
    let mut scans = vec![];
    visit(&plan, false, &mut scans);
    Ok(tables
        .iter()
        .map(|(name, _, _)| name)
        .filter(|name| {
            let reads: Vec<bool> = scans
                .iter()
                .filter(|(t, _)| t == *name)
                .map(|(_, set)| *set)
                .collect();
            !reads.is_empty() && reads.iter().all(|s| *s)
        })
        .cloned()
        .collect())
}

/// The rows of `now` that `before` does not have, as multisets (a row `before` has twice is
/// taken out of `now` twice): what a query's result gained between two of its runs.
pub fn changed_rows(
    now: Vec<RecordBatch>,
    before: &[RecordBatch],
) -> Result<Vec<RecordBatch>, String> {
    use arrow::row::{RowConverter, SortField};
    let Some(first) = now.first() else {
        return Ok(vec![]);
    };
    if before.is_empty() {
        return Ok(now);
    }
    let conv = RowConverter::new(
        first
            .schema()
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect(),
    )
    .map_err(|e| e.to_string())?;
    let mut had: HashMap<Box<[u8]>, usize> = HashMap::new();
    for b in before {
        let rows = conv
            .convert_columns(b.columns())
            .map_err(|e| e.to_string())?;
        for r in rows.iter() {
            *had.entry(r.as_ref().into()).or_default() += 1;
        }
    }
    let mut out = vec![];
    for b in now {
        let rows = conv
            .convert_columns(b.columns())
            .map_err(|e| e.to_string())?;
        let mut keep = vec![];
        for (i, r) in rows.iter().enumerate() {
            match had.get_mut(r.as_ref()) {
                Some(n) if *n > 0 => *n -= 1,
                _ => keep.push(i as u32),
            }
        }
        if keep.len() == b.num_rows() {
            out.push(b);
        } else if !keep.is_empty() {
            let idx = arrow::array::UInt32Array::from(keep);
            out.push(arrow::compute::take_record_batch(&b, &idx).map_err(|e| e.to_string())?);
        }
    }
    Ok(out)
}

/// The fields of each table that `query` reads (as the optimizer pushes its projections down
/// to the table scans), by table order, each in its table's field order; a table read for its
/// row count alone keeps its first field, so its rows still count.
pub async fn read_columns(
    query: &str,
    tables: &[(String, String, SchemaRef)],
) -> Result<Vec<Vec<String>>, String> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    use datafusion::logical_expr::LogicalPlan;
    let df = planned(query, tables).await?;
    let (state, plan) = df.into_parts();
    let plan = state.optimize(&plan).map_err(|e| e.to_string())?;
    let mut read: Vec<Vec<bool>> = tables
        .iter()
        .map(|(_, _, s)| vec![false; s.fields().len()])
        .collect();
    plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            let Some(i) = tables
                .iter()
                .position(|(name, _, _)| name == scan.table_name.table())
            else {
                return Ok(TreeNodeRecursion::Continue);
            };
            match &scan.projection {
                Some(p) => p.iter().for_each(|&c| read[i][c] = true),
                None => read[i].iter_mut().for_each(|r| *r = true),
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(|e| e.to_string())?;
    Ok(tables
        .iter()
        .zip(read)
        .map(|((_, _, schema), read)| {
            let mut cols: Vec<String> = schema
                .fields()
                .iter()
                .zip(&read)
                .filter(|(_, r)| **r)
                .map(|(f, _)| f.name().clone())
                .collect();
            if cols.is_empty() {
                cols.extend(schema.fields().first().map(|f| f.name().clone()));
            }
            cols
        })
        .collect())
}

/// Runs `query` once over in-memory tables (name, user schema, batches).
pub async fn run_once(
    query: &str,
    tables: Vec<(String, SchemaRef, Vec<RecordBatch>)>,
) -> Result<Vec<RecordBatch>, String> {
    let mut read = vec![];
    for (name, schema, batches) in tables {
        let batches = as_tables(&name, &batches, &schema)?;
        // What MemTable checks: each batch's fields are the table's.
        if let Some(b) = batches.iter().find(|b| !schema.contains(&b.schema())) {
            return Err(format!(
                "table '{name}': rows of schema {} where the table has {}",
                b.schema(),
                schema
            ));
        }
        read.push((name, schema, batches));
    }
    crate::query_cache::run(query, read).await
}

/// [`run_once`] in a given context (its tables replaced): a context is costly to make, and
/// a query per window reuses one.
async fn run_in(
    ctx: &SessionContext,
    query: &str,
    tables: Vec<(String, SchemaRef, Vec<RecordBatch>)>,
) -> Result<Vec<RecordBatch>, String> {
    for (name, schema, batches) in tables {
        let batches = as_tables(&name, &batches, &schema)?;
        let t = MemTable::try_new(schema, vec![batches]).map_err(|e| e.to_string())?;
        ctx.deregister_table(table_name(&name))
            .map_err(|e| e.to_string())?;
        ctx.register_table(table_name(&name), Arc::new(t))
            .map_err(|e| e.to_string())?;
    }
    let df = ctx.sql(query).await.map_err(|e| e.to_string())?;
    df.collect().await.map_err(|e| e.to_string())
}

/// Table `name`'s rows with its fields ([`as_table`]).
fn as_tables(
    name: &str,
    batches: &[RecordBatch],
    schema: &arrow::datatypes::Schema,
) -> Result<Vec<RecordBatch>, String> {
    batches
        .iter()
        .map(|b| as_table(b, schema).map_err(|e| format!("table '{name}': {e}")))
        .collect()
}

/// `b` with the fields of `schema`, by name: rows kept with more fields than their table has now
/// (state written before its query read fewer) are read as the table.
fn as_table(b: &RecordBatch, schema: &arrow::datatypes::Schema) -> Result<RecordBatch, String> {
    if b.schema().fields() == schema.fields() {
        return Ok(b.clone());
    }
    let at = schema
        .fields()
        .iter()
        .map(|f| b.schema().index_of(f.name()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("kept rows lack a field the query reads: {e}"))?;
    b.project(&at).map_err(|e| e.to_string())
}

/// `query` grouping by the window too, when that gives each window's result in one run: the
/// query is one `SELECT ... FROM table [WHERE ...] GROUP BY ...` over one table (nothing that
/// compares groups or sees other rows: no subquery, DISTINCT, ORDER BY, LIMIT or window
/// function), so adding the window
/// bounds to its groups (and its output, last) keeps the windows apart. `None`: run it per
/// window.
fn grouped_by_window(query: &str) -> Option<String> {
    use datafusion::sql::sqlparser::ast::{
        Expr, GroupByExpr, Ident, SelectItem, SetExpr, Statement, TableFactor,
    };
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    use riverbank_elements::columns::{WINDOW_END, WINDOW_START};
    // A subquery anywhere (FROM, WHERE, the projection) would see every window's rows at once.
    if query.to_ascii_uppercase().matches("SELECT").count() != 1 {
        return None;
    }
    let mut statements = Parser::parse_sql(&GenericDialect {}, query).ok()?;
    let [Statement::Query(q)] = statements.as_mut_slice() else {
        return None;
    };
    let plain = nothing_around(q);
    let SetExpr::Select(select) = q.body.as_mut() else {
        return None;
    };
    let one_table = matches!(select.from.as_slice(), [t]
        if t.joins.is_empty() && matches!(t.relation, TableFactor::Table { .. }));
    let GroupByExpr::Expressions(groups, modifiers) = &mut select.group_by else {
        return None;
    };
    let projection = select
        .projection
        .iter()
        .map(|p| p.to_string().to_ascii_uppercase())
        .collect::<Vec<_>>()
        .join(",");
    let simple = plain
        && one_table
        && !groups.is_empty()
        && modifiers.is_empty()
        && select.distinct.is_none()
        && select.top.is_none()
        && select.named_window.is_empty()
        && select.qualify.is_none()
        && !projection.contains(" OVER");
    if !simple {
        return None;
    }
    for name in [WINDOW_START, WINDOW_END] {
        groups.push(Expr::Identifier(Ident::new(name)));
        select
            .projection
            .push(SelectItem::UnnamedExpr(Expr::Identifier(Ident::new(name))));
    }
    Some(statements[0].to_string())
}

/// Runs `query` once per window of its (windowed) inputs, as Beam SQL aggregates per window.
/// `tables` hold full batches (with window columns); results carry their window and the
/// end-of-window timestamp, in `output_schema`. Batches without window columns (a side input
/// beside the windowed ones) are in every window's tables.
pub async fn run_windowed(
    query: &str,
    tables: Vec<(String, SchemaRef, Vec<RecordBatch>)>,
    output_schema: SchemaRef,
) -> Result<Vec<RecordBatch>, String> {
    use arrow::array::{BooleanArray, TimestampMicrosecondArray};
    use riverbank_elements::columns::{user_batch, window_bounds};
    fn bounds(b: &RecordBatch) -> Result<(&[i64], &[i64]), String> {
        window_bounds(b).ok_or_else(|| "input is not windowed".to_string())
    }
    // A batch of one window (a streaming shard's buffers always are) is taken whole below,
    // without a per-row set or filter.
    fn single(ws: &[i64], we: &[i64]) -> Option<(i64, i64)> {
        let (s, e) = (*ws.first()?, *we.first()?);
        (ws.iter().all(|w| *w == s) && we.iter().all(|w| *w == e)).then_some((s, e))
    }
    let side = |b: &RecordBatch| window_bounds(b).is_none();
    let has_side = tables.iter().any(|(_, _, bs)| bs.iter().any(side));
    // One run for every window, when grouping by the window keeps them apart.
    if let Some(grouped) = grouped_by_window(query).filter(|_| !has_side) {
        use riverbank_elements::columns::{WINDOW_END, WINDOW_START, ts_field};
        let mut with_windows = vec![];
        for (name, user, batches) in tables {
            let mut fields: Vec<_> = user.fields().iter().map(|f| f.as_ref().clone()).collect();
            fields.extend([ts_field(WINDOW_START), ts_field(WINDOW_END)]);
            let schema = Arc::new(arrow::datatypes::Schema::new(fields));
            let mut rows = vec![];
            for b in &batches {
                let (ws, we) = bounds(b)?;
                let mut cols = as_table(&user_batch(b), &user)?.columns().to_vec();
                for bound in [ws, we] {
                    let a = TimestampMicrosecondArray::from(bound.to_vec()).with_timezone("UTC");
                    cols.push(Arc::new(a));
                }
                rows.push(RecordBatch::try_new(schema.clone(), cols).map_err(|e| e.to_string())?);
            }
            with_windows.push((name, schema, rows));
        }
        let mut out = vec![];
        for b in run_once(&grouped, with_windows).await? {
            use arrow::array::AsArray;
            let we = b.column(b.num_columns() - 1);
            let we = we.as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
            let ts = we.unary::<_, arrow::datatypes::TimestampMicrosecondType>(|e| e - 1);
            let mut cols = b.columns().to_vec();
            cols.push(Arc::new(ts.with_timezone("UTC")));
            out.push(RecordBatch::try_new(output_schema.clone(), cols).map_err(|e| e.to_string())?);
        }
        return Ok(out);
    }
    let mut windows = std::collections::BTreeSet::new();
    for (_, _, batches) in &tables {
        for b in batches.iter().filter(|b| !side(b)) {
            let (ws, we) = bounds(b)?;
            match single(ws, we) {
                Some(w) => {
                    windows.insert(w);
                }
                None => windows.extend(ws.iter().copied().zip(we.iter().copied())),
            }
        }
    }
    let mut out = vec![];
    let ctx = SessionContext::new_with_config(session_config(1));
    for (ws, we) in windows {
        let mut window_tables = vec![];
        for (name, schema, batches) in &tables {
            let mut part = vec![];
            for b in batches {
                if side(b) {
                    part.push(user_batch(b));
                    continue;
                }
                let (s, e) = bounds(b)?;
                if let Some(w) = single(s, e) {
                    if w == (ws, we) {
                        part.push(user_batch(b));
                    }
                    continue;
                }
                let mask: BooleanArray = s
                    .iter()
                    .zip(e)
                    .map(|(a, z)| Some(*a == ws && *z == we))
                    .collect();
                let f = arrow::compute::filter_record_batch(b, &mask).map_err(|e| e.to_string())?;
                if f.num_rows() > 0 {
                    part.push(user_batch(&f));
                }
            }
            window_tables.push((name.clone(), schema.clone(), part));
        }
        for b in run_in(&ctx, query, window_tables).await? {
            let n = b.num_rows();
            let ts = |v: i64| {
                Arc::new(TimestampMicrosecondArray::from(vec![v; n]).with_timezone("UTC"))
                    as arrow::array::ArrayRef
            };
            let mut cols = b.columns().to_vec();
            cols.extend([ts(ws), ts(we), ts(we - 1)]);
            out.push(RecordBatch::try_new(output_schema.clone(), cols).map_err(|e| e.to_string())?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, Int64Array, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use riverbank_elements::columns::{TS, WINDOW_END, WINDOW_START, ts_field};

    #[test]
    fn one_grouped_select_groups_by_the_window_too_and_nothing_else_does() {
        let q = grouped_by_window("SELECT k, COUNT(*) AS n FROM t WHERE v > 1 GROUP BY k");
        assert_eq!(
            q.as_deref(),
            Some(
                "SELECT k, COUNT(*) AS n, __rb_ws, __rb_we FROM t WHERE v > 1 GROUP BY k, __rb_ws, __rb_we"
            )
        );
        for per_window in [
            "SELECT COUNT(*) AS n FROM t",
            "SELECT k, COUNT(*) AS n FROM t GROUP BY k ORDER BY n DESC LIMIT 3",
            "SELECT DISTINCT k FROM t GROUP BY k",
            "SELECT a.k, COUNT(*) FROM a JOIN b ON a.k = b.k GROUP BY a.k",
            "SELECT k, RANK() OVER (ORDER BY COUNT(*)) FROM t GROUP BY k",
            "SELECT k, n FROM (SELECT k, COUNT(*) AS n FROM t GROUP BY k) GROUP BY k, n",
            "SELECT k, COUNT(*) FROM t WHERE v > (SELECT AVG(v) FROM t) GROUP BY k",
        ] {
            assert_eq!(grouped_by_window(per_window), None, "{per_window}");
        }
    }

    /// Rows (k, v) in windows [start, start + 10): user columns and the hidden ones.
    fn windowed(rows: &[(&str, i64, i64)]) -> RecordBatch {
        let ts = |f: &dyn Fn(i64) -> i64| {
            Arc::new(
                TimestampMicrosecondArray::from_iter_values(rows.iter().map(|r| f(r.2)))
                    .with_timezone("UTC"),
            ) as arrow::array::ArrayRef
        };
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("k", DataType::Utf8, false),
                Field::new("v", DataType::Int64, false),
                ts_field(TS),
                ts_field(WINDOW_START),
                ts_field(WINDOW_END),
            ])),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                ts(&|s| s),
                ts(&|s| s),
                ts(&|s| s + 10),
            ],
        )
        .unwrap()
    }

    /// The one grouped run and the run per window give the same rows, windows and times.
    #[tokio::test]
    async fn grouping_by_the_window_gives_what_a_query_per_window_gives() {
        let user = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("v", DataType::Int64, false),
        ]));
        let input = vec![
            windowed(&[("a", 1, 0), ("a", 2, 0), ("b", 5, 0), ("a", 7, 10)]),
            windowed(&[("b", 1, 10), ("b", 1, 20)]),
        ];
        let out = |q: &str| {
            let schema = plan_schema_sync(q, &user);
            let mut fields: Vec<Field> =
                schema.fields().iter().map(|f| f.as_ref().clone()).collect();
            fields.extend([ts_field(WINDOW_START), ts_field(WINDOW_END), ts_field(TS)]);
            (q.to_string(), Arc::new(Schema::new(fields)))
        };
        let mut results = vec![];
        for q in [
            "SELECT k, SUM(v) AS s FROM t GROUP BY k",
            "SELECT k, SUM(v) AS s FROM t GROUP BY k ORDER BY k",
        ] {
            let (q, schema) = out(q);
            let batches = run_windowed(&q, vec![("t".into(), user.clone(), input.clone())], schema)
                .await
                .unwrap();
            let mut rows = vec![];
            for b in &batches {
                let n = b.num_columns();
                let t = |i: usize| {
                    b.column(i)
                        .as_primitive::<arrow::datatypes::TimestampMicrosecondType>()
                };
                for r in 0..b.num_rows() {
                    rows.push((
                        b.column(0).as_string::<i32>().value(r).to_string(),
                        b.column(1).as_primitive::<Int64Type>().value(r),
                        t(n - 3).value(r),
                        t(n - 2).value(r),
                        t(n - 1).value(r),
                    ));
                }
            }
            rows.sort();
            results.push(rows);
        }
        assert_eq!(
            results[0],
            [
                ("a".to_string(), 3, 0, 10, 9),
                ("a".to_string(), 7, 10, 20, 19),
                ("b".to_string(), 1, 10, 20, 19),
                ("b".to_string(), 1, 20, 30, 29),
                ("b".to_string(), 5, 0, 10, 9),
            ]
        );
        assert_eq!(results[0], results[1]);
    }

    #[tokio::test]
    async fn a_global_window_query_is_keyed_by_what_every_aggregate_groups_by() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("category", DataType::Int64, false),
            Field::new("price", DataType::Int64, false),
            Field::new("other", DataType::Int64, false),
        ]));
        let one = [("t".to_string(), "T".to_string(), schema.clone())];
        let keyed = [
            ("SELECT id, COUNT(*) AS n FROM t GROUP BY id", vec!["id"]),
            (
                "SELECT COUNT(*) AS n FROM t WHERE price > 3 GROUP BY id, category",
                vec!["id", "category"],
            ),
            (
                "SELECT category, id + 1 FROM t GROUP BY category, id + 1",
                vec!["category"],
            ),
            (
                "SELECT category, AVG(final) AS average FROM (SELECT id, category, MAX(price) AS final \
                 FROM t GROUP BY id, category) GROUP BY category",
                vec!["category"],
            ),
        ];
        for (q, want) in keyed {
            assert_eq!(state_keys(q, &one).await.unwrap(), [want], "{q}");
        }
        let none: Vec<Vec<String>> = vec![vec![]];
        for q in [
            "SELECT * FROM t",
            "SELECT id, COUNT(*) AS n FROM t GROUP BY id ORDER BY n LIMIT 3",
            "SELECT id, RANK() OVER (ORDER BY COUNT(*)) FROM t GROUP BY id",
            "SELECT id, COUNT(*) FROM t WHERE price > (SELECT AVG(price) FROM t) GROUP BY id",
            // The outer groups are not groups of the inner aggregate.
            "SELECT category, COUNT(*) FROM (SELECT id, MAX(category) AS category FROM t GROUP BY id) \
             GROUP BY category",
            // `category` renamed from another field on the way.
            "SELECT category, COUNT(*) FROM (SELECT other AS category, id FROM t) GROUP BY category",
            "SELECT n, COUNT(*) FROM (SELECT id, COUNT(*) AS n FROM t GROUP BY id) GROUP BY n",
        ] {
            assert_eq!(state_keys(q, &one).await.unwrap(), none, "{q}");
        }
    }

    #[tokio::test]
    async fn a_group_aggregate_of_max_min_sum_and_count_merges_by_its_own_groups() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("category", DataType::Int64, false),
            Field::new("price", DataType::Int64, false),
            Field::new("rate", DataType::Int32, false),
        ]));
        let one = [("PCOLLECTION".to_string(), "T".to_string(), schema.clone())];
        let merged = [
            (
                "SELECT id, category, MAX(price) AS final FROM PCOLLECTION GROUP BY id, category",
                r#"SELECT "id", "category", MAX("final") AS "final" FROM PCOLLECTION GROUP BY "id", "category""#,
            ),
            (
                "SELECT COUNT(*) AS n, id, MIN(price) AS low, SUM(price * 2) AS total \
                 FROM PCOLLECTION WHERE price > 3 GROUP BY id",
                r#"SELECT SUM("n") AS "n", "id", MIN("low") AS "low", SUM("total") AS "total" FROM PCOLLECTION GROUP BY "id""#,
            ),
        ];
        for (q, want) in merged {
            assert_eq!(merge_query(q, &one).await.unwrap().as_deref(), Some(want));
        }
        for q in [
            // Not merged by itself, or not a plain aggregate of the groups.
            "SELECT id, AVG(price) AS a FROM PCOLLECTION GROUP BY id",
            "SELECT id, COUNT(DISTINCT price) AS n FROM PCOLLECTION GROUP BY id",
            "SELECT id, MAX(price) + 1 AS m FROM PCOLLECTION GROUP BY id",
            "SELECT id, MAX(price) AS m FROM PCOLLECTION GROUP BY id HAVING MAX(price) > 3",
            "SELECT id AS k, MAX(price) AS m FROM PCOLLECTION GROUP BY id",
            "SELECT MAX(price) AS m FROM PCOLLECTION GROUP BY id",
            "SELECT MAX(price) AS m FROM PCOLLECTION",
            "SELECT id, MAX(price) AS m FROM PCOLLECTION GROUP BY id ORDER BY m LIMIT 3",
            "SELECT category, AVG(final) AS average FROM (SELECT id, category, MAX(price) AS final \
             FROM PCOLLECTION GROUP BY id, category) GROUP BY category",
            // A SUM of an Int32 is an Int64, and a SUM of those an Int64 again: fine; but
            // this one is not a row-by-row read.
            "SELECT id, SUM(rate) AS r FROM PCOLLECTION WHERE price > (SELECT AVG(price) FROM PCOLLECTION) GROUP BY id",
        ] {
            assert_eq!(merge_query(q, &one).await.unwrap(), None, "{q}");
        }
    }

    /// Each row of `batches` as text, sorted.
    fn sorted_rows(batches: &[RecordBatch]) -> Vec<String> {
        let mut rows = vec![];
        for b in batches {
            for r in 0..b.num_rows() {
                let cells: Vec<String> = b
                    .columns()
                    .iter()
                    .map(|c| arrow::util::display::array_value_to_string(c, r).unwrap())
                    .collect();
                rows.push(cells.join("|"));
            }
        }
        rows.sort();
        rows
    }

    #[tokio::test]
    async fn an_aggregate_over_a_group_aggregate_kept_as_sums_gives_the_querys_result() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("category", DataType::Utf8, true),
            Field::new("price", DataType::Int64, false),
            Field::new("weight", DataType::Float64, true),
        ]));
        let one = [("PCOLLECTION".to_string(), "T".to_string(), schema.clone())];
        let queries = [
            // Nexmark Q4's averages.
            "SELECT category, AVG(final) AS average FROM (SELECT id, category, MAX(price) AS final \
             FROM PCOLLECTION GROUP BY id, category) GROUP BY category",
            "SELECT COUNT(*) AS auctions, category, SUM(final) AS total, COUNT(w) AS weighed, \
             AVG(w) AS w FROM (SELECT id, category, MAX(price) AS final, MIN(weight) AS w \
             FROM PCOLLECTION WHERE price > 2 GROUP BY id, category) t GROUP BY category",
        ];
        // Rows arriving in four parts; weights in halves, so every sum is exact.
        let part = |k: i64| {
            let n = 40;
            let ids = (0..n).map(|i| (i * 7 + k * 3) % 13);
            let categories = (0..n).map(|i| match (i + k) % 4 {
                0 => None,
                c => Some(format!("c{c}")),
            });
            let prices = (0..n).map(|i| (i * 5 + k * 11) % 17);
            let weights = (0..n).map(|i| ((i + k) % 3 != 0).then_some(((i * k) % 9) as f64 / 2.0));
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(arrow::array::Int64Array::from_iter_values(ids)),
                    Arc::new(arrow::array::StringArray::from_iter(categories)),
                    Arc::new(arrow::array::Int64Array::from_iter_values(prices)),
                    Arc::new(arrow::array::Float64Array::from_iter(weights)),
                ],
            )
            .unwrap()
        };
        for query in queries {
            let nested = nested_query(query, &one).await.unwrap().expect(query);
            let run = |q: String, tables: Vec<(&'static str, SchemaRef, Vec<RecordBatch>)>| async move {
                // Each table's batches in its schema (queries differ in what they call nullable).
                let tables = tables
                    .into_iter()
                    .map(|(n, s, b)| {
                        let b = b
                            .iter()
                            .map(|b| RecordBatch::try_new(s.clone(), b.columns().to_vec()).unwrap())
                            .collect();
                        (n.to_string(), s, b)
                    })
                    .collect();
                run_once(&q, tables).await.unwrap()
            };
            let (mut all, mut inner_rows, mut sums) = (vec![], vec![], vec![]);
            for k in 0..4 {
                let new = part(k);
                all.push(new.clone());
                let fresh = run(
                    nested.inner.clone(),
                    vec![("PCOLLECTION", schema.clone(), vec![new])],
                )
                .await;
                let inner_schema = plan_schema(&nested.inner, &one).await.unwrap();
                // Every kept inner row taken out and the merged ones added: the sums' algebra.
                let mut rows = inner_rows.clone();
                rows.extend(fresh);
                let merged = run(
                    nested.inner_merge.clone(),
                    vec![("PCOLLECTION", inner_schema.clone(), rows)],
                )
                .await;
                let parts = run(
                    nested.parts.clone(),
                    vec![
                        ("NOW", inner_schema.clone(), merged.clone()),
                        ("BEFORE", inner_schema.clone(), inner_rows),
                    ],
                )
                .await;
                inner_rows = merged;
                sums.extend(parts);
                let sum_schema = plan_schema(
                    &nested.sums,
                    &[("PCOLLECTION".into(), String::new(), sums[0].schema())],
                )
                .await
                .unwrap();
                sums = run(
                    nested.sums.clone(),
                    vec![("PCOLLECTION", sum_schema.clone(), sums)],
                )
                .await;
                let kept = run(
                    nested.finish.clone(),
                    vec![("PCOLLECTION", sum_schema, sums.clone())],
                )
                .await;
                let whole = run(
                    query.to_string(),
                    vec![("PCOLLECTION", schema.clone(), all.clone())],
                )
                .await;
                assert_eq!(sorted_rows(&kept), sorted_rows(&whole), "{query}, part {k}");
                assert!(!sorted_rows(&whole).is_empty());
            }
        }
        for q in [
            // Not over a group aggregate that merges, or more than its aggregates' sums.
            "SELECT category, AVG(final) AS a FROM (SELECT id, category, AVG(price) AS final \
             FROM PCOLLECTION GROUP BY id, category) GROUP BY category",
            "SELECT category, MAX(final) AS a FROM (SELECT id, category, MAX(price) AS final \
             FROM PCOLLECTION GROUP BY id, category) GROUP BY category",
            "SELECT category, AVG(final) + 1 AS a FROM (SELECT id, category, MAX(price) AS final \
             FROM PCOLLECTION GROUP BY id, category) GROUP BY category",
            "SELECT category, AVG(final) AS a FROM (SELECT id, category, MAX(price) AS final \
             FROM PCOLLECTION GROUP BY id, category) WHERE final > 3 GROUP BY category",
            "SELECT category, AVG(final) AS a FROM (SELECT id, category, MAX(price) AS final \
             FROM PCOLLECTION GROUP BY id, category) GROUP BY category HAVING COUNT(*) > 1",
            "SELECT final, COUNT(*) AS a FROM (SELECT id, category, MAX(price) AS final \
             FROM PCOLLECTION GROUP BY id, category) GROUP BY final",
            "SELECT category, COUNT(DISTINCT final) AS a FROM (SELECT id, category, MAX(price) AS final \
             FROM PCOLLECTION GROUP BY id, category) GROUP BY category",
            "SELECT category, AVG(price) AS a FROM PCOLLECTION GROUP BY category",
        ] {
            assert_eq!(nested_query(q, &one).await.unwrap(), None, "{q}");
        }
    }

    #[tokio::test]
    async fn a_query_of_the_rows_with_the_greatest_field_keeps_only_those() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("auction", DataType::Int64, false),
            Field::new("price", DataType::Int64, true),
            Field::new("weight", DataType::Float64, false),
            Field::new("dateTime", DataType::Int64, false),
        ]));
        let one = [("PCOLLECTION".to_string(), "T".to_string(), schema.clone())];
        let max = |field: &str| {
            Some(Extreme {
                field: field.into(),
                max: true,
            })
        };
        let cases = [
            // Nexmark Q7.
            (
                "SELECT auction, price, \"dateTime\" FROM PCOLLECTION WHERE price = (SELECT MAX(price) FROM PCOLLECTION)",
                max("price"),
            ),
            (
                "SELECT auction * 2 AS a FROM PCOLLECTION WHERE (SELECT MIN(\"dateTime\") FROM PCOLLECTION) = \"dateTime\"",
                Some(Extreme {
                    field: "dateTime".into(),
                    max: false,
                }),
            ),
            (
                "SELECT * FROM PCOLLECTION WHERE price = (SELECT max(price) FROM PCOLLECTION)",
                max("price"),
            ),
            // Anything else that could see the other rows, or another field.
            (
                "SELECT auction FROM PCOLLECTION WHERE price = (SELECT MAX(auction) FROM PCOLLECTION)",
                None,
            ),
            (
                "SELECT auction FROM PCOLLECTION WHERE price = (SELECT MAX(price) FROM PCOLLECTION WHERE auction > 1)",
                None,
            ),
            (
                "SELECT auction FROM PCOLLECTION WHERE price = (SELECT MAX(price) FROM PCOLLECTION) ORDER BY auction LIMIT 1",
                None,
            ),
            (
                "SELECT COUNT(*) AS n FROM PCOLLECTION WHERE price = (SELECT MAX(price) FROM PCOLLECTION)",
                None,
            ),
            (
                "SELECT auction, (SELECT COUNT(*) FROM PCOLLECTION) AS n FROM PCOLLECTION WHERE price = (SELECT MAX(price) FROM PCOLLECTION)",
                None,
            ),
            (
                "SELECT DISTINCT auction FROM PCOLLECTION WHERE price = (SELECT MAX(price) FROM PCOLLECTION)",
                None,
            ),
            (
                "SELECT auction FROM PCOLLECTION WHERE price >= (SELECT MAX(price) FROM PCOLLECTION)",
                None,
            ),
            (
                "SELECT auction FROM PCOLLECTION WHERE auction > 3 AND price = (SELECT MAX(price) FROM PCOLLECTION)",
                None,
            ),
            (
                "SELECT auction FROM PCOLLECTION WHERE weight = (SELECT MAX(weight) FROM PCOLLECTION)",
                None,
            ),
            (
                "SELECT auction, SUM(price) OVER () AS s FROM PCOLLECTION WHERE price = (SELECT MAX(price) FROM PCOLLECTION)",
                None,
            ),
        ];
        for (q, want) in cases {
            assert_eq!(extreme_rows(q, &one).await.unwrap(), want, "{q}");
        }
    }

    #[tokio::test]
    async fn tables_read_only_under_distinct_are_read_as_sets() {
        let f = |names: &[&str]| {
            Arc::new(Schema::new(
                names
                    .iter()
                    .map(|n| Field::new(*n, DataType::Int64, false))
                    .collect::<Vec<_>>(),
            ))
        };
        let two = [
            ("P".to_string(), "p".to_string(), f(&["id", "name"])),
            ("A".to_string(), "a".to_string(), f(&["seller", "price"])),
        ];
        let cases: [(&str, &[&str]); 7] = [
            // Nexmark Q8.
            (
                "SELECT P.id, P.name FROM (SELECT DISTINCT id, name FROM P) P JOIN (SELECT DISTINCT seller FROM A) A ON P.id = A.seller",
                &["P", "A"],
            ),
            (
                "SELECT P.id FROM P JOIN (SELECT seller, MAX(price) AS m FROM A WHERE price > 1 GROUP BY seller) A ON P.id = A.seller",
                &["A"],
            ),
            (
                "SELECT DISTINCT id FROM (SELECT id FROM P UNION ALL SELECT seller AS id FROM A)",
                &[],
            ),
            (
                "SELECT seller, COUNT(*) AS n FROM (SELECT DISTINCT seller, price FROM A) GROUP BY seller",
                &["A"],
            ),
            (
                "SELECT DISTINCT n FROM (SELECT seller, COUNT(*) AS n FROM A GROUP BY seller)",
                &[],
            ),
            (
                "SELECT DISTINCT id FROM P WHERE id IN (SELECT DISTINCT seller FROM A)",
                &[],
            ),
            (
                "SELECT DISTINCT id FROM (SELECT id FROM P ORDER BY id LIMIT 3)",
                &[],
            ),
        ];
        for (q, want) in cases {
            assert_eq!(set_tables(q, &two).await.unwrap(), want.to_vec(), "{q}");
        }
    }

    #[tokio::test]
    async fn a_query_reads_the_fields_it_names_of_each_table() {
        let f = |names: &[&str]| {
            Arc::new(Schema::new(
                names
                    .iter()
                    .map(|n| Field::new(*n, DataType::Int64, false))
                    .collect::<Vec<_>>(),
            ))
        };
        let tables = [
            (
                "A".to_string(),
                "a".to_string(),
                f(&["id", "category", "description", "expires"]),
            ),
            (
                "B".to_string(),
                "b".to_string(),
                f(&["auction", "price", "url", "placed"]),
            ),
        ];
        let cases: [(&str, [&[&str]; 2]); 4] = [
            (
                "SELECT A.id, MAX(B.price) FROM A JOIN B ON A.id = B.auction \
                 WHERE B.placed <= A.expires GROUP BY A.id",
                [&["id", "expires"], &["auction", "price", "placed"]],
            ),
            (
                "SELECT * FROM A",
                [&["id", "category", "description", "expires"], &["auction"]],
            ),
            // Counting rows reads no field: the first is kept, so the rows still count.
            ("SELECT COUNT(*) FROM A", [&["id"], &["auction"]]),
            (
                "SELECT category FROM A WHERE id IN (SELECT auction FROM B WHERE price > 3)",
                [&["id", "category"], &["auction", "price"]],
            ),
        ];
        for (q, want) in cases {
            let got = read_columns(q, &tables).await.unwrap();
            assert_eq!(got, want.map(|w| w.to_vec()), "{q}");
        }

        // Rows kept whole (before their query read fewer fields) are read as the table.
        let whole = RecordBatch::try_new(
            tables[1].2.clone(),
            (1..=4)
                .map(|v| Arc::new(Int64Array::from(vec![v])) as arrow::array::ArrayRef)
                .collect(),
        )
        .unwrap();
        let narrow = f(&["auction", "price"]);
        let q = "SELECT auction + price AS s FROM B";
        let out = run_once(q, vec![("B".into(), narrow.clone(), vec![whole.clone()])])
            .await
            .unwrap();
        assert_eq!(out[0].column(0).as_primitive::<Int64Type>().value(0), 3);
        let wider = f(&["auction", "price", "missing"]);
        let err = run_once(q, vec![("B".into(), wider, vec![whole])]).await;
        assert!(err.unwrap_err().contains("table 'B'"));
    }

    fn plan_schema_sync(q: &str, user: &SchemaRef) -> SchemaRef {
        let tables = [("t".to_string(), "T".to_string(), user.clone())];
        futures::executor::block_on(plan_schema(q, &tables)).unwrap()
    }
}
