//! Live counters of a run, read by the CLI's progress display (and, later, exported).
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Debug, Default)]
pub struct StageMetrics {
    pub bundles: AtomicU64,
    pub bundle_retries: AtomicU64,
    /// 0 pending, 1 running, 2 done.
    pub state: AtomicU64,
}

#[derive(Debug, Default)]
pub struct Metrics {
    pub rows_read: AtomicU64,
    pub bytes_read: AtomicU64,
    pub splits_total: AtomicU64,
    pub splits_done: AtomicU64,
    pub estimated_input_bytes: AtomicU64,
    /// Elements out of each transform (index as in the plan's graph), committed per bundle.
    pub elements_out: Vec<AtomicU64>,
    pub stages: Vec<StageMetrics>,
    pub spills: AtomicU64,
}

impl Metrics {
    pub fn new(transforms: usize, stages: usize) -> Self {
        Metrics {
            elements_out: (0..transforms).map(|_| AtomicU64::new(0)).collect(),
            stages: (0..stages).map(|_| StageMetrics::default()).collect(),
            ..Default::default()
        }
    }
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Relaxed)
    }
}
