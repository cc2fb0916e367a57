//! Phase 6, apply: the four children built from the job, the plan the children run, the pods
//! decided and the run (`children`, pure), then server-side applied in one go. Children that
//! can't be made (a spec mistake the schema can't catch) make the spec invalid.
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
    Ok(Ok(Applied {
        run,
        ready_workers: workers
            .status
            .and_then(|s| s.ready_replicas)
            .unwrap_or_default(),
    }))
}
