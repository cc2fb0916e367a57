//! A plan's fused stages as `riverbank plan` shows a YAML plan's: Dataflow-shaped JSON
//! (`executionPipelineStage`) and Graphviz DOT. The text form is [`Plan`]'s `Display`.
use std::collections::HashMap;

use serde_json::{Value, json};

use super::{Plan, StageKind};

/// `S03`, as YAML plans name their stages.
fn id(i: usize) -> String {
    format!("S{i:02}")
}

/// One stage's kind, inputs (main, then side) and outputs, by PCollection id.
fn shape(kind: &StageKind) -> (&'static str, Vec<&String>, Vec<&String>, Vec<&String>) {
    match kind {
        StageKind::Impulse { output } => ("Impulse", vec![], vec![], vec![output]),
        StageKind::GroupByKey { input, output, .. } => {
            ("GroupByKey", vec![input], vec![], vec![output])
        }
        StageKind::Concat { inputs, output, .. } => {
            ("Flatten", inputs.iter().collect(), vec![], vec![output])
        }
        StageKind::Sdk(s) => (
            "SDK harness",
            s.inputs.iter().collect(),
            s.side_inputs.iter().map(|x| &x.pcollection).collect(),
            s.outputs.iter().collect(),
        ),
    }
}

impl Plan {
    /// The stage producing each materialized PCollection.
    fn producers(&self) -> HashMap<&String, usize> {
        let mut producers = HashMap::new();
        for (i, stage) in self.stages.iter().enumerate() {
            for p in shape(&stage.kind).3 {
                producers.insert(p, i);
            }
        }
        producers
    }

    fn label(&self, p: &str) -> String {
        self.components
            .pcollections
            .get(p)
            .map(|c| c.unique_name.clone())
            .unwrap_or_else(|| p.to_string())
    }

    fn component_names(&self, kind: &StageKind) -> Vec<String> {
        match kind {
            StageKind::Sdk(s) => s.transforms.iter().map(|t| self.name_of(t)).collect(),
            StageKind::GroupByKey { transform, .. } | StageKind::Concat { transform, .. } => {
                vec![self.name_of(transform)]
            }
            StageKind::Impulse { .. } => vec!["Impulse".into()],
        }
    }

    /// Dataflow's `executionPipelineStage` list, as `riverbank plan --format json` gives it.
    pub fn to_json(&self, job_name: &str) -> Value {
        let producers = self.producers();
        let stages: Vec<Value> = self
            .stages
            .iter()
            .enumerate()
            .map(|(i, stage)| {
                let (kind, mains, sides, outputs) = shape(&stage.kind);
                let source = |p: &&String, side: bool| {
                    json!({
                        "userName": self.label(p),
                        "name": p,
                        "fromStages": producers.get(p).map(|s| vec![id(*s)]).unwrap_or_default(),
                        "sideInput": side,
                    })
                };
                let mut prerequisites: Vec<String> = mains
                    .iter()
                    .chain(&sides)
                    .filter_map(|p| producers.get(p).map(|s| id(*s)))
                    .collect();
                prerequisites.sort();
                prerequisites.dedup();
                json!({
                    "id": id(i),
                    "name": stage.name,
                    "kind": kind,
                    "componentTransform": self.component_names(&stage.kind)
                        .into_iter()
                        .map(|n| json!({"userName": n}))
                        .collect::<Vec<_>>(),
                    "inputSource": mains.iter().map(|p| source(p, false))
                        .chain(sides.iter().map(|p| source(p, true)))
                        .collect::<Vec<_>>(),
                    "outputSource": outputs.iter()
                        .map(|p| json!({"userName": self.label(p), "name": p}))
                        .collect::<Vec<_>>(),
                    "prerequisiteStage": prerequisites,
                })
            })
            .collect();
        json!({
            "jobName": job_name,
            "type": if self.streaming { "JOB_TYPE_STREAMING" } else { "JOB_TYPE_BATCH" },
            "executionPipelineStage": stages,
        })
    }

    /// The stages as boxes and the PCollections between them as edges (side inputs dotted).
    pub fn to_dot(&self) -> String {
        let quote = |s: &str| s.replace('\\', "\\\\").replace('"', "'");
        let mut out = String::from(
            "digraph plan {\n  rankdir=LR;\n  node [shape=box, style=rounded, fontname=\"Helvetica\"];\n",
        );
        for (i, stage) in self.stages.iter().enumerate() {
            let names: Vec<String> = self
                .component_names(&stage.kind)
                .iter()
                .map(|n| quote(n))
                .collect();
            out.push_str(&format!(
                "  {} [label=\"{} {}\\n{}\"];\n",
                id(i),
                id(i),
                shape(&stage.kind).0,
                names.join("\\n")
            ));
        }
        let producers = self.producers();
        for (i, stage) in self.stages.iter().enumerate() {
            let (_, mains, sides, _) = shape(&stage.kind);
            let edges = mains
                .iter()
                .map(|p| (p, "solid"))
                .chain(sides.iter().map(|p| (p, "dotted")));
            for (p, style) in edges {
                if let Some(from) = producers.get(p) {
                    out.push_str(&format!(
                        "  {} -> {} [label=\"{}\", style={style}];\n",
                        id(*from),
                        id(i),
                        quote(&self.label(p))
                    ));
                }
            }
        }
        out.push_str("}\n");
        out
    }
}
