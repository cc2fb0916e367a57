//! How a run is configured (`RunConfig`, the test knobs `BundleChaos`) and what it reports
//! (`RunSummary`): shared by the in-process run, the coordinator and the workers.
use std::path::PathBuf;
use std::time::Duration;

/// Shuffle partitions when the job does not say.
pub const DEFAULT_SHUFFLE_PARTITIONS: u32 = 8;

/// Batch: neighbouring shuffle partitions run as one work item while their shuffled bytes
/// together stay within this (MiB), unless the job says otherwise. Below a few MiB an item's
/// fixed costs (its lease and report, opening each producer's stream) outweigh its work.
pub const DEFAULT_COALESCE_PARTITIONS_MB: u64 = 4;

/// How a run is carried out.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Work slots: work items run at once in this process (normally the number of cores).
    /// The one name for what the CLI calls `--slots` and Dataflow `numberOfWorkerHarnessThreads`.
    pub slots: usize,
    /// Partitions of every shuffle (Combine, Reshuffle). Part of the job, not of the machine:
    /// results are byte-identical for any number of workers only at the same value.
    pub shuffle_partitions: u32,
    /// Batch: neighbouring shuffle partitions whose shuffled bytes together stay within this
    /// run as one item, once their sizes are known (0: never). The output does not change.
    pub coalesce_bytes: u64,
    pub batch_size: usize,
    /// Memory for each combine/SQL operator before it spills to disk.
    pub memory_limit: usize,
    pub spill_dir: PathBuf,
    /// Names this run's temporary files.
    pub job_token: String,
    pub max_attempts: u32,
    pub chaos: BundleChaos,
}

/// Testing knobs on every bundle; all zero in real runs. A coordinator hands them to its
/// workers with the job, so a test sets them once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BundleChaos {
    /// Fail the first N attempts of every bundle, as a flaky worker would.
    pub inject_failures: u32,
    /// Sleep this long after every bundle (so a test can kill a worker mid-stage).
    pub delay_ms: u64,
    /// Keep a core busy this long after every bundle, as a CPU-bound transform would (the
    /// autoscaler does not add workers to a job whose CPU is idle).
    pub busy_ms: u64,
    /// And this long per row of the bundle: CPU that follows the load, as a real transform's
    /// does (a load step then moves the workers' CPU).
    #[serde(default)]
    pub busy_us_per_row: u64,
}

impl BundleChaos {
    /// Whether attempt `attempt` (from 1) of a bundle is to fail.
    pub fn fails(&self, attempt: u32) -> bool {
        attempt <= self.inject_failures
    }

    /// The delay and the busy time after a bundle of `rows`.
    pub async fn after_bundle(&self, rows: usize) {
        if self.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.delay_ms)).await;
        }
        let busy = Duration::from_millis(self.busy_ms)
            + Duration::from_micros(self.busy_us_per_row.saturating_mul(rows as u64));
        if !busy.is_zero() {
            // On the blocking pool, so the worker's heartbeats keep going.
            let _ = tokio::task::spawn_blocking(move || {
                let start = std::time::Instant::now();
                while start.elapsed() < busy {
                    std::hint::spin_loop();
                }
            })
            .await;
        }
    }
}

impl RunConfig {
    pub fn local(spill_dir: PathBuf) -> Self {
        let slots = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        RunConfig {
            slots,
            batch_size: 65_536,
            memory_limit: 512 << 20,
            spill_dir,
            job_token: new_token(),
            max_attempts: 4,
            chaos: BundleChaos::default(),
            shuffle_partitions: DEFAULT_SHUFFLE_PARTITIONS,
            coalesce_bytes: DEFAULT_COALESCE_PARTITIONS_MB << 20,
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
