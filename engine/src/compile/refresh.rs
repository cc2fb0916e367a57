//! File reads with a `refresh_interval` (Riverbank's, streaming jobs): Beam's slowly updating
//! side input. Each read of the files replaces the last in the Sql and Join that take them,
//! so their rows may reach only those, through transforms that map rows one by one; anything
//! that gathers rows (a Combine, a WindowInto, a Flatten with a stream) would take the rows of
//! every read. This pass marks each Sql/Join input that carries a refreshed read
//! (`SqlOp::refreshing`) and refuses, naming the transform, where one would go elsewhere.
use super::CompiledTransform;
use riverbank_pipeline::config::TransformConfig;
use riverbank_pipeline::{Issue, Plan};
use std::collections::HashSet;

pub(super) fn mark(plan: &Plan, out: &mut [CompiledTransform]) -> Vec<Issue> {
    let graph = &plan.graph;
    let mut issues = vec![];
    for t in &graph.transforms {
        let TransformConfig::Read(rc) = &t.config else {
            continue;
        };
        if rc.refresh_us.is_none() {
            continue;
        }
        if !plan.is_streaming() {
            issues.push(Issue {
                transform: Some(t.name.clone()),
                field: Some("refresh_interval".into()),
                message: "reads the files again and again in a streaming job; a batch job reads \
                          them once: leave refresh_interval out"
                    .into(),
            });
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
                match &r.config {
                    TransformConfig::MapToFields { .. }
                    | TransformConfig::Filter { .. }
                    | TransformConfig::Explode { .. }
                    | TransformConfig::Partition { .. }
                    | TransformConfig::AssignTimestamps { .. }
                    | TransformConfig::ExtractWindowingInfo { .. }
                    | TransformConfig::Reshuffle
                    | TransformConfig::LogForTesting { .. }
                    | TransformConfig::ValidateWithSchema { .. } => todo.extend(r.outputs()),
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
    issues
}
