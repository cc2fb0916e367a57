//! The `riverbank.dev/cleanup` finalizer: added to an active job, released once it is over (or
//! its spec is invalid, or it was deleted and cancelled).
use super::context::{Context, Error, key};
use super::write;
use crate::crd::DataflowJob;
use kube::ResourceExt;

/// The finalizer on every *active* job: its deletion waits until the coordinator cancelled the
/// job (and aborted its sinks' temporary files), or until [`Context::cleanup_timeout`] has
/// passed. A job loses it once it is final and its pods are at zero (or its spec is invalid),
/// so a job that is over never holds up its deletion, or its namespace's, once no operator is
/// left to remove it (after `helm uninstall`). Nothing is done about it on shutdown: SIGTERM is
/// a rollout or a leader change as often as an uninstall.
pub const FINALIZER: &str = "riverbank.dev/cleanup";

pub fn has(job: &DataflowJob) -> bool {
    job.finalizers().iter().any(|f| f == FINALIZER)
}

/// Adds the finalizer with a JSON patch that first tests the list it extends, so a concurrent
/// change of the finalizers fails the patch (and the reconcile is retried) instead of being lost.
pub async fn add(ctx: &Context, job: &DataflowJob, namespace: &str) -> Result<(), Error> {
    let patch = if job.finalizers().is_empty() {
        serde_json::json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
        ])
    } else {
        serde_json::json!([
            {"op": "test", "path": "/metadata/finalizers", "value": job.finalizers()},
            {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER},
        ])
    };
    write::json_patch(ctx, job, namespace, patch).await
}

/// Removes the finalizer (at its index, tested first), if the job has it; a job already gone
/// is fine.
pub async fn release(ctx: &Context, job: &DataflowJob, namespace: &str) -> Result<(), Error> {
    let Some(i) = job.finalizers().iter().position(|f| f == FINALIZER) else {
        return Ok(());
    };
    tracing::info!(job = %key(job), "removing the finalizer");
    let path = format!("/metadata/finalizers/{i}");
    let patch = serde_json::json!([
        {"op": "test", "path": path, "value": FINALIZER},
        {"op": "remove", "path": path},
    ]);
    match write::json_patch(ctx, job, namespace, patch).await {
        Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => Ok(()),
        other => other,
    }
}
