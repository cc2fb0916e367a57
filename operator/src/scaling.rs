//! How many pods a job should have: [`replicas`] is the one place the decision is made (stopped,
//! cancelled, finished, autoscaled or fixed); the reconciler passes it to
//! `children::desired_children` and records its worker count in status.targetWorkers.
//!
//! `autoscalingAlgorithm: NONE` keeps numWorkers, within [minimum, maxNumWorkers].
//! THROUGHPUT_BASED (the default) follows `riverbank-autoscale`'s engine with Riverbank's policy:
//! per job the operator keeps a window of observations built from the coordinator's
//! `JobProgress` and the engine's small state ([`JobScaler`], held in [`Autoscalers`]), and
//! asks the engine once per evaluation interval (10 s streaming, 30 s batch).
//!
//! The engine's start-up estimate is measured per job: from a scale-up's decision until the
//! coordinator reports all the workers asked for (averaged with the previous measurement).
//!
//! What must outlive the operator is kept in status.autoscaling: the measured start-up and the
//! last applied rescale. An operator that restarts (or takes over leadership) reads them back, so
//! a scale-up still under way is waited for rather than decided again. The window itself is not
//! kept: it refills (two minutes in streaming, one reading in batch) before the engine decides
//! again; the last target survives in status.targetWorkers, and a standing insight is left in
//! its condition until then.
use crate::crd::{
    AutoscalingAlgorithm, AutoscalingStatus, DataflowJob, DesiredState, EvaluationStatus, JobState,
    RescaleStatus, ScalingDecision,
};
use crate::insights::{InsightState, StandingInsight};
use crate::lifecycle::{Replicas, previous_state};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use riverbank_autoscale::engine::{PendingRescale, RESCALE_TIMEOUT_SECS};
use riverbank_autoscale::{
    Decision, Engine, EngineConfig, EngineState, Observation, Policy, Reason, Window,
};
use riverbank_pipeline::progress::{JobPhase, JobProgress};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// A job no reconcile has looked at for this long was deleted (without a finalizer its deletion
/// never reaches the reconciler): its memory is dropped.
const FORGET_AFTER_SECS: f64 = 3600.0;
/// Readings closer together than this are not both kept: a running job is reconciled about
/// every second (and on pod events), which would overweight one moment.
pub const MIN_OBSERVATION_GAP_SECS: f64 = 5.0;

/// Seconds on a monotonic clock; the tests substitute one they move by hand.
pub trait Clock: Send + Sync {
    fn now_secs(&self) -> f64;
}

/// Seconds since the operator started.
pub struct MonotonicClock(Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock(Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now_secs(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// The engine's configuration for `job`: its options as its plan carries them
/// (`JobOptions::to_pipeline_options`, what `DataflowJob::plan` uses), with Riverbank's policy;
/// `autoscalingAlgorithm: NONE` makes it the fixed policy.
///
/// A batch rescale pauses nothing: workers pull work items, so a joining worker takes new ones
/// and a leaving one drains its own while the others go on. A streaming rescale moves the
/// persistent disks, and keeps the engine's 10 s pause. The start-up estimate (60 s) is replaced
/// by the job's measured one ([`JobScaler`]).
pub fn engine_config(job: &DataflowJob) -> EngineConfig {
    let options = job.spec.options.to_pipeline_options(&job.job_name());
    let mut cfg = EngineConfig::from_options(&options, Policy::Riverbank);
    if !cfg.streaming {
        cfg.pause_secs = 0.0;
    }
    cfg
}

/// How many pods `job` runs now: none once it was cancelled (desiredState Cancelled) or its
/// recorded state is final (Done, Failed, Cancelled, Drained), else one coordinator and
/// [`target_workers`]. The recorded state, not this reconcile's observation: a job that has just
/// finished keeps its pods until its final state is stored, so a failed status write never
/// loses a Done (the coordinator is still there to say it again). A Failed that only says the
/// spec was invalid does not count as final (`lifecycle::previous_state`): a fixed spec starts the
/// job afresh.
pub fn replicas(job: &DataflowJob, autoscaled: Option<u32>) -> Replicas {
    let old = job.status.clone().unwrap_or_default();
    let finished = previous_state(&old).is_some_and(JobState::is_terminal);
    if finished || job.spec.desired_state == DesiredState::Cancelled {
        Replicas::STOPPED
    } else {
        Replicas {
            coordinator: 1,
            workers: target_workers(job, autoscaled),
        }
    }
}

/// A Beam SDK job's SDK worker pods at its start: numWorkers (default 3), at most maxNumWorkers;
/// its runner is given their pools then (the API server refuses a change of numWorkers, which
/// would restart the runner). Autoscaled like any job's workers ([`target_workers`]): the
/// operator tells the runner of the pods as they come and go.
pub fn sdk_worker_pods(job: &DataflowJob) -> i32 {
    let o = &job.spec.options;
    o.initial_workers().clamp(1, o.max_workers().max(1))
}

/// The number of workers `job` should run with while it is active. `autoscaled` is the target of
/// the engine's last applied decision ([`Autoscaled::target`]); without one, a running job keeps
/// the target in its status and a new one starts at the engine's initial size (numWorkers, made
/// a usable count for a streaming job's disks).
pub fn target_workers(job: &DataflowJob, autoscaled: Option<u32>) -> i32 {
    let o = &job.spec.options;
    let max = o.max_workers();
    let target = match o.autoscaling() {
        AutoscalingAlgorithm::None => o.initial_workers(),
        AutoscalingAlgorithm::ThroughputBased => autoscaled
            .map(|n| i32::try_from(n).unwrap_or(i32::MAX))
            .or_else(|| running_target(job))
            .unwrap_or_else(|| i32::try_from(engine_config(job).initial_workers()).unwrap_or(max)),
    };
    target.clamp(o.min_workers().min(max), max)
}

fn running_target(job: &DataflowJob) -> Option<i32> {
    let s = job.status.as_ref()?;
    if !matches!(
        s.state,
        Some(JobState::Running | JobState::Draining | JobState::Updating)
    ) {
        return None;
    }
    s.target_workers.filter(|&n| n > 0)
}

/// The stable code of an engine reason, as Events show it (`SCALE_UP_BACKLOG`).
pub fn reason_code(reason: Reason) -> String {
    serde_json::to_value(reason)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_else(|| format!("{reason:?}"))
}

/// Decisions that looked at a full window; the others say nothing about insights.
fn conclusive(reason: Reason) -> bool {
    !matches!(
        reason,
        Reason::NoMetrics | Reason::NotDue | Reason::RescaleInProgress | Reason::Settling
    )
}

/// A rescale the operator applied, on its monotonic clock.
#[derive(Debug, Clone, PartialEq)]
pub struct AppliedRescale {
    pub at_secs: f64,
    pub from: u32,
    pub to: u32,
    /// The engine's reason code.
    pub reason: String,
    /// `at_secs` in real time, fixed once (see [`Autoscalers::observe`]).
    pub time: Option<Timestamp>,
}

/// One job's autoscaling memory: the window, the engine's state, and what came of it.
#[derive(Debug, Clone)]
pub struct JobScaler {
    state: EngineState,
    window: Window,
    /// The target of the last applied (not dry-run) rescale.
    target: Option<u32>,
    insight: InsightState,
    /// The last decision that changes, or in a dry run would change, the worker count, until
    /// its Event is published.
    unpublished: Option<Decision>,
    seen_at: f64,
    /// Measured seconds from a scale-up's decision until all its workers had joined.
    startup_secs: Option<f64>,
    /// A scale-up whose workers have not all joined yet: the start-up being measured.
    joining: Option<PendingRescale>,
    /// Streaming: the pause of the job's last rescale as its coordinator measured it (the
    /// first checkpoint after the workers changed, shard moves included), seconds.
    pause_secs: Option<f64>,
    last_rescale: Option<AppliedRescale>,
    /// The latest decision, and when (in real time) it was made.
    last_evaluation: Option<(Decision, Option<Timestamp>)>,
}

impl Default for JobScaler {
    fn default() -> Self {
        JobScaler {
            state: EngineState::default(),
            window: Window::new(MIN_OBSERVATION_GAP_SECS),
            target: None,
            insight: InsightState::default(),
            unpublished: None,
            seen_at: 0.0,
            startup_secs: None,
            joining: None,
            pause_secs: None,
            last_rescale: None,
            last_evaluation: None,
        }
    }
}

impl JobScaler {
    /// A scaler that picks up what an earlier operator left in status.autoscaling: the measured
    /// start-up, and a rescale decided less than the engine's rescale timeout ago, which the
    /// engine waits for (as it would have) instead of deciding again.
    pub fn restored(stored: &AutoscalingStatus, at_secs: f64, wall: Timestamp) -> JobScaler {
        let mut s = JobScaler {
            startup_secs: stored
                .startup_seconds
                .filter(|s| s.is_finite() && *s >= 0.0),
            seen_at: at_secs,
            ..JobScaler::default()
        };
        if let Some(r) = &stored.last_rescale {
            let age = wall.duration_since(r.time.0).as_secs_f64().max(0.0);
            let since = at_secs - age;
            let (from, to) = (
                u32::try_from(r.from_workers).unwrap_or(0),
                u32::try_from(r.to_workers).unwrap_or(0),
            );
            s.last_rescale = Some(AppliedRescale {
                at_secs: since,
                from,
                to,
                reason: r.reason.clone(),
                time: Some(r.time.0),
            });
            if age < RESCALE_TIMEOUT_SECS {
                let pending = PendingRescale {
                    target: to,
                    since_secs: since,
                };
                s.state.rescale = Some(pending);
                if to > from {
                    s.joining = Some(pending);
                }
            }
        }
        s
    }

    /// The configuration with this job's measured start-up.
    fn configured(&self, cfg: &EngineConfig) -> EngineConfig {
        EngineConfig {
            startup_secs: self.startup_secs.unwrap_or(cfg.startup_secs),
            // A streaming rescale pauses the job while shards move: the measured pause, once
            // there is one, replaces the engine's estimate.
            pause_secs: match self.pause_secs {
                Some(p) if cfg.streaming => p,
                _ => cfg.pause_secs,
            },
            ..cfg.clone()
        }
    }

    /// Times a scale-up from its decision until the live workers reach its target.
    fn measure_startup(&mut self, live: u32, at_secs: f64) {
        let Some(j) = self.joining else { return };
        let took = at_secs - j.since_secs;
        if live >= j.target {
            self.startup_secs = Some(self.startup_secs.map_or(took, |old| (old + took) / 2.0));
            self.joining = None;
        } else if took >= RESCALE_TIMEOUT_SECS {
            self.joining = None;
        }
    }

    /// What status.autoscaling should say, on the monotonic clock.
    pub fn memory(&self) -> (Option<f64>, Option<&AppliedRescale>) {
        (self.startup_secs, self.last_rescale.as_ref())
    }

    /// Records one reading of the coordinator's progress taken at `at_secs`, and asks the
    /// engine when its evaluation interval has passed. Returns the decision, if one was made.
    pub fn observe(
        &mut self,
        cfg: &EngineConfig,
        progress: &JobProgress,
        at_secs: f64,
        cores_per_worker: u32,
    ) -> Option<Decision> {
        self.seen_at = at_secs;
        if progress.phase != JobPhase::Running {
            return None;
        }
        if let Some(ms) = progress
            .streaming
            .as_ref()
            .and_then(|s| s.last_rescale_pause_ms)
        {
            self.pause_secs = Some(ms as f64 / 1000.0);
        }
        let observation = Observation::from_progress(progress, at_secs, cores_per_worker);
        self.measure_startup(observation.workers, at_secs);
        // Until a worker has joined there is nothing to measure per worker.
        if observation.workers == 0 {
            return None;
        }
        if !self.window.push(observation) {
            return None;
        }
        if self
            .state
            .last_eval_secs
            .is_some_and(|last| at_secs - last < cfg.evaluation_interval_secs() - 1e-6)
        {
            return None;
        }
        let decision =
            Engine::new(self.configured(cfg)).decide(&mut self.state, self.window.observations());
        // Only a rescale moves the StatefulSet. A hold reports the live workers as its target,
        // and applying that would shrink the job whenever a worker pod restarts.
        if decision.is_rescale() && !decision.dry_run {
            let (from, to) = (decision.current_workers, decision.workers_to_apply());
            self.target = Some(to);
            self.last_rescale = Some(AppliedRescale {
                at_secs,
                from,
                to,
                reason: reason_code(decision.reason),
                time: None,
            });
            self.joining = (to > from).then_some(PendingRescale {
                target: to,
                since_secs: at_secs,
            });
        }
        if conclusive(decision.reason) {
            self.insight = match decision.insight {
                Some(insight) => InsightState::Holds(StandingInsight {
                    finding: riverbank_autoscale::insights::from_decision(
                        insight,
                        &decision,
                        cfg.max_workers,
                    ),
                }),
                None => InsightState::Clear,
            };
        }
        self.last_evaluation = Some((decision.clone(), None));
        if decision.is_rescale() {
            self.unpublished = Some(decision.clone());
        }
        Some(decision)
    }

    /// What the reconciler needs now.
    pub fn view(&self) -> Autoscaled {
        Autoscaled {
            target: self.target,
            insight: self.insight.clone(),
            event: self.unpublished.clone(),
            decided: None,
            memory: None,
        }
    }

    /// The Event of the decision made at `at_secs` was published.
    pub fn published(&mut self, at_secs: f64) {
        if self
            .unpublished
            .as_ref()
            .is_some_and(|d| d.at_secs == at_secs)
        {
            self.unpublished = None;
        }
    }
}

/// status.autoscaling from a scaler's memory (without `memory`: vertical autoscaling fills it).
fn status_memory(scaler: &JobScaler, wall: Timestamp) -> Option<AutoscalingStatus> {
    let (startup, last) = scaler.memory();
    let evaluated = scaler.last_evaluation.as_ref();
    if startup.is_none() && last.is_none() && evaluated.is_none() {
        return None;
    }
    Some(AutoscalingStatus {
        // Whole seconds: a status that changes in the last digit would be rewritten for nothing.
        startup_seconds: startup.map(f64::round),
        last_rescale: last.map(|r| RescaleStatus {
            time: Time(r.time.unwrap_or(wall)),
            from_workers: to_i32(r.from),
            to_workers: to_i32(r.to),
            reason: r.reason.clone(),
        }),
        last_evaluation: evaluated.map(|(d, at)| evaluation_status(d, at.unwrap_or(wall))),
        memory: None,
    })
}

fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// status.autoscaling.lastEvaluation of a decision made at `time`.
pub fn evaluation_status(d: &Decision, time: Timestamp) -> EvaluationStatus {
    EvaluationStatus {
        time: Time(time),
        decision: match d.target_workers.cmp(&d.current_workers) {
            std::cmp::Ordering::Greater => ScalingDecision::ScaleUp,
            std::cmp::Ordering::Less => ScalingDecision::ScaleDown,
            std::cmp::Ordering::Equal => ScalingDecision::Hold,
        },
        current_workers: to_i32(d.current_workers),
        target_workers: to_i32(d.target_workers),
        reason: reason_code(d.reason),
        message: d.message.clone(),
        dry_run: d.dry_run && d.is_rescale(),
    }
}

/// One reconcile's view of a job's autoscaling.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Autoscaled {
    /// For [`target_workers`].
    pub target: Option<u32>,
    pub insight: InsightState,
    /// A rescale decision (real or dry-run) whose Event is still to be published.
    pub event: Option<Decision>,
    /// The decision this reconcile made, if the engine was asked.
    pub decided: Option<Decision>,
    /// For status.autoscaling; None when there is nothing to keep yet.
    pub memory: Option<AutoscalingStatus>,
}

/// Every job's [`JobScaler`], keyed by namespace, name and uid (a job deleted and created again
/// under the same name starts afresh).
#[derive(Default)]
pub struct Autoscalers {
    jobs: Mutex<HashMap<String, JobScaler>>,
}

impl Autoscalers {
    pub fn key(job: &DataflowJob) -> String {
        format!(
            "{}/{}/{}",
            job.namespace().unwrap_or_default(),
            job.name_any(),
            job.uid().unwrap_or_default()
        )
    }

    /// Records a reconcile of an autoscaled, active job: `progress` is the coordinator's answer
    /// when it gave one; `stored` is the job's status.autoscaling, read when the job is new to
    /// this operator. `at_secs` is the monotonic clock, `wall` the same moment in real time.
    #[allow(clippy::too_many_arguments)]
    pub fn observe(
        &self,
        key: &str,
        cfg: &EngineConfig,
        progress: Option<&JobProgress>,
        stored: Option<&AutoscalingStatus>,
        at_secs: f64,
        wall: Timestamp,
        cores_per_worker: u32,
    ) -> Autoscaled {
        let mut jobs = self.jobs.lock().expect("not poisoned");
        jobs.retain(|k, s| k == key || at_secs - s.seen_at < FORGET_AFTER_SECS);
        let scaler = jobs.entry(key.to_string()).or_insert_with(|| {
            stored.map_or_else(JobScaler::default, |s| {
                JobScaler::restored(s, at_secs, wall)
            })
        });
        let decided = match progress {
            Some(p) => scaler.observe(cfg, p, at_secs, cores_per_worker),
            None => {
                scaler.seen_at = at_secs;
                None
            }
        };
        if let Some(r) = scaler.last_rescale.as_mut()
            && r.time.is_none()
        {
            let ago = SignedDuration::from_secs_f64((at_secs - r.at_secs).max(0.0));
            r.time = Some(wall.checked_sub(ago).unwrap_or(wall));
        }
        if let Some((d, time)) = scaler.last_evaluation.as_mut()
            && time.is_none()
        {
            let ago = SignedDuration::from_secs_f64((at_secs - d.at_secs).max(0.0));
            *time = Some(wall.checked_sub(ago).unwrap_or(wall));
        }
        Autoscaled {
            decided,
            memory: status_memory(scaler, wall),
            ..scaler.view()
        }
    }

    pub fn published(&self, key: &str, at_secs: f64) {
        if let Some(s) = self.jobs.lock().expect("not poisoned").get_mut(key) {
            s.published(at_secs);
        }
    }

    /// The job is no longer autoscaled (finished, invalid, NONE): nothing to remember.
    pub fn forget(&self, key: &str) {
        self.jobs.lock().expect("not poisoned").remove(key);
    }

    pub fn len(&self) -> usize {
        self.jobs.lock().expect("not poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
#[path = "scaling_tests.rs"]
mod tests;
