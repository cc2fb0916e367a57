//! One observation of a running job: what the engine reads. The operator builds it from the
//! coordinator's [`JobProgress`]; the simulator from its worker model.
use riverbank_pipeline::{JobPhase, JobProgress};
use serde::{Deserialize, Serialize};

/// Metrics of one polling interval. Rates and CPU are averages over the `interval_secs` ending at
/// `at_secs`; byte counts are readings at `at_secs`. Time is the caller's (any monotonic origin).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Observation {
    pub at_secs: f64,
    /// The period the rates and CPU average over.
    pub interval_secs: f64,
    /// Workers processing work (joined and not draining).
    pub workers: u32,
    pub cores_per_worker: u32,
    /// Bytes still to process: the sources' backlog in streaming; the estimated remaining work
    /// of the running and pending stages in batch.
    pub backlog_bytes: f64,
    /// Bytes processed per second by the whole job.
    pub throughput_bytes_per_sec: f64,
    /// Average CPU of the workers, as a fraction of their cores (0 to 1).
    pub avg_cpu: f64,
    /// Fraction of the job's estimated work done (batch), 0 to 1.
    pub fraction_consumed: f64,
    /// Work items a new worker could be given now (batch): queued ones, and running source
    /// items it could split off half of. Fewer than the workers caps parallelism.
    pub runnable_items: Option<u64>,
    /// Distinct keys with pending work, when known. A key runs on one core at a time.
    pub active_keys: Option<u64>,
    /// Nothing a new worker could be given: no queued item and no running one to split
    /// (unsplittable input, fixed shard counts, fewer items than workers).
    pub parallelism_capped: bool,
    /// Shuffle data on the workers' disks is still needed by a later stage (batch).
    pub shuffle_data_live: bool,
}

impl Observation {
    /// Builds an observation from the coordinator's status at `at_secs` (the operator's clock).
    /// Draining and dead workers are not counted: they no longer take work.
    pub fn from_progress(p: &JobProgress, at_secs: f64, cores_per_worker: u32) -> Observation {
        let live: Vec<_> = p
            .workers
            .iter()
            .filter(|w| w.alive && !w.draining)
            .collect();
        let avg_cpu = if live.is_empty() {
            0.0
        } else {
            live.iter().map(|w| w.cpu.clamp(0.0, 1.0)).sum::<f64>() / live.len() as f64
        };
        let other_stage_wrote = |i: usize| p.stages.iter().any(|s| s.index != i && s.bytes_out > 0);
        let shuffle_data_live = p
            .stages
            .iter()
            .any(|s| s.state != "Done" && other_stage_wrote(s.index));
        Observation {
            at_secs,
            // The coordinator averages its rates over 30 s.
            interval_secs: 30.0,
            workers: live.len() as u32,
            cores_per_worker: cores_per_worker.max(1),
            backlog_bytes: p.remaining_bytes as f64,
            throughput_bytes_per_sec: p.throughput_bytes_per_sec.max(0.0),
            avg_cpu,
            fraction_consumed: p.fraction_consumed,
            // What a new worker could be given now: a queued item, or half of a running one.
            runnable_items: Some(p.runnable_items + p.splittable_items),
            active_keys: p.active_keys,
            parallelism_capped: p.phase == JobPhase::Running
                && p.runnable_items + p.splittable_items == 0
                && p.work_items_running > 0,
            shuffle_data_live,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riverbank_pipeline::{JobPhase, StageProgress, WorkerProgress};

    fn worker(name: &str, cpu: f64, alive: bool, draining: bool) -> WorkerProgress {
        WorkerProgress {
            name: name.into(),
            alive,
            cpu,
            draining,
            ..Default::default()
        }
    }

    #[test]
    fn counts_live_workers_and_averages_their_cpu() {
        let p = JobProgress {
            streaming: None,
            job_name: "j".into(),
            phase: JobPhase::Running,
            message: String::new(),
            failure: None,
            started_at: None,
            finished_at: None,
            work_items_total: 10,
            work_items_done: 4,
            work_items_running: 2,
            fraction_consumed: 0.4,
            remaining_bytes: 6000,
            throughput_bytes_per_sec: 100.0,
            throughput_elements_per_sec: 1.0,
            backlog_seconds: Some(60.0),
            active_keys: Some(7),
            runnable_items: 3,
            splittable_items: 1,
            workers: vec![
                worker("a", 0.5, true, false),
                worker("b", 0.9, true, false),
                worker("c", 1.0, true, true),
                worker("d", 1.0, false, false),
            ],
            stages: vec![
                StageProgress {
                    index: 0,
                    state: "Done".into(),
                    bytes_out: 10,
                    ..Default::default()
                },
                StageProgress {
                    index: 1,
                    state: "Running".into(),
                    ..Default::default()
                },
            ],
            work_items: vec![],
        };
        let o = Observation::from_progress(&p, 42.0, 4);
        assert_eq!(o.workers, 2);
        assert!((o.avg_cpu - 0.7).abs() < 1e-9);
        assert_eq!(o.backlog_bytes, 6000.0);
        assert_eq!(o.active_keys, Some(7));
        assert_eq!(o.runnable_items, Some(4), "3 queued, 1 to split");
        assert!(!o.parallelism_capped);
        let capped = Observation::from_progress(
            &JobProgress {
                runnable_items: 0,
                splittable_items: 0,
                ..p.clone()
            },
            42.0,
            4,
        );
        assert!(
            capped.parallelism_capped,
            "two running items, nothing more to hand out"
        );
        assert!(
            o.shuffle_data_live,
            "stage 1 still reads what stage 0 wrote"
        );
        let mut done = p.clone();
        done.stages[1].state = "Done".into();
        assert!(!Observation::from_progress(&done, 42.0, 4).shuffle_data_live);
    }
}
