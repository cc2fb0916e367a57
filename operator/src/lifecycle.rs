//! Where a job is, as its recorded status says (its state for the lifecycle, whether its spec
//! was found invalid, its conditions), and the pods it runs with. A leaf: scaling, streaming
//! control, status and the reconciler all read the job's past from here.
use crate::crd::{DataflowJobStatus, JobState};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use riverbank_pipeline::progress::JobProgress;

/// The Ready condition (the others are in `status`).
pub const READY: &str = "Ready";

/// Reasons of a Failed state that a new spec can fix.
pub const INVALID_PIPELINE: &str = "InvalidPipeline";
pub const INVALID_SPEC: &str = "InvalidSpec";

/// The pods of a job: its coordinator (0 or 1) and its workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replicas {
    pub coordinator: i32,
    pub workers: i32,
}

impl Replicas {
    /// A stopped job keeps its objects (and disks) at zero pods until it is deleted.
    pub const STOPPED: Replicas = Replicas {
        coordinator: 0,
        workers: 0,
    };
}

/// True when the status says only that the spec (pipeline or pod settings) is invalid.
pub fn is_invalid_spec(status: &DataflowJobStatus) -> bool {
    status.state == Some(JobState::Failed)
        && condition(status, READY)
            .is_some_and(|c| c.reason == INVALID_PIPELINE || c.reason == INVALID_SPEC)
}

pub fn condition<'a>(status: &'a DataflowJobStatus, type_: &str) -> Option<&'a Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

/// The state the job was in, for the lifecycle: an invalid-spec Failed does not count.
pub fn previous_state(old: &DataflowJobStatus) -> Option<JobState> {
    if is_invalid_spec(old) {
        None
    } else {
        old.state
    }
}

/// status.currentWorkers: the worker StatefulSet's ready pods, or, while the coordinator
/// answers about an active job, the workers it sees taking work (alive, not draining) if more.
/// A worker leases items as soon as it reaches the coordinator, before its pod is Ready (its
/// startup and readiness probes take a few periods): ready pods alone showed 0 workers for a
/// short batch job whose workers were busy.
pub fn current_workers(progress: Option<&JobProgress>, ready_replicas: i32) -> i32 {
    match progress {
        Some(p) if !p.phase.is_terminal() => {
            let live = p.workers.iter().filter(|w| w.alive && !w.draining).count();
            ready_replicas.max(i32::try_from(live).unwrap_or(i32::MAX))
        }
        _ => ready_replicas,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::progress;
    use riverbank_pipeline::progress::JobPhase;

    #[test]
    fn current_workers_counts_the_workers_at_work_before_their_pods_are_ready() {
        use riverbank_pipeline::progress::WorkerProgress;
        let worker = |alive, draining| WorkerProgress {
            alive,
            draining,
            ..Default::default()
        };
        let mut p = progress(JobPhase::Running);
        p.workers = vec![
            worker(true, false),
            worker(true, false),
            worker(false, false),
            worker(true, true),
        ];
        // Two workers leasing items, no pod Ready yet (probes take a few periods).
        assert_eq!(current_workers(Some(&p), 0), 2);
        assert_eq!(current_workers(Some(&p), 3), 3, "ready pods, if more");
        // Not asked (a stopped job), or over: the ready pods.
        assert_eq!(current_workers(None, 1), 1);
        p.phase = JobPhase::Done;
        assert_eq!(current_workers(Some(&p), 0), 0);
    }
}
