//! How a run is configured and what it reports. `run` executes a plan on this machine through
//! the work-item engine (`crate::engine`): the same items, shuffles and commits as a
//! distributed run, with the coordinator and `partitions` workers in this process.
use crate::compile::CompiledPlan;
use crate::error::RunError;
use crate::metrics::Metrics;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Shuffle partitions when the job does not say.
pub const DEFAULT_SHUFFLE_PARTITIONS: u32 = 8;

/// How a run is carried out.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Work items run at once in this process (normally the number of cores).
    pub partitions: usize,
    /// Partitions of every shuffle (Combine, Reshuffle). Part of the job, not of the machine:
    /// results are byte-identical for any number of workers only at the same value.
    pub shuffle_partitions: u32,
    pub batch_size: usize,
    /// Memory for each combine/SQL operator before it spills to disk.
    pub memory_limit: usize,
    pub spill_dir: PathBuf,
    /// Names this run's temporary files.
    pub job_token: String,
    pub max_attempts: u32,
    /// Chaos testing: fail the first N attempts of every bundle, as a flaky worker would.
    pub inject_bundle_failures: u32,
    /// Chaos testing: sleep this long after every bundle (so a test can kill a worker mid-stage).
    pub bundle_delay_ms: u64,
    /// Testing: keep a core busy this long after every bundle, as a CPU-bound transform would
    /// (the autoscaler does not add workers to a job whose CPU is idle).
    pub bundle_busy_ms: u64,
}

impl RunConfig {
    pub fn local(spill_dir: PathBuf) -> Self {
        let partitions = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        RunConfig {
            partitions,
            batch_size: 65_536,
            memory_limit: 512 << 20,
            spill_dir,
            job_token: new_token(),
            max_attempts: 4,
            inject_bundle_failures: 0,
            bundle_delay_ms: 0,
            bundle_busy_ms: 0,
            shuffle_partitions: DEFAULT_SHUFFLE_PARTITIONS,
        }
    }
}

pub fn new_token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}-{}", nanos, std::process::id())
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub wall: Duration,
    /// (transform name, elements out) in plan order.
    pub elements_out: Vec<(String, u64)>,
    /// (sink transform name, committed files).
    pub files: Vec<(String, Vec<String>)>,
}

/// Runs a compiled plan to completion on this machine and commits its sinks.
pub async fn run(
    plan: CompiledPlan,
    cfg: RunConfig,
    metrics: Arc<Metrics>,
) -> Result<RunSummary, RunError> {
    crate::engine::local::run(plan, cfg, metrics).await
}
