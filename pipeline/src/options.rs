//! Dataflow pipeline options, under their Java names (seed 002), as they make sense here.
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AutoscalingAlgorithm {
    #[default]
    ThroughputBased,
    None,
}

/// `spec.options` of a DataflowJob, or `options:` of a Beam YAML file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PipelineOptions {
    #[serde(default)]
    pub streaming: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_workers: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_workers: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling_algorithm: Option<AutoscalingAlgorithm>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number_of_worker_harness_threads: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_size_gb: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_disk_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temp_location: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub experiments: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ram: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_count: Option<u32>,
    /// Streaming: seconds between consistent checkpoints (Riverbank's; Flink's
    /// `execution.checkpointing.interval`). Output is committed at each checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_interval_sec: Option<f64>,
    /// Options Riverbank does not interpret (Beam YAML's own, e.g. `yaml_experimental_features`).
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

impl PipelineOptions {
    /// Dataflow's default: 1000 workers in batch, 100 in streaming (seed 000).
    pub fn effective_max_workers(&self) -> u32 {
        self.max_num_workers
            .unwrap_or(if self.streaming { 100 } else { 1000 })
    }

    /// Dataflow's default: 3 workers when autoscaling is off.
    pub fn effective_num_workers(&self) -> u32 {
        self.num_workers.unwrap_or(3)
    }

    /// Seconds between streaming checkpoints (default 10, as the Dataflow-like default).
    pub fn effective_checkpoint_interval(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(
            self.checkpoint_interval_sec
                .filter(|s| s.is_finite() && *s > 0.0)
                .unwrap_or(10.0),
        )
    }

    /// Streaming: how many of the last checkpoints keep their files (log entries and state
    /// checkpoints) in the checkpoint directory: `options.checkpointsRetained` (Riverbank's),
    /// default 20; 0 keeps every one. Named snapshots are copies, never collected.
    pub fn checkpoints_retained(&self) -> u64 {
        self.other
            .get("checkpointsRetained")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(20)
    }

    pub fn has_experiment(&self, name: &str) -> bool {
        self.experiments.iter().any(|e| e == name)
    }
}
