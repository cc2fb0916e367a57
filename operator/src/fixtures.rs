//! Test fixtures shared by the unit tests: one `DataflowJob` builder and one `JobProgress`, so
//! each test states only what it is about.
use crate::crd::{DataflowJob, DataflowJobSpec, DataflowJobStatus, JobOptions};
use crate::reconcile::FINALIZER;
use riverbank_pipeline::progress::{JobPhase, JobProgress};
use serde_json::{Value, json};

/// The coordinator's report of a small job: 1 of 4 work items done, 2 running, a quarter of the
/// input read at 100 B/s (40 elements/s), 30 s of backlog, 2 items ready to run, no workers.
/// Tests change what they are about with struct update syntax.
pub fn progress(phase: JobPhase) -> JobProgress {
    JobProgress {
        streaming: None,
        job_name: "test".into(),
        phase,
        message: "1 of 1 stages running".into(),
        failure: None,
        started_at: Some("2025-03-01T10:00:00Z".into()),
        finished_at: None,
        work_items_total: 4,
        work_items_done: 1,
        work_items_running: 2,
        fraction_consumed: 0.25,
        remaining_bytes: 3000,
        throughput_bytes_per_sec: 100.0,
        throughput_elements_per_sec: 40.0,
        backlog_seconds: Some(30.0),
        active_keys: None,
        runnable_items: 2,
        splittable_items: 0,
        workers: vec![],
        stages: vec![],
        work_items: vec![],
    }
}

/// A `DataflowJob` as the API server returns it: namespace `default`, a uid, generation 1, an
/// empty pipeline and no options unless set.
pub struct JobBuilder(DataflowJob);

impl JobBuilder {
    pub fn new(name: &str) -> Self {
        let mut job = DataflowJob::new(
            name,
            DataflowJobSpec {
                pipeline: Default::default(),
                beam_pipeline: None,
                options: Default::default(),
                desired_state: Default::default(),
                pods: None,
                worker: None,
                snapshot: None,
                from_snapshot: None,
                transform_name_mapping: Default::default(),
            },
        );
        job.metadata.namespace = Some("default".into());
        job.metadata.uid = Some(format!("6f1c6a52-0000-4000-8000-{name:0>12}"));
        job.metadata.generation = Some(1);
        JobBuilder(job)
    }

    /// The small valid pipeline of the reconciler's tests: Create → WriteToJson.
    pub fn numbers(self) -> Self {
        self.pipeline(json!({"transforms": [
            {"type": "Create", "name": "Numbers", "config": {"elements": [{"n": 1}, {"n": 2}]}},
            {"type": "WriteToJson", "name": "Out", "input": "Numbers", "config": {"path": "/data/out.jsonl"}}
        ]}))
    }

    pub fn pipeline(mut self, pipeline: Value) -> Self {
        self.0.spec.pipeline = Some(pipeline.as_object().expect("a mapping").clone());
        self
    }

    /// A Beam SDK pipeline's job, as the job service creates it.
    pub fn beam_sdk(mut self) -> Self {
        self.0.spec.pipeline = None;
        self.0.spec.beam_pipeline = Some(crate::crd::BeamPipelineSpec {
            location: "s3://bucket/beam/wordcount-1/".into(),
            sdk_container_image: "example.com/beam-python-sdk:2.77.0".into(),
            sdk_container_args: None,
            sdk_worker_parallelism: Some(2),
        });
        self
    }

    pub fn options(mut self, options: JobOptions) -> Self {
        self.0.spec.options = options;
        self
    }

    pub fn namespace(mut self, namespace: &str) -> Self {
        self.0.metadata.namespace = Some(namespace.into());
        self
    }

    pub fn status(mut self, status: Option<DataflowJobStatus>) -> Self {
        self.0.status = status;
        self
    }

    /// With the operator's finalizer, as every job has after its first reconcile.
    pub fn finalized(mut self) -> Self {
        self.0.metadata.finalizers = Some(vec![FINALIZER.into()]);
        self
    }

    pub fn build(self) -> DataflowJob {
        self.0
    }
}
