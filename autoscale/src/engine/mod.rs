//! The decision engine: a pure, deterministic function from a job's options, a window of
//! observations and the engine's own small state to a target worker count and its reason.
//! No I/O and no clock (time comes in the observations), so the operator, `riverbank run
//! --autoscale` and the simulator all get the same answer from the same inputs.
mod batch;
pub mod sizes;
mod streaming;
pub mod window;

use crate::observe::Observation;
use riverbank_pipeline::PipelineOptions;
use riverbank_pipeline::options::AutoscalingAlgorithm;
use serde::{Deserialize, Serialize};
pub use sizes::WorkerSizes;

/// Streaming: "a couple of minutes" (seed 000) — how long a condition must hold.
pub const STREAMING_WINDOW_SECS: f64 = 120.0;
/// Streaming: how often the engine looks (Dataflow does not say; one poll of the operator).
pub const STREAMING_INTERVAL_SECS: f64 = 10.0;
/// Batch: Dataflow re-evaluates the amount of work every 30 s.
pub const BATCH_INTERVAL_SECS: f64 = 30.0;
/// Backlogged when the estimated backlog time stays above this.
pub const BACKLOGGED_SECS: f64 = 15.0;
/// Scale-down is considered only under this backlog time.
pub const IDLE_BACKLOG_SECS: f64 = 10.0;
/// Streaming scale-up needs more average CPU than this (else the backlog is not CPU-bound).
pub const SCALE_UP_MIN_CPU: f64 = 0.20;
/// Streaming scale-down needs less average CPU than this, and aims at it afterwards.
pub const TARGET_CPU: f64 = 0.75;
/// Scale-ups are sized to clear the backlog in about this long.
pub const CLEAR_BACKLOG_SECS: f64 = 150.0;
/// Batch: no scale-up while average CPU is under this.
pub const BATCH_MIN_CPU: f64 = 0.05;
/// Batch sizing: workers = ceil(sqrt(remaining worker-seconds / this)), so the remaining time is
/// sqrt(work × this): four times the work gets twice the workers (sub-linear, seed 000).
pub const BATCH_REFERENCE_SECS: f64 = 30.0;
/// A rescale whose workers never show up is given up after this long.
pub const RESCALE_TIMEOUT_SECS: f64 = 600.0;
/// Riverbank: a streaming scale-down waits until the backlog is under this (drained).
pub const DRAINED_SECS: f64 = 1.0;
/// Riverbank: scale-downs provision the measured peak arrivals (trend plus the largest burst)
/// at up to this CPU. The documented 75 % target on the mean keeps a margin for variation it
/// does not measure; Riverbank measures it, so the margin left is for error.
pub const PEAK_CPU: f64 = 0.90;
/// Riverbank: how long a scale-down is expected to pay off, to weigh against its pause.
pub const SCALE_DOWN_HORIZON_SECS: f64 = 300.0;
/// Riverbank reads arrivals (trend and bursts) over this long, across rescales.
pub const ARRIVAL_LOOKBACK_SECS: f64 = 600.0;
/// Observations a caller should keep: the longest window any rule reads.
pub const HISTORY_SECS: f64 = ARRIVAL_LOOKBACK_SECS;
/// Insight thresholds (seed 004): at max with CPU above 80 %, or (streaming) above 50 % with an
/// estimated processing time over 2 minutes.
pub const MAX_INSIGHT_CPU: f64 = 0.80;
pub const MAX_INSIGHT_STREAMING_CPU: f64 = 0.50;
pub const MAX_INSIGHT_BACKLOG_SECS: f64 = 120.0;

/// Which rules decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Keep `numWorkers` (what `autoscalingAlgorithm: NONE` does).
    Fixed,
    /// Dataflow's documented rules, as written.
    Documented,
    /// The documented rules plus Riverbank's: scale-ups sized for the join, scale-downs sized on
    /// measured peaks and held during a ramp up, the active-keys check, the pause-cost check.
    Riverbank,
}

impl Policy {
    pub const ALL: [Policy; 3] = [Policy::Fixed, Policy::Documented, Policy::Riverbank];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Fixed => "fixed",
            Policy::Documented => "documented",
            Policy::Riverbank => "riverbank",
        }
    }
}

/// The options the engine reads, resolved with Dataflow's defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineConfig {
    pub policy: Policy,
    pub streaming: bool,
    /// Fixed size, and the starting size of an autoscaled job.
    pub num_workers: u32,
    pub max_workers: u32,
    /// Decide and report, but never resize (`experiments: [autoscaling_dry_run]`).
    pub dry_run: bool,
    /// Expected seconds from asking for a worker to its first work item (Riverbank's
    /// pause-cost rule; the operator measures it, the simulator knows it).
    pub startup_secs: f64,
    /// Expected seconds a rescale stops processing while work and disks move.
    pub pause_secs: f64,
}

impl EngineConfig {
    /// `autoscalingAlgorithm: NONE` forces the fixed policy whatever was asked.
    pub fn from_options(options: &PipelineOptions, policy: Policy) -> EngineConfig {
        let policy = match options.autoscaling_algorithm {
            Some(AutoscalingAlgorithm::None) => Policy::Fixed,
            _ => policy,
        };
        EngineConfig {
            policy,
            streaming: options.streaming,
            num_workers: options.effective_num_workers().max(1),
            max_workers: options.effective_max_workers().max(1),
            dry_run: options.has_experiment("autoscaling_dry_run"),
            startup_secs: 60.0,
            pause_secs: 10.0,
        }
    }

    pub fn sizes(&self) -> WorkerSizes {
        WorkerSizes::new(self.max_workers, self.streaming)
    }

    /// The size a job starts with: `numWorkers`, made usable for its disks when autoscaled.
    pub fn initial_workers(&self) -> u32 {
        match self.policy {
            Policy::Fixed => self.num_workers,
            _ => self.sizes().at_least(self.num_workers),
        }
    }

    pub fn evaluation_interval_secs(&self) -> f64 {
        if self.streaming {
            STREAMING_INTERVAL_SECS
        } else {
            BATCH_INTERVAL_SECS
        }
    }
}

/// Why the engine chose its target. The codes are stable (Events, JSON); the message has numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Reason {
    AutoscalingOff,
    NoMetrics,
    NotDue,
    RescaleInProgress,
    /// Not yet a full window at the current size.
    Settling,
    ScaleUpBacklog,
    ScaleDownIdle,
    /// Batch: sized from the remaining work (up or down).
    ScaleToRemainingWork,
    Steady,
    HoldHighCpu,
    HoldLowCpu,
    HoldDiskDistribution,
    HoldAtMinimum,
    HoldAtMaximum,
    HoldNoThroughput,
    HoldParallelismCapped,
    HoldShuffleData,
    HoldActiveKeys,
    HoldPauseCost,
    HoldScaleDownDelay,
}

/// Dataflow Insights (seed 004). The engine raises the first two; the others come from the
/// job's progress and its pods ([`crate::insights`]). Ordered by how much they need a person:
/// a job that does not progress first, hints last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Insight {
    /// A work item keeps failing and being retried.
    Stuck,
    /// Worker pods were killed for running out of memory.
    WorkerOutOfMemory,
    /// A work item runs far longer than the stage's typical item.
    LongWorkItem,
    /// One key carries so much of a stage's input that the stage cannot go faster.
    HotKey,
    /// At `maxNumWorkers` with high CPU: raising the maximum could help.
    MaxNumWorkers,
    /// Fewer active keys than cores: more workers would idle.
    ActiveKeys,
    /// A transform emits far more elements than it receives and is fused with what follows.
    HighFanOut,
}

impl Insight {
    pub const ALL: [Insight; 7] = [
        Insight::Stuck,
        Insight::WorkerOutOfMemory,
        Insight::LongWorkItem,
        Insight::HotKey,
        Insight::MaxNumWorkers,
        Insight::ActiveKeys,
        Insight::HighFanOut,
    ];

    /// Dataflow's name (`MAX_NUM_WORKERS`): Events' reason, status.insights[].type.
    pub fn code(self) -> &'static str {
        match self {
            Insight::Stuck => "STUCK",
            Insight::WorkerOutOfMemory => "WORKER_OUT_OF_MEMORY",
            Insight::LongWorkItem => "LONG_WORK_ITEM",
            Insight::HotKey => "HOT_KEY",
            Insight::MaxNumWorkers => "MAX_NUM_WORKERS",
            Insight::ActiveKeys => "ACTIVE_KEYS",
            Insight::HighFanOut => "HIGH_FAN_OUT",
        }
    }

    pub fn from_code(code: &str) -> Option<Insight> {
        Insight::ALL.into_iter().find(|i| i.code() == code)
    }

    /// The insight's message as Dataflow shows it (seed 004).
    pub fn title(self) -> &'static str {
        match self {
            Insight::Stuck => "Job is stuck due to failed and retried work item",
            Insight::WorkerOutOfMemory => "Some workers are out of memory",
            Insight::LongWorkItem => "Stage spending too long on work",
            Insight::HotKey => "Hot key detected",
            Insight::MaxNumWorkers => "The maximum number of workers could be increased",
            Insight::ActiveKeys => "Active keys can be increased",
            Insight::HighFanOut => "High fan-out detected",
        }
    }
}

/// What happens to shuffle data and state on the disks of workers that leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ShuffleHandling {
    /// Streaming: the disks are re-attached to the remaining workers (they are fixed at
    /// `maxNumWorkers` and spread evenly); nothing is recomputed.
    DisksMove,
    /// Batch: no later stage needs the departing workers' shuffle data; they leave now.
    NoLiveData,
    /// Batch: a later stage still reads shuffle data on the workers' disks, so the scale-down
    /// waits until it has been consumed. Riverbank never recomputes shuffle output to shrink.
    WaitForConsumers,
}

/// One decision, with everything an Event or a timeline row needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub at_secs: f64,
    pub current_workers: u32,
    pub target_workers: u32,
    pub reason: Reason,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insight: Option<Insight>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shuffle: Option<ShuffleHandling>,
    /// Recorded only: the caller keeps `current_workers`.
    pub dry_run: bool,
}

impl Decision {
    pub fn is_rescale(&self) -> bool {
        self.target_workers != self.current_workers
    }

    /// The size the caller should set: the target, unless this is a dry run.
    pub fn workers_to_apply(&self) -> u32 {
        if self.dry_run {
            self.current_workers
        } else {
            self.target_workers
        }
    }
}

/// A rescale asked for and not yet seen in the observations.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingRescale {
    pub target: u32,
    pub since_secs: f64,
}

/// The little the engine remembers between calls. Serializable so the operator can keep it
/// across restarts; `Default` for a new job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineState {
    pub last_eval_secs: Option<f64>,
    pub rescale: Option<PendingRescale>,
}

/// What a rule set proposes, before the engine stamps it into a [`Decision`].
#[derive(Debug, Clone)]
pub(crate) struct Proposal {
    pub target: u32,
    pub reason: Reason,
    pub message: String,
    pub insight: Option<Insight>,
    pub shuffle: Option<ShuffleHandling>,
}

impl Proposal {
    pub fn new(target: u32, reason: Reason, message: String) -> Proposal {
        Proposal {
            target,
            reason,
            message,
            insight: None,
            shuffle: None,
        }
    }

    pub fn hold(current: u32, reason: Reason, message: String) -> Proposal {
        Proposal::new(current, reason, message)
    }

    pub fn with_insight(mut self, insight: Insight) -> Proposal {
        self.insight = Some(insight);
        self
    }

    pub fn with_shuffle(mut self, shuffle: ShuffleHandling) -> Proposal {
        self.shuffle = Some(shuffle);
        self
    }
}

/// The engine: its configuration and the rules. Cheap to build; holds no per-job state.
#[derive(Debug, Clone)]
pub struct Engine {
    config: EngineConfig,
}

impl Engine {
    pub fn new(config: EngineConfig) -> Engine {
        Engine { config }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Decides from `window` (oldest first; the caller keeps [`HISTORY_SECS`] of it). Updates
    /// `state` as if the decision is carried out (unless it is a dry run).
    pub fn decide(&self, state: &mut EngineState, window: &[Observation]) -> Decision {
        let cfg = &self.config;
        let Some(latest) = window.last() else {
            let current = state.rescale.map_or(cfg.initial_workers(), |r| r.target);
            return self.stamp(
                0.0,
                current,
                Proposal::hold(current, Reason::NoMetrics, "no metrics yet".into()),
            );
        };
        let (now, current) = (latest.at_secs, latest.workers);
        let proposal = self.propose(state, window, now, current);
        let decision = self.stamp(now, current, proposal);
        if decision.is_rescale() && !cfg.dry_run && cfg.policy != Policy::Fixed {
            state.rescale = Some(PendingRescale {
                target: decision.target_workers,
                since_secs: now,
            });
        }
        decision
    }

    fn propose(
        &self,
        state: &mut EngineState,
        window: &[Observation],
        now: f64,
        current: u32,
    ) -> Proposal {
        let cfg = &self.config;
        if cfg.policy == Policy::Fixed {
            return Proposal::new(
                cfg.num_workers,
                Reason::AutoscalingOff,
                format!("autoscaling is off: numWorkers {}", cfg.num_workers),
            );
        }
        let interval = cfg.evaluation_interval_secs();
        if let Some(last) = state.last_eval_secs
            && now - last < interval - 1e-6
        {
            return Proposal::hold(
                current,
                Reason::NotDue,
                format!("evaluated {:.0} s ago; every {interval:.0} s", now - last),
            );
        }
        state.last_eval_secs = Some(now);
        if let Some(p) = state.rescale {
            if current == p.target || now - p.since_secs >= RESCALE_TIMEOUT_SECS {
                state.rescale = None;
            } else {
                return Proposal::hold(
                    current,
                    Reason::RescaleInProgress,
                    format!(
                        "waiting for {} workers (asked {:.0} s ago), {current} running",
                        p.target,
                        now - p.since_secs
                    ),
                );
            }
        }
        let span = if cfg.streaming {
            STREAMING_WINDOW_SECS
        } else {
            BATCH_INTERVAL_SECS
        };
        let run = window::settled(window, span);
        let covered = window::coverage(run);
        let lookback = window::lookback(window, ARRIVAL_LOOKBACK_SECS);
        let Some(stats) = window::stats(run, lookback).filter(|_| covered >= span - 1e-6) else {
            return Proposal::hold(
                current,
                Reason::Settling,
                format!("{covered:.0} s of metrics at {current} workers; need {span:.0} s"),
            );
        };
        let proposal = if cfg.streaming {
            streaming::propose(cfg, &stats)
        } else {
            batch::propose(cfg, &stats)
        };
        match self.max_insight(&stats) {
            Some(i) if proposal.insight.is_none() => proposal.with_insight(i),
            _ => proposal,
        }
    }

    /// MAX_NUM_WORKERS (seed 004): at the maximum and busy.
    fn max_insight(&self, s: &window::WindowStats) -> Option<Insight> {
        let busy = s.mean_cpu > MAX_INSIGHT_CPU
            || (self.config.streaming
                && s.mean_cpu > MAX_INSIGHT_STREAMING_CPU
                && s.backlog_secs > MAX_INSIGHT_BACKLOG_SECS);
        (s.workers >= self.config.max_workers && busy).then_some(Insight::MaxNumWorkers)
    }

    fn stamp(&self, now: f64, current: u32, p: Proposal) -> Decision {
        Decision {
            at_secs: now,
            current_workers: current,
            target_workers: p.target,
            reason: p.reason,
            message: p.message,
            insight: p.insight,
            shuffle: p.shuffle,
            dry_run: self.config.dry_run,
        }
    }
}

/// `ceil(x)` as a worker count, saturating (x may be huge or infinite). A hair of tolerance so
/// that 10 × 0.45 / 0.75 is 6 workers, not 7.
pub(crate) fn ceil_workers(x: f64) -> u32 {
    if x.is_nan() || x <= 0.0 {
        0
    } else {
        (x - 1e-9).ceil().min(f64::from(u32::MAX)) as u32
    }
}

/// CPU as a percentage for messages.
pub(crate) fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

#[cfg(test)]
mod tests;
