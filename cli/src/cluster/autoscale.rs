//! `run --workers N --autoscale`: the operator's autoscaling engine (`riverbank-autoscale`)
//! applied to local worker processes, so its decisions can be watched on one machine.
use super::LocalAutoscale;
use riverbank_autoscale::{
    Decision, Engine, EngineConfig, EngineState, Observation, Policy, Window,
};
use riverbank_pipeline::{JobProgress, Plan};
use std::time::Instant;

/// Real seconds between two readings kept (the progress is polled more often).
const OBSERVATION_GAP_SECS: f64 = 0.25;

pub struct Scaler {
    engine: Engine,
    state: EngineState,
    window: Window,
    start: Instant,
    time_scale: f64,
    cores: u32,
    last_decision: Option<f64>,
    last: Option<Decision>,
}

impl Scaler {
    pub fn new(plan: &Plan, workers: usize, threads: usize, a: &LocalAutoscale) -> Scaler {
        let mut cfg = EngineConfig::from_options(&plan.options, Policy::Riverbank);
        cfg.num_workers = workers as u32;
        cfg.max_workers = a.max_workers.max(workers as u32);
        // A local worker process starts in well under a second, and there are no disks to move.
        cfg.startup_secs = a.time_scale;
        cfg.pause_secs = 0.0;
        let time_scale = a.time_scale.max(1e-3);
        Scaler {
            engine: Engine::new(cfg),
            state: EngineState::default(),
            // The window is on the engine's clock: a quarter of a real second, scaled.
            window: Window::new(OBSERVATION_GAP_SECS * time_scale),
            start: Instant::now(),
            time_scale,
            cores: threads as u32,
            last_decision: None,
            last: None,
        }
    }

    /// Takes an observation every quarter second (real time) and, at the engine's interval, a
    /// decision.
    /// Returns the worker count to run when it differs from `active`.
    pub fn observe(&mut self, p: &JobProgress, active: usize) -> Option<usize> {
        let at = self.start.elapsed().as_secs_f64() * self.time_scale;
        // Rates per engine second.
        let mut scaled = p.clone();
        scaled.throughput_bytes_per_sec /= self.time_scale;
        if !self
            .window
            .push(Observation::from_progress(&scaled, at, self.cores))
        {
            return None;
        }
        let interval = self.engine.config().evaluation_interval_secs();
        if self.last_decision.is_some_and(|t| at - t < interval) {
            return None;
        }
        self.last_decision = Some(at);
        let d = self
            .engine
            .decide(&mut self.state, self.window.observations());
        tracing::debug!(current = d.current_workers, target = d.target_workers, reason = ?d.reason, message = %d.message, "autoscaling decision");
        if d.target_workers != d.current_workers || d.insight.is_some() {
            eprintln!(
                "autoscale: {} -> {} workers ({:?}{}): {}",
                d.current_workers,
                d.target_workers,
                d.reason,
                if d.dry_run { ", dry run" } else { "" },
                d.message
            );
        }
        let target = d.workers_to_apply() as usize;
        self.last = Some(d);
        (target != active && target > 0).then_some(target)
    }

    /// The most workers the engine may ask for.
    pub fn max_workers(&self) -> u32 {
        self.engine.config().max_workers
    }

    /// The last decision (the console's autoscaling rationale).
    pub fn last(&self) -> Option<&Decision> {
        self.last.as_ref()
    }
}
