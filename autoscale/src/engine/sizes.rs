//! Which worker counts a job may run with.
//!
//! Streaming jobs keep their persistent disks (the worker StatefulSet's volume claims) fixed at
//! `maxNumWorkers` and spread them evenly over the workers (seed 000, "Persistent disk
//! resources"): a count is usable only when it divides the disks, and no worker may hold more
//! than 15, so the minimum is ceil(max / 15). A rescale moves disks between workers; it never
//! loses the state on them. Batch jobs use any count from 1 to `maxNumWorkers`.
use serde::{Deserialize, Serialize};

/// Dataflow's limit of persistent disks per streaming worker.
pub const MAX_DISKS_PER_WORKER: u32 = 15;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerSizes {
    max: u32,
    /// Disks spread evenly over the workers (streaming); any count otherwise.
    disks: bool,
}

impl WorkerSizes {
    pub fn new(max_workers: u32, streaming: bool) -> WorkerSizes {
        WorkerSizes {
            max: max_workers.max(1),
            disks: streaming,
        }
    }

    pub fn max(&self) -> u32 {
        self.max
    }

    pub fn min(&self) -> u32 {
        if self.disks {
            self.max.div_ceil(MAX_DISKS_PER_WORKER)
        } else {
            1
        }
    }

    /// Whether every worker gets the same number of disks with `n` workers.
    pub fn allows(&self, n: u32) -> bool {
        n >= self.min() && n <= self.max && (!self.disks || self.max.is_multiple_of(n))
    }

    /// The smallest usable count of at least `n` (the max when `n` exceeds it).
    pub fn at_least(&self, n: u32) -> u32 {
        (n.max(self.min())..=self.max)
            .find(|&c| self.allows(c))
            .unwrap_or(self.max)
    }

    /// Disks each worker holds with `n` workers (streaming).
    pub fn disks_per_worker(&self, n: u32) -> u32 {
        self.max / n.max(1)
    }

    /// Every usable count, ascending.
    pub fn all(&self) -> Vec<u32> {
        (self.min()..=self.max)
            .filter(|&c| self.allows(c))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_counts_divide_the_disks_and_respect_the_minimum() {
        let cases: &[(u32, u32, &[u32])] = &[
            (100, 7, &[10, 20, 25, 50, 100]),
            (15, 1, &[1, 3, 5, 15]),
            (60, 4, &[4, 5, 6, 10, 12, 15, 20, 30, 60]),
            (16, 2, &[2, 4, 8, 16]),
            (7, 1, &[1, 7]),
        ];
        for &(max, min, all) in cases {
            let s = WorkerSizes::new(max, true);
            assert_eq!(s.min(), min, "min for max {max}");
            assert_eq!(s.all(), all, "counts for max {max}");
        }
    }

    #[test]
    fn at_least_rounds_up_to_a_usable_count() {
        let s = WorkerSizes::new(100, true);
        assert_eq!(s.at_least(75), 100);
        assert_eq!(s.at_least(40), 50);
        assert_eq!(s.at_least(1), 10);
        assert_eq!(s.at_least(500), 100);
        assert_eq!(s.disks_per_worker(50), 2);
        let b = WorkerSizes::new(1000, false);
        assert_eq!((b.min(), b.at_least(37), b.at_least(0)), (1, 37, 1));
    }
}
