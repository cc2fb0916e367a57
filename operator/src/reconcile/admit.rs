//! Phase 1, admit: is there a job to run this time? A deleted job goes to `cleanup`; a spec
//! already reported invalid waits for a new one; an active job gets the finalizer; a spec that
//! cannot run whatever its pipeline says is invalid. What is admitted carries what the rest of
//! the reconcile reads of the job's past.
use super::context::{Context, Error};
use super::finalizer;
use crate::children;
use crate::crd::{DataflowJob, DataflowJobStatus, DesiredState, JobState};
use crate::lifecycle::{INVALID_SPEC, is_invalid_spec, previous_state};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

/// A job admitted for this reconcile, and what it was.
#[derive(Debug, Clone)]
pub struct Admitted {
    pub namespace: String,
    pub name: String,
    /// Its status as this reconcile found it.
    pub old: DataflowJobStatus,
    /// Its state for the lifecycle (`lifecycle::previous_state`).
    pub previous: Option<JobState>,
    /// Not over yet.
    pub active: bool,
    /// Active, and desiredState Cancelled.
    pub cancelling: bool,
    /// Started earlier: it has a coordinator to ask or to stop.
    pub started: bool,
    pub streaming: bool,
    /// Its coordinator's address.
    pub address: String,
    pub now: Timestamp,
}

impl Admitted {
    /// Active, not being cancelled.
    pub fn going(&self) -> bool {
        self.active && !self.cancelling
    }
}

/// The spec can't run: `reason` is `lifecycle::INVALID_PIPELINE` or `INVALID_SPEC`.
#[derive(Debug, Clone)]
pub struct Invalid {
    pub reason: &'static str,
    pub error: String,
    pub now: Timestamp,
}

pub enum Admission {
    Admitted(Box<Admitted>),
    /// Deleted: the finalizer's work (`cleanup`).
    Deleted,
    /// Its spec was reported invalid for this generation: only a new spec can change that.
    AlreadyInvalid(Box<DataflowJobStatus>),
    Invalid(Invalid),
}

pub async fn admit(ctx: &Context, job: &DataflowJob, namespace: &str) -> Result<Admission, Error> {
    let name = job.name_any();
    if job.metadata.deletion_timestamp.is_some() {
        return Ok(Admission::Deleted);
    }
    let old = job.status.clone().unwrap_or_default();
    if is_invalid_spec(&old) && old.observed_generation == job.metadata.generation {
        return Ok(Admission::AlreadyInvalid(Box::new(old)));
    }
    // The finalizer is there to cancel an *active* job when it is deleted: a job that is over
    // never gets it (and loses it once its pods are at zero, in `finish`), so a finished job
    // cannot keep its namespace Terminating when no operator is left to remove it.
    if previous_state(&old).is_none_or(|s| !s.is_terminal()) && !finalizer::has(job) {
        finalizer::add(ctx, job, namespace).await?;
    }
    let now = Timestamp::now();
    let streaming = job.spec.options.streaming();
    if streaming && job.spec.options.temp_location.is_none() {
        let error = "a streaming job needs options.tempLocation (an object store URL, or a path every pod mounts): its checkpoints and state shards are kept there so that any worker can restore them";
        return Ok(Admission::Invalid(Invalid {
            reason: INVALID_SPEC,
            error: error.into(),
            now,
        }));
    }
    let previous = previous_state(&old);
    let active = previous.is_none_or(|s| !s.is_terminal());
    let address = children::coordinator_address(&name, namespace, &ctx.settings.cluster_domain);
    Ok(Admission::Admitted(Box::new(Admitted {
        namespace: namespace.to_string(),
        cancelling: active && job.spec.desired_state == DesiredState::Cancelled,
        // Only a job that was started has a coordinator to ask or to stop.
        started: previous.is_some(),
        name,
        old,
        previous,
        active,
        streaming,
        address,
        now,
    })))
}
