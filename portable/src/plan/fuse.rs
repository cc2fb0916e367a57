//! Greedy fusion: each SDK transform joins the stage that produces its main input, unless that
//! would read a side input computed after (or inside) that stage, or its input is the split
//! output of a splittable DoFn (materialized so bundles spread), or it reads a side input that
//! never ends (its main input then waits, between stages, for the side windows it needs).
//! Runner-native transforms are stages of their own. Returns the stages in execution order and
//! the PCollections that cross stage boundaries.
use std::collections::{BTreeSet, HashMap};

use crate::error::PortableError;
use crate::runner_api::Components;
use crate::urns;

use super::leaves::urn;
use super::sdf::SPLIT_SUFFIX;
use super::{SdkStage, SideInput, Stage, StageKind, side_input_tags};

struct Draft {
    stage: Stage,
    /// Stages this one reads from (main or side inputs).
    deps: BTreeSet<usize>,
}

pub(crate) fn fuse(
    components: &Components,
    leaves: &[String],
) -> Result<(Vec<Stage>, BTreeSet<String>), PortableError> {
    let mut drafts: Vec<Draft> = Vec::new();
    let mut producer: HashMap<String, usize> = HashMap::new();
    let mut boundary: BTreeSet<String> = BTreeSet::new();
    // PCollections produced by a split step, which its consumer reads from a new stage.
    let mut break_after: BTreeSet<String> = BTreeSet::new();

    for id in leaves {
        let t = &components.transforms[id];
        let name = t.unique_name.clone();
        let native = |kind: StageKind| Stage {
            name: name.clone(),
            kind,
        };
        let one = |map: &std::collections::HashMap<String, String>| {
            map.values().next().cloned().unwrap_or_default()
        };
        let (stage_index, inputs_read): (usize, Vec<String>) = match urn(t) {
            urns::IMPULSE => {
                drafts.push(Draft {
                    stage: native(StageKind::Impulse {
                        output: one(&t.outputs),
                    }),
                    deps: BTreeSet::new(),
                });
                (drafts.len() - 1, vec![])
            }
            urns::GROUP_BY_KEY => {
                let kind = StageKind::GroupByKey {
                    transform: id.clone(),
                    input: one(&t.inputs),
                    output: one(&t.outputs),
                };
                drafts.push(Draft {
                    stage: native(kind),
                    deps: BTreeSet::new(),
                });
                (drafts.len() - 1, vec![one(&t.inputs)])
            }
            urns::FLATTEN | urns::RESHUFFLE => {
                // By tag; a PCollection flattened twice is there twice (its elements too).
                let mut tagged: Vec<(&String, &String)> = t.inputs.iter().collect();
                tagged.sort();
                let inputs: Vec<String> = tagged.into_iter().map(|(_, p)| p.clone()).collect();
                let kind = StageKind::Concat {
                    transform: id.clone(),
                    inputs: inputs.clone(),
                    output: one(&t.outputs),
                };
                drafts.push(Draft {
                    stage: native(kind),
                    deps: BTreeSet::new(),
                });
                (drafts.len() - 1, inputs)
            }
            _ => {
                let sides = side_input_tags(components, id)?;
                let mut mains: Vec<String> = t
                    .inputs
                    .iter()
                    .filter(|(tag, _)| !sides.contains_key(*tag))
                    .map(|(_, p)| p.clone())
                    .collect();
                mains.sort();
                mains.dedup();
                let side_inputs: Vec<SideInput> = sides
                    .iter()
                    .map(|(tag, access)| SideInput {
                        transform: id.clone(),
                        tag: tag.clone(),
                        pcollection: t.inputs[tag].clone(),
                        access: access.clone(),
                    })
                    .collect();
                let side_stages: Vec<usize> = side_inputs
                    .iter()
                    .filter_map(|s| producer.get(&s.pcollection).copied())
                    .collect();
                let stateful = super::leaves::stateful(components, id)?;
                // A side input that never ends makes its consumer's main elements wait for its
                // windows (`execute::side_windows`): the consumer starts a stage, so what waits
                // is its own input.
                let waits = side_inputs
                    .iter()
                    .any(|s| super::is_unbounded(components, &s.pcollection));
                let host = match mains.as_slice() {
                    [main] if !break_after.contains(main) && stateful.is_none() && !waits => producer.get(main).copied().filter(|&p| {
                        matches!(&drafts[p].stage.kind, StageKind::Sdk(s) if s.environment == t.environment_id)
                            && side_stages.iter().all(|&s| s != p && !depends_on(&drafts, s, p))
                    }),
                    _ => None,
                };
                for s in &side_inputs {
                    boundary.insert(s.pcollection.clone());
                }
                let index = match host {
                    Some(p) => {
                        if let StageKind::Sdk(s) = &mut drafts[p].stage.kind {
                            s.transforms.push(id.clone());
                            s.side_inputs.extend(side_inputs);
                        }
                        p
                    }
                    None => {
                        let stage = SdkStage {
                            environment: t.environment_id.clone(),
                            transforms: vec![id.clone()],
                            inputs: mains.clone(),
                            side_inputs,
                            outputs: Vec::new(),
                            keyed: stateful.map(|_| super::Keyed::default()),
                        };
                        drafts.push(Draft {
                            stage: Stage {
                                name: name.clone(),
                                kind: StageKind::Sdk(stage),
                            },
                            deps: BTreeSet::new(),
                        });
                        for m in &mains {
                            boundary.insert(m.clone());
                        }
                        drafts.len() - 1
                    }
                };
                let mut read = if host.is_some() { vec![] } else { mains };
                read.extend(sides.keys().map(|tag| t.inputs[tag].clone()));
                if id.ends_with(SPLIT_SUFFIX) {
                    break_after.extend(t.outputs.values().cloned());
                }
                (index, read)
            }
        };
        for p in &inputs_read {
            let from = *producer.get(p).ok_or_else(|| {
                PortableError::Malformed(format!("'{name}' reads '{p}' before it is produced"))
            })?;
            if from != stage_index {
                drafts[stage_index].deps.insert(from);
            }
            if !matches!(&drafts[stage_index].stage.kind, StageKind::Sdk(_)) {
                boundary.insert(p.clone());
            }
        }
        for p in t.outputs.values() {
            producer.insert(p.clone(), stage_index);
        }
    }

    // Outputs of each SDK stage: what it produces that crosses a boundary.
    for (p, &stage) in &producer {
        if let (true, StageKind::Sdk(s)) = (boundary.contains(p), &mut drafts[stage].stage.kind) {
            s.outputs.push(p.clone());
        }
    }
    for d in &mut drafts {
        if let StageKind::Sdk(s) = &mut d.stage.kind {
            s.outputs.sort();
        }
    }
    // Native stages' outputs are materialized too (they are read over the data plane).
    for d in &drafts {
        match &d.stage.kind {
            StageKind::Impulse { output }
            | StageKind::GroupByKey { output, .. }
            | StageKind::Concat { output, .. } => {
                boundary.insert(output.clone());
            }
            StageKind::Sdk(_) => {}
        }
    }
    Ok((order(drafts)?, boundary))
}

/// Whether stage `a` reads (transitively) from stage `b`.
fn depends_on(drafts: &[Draft], a: usize, b: usize) -> bool {
    let mut stack = vec![a];
    let mut seen = BTreeSet::new();
    while let Some(s) = stack.pop() {
        if s == b {
            return true;
        }
        if seen.insert(s) {
            stack.extend(drafts[s].deps.iter().copied());
        }
    }
    false
}

/// The stages in an order where every stage runs after those it reads from.
fn order(drafts: Vec<Draft>) -> Result<Vec<Stage>, PortableError> {
    let n = drafts.len();
    let mut done = vec![false; n];
    let mut out = Vec::with_capacity(n);
    let mut slots: Vec<Option<Draft>> = drafts.into_iter().map(Some).collect();
    while out.len() < n {
        let next = (0..n).find(|&i| {
            !done[i]
                && slots[i]
                    .as_ref()
                    .is_some_and(|d| d.deps.iter().all(|&x| done[x]))
        });
        let Some(i) = next else {
            return Err(PortableError::Malformed("fused stages form a cycle".into()));
        };
        done[i] = true;
        out.push(slots[i].take().expect("taken once").stage);
    }
    Ok(out)
}
