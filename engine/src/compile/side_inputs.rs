//! Bounded sources beside streams (side inputs), after every transform is compiled: each
//! streaming Sql/Join input that carries only a bounded source's rows (a `Create`, a file read,
//! through transforms that map rows one by one) is marked (`SqlOp::bounded_inputs`: a
//! discarding firing keeps them), and so is each that carries a file read with a
//! `refresh_interval` (`SqlOp::refreshing`: Beam's slowly updating side input, each read
//! replacing the last in the Sql and Join that take it). A refreshed read's rows may reach only
//! those (and sinks): anything that gathers rows (a Combine, a WindowInto, a Flatten with a
//! stream) would take the rows of every read, and is refused naming the transform.
use super::CompiledTransform;
use riverbank_pipeline::config::TransformConfig;
use riverbank_pipeline::{Issue, Plan, Transform};
use std::collections::HashSet;

pub(super) fn mark(plan: &Plan, out: &mut [CompiledTransform]) -> Vec<Issue> {
    let graph = &plan.graph;
    let mut issues = vec![];
    for t in &graph.transforms {
        let refresh = match &t.config {
            TransformConfig::Read(rc) => rc.refresh_us,
            TransformConfig::Create { .. } => None,
            _ => continue,
        };
        if refresh.is_some() && !plan.is_streaming() {
            issues.push(Issue {
                transform: Some(t.name.clone()),
                field: Some("refresh_interval".into()),
                message: "reads the files again and again in a streaming job; a batch job reads \
                          them once: leave refresh_interval out"
                    .into(),
            });
            continue;
        }
        if !plan.is_streaming() {
            continue;
        }
        let mut todo = t.outputs();
        let mut seen = HashSet::new();
        while let Some(c) = todo.pop() {
            if !seen.insert(c.clone()) {
                continue;
            }
            for j in graph.consumers(&c) {
                let r = &graph.transforms[j];
                if row_by_row(r) {
                    todo.extend(r.outputs());
                    continue;
                }
                let gathers = matches!(
                    r.config,
                    TransformConfig::Sql { .. } | TransformConfig::Join { .. }
                );
                if gathers && let CompiledTransform::Sql(op) = &mut out[j] {
                    op.bounded_inputs.insert(c.clone());
                }
                if refresh.is_none() {
                    continue;
                }
                match &r.config {
                    TransformConfig::Sql { .. } | TransformConfig::Join { .. }
                        if r.inputs.len() < 2 =>
                    {
                        issues.push(Issue::at(
                            &r.name,
                            format!(
                                "its only input is '{}', read again every refresh_interval: a \
                                 refreshed read is a side input, beside a stream, of a Sql or Join",
                                t.name
                            ),
                        ));
                    }
                    TransformConfig::Sql { .. } | TransformConfig::Join { .. } => {
                        if let CompiledTransform::Sql(op) = &mut out[j] {
                            op.refreshing.insert(c.clone(), t.name.clone());
                        }
                    }
                    // A sink writes every read.
                    TransformConfig::Write(_) | TransformConfig::WriteConnector(_) => {}
                    _ => issues.push(Issue::at(
                        &r.name,
                        format!(
                            "reads the rows of '{}', which its refresh_interval reads again and \
                             again: only a Sql or Join (after transforms that map rows one by \
                             one) replaces one read's rows with the next's; a {} would take the \
                             rows of every read",
                            t.name, r.type_name
                        ),
                    )),
                }
            }
        }
    }
    // A side input is beside a stream: a query of bounded inputs alone has none.
    for ct in out.iter_mut() {
        if let CompiledTransform::Sql(op) = ct
            && op.tables.iter().all(|(_, c)| op.bounded_inputs.contains(c))
        {
            op.bounded_inputs.clear();
        }
    }
    issues
}

/// A transform that maps rows one by one: a side input's rows stay a side input's through it.
fn row_by_row(t: &Transform) -> bool {
    matches!(
        t.config,
        TransformConfig::MapToFields { .. }
            | TransformConfig::Filter { .. }
            | TransformConfig::Explode { .. }
            | TransformConfig::Partition { .. }
            | TransformConfig::AssignTimestamps { .. }
            | TransformConfig::ExtractWindowingInfo { .. }
            | TransformConfig::Reshuffle
            | TransformConfig::LogForTesting { .. }
            | TransformConfig::ValidateWithSchema { .. }
    )
}
