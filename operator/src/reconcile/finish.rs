//! Phase 8, finish: what follows a written report — the autoscaler's decision marked published
//! (and counted, when it rescaled), the finalizer released once the job is over and its pods
//! are at zero — and when to look at the job again.
use super::context::{Context, Error};
use super::finalizer;
use super::scale::Scaled;
use crate::crd::{DataflowJob, DataflowJobStatus, JobState};
use crate::lifecycle::Replicas;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use std::time::Duration;

/// A running job is looked at again this soon after each reconcile, whose long poll of the
/// coordinator (up to [`crate::coordinator_client::MAX_WAIT`]) paces it while nothing happens.
pub const FOLLOW_REQUEUE: Duration = Duration::from_secs(1);
/// A starting job (Pending) is looked at again this soon: its coordinator may not answer yet.
pub const STARTING_REQUEUE: Duration = Duration::from_secs(2);

pub async fn finish(
    ctx: &Context,
    job: &DataflowJob,
    namespace: &str,
    scaled: &Scaled,
    next: &DataflowJobStatus,
) -> Result<Action, Error> {
    if let Some(d) = &scaled.autoscaled.event {
        ctx.autoscalers.published(&scaled.scaler, d.at_secs);
        if d.is_rescale() && !d.dry_run {
            ctx.metrics.rescaled(
                namespace,
                &job.name_any(),
                d.target_workers > d.current_workers,
            );
        }
    }
    if next.state.is_some_and(JobState::is_terminal) && scaled.replicas == Replicas::STOPPED {
        // Over, its final state stored and its pods at zero: nothing is left to cancel.
        finalizer::release(ctx, job, namespace).await?;
    }
    Ok(next_action(
        next.state,
        scaled.replicas,
        ctx.status_interval,
    ))
}

/// When to look at a job again: the operator's own status writes do not bring it back (the job
/// stream is filtered), so this is the only clock of a job that nothing else changes.
pub fn next_action(state: Option<JobState>, applied: Replicas, interval: Duration) -> Action {
    match state {
        // Just finished: scale its pods to zero now that the final state is stored.
        Some(s) if s.is_terminal() && applied != Replicas::STOPPED => {
            Action::requeue(Duration::ZERO)
        }
        // Nothing to poll; a change to the job or a child brings it back.
        Some(s) if s.is_terminal() => Action::await_change(),
        Some(JobState::Running | JobState::Draining | JobState::Updating) => {
            Action::requeue(FOLLOW_REQUEUE)
        }
        Some(JobState::Pending) | None => Action::requeue(STARTING_REQUEUE),
        Some(_) => Action::requeue(interval),
    }
}
