//! Splittable DoFns (every bounded read of the Python SDK) become the three transforms Beam's
//! SDK harnesses implement: pair each element with its initial restriction, split and size the
//! restrictions, then process each (element, restriction). The split restrictions are
//! materialized, so a big read spreads over bundles and harnesses.
use crate::coders;
use crate::error::PortableError;
use crate::runner_api::{Components, PCollection};
use crate::urns;

use super::leaves::{par_do_payload, urn};

/// A leaf after which the next transform must start a new stage (its output is materialized).
pub(crate) const SPLIT_SUFFIX: &str = "/SplitAndSizeRestriction";

pub(crate) fn expand(
    components: &mut Components,
    leaves: Vec<String>,
) -> Result<Vec<String>, PortableError> {
    let mut out = Vec::with_capacity(leaves.len());
    for id in leaves {
        let t = components.transforms[&id].clone();
        if urn(&t) != urns::PAR_DO {
            out.push(id);
            continue;
        }
        let payload = par_do_payload(&t)?;
        if payload.restriction_coder_id.is_empty() {
            out.push(id);
            continue;
        }
        let main_tag = t
            .inputs
            .keys()
            .find(|tag| !payload.side_inputs.contains_key(*tag))
            .cloned()
            .ok_or_else(|| {
                PortableError::unsupported(&t.unique_name, "a splittable DoFn without a main input")
            })?;
        let main = components.pcollections[&t.inputs[&main_tag]].clone();
        let doubles = coders::add_coder(components, "doubles", urns::DOUBLE, vec![]);
        let paired_coder = coders::add_coder(
            components,
            &format!("{id}_paired"),
            urns::KV,
            vec![main.coder_id.clone(), payload.restriction_coder_id.clone()],
        );
        let sized_coder = coders::add_coder(
            components,
            &format!("{id}_sized"),
            urns::KV,
            vec![paired_coder.clone(), doubles],
        );
        let paired = add_pcollection(components, &main, &format!("{id}_paired"), paired_coder);
        let split = add_pcollection(components, &main, &format!("{id}_split"), sized_coder);

        let step = |suffix: &str, spec_urn: &str, input: &str, output: &str| {
            let mut s = t.clone();
            s.unique_name = format!("{}{suffix}", t.unique_name);
            s.subtransforms.clear();
            if let Some(spec) = s.spec.as_mut() {
                spec.urn = spec_urn.to_string();
            }
            s.inputs.insert(main_tag.clone(), input.to_string());
            s.outputs = if output.is_empty() {
                t.outputs.clone()
            } else {
                [("out".to_string(), output.to_string())].into()
            };
            (format!("{id}{suffix}"), s)
        };
        let main_input = t.inputs[&main_tag].clone();
        for (new_id, transform) in [
            step(
                "/PairWithRestriction",
                urns::PAIR_WITH_RESTRICTION,
                &main_input,
                &paired,
            ),
            step(
                SPLIT_SUFFIX,
                urns::SPLIT_AND_SIZE_RESTRICTIONS,
                &paired,
                &split,
            ),
            step(
                "/Process",
                urns::PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS,
                &split,
                "",
            ),
        ] {
            components.transforms.insert(new_id.clone(), transform);
            out.push(new_id);
        }
    }
    Ok(out)
}

fn add_pcollection(
    components: &mut Components,
    like: &PCollection,
    id: &str,
    coder: String,
) -> String {
    let mut p = like.clone();
    p.unique_name = format!("{}{}", like.unique_name, &id[id.rfind('_').unwrap_or(0)..]);
    p.coder_id = coder;
    components.pcollections.insert(id.to_string(), p);
    id.to_string()
}
