//! Riverbank's Kubernetes operator: the `DataflowJob` custom resource, the pure functions from a
//! job and its plan to the objects that run it, and the controller that reconciles them.
//!
//! Pure parts (`crd`, `children`, `status`, `pods`, `scaling`, `insights`, `memory`,
//! `streaming`, and the leaves `lifecycle`, `quantity`, `settings`) are deterministic and
//! testable without a cluster; `reconcile` does the I/O (API server, coordinator) around them
//! in named phases, and `controller` runs it on the watches, with its requests asserted against
//! a mock API server in its tests.
pub mod children;
pub mod console;
pub mod controller;
pub mod coordinator_client;
pub mod crd;
#[cfg(test)]
mod fixtures;
pub mod http;
pub mod insights;
pub mod leader;
pub mod lifecycle;
pub mod memory;
pub mod metrics;
pub mod pods;
pub mod quantity;
pub mod reconcile;
pub mod scaling;
pub mod settings;
pub mod status;
pub mod streaming;

pub use children::{Children, ChildrenError, desired_children, desired_children_sized};
pub use crd::{DataflowJob, DataflowJobSpec, DataflowJobStatus};
pub use settings::OperatorSettings;

use kube::CustomResourceExt;

/// The CustomResourceDefinition as YAML, exactly as checked in at `crds/dataflowjob.yaml`.
pub fn crd_yaml() -> String {
    let body = serde_norway::to_string(&DataflowJob::crd()).expect("a CRD always serializes");
    format!(
        "# Generated from operator/src/crd.rs by `cargo run -p riverbank-operator -- crd`. Do not edit.\n{body}"
    )
}
