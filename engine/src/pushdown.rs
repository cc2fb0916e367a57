//! Projection pushdown: a source reads only the fields something downstream uses, as
//! Dataflow's and every columnar engine's planner does. Decided from compiled expressions,
//! so it needs a first compile with the sources' full schemas.
use crate::compiled::{CompiledPlan, CompiledTransform};
use crate::ops::Kind;
use datafusion::physical_expr::utils::collect_columns;
use riverbank_io::unbounded::StreamSpec;
use riverbank_pipeline::Plan;
use riverbank_pipeline::config::{StreamSourceConfig, TransformConfig};
use riverbank_udf::expr::Compiled;
use std::collections::{BTreeSet, HashMap};

/// Which user fields of a collection are needed downstream.
#[derive(Debug, Clone, PartialEq)]
enum Need {
    All,
    Fields(BTreeSet<String>),
}

impl Need {
    fn none() -> Need {
        Need::Fields(BTreeSet::new())
    }
    fn union(&mut self, other: &Need) {
        match (&mut *self, other) {
            (Need::All, _) => {}
            (_, Need::All) => *self = Need::All,
            (Need::Fields(a), Need::Fields(b)) => a.extend(b.iter().cloned()),
        }
    }
    fn with(mut self, fields: impl IntoIterator<Item = String>) -> Need {
        if let Need::Fields(s) = &mut self {
            s.extend(fields);
        }
        self
    }
}

fn refs(c: &Compiled) -> impl Iterator<Item = String> {
    collect_columns(&c.expr)
        .into_iter()
        .map(|c| c.name().to_string())
}

/// A plan whose sources read fewer columns, or `None` when every source needs all of its own.
pub fn narrow_sources(cp: &CompiledPlan) -> Option<Plan> {
    let graph = &cp.plan.graph;
    let mut need: HashMap<String, Need> = HashMap::new();
    let mut narrowed: Vec<(usize, Vec<String>)> = vec![];
    for (i, t) in graph.transforms.iter().enumerate().rev() {
        let mut out = Need::none();
        for c in t.outputs() {
            if let Some(n) = need.get(&c) {
                out.union(n);
            }
        }
        let user_fields =
            |c: &str| -> Vec<String> { cp.schemas.get(c).map_or(vec![], |s| user_fields_of(s)) };
        let input_need = if t.error_output.is_some() {
            Need::All // error rows carry the whole element
        } else {
            match &cp.transforms[i] {
                CompiledTransform::Read { source, .. } => {
                    if let Need::Fields(f) = &out {
                        let all: Vec<String> = source
                            .schema
                            .fields()
                            .iter()
                            .map(|f| f.name().clone())
                            .collect();
                        let keep: Vec<String> =
                            all.iter().filter(|n| f.contains(*n)).cloned().collect();
                        if keep.len() < all.len() && !keep.is_empty() {
                            narrowed.push((i, keep));
                        }
                    }
                    continue;
                }
                // A Nexmark reader makes only the fields used (and its event time).
                CompiledTransform::ReadStream(r) => {
                    if let (
                        Need::Fields(f),
                        StreamSpec::Generator(StreamSourceConfig::Nexmark { .. }),
                    ) = (&out, &r.spec)
                    {
                        let all = user_fields_of(&r.schema);
                        if all.iter().any(|n| n != "dateTime" && !f.contains(n)) {
                            let keep = all.into_iter().filter(|n| f.contains(n)).collect();
                            narrowed.push((i, keep));
                        }
                    }
                    continue;
                }
                // Each input: the fields its tables read.
                CompiledTransform::Sql(op) => {
                    for (_, c) in &t.inputs {
                        let n = match op.columns_of(c) {
                            Some(cols) => Need::none().with(cols.into_iter().map(str::to_string)),
                            None => Need::All,
                        };
                        need.entry(c.clone()).or_insert_with(Need::none).union(&n);
                    }
                    continue;
                }
                CompiledTransform::Element(e) => match &e.kind {
                    Kind::MapToFields { keep, fields } => {
                        let input = user_fields(&t.inputs[0].1);
                        // `drop` names fields too: they must still exist when compiled again.
                        let dropped = match &t.config {
                            TransformConfig::MapToFields { drop, .. } => drop.clone(),
                            _ => vec![],
                        };
                        Need::none()
                            .with(keep.iter().filter_map(|&k| input.get(k).cloned()))
                            .with(fields.iter().flat_map(|(_, c)| refs(c)))
                            .with(dropped)
                    }
                    Kind::Filter { keep } => out.clone().with(refs(keep)),
                    Kind::Partition { by, .. } => out.clone().with(refs(by)),
                    Kind::AssignTimestamps { timestamp } => out.clone().with(refs(timestamp)),
                    Kind::Explode { .. }
                    | Kind::LogForTesting { .. }
                    | Kind::ValidateWithSchema { .. } => Need::All,
                    Kind::WindowInto { .. } | Kind::Flatten => out.clone(),
                    Kind::MatchAll { field, .. } => Need::none().with([field.clone()]),
                    Kind::ExtractWindowingInfo { fields } => match &out {
                        Need::All => Need::All,
                        Need::Fields(f) => Need::Fields(
                            f.iter()
                                .filter(|n| !fields.iter().any(|(out, _)| out == *n))
                                .cloned()
                                .collect(),
                        ),
                    },
                },
                CompiledTransform::Combine(op) => {
                    let input = user_fields(&t.inputs[0].1);
                    Need::none()
                        .with(op.keys.iter().filter_map(|&k| input.get(k).cloned()))
                        .with(op.values.iter().flat_map(refs))
                }
                CompiledTransform::Reshuffle => out.clone(),
                _ => Need::All,
            }
        };
        for (_, c) in &t.inputs {
            need.entry(c.clone())
                .or_insert_with(Need::none)
                .union(&input_need);
        }
    }
    if narrowed.is_empty() {
        return None;
    }
    let mut plan = cp.plan.clone();
    for (i, cols) in narrowed {
        match &mut plan.graph.transforms[i].config {
            TransformConfig::Read(rc) if rc.columns.is_none() => rc.columns = Some(cols),
            TransformConfig::ReadStream(StreamSourceConfig::Nexmark { columns, .. })
                if columns.is_none() =>
            {
                *columns = Some(cols)
            }
            _ => {}
        }
    }
    Some(plan)
}

/// A schema's user fields (not the hidden ones), by name.
fn user_fields_of(schema: &arrow::datatypes::Schema) -> Vec<String> {
    schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|n| !riverbank_elements::columns::is_hidden(n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nexmark's Q4 read: each reader makes the fields its Join reads and its event time, and
    /// the Join's tables have those fields only.
    #[tokio::test]
    async fn a_nexmark_reader_makes_the_fields_its_join_reads() {
        let yaml = r#"
pipeline:
  transforms:
    - {type: ReadFromNexmark, name: Auctions, config: {kind: auction, rate: 1000, count: 100}}
    - {type: ReadFromNexmark, name: Bids, config: {kind: bid, rate: 1000, count: 100}}
    - type: WindowInto
      name: Fixed
      input: Bids
      windowing: {type: fixed, size: 10s}
    - type: WindowInto
      name: FixedAuctions
      input: Auctions
      windowing: {type: fixed, size: 10s}
    - type: Join
      input: {A: FixedAuctions, B: Fixed}
      config:
        type: inner
        equalities: [{A: id, B: auction}]
        fields: {A: {category: category}, B: {price: price}}
    - {type: WriteToJson, input: Join, config: {path: /tmp/unused}}
options: {streaming: true}
"#;
        let plan = riverbank_pipeline::load_plan(yaml, &Default::default(), "t").unwrap();
        let cp = crate::compile::compile(plan, 1024).await.unwrap();
        let columns = |name: &str| {
            let t = cp.plan.graph.transforms.iter().find(|t| t.name == name);
            match &t.unwrap().config {
                TransformConfig::ReadStream(StreamSourceConfig::Nexmark { columns, .. }) => {
                    columns.clone()
                }
                other => panic!("{other:?}"),
            }
        };
        let v = |s: &[&str]| Some(s.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(columns("Auctions"), v(&["id", "category"]));
        assert_eq!(columns("Bids"), v(&["auction", "price"]));
        let fields = |c: &str| user_fields_of(&cp.schemas[c]);
        let read = |name: &str| {
            let t = cp.plan.graph.transforms.iter().find(|t| t.name == name);
            t.unwrap().outputs()[0].clone()
        };
        assert_eq!(fields(&read("Bids")), ["auction", "price", "dateTime"]);
        assert_eq!(fields(&read("Auctions")), ["id", "dateTime", "category"]);
    }
}
