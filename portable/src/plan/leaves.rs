//! The transforms that run: composites opened down to their primitives (except the ones the
//! runner executes whole), each checked for something Riverbank can run, then put in an order
//! where every input is produced before it is read.
use std::collections::{HashMap, HashSet, VecDeque};

use prost::Message;

use crate::error::PortableError;
use crate::runner_api::{Components, PTransform, ParDoPayload};
use crate::urns;

/// Runner-native primitives: executed by Riverbank, never sent to an SDK harness.
const NATIVE: &[&str] = &[urns::IMPULSE, urns::GROUP_BY_KEY, urns::FLATTEN];

pub(crate) fn urn(t: &PTransform) -> &str {
    t.spec.as_ref().map(|s| s.urn.as_str()).unwrap_or("")
}

pub(crate) fn par_do_payload(t: &PTransform) -> Result<ParDoPayload, PortableError> {
    let bytes = t.spec.as_ref().map(|s| s.payload.as_slice()).unwrap_or(&[]);
    ParDoPayload::decode(bytes).map_err(|e| {
        PortableError::unsupported(
            &t.unique_name,
            format!("its ParDo payload does not decode: {e}"),
        )
    })
}

/// The leaf transforms under `roots`, in the order the pipeline lists them.
pub(crate) fn collect(
    components: &Components,
    roots: &[String],
) -> Result<Vec<String>, PortableError> {
    let mut out = Vec::new();
    for root in roots {
        visit(components, root, &mut out)?;
    }
    Ok(out)
}

fn visit(components: &Components, id: &str, out: &mut Vec<String>) -> Result<(), PortableError> {
    let t = components
        .transforms
        .get(id)
        .ok_or_else(|| PortableError::Malformed(format!("no transform '{id}'")))?;
    let u = urn(t);
    let whole = NATIVE.contains(&u) || (u == urns::RESHUFFLE && same_coder_through(components, t));
    if !whole && !t.subtransforms.is_empty() {
        for s in &t.subtransforms {
            visit(components, s, out)?;
        }
        return Ok(());
    }
    if passes_its_input_on(t) {
        return Ok(());
    }
    check(t)?;
    if u == urns::GROUP_BY_KEY {
        check_merging(components, t)?;
    }
    out.push(id.to_string());
    Ok(())
}

/// A leaf whose outputs are its inputs does nothing (the Python SDK submits its `MaybeReshuffle`
/// so when it chose not to reshuffle, unless its own pre-optimization removed it first).
fn passes_its_input_on(t: &PTransform) -> bool {
    t.subtransforms.is_empty()
        && !t.outputs.is_empty()
        && t.outputs
            .values()
            .all(|o| t.inputs.values().any(|i| i == o))
}

/// A Reshuffle the runner can do by passing bytes on: one input, one output, one coder.
fn same_coder_through(components: &Components, t: &PTransform) -> bool {
    let coder = |p: Option<&String>| {
        p.and_then(|p| components.pcollections.get(p))
            .map(|p| super::coder_key(components, &p.coder_id))
    };
    t.inputs.len() == 1
        && t.outputs.len() == 1
        && coder(t.inputs.values().next()).is_some()
        && coder(t.inputs.values().next()) == coder(t.outputs.values().next())
}

/// A GroupByKey whose windows merge by a WindowFn other than sessions has them merged by the
/// SDK (`execute::merge_windows`): that needs the strategy's SDK environment, and interval
/// windows (the runner stamps each group at its window's end).
fn check_merging(components: &Components, t: &PTransform) -> Result<(), PortableError> {
    let strategy = t
        .inputs
        .values()
        .next()
        .and_then(|p| components.pcollections.get(p))
        .and_then(|p| {
            components
                .windowing_strategies
                .get(&p.windowing_strategy_id)
        });
    let Some(strategy) = strategy.filter(|s| super::merges_on_sdk(s)) else {
        return Ok(());
    };
    let window_fn = strategy.window_fn.as_ref().map_or("", |f| f.urn.as_str());
    if !components
        .environments
        .contains_key(&strategy.environment_id)
    {
        return Err(PortableError::unsupported(
            &t.unique_name,
            format!(
                "its windows merge by '{window_fn}', which the SDK must merge, but its windowing strategy names no SDK environment ('{}')",
                strategy.environment_id
            ),
        ));
    }
    let window_coder = components
        .coders
        .get(&strategy.window_coder_id)
        .and_then(|c| c.spec.as_ref())
        .map_or("", |s| s.urn.as_str());
    if window_coder != urns::INTERVAL_WINDOW {
        return Err(PortableError::unsupported(
            &t.unique_name,
            format!(
                "its windows merge by '{window_fn}' into windows of coder '{window_coder}'; Riverbank groups merging windows that are interval windows only"
            ),
        ));
    }
    Ok(())
}

/// Refuses, naming the transform, what Riverbank cannot run yet.
fn check(t: &PTransform) -> Result<(), PortableError> {
    let u = urn(t);
    let name = &t.unique_name;
    if NATIVE.contains(&u) || u == urns::RESHUFFLE {
        return Ok(());
    }
    match u {
        urns::READ => {
            return Err(PortableError::unsupported(
                name,
                "a primitive Read (beam:transform:read:v1) is not supported; SDKs that expand reads into Impulse and a splittable DoFn (Python, and Java with use_sdf_read) run",
            ));
        }
        urns::TEST_STREAM => {
            return Err(PortableError::unsupported(
                name,
                "TestStream needs a streaming runner",
            ));
        }
        _ => {}
    }
    if t.environment_id.is_empty() {
        return Err(PortableError::unsupported(
            name,
            format!(
                "Riverbank does not know the transform URN '{u}' and no SDK environment is given to run it"
            ),
        ));
    }
    if u == urns::PAR_DO {
        let p = par_do_payload(t)?;
        for (id, spec) in &p.state_specs {
            let protocol = spec.protocol.as_ref().map(|f| f.urn.as_str()).unwrap_or("");
            if protocol != urns::BAG_USER_STATE && protocol != urns::ORDERED_LIST_USER_STATE {
                return Err(PortableError::unsupported(
                    name,
                    format!(
                        "state '{id}' is of kind '{protocol}': Riverbank keeps bag-backed state (bag, value, combining, set) and ordered lists only"
                    ),
                ));
            }
        }
        if p.requires_time_sorted_input {
            return Err(PortableError::unsupported(
                name,
                "@RequiresTimeSortedInput is not supported yet",
            ));
        }
        if p.requires_stable_input {
            return Err(PortableError::unsupported(
                name,
                "@RequiresStableInput is not supported yet",
            ));
        }
    }
    Ok(())
}

/// The timer families of transform `id` when it is a stateful DoFn (state or timers), else
/// `None`: its input is grouped by key and it starts a stage.
pub(crate) fn stateful(
    components: &Components,
    id: &str,
) -> Result<Option<Vec<String>>, PortableError> {
    let t = &components.transforms[id];
    if urn(t) != urns::PAR_DO {
        return Ok(None);
    }
    let p = par_do_payload(t)?;
    if p.state_specs.is_empty() && p.timer_family_specs.is_empty() {
        return Ok(None);
    }
    let mut families: Vec<String> = p.timer_family_specs.keys().cloned().collect();
    families.sort();
    Ok(Some(families))
}

/// Orders `leaves` so that each comes after the producers of all its inputs (side inputs too),
/// keeping the pipeline's own order where it already is one.
pub(crate) fn topological(
    components: &Components,
    leaves: Vec<String>,
) -> Result<Vec<String>, PortableError> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, id) in leaves.iter().enumerate() {
        for p in components.transforms[id].outputs.values() {
            producer.insert(p, i);
        }
    }
    let mut waiting = vec![0usize; leaves.len()];
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); leaves.len()];
    for (i, id) in leaves.iter().enumerate() {
        let inputs: HashSet<&String> = components.transforms[id].inputs.values().collect();
        for p in inputs {
            match producer.get(p.as_str()) {
                Some(&j) => {
                    waiting[i] += 1;
                    consumers[j].push(i);
                }
                None => {
                    return Err(PortableError::Malformed(format!(
                        "transform '{}' reads PCollection '{p}', which no transform produces",
                        components.transforms[id].unique_name
                    )));
                }
            }
        }
    }
    let mut ready: VecDeque<usize> = (0..leaves.len()).filter(|i| waiting[*i] == 0).collect();
    let mut order = Vec::with_capacity(leaves.len());
    while let Some(i) = ready.pop_front() {
        order.push(leaves[i].clone());
        for &c in &consumers[i] {
            waiting[c] -= 1;
            if waiting[c] == 0 {
                ready.push_back(c);
            }
        }
    }
    if order.len() != leaves.len() {
        let mut stuck: Vec<&str> = (0..leaves.len())
            .filter(|&i| waiting[i] > 0)
            .map(|i| components.transforms[&leaves[i]].unique_name.as_str())
            .collect();
        stuck.sort();
        return Err(PortableError::Malformed(format!(
            "the pipeline's transforms form a cycle: {}",
            stuck.join(", ")
        )));
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner_api::{
        Coder, Environment, FunctionSpec, PCollection, WindowingStrategy, merge_status,
    };

    /// A GroupByKey over windows of a user's merging WindowFn, its window coder `window_urn`,
    /// its strategy's environment `env` (present in the components or not).
    fn grouping(window_urn: &str, env_present: bool) -> (Components, PTransform) {
        let spec = |urn: &str| {
            Some(FunctionSpec {
                urn: urn.into(),
                payload: vec![],
            })
        };
        let mut c = Components::default();
        c.coders.insert(
            "w".into(),
            Coder {
                spec: spec(window_urn),
                component_coder_ids: vec![],
            },
        );
        c.windowing_strategies.insert(
            "s".into(),
            WindowingStrategy {
                window_fn: spec("beam:window_fn:pickled_python:v1"),
                merge_status: merge_status::Enum::NeedsMerge as i32,
                window_coder_id: "w".into(),
                environment_id: "py".into(),
                ..Default::default()
            },
        );
        if env_present {
            c.environments.insert("py".into(), Environment::default());
        }
        c.pcollections.insert(
            "in".into(),
            PCollection {
                windowing_strategy_id: "s".into(),
                ..Default::default()
            },
        );
        let gbk = PTransform {
            unique_name: "Group".into(),
            spec: spec(urns::GROUP_BY_KEY),
            inputs: [("0".to_string(), "in".to_string())].into(),
            ..Default::default()
        };
        (c, gbk)
    }

    #[test]
    fn a_users_merging_window_fn_is_merged_by_its_sdk_when_it_can_be() {
        let (c, gbk) = grouping(urns::INTERVAL_WINDOW, true);
        check_merging(&c, &gbk).unwrap();

        let (c, gbk) = grouping(urns::INTERVAL_WINDOW, false);
        let e = check_merging(&c, &gbk).unwrap_err().to_string();
        assert!(
            e.contains("'Group'") && e.contains("no SDK environment"),
            "{e}"
        );

        let (c, gbk) = grouping("beam:coder:my_window:v1", true);
        let e = check_merging(&c, &gbk).unwrap_err().to_string();
        assert!(
            e.contains("'Group'") && e.contains("beam:coder:my_window:v1"),
            "{e}"
        );
    }
}
