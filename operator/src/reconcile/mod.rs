//! One reconcile of a DataflowJob, as named phases, each a function from the results before it
//! to a result of its own:
//!
//! admit → plan → control streaming (before the poll) → run → control streaming (after the
//! poll) → scale → apply → report → finish
//!
//! `admit` decides whether there is a job to run (a deleted one goes to `cleanup`, an invalid
//! spec to [`stop_invalid`]); `plan` plans the pipeline once and sizes the workers from it;
//! `control` steers a streaming job through its coordinator; `run` cancels or follows the job
//! (the coordinator's `JobProgress`, the pods); `scale` decides the pods (autoscaler, memory,
//! counts); `apply` builds and server-side applies the children (and tells a Beam SDK job's
//! runner its SDK worker pods); `report` is the one place that turns the phases' results into
//! the status, the Events, the console and the metrics;
//! `finish` releases what is over and says when to look again. Phases talk to the API server
//! and the coordinator; what they decide is pure (`children`, `status`, `scaling`, `memory`,
//! `streaming`).
mod admit;
mod apply;
mod cleanup;
mod context;
mod control;
mod finalizer;
mod finish;
mod plan;
mod report;
mod run;
mod scale;
mod write;

pub use cleanup::CLEANUP_RETRY;
pub use context::{Context, Error, PodStores, key};
pub use finalizer::FINALIZER;
pub use finish::{FOLLOW_REQUEUE, STARTING_REQUEUE, next_action};
pub use write::{FIELD_MANAGER, STOP_FIELD_MANAGER};

use crate::children;
use crate::crd::DataflowJob;
use crate::metrics::Outcome;
use crate::scaling::Autoscalers;
use admit::{Admission, Invalid};
use cleanup::Deletion;
use kube::ResourceExt;
use kube::runtime::controller::Action;

pub async fn reconcile_job(job: &DataflowJob, ctx: &Context) -> Result<(Action, Outcome), Error> {
    let namespace = job.namespace().ok_or(Error::MissingMetadata("namespace"))?;
    let admitted = match admit::admit(ctx, job, &namespace).await? {
        Admission::Admitted(admitted) => admitted,
        Admission::Deleted => return deleted(ctx, job, &namespace).await,
        Admission::AlreadyInvalid(old) => {
            report::unchanged(ctx, job, &old);
            // Reported once; only a new spec (generation) can change the answer. Its pods are
            // at zero: nothing to cancel, so nothing to hold its deletion for.
            finalizer::release(ctx, job, &namespace).await?;
            return Ok((Action::await_change(), Outcome::Skipped));
        }
        Admission::Invalid(invalid) => return stop_invalid(ctx, job, &namespace, invalid).await,
    };
    let planned = match plan::plan(job, &admitted, &ctx.settings) {
        Ok(planned) => planned,
        Err(invalid) => return stop_invalid(ctx, job, &namespace, invalid).await,
    };
    let steered = control::steer(ctx, job, &admitted, &planned).await?;
    let ran = run::run(ctx, job, &admitted).await;
    let (steered, ran) = control::after_poll(job, &planned, steered, ran, admitted.now);
    let scaled = scale::scale(ctx, job, &admitted, &planned, &ran);
    let applied = match apply::apply(ctx, job, &admitted, &steered, planned, &scaled).await? {
        Ok(applied) => applied,
        Err(invalid) => return stop_invalid(ctx, job, &namespace, invalid).await,
    };
    let report = report::planned(job, &admitted, &steered, ran, &scaled, &applied);
    report::show(ctx, job, &report);
    let next = report::write(ctx, job, &namespace, report).await?;
    let action = finish::finish(ctx, job, &namespace, &scaled, &next).await?;
    Ok((action, Outcome::Applied))
}

/// The spec can't run: record it (once) and stop the pods of an earlier, valid generation.
async fn stop_invalid(
    ctx: &Context,
    job: &DataflowJob,
    namespace: &str,
    invalid: Invalid,
) -> Result<(Action, Outcome), Error> {
    let report = report::invalid(job, &invalid);
    report::show(ctx, job, &report);
    ctx.autoscalers.forget(&Autoscalers::key(job));
    if !report.old.stages.is_empty() {
        let name = job.name_any();
        write::scale_to_zero(ctx, namespace, &children::coordinator_name(&name)).await?;
        write::scale_to_zero(ctx, namespace, &children::workers_name(&name)).await?;
    }
    report::write(ctx, job, namespace, report).await?;
    // Its pods are at zero: nothing to cancel; a fixed spec brings the finalizer back.
    finalizer::release(ctx, job, namespace).await?;
    Ok((Action::await_change(), Outcome::Invalid))
}

/// A deleted job: cancelled through its coordinator if it is active, then released.
async fn deleted(
    ctx: &Context,
    job: &DataflowJob,
    namespace: &str,
) -> Result<(Action, Outcome), Error> {
    match cleanup::cleanup(ctx, job, namespace).await {
        Deletion::Gone => Ok((Action::await_change(), Outcome::Skipped)),
        Deletion::Waiting => Ok((Action::requeue(CLEANUP_RETRY), Outcome::Cleanup)),
        Deletion::Release(event) => {
            if let Some(event) = &event {
                report::publish(ctx, job, event).await;
            }
            report::forget(ctx, job, namespace);
            finalizer::release(ctx, job, namespace).await?;
            Ok((Action::await_change(), Outcome::Cleanup))
        }
    }
}
