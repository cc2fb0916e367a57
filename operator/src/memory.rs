//! Vertical autoscaling of the workers' memory (Dataflow Prime's, on Kubernetes), as a pure
//! function of the job (its options and status.autoscaling.memory), its pods (from the pod
//! watch's store) and the coordinator's per-worker memory use.
//!
//! A worker container terminated with reason OOMKilled, or a worker using more than
//! [`NEAR_LIMIT`] of its memory, is pressure. Under pressure the workers' memory (request and
//! limit of the worker StatefulSet's pods) grows by [`STEP`], rounded up to [`GRAIN`], up to
//! options.maxWorkerMemory; after [`QUIET_SECS`] without pressure it shrinks a step, never below
//! the base (pods.resources, minRam or the operator's default). Only a pod already at the current
//! size counts: a pod still at an older, smaller size is what the last step is replacing.
//! Everything the decision needs next time is in status, so a restarted operator goes on where
//! the last one stopped; with `autoscaling_dry_run` the decision is recorded and published but
//! the pods keep their memory.
use crate::children::{self, labels};
use crate::crd::{DataflowJob, MemoryStatus};
use crate::quantity::{memory_quantity, parse_bytes, quantity};
use crate::settings::OperatorSettings;
use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::{Event, EventType};
use riverbank_autoscale::insights::OomKill;
use riverbank_pipeline::progress::JobProgress;
use std::sync::Arc;

pub use riverbank_autoscale::memory::{GRAIN, STEP, round_up, step_down, step_up};
/// A worker whose resident memory reaches this share of its memory is short of it.
pub const NEAR_LIMIT: f64 = 0.9;
/// Without pressure for this long, the memory shrinks a step.
pub const QUIET_SECS: i64 = 30 * 60;
/// Under steady pressure, status.autoscaling.memory.lastPressure is refreshed at most this
/// often (each status write brings the job back for a reconcile).
const PRESSURE_REFRESH_SECS: i64 = 60;

/// OOMKilled and NearLimit: why memory grows; Quiet: why it shrinks; AtMaximum: it can't grow.
pub const OOM_KILLED: &str = "OOMKilled";
pub const NEAR_LIMIT_REASON: &str = "NearLimit";
pub const QUIET: &str = "Quiet";
pub const AT_MAXIMUM: &str = "AtMaximum";

/// What one reconcile makes of the workers' memory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemoryOutcome {
    /// The memory request and limit the worker pods get, when vertical autoscaling set one
    /// above the base (None: the pods keep the resources they are configured with).
    pub apply: Option<Quantity>,
    /// status.autoscaling.memory.
    pub status: Option<MemoryStatus>,
    /// A change (or, in a dry run, a proposed change) to publish.
    pub event: Option<MemoryEvent>,
    /// Worker pods killed for running out of memory (WORKER_OUT_OF_MEMORY).
    pub oom_kills: Vec<OomKill>,
    /// What the operator does about them, for the insight's recommendation.
    pub what_next: Option<String>,
}

/// The memory of a container's resources: its limit, else its request. Of the workers'
/// configured resources (spec.pods.resources, or minRam over the operator's default), the base
/// that vertical autoscaling starts from.
fn memory_of(r: &ResourceRequirements) -> Option<u64> {
    let get = |m: &Option<std::collections::BTreeMap<String, Quantity>>| {
        m.as_ref()
            .and_then(|m| m.get("memory"))
            .and_then(|q| parse_bytes(&q.0))
    };
    get(&r.limits).or_else(|| get(&r.requests))
}

/// options.maxWorkerMemory in bytes; None when not set (or not a size: the children report
/// that as an invalid spec).
pub fn max_memory(job: &DataflowJob) -> Option<u64> {
    let hint = job.spec.options.max_worker_memory.as_deref()?;
    parse_bytes(&memory_quantity(hint)?.0)
}

/// The memory a pod's worker container has: its limit, else its request.
fn pod_memory(pod: &Pod) -> Option<u64> {
    let c = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == children::WORKER)?;
    memory_of(c.resources.as_ref()?)
}

fn is_worker(pod: &Pod) -> bool {
    pod.labels().get(labels::COMPONENT).map(String::as_str) == Some(children::WORKER)
}

/// Whether the pod's worker container last ended (or has just ended) OOMKilled.
fn oom_killed(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.name == children::WORKER)
        .any(|c| {
            [c.state.as_ref(), c.last_state.as_ref()]
                .into_iter()
                .flatten()
                .filter_map(|s| s.terminated.as_ref())
                .any(|t| t.reason.as_deref() == Some(OOM_KILLED))
        })
}

fn fmt(bytes: u64) -> String {
    quantity(bytes).0
}

/// The reconcile's decision about the workers' memory. `active`: the job runs (or starts);
/// otherwise nothing changes. `dry_run`: decide and publish, but keep the memory. The workers'
/// configured resources come from the job and its plan (see [`decide_for`]).
pub fn decide(
    job: &DataflowJob,
    settings: &OperatorSettings,
    pods: &[Arc<Pod>],
    progress: Option<&JobProgress>,
    active: bool,
    dry_run: bool,
    now: Timestamp,
) -> MemoryOutcome {
    let configured = children::worker_resources(job, settings).ok();
    decide_for(
        job,
        configured.as_ref(),
        pods,
        progress,
        active,
        dry_run,
        now,
    )
}

/// [`decide`] for workers whose configured resources are known (`children::worker_requests`,
/// from a plan already made); None when they can't be made (the children report why).
pub fn decide_for(
    job: &DataflowJob,
    configured: Option<&ResourceRequirements>,
    pods: &[Arc<Pod>],
    progress: Option<&JobProgress>,
    active: bool,
    dry_run: bool,
    now: Timestamp,
) -> MemoryOutcome {
    let stored = job
        .status
        .as_ref()
        .and_then(|s| s.autoscaling.as_ref())
        .and_then(|a| a.memory.clone());
    let workers: Vec<&Pod> = pods
        .iter()
        .map(AsRef::as_ref)
        .filter(|p| is_worker(p) && p.metadata.deletion_timestamp.is_none())
        .collect();
    let oom_kills: Vec<OomKill> = workers
        .iter()
        .filter(|p| oom_killed(p))
        .map(|p| OomKill {
            pod: p.name_any(),
            memory: pod_memory(p).map(fmt),
        })
        .collect();
    let (Some(base), Some(max)) = (configured.and_then(memory_of), max_memory(job)) else {
        // Vertical autoscaling is off: the insight recommends what to set.
        return MemoryOutcome {
            oom_kills,
            ..MemoryOutcome::default()
        };
    };
    let current = stored
        .as_ref()
        .and_then(|m| parse_bytes(&m.current))
        .unwrap_or(base)
        .clamp(base, max.max(base));
    let apply = (current > base).then(|| quantity(current));
    let mut outcome = MemoryOutcome {
        apply,
        status: stored.clone(),
        oom_kills,
        ..MemoryOutcome::default()
    };
    if !active {
        return outcome;
    }

    // Pressure on pods already at the current size.
    let at_current = |p: &Pod| pod_memory(p).is_none_or(|m| m >= current);
    let oom_now: Vec<&Pod> = workers
        .iter()
        .copied()
        .filter(|p| oom_killed(p) && at_current(p))
        .collect();
    let near: Option<(String, u64, u64)> = progress.and_then(|p| {
        p.workers.iter().filter(|w| w.alive).find_map(|w| {
            let pod = workers.iter().find(|p| p.name_any() == w.name)?;
            let limit = pod_memory(pod)?;
            (limit >= current && w.rss_bytes as f64 >= NEAR_LIMIT * limit as f64)
                .then(|| (w.name.clone(), w.rss_bytes, limit))
        })
    });
    let pressure = match (oom_now.first(), &near) {
        (Some(p), _) => Some((
            OOM_KILLED,
            format!(
                "worker pod {} was killed for running out of memory at {}",
                p.name_any(),
                fmt(current)
            ),
        )),
        (None, Some((pod, rss, limit))) => Some((
            NEAR_LIMIT_REASON,
            format!(
                "worker pod {pod} uses {} of its {} ({:.0}%)",
                fmt(round_up(*rss)),
                fmt(*limit),
                *rss as f64 * 100.0 / *limit as f64
            ),
        )),
        (None, None) => None,
    };
    let last_pressure = stored
        .as_ref()
        .and_then(|m| m.last_pressure.as_ref().map(|t| t.0));
    let last_change = stored.as_ref().map(|m| m.last_change.0);
    let since = |t: Option<Timestamp>| t.map(|t| now.duration_since(t).as_secs());

    let (target, reason, why) = match pressure {
        Some((reason, why)) => {
            let target = step_up(current).min(max);
            if target <= current {
                outcome.what_next = Some(format!(
                    "The workers already have options.maxWorkerMemory ({}): raise it, give the workers more memory from the start (options.minRam), or reduce the memory the pipeline needs.",
                    fmt(max)
                ));
                let refresh = stored.as_ref().is_none_or(|m| m.reason != AT_MAXIMUM)
                    || since(last_pressure).is_none_or(|s| s >= PRESSURE_REFRESH_SECS);
                if refresh {
                    let first = stored.as_ref().is_none_or(|m| m.reason != AT_MAXIMUM);
                    outcome.status = Some(MemoryStatus {
                        current: fmt(current),
                        reason: AT_MAXIMUM.into(),
                        message: format!("{why}; the workers already have maxWorkerMemory"),
                        last_change: if first {
                            Time(now)
                        } else {
                            Time(last_change.unwrap_or(now))
                        },
                        last_pressure: Some(Time(now)),
                        proposed: None,
                    });
                    if first {
                        outcome.event = Some(event(
                            true,
                            "MemoryAtMaximum",
                            format!(
                                "Workers need more memory ({why}), but they already have options.maxWorkerMemory ({})",
                                fmt(max)
                            ),
                        ));
                    }
                }
                return outcome;
            }
            (target, reason, why)
        }
        None => {
            let quiet = since(last_pressure.max(last_change)).is_none_or(|s| s >= QUIET_SECS);
            if current <= base || !quiet {
                return outcome;
            }
            (
                step_down(current).max(base),
                QUIET,
                format!(
                    "no worker was short of memory for {} minutes",
                    QUIET_SECS / 60
                ),
            )
        }
    };
    let grows = target > current;
    outcome.what_next = grows.then(|| {
        format!(
            "The operator raises the workers' memory to {}{} (options.maxWorkerMemory {}); their items run again on the bigger workers.",
            fmt(target),
            if dry_run { " in a dry run only (autoscaling_dry_run): nothing changes" } else { "" },
            fmt(max)
        )
    });
    let pressure_at = if grows {
        Some(Time(now))
    } else {
        last_pressure.map(Time)
    };
    if dry_run {
        // Published once per proposal; the pods keep their memory.
        if stored.as_ref().and_then(|m| m.proposed.as_deref()) == Some(fmt(target).as_str()) {
            return outcome;
        }
        outcome.status = Some(MemoryStatus {
            current: fmt(current),
            reason: reason.into(),
            message: format!("{why}: would set {}", fmt(target)),
            last_change: Time(now),
            last_pressure: pressure_at,
            proposed: Some(fmt(target)),
        });
        outcome.event = Some(event(
            false,
            "MemoryScalingDryRun",
            format!(
                "Dry run (autoscaling_dry_run), would set the workers' memory {} -> {} ({reason}: {why}); keeping {}",
                fmt(current),
                fmt(target),
                fmt(current)
            ),
        ));
        return outcome;
    }
    outcome.apply = (target > base).then(|| quantity(target));
    outcome.status = Some(MemoryStatus {
        current: fmt(target),
        reason: reason.into(),
        message: format!("{why}: {} -> {}", fmt(current), fmt(target)),
        last_change: Time(now),
        last_pressure: pressure_at,
        proposed: None,
    });
    outcome.event = Some(event(
        grows,
        "MemoryScaling",
        format!(
            "Setting the workers' memory {} -> {} ({reason}: {why}); the worker pods restart with it{}",
            fmt(current),
            fmt(target),
            if grows {
                format!(" (at most options.maxWorkerMemory, {})", fmt(max))
            } else {
                String::new()
            }
        ),
    ));
    outcome
}

/// An Event about the workers' memory: MemoryScaling, MemoryScalingDryRun, MemoryAtMaximum.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryEvent {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

impl MemoryEvent {
    pub fn event(&self) -> Event {
        Event {
            type_: if self.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: self.reason.into(),
            note: Some(self.note.clone()),
            action: "ScaleMemory".into(),
            secondary: None,
        }
    }
}

fn event(warning: bool, reason: &'static str, note: String) -> MemoryEvent {
    MemoryEvent {
        warning,
        reason,
        note,
    }
}

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
