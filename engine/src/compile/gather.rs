//! Transforms that need all of their input: `Sql`, `Join` (a generated query) and `AssertEqual`.

use arrow::datatypes::{Field, Schema, SchemaRef};
use riverbank_pipeline::config::JoinType;
use riverbank_pipeline::trigger::{AccumulationMode, Triggering};
use riverbank_pipeline::windowing::WindowFn;
use serde_json::Value;
use std::sync::Arc;

use super::{CompiledTransform, Cx, SqlKeys, SqlOp, Step};
use crate::sql;
use riverbank_elements::columns::{
    TS, WINDOW_END, WINDOW_START, has_window, ts_field, user_schema,
};

pub(super) async fn sql(
    cx: &Cx<'_>,
    query: &str,
    windowing: &(WindowFn, Triggering),
    (keyed_state, streaming): (Option<&[Option<i64>]>, bool),
) -> Step {
    let t = cx.t;
    // An unnamed input (`input: X` or `input: [X]`, tags `input` / `input0`) is PCOLLECTION;
    // a named one (`input: {rows: X}`) keeps its name.
    let unnamed = |tag: &str| {
        tag.strip_prefix("input")
            .is_some_and(|rest| rest.chars().all(|c| c.is_ascii_digit()))
    };
    let tables: Vec<(String, String, SchemaRef)> = if t.inputs.len() == 1 && unnamed(&t.inputs[0].0)
    {
        vec![(
            "PCOLLECTION".into(),
            t.inputs[0].1.clone(),
            user_schema(&cx.inputs[0]),
        )]
    } else {
        tables(cx)
    };
    let schema = sql::plan_schema(query, &tables)
        .await
        .map_err(|m| cx.err("query", m))?;
    let session_keys = match windowing.0.is_merging() {
        true => Some(
            sql::group_keys(query, &tables)
                .await
                .map_err(|m| cx.err("query", m))?,
        ),
        false => None,
    };
    // Streaming: sessions merge by their key, the global window's state is kept by its own.
    let keyed = match (keyed_state, &session_keys) {
        (Some(_), Some(keys)) => Some(keys.clone()),
        (Some(_), None) => Some(
            sql::state_keys(query, &tables)
                .await
                .map_err(|m| cx.err("query", m))?,
        ),
        (None, _) => None,
    };
    let keyed = match (keyed, keyed_state) {
        (Some(fields), Some(ttl)) => {
            let mut keys = sql_keys(&tables, fields, ttl).map_err(|m| cx.err("query", m))?;
            // Aggregates kept in place of rows: only when every row stays (a TTL lets rows
            // go, which an aggregate cannot) and every firing adds to the last.
            let accumulating = windowing.1.accumulation == AccumulationMode::Accumulating;
            if session_keys.is_none() && accumulating && keys.ttl_us.iter().all(Option::is_none) {
                keys.merge = sql::merge_query(query, &tables)
                    .await
                    .map_err(|m| cx.err("query", m))?;
                if keys.merge.is_none() {
                    keys.nested = sql::nested_query(query, &tables)
                        .await
                        .map_err(|m| cx.err("query", m))?
                        .map(Box::new);
                }
            }
            Some(keys)
        }
        _ => None,
    };
    let columns = sql::read_columns(query, &tables)
        .await
        .map_err(|m| cx.err("query", m))?;
    // What a windowed streaming shard (`sql_shard`) may keep less of; nothing else asks.
    let windowed_state =
        streaming && keyed_state.is_none() && cx.inputs.iter().any(|s| has_window(s));
    let (set_tables, extreme) = match windowed_state {
        true => (
            sql::set_tables(query, &tables)
                .await
                .map_err(|m| cx.err("query", m))?,
            sql::extreme_rows(query, &tables)
                .await
                .map_err(|m| cx.err("query", m))?,
        ),
        false => (vec![], None),
    };
    let (mut ct, schema) = sql_op(
        query.to_string(),
        (tables, columns),
        schema,
        cx.inputs,
        &windowing.1,
        (session_keys, keyed),
    )
    .map_err(|m| cx.err("input", m))?;
    if let CompiledTransform::Sql(op) = &mut ct {
        op.extreme = extreme;
        op.set_tables = set_tables;
    }
    Ok((ct, cx.main(schema)))
}

/// A Join's config: its type, equalities and selected fields.
type JoinSpec<'a> = (
    &'a JoinType,
    &'a [Vec<(String, String)>],
    &'a [(String, Vec<(String, String)>)],
);

pub(super) async fn join(
    cx: &Cx<'_>,
    (join_type, equalities, fields): JoinSpec<'_>,
    windowing: &(WindowFn, Triggering),
    keyed_state: Option<&[Option<i64>]>,
) -> Step {
    let named: Vec<(String, SchemaRef)> =
        cx.t.inputs
            .iter()
            .zip(cx.inputs)
            .map(|((tag, _), s)| (tag.clone(), user_schema(s)))
            .collect();
    let query =
        sql::join_query(&named, join_type, equalities, fields).map_err(|m| cx.err("", m))?;
    let tables = tables(cx);
    let schema = sql::plan_schema(&query, &tables)
        .await
        .map_err(|m| cx.err("", m))?;
    let session_keys = match windowing.0.is_merging() {
        true => Some(join_keys(&named, equalities).map_err(|m| cx.err("equalities", m))?),
        false => None,
    };
    let keyed = match keyed_state {
        // Keyed by the equalities when they relate every input (sessions merge by them); else
        // all in one shard.
        Some(ttl) => {
            let fields = session_keys.clone().unwrap_or_else(|| {
                join_keys(&named, equalities).unwrap_or_else(|_| vec![vec![]; named.len()])
            });
            let mut keys = sql_keys(&tables, fields, ttl).map_err(|m| cx.err("equalities", m))?;
            keys.inner_pair =
                *join_type == JoinType::Inner && tables.len() == 2 && tables[0].1 != tables[1].1;
            Some(keys)
        }
        None => None,
    };
    let columns = sql::read_columns(&query, &tables)
        .await
        .map_err(|m| cx.err("", m))?;
    let (ct, schema) = sql_op(
        query,
        (tables, columns),
        schema,
        cx.inputs,
        &windowing.1,
        (session_keys, keyed),
    )
    .map_err(|m| cx.err("input", m))?;
    Ok((ct, cx.main(schema)))
}

/// The state keys of a streaming query over the global window: each table's key columns, and
/// each key part's type widened over the tables (an Int32 key of one input and an Int64 key of
/// another must reach the same shard).
fn sql_keys(
    tables: &[(String, String, SchemaRef)],
    fields: Vec<Vec<String>>,
    ttl_us: &[Option<i64>],
) -> Result<SqlKeys, String> {
    use arrow::datatypes::DataType;
    // Rows are routed by collection: a collection read as two tables keyed apart (a self-join
    // on different fields) cannot be; all of its rows then meet in one shard.
    let apart = tables.iter().zip(&fields).any(|((_, c, _), f)| {
        tables
            .iter()
            .zip(&fields)
            .any(|((_, c2, _), f2)| c == c2 && f != f2)
    });
    let fields = match apart {
        true => vec![vec![]; tables.len()],
        false => fields,
    };
    let parts = fields.first().map_or(0, Vec::len);
    let mut types = vec![DataType::Null; parts];
    for ((table, _, schema), keys) in tables.iter().zip(&fields) {
        for (t, name) in types.iter_mut().zip(keys) {
            let f = schema
                .field_with_name(name)
                .map_err(|_| format!("input '{table}' has no key field '{name}'"))?;
            *t = riverbank_elements::widen::unify(t, f.data_type());
        }
    }
    // A single input's TTL applies to the one table reading it.
    let ttl_us = (0..tables.len())
        .map(|i| ttl_us.get(i).copied().flatten())
        .collect();
    Ok(SqlKeys {
        fields,
        types,
        ttl_us,
        inner_pair: false,
        merge: None,
        nested: None,
    })
}

/// Each input's key fields, for merging sessions across a Join's inputs: every equality must
/// name every input (directly or by `*`), so that all inputs share one key.
fn join_keys(
    inputs: &[(String, SchemaRef)],
    equalities: &[Vec<(String, String)>],
) -> Result<Vec<Vec<String>>, String> {
    inputs
        .iter()
        .map(|(name, _)| {
            equalities
                .iter()
                .map(|eq| {
                    eq.iter()
                        .find(|(i, _)| i == name)
                        .or_else(|| eq.iter().find(|(i, _)| i == "*"))
                        .map(|(_, f)| f.clone())
                        .ok_or_else(|| {
                            format!(
                                "a Join over session windows merges sessions by its key, so \
                                 every equality must name every input, and {eq:?} does not \
                                 name '{name}'"
                            )
                        })
                })
                .collect()
        })
        .collect()
}

pub(super) fn assert_equal(elements: &[Value]) -> Step {
    Ok((
        CompiledTransform::AssertEqual {
            expected: elements.to_vec(),
        },
        vec![],
    ))
}

/// A query's tables: (table, collection id, user schema).
type Tables = Vec<(String, String, SchemaRef)>;

/// Every input as a table named by its tag.
fn tables(cx: &Cx<'_>) -> Tables {
    cx.t.inputs
        .iter()
        .zip(cx.inputs)
        .map(|((tag, c), s)| (tag.clone(), c.clone(), user_schema(s)))
        .collect()
}

/// A Sql/Join op. On windowed inputs the output carries the window and Beam's end-of-window
/// timestamp, as a grouping step's output does. Unwindowed inputs beside windowed ones are
/// side inputs: all of their rows are in every window's query (as a Beam side input in the
/// global window is seen from every window of the main input); beside session windows, in
/// every session's (the sessions merge across the windowed inputs only).
fn sql_op(
    query: String,
    (tables, columns): (Tables, Vec<Vec<String>>),
    schema: SchemaRef,
    inputs: &[SchemaRef],
    triggering: &Triggering,
    (session_keys, keyed): (Option<Vec<Vec<String>>>, Option<SqlKeys>),
) -> Result<(CompiledTransform, SchemaRef), String> {
    let each: Vec<bool> = inputs.iter().map(|s| has_window(s)).collect();
    let windowed = each.iter().any(|w| *w);
    let side_tables: Vec<String> = tables
        .iter()
        .zip(&each)
        .filter(|(_, w)| windowed && !**w)
        .map(|((name, _, _), _)| name.clone())
        .collect();
    let output_schema: SchemaRef = if windowed {
        let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.extend([ts_field(WINDOW_START), ts_field(WINDOW_END), ts_field(TS)]);
        Arc::new(Schema::new(fields))
    } else {
        schema
    };
    Ok((
        CompiledTransform::Sql(SqlOp {
            query,
            tables: tables.into_iter().map(|(n, c, _)| (n, c)).collect(),
            windowed,
            side_tables,
            triggering: triggering.clone(),
            output_schema: output_schema.clone(),
            session_keys,
            keyed,
            columns: Some(columns),
            // Filled once the whole plan is compiled (`side_inputs::mark`).
            bounded_inputs: Default::default(),
            refreshing: Default::default(),
            extreme: None,
            set_tables: vec![],
        }),
        output_schema,
    ))
}
