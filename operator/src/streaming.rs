//! Streaming job control through the coordinator: drain, named snapshots and updates of the
//! pipeline, the way `gcloud dataflow jobs drain|update` and the Flink operator's savepoint
//! upgrades work.
//!
//! An update is a changed `spec.pipeline` (or a pipeline option other than the worker counts)
//! on a running streaming job. It goes: the coordinator checks that the new plan can take the
//! job's state (`/v1/job/update-check`: Combines with the same keys and accumulators, sources
//! with the same partitions, by name or `transformNameMapping`) → refused: status.update says why,
//! the old pipeline runs on → accepted: the coordinator finishes its checkpoint, snapshots the
//! state and ends (`/v1/job/stop`; Stopping) → the children switch to the new plan, whose
//! coordinator starts from that snapshot under a new run id and checkpoint directory
//! (Restarting) → its first Running report ends the update (Done). Each step is recorded in
//! status before the next is taken, so an operator restarted halfway goes on where it was.
//!
//! Here the pure parts: runs and their checkpoint locations, the coordinator's streaming
//! arguments, what an update's steps make of the coordinator's answer ([`after_poll`]), and the
//! streaming numbers of status. The requests to the coordinator before its status is read
//! (drain, snapshot, update check, stop) are the reconciler's `control` phase.
use crate::crd::{
    DataflowJob, DesiredState, JobOptions, JobState, RunStatus, SnapshotStatus, UpdatePhase,
    UpdateStatus,
};
use crate::lifecycle::previous_state;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event, EventType};
use riverbank_pipeline::{JobProgress, Plan};

/// The snapshot an update to generation `g` starts from.
pub fn update_snapshot_name(generation: i64) -> String {
    format!("update-g{generation}")
}

/// The run id of a pipeline version, as its coordinator reports it (`--run-id`).
pub fn run_id(run: &RunStatus) -> String {
    format!("g{}", run.generation)
}

/// The pipeline version the job's coordinator runs: the recorded one, else the first, from the
/// generation that started the job and its `fromSnapshot`, keeping its checkpoints under
/// [`state_location`].
pub fn current_run(job: &DataflowJob) -> RunStatus {
    let status = job.status.as_ref();
    status
        .and_then(|s| s.run.clone())
        .unwrap_or_else(|| RunStatus {
            generation: job.metadata.generation.unwrap_or(1),
            spec_generation: None,
            // A job that started before runs were recorded keeps the coordinator's default
            // (tempLocation/NAME), where its checkpoints are.
            checkpoint_location: if status.is_some_and(|s| previous_state(s).is_some()) {
                None
            } else {
                state_location(job)
            },
            from_snapshot: job.spec.from_snapshot.as_ref().map(|f| f.location.clone()),
        })
}

/// Where a new streaming job keeps its checkpoints, state and snapshots:
/// `tempLocation/NAME/UID`. Keyed by the object's uid, so a DataflowJob deleted and created
/// again under the same name is a new job that starts afresh (or from its `fromSnapshot`),
/// never resuming the deleted one's checkpoint log; updates of the same object keep it (their
/// runs are under it, see [`run_checkpoint_location`]).
pub fn state_location(job: &DataflowJob) -> Option<String> {
    let temp = job.spec.options.temp_location.as_deref()?;
    let uid = job.metadata.uid.as_deref()?;
    Some(format!(
        "{}/{}/{uid}",
        temp.trim_end_matches('/'),
        job.job_name()
    ))
}

/// The state shards of a streaming plan: its maxNumWorkers (the persistent disks).
pub fn shards(plan: &Plan) -> i32 {
    plan.options
        .max_num_workers
        .map_or(100, |n| i32::try_from(n).unwrap_or(i32::MAX))
}

/// The coordinator arguments of a streaming run of `plan`: its state shards, run id,
/// checkpoint directory and the snapshot it starts from.
pub fn coordinator_args(job: &DataflowJob, plan: &Plan, run: &RunStatus) -> Vec<String> {
    let mut args = vec![
        "--shuffle-partitions".to_string(),
        shards(plan).to_string(),
        "--run-id".into(),
        run_id(run),
    ];
    if let Some(dir) = &run.checkpoint_location {
        args.extend(["--checkpoint-dir".into(), dir.clone()]);
    }
    if let Some(snapshot) = &run.from_snapshot {
        args.extend(["--from-snapshot".into(), snapshot.clone()]);
        if !job.spec.transform_name_mapping.is_empty() {
            args.extend([
                "--transform-name-mapping".into(),
                serde_json::to_string(&job.spec.transform_name_mapping)
                    .expect("a map of strings serializes"),
            ]);
        }
    }
    args
}

/// Where an updated run keeps its checkpoints: its own directory `runs/gN` under the job's
/// (found from the run it replaces: `current`'s location, without its own `runs/gM`; a job
/// started before its location was recorded has tempLocation/NAME).
pub fn run_checkpoint_location(
    job: &DataflowJob,
    current: &RunStatus,
    generation: i64,
) -> Option<String> {
    let base = match &current.checkpoint_location {
        Some(location) => job_root(location).to_string(),
        None => format!(
            "{}/{}",
            job.spec
                .options
                .temp_location
                .as_deref()?
                .trim_end_matches('/'),
            job.job_name()
        ),
    };
    Some(format!("{base}/runs/g{generation}"))
}

/// The job's directory of a run's checkpoint location: `X` of `X/runs/gN`, else `X`.
fn job_root(location: &str) -> &str {
    match location.rsplit_once("/runs/g") {
        Some((root, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => root,
        _ => location,
    }
}

/// What this reconcile does about a streaming job, decided before the coordinator is polled.
#[derive(Debug, Clone)]
pub struct Control {
    /// The plan the children run: the new spec's, or the running one while an update is refused
    /// or still stopping the old pipeline.
    pub plan: Plan,
    pub run: RunStatus,
    pub update: Option<UpdateStatus>,
    pub snapshots: Vec<SnapshotStatus>,
    /// Events for what this reconcile did (snapshots, update steps).
    pub events: Vec<Note>,
}

/// An Event to publish: kube's `Event` is neither `Clone` nor `Debug`.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

impl Note {
    pub fn event(&self) -> Event {
        Event {
            type_: if self.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: self.reason.into(),
            note: Some(self.note.clone()),
            action: self.action.into(),
            secondary: None,
        }
    }
}

impl Control {
    /// The job is between two pipeline versions.
    pub fn updating(&self) -> bool {
        self.update
            .as_ref()
            .is_some_and(|u| matches!(u.phase, UpdatePhase::Stopping | UpdatePhase::Restarting))
    }
}

pub(crate) fn event(
    type_: EventType,
    reason: &'static str,
    action: &'static str,
    note: String,
) -> Note {
    Note {
        warning: type_ == EventType::Warning,
        reason,
        action,
        note,
    }
}

/// After the poll: an update whose old pipeline has stopped switches to the new one; the new
/// run's first Running report ends it. Returns the progress that belongs to the current run
/// (the old run's final answer must not end the job).
pub fn after_poll(
    job: &DataflowJob,
    c: &mut Control,
    progress: Option<Result<JobProgress, String>>,
    now: Timestamp,
) -> Option<Result<JobProgress, String>> {
    let generation = job.metadata.generation.unwrap_or(1);
    let Some(update) = c.update.as_mut().filter(|u| u.generation == generation) else {
        return progress;
    };
    let reading = progress.as_ref().and_then(|p| p.as_ref().ok());
    match update.phase {
        UpdatePhase::Stopping => {
            let p = reading?;
            if p.phase == riverbank_pipeline::JobPhase::Failed {
                return progress;
            }
            let stopped = p.phase.is_terminal() && p.streaming.as_ref().is_some_and(|s| s.stopped);
            if !stopped {
                return None;
            }
            let name = update_snapshot_name(generation);
            let snapshot = p
                .streaming
                .as_ref()
                .and_then(|s| s.snapshots.iter().find(|t| t.name == name))
                .cloned();
            if let Some(t) = &snapshot
                && !c.snapshots.iter().any(|s| s.name == name)
            {
                c.snapshots.push(SnapshotStatus {
                    name: name.clone(),
                    checkpoint: i64::try_from(t.checkpoint).unwrap_or(i64::MAX),
                    location: t.location.clone(),
                    time: Time(now),
                });
            }
            c.run = RunStatus {
                generation,
                spec_generation: None,
                checkpoint_location: run_checkpoint_location(job, &c.run, generation),
                from_snapshot: snapshot.as_ref().map(|t| t.location.clone()),
            };
            update.phase = UpdatePhase::Restarting;
            update.snapshot = c.run.from_snapshot.clone();
            update.message = match &snapshot {
                Some(t) => format!(
                    "Starting the new pipeline from snapshot {name} (checkpoint {})",
                    t.checkpoint
                ),
                None => {
                    "The job had no completed checkpoint: starting the new pipeline afresh".into()
                }
            };
            update.time = Time(now);
            c.events.push(event(
                EventType::Normal,
                "Updating",
                "Update",
                update.message.clone(),
            ));
            // The plan switches now (the caller passes the new one): see `reconcile::control`.
            None
        }
        UpdatePhase::Restarting => match reading {
            Some(p)
                if p.streaming.as_ref().and_then(|s| s.run_id.as_deref())
                    == Some(run_id(&c.run).as_str()) =>
            {
                if p.phase == riverbank_pipeline::JobPhase::Running {
                    update.phase = UpdatePhase::Done;
                    update.message = format!("Generation {generation} runs");
                    update.time = Time(now);
                    c.events.push(event(
                        EventType::Normal,
                        "Updated",
                        "Update",
                        format!(
                            "Generation {generation} runs, with the state of snapshot {}",
                            update.snapshot.as_deref().unwrap_or("(none)")
                        ),
                    ));
                    progress
                } else if p.phase.is_terminal() {
                    progress
                } else {
                    None
                }
            }
            // The old run's coordinator still answers: not the job's news.
            _ => None,
        },
        UpdatePhase::Done | UpdatePhase::Refused => progress,
    }
}

/// The streaming numbers of status, from the coordinator's report.
pub fn streaming_status(
    options: &JobOptions,
    p: &riverbank_pipeline::StreamingProgress,
    workers: Option<i32>,
    now: Timestamp,
) -> crate::crd::StreamingStatus {
    let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let shards = options.max_workers();
    crate::crd::StreamingStatus {
        watermark: p.watermark.clone(),
        watermark_lag_seconds: p.watermark_lag_seconds.map(|s| s.round() as i64),
        backlog_messages: int(p.backlog_elements),
        backlog_bytes: int(p.backlog_bytes),
        state_bytes: int(p.state_bytes),
        active_keys: int(p.active_keys),
        late_elements_dropped: int(p.late_elements_dropped),
        checkpoint: int(p.checkpoint),
        last_checkpoint_time: p
            .last_checkpoint_age_seconds
            .and_then(|age| k8s_openapi::jiff::SignedDuration::try_from_secs_f64(age).ok())
            .and_then(|age| now.checked_sub(age).ok())
            // Whole seconds: the age moves on every poll.
            .and_then(|t| Timestamp::from_second(t.as_second()).ok())
            .map(Time),
        shards,
        shards_per_worker: workers.filter(|&w| w > 0).map(|w| (shards + w - 1) / w),
        last_rescale_pause_seconds: p.last_rescale_pause_ms.map(|ms| ms as f64 / 1000.0),
    }
}

/// status.message of a running streaming job: its checkpoints, watermark and backlog, e.g.
/// `checkpoint 12 done 3 s ago in 0.8 s; watermark 2025-03-01T10:04:50Z, 12 s behind; backlog
/// 1200 messages (4 s)`.
pub fn streaming_message(p: &riverbank_pipeline::StreamingProgress) -> String {
    let mut parts = vec![];
    parts.push(match (p.checkpoint, p.last_checkpoint_age_seconds) {
        (0, _) => "no checkpoint done yet".to_string(),
        (n, Some(age)) => format!(
            "checkpoint {n} done {} s ago in {:.1} s",
            age.max(0.0).round(),
            p.last_checkpoint_ms as f64 / 1000.0
        ),
        (n, None) => format!("checkpoint {n} done"),
    });
    parts.push(match (&p.watermark, p.watermark_lag_seconds) {
        (Some(w), Some(lag)) => format!("watermark {w}, {} s behind", lag.max(0.0).round()),
        (Some(w), None) => format!("watermark {w}"),
        (None, _) => "no watermark yet".to_string(),
    });
    // A Beam SDK job's sources size their backlog in bytes, not messages.
    let mut backlog = match (p.backlog_elements, p.backlog_bytes) {
        (0, bytes) if bytes > 0 => format!("backlog {bytes} bytes"),
        (n, _) => format!("backlog {n} messages"),
    };
    if let Some(secs) = p
        .backlog_seconds
        .filter(|_| p.backlog_elements > 0 || p.backlog_bytes > 0)
    {
        backlog.push_str(&format!(" ({} s)", secs.max(0.0).round()));
    }
    parts.push(backlog);
    if p.late_elements_dropped > 0 {
        parts.push(format!("{} late elements dropped", p.late_elements_dropped));
    }
    parts.join("; ")
}

/// The state a streaming job is in while the coordinator's phase is not final.
pub fn active_state(job: &DataflowJob, c: Option<&Control>, draining: bool) -> Option<JobState> {
    if c.is_some_and(Control::updating) {
        Some(JobState::Updating)
    } else if job.spec.desired_state == DesiredState::Drained || draining {
        Some(JobState::Draining)
    } else {
        None
    }
}
