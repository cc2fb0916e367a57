//! How many workers a job should have: the one place the decision is made, recorded in
//! status.targetWorkers and applied as the worker StatefulSet's replicas
//! (`children::worker_replicas`).
//!
//! For now this is Dataflow's starting point held fixed: numWorkers (default 3), within
//! [minimum, maxNumWorkers]. The throughput-based autoscaler (issue 5, `riverbank-autoscale`)
//! replaces the body of [`target_workers`] with its decision from the coordinator's progress.
use crate::crd::DataflowJob;

/// The number of workers `job` should run with while it is active.
pub fn target_workers(job: &DataflowJob) -> i32 {
    let o = &job.spec.options;
    let max = o.max_workers();
    o.initial_workers().clamp(o.min_workers().min(max), max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{AutoscalingAlgorithm, DataflowJobSpec, JobOptions};

    fn job(options: JobOptions) -> DataflowJob {
        DataflowJob::new(
            "j",
            DataflowJobSpec {
                pipeline: Default::default(),
                options,
                desired_state: Default::default(),
                worker: None,
            },
        )
    }

    #[test]
    fn num_workers_within_bounds() {
        assert_eq!(target_workers(&job(JobOptions::default())), 3);
        let o = JobOptions {
            max_num_workers: Some(2),
            ..Default::default()
        };
        assert_eq!(
            target_workers(&job(o)),
            2,
            "default 3 never above the maximum"
        );
        let o = JobOptions {
            num_workers: Some(7),
            autoscaling_algorithm: Some(AutoscalingAlgorithm::None),
            ..Default::default()
        };
        assert_eq!(target_workers(&job(o)), 7);
        // Streaming jobs never go below ceil(maxNumWorkers / 15): 100 → 7.
        let o = JobOptions {
            streaming: Some(true),
            num_workers: Some(1),
            ..Default::default()
        };
        assert_eq!(target_workers(&job(o)), 7);
    }
}
