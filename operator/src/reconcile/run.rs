//! Phase 4, run: the job's run as its coordinator and its pods show it. A job being cancelled
//! is told to cancel; an active, started one is followed by a long poll of its coordinator's
//! `JobProgress`, so a transition is seen as it happens; then its pods, from the pod watch's
//! store, as they are after the wait.
use super::admit::Admitted;
use super::context::{Context, key};
use crate::children::{self, labels};
use crate::coordinator_client;
use crate::crd::{DataflowJob, JobState};
use crate::pods::{self, PodProblem};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use riverbank_pipeline::progress::JobProgress;
use std::sync::Arc;
use std::time::Duration;

/// What the coordinator and the pods said.
#[derive(Debug, Clone)]
pub struct Ran {
    /// The answer to `POST /v1/cancel`, when this reconcile cancelled a started job.
    pub cancel: Option<Result<(), String>>,
    /// The coordinator's answer; None when it was not asked (job stopped or being cancelled).
    pub progress: Option<Result<JobProgress, String>>,
    /// The job's pods after the wait.
    pub pods: Vec<Arc<Pod>>,
    /// The worst problem among them, while the job is followed.
    pub pod_problem: Option<PodProblem>,
}

impl Ran {
    /// The coordinator's progress, when it answered.
    pub fn reading(&self) -> Option<&JobProgress> {
        self.progress.as_ref().and_then(|p| p.as_ref().ok())
    }
}

pub async fn run(ctx: &Context, job: &DataflowJob, admitted: &Admitted) -> Ran {
    let Admitted {
        namespace,
        name,
        address,
        ..
    } = admitted;
    let cancel = if admitted.cancelling && admitted.started {
        let answer = ctx.coordinator.cancel(address).await;
        if let Err(e) = &answer {
            tracing::warn!(job = %key(job), error = %e, "cancel: the coordinator did not answer; scaling to zero anyway");
        }
        Some(answer.map_err(|e| e.to_string()))
    } else {
        None
    };
    let following = admitted.going() && admitted.started;
    let progress = if following {
        let wait = follow_wait(admitted.previous, &ctx.pods.of_job(namespace, name));
        Some(
            ctx.coordinator
                .status(address, wait)
                .await
                .map_err(|e| e.to_string()),
        )
    } else {
        None
    };
    // The pods as they are after the wait.
    let pods = ctx.pods.of_job(namespace, name);
    let pod_problem = following
        .then(|| pods::diagnose(pods.iter().map(AsRef::as_ref)))
        .flatten();
    Ran {
        cancel,
        progress,
        pods,
        pod_problem,
    }
}

/// The job's coordinator pod is running.
pub fn coordinator_up(pods: &[Arc<Pod>]) -> bool {
    pods.iter().any(|p| {
        p.labels().get(labels::COMPONENT).map(String::as_str) == Some(children::COORDINATOR)
            && p.metadata.deletion_timestamp.is_none()
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
}

/// How long the coordinator may hold this reconcile's status request: a long poll while the job
/// runs, or is starting with its coordinator pod up, so that a transition (Running, Done) is
/// seen as it happens, even on a job of a few seconds.
fn follow_wait(previous: Option<JobState>, pods: &[Arc<Pod>]) -> Option<Duration> {
    match previous {
        Some(JobState::Running | JobState::Draining | JobState::Updating) => {
            Some(coordinator_client::MAX_WAIT)
        }
        Some(JobState::Pending) if coordinator_up(pods) => Some(coordinator_client::MAX_WAIT),
        _ => None,
    }
}
