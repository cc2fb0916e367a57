//! Transforms that need all of their input: `Sql`, `Join` (a generated query) and `AssertEqual`.

use arrow::datatypes::{Field, Schema, SchemaRef};
use riverbank_pipeline::config::JoinType;
use riverbank_pipeline::trigger::Triggering;
use riverbank_pipeline::windowing::WindowFn;
use serde_json::Value;
use std::sync::Arc;

use super::{CompiledTransform, Cx, SqlOp, Step};
use crate::sql;
use riverbank_elements::columns::{
    TS, WINDOW_END, WINDOW_START, has_window, ts_field, user_schema,
};

pub(super) async fn sql(cx: &Cx<'_>, query: &str, windowing: &(WindowFn, Triggering)) -> Step {
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
    let (ct, schema) = sql_op(
        query.to_string(),
        tables,
        schema,
        cx.inputs,
        &windowing.1,
        session_keys,
    )
    .map_err(|m| cx.err("input", m))?;
    Ok((ct, cx.main(schema)))
}

pub(super) async fn join(
    cx: &Cx<'_>,
    join_type: &JoinType,
    equalities: &[Vec<(String, String)>],
    fields: &[(String, Vec<(String, String)>)],
    windowing: &(WindowFn, Triggering),
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
    let (ct, schema) = sql_op(query, tables, schema, cx.inputs, &windowing.1, session_keys)
        .map_err(|m| cx.err("input", m))?;
    Ok((ct, cx.main(schema)))
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

/// Every input as a table named by its tag: (table, collection id, user schema).
fn tables(cx: &Cx<'_>) -> Vec<(String, String, SchemaRef)> {
    cx.t.inputs
        .iter()
        .zip(cx.inputs)
        .map(|((tag, c), s)| (tag.clone(), c.clone(), user_schema(s)))
        .collect()
}

/// A Sql/Join op. On windowed inputs (all of them, alike) the output carries the window and
/// Beam's end-of-window timestamp, as a grouping step's output does.
fn sql_op(
    query: String,
    tables: Vec<(String, String, SchemaRef)>,
    schema: SchemaRef,
    inputs: &[SchemaRef],
    triggering: &Triggering,
    session_keys: Option<Vec<Vec<String>>>,
) -> Result<(CompiledTransform, SchemaRef), String> {
    let windowed: Vec<bool> = inputs.iter().map(|s| has_window(s)).collect();
    if windowed.iter().any(|w| *w != windowed[0]) {
        return Err("some inputs are windowed and some are not; window them alike".into());
    }
    let windowed = windowed.first().copied().unwrap_or(false);
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
            triggering: triggering.clone(),
            output_schema: output_schema.clone(),
            session_keys,
        }),
        output_schema,
    ))
}
