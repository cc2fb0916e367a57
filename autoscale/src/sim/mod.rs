//! The simulator: replays a load trace through a model of workers and the engine, and accounts
//! what each policy costs (worker-seconds) and how far behind it falls (backlog).
//!
//! The worker model, stepped once per second:
//! - A worker has `cores`; a core processes `1000 / cost_ms` elements per second. A key runs on
//!   one core at a time, so elements that arrived while only `keys` keys were active can use at
//!   most `keys` cores, also after the load has spread out again: queued elements keep their
//!   keys. The oldest queued elements are served first.
//! - Scaling up: the new workers are billed at once, join after `startup_secs`, and their joining
//!   stops all processing for `pause_secs` (work and disks move). Scaling down: processing stops
//!   for `pause_secs`, then the workers leave.
//! - Every 10 s the job is observed (backlog, throughput, CPU = busy / available core time, keys)
//!   and the engine decides; a rescale starts unless one is under way or it is a dry run.
//! - Backlog time is the backlog divided by the current input rate: how long the job is behind.
pub mod trace;

use crate::engine::window::Window;
use crate::engine::{Decision, Engine, EngineConfig, EngineState, Insight, Policy, Reason};
use crate::observe::Observation;
use riverbank_pipeline::PipelineOptions;
use serde::Serialize;
pub use trace::{Load, Trace, TracePoint};

/// Seconds between observations (and engine calls).
pub const OBSERVE_SECS: f64 = 10.0;
const TICK_SECS: f64 = 1.0;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerModel {
    pub cores: u32,
    pub startup_secs: f64,
    pub pause_secs: f64,
}

impl WorkerModel {
    /// `cpuCount` of the options, else Dataflow's default machine: 4 vCPUs for streaming
    /// (n1-standard-4), 1 for batch (n1-standard-1). Kubernetes pods start faster than VMs; a
    /// minute covers scheduling, image pull and joining.
    pub fn from_options(options: &PipelineOptions) -> WorkerModel {
        WorkerModel {
            cores: options
                .cpu_count
                .unwrap_or(if options.streaming { 4 } else { 1 })
                .max(1),
            startup_secs: 60.0,
            pause_secs: 10.0,
        }
    }
}

/// What one policy cost on one trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    pub policy: Policy,
    /// Σ billed workers × seconds (starting workers are billed).
    pub worker_seconds: f64,
    /// Σ backlog time × seconds.
    pub backlog_seconds: f64,
    pub worst_backlog_secs: f64,
    pub rescales: u32,
    pub final_backlog_secs: f64,
    pub insights: Vec<Insight>,
}

/// One observation and the decision taken on it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineRow {
    pub time_s: f64,
    pub input_rate: f64,
    pub backlog_secs: f64,
    /// Billed workers.
    pub workers: u32,
    /// Workers processing.
    pub active_workers: u32,
    pub cpu: f64,
    pub decision: u32,
    pub reason: Reason,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insight: Option<Insight>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRun {
    pub totals: Totals,
    pub timeline: Vec<TimelineRow>,
}

/// A rescale under way.
#[derive(Debug, Clone, Copy)]
struct Rescale {
    target: u32,
    pause_from: f64,
    done_at: f64,
}

/// Queued elements, grouped by the key limit they arrived under, oldest first.
#[derive(Debug, Default)]
struct Backlog {
    groups: Vec<(Option<u64>, f64)>,
}

impl Backlog {
    fn total(&self) -> f64 {
        self.groups.iter().map(|g| g.1).sum()
    }

    fn arrive(&mut self, keys: Option<u64>, elements: f64) {
        match self.groups.last_mut() {
            Some(last) if last.0 == keys => last.1 += elements,
            _ => self.groups.push((keys, elements)),
        }
    }

    /// Processes with `cores` for one tick at `per_core` elements per second each; returns the
    /// elements done and the core-seconds they took.
    fn process(&mut self, cores: f64, per_core: f64, secs: f64) -> (f64, f64) {
        let (mut left, mut done) = (cores, 0.0);
        for (keys, queued) in &mut self.groups {
            let usable = keys.map_or(left, |k| left.min(k as f64));
            let n = queued.min(usable * per_core * secs);
            *queued -= n;
            done += n;
            left -= n / (per_core * secs);
            if left <= 1e-12 {
                break;
            }
        }
        self.groups.retain(|g| g.1 > 1e-9);
        (done, done / per_core)
    }
}

/// Runs one policy over a trace.
pub fn simulate(trace: &Trace, config: EngineConfig, model: &WorkerModel) -> PolicyRun {
    let policy = config.policy;
    let engine = Engine::new(config);
    let mut state = EngineState::default();
    let mut billed = engine.config().initial_workers();
    let mut active = billed;
    let mut rescale: Option<Rescale> = None;
    let mut backlog = Backlog::default();
    // Readings every OBSERVE_SECS, all kept: the same window the operator keeps.
    let mut history = Window::new(0.0);
    let mut timeline = Vec::new();
    let mut totals = Totals {
        policy,
        worker_seconds: 0.0,
        backlog_seconds: 0.0,
        worst_backlog_secs: 0.0,
        rescales: 0,
        final_backlog_secs: 0.0,
        insights: Vec::new(),
    };
    // Per observation interval: elements processed, busy and available core-seconds.
    let (mut processed, mut busy, mut available) = (0.0, 0.0, 0.0);
    let ticks = ((trace.end() - trace.start()) / TICK_SECS).round() as u64;
    let per_observation = (OBSERVE_SECS / TICK_SECS).round() as u64;
    let mut backlog_secs = 0.0;
    for tick in 0..ticks {
        let t = trace.start() + tick as f64 * TICK_SECS;
        let load = trace.at(t + TICK_SECS / 2.0);
        backlog.arrive(load.keys, load.input_rate * TICK_SECS);
        let paused = rescale.is_some_and(|r| t >= r.pause_from);
        let cores = f64::from(active) * f64::from(model.cores);
        if !paused {
            let (done, core_secs) = backlog.process(cores, 1000.0 / load.cost_ms, TICK_SECS);
            processed += done;
            busy += core_secs;
        }
        available += cores * TICK_SECS;
        totals.worker_seconds += f64::from(billed) * TICK_SECS;
        backlog_secs = backlog.total() / load.input_rate;
        totals.backlog_seconds += backlog_secs * TICK_SECS;
        totals.worst_backlog_secs = totals.worst_backlog_secs.max(backlog_secs);
        let now = t + TICK_SECS;
        if let Some(r) = rescale
            && now >= r.done_at - 1e-9
        {
            active = r.target;
            billed = r.target;
            rescale = None;
        }
        if !(tick + 1).is_multiple_of(per_observation) {
            continue;
        }
        let obs = Observation {
            at_secs: now,
            interval_secs: OBSERVE_SECS,
            workers: active,
            cores_per_worker: model.cores,
            backlog_bytes: backlog.total() * load.element_bytes,
            throughput_bytes_per_sec: processed * load.element_bytes / OBSERVE_SECS,
            avg_cpu: if available > 0.0 {
                busy / available
            } else {
                0.0
            },
            fraction_consumed: 0.0,
            runnable_items: None,
            active_keys: load.keys,
            parallelism_capped: false,
            shuffle_data_live: false,
        };
        (processed, busy, available) = (0.0, 0.0, 0.0);
        let cpu = obs.avg_cpu;
        history.push(obs);
        let d: Decision = engine.decide(&mut state, history.observations());
        if let Some(i) = d.insight
            && !totals.insights.contains(&i)
        {
            totals.insights.push(i);
        }
        let wanted = d.workers_to_apply();
        if rescale.is_none() && wanted != billed {
            totals.rescales += 1;
            rescale = Some(if wanted > billed {
                billed = wanted;
                Rescale {
                    target: wanted,
                    pause_from: now + model.startup_secs,
                    done_at: now + model.startup_secs + model.pause_secs,
                }
            } else {
                Rescale {
                    target: wanted,
                    pause_from: now,
                    done_at: now + model.pause_secs,
                }
            });
        }
        timeline.push(TimelineRow {
            time_s: now,
            input_rate: load.input_rate,
            backlog_secs,
            workers: billed,
            active_workers: active,
            cpu,
            decision: d.target_workers,
            reason: d.reason,
            message: d.message,
            insight: d.insight,
        });
    }
    totals.final_backlog_secs = backlog_secs;
    PolicyRun { totals, timeline }
}

/// Runs every policy over a trace with the same options and model.
pub fn compare(trace: &Trace, options: &PipelineOptions, model: &WorkerModel) -> Vec<PolicyRun> {
    Policy::ALL
        .iter()
        .map(|&policy| {
            let config = EngineConfig {
                startup_secs: model.startup_secs,
                pause_secs: model.pause_secs,
                ..EngineConfig::from_options(options, policy)
            };
            simulate(trace, config, model)
        })
        .collect()
}

#[cfg(test)]
mod tests;
