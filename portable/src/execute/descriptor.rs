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
    for p in &stage.inputs {
        let tid = format!("{id}/read/{p}");
        let spec = FunctionSpec {
            urn: urns::DATA_INPUT.into(),
            payload: port(p),
        };
        let source = PTransform {
            unique_name: tid.clone(),
            spec: Some(spec),
            outputs: [("out".to_string(), p.clone())].into(),
            ..Default::default()
        };
        d.pcollections.insert(p.clone(), c.pcollections[p].clone());
        d.transforms.insert(tid.clone(), source);
        ports.inputs.insert(p.clone(), tid);
    }
    for p in &stage.outputs {
        let tid = format!("{id}/write/{p}");
        let spec = FunctionSpec {
            urn: urns::DATA_OUTPUT.into(),
            payload: port(p),
        };
        let sink = PTransform {
            unique_name: tid.clone(),
            spec: Some(spec),
            inputs: [("in".to_string(), p.clone())].into(),
            ..Default::default()
        };
        d.transforms.insert(tid.clone(), sink);
        ports.outputs.insert(p.clone(), tid);
    }
    // Coders, windowing strategies and environments: all of them (the harness looks up by id).
    d.coders = c.coders.clone();
    d.windowing_strategies = c.windowing_strategies.clone();
    d.environments = c.environments.clone();
    (d, ports)
}
