//! Phase 6, apply: the four children built from the job, the plan the children run, the pods
//! decided and the run (`children`, pure), then server-side applied in one go; a running Beam
//! SDK job's runner is then told its SDK worker pods' pools. Children that can't be made (a spec
//! mistake the schema can't catch) make the spec invalid.
use super::admit::{Admitted, Invalid};
use super::context::{Context, Error};
use super::control::Steered;
use super::plan::Planned;
use super::scale::Scaled;
use super::write;
use crate::children::{self, Sizing};
use crate::crd::{DataflowJob, RunStatus};
use crate::lifecycle::INVALID_SPEC;
use crate::streaming;

pub struct Applied {
    /// A streaming job's run, as its coordinator was given it.
    pub run: Option<RunStatus>,
    /// The worker StatefulSet's ready pods, as the API server answered the apply.
    pub ready_workers: i32,
}

/// A running Beam SDK job's runner is told the SDK worker pods it may use, as scaled: it starts
/// harnesses in pods added (they join the running stage) and stops asking pods removed. Said at
/// every reconcile (the runner ignores a list it has); a runner that does not answer hears it
/// at the next one.
async fn tell_sdk_workers(ctx: &Context, job: &DataflowJob, admitted: &Admitted, pods: i32) {
    let pools = children::sdk_worker_pools(
        &admitted.name,
        &admitted.namespace,
        &ctx.settings.cluster_domain,
        pods,
    );
    if pools.is_empty() {
        return;
    }
    if let Err(e) = ctx.coordinator.sdk_workers(&admitted.address, &pools).await {
        tracing::debug!(job = %super::context::key(job), error = %e, "the runner did not take its SDK worker pools yet");
    }
}

pub async fn apply(
    ctx: &Context,
    job: &DataflowJob,
    admitted: &Admitted,
    steered: &Steered,
    planned: Planned,
    scaled: &Scaled,
) -> Result<Result<Applied, Invalid>, Error> {
    let run = match &steered.control {
        Some(c) => Some(c.run.clone()),
        None => admitted.streaming.then(|| streaming::current_run(job)),
    };
    let sizing = Sizing {
        replicas: scaled.replicas,
        // The workers' resources as planned (their error, if any, is the children's).
        workers: planned.workers,
        memory: scaled.memory.apply.as_ref(),
    };
    let children = match children::desired_children_run(
        job,
        &steered.plan,
        &ctx.settings,
        sizing,
        run.as_ref(),
    ) {
        Ok(children) => children,
        Err(e) => {
            return Ok(Err(Invalid {
                reason: INVALID_SPEC,
                error: e.to_string(),
                now: admitted.now,
            }));
        }
    };
    let workers = write::apply_children(ctx, &admitted.namespace, children).await?;
    if job.is_beam_sdk() && admitted.started && admitted.going() {
        tell_sdk_workers(ctx, job, admitted, scaled.replicas.workers).await;
    }
    Ok(Ok(Applied {
        run,
        ready_workers: workers
            .status
            .and_then(|s| s.ready_replicas)
            .unwrap_or_default(),
    }))
}
