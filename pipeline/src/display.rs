//! Renderings of a plan: text for people, Dataflow-shaped JSON for tools, DOT for Graphviz.
use crate::plan::{Exchange, OpRole, Plan, stage_kind};
use serde_json::{Value, json};

/// A fused op's name as `riverbank plan`, Dataflow and status show it (`SumPerZone/PartialCombine`).
pub fn component_name(plan: &Plan, transform: usize, role: OpRole) -> String {
    let name = &plan.graph.transforms[transform].name;
    match role {
        OpRole::PartialCombine => format!("{name}/PartialCombine"),
        OpRole::FinalCombine => format!("{name}/FinalCombine"),
        OpRole::ShuffleRead => format!("{name}/ShuffleRead+{name}"),
        OpRole::Apply => name.clone(),
        OpRole::Commit => format!("{name}/Commit"),
    }
}

/// How a stage input's shuffle is shown (`shuffle(combine states by key)`).
pub fn exchange_name(e: &Exchange) -> &'static str {
    match e {
        Exchange::CombineStates { .. } => "shuffle(combine states by key)",
        Exchange::Redistribute => "shuffle(redistribute)",
        Exchange::Gather => "shuffle(gather)",
        Exchange::WrittenFiles => "files written (after commit)",
    }
}

/// Mirrors Dataflow's `executionPipelineStage` list (`id`, `name`, `kind`,
/// `componentTransform`, `inputSource`, `outputSource`, `prerequisiteStage`).
pub fn to_json(plan: &Plan) -> Value {
    let stages: Vec<Value> = plan
        .stages
        .iter()
        .map(|s| {
            let comps: Vec<Value> = s
                .ops
                .iter()
                .map(|o| {
                    let t = &plan.graph.transforms[o.transform];
                    json!({"userName": component_name(plan, o.transform, o.role), "name": format!("s{}", o.transform + 1), "originalTransform": t.name, "type": t.type_name, "role": o.role})
                })
                .collect();
            let inputs: Vec<Value> = s
                .inputs
                .iter()
                .map(|i| json!({"userName": i.collection, "name": i.collection, "originalTransformOrCollection": i.collection, "fromStages": i.from_stages.iter().map(|x| plan.stages[*x].id()).collect::<Vec<_>>(), "shuffle": exchange_name(&i.exchange)}))
                .collect();
            let outputs: Vec<Value> = s.outputs.iter().map(|(c, e)| json!({"userName": c, "name": c, "originalTransformOrCollection": c, "shuffle": exchange_name(e)})).collect();
            json!({
                "id": s.id(),
                "name": s.name(),
                "kind": stage_kind(plan, s),
                "componentTransform": comps,
                "inputSource": inputs,
                "outputSource": outputs,
                "prerequisiteStage": plan.prerequisites(s.index).iter().map(|x| plan.stages[*x].id()).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({"jobName": plan.job_name, "executionPipelineStage": stages})
}

pub fn to_text(plan: &Plan) -> String {
    let mut out = format!(
        "job {}: {} transforms in {} fused stages\n",
        plan.job_name,
        plan.graph.transforms.len(),
        plan.stages.len()
    );
    for s in &plan.stages {
        out.push_str(&format!(
            "\n{} {} [{}]\n",
            s.id(),
            s.name(),
            stage_kind(plan, s)
        ));
        for i in &s.inputs {
            let from: Vec<String> = i.from_stages.iter().map(|x| plan.stages[*x].id()).collect();
            out.push_str(&format!(
                "  in   {} <- {} via {}\n",
                i.collection,
                from.join(", "),
                exchange_name(&i.exchange)
            ));
        }
        for o in &s.ops {
            let t = &plan.graph.transforms[o.transform];
            out.push_str(&format!(
                "  op   {} ({})\n",
                component_name(plan, o.transform, o.role),
                t.type_name
            ));
        }
        for (c, e) in &s.outputs {
            out.push_str(&format!("  out  {} -> {}\n", c, exchange_name(e)));
        }
    }
    out
}

pub fn to_dot(plan: &Plan) -> String {
    let mut out = String::from(
        "digraph plan {\n  rankdir=LR;\n  node [shape=box, style=rounded, fontname=\"Helvetica\"];\n",
    );
    for s in &plan.stages {
        let comps: Vec<String> = s
            .ops
            .iter()
            .map(|o| component_name(plan, o.transform, o.role).replace('"', "'"))
            .collect();
        out.push_str(&format!(
            "  {} [label=\"{} {}\\n{}\"];\n",
            s.id(),
            s.id(),
            stage_kind(plan, s),
            comps.join("\\n")
        ));
    }
    for s in &plan.stages {
        for i in &s.inputs {
            for f in &i.from_stages {
                out.push_str(&format!(
                    "  {} -> {} [label=\"{}\\n{}\", style=dashed];\n",
                    plan.stages[*f].id(),
                    s.id(),
                    i.collection.replace('"', "'"),
                    exchange_name(&i.exchange)
                ));
            }
        }
    }
    out.push_str("}\n");
    out
}
