//! A job's next status, as a pure function of what one reconcile observed, and the Events that
//! the change from the old status to the new one calls for.
//!
//! The lifecycle follows Dataflow: Pending → Running → Done or Failed from the coordinator's
//! `JobProgress`; desiredState Cancelled → Cancelled at once. Done, Failed and Cancelled are
//! final, except a Failed that only says the spec is invalid: a fixed spec (a new generation)
//! starts the job afresh. Keeping this free of I/O keeps every transition unit-testable.
use crate::crd::{
    AutoscalingStatus, DataflowJob, DataflowJobStatus, DesiredState, JobState, MemoryStatus,
    StageStatus,
};
use crate::insights::{Found, is_insight_reason, next_insights};
use crate::lifecycle::{
    INVALID_PIPELINE, INVALID_SPEC, READY, Replicas, condition, is_invalid_spec, previous_state,
};
use crate::pods::PodProblem;
use crate::scaling::reason_code;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event, EventType};
use riverbank_autoscale::{Decision, ShuffleHandling};
use riverbank_pipeline::progress::{JobFailure, JobPhase, JobProgress};

/// Condition types (documented on `DataflowJobStatus::conditions`; Ready is `lifecycle::READY`).
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";
/// Streaming: the last update of the pipeline (`status.update`): applied, under way or refused.
pub const UPDATED: &str = "Updated";

/// What one reconcile of a planned job observed.
#[derive(Debug, Clone)]
pub struct Observed {
    pub stages: Vec<StageStatus>,
    /// The workers this reconcile runs the job with (`scaling::replicas`).
    pub target_workers: i32,
    /// The coordinator's answer; None when it was not asked (job stopped or being cancelled).
    pub progress: Option<Result<JobProgress, String>>,
    /// The worst problem among the job's pods.
    pub pod_problem: Option<PodProblem>,
    /// The answer to `POST /v1/cancel`, when this reconcile cancelled a started job.
    pub cancel: Option<Result<(), String>>,
    /// The insights found, by source (`insights::Found`): the engine's, the coordinator's
    /// progress's, the pods'.
    pub insights: Found,
    /// What the autoscaler keeps in status (`scaling::Autoscaled::memory`); None keeps the old.
    /// Its `memory` is ignored: see `memory`.
    pub autoscaling: Option<AutoscalingStatus>,
    /// status.autoscaling.memory as vertical autoscaling leaves it (`memory::decide`).
    pub memory: Option<MemoryStatus>,
    /// Streaming: the run, snapshots and update this reconcile leaves.
    pub streaming: StreamingObserved,
    pub now: Timestamp,
}

/// What a reconcile of a streaming job decided (`reconcile::control`: before and after the poll).
#[derive(Debug, Clone, Default)]
pub struct StreamingObserved {
    /// The run its coordinator runs (None: a batch job).
    pub run: Option<crate::crd::RunStatus>,
    /// Drain, snapshots and update steps, when its coordinator runs it.
    pub control: Option<crate::streaming::Control>,
}

/// The status of a job whose spec can't run: `reason` is INVALID_PIPELINE or INVALID_SPEC.
/// Final for this generation; the stages of an earlier plan no longer apply.
pub fn invalid_status(
    job: &DataflowJob,
    reason: &str,
    error: &str,
    now: Timestamp,
) -> DataflowJobStatus {
    let old = job.status.clone().unwrap_or_default();
    let generation = job.metadata.generation;
    let message = match reason {
        INVALID_PIPELINE => format!("Invalid pipeline: {error}"),
        _ => format!("Invalid spec: {error}"),
    };
    let mut s = DataflowJobStatus {
        state: Some(JobState::Failed),
        message: Some(message.clone()),
        conditions: old.conditions,
        observed_generation: generation,
        current_workers: old.current_workers,
        // The reconciler scales an invalid job's pods to zero.
        target_workers: Some(Replicas::STOPPED.workers),
        start_time: old.start_time,
        completion_time: old.completion_time.or(Some(Time(now))),
        autoscaling: old.autoscaling,
        // Where a streaming job's state is: a fixed spec goes on from it.
        run: old.run,
        ..Default::default()
    };
    set_condition(&mut s, READY, false, reason, &message, generation, now);
    set_condition(
        &mut s,
        PROGRESSING,
        false,
        reason,
        &message,
        generation,
        now,
    );
    set_condition(&mut s, DEGRADED, false, "AsExpected", "", generation, now);
    s
}

/// The next status of a job whose spec planned successfully. `current_workers` is left as it
/// was: the reconciler fills it in from the worker StatefulSet it just applied.
pub fn planned_status(job: &DataflowJob, observed: Observed) -> DataflowJobStatus {
    let old = job.status.clone().unwrap_or_default();
    let previous = previous_state(&old);
    let generation = job.metadata.generation;
    let now = observed.now;
    let fresh = previous.is_none();
    let mut s = DataflowJobStatus {
        state: previous,
        message: old.message.clone(),
        conditions: old.conditions.clone(),
        observed_generation: generation,
        stages: observed.stages,
        current_workers: old.current_workers,
        target_workers: Some(observed.target_workers),
        backlog_seconds: old.backlog_seconds,
        throughput: old.throughput,
        progress: old.progress,
        start_time: if fresh { None } else { old.start_time },
        completion_time: if fresh { None } else { old.completion_time },
        autoscaling: merge_autoscaling(
            old.autoscaling.as_ref(),
            observed.autoscaling,
            observed.memory,
        ),
        insights: vec![],
        streaming: old.streaming.clone(),
        snapshots: old.snapshots.clone(),
        run: observed.streaming.run.clone().or(old.run.clone()),
        update: old.update.clone(),
    };
    let control = observed.streaming.control.as_ref();
    if let Some(c) = control {
        s.snapshots = c.snapshots.clone();
        s.update = c.update.clone();
    }

    match previous {
        // Final: nothing changes (its pods are at zero: `scaling::replicas`).
        Some(state) if state.is_terminal() => {}
        _ if job.spec.desired_state == DesiredState::Cancelled => {
            s.state = Some(JobState::Cancelled);
            s.message = Some(match &observed.cancel {
                Some(Ok(())) => "Cancelled: the coordinator stopped the job and aborted its sinks; workers scaled to zero".into(),
                Some(Err(e)) => format!("Cancelled; the coordinator could not be told ({e}); workers scaled to zero"),
                None => "Cancelled before it started".into(),
            });
            s.completion_time = Some(Time(now));
        }
        _ => match &observed.progress {
            Some(Ok(p)) => {
                apply_progress(&mut s, job, p, previous, now);
                if let Some(sp) = &p.streaming {
                    s.streaming = Some(crate::streaming::streaming_status(
                        &job.spec.options,
                        sp,
                        old.current_workers,
                        now,
                    ));
                }
            }
            Some(Err(e)) => {
                let state = previous.unwrap_or(JobState::Pending);
                s.state = Some(state);
                s.message = Some(if state == JobState::Running {
                    format!("Running; the coordinator's status is unavailable: {e}")
                } else {
                    "Starting: waiting for the coordinator".into()
                });
            }
            // Not asked: the job's objects are only being created.
            None => {
                s.state = Some(previous.unwrap_or(JobState::Pending));
                if previous.is_none() {
                    s.message = Some("Starting: creating the coordinator and workers".into());
                }
            }
        },
    }

    // Streaming: draining and updating are states of their own while the job is not over.
    let reading = match &observed.progress {
        Some(Ok(p)) => p.streaming.as_ref(),
        _ => None,
    };
    let draining = reading.is_some_and(|sp| sp.draining);
    if let Some(st) = s
        .state
        .filter(|st| !st.is_terminal() && *st != JobState::Pending)
        && let Some(next) = crate::streaming::active_state(job, control, draining)
    {
        if st != next {
            s.message = Some(match next {
                JobState::Updating => control
                    .and_then(|c| c.update.as_ref())
                    .map_or_else(|| "Updating".into(), |u| format!("Updating: {}", u.message)),
                _ => {
                    let mut m = String::from(
                        "Draining: reading no more input; firing every window and committing",
                    );
                    if let Some(sp) = reading {
                        m.push_str("; ");
                        m.push_str(&crate::streaming::streaming_message(sp));
                    }
                    m
                }
            });
        }
        s.state = Some(next);
    }
    let state = s.state.expect("set above");
    // A problem pod is what the user needs to see while the job is (trying to be) active.
    let problem = observed
        .pod_problem
        .as_ref()
        .filter(|_| !state.is_terminal());
    if let Some(p) = problem {
        s.message = Some(p.summary());
    }
    if state == JobState::Running {
        s.insights = next_insights(&old.insights, &observed.insights, now);
    }

    let (ready, ready_reason, ready_message) = match (state, problem) {
        (JobState::Running, None) => (true, "Running", "The job is processing data".to_string()),
        (_, Some(p)) if !state.is_terminal() => (false, p.reason.as_str(), p.summary()),
        (JobState::Pending, _) => (
            false,
            "Starting",
            "The coordinator and workers are starting".into(),
        ),
        (other, _) => (
            false,
            state_name(other),
            s.message.clone().unwrap_or_default(),
        ),
    };
    set_condition(
        &mut s,
        READY,
        ready,
        ready_reason,
        &ready_message,
        generation,
        now,
    );
    // Fixed texts while active: the coordinator's message changes every poll and lives in
    // status.message; conditions change only when something happens.
    let (progressing, reason, message) = match state {
        JobState::Pending => (true, "Starting", "The job is starting".to_string()),
        JobState::Running => (true, "Processing", "The job is processing data".to_string()),
        other => (
            false,
            state_name(other),
            s.message.clone().unwrap_or_default(),
        ),
    };
    set_condition(
        &mut s,
        PROGRESSING,
        progressing,
        reason,
        &message,
        generation,
        now,
    );
    if let Some(u) = s.update.clone() {
        let (ok, reason) = match u.phase {
            crate::crd::UpdatePhase::Done => (true, "Updated"),
            crate::crd::UpdatePhase::Refused => (false, "UpdateRefused"),
            _ => (false, "Updating"),
        };
        set_condition(&mut s, UPDATED, ok, reason, &u.message, generation, now);
    }
    match (problem, s.insights.first().cloned()) {
        (Some(p), _) => set_condition(
            &mut s,
            DEGRADED,
            true,
            &p.reason,
            &p.summary(),
            generation,
            now,
        ),
        // The most pressing insight, as status.insights keeps it (its first message).
        (None, Some(i)) => set_condition(
            &mut s, DEGRADED, true, &i.type_, &i.message, generation, now,
        ),
        (None, None) => set_condition(&mut s, DEGRADED, false, "AsExpected", "", generation, now),
    }
    s
}

/// status.autoscaling: what the autoscaler reports now over what it reported before (a restarted
/// operator knows nothing yet), with vertical autoscaling's memory.
fn merge_autoscaling(
    old: Option<&AutoscalingStatus>,
    new: Option<AutoscalingStatus>,
    memory: Option<MemoryStatus>,
) -> Option<AutoscalingStatus> {
    let old = old.cloned().unwrap_or_default();
    let new = new.unwrap_or_default();
    let merged = AutoscalingStatus {
        startup_seconds: new.startup_seconds.or(old.startup_seconds),
        last_rescale: new.last_rescale.or(old.last_rescale),
        last_evaluation: new.last_evaluation.or(old.last_evaluation),
        memory,
    };
    (merged != AutoscalingStatus::default()).then_some(merged)
}

/// Folds the coordinator's report into the status (`previous`: the job's state before).
fn apply_progress(
    s: &mut DataflowJobStatus,
    job: &DataflowJob,
    p: &JobProgress,
    previous: Option<JobState>,
    now: Timestamp,
) {
    let streaming = p.streaming.as_ref();
    // A streaming coordinator reports the phase of its checkpoint under way, Pending while that
    // one has no worker yet (workers joining or leaving: a rescale; a restarted pod). A job
    // that has run, or has a checkpoint, is still running.
    let started = matches!(
        previous,
        Some(JobState::Running | JobState::Draining | JobState::Updating)
    ) || streaming.is_some_and(|sp| sp.checkpoint > 0);
    let state = match p.phase {
        JobPhase::Pending if streaming.is_some() && started => JobState::Running,
        JobPhase::Pending => JobState::Pending,
        JobPhase::Running => JobState::Running,
        // A streaming job ends Done only by a drain; a Beam SDK pipeline's also when its
        // sources end (its runner says which).
        JobPhase::Done
            if job.spec.options.streaming()
                && (!job.is_beam_sdk() || streaming.is_some_and(|sp| sp.draining)) =>
        {
            JobState::Drained
        }
        JobPhase::Done => JobState::Done,
        JobPhase::Failed => JobState::Failed,
        JobPhase::Cancelled => JobState::Cancelled,
    };
    s.state = Some(state);
    s.message = Some(match (&p.failure, streaming) {
        (Some(f), _) => failure_message(f),
        // A stream's work items are one checkpoint's: it speaks of checkpoints, watermark and
        // backlog instead.
        (None, Some(sp)) if !state.is_terminal() => {
            let mut m = crate::streaming::streaming_message(sp);
            if p.phase == JobPhase::Pending {
                m.push_str("; waiting for workers");
            }
            m
        }
        (None, Some(sp)) if state == JobState::Drained => format!(
            "Drained: every window fired and committed (checkpoint {})",
            sp.checkpoint
        ),
        (None, _) => p.message.clone(),
    });
    s.backlog_seconds = p.backlog_seconds.map(|b| b.max(0.0).round() as i64);
    // One decimal: the value moves a little every poll; finer digits only churn status.
    s.throughput = Some((p.throughput_elements_per_sec * 10.0).round() / 10.0);
    if !job.spec.options.streaming() {
        s.progress = Some((p.fraction_consumed.clamp(0.0, 1.0) * 1000.0).round() / 1000.0);
    }
    let at = |text: &Option<String>| {
        text.as_deref()
            .and_then(|t| t.parse::<Timestamp>().ok())
            .map(Time)
            .unwrap_or(Time(now))
    };
    if state != JobState::Pending && s.start_time.is_none() {
        s.start_time = Some(at(&p.started_at));
    }
    if state.is_terminal() && s.completion_time.is_none() {
        s.completion_time = Some(at(&p.finished_at));
    }
}

/// `CountPerWindow: division by zero on {"x":0} (4 attempts)`.
fn failure_message(f: &JobFailure) -> String {
    let mut text = match &f.transform {
        Some(t) => format!("{t}: {}", f.message),
        None => f.message.clone(),
    };
    if let Some(record) = &f.record {
        let mut record = record.clone();
        if record.len() > 200 {
            let mut end = 200;
            while !record.is_char_boundary(end) {
                end -= 1;
            }
            record.truncate(end);
            record.push_str("...");
        }
        text.push_str(&format!(" on {record}"));
    }
    if f.attempts > 0 {
        text.push_str(&format!(
            " ({} attempt{})",
            f.attempts,
            if f.attempts == 1 { "" } else { "s" }
        ));
    }
    text
}

pub fn state_name(state: JobState) -> &'static str {
    match state {
        JobState::Pending => "Pending",
        JobState::Running => "Running",
        JobState::Done => "Done",
        JobState::Failed => "Failed",
        JobState::Cancelled => "Cancelled",
        JobState::Draining => "Draining",
        JobState::Drained => "Drained",
        JobState::Updating => "Updating",
    }
}

/// True when `new` differs from `old` only in what moves on every poll (throughput, backlog,
/// progress, the coordinator's message, ready workers): such changes are written at most once
/// per poll interval, because each status write brings the job back for another reconcile.
///
/// So is a new autoscaler evaluation with the same decision and reason as the last one written
/// (its numbers and time moved): status.autoscaling.lastEvaluation is rewritten at once when the
/// decision or its reason changes, else at most once per poll interval.
pub fn only_metrics_changed(old: &DataflowJobStatus, new: &DataflowJobStatus) -> bool {
    let evaluation = |s: &DataflowJobStatus| {
        s.autoscaling
            .as_ref()
            .and_then(|a| a.last_evaluation.clone())
    };
    let same_verdict = match (evaluation(old), evaluation(new)) {
        (Some(a), Some(b)) => a.decision == b.decision && a.reason == b.reason,
        (a, b) => a == b,
    };
    let strip = |s: &DataflowJobStatus| {
        let mut s = DataflowJobStatus {
            throughput: None,
            backlog_seconds: None,
            progress: None,
            message: None,
            current_workers: None,
            streaming: None,
            ..s.clone()
        };
        if let Some(a) = s.autoscaling.as_mut() {
            a.last_evaluation = None;
        }
        s
    };
    same_verdict && strip(old) == strip(new)
}

/// Sets a standard condition. lastTransitionTime changes only when the status does.
pub fn set_condition(
    s: &mut DataflowJobStatus,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let transition = s
        .conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    let condition = Condition {
        type_: type_.into(),
        status,
        reason: reason.into(),
        message: message.into(),
        last_transition_time: transition,
        observed_generation: generation,
    };
    match s.conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => *c = condition,
        None => s.conditions.push(condition),
    }
}

/// The Events the change from `old` to `new` calls for: one per transition or decision.
/// `decision` is the autoscaler's rescale (real or dry-run) not yet published, which replaces
/// the plain "Target workers" note with its reason code and numbers.
pub fn events(
    old: &DataflowJobStatus,
    new: &DataflowJobStatus,
    decision: Option<&Decision>,
) -> Vec<Event> {
    let event = |type_, reason: &str, action: &str, note: String| Event {
        type_,
        reason: reason.into(),
        note: Some(truncate_note(note)),
        action: action.into(),
        secondary: None,
    };
    let mut out = vec![];
    let message = new.message.clone().unwrap_or_default();
    if is_invalid_spec(new) {
        if !is_invalid_spec(old) || old.message != new.message {
            let reason = condition(new, READY).map_or(INVALID_SPEC, |c| c.reason.as_str());
            out.push(event(EventType::Warning, reason, "Validate", message));
        }
        return out;
    }
    let before = previous_state(old);
    if before != new.state {
        match new.state {
            Some(JobState::Pending) => out.push(event(
                EventType::Normal,
                "Planned",
                "Plan",
                match (new.stages.len(), new.target_workers.unwrap_or_default()) {
                    // A Beam SDK pipeline: its runner pod plans it.
                    (0, workers) => {
                        format!("Starting the runner pod and {workers} SDK worker pods")
                    }
                    (stages, workers) => format!(
                        "Planned {stages} stages; starting the coordinator and {workers} workers"
                    ),
                },
            )),
            Some(JobState::Running) => {
                out.push(event(EventType::Normal, "Running", "Observe", message))
            }
            Some(JobState::Done) => out.push(event(
                EventType::Normal,
                "Completed",
                "Complete",
                format!("{message}; scaling the coordinator and workers to zero"),
            )),
            Some(JobState::Failed) => {
                out.push(event(EventType::Warning, "Failed", "Fail", message))
            }
            Some(JobState::Cancelled) => {
                out.push(event(EventType::Normal, "Cancelled", "Cancel", message))
            }
            Some(JobState::Draining) => {
                out.push(event(EventType::Normal, "Draining", "Drain", message))
            }
            Some(JobState::Drained) => out.push(event(
                EventType::Normal,
                "Drained",
                "Drain",
                format!("{message}; scaling the coordinator and workers to zero"),
            )),
            _ => {}
        }
    } else if old.observed_generation != new.observed_generation
        && !new.state.is_some_and(JobState::is_terminal)
    {
        out.push(event(
            EventType::Normal,
            "Replanned",
            "Plan",
            format!(
                "Applied generation {}: {} stages",
                new.observed_generation.unwrap_or_default(),
                new.stages.len()
            ),
        ));
    }
    let decided = decision
        .filter(|d| d.is_rescale() && new.state == Some(JobState::Running))
        .map(|d| decision_event(d, new.target_workers.unwrap_or_default()));
    let covered = decided.as_ref().is_some_and(|e| e.reason == "Scaling");
    out.extend(decided);
    if let (Some(a), Some(b)) = (old.target_workers, new.target_workers)
        && a != b
        && before == new.state
        && !new.state.is_some_and(JobState::is_terminal)
        && !covered
    {
        out.push(event(
            EventType::Normal,
            "Scaling",
            "Scale",
            format!("Target workers {a} -> {b}"),
        ));
    }
    // Insights have their own Events (reason: the insight's name, when it appears and clears);
    // other reasons of Degraded (a pod problem) theirs.
    out.extend(crate::insights::events(
        &old.insights,
        &new.insights,
        new.state == Some(JobState::Running),
    ));
    let degraded = |s: &DataflowJobStatus| {
        condition(s, DEGRADED)
            .filter(|c| c.status == "True" && !is_insight_reason(&c.reason))
            .map(|c| c.reason.clone())
    };
    match (degraded(old), degraded(new)) {
        (before, Some(reason)) if before.as_deref() != Some(reason.as_str()) => {
            let note = condition(new, DEGRADED)
                .map(|c| c.message.clone())
                .unwrap_or_default();
            out.push(event(EventType::Warning, &reason, "Diagnose", note));
        }
        (Some(before), None) => out.push(event(
            EventType::Normal,
            "Recovered",
            "Diagnose",
            format!("No longer {before}"),
        )),
        _ => {}
    }
    out
}

/// `Scaling` for a rescale, `ScalingDryRun` for one only recorded (`kept` workers stay), with
/// the engine's reason code and message: `2 -> 4 workers (SCALE_TO_REMAINING_WORK): ...`.
fn decision_event(d: &Decision, kept: i32) -> Event {
    let what = format!(
        "{} -> {} workers ({}): {}",
        d.current_workers,
        d.target_workers,
        reason_code(d.reason),
        d.message
    );
    let shuffle = match d.shuffle {
        Some(ShuffleHandling::DisksMove) => {
            "; the departing workers' disks move to the remaining workers"
        }
        Some(ShuffleHandling::NoLiveData) => "; no later stage needs their shuffle data",
        Some(ShuffleHandling::WaitForConsumers) => {
            "; waiting until later stages have read their shuffle data"
        }
        None => "",
    };
    let (reason, note) = if d.dry_run {
        (
            "ScalingDryRun",
            format!("Dry run (autoscaling_dry_run), would scale {what}{shuffle}; keeping {kept}"),
        )
    } else {
        ("Scaling", format!("Scaling {what}{shuffle}"))
    };
    Event {
        type_: EventType::Normal,
        reason: reason.into(),
        note: Some(truncate_note(note)),
        action: "Scale".into(),
        secondary: None,
    }
}

/// Event notes are at most 1 kB.
fn truncate_note(mut note: String) -> String {
    if note.len() > 1000 {
        let mut end = 997;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, JobBuilder};
    use riverbank_pipeline::progress::JobFailure;

    fn job(status: Option<DataflowJobStatus>) -> DataflowJob {
        JobBuilder::new("j").status(status).build()
    }

    /// The shared fixture with this module's numbers: 4 of 10 items done, 12.34 elements/s,
    /// 9.6 s of backlog.
    fn progress(phase: JobPhase) -> JobProgress {
        JobProgress {
            streaming: None,
            job_name: "j".into(),
            message: "working".into(),
            started_at: Some("2025-01-02T03:04:05Z".into()),
            work_items_total: 10,
            work_items_done: 4,
            fraction_consumed: 0.4,
            throughput_elements_per_sec: 12.34,
            backlog_seconds: Some(9.6),
            ..fixtures::progress(phase)
        }
    }

    fn observed(p: Option<Result<JobProgress, String>>, t: i64) -> Observed {
        Observed {
            stages: vec![StageStatus::default(); 3],
            target_workers: 3,
            progress: p,
            pod_problem: None,
            cancel: None,
            insights: Found::default(),
            autoscaling: None,
            memory: None,
            streaming: Default::default(),
            now: Timestamp::from_second(t).unwrap(),
        }
    }

    #[test]
    fn pending_then_running_then_done() {
        let first = planned_status(&job(None), observed(Some(Err("dns".into())), 100));
        assert_eq!(first.state, Some(JobState::Pending));
        assert_eq!(
            first.message.as_deref(),
            Some("Starting: waiting for the coordinator")
        );
        let ev = events(&Default::default(), &first, None);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].reason, "Planned");
        assert_eq!(
            ev[0].note.as_deref(),
            Some("Planned 3 stages; starting the coordinator and 3 workers")
        );

        let running = planned_status(
            &job(Some(first.clone())),
            observed(Some(Ok(progress(JobPhase::Running))), 200),
        );
        assert_eq!(running.state, Some(JobState::Running));
        assert_eq!(running.backlog_seconds, Some(10));
        assert_eq!(running.throughput, Some(12.3));
        assert_eq!(running.progress, Some(0.4));
        assert_eq!(
            running.start_time.as_ref().unwrap().0.to_string(),
            "2025-01-02T03:04:05Z"
        );
        let ready = condition(&running, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "Running")
        );
        assert_eq!(ready.last_transition_time.0.as_second(), 200);
        // Progressing stayed True (Starting → Processing): its transition time is kept.
        assert_eq!(
            condition(&running, PROGRESSING)
                .unwrap()
                .last_transition_time
                .0
                .as_second(),
            100
        );
        let ev = events(&first, &running, None);
        assert_eq!(
            ev.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(),
            ["Running"]
        );

        let mut finished = progress(JobPhase::Done);
        finished.finished_at = Some("2025-01-02T04:00:00Z".into());
        let done = planned_status(
            &job(Some(running.clone())),
            observed(Some(Ok(finished)), 300),
        );
        assert_eq!(done.state, Some(JobState::Done));
        assert_eq!(
            done.target_workers,
            Some(3),
            "the pods stay until Done is stored (scaling::replicas)"
        );
        assert_eq!(
            done.completion_time.as_ref().unwrap().0.to_string(),
            "2025-01-02T04:00:00Z"
        );
        assert_eq!(condition(&done, PROGRESSING).unwrap().status, "False");
        assert_eq!(events(&running, &done, None)[0].reason, "Completed");

        // The next reconcile scales to zero (scaling::replicas of a Done job): recorded quietly.
        let mut zero = observed(None, 400);
        zero.target_workers = 0;
        let stopped = planned_status(&job(Some(done.clone())), zero);
        assert_eq!(stopped.target_workers, Some(0));
        assert_eq!(
            DataflowJobStatus {
                target_workers: done.target_workers,
                ..stopped.clone()
            },
            done,
            "nothing else changes"
        );
        assert!(events(&done, &stopped, None).is_empty());
        // Final: later observations change nothing and stay quiet.
        let mut zero = observed(None, 500);
        zero.target_workers = 0;
        let again = planned_status(&job(Some(stopped.clone())), zero);
        assert_eq!(again, stopped);
        assert!(events(&stopped, &again, None).is_empty());
    }

    /// A streaming job's report: checkpoint 7 done, the coordinator's phase `phase` (its
    /// checkpoint's: Pending while that one waits for workers).
    fn streaming(phase: JobPhase, draining: bool) -> JobProgress {
        JobProgress {
            message: "0/8 work items done, 1 running".into(),
            streaming: Some(riverbank_pipeline::StreamingProgress {
                checkpoint: 7,
                watermark: Some("2025-03-01T10:04:50Z".into()),
                watermark_lag_seconds: Some(12.4),
                backlog_elements: 900,
                backlog_seconds: Some(9.0),
                last_checkpoint_age_seconds: Some(1.2),
                last_checkpoint_ms: 800,
                draining,
                ..Default::default()
            }),
            ..progress(phase)
        }
    }

    fn streaming_job(status: Option<DataflowJobStatus>) -> DataflowJob {
        let mut job = job(status);
        job.spec.options.streaming = Some(true);
        job
    }

    #[test]
    fn a_streaming_job_speaks_of_checkpoints_and_stays_running_while_workers_change() {
        let running = planned_status(
            &streaming_job(None),
            observed(Some(Ok(streaming(JobPhase::Running, false))), 100),
        );
        assert_eq!(running.state, Some(JobState::Running));
        assert_eq!(
            running.message.as_deref(),
            Some(
                "checkpoint 7 done 1 s ago in 0.8 s; watermark 2025-03-01T10:04:50Z, 12 s behind; backlog 900 messages (9 s)"
            ),
            "not the checkpoint's work items"
        );
        // A Beam SDK job's sources say their backlog in bytes.
        let mut sdk = streaming(JobPhase::Running, false);
        if let Some(s) = sdk.streaming.as_mut() {
            (s.backlog_elements, s.backlog_bytes) = (0, 4_000);
        }
        let sdk = planned_status(&streaming_job(None), observed(Some(Ok(sdk)), 100));
        assert!(
            sdk.message
                .as_deref()
                .is_some_and(|m| m.ends_with("; backlog 4000 bytes (9 s)")),
            "{:?}",
            sdk.message
        );

        // A rescale: the checkpoint under way waits for its workers (the coordinator's Pending).
        let rescaling = planned_status(
            &streaming_job(Some(running.clone())),
            observed(Some(Ok(streaming(JobPhase::Pending, false))), 200),
        );
        assert_eq!(rescaling.state, Some(JobState::Running));
        assert!(
            rescaling
                .message
                .as_deref()
                .unwrap()
                .ends_with("; waiting for workers"),
            "{:?}",
            rescaling.message
        );
        assert!(events(&running, &rescaling, None).is_empty());

        // So is a restarted coordinator's (no checkpoint of its own yet) of a job that ran.
        let mut restarted = streaming(JobPhase::Pending, false);
        restarted.streaming.as_mut().unwrap().checkpoint = 0;
        let next = planned_status(
            &streaming_job(Some(running.clone())),
            observed(Some(Ok(restarted.clone())), 300),
        );
        assert_eq!(next.state, Some(JobState::Running));
        // A new job with no checkpoint is still starting.
        let new = planned_status(&streaming_job(None), observed(Some(Ok(restarted)), 300));
        assert_eq!(new.state, Some(JobState::Pending));
    }

    #[test]
    fn a_stream_being_drained_is_draining_whatever_its_checkpoints_phase() {
        let running = planned_status(
            &streaming_job(None),
            observed(Some(Ok(streaming(JobPhase::Running, false))), 100),
        );
        for phase in [JobPhase::Running, JobPhase::Pending] {
            let draining = planned_status(
                &streaming_job(Some(running.clone())),
                observed(Some(Ok(streaming(phase, true))), 200),
            );
            assert_eq!(draining.state, Some(JobState::Draining), "{phase:?}");
            let message = draining.message.unwrap();
            assert!(
                message.starts_with("Draining: reading no more input")
                    && message.contains("checkpoint 7"),
                "{message}"
            );
        }
        let drained = planned_status(
            &streaming_job(Some(running)),
            observed(Some(Ok(streaming(JobPhase::Done, true))), 300),
        );
        assert_eq!(drained.state, Some(JobState::Drained));
        assert_eq!(
            drained.message.as_deref(),
            Some("Drained: every window fired and committed (checkpoint 7)")
        );
    }

    #[test]
    fn failures_name_transform_record_and_attempts() {
        let mut p = progress(JobPhase::Failed);
        p.failure = Some(JobFailure {
            transform: Some("ZoneAmount".into()),
            message: "division by zero".into(),
            record: Some("{\"x\":0}".into()),
            attempts: 4,
        });
        let failed = planned_status(&job(None), observed(Some(Ok(p)), 100));
        assert_eq!(failed.state, Some(JobState::Failed));
        assert_eq!(
            failed.message.as_deref(),
            Some("ZoneAmount: division by zero on {\"x\":0} (4 attempts)")
        );
        assert!(!is_invalid_spec(&failed), "a runtime failure is final");
        let ev = events(&Default::default(), &failed, None);
        assert_eq!(ev[0].reason, "Failed");
        assert!(matches!(ev[0].type_, EventType::Warning));
    }

    #[test]
    fn invalid_spec_is_final_until_the_spec_changes() {
        let bad = invalid_status(
            &job(None),
            INVALID_PIPELINE,
            "transform Foo: unknown type",
            Timestamp::from_second(100).unwrap(),
        );
        assert!(is_invalid_spec(&bad));
        assert_eq!(
            bad.message.as_deref(),
            Some("Invalid pipeline: transform Foo: unknown type")
        );
        let ev = events(&Default::default(), &bad, None);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].reason, INVALID_PIPELINE);
        assert!(events(&bad, &bad, None).is_empty(), "reported once");

        // The fixed spec starts afresh: Pending, Planned again.
        let mut fixed = job(Some(bad.clone()));
        fixed.metadata.generation = Some(2);
        let next = planned_status(&fixed, observed(Some(Err("starting".into())), 200));
        assert_eq!(next.state, Some(JobState::Pending));
        assert_eq!(next.observed_generation, Some(2));
        assert_eq!(next.completion_time, None);
        assert_eq!(events(&bad, &next, None)[0].reason, "Planned");
    }

    #[test]
    fn cancel_is_immediate_and_pod_problems_show() {
        let running = planned_status(
            &job(None),
            observed(Some(Ok(progress(JobPhase::Running))), 1),
        );
        let mut cancelling = job(Some(running.clone()));
        cancelling.spec.desired_state = DesiredState::Cancelled;
        let mut o = observed(None, 2);
        o.cancel = Some(Ok(()));
        o.target_workers = 0;
        let cancelled = planned_status(&cancelling, o);
        assert_eq!(cancelled.state, Some(JobState::Cancelled));
        assert_eq!(cancelled.target_workers, Some(0));
        assert!(cancelled.completion_time.is_some());
        assert_eq!(events(&running, &cancelled, None)[0].reason, "Cancelled");

        let mut o = observed(Some(Err("refused".into())), 3);
        o.pod_problem = Some(PodProblem {
            pod: "j-worker-0".into(),
            reason: "ImagePullBackOff".into(),
            message: "Back-off pulling image".into(),
        });
        let stuck = planned_status(&job(None), o);
        assert_eq!(stuck.state, Some(JobState::Pending));
        assert_eq!(
            stuck.message.as_deref(),
            Some("pod j-worker-0: ImagePullBackOff: Back-off pulling image")
        );
        let ready = condition(&stuck, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "ImagePullBackOff")
        );
        assert_eq!(condition(&stuck, DEGRADED).unwrap().status, "True");
        let reasons: Vec<_> = events(&Default::default(), &stuck, None)
            .into_iter()
            .map(|e| e.reason)
            .collect();
        assert_eq!(reasons, ["Planned", "ImagePullBackOff"]);

        let healed = planned_status(
            &job(Some(stuck.clone())),
            observed(Some(Err("x".into())), 4),
        );
        let reasons: Vec<_> = events(&stuck, &healed, None)
            .into_iter()
            .map(|e| e.reason)
            .collect();
        assert_eq!(reasons, ["Recovered"]);
    }
}
