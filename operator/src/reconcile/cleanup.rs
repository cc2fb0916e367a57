//! A deleted job (the finalizer's work). One that is final (or never ran) is released at once:
//! its children go by garbage collection (owner references). An active one is first cancelled
//! through its coordinator, which aborts its sinks' temporary files; the job is released once
//! the coordinator reports a final phase, or, if it does not within
//! [`Context::cleanup_timeout`] of the deletion, released anyway with a Warning Event: a
//! coordinator that is gone or stuck must not keep the job forever.
use super::context::{Context, key};
use super::{finalizer, run};
use crate::children;
use crate::crd::{DataflowJob, JobState};
use crate::lifecycle::previous_state;
use crate::scaling::Autoscalers;
use crate::status;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::runtime::events::{Event, EventType};
use std::time::Duration;

/// A deleted job whose coordinator has not confirmed the cancel yet is looked at this often.
pub const CLEANUP_RETRY: Duration = Duration::from_secs(2);
/// How long the coordinator may hold the request that follows a cancel, waiting for the job to
/// reach its final phase.
const CLEANUP_WAIT: Duration = Duration::from_secs(2);

/// What became of a deleted job.
pub enum Deletion {
    /// It holds no finalizer: nothing to do.
    Gone,
    /// Its coordinator has not confirmed the cancel yet: look again in [`CLEANUP_RETRY`].
    Waiting,
    /// Release it (remove the finalizer), after publishing the Event, if any.
    Release(Option<Box<Event>>),
}

pub async fn cleanup(ctx: &Context, job: &DataflowJob, namespace: &str) -> Deletion {
    ctx.autoscalers.forget(&Autoscalers::key(job));
    if !finalizer::has(job) {
        return Deletion::Gone;
    }
    let name = job.name_any();
    let old = job.status.clone().unwrap_or_default();
    let previous = previous_state(&old);
    let coordinator_up = run::coordinator_up(&ctx.pods.of_job(namespace, &name));
    let nothing_to_stop = match previous {
        Some(s) if s.is_terminal() => Some(format!(
            "The job was {} when deleted: nothing to cancel",
            status::state_name(s)
        )),
        // A job that is starting is cancelled only if its coordinator runs.
        None | Some(JobState::Pending) if !coordinator_up => Some(
            "The job's coordinator was not running when the job was deleted: nothing to cancel"
                .into(),
        ),
        _ => None,
    };
    if let Some(why) = nothing_to_stop {
        tracing::info!(job = %key(job), "{why}; releasing");
        return Deletion::Release(None);
    }

    let address = children::coordinator_address(&name, namespace, &ctx.settings.cluster_domain);
    let answer = match ctx.coordinator.cancel(&address).await {
        Ok(()) => ctx
            .coordinator
            .status(&address, Some(CLEANUP_WAIT))
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let deleted_at = job
        .metadata
        .deletion_timestamp
        .as_ref()
        .map_or_else(Timestamp::now, |t| t.0);
    let waited = Timestamp::now().duration_since(deleted_at);
    let timeout = SignedDuration::try_from(ctx.cleanup_timeout).unwrap_or(SignedDuration::MAX);
    let event = match &answer {
        Ok(p) if p.phase.is_terminal() => Event {
            type_: EventType::Normal,
            reason: "CleanedUp".into(),
            note: Some(format!(
                "Deleted while active: the coordinator cancelled the job ({:?}) and aborted its sinks' temporary files",
                p.phase
            )),
            action: "Cleanup".into(),
            secondary: None,
        },
        _ if waited < timeout => {
            let state = answer
                .as_ref()
                .map_or_else(|e| e.clone(), |p| format!("still {:?}", p.phase));
            tracing::info!(job = %key(job), %state, "deleted: waiting for the coordinator to cancel");
            return Deletion::Waiting;
        }
        _ => {
            let why = match &answer {
                Ok(p) => format!("it still reported {:?}", p.phase),
                Err(e) => e.clone(),
            };
            Event {
                type_: EventType::Warning,
                reason: "CleanupTimedOut".into(),
                note: Some(format!(
                    "Deleted while active, and the coordinator did not confirm the cancel within {} s ({why}); releasing the job: its sinks' temporary files (.temp-riverbank-*) may remain",
                    ctx.cleanup_timeout.as_secs()
                )),
                action: "Cleanup".into(),
                secondary: None,
            }
        }
    };
    Deletion::Release(Some(Box::new(event)))
}
