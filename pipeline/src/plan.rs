//! The planner: Dataflow's fusion and combine lifting (seed 000), on an expanded graph.
//!
//! Every transform is placed in one or more stages:
//! - a source starts a stage; element-wise transforms and sinks join the stage(s) of their
//!   input (producer–consumer fusion; siblings of one collection end up together);
//! - a Flatten whose inputs come from different stages is *unzipped*: it and everything fused
//!   after it run in each producing stage, so nothing is materialized for it;
//! - a Combine is lifted: a partial combine joins each producing stage, the partial states are
//!   shuffled by key, and a new stage starts with the final combine;
//! - Reshuffle, Sql, Join and AssertEqual read their inputs through a shuffle and start a stage;
//! - a file sink whose output (the files it wrote) is read gets a stage of its own after the
//!   stages that write it: one item commits the sink and emits its files to what reads them.
use crate::config::{Class, TransformConfig};
use crate::graph::Graph;
use crate::options::PipelineOptions;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// What an op does inside a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpRole {
    /// The transform, applied to each element (or, for sources, producing elements).
    Apply,
    /// The producer half of a lifted Combine: combines within the stage, then shuffles states.
    PartialCombine,
    /// The consumer half of a lifted Combine: merges shuffled states and emits results.
    FinalCombine,
    /// Reads the shuffled inputs of a Reshuffle/Sql/Join/AssertEqual and applies it.
    ShuffleRead,
    /// Commits a file sink once every stage writing it is done, and emits the files written.
    Commit,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// Index into `Plan::graph.transforms`.
    pub transform: usize,
    pub role: OpRole,
}

/// How elements cross from one stage to the next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Exchange {
    /// Partial-combine states, hash-partitioned by the group key.
    CombineStates { combine: usize },
    /// Elements spread evenly over the consumer's partitions (Reshuffle).
    Redistribute,
    /// Every element made available to one consumer that needs its whole input (Sql, Join, AssertEqual).
    Gather,
    /// Nothing crosses: the consumer commits the sink's temp parts the producers wrote and
    /// reads the files written.
    WrittenFiles,
}

/// A collection crossing into a stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageInput {
    pub collection: String,
    pub from_stages: Vec<usize>,
    pub exchange: Exchange,
}

/// One fused stage: ops in topological order, all run in the same pass over each bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stage {
    pub index: usize,
    pub ops: Vec<Op>,
    pub inputs: Vec<StageInput>,
    /// Collections produced here that other stages read, with the exchange they cross.
    pub outputs: Vec<(String, Exchange)>,
}

impl Stage {
    pub fn id(&self) -> String {
        format!("S{:02}", self.index)
    }
    pub fn name(&self) -> String {
        format!("F{}", self.index)
    }
    /// The sink this stage commits, when it is a read sink's commit stage.
    pub fn commits(&self) -> Option<usize> {
        self.ops
            .first()
            .filter(|o| o.role == OpRole::Commit)
            .map(|o| o.transform)
    }
}

/// The serializable plan the runtime executes: the graph it was made from and its stages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub job_name: String,
    pub options: PipelineOptions,
    pub graph: Graph,
    pub stages: Vec<Stage>,
}

impl Plan {
    /// A streaming job: `options.streaming`, or any unbounded source.
    pub fn is_streaming(&self) -> bool {
        self.options.streaming
            || self
                .graph
                .transforms
                .iter()
                .any(|t| t.config.is_unbounded())
    }

    /// The names of the transforms only Beam's Python SDK runs (`PyTransform`s): a plan with
    /// any needs an image with apache-beam beside the `riverbank` binary.
    pub fn python_sdk_transforms(&self) -> Vec<&str> {
        self.graph
            .transforms
            .iter()
            .filter(|t| matches!(t.config, TransformConfig::PyTransform { .. }))
            .map(|t| t.name.as_str())
            .collect()
    }

    /// What a worker needs to run any stage of the plan: the largest `min_ram` and `cpu_count`
    /// of the transforms' `resource_hints`, and an accelerator if one asks for it (the first,
    /// in topological order). Pods run every stage, so this is where their requests can
    /// come from; the operator sizes them from `options.minRam`/`options.cpuCount` today.
    pub fn worker_resource_hints(&self) -> crate::ResourceHints {
        let mut h = crate::ResourceHints::default();
        for t in &self.graph.transforms {
            let r = &t.resource_hints;
            h.min_ram_bytes = h.min_ram_bytes.max(r.min_ram_bytes);
            h.cpu_count = h.cpu_count.max(r.cpu_count);
            h.max_active_bundles_per_worker = h
                .max_active_bundles_per_worker
                .max(r.max_active_bundles_per_worker);
            if h.accelerator.is_none() {
                h.accelerator = r.accelerator.clone();
            }
        }
        h
    }

    /// Stages whose output feeds `stage` (Dataflow's `prerequisiteStage`).
    pub fn prerequisites(&self, stage: usize) -> Vec<usize> {
        let set: BTreeSet<usize> = self.stages[stage]
            .inputs
            .iter()
            .flat_map(|i| i.from_stages.iter().copied())
            .collect();
        set.into_iter().collect()
    }
}

/// Plans `graph` into fused stages.
pub fn plan(job_name: &str, options: PipelineOptions, graph: Graph) -> Plan {
    let n = graph.transforms.len();
    // Stages each transform's output is produced in (where its readers fuse).
    let mut placed: Vec<Vec<usize>> = vec![vec![]; n];
    let mut stages: Vec<Stage> = vec![];
    let new_stage = |stages: &mut Vec<Stage>| {
        let index = stages.len();
        stages.push(Stage {
            index,
            ops: vec![],
            inputs: vec![],
            outputs: vec![],
        });
        index
    };
    let producing = |placed: &Vec<Vec<usize>>, c: &str| -> Vec<usize> {
        graph
            .producer(c)
            .map(|p| placed[p].clone())
            .unwrap_or_default()
    };

    for (i, t) in graph.transforms.iter().enumerate() {
        match t.config.class() {
            Class::Source => {
                let s = new_stage(&mut stages);
                stages[s].ops.push(Op {
                    transform: i,
                    role: OpRole::Apply,
                });
                placed[i] = vec![s];
            }
            Class::ElementWise | Class::Sink => {
                // Union of the input producers' stages: one stage normally, several when a
                // Flatten (or something after one) is unzipped.
                let mut set = BTreeSet::new();
                for (_, c) in &t.inputs {
                    set.extend(producing(&placed, c));
                }
                for &s in &set {
                    stages[s].ops.push(Op {
                        transform: i,
                        role: OpRole::Apply,
                    });
                }
                placed[i] = set.into_iter().collect();
                // The files a sink wrote exist once it is committed, after every stage
                // writing it: its readers start a stage there.
                if t.config.class() == Class::Sink && !graph.consumers(&t.name).is_empty() {
                    let s = new_stage(&mut stages);
                    stages[s].inputs.push(StageInput {
                        collection: t.name.clone(),
                        from_stages: std::mem::take(&mut placed[i]),
                        exchange: Exchange::WrittenFiles,
                    });
                    stages[s].ops.push(Op {
                        transform: i,
                        role: OpRole::Commit,
                    });
                    placed[i] = vec![s];
                }
            }
            Class::Combine => {
                let (_, input) = &t.inputs[0];
                let from = producing(&placed, input);
                for &s in &from {
                    stages[s].ops.push(Op {
                        transform: i,
                        role: OpRole::PartialCombine,
                    });
                    stages[s]
                        .outputs
                        .push((input.clone(), Exchange::CombineStates { combine: i }));
                }
                let s = new_stage(&mut stages);
                stages[s].inputs.push(StageInput {
                    collection: input.clone(),
                    from_stages: from,
                    exchange: Exchange::CombineStates { combine: i },
                });
                stages[s].ops.push(Op {
                    transform: i,
                    role: OpRole::FinalCombine,
                });
                placed[i] = vec![s];
            }
            Class::Gather | Class::Reshuffle => {
                let exchange = if t.config.class() == Class::Reshuffle {
                    Exchange::Redistribute
                } else {
                    Exchange::Gather
                };
                let s = new_stage(&mut stages);
                for (_, input) in &t.inputs {
                    let from = producing(&placed, input);
                    for &p in &from {
                        if !stages[p]
                            .outputs
                            .iter()
                            .any(|(c, e)| c == input && *e == exchange)
                        {
                            stages[p].outputs.push((input.clone(), exchange.clone()));
                        }
                    }
                    if !stages[s].inputs.iter().any(|x| &x.collection == input) {
                        stages[s].inputs.push(StageInput {
                            collection: input.clone(),
                            from_stages: from,
                            exchange: exchange.clone(),
                        });
                    }
                }
                stages[s].ops.push(Op {
                    transform: i,
                    role: OpRole::ShuffleRead,
                });
                placed[i] = vec![s];
            }
        }
    }
    Plan {
        job_name: job_name.to_string(),
        options,
        graph,
        stages,
    }
}

/// Dataflow-style stage kind for display.
pub fn stage_kind(plan: &Plan, stage: &Stage) -> &'static str {
    match stage
        .ops
        .first()
        .map(|o| (o.role, &plan.graph.transforms[o.transform].config))
    {
        Some((OpRole::FinalCombine, _)) => "GROUP_BY_KEY_KIND",
        Some((OpRole::ShuffleRead, TransformConfig::Reshuffle)) => "SHUFFLE_KIND",
        Some((OpRole::ShuffleRead, _)) => "GROUP_BY_KEY_KIND",
        Some((
            OpRole::Apply,
            TransformConfig::Read(_)
            | TransformConfig::ReadStream(_)
            | TransformConfig::ReadConnector(_),
        )) => "READ_KIND",
        Some((OpRole::Apply, TransformConfig::Create { .. })) => "CONSTANT_KIND",
        _ => "PAR_DO_KIND",
    }
}
