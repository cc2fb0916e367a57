//! Combiner lifting, as Beam's portable runners do it for SDKs that submit `CombinePerKey` whole
//! (Java, Go, and Python with `--experiments=pre_optimize=none`): the composite becomes
//! Precombine (partial accumulators per key, fused into the stage that produces the input),
//! GroupByKey (of accumulators, not of every value), MergeAccumulators and ExtractOutputs, each
//! an SDK transform carrying the user's own CombineFn. A composite the SDK lifted already, one
//! whose input is not a KV, or one whose trigger must see every element stays as it came.
use prost::Message;

use crate::coders;
use crate::error::PortableError;
use crate::runner_api::trigger::Trigger as T;
use crate::runner_api::{
    CombinePayload, Components, FunctionSpec, PCollection, PTransform, Trigger,
};
use crate::urns;

use super::leaves::urn;

/// Rewrites every liftable `CombinePerKey` of `components` to its four lifted parts (the
/// composite's subtransforms, which planning then opens it to).
pub(crate) fn combiners(components: &mut Components) -> Result<(), PortableError> {
    let mut ids: Vec<String> = components
        .transforms
        .iter()
        .filter(|(_, t)| urn(t) == urns::COMBINE_PER_KEY)
        .map(|(id, _)| id.clone())
        .collect();
    ids.sort();
    for id in ids {
        lift(components, &id)?;
    }
    Ok(())
}

fn lift(components: &mut Components, id: &str) -> Result<(), PortableError> {
    let t = components.transforms[id].clone();
    let lifted_already = t.subtransforms.iter().any(|s| {
        components
            .transforms
            .get(s)
            .is_some_and(|s| urn(s) == urns::COMBINE_PER_KEY_PRECOMBINE)
    });
    let environment = if t.environment_id.is_empty() {
        // A composite may leave its environment to its parts.
        t.subtransforms
            .iter()
            .filter_map(|s| components.transforms.get(s))
            .map(|s| s.environment_id.clone())
            .find(|e| !e.is_empty())
            .unwrap_or_default()
    } else {
        t.environment_id.clone()
    };
    let (Some(input), Some(output)) = (t.inputs.values().next(), t.outputs.values().next()) else {
        return Ok(());
    };
    if lifted_already || environment.is_empty() || t.inputs.len() != 1 {
        return Ok(());
    }
    let payload = t.spec.as_ref().map(|s| s.payload.as_slice()).unwrap_or(&[]);
    let combine = CombinePayload::decode(payload).map_err(|e| {
        PortableError::unsupported(
            &t.unique_name,
            format!("its Combine payload does not decode: {e}"),
        )
    })?;
    let input_pcoll = components.pcollections[input].clone();
    let output_pcoll = components.pcollections[output].clone();
    let key_coder = match components.coders.get(&input_pcoll.coder_id) {
        Some(c) if c.spec.as_ref().is_some_and(|s| s.urn == urns::KV) => {
            c.component_coder_ids[0].clone()
        }
        _ => return Ok(()),
    };
    let trigger = components
        .windowing_strategies
        .get(&input_pcoll.windowing_strategy_id)
        .and_then(|w| w.trigger.as_ref());
    if !sees_panes_not_elements(trigger) {
        return Ok(());
    }

    let acc = combine.accumulator_coder_id.clone();
    if !components.coders.contains_key(&acc) {
        return Ok(()); // nothing to carry partial accumulators in
    }
    let key_acc = coders::add_coder(
        components,
        &format!("{id}_key_acc"),
        urns::KV,
        vec![key_coder.clone(), acc.clone()],
    );
    let accs = coders::add_coder(components, &format!("{id}_accs"), urns::ITERABLE, vec![acc]);
    let key_accs = coders::add_coder(
        components,
        &format!("{id}_key_accs"),
        urns::KV,
        vec![key_coder, accs],
    );
    let pcollection =
        |components: &mut Components, suffix: &str, like: &PCollection, coder: &str| {
            let pid = format!("{id}/{suffix}.out");
            components.pcollections.insert(
                pid.clone(),
                PCollection {
                    unique_name: format!("{}/{suffix}.out", t.unique_name),
                    coder_id: coder.to_string(),
                    ..like.clone()
                },
            );
            pid
        };
    let precombined = pcollection(components, "Precombine", &input_pcoll, &key_acc);
    let grouped = pcollection(components, "Group", &output_pcoll, &key_accs);
    let merged = pcollection(components, "Merge", &output_pcoll, &key_acc);

    let step = |suffix: &str, spec_urn: &str, from: &str, to: &str, sdk: bool| PTransform {
        unique_name: format!("{}/{suffix}", t.unique_name),
        spec: Some(FunctionSpec {
            urn: spec_urn.to_string(),
            payload: if sdk { payload.to_vec() } else { Vec::new() },
        }),
        inputs: [("in".to_string(), from.to_string())].into(),
        outputs: [("out".to_string(), to.to_string())].into(),
        environment_id: if sdk {
            environment.clone()
        } else {
            String::new()
        },
        annotations: t.annotations.clone(),
        ..Default::default()
    };
    let parts = [
        (
            "Precombine",
            step(
                "Precombine",
                urns::COMBINE_PER_KEY_PRECOMBINE,
                input,
                &precombined,
                true,
            ),
        ),
        (
            "Group",
            step("Group", urns::GROUP_BY_KEY, &precombined, &grouped, false),
        ),
        (
            "Merge",
            step(
                "Merge",
                urns::COMBINE_PER_KEY_MERGE_ACCUMULATORS,
                &grouped,
                &merged,
                true,
            ),
        ),
        (
            "ExtractOutputs",
            step(
                "ExtractOutputs",
                urns::COMBINE_PER_KEY_EXTRACT_OUTPUTS,
                &merged,
                output,
                true,
            ),
        ),
    ];
    let mut subtransforms = Vec::with_capacity(parts.len());
    for (suffix, part) in parts {
        let part_id = format!("{id}/{suffix}");
        components.transforms.insert(part_id.clone(), part);
        subtransforms.push(part_id);
    }
    if let Some(t) = components.transforms.get_mut(id) {
        t.subtransforms = subtransforms;
    }
    Ok(())
}

/// Whether a trigger fires on panes a partial combine does not change: one that must observe
/// every element (an element count above one, say) needs them ungrouped (Beam's rule).
fn sees_panes_not_elements(trigger: Option<&Trigger>) -> bool {
    let Some(trigger) = trigger.and_then(|t| t.trigger.as_ref()) else {
        return true;
    };
    let sub = |t: &Option<Box<Trigger>>| sees_panes_not_elements(t.as_deref());
    match trigger {
        T::Default(_) | T::Always(_) | T::Never(_) => true,
        T::AfterProcessingTime(_) | T::AfterSynchronizedProcessingTime(_) => true,
        T::ElementCount(c) => c.element_count == 1,
        T::AfterEndOfWindow(w) => sub(&w.early_firings) && sub(&w.late_firings),
        T::AfterAny(any) => any
            .subtriggers
            .iter()
            .all(|t| sees_panes_not_elements(Some(t))),
        T::Repeat(r) => sub(&r.subtrigger),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner_api::trigger::{AfterEndOfWindow, ElementCount, Repeat};

    #[test]
    fn a_trigger_that_counts_elements_keeps_the_combine_unlifted() {
        let count = |n| Trigger {
            trigger: Some(T::ElementCount(ElementCount { element_count: n })),
        };
        let early = |t: Trigger| Trigger {
            trigger: Some(T::AfterEndOfWindow(Box::new(AfterEndOfWindow {
                early_firings: Some(Box::new(Trigger {
                    trigger: Some(T::Repeat(Box::new(Repeat {
                        subtrigger: Some(Box::new(t)),
                    }))),
                })),
                late_firings: None,
            }))),
        };
        assert!(sees_panes_not_elements(None));
        assert!(sees_panes_not_elements(Some(&early(count(1)))));
        assert!(!sees_panes_not_elements(Some(&early(count(5)))));
    }
}
