//! Phase 2, plan: the pipeline planned once per reconcile (the same planner as `riverbank
//! plan`), and from the plan the workers' configured resources (its transforms' resource
//! hints), which the autoscaler, vertical autoscaling and the children all use.
use super::admit::{Admitted, Invalid};
use crate::children::{self, ChildrenError};
use crate::crd::{DataflowJob, JobState};
use crate::lifecycle::INVALID_PIPELINE;
use crate::settings::OperatorSettings;
use k8s_openapi::api::core::v1::ResourceRequirements;
use riverbank_pipeline::{PipelineError, Plan};

/// What the spec plans to.
pub enum Pipeline {
    /// The children run the spec's plan.
    Spec(Plan),
    /// A streaming job its coordinator runs: streaming control (`control`) decides whether the
    /// children run the spec's plan (`Ok`) or keep the running one (an update refused or under
    /// way; an invalid new pipeline is an update refused, not a stopped job).
    Steered(Result<Plan, PipelineError>),
}

pub struct Planned {
    pub pipeline: Pipeline,
    /// The workers' configured resources (`children::worker_requests`), or why they can't be
    /// made (reported by the children, as an invalid spec).
    pub workers: Result<ResourceRequirements, ChildrenError>,
}

impl Planned {
    /// The spec's plan, when it plans.
    pub fn spec(&self) -> Option<&Plan> {
        match &self.pipeline {
            Pipeline::Spec(plan) | Pipeline::Steered(Ok(plan)) => Some(plan),
            Pipeline::Steered(Err(_)) => None,
        }
    }
}

pub fn plan(
    job: &DataflowJob,
    admitted: &Admitted,
    settings: &OperatorSettings,
) -> Result<Planned, Invalid> {
    let spec = job.plan();
    let hints = spec
        .as_ref()
        .map(Plan::worker_resource_hints)
        .unwrap_or_default();
    let workers = children::worker_requests(job, settings, &hints);
    // A streaming Beam SDK job's runner keeps its own state (checkpoints under tempLocation):
    // it is drained and cancelled, never steered through updates and snapshots.
    let steered = admitted.streaming
        && !job.is_beam_sdk()
        && admitted.going()
        && matches!(
            admitted.previous,
            Some(JobState::Running | JobState::Draining | JobState::Updating)
        )
        && (spec.is_ok() || admitted.old.run.is_some());
    let pipeline = match spec {
        _ if steered => Pipeline::Steered(spec),
        Ok(plan) => Pipeline::Spec(plan),
        Err(e) => {
            return Err(Invalid {
                reason: INVALID_PIPELINE,
                error: e.to_string(),
                now: admitted.now,
            });
        }
    };
    Ok(Planned { pipeline, workers })
}
