//! Riverbank's Kubernetes operator: the `DataflowJob` custom resource and the pure functions
//! from a job and its plan to the objects that run it.
//!
//! The controller loop (watch, apply children, prune, lifecycle, autoscaling, status) is not
//! here yet; everything in this crate is deterministic and testable without a cluster.
pub mod children;
pub mod crd;

pub use children::{Children, ChildrenError, OperatorSettings, desired_children};
pub use crd::{DataflowJob, DataflowJobSpec, DataflowJobStatus};

use kube::CustomResourceExt;

/// The CustomResourceDefinition as YAML, exactly as checked in at `crds/dataflowjob.yaml`.
pub fn crd_yaml() -> String {
    let body = serde_norway::to_string(&DataflowJob::crd()).expect("a CRD always serializes");
    format!(
        "# Generated from operator/src/crd.rs by `cargo run -p riverbank-operator -- crd`. Do not edit.\n{body}"
    )
}
