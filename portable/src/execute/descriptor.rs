//! The ProcessBundleDescriptor of an SDK stage: its fused transforms, a data-plane source for
//! each materialized input and a sink for each materialized output, and the components they
//! name.
use std::collections::HashMap;

use prost::Message;

use crate::fn_api::{ProcessBundleDescriptor, RemoteGrpcPort};
use crate::plan::{Plan, SdkStage};
use crate::runner_api::{ApiServiceDescriptor, FunctionSpec, PTransform};
use crate::urns;

/// Data-source and sink transform ids of a stage, by PCollection.
pub(crate) struct Ports {
    pub inputs: HashMap<String, String>,
    pub outputs: HashMap<String, String>,
}

pub(crate) fn build(
    plan: &Plan,
    stage: &SdkStage,
    id: &str,
    url: &str,
) -> (ProcessBundleDescriptor, Ports) {
    let c = &plan.components;
    let mut d = ProcessBundleDescriptor {
        id: id.to_string(),
        state_api_service_descriptor: Some(ApiServiceDescriptor {
            url: url.to_string(),
            authentication: None,
        }),
        ..Default::default()
    };
    let port = |pcoll: &str| {
        RemoteGrpcPort {
            api_service_descriptor: Some(ApiServiceDescriptor {
                url: url.to_string(),
                authentication: None,
            }),
            coder_id: plan.materialized[pcoll].wire_coder.clone(),
        }
        .encode_to_vec()
    };
    let mut ports = Ports {
        inputs: HashMap::new(),
        outputs: HashMap::new(),
    };
    for t in &stage.transforms {
        let transform = c.transforms[t].clone();
        for p in transform.inputs.values().chain(transform.outputs.values()) {
            d.pcollections.insert(p.clone(), c.pcollections[p].clone());
        }
        d.transforms.insert(t.clone(), transform);
    }
    // A data-plane end: a source reads PCollection `p` from the runner, a sink writes it back.
    let end = |p: &String, urn: &str, tid: &str| PTransform {
        unique_name: tid.to_string(),
        spec: Some(FunctionSpec {
            urn: urn.into(),
            payload: port(p),
        }),
        inputs: if urn == urns::DATA_OUTPUT {
            [("in".to_string(), p.clone())].into()
        } else {
            Default::default()
        },
        outputs: if urn == urns::DATA_INPUT {
            [("out".to_string(), p.clone())].into()
        } else {
            Default::default()
        },
        ..Default::default()
    };
    for p in &stage.inputs {
        let tid = format!("{id}/read/{p}");
        d.pcollections.insert(p.clone(), c.pcollections[p].clone());
        d.transforms
            .insert(tid.clone(), end(p, urns::DATA_INPUT, &tid));
        ports.inputs.insert(p.clone(), tid);
    }
    for p in &stage.outputs {
        let tid = format!("{id}/write/{p}");
        d.transforms
            .insert(tid.clone(), end(p, urns::DATA_OUTPUT, &tid));
        ports.outputs.insert(p.clone(), tid);
    }
    if stage
        .keyed
        .as_ref()
        .is_some_and(|k| !k.timer_families.is_empty())
    {
        d.timer_api_service_descriptor = Some(ApiServiceDescriptor {
            url: url.to_string(),
            authentication: None,
        });
    }
    // Coders, windowing strategies and environments: all of them (the harness looks up by id).
    d.coders = c.coders.clone();
    d.windowing_strategies = c.windowing_strategies.clone();
    d.environments = c.environments.clone();
    (d, ports)
}
