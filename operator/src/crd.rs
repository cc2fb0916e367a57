//! The `DataflowJob` custom resource (`riverbank.dev/v1alpha1`).
//!
//! Doc comments on these types become the CRD's `description`s, which `kubectl explain
//! dataflowjob.spec...` shows: they are written as the user's manual, not as notes to developers.
//! Validation that the API server can do cheaply (OpenAPI bounds and patterns, a few CEL rules)
//! lives here so that mistakes are rejected at `kubectl apply` time, not minutes later in a pod.
use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use riverbank_pipeline::display::{component_name, exchange_name};
use riverbank_pipeline::options::AutoscalingAlgorithm as PipelineAutoscaling;
use riverbank_pipeline::{Issue, PipelineError, PipelineOptions, Plan};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// API group of every Riverbank resource.
pub const GROUP: &str = "riverbank.dev";
/// The one served and stored version.
pub const VERSION: &str = "v1alpha1";

/// Child object names are `<job>-coordinator` etc., and a StatefulSet's pods carry a
/// `controller-revision-hash` label of `<statefulset>-<10 chars>` that must fit in 63
/// characters: 63 - 11 - len("-coordinator") leaves 40 for the job name.
pub const MAX_JOB_NAME_LEN: usize = 40;

/// The spec of a DataflowJob: a Beam YAML pipeline, the Dataflow pipeline options it runs with, the state you want it in, and how its pods look.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "riverbank.dev",
    version = "v1alpha1",
    kind = "DataflowJob",
    namespaced,
    shortname = "dfj",
    category = "riverbank",
    status = "DataflowJobStatus",
    derive = "PartialEq",
    doc = "A DataflowJob runs an Apache Beam YAML pipeline on this cluster the way Google Cloud Dataflow runs it: the operator validates the pipeline, plans it into fused stages, starts a coordinator and a StatefulSet of workers with one persistent disk each, scales the workers on backlog, and reports progress in status. The operator never changes spec; it owns only status and the objects it creates for the job.",
    validation = Rule::new("size(self.metadata.name) <= 40 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("metadata.name must be a DNS label of at most 40 characters starting with a letter (lowercase letters, digits and '-'): the job's Service and StatefulSets are named after it"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state", description = "The job's state, as Dataflow reports it"),
    printcolumn(name = "Workers", type_ = "integer", json_path = ".status.currentWorkers", description = "Workers running now: ready worker pods, or the workers the coordinator sees taking work if more"),
    printcolumn(name = "Target", type_ = "integer", json_path = ".status.targetWorkers", description = "Workers the autoscaler wants", priority = 1),
    printcolumn(name = "Backlog", type_ = "integer", json_path = ".status.backlogSeconds", description = "Estimated seconds to process the unread input at the current throughput"),
    printcolumn(name = "Watermark Lag", type_ = "integer", json_path = ".status.streaming.watermarkLagSeconds", description = "Streaming: seconds the output watermark is behind wall time (data freshness)"),
    printcolumn(name = "Progress", type_ = "number", json_path = ".status.progress", description = "Fraction of the input processed (batch)", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.desiredState != 'Drained' || (has(self.options) && has(self.options.streaming) && self.options.streaming)",
        "message": "desiredState Drained applies to streaming jobs only (options.streaming: true); stop a batch job with Cancelled"
    },
    {
        "rule": "(!has(self.snapshot) && !has(self.fromSnapshot)) || (has(self.options) && has(self.options.streaming) && self.options.streaming)",
        "message": "snapshot and fromSnapshot apply to streaming jobs only (options.streaming: true)"
    },
    {
        "rule": "has(self.fromSnapshot) == has(oldSelf.fromSnapshot) && (!has(self.fromSnapshot) || self.fromSnapshot == oldSelf.fromSnapshot)",
        "message": "fromSnapshot is where a job starts: it cannot change once the job exists (create a new DataflowJob)"
    },
    {
        "rule": "!has(self.options) || !has(self.options.serviceAccount) || ((!has(self.pods) || !has(self.pods.serviceAccountName) || self.options.serviceAccount == self.pods.serviceAccountName) && (!has(self.worker) || !has(self.worker.serviceAccountName) || self.options.serviceAccount == self.worker.serviceAccountName))",
        "message": "options.serviceAccount and pods.serviceAccountName name the same ServiceAccount: set one of them"
    },
    {
        "rule": "!has(self.pods) || !has(self.worker)",
        "message": "worker is the deprecated name of pods: set pods only"
    },
    {
        "rule": "(has(self.options) && has(self.options.diskSizeGb) ? self.options.diskSizeGb : 0) == (has(oldSelf.options) && has(oldSelf.options.diskSizeGb) ? oldSelf.options.diskSizeGb : 0) && (has(self.options) && has(self.options.workerDiskType) ? self.options.workerDiskType : '') == (has(oldSelf.options) && has(oldSelf.options.workerDiskType) ? oldSelf.options.workerDiskType : '')",
        "message": "options.diskSizeGb and options.workerDiskType cannot change once the job exists (its disks are provisioned): create a new DataflowJob"
    },
    {
        "rule": "(has(self.options) && has(self.options.streaming) && self.options.streaming) == (has(oldSelf.options) && has(oldSelf.options.streaming) && oldSelf.options.streaming)",
        "message": "options.streaming cannot change once the job exists: create a new DataflowJob"
    },
    {
        "rule": "has(self.pipeline) != has(self.beamPipeline)",
        "message": "set pipeline (a Beam YAML pipeline) or beamPipeline (a Beam SDK pipeline a job service submitted), exactly one of them"
    },
    {
        "rule": "!has(self.beamPipeline) || !(has(self.snapshot) || has(self.fromSnapshot) || has(self.transformNameMapping))",
        "message": "snapshot, fromSnapshot and transformNameMapping are for Beam YAML pipelines: a streaming Beam SDK pipeline keeps its state in checkpoints under its tempLocation and is updated with --update on the job server that runs it"
    },
    {
        "rule": "has(self.beamPipeline) == has(oldSelf.beamPipeline) && (!has(self.beamPipeline) || self.beamPipeline == oldSelf.beamPipeline || (has(self.options) && has(self.options.streaming) && self.options.streaming))",
        "message": "beamPipeline cannot change once the job exists (but by the job service's --update of a streaming job): submit the pipeline again"
    },
    {
        "rule": "!has(self.beamPipeline) || (has(self.options) && has(self.options.numWorkers) ? self.options.numWorkers : 0) == (has(oldSelf.options) && has(oldSelf.options.numWorkers) ? oldSelf.options.numWorkers : 0)",
        "message": "a Beam SDK job's options.numWorkers is fixed when it starts (its runner is given its SDK worker pods then)"
    }
]))]
pub struct DataflowJobSpec {
    /// The pipeline: the `pipeline:` mapping of a Beam YAML file, as you would pass it to `riverbank run` (`transforms:` and optionally `type: chain`, `source`, `sink`, `windowing`). It is validated and planned by the operator; problems are reported in status.conditions and status.message, naming the transform and field. Jinja templating is not applied here: render templates before applying the resource. Set this or beamPipeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "pipeline_schema")]
    pub pipeline: Option<Map<String, Value>>,

    /// A Beam SDK pipeline (Python, Java, Go) as Riverbank's job service submits it: `python pipeline.py --runner=PortableRunner --job_endpoint=<the chart's job service>` becomes a DataflowJob with this field. The job's runner pod reads the pipeline from object storage, plans it into fused stages and runs them, the user code in SDK harnesses of its SDK worker pods: options.numWorkers at the start (default 3; fixed once the job starts), then autoscaled between 1 and maxNumWorkers on the running stage's backlog as any batch job's workers are (autoscalingAlgorithm NONE keeps numWorkers). Batch only. Set this or pipeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beam_pipeline: Option<BeamPipelineSpec>,

    /// Dataflow pipeline options under their Java names (`--numWorkers` becomes `numWorkers`). Options that make no sense on Kubernetes (project, region, machine types) are not accepted.
    #[serde(default, skip_serializing_if = "JobOptions::is_empty")]
    pub options: JobOptions,

    /// The state you want the job in. `Running` (the default) runs it. `Drained` (streaming jobs only) stops reading input, finishes in-flight windows and results, then ends in state Drained. `Cancelled` stops the job now, without waiting for in-flight work; partial output of sinks that commit at the end is discarded. Drained and Cancelled are final: a job cannot be set back to Running (create a new job instead); a Drained job can still be Cancelled.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == oldSelf || oldSelf == 'Running' || (oldSelf == 'Drained' && self == 'Cancelled')",
        "message": "a Drained or Cancelled job cannot be resumed: create a new DataflowJob (a Drained job can still be Cancelled)"
    }]))]
    pub desired_state: DesiredState,

    /// Streaming: take a snapshot of the running job, named `snapshot.name`: its last completed checkpoint (source offsets and every keyed state), kept in tempLocation to start new jobs from (`fromSnapshot`). Set a new name to take another; status.snapshots lists those taken and where they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotSpec>,

    /// Streaming: start this job from a snapshot of another (Dataflow's createFromSnapshot), keeping its state and continuing from its source offsets. Transforms renamed since are mapped with transformNameMapping. Cannot change once the job exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<FromSnapshotSpec>,

    /// Streaming: transforms renamed by an update or since the snapshot a job starts from, old name to new (Dataflow's transformNameMapping). A state whose new name is "" is dropped. A changed spec.pipeline on a running streaming job is an update: the operator checks that the new pipeline can take the running job's state (Combines with the same keys and accumulators, sources with the same partitions, matched by name or by this mapping), refuses an incompatible one in status.conditions (type Updated) without stopping the job, and otherwise stops the job after a checkpoint, snapshots it and starts the new pipeline from that snapshot.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub transform_name_mapping: BTreeMap<String, String>,

    /// How the job's pods look, the coordinator's and the workers': image, pull settings, ServiceAccount, scheduling, labels, annotations, environment and credentials apply to both; resources apply to the worker pods only (the coordinator has its own small requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<PodsSpec>,

    /// Deprecated: the former name of `pods`, still read as `pods` while the API is v1alpha1. Set `pods` instead (not both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<PodsSpec>,
}

/// A Beam SDK pipeline in object storage.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BeamPipelineSpec {
    /// The folder holding the submitted pipeline as the job service wrote it: `pipeline.pb` (the Beam pipeline proto), `options.pb` (its pipeline options) and `artifacts/` (the files the SDK staged). The pods read it with the credentials of spec.pods.
    #[schemars(
        length(min = 1, max = 2048),
        regex(pattern = r"^((s3|gs|az|file)://.+|/.*)$")
    )]
    pub location: String,

    /// The SDK harness container's image: the pipeline's environment image (`--environment_config` of a DOCKER environment, Dataflow's sdk_container_image): Beam's SDK image, or one built on it with the pipeline's dependencies. It runs in each SDK worker pod as Beam's worker pool (`--worker_pool`, port 50000), and the runner starts its SDK harnesses there.
    #[schemars(length(min = 1, max = 1024))]
    pub sdk_container_image: String,

    /// Arguments of the SDK container. Default `--worker_pool`, what Beam's SDK images take to run as a worker pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sdk_container_args: Option<Vec<String>>,

    /// SDK harness processes the runner starts in each SDK worker pod (each runs bundles of the user's code). Default: the workers' cores (Dataflow's one per vCPU for Python); a pipeline's own `--sdk_worker_parallelism` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub sdk_worker_parallelism: Option<i32>,
}

/// A snapshot to take.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSpec {
    /// The snapshot's name, unique within the job: letters, digits, '-', '_' and '.'.
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")
    )]
    pub name: String,
}

/// Where a new streaming job starts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FromSnapshotSpec {
    /// The snapshot's location, as status.snapshots[].location of the job it was taken from shows it (under that job's tempLocation).
    #[schemars(
        length(min = 1, max = 2048),
        regex(pattern = r"^((s3|gs|az|file)://.+|/.*)$")
    )]
    pub location: String,
}

/// `spec.pipeline` is user data the operator parses itself: keep every field the user wrote
/// (no pruning) but require an object.
fn pipeline_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// `Option<enum>` fields: schemars lists `null` among the enum values; the field is already
/// `nullable`, and an enum value the API server must check against `type: string` is a risk.
fn no_null_in_enum(schema: &mut schemars::Schema) {
    if let Some(values) = schema.get_mut("enum").and_then(Value::as_array_mut) {
        values.retain(|v| !v.is_null());
    }
}

/// What the user wants the job to do.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DesiredState {
    /// Run the job (the default).
    #[default]
    Running,
    /// Streaming: stop reading, finish windows, then end.
    Drained,
    /// Stop now.
    Cancelled,
}

// Horizontal autoscaling mode, Dataflow's `autoscalingAlgorithm`. (Plain comments on enums used
// as `Option<_>`: kube's schema rewrite would put their doc in place of the field's.)
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AutoscalingAlgorithm {
    // Scale workers on backlog and throughput between the minimum and maxNumWorkers.
    ThroughputBased,
    // A fixed number of workers: numWorkers.
    None,
}

/// Dataflow pipeline options, under their Java names, as they make sense on Kubernetes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.numWorkers) || !has(self.maxNumWorkers) || self.numWorkers <= self.maxNumWorkers",
    "message": "numWorkers (the initial number of workers) must not exceed maxNumWorkers"
}]))]
pub struct JobOptions {
    /// Run as a streaming job: unbounded sources are read continuously, windows fire as the watermark passes, and the job runs until drained or cancelled. Cannot change once the job exists. Default false (batch: the job ends when its bounded input is processed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streaming: Option<bool>,

    /// The job name shown in status, logs and metrics. Defaults to metadata.name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub job_name: Option<String>,

    /// The initial number of workers. With autoscalingAlgorithm NONE this is the fixed number of workers (default 3). With THROUGHPUT_BASED the autoscaler starts here and moves between the minimum and maxNumWorkers (default start: 3, or maxNumWorkers if lower).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub num_workers: Option<i32>,

    /// The most workers the job may use. Default 1000 for batch jobs and 100 for streaming jobs. For streaming jobs this is also the number of persistent disks the job's state is spread over, so the autoscaler only uses worker counts that divide it evenly, and never fewer than ceil(maxNumWorkers / 15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_num_workers: Option<i32>,

    /// Horizontal autoscaling: THROUGHPUT_BASED (the default) scales workers on backlog and throughput; NONE keeps numWorkers workers for the whole job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = no_null_in_enum)]
    pub autoscaling_algorithm: Option<AutoscalingAlgorithm>,

    /// Threads each worker uses to process bundles. Default: one per CPU the worker pod is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub number_of_worker_harness_threads: Option<i32>,

    /// Streaming: seconds between consistent checkpoints (default 10). Output is committed and source offsets and state are saved at each checkpoint, so it bounds both the output latency and the work redone after a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.1, max = 3600.0))]
    pub checkpoint_interval_sec: Option<f64>,

    /// Size of each worker's persistent disk (a PersistentVolumeClaim per worker, kept for shuffle data, spills and streaming state), in GB. Cannot change once the job exists. Default as Dataflow without its shuffle service: 250 for batch jobs, 400 for streaming jobs (the cluster administrator may set a different default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub disk_size_gb: Option<i32>,

    /// The StorageClass of the workers' persistent disks (Dataflow's workerDiskType, as a Kubernetes StorageClass name). Cannot change once the job exists. Default: the cluster's default StorageClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub worker_disk_type: Option<String>,

    /// Where the job keeps temporary files and checkpoints: an object store URL (`s3://bucket/path`, `gs://bucket/path`, `az://container/path`) or an absolute path on a volume every pod mounts. Sinks write their temp files under it and commit them atomically at the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048), regex(pattern = r"^((s3|gs|az|file)://.+|/.*)$"))]
    pub temp_location: Option<String>,

    /// The Kubernetes ServiceAccount the job's pods run as (Dataflow's worker service account). Bind cloud identities to it (GKE Workload Identity, EKS IRSA/Pod Identity, Azure Workload Identity) to reach object storage without keys. Default: the namespace's `default` ServiceAccount. Same as pods.serviceAccountName; set one of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub service_account: Option<String>,

    /// Experiments to enable, by name, as Dataflow's `--experiments`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub experiments: Vec<String>,

    /// Resource hint: the memory each worker needs, e.g. `16GB`, `16GiB` or a Kubernetes quantity like `16Gi`. Becomes the worker pods' memory request when pods.resources is not set (the Kubernetes form of Dataflow's Auto VM selection: a request, not a machine type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?([kKMGTPE]i?B?)?$"))]
    pub min_ram: Option<String>,

    /// Resource hint: the CPUs each worker needs. Becomes the worker pods' CPU request when pods.resources is not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub cpu_count: Option<i32>,

    /// Resource hint: the most memory a worker may be given, e.g. `16GB`, `16GiB` or `16Gi` (Dataflow Prime's vertical autoscaling bound). When set, the operator grows the workers' memory (their pods' memory request and limit, ×1.5 a step, up to this) when a worker is killed for running out of memory or uses more than 90% of its memory, and shrinks it back a step after 30 minutes without pressure, never below what minRam, pods.resources or the operator's default give. Changing the memory restarts the worker pods; the work items they ran run again. Not set: the workers' memory never changes. Must not be below the workers' memory request. The autoscaling_dry_run experiment records the decisions without applying them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?([kKMGTPE]i?B?)?$"))]
    pub max_worker_memory: Option<String>,
}

// Image pull policy of the job's containers.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ImagePullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl ImagePullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            ImagePullPolicy::Always => "Always",
            ImagePullPolicy::IfNotPresent => "IfNotPresent",
            ImagePullPolicy::Never => "Never",
        }
    }
}

/// Customization of the job's pods (coordinator and workers).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodsSpec {
    /// Container image with the `riverbank` binary. Default: the worker image the operator was installed with, of the operator's own version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub image: Option<String>,

    /// When to pull the image: Always, IfNotPresent or Never. Default: the operator's setting (IfNotPresent unless the administrator changed it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = no_null_in_enum)]
    pub image_pull_policy: Option<ImagePullPolicy>,

    /// Secrets (of type kubernetes.io/dockerconfigjson) in the job's namespace to pull the image with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,

    /// CPU and memory of each worker pod. When not set, requests come from the resource hints options.cpuCount and options.minRam, or else from the operator's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Node labels the job's pods must run on (a pod's nodeSelector).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    /// Taints the job's pods tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,

    /// Node and pod affinity of the job's pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,

    /// Extra labels on the job's pods. The operator's own labels (app.kubernetes.io/name, app.kubernetes.io/instance, app.kubernetes.io/component, app.kubernetes.io/managed-by and riverbank.dev/job) take precedence.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,

    /// Extra annotations on the job's pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,

    /// Extra environment variables of the job's containers (e.g. RUST_LOG, AWS_REGION, AWS_ENDPOINT_URL). Do not put secrets here: use credentials. POD_NAME, POD_NAMESPACE and names starting with RIVERBANK_ are set by the operator and cannot be overridden.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub env: Vec<EnvVar>,

    /// The Kubernetes ServiceAccount the job's pods run as. Same as options.serviceAccount; set one of them. The pods do not mount a Kubernetes API token: they never call the API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub service_account_name: Option<String>,

    /// Credentials the pipeline needs (object store keys, service account key files), each a key of a Secret in the job's namespace, given to the coordinator and worker containers as an environment variable or as a read-only file. Secrets are referenced by name only: their values never appear in the DataflowJob, and the operator never reads them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub credentials: Vec<SecretCredential>,
}

/// One key of a Secret, exposed to the job's containers as an environment variable or a file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.env) != has(self.path)",
    "message": "set exactly one of env (an environment variable) or path (a file)"
}]))]
pub struct SecretCredential {
    /// Name of the Secret, in the job's namespace.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,

    /// The key within the Secret.
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,

    /// Expose the key as this environment variable, e.g. AWS_SECRET_ACCESS_KEY.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]*$")
    )]
    pub env: Option<String>,

    /// Mount the key as a read-only file at this absolute path, e.g. /var/run/secrets/gcp/key.json (then point GOOGLE_APPLICATION_CREDENTIALS at it with env). Files in the same directory share one volume; /tmp, /etc/riverbank and /var/lib/riverbank are reserved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 1024), regex(pattern = r"^(/[^/]+)+$"))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "!self.matches('(^|/)[.][.]?(/|$)')",
        "message": "path must not contain '.' or '..' segments"
    }]))]
    pub path: Option<String>,
}

// Dataflow's job states.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum JobState {
    // Accepted; the plan is being made and the pods are starting.
    Pending,
    // Processing data.
    Running,
    // A batch job finished successfully: every sink committed.
    Done,
    // The job stopped on an error it could not retry past (see message and conditions).
    Failed,
    // Stopped by desiredState Cancelled.
    Cancelled,
    // desiredState Drained: no longer reading input, finishing in-flight work.
    Draining,
    // Drained: all in-flight work finished and committed.
    Drained,
    // Applying a changed pipeline to a running streaming job.
    Updating,
}

impl JobState {
    /// States a job never leaves.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Done | JobState::Failed | JobState::Cancelled | JobState::Drained
        )
    }
}

/// What the operator observed of the job. Written only by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataflowJobStatus {
    /// The job's state, one of Dataflow's job states. Pending: accepted, the plan is being made and the pods are starting. Running: processing data. Done: a batch job finished and every sink committed. Failed: stopped on an error it could not retry past (see message and conditions). Cancelled: stopped by desiredState Cancelled. Draining: no longer reading input, finishing in-flight work. Drained: all in-flight work finished and committed. Updating: applying a changed pipeline to a running streaming job. Done, Failed, Cancelled and Drained are final.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = no_null_in_enum)]
    pub state: Option<JobState>,

    /// A human-readable summary of the state: what the job is doing, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// Standard conditions. `Ready`: the pipeline is valid and the job's pods are running. `Progressing`: the job is processing or scaling. `Degraded`: the job runs but something needs attention: a pod that cannot run (ImagePullBackOff, CrashLoopBackOff, Unschedulable...), or else the first of status.insights, with its Dataflow Insights name as reason (STUCK, WORKER_OUT_OF_MEMORY, LONG_WORK_ITEM, HOT_KEY, MAX_NUM_WORKERS, ACTIVE_KEYS, HIGH_FAN_OUT).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The metadata.generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The fused execution plan, as Dataflow shows it: element-wise steps fused into stages, split at shuffles (GroupByKey/Combine, Reshuffle, side inputs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageStatus>,

    /// Workers running now: the worker pods that are ready, or, while the coordinator reports on an active job, the workers it sees taking work if more (a worker leases work before its pod is Ready).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_workers: Option<i32>,

    /// The number of workers the autoscaler chose (numWorkers when autoscaling is NONE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_workers: Option<i32>,

    /// Estimated time to process the input not yet read, at the current throughput, in seconds (Dataflow's backlog; streaming jobs scale up while it stays above 15 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog_seconds: Option<i64>,

    /// Elements read per second by the job's sources, averaged over the last minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<f64>,

    /// Fraction of the input processed, from 0 to 1 (batch jobs; estimated from the splits of the sources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub progress: Option<f64>,

    /// When the job started running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the job reached a final state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// What the autoscaler measured on this job, its latest evaluation (with why it holds), the last rescale it applied and the workers' memory; an operator that restarts reads it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingStatus>,

    /// Streaming: the job's data freshness, backlog, state and checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streaming: Option<StreamingStatus>,

    /// Streaming: the snapshots taken of this job (spec.snapshot, and the one each update starts from), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotStatus>,

    /// Streaming: the pipeline version running now: the spec generation it came from, where its checkpoints are and the snapshot it started from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunStatus>,

    /// Streaming: the last update of the pipeline (a changed spec.pipeline on a running job) and how far it got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update: Option<UpdateStatus>,

    /// Dataflow Insights that hold now, most pressing first: what looks wrong with the running job and what to do about it. Each is also published as an Event whose reason is its type, when it appears (Warning) and when it clears (Normal). Cleared when the condition ends, and when the job is over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub insights: Vec<InsightStatus>,
}

/// A streaming job's numbers, from its coordinator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StreamingStatus {
    /// The output watermark: event time up to which every window has fired (RFC 3339; "end of time" once drained).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<String>,
    /// Seconds the watermark is behind wall time (Dataflow's data freshness).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark_lag_seconds: Option<i64>,
    /// Source messages not read yet, over every partition (consumer lag).
    pub backlog_messages: i64,
    /// Their estimated bytes.
    pub backlog_bytes: i64,
    /// Bytes of keyed state on the workers' disks.
    pub state_bytes: i64,
    /// Keys and windows held in state.
    pub active_keys: i64,
    /// Late elements dropped (behind the watermark by more than the allowed lateness).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub late_elements_dropped: i64,
    /// The last completed checkpoint.
    pub checkpoint: i64,
    /// When it completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint_time: Option<Time>,
    /// State shards (maxNumWorkers of them: the persistent disks the state is spread over; 0 for a Beam SDK pipeline, whose runner keeps its state and checkpoints it to tempLocation).
    pub shards: i32,
    /// Shards on each worker now (shards / current workers, rounded up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards_per_worker: Option<i32>,
    /// The pause of the last rescale (its first checkpoint, shard moves included), seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rescale_pause_seconds: Option<f64>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// A snapshot taken of the job.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// Its name (spec.snapshot.name, or update-g<generation> for the one an update starts from).
    pub name: String,
    /// The checkpoint it holds.
    pub checkpoint: i64,
    /// Where it is: give it to a new job's fromSnapshot.location.
    pub location: String,
    pub time: Time,
}

/// The pipeline version a streaming job runs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunStatus {
    /// The metadata.generation whose pipeline runs.
    pub generation: i64,
    /// The latest metadata.generation found to need no update (worker counts, pod settings, desiredState): it applies to this run as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_generation: Option<i64>,
    /// Where its checkpoints are: tempLocation/jobName/UID for the first run of a job (one directory per DataflowJob object: a job created again under the same name starts afresh), .../runs/gN for the run of an update to generation N; absent for a job started before this was recorded (tempLocation/jobName).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_location: Option<String>,
    /// The snapshot it started from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<String>,
}

// How far an update got.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum UpdatePhase {
    // The job is finishing a checkpoint, then stops and snapshots its state.
    Stopping,
    // The new pipeline is starting from the snapshot.
    Restarting,
    // The new pipeline runs.
    Done,
    // The new pipeline cannot take the job's state; the old one runs on.
    Refused,
}

/// An update of a running streaming job's pipeline.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateStatus {
    /// The metadata.generation of the new pipeline.
    pub generation: i64,
    /// Stopping, Restarting, Done or Refused.
    pub phase: UpdatePhase,
    /// What happened; for Refused, why the new pipeline cannot take the state.
    pub message: String,
    /// The snapshot the new pipeline starts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    pub time: Time,
}

/// One Dataflow insight about the running job.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InsightStatus {
    /// Dataflow's insight name. STUCK: a work item keeps failing and being retried. WORKER_OUT_OF_MEMORY: worker pods were killed for running out of memory. LONG_WORK_ITEM: a work item runs far longer than its stage's typical item. HOT_KEY: one key carries so much of a stage's input that the stage cannot go faster. MAX_NUM_WORKERS: the job is busy at maxNumWorkers. ACTIVE_KEYS: fewer keys than cores, so more workers would idle. HIGH_FAN_OUT: a transform emits far more elements than it receives and is fused with what follows.
    #[serde(rename = "type")]
    pub type_: String,
    /// What it is about: a stage and transform (S00/Explode), a work item (S01/item-12), a pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// Since when it holds (about this subject).
    pub since: Time,
    /// What was seen, with its numbers as they were when it was first seen.
    pub message: String,
    /// What to do about it.
    pub recommendation: String,
}

/// The autoscaler's memory of a job that outlives the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingStatus {
    /// Seconds from asking for more workers until they had all joined the job, as measured on this job's scale-ups (averaged with the previous measurement). The autoscaler weighs scale-ups against it; 60 s until measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_seconds: Option<f64>,

    /// The last rescale the autoscaler applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rescale: Option<RescaleStatus>,

    /// The autoscaler's latest evaluation, including why it keeps the workers it has. Rewritten when the decision or its reason changes, and otherwise at most once per evaluation interval (30 s batch, 10 s streaming) and status interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_evaluation: Option<EvaluationStatus>,

    /// The workers' memory, when options.maxWorkerMemory lets the operator change it (vertical autoscaling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStatus>,
}

// What an evaluation decided.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ScalingDecision {
    // More workers.
    ScaleUp,
    // Fewer workers.
    ScaleDown,
    // Keep the workers the job has.
    Hold,
}

/// One evaluation of the horizontal autoscaler.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvaluationStatus {
    /// When it was made.
    pub time: Time,
    /// ScaleUp, ScaleDown or Hold.
    pub decision: ScalingDecision,
    /// Workers taking work when it was made.
    pub current_workers: i32,
    /// Workers it wants (the current ones for a hold).
    pub target_workers: i32,
    /// The engine's reason code, e.g. HOLD_PAUSE_COST, SCALE_UP_BACKLOG, SETTLING.
    pub reason: String,
    /// Why, with the numbers, e.g. `1 worker kept: 50 s of work left is less than a 60 s start-up`.
    pub message: String,
    /// Recorded only (the autoscaling_dry_run experiment): the workers were not changed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// The workers' memory as vertical autoscaling set it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStatus {
    /// The memory request and limit of each worker pod now, e.g. `3Gi`.
    pub current: String,
    /// Why it was last changed: OOMKilled (a worker was killed for running out of memory), NearLimit (a worker used more than 90% of it), Quiet (no pressure for 30 minutes: a step back down), or AtMaximum (under pressure at options.maxWorkerMemory: nothing more to give).
    pub reason: String,
    /// What happened, with the numbers.
    pub message: String,
    /// When the memory was last changed (or, at the maximum, found not enough).
    pub last_change: Time,
    /// When a worker was last seen short of memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pressure: Option<Time>,
    /// Dry run (the autoscaling_dry_run experiment): the memory the operator would have set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposed: Option<String>,
}

/// One applied rescale.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RescaleStatus {
    /// When it was decided.
    pub time: Time,
    /// Workers before.
    pub from_workers: i32,
    /// Workers asked for.
    pub to_workers: i32,
    /// The engine's reason code, e.g. SCALE_UP_BACKLOG.
    pub reason: String,
}

/// One fused stage of the plan.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageStatus {
    /// Stage id, e.g. S01 (Dataflow's executionPipelineStage id).
    pub id: String,
    /// Stage name, e.g. F1.
    pub name: String,
    /// Dataflow's stage kind: READ_KIND, PAR_DO_KIND, GROUP_BY_KEY_KIND, SHUFFLE_KIND or CONSTANT_KIND.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// The transforms fused into this stage, in order (Dataflow's componentTransform), e.g. `SumPerZone/PartialCombine`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub component_transforms: Vec<String>,
    /// Collections read from other stages: `collection <- producing stages via shuffle`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// Collections written for other stages: `collection -> shuffle`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<String>,
}

impl JobOptions {
    fn is_empty(&self) -> bool {
        *self == JobOptions::default()
    }

    pub fn streaming(&self) -> bool {
        self.streaming.unwrap_or(false)
    }

    pub fn autoscaling(&self) -> AutoscalingAlgorithm {
        self.autoscaling_algorithm
            .unwrap_or(AutoscalingAlgorithm::ThroughputBased)
    }

    /// Dataflow's default: 1000 workers in batch, 100 in streaming (seed 000).
    pub fn max_workers(&self) -> i32 {
        self.max_num_workers
            .unwrap_or(if self.streaming() { 100 } else { 1000 })
    }

    /// Streaming jobs never go below ceil(maxNumWorkers / 15) (seed 000: disks are spread
    /// over the workers); batch jobs may go down to one.
    pub fn min_workers(&self) -> i32 {
        match self.autoscaling() {
            AutoscalingAlgorithm::None => self.initial_workers(),
            AutoscalingAlgorithm::ThroughputBased if self.streaming() => {
                (self.max_workers() + 14) / 15
            }
            AutoscalingAlgorithm::ThroughputBased => 1,
        }
    }

    /// Workers the job starts with: numWorkers, else Dataflow's 3, never above the maximum.
    pub fn initial_workers(&self) -> i32 {
        match self.num_workers {
            Some(n) => n,
            None => 3.min(self.max_workers()),
        }
    }

    /// Dataflow's disk defaults without its shuffle service and Streaming Engine (seed 002),
    /// because Riverbank workers keep shuffle data and state on their own disks.
    pub fn disk_size_gb(&self, default: Option<i32>) -> i32 {
        self.disk_size_gb
            .or(default)
            .unwrap_or(if self.streaming() { 400 } else { 250 })
    }

    /// The options as the pipeline model and runtime take them.
    pub fn to_pipeline_options(&self, job_name: &str) -> PipelineOptions {
        let positive = |v: Option<i32>| v.and_then(|n| u32::try_from(n).ok());
        PipelineOptions {
            streaming: self.streaming(),
            job_name: Some(job_name.to_string()),
            num_workers: positive(self.num_workers),
            max_num_workers: positive(self.max_num_workers),
            autoscaling_algorithm: self.autoscaling_algorithm.map(|a| match a {
                AutoscalingAlgorithm::ThroughputBased => PipelineAutoscaling::ThroughputBased,
                AutoscalingAlgorithm::None => PipelineAutoscaling::None,
            }),
            number_of_worker_harness_threads: positive(self.number_of_worker_harness_threads),
            disk_size_gb: positive(self.disk_size_gb),
            worker_disk_type: self.worker_disk_type.clone(),
            temp_location: self.temp_location.clone(),
            service_account: self.service_account.clone(),
            experiments: self.experiments.clone(),
            min_ram: self.min_ram.clone(),
            cpu_count: positive(self.cpu_count),
            checkpoint_interval_sec: self.checkpoint_interval_sec,
            other: BTreeMap::new(),
        }
    }
}

impl DataflowJob {
    /// The job's name in the plan, logs and metrics: options.jobName, else metadata.name.
    pub fn job_name(&self) -> String {
        self.spec
            .options
            .job_name
            .clone()
            .or_else(|| self.metadata.name.clone())
            .unwrap_or_default()
    }

    /// Validates and plans spec.pipeline (structure only: schemas are checked where the data
    /// is, when the coordinator starts). No templating: a resource holds a rendered pipeline.
    pub fn plan(&self) -> Result<Plan, PipelineError> {
        let name = self.job_name();
        if self.spec.beam_pipeline.is_some() {
            // A Beam SDK pipeline is planned by its runner pod, from the proto: nothing to plan
            // here but the options (the YAML plan has no stages).
            return Ok(riverbank_pipeline::plan::plan(
                &name,
                self.spec.options.to_pipeline_options(&name),
                riverbank_pipeline::graph::Graph {
                    transforms: Vec::new(),
                },
            ));
        }
        let pipeline = Value::Object(self.spec.pipeline.clone().unwrap_or_default());
        let graph = riverbank_pipeline::graph::build(&pipeline).map_err(PipelineError::Invalid)?;
        let plan = riverbank_pipeline::plan::plan(
            &name,
            self.spec.options.to_pipeline_options(&name),
            graph,
        );
        // `riverbank run` hands such a pipeline whole to Beam's own YAML runner; the
        // coordinator's engine runs a PyTransform in batch stages only.
        if plan.is_streaming() {
            let issues: Vec<Issue> = plan
                .python_sdk_transforms()
                .into_iter()
                .map(|t| {
                    Issue::at(
                        t,
                        "a PyTransform runs in batch DataflowJobs only: a streaming pipeline with \
                         one runs on `riverbank run` (through Beam's Python SDK), or as a Beam \
                         SDK pipeline through the chart's job service",
                    )
                })
                .collect();
            if !issues.is_empty() {
                return Err(PipelineError::Invalid(issues));
            }
        }
        Ok(plan)
    }

    /// A Beam SDK pipeline's job (spec.beamPipeline), run by a runner pod and SDK worker pods.
    pub fn is_beam_sdk(&self) -> bool {
        self.spec.beam_pipeline.is_some()
    }

    /// spec.pods, or its deprecated name spec.worker.
    pub fn pods(&self) -> Option<&PodsSpec> {
        self.spec.pods.as_ref().or(self.spec.worker.as_ref())
    }

    /// The ServiceAccount of the job's pods, from pods.serviceAccountName or options.serviceAccount.
    pub fn service_account(&self) -> Option<&str> {
        self.pods()
            .and_then(|p| p.service_account_name.as_deref())
            .or(self.spec.options.service_account.as_deref())
    }
}

impl StageStatus {
    /// A Beam SDK pipeline's stages, as its runner pod reports them (the runner plans the
    /// pipeline proto; the operator never sees it): ids and names only.
    pub fn from_progress(progress: &riverbank_pipeline::progress::JobProgress) -> Vec<StageStatus> {
        progress
            .stages
            .iter()
            .map(|s| StageStatus {
                id: format!("S{:02}", s.index),
                name: s.name.clone(),
                ..Default::default()
            })
            .collect()
    }

    /// The plan's stages as status shows them, read from the typed plan, in the words
    /// `riverbank plan` prints (`Coll <- S00 via shuffle(...)`, `Coll -> shuffle(...)`,
    /// `SumPerZone/PartialCombine`).
    pub fn from_plan(plan: &Plan) -> Vec<StageStatus> {
        plan.stages
            .iter()
            .map(|s| StageStatus {
                id: s.id(),
                name: s.name(),
                kind: riverbank_pipeline::plan::stage_kind(plan, s).to_string(),
                component_transforms: s
                    .ops
                    .iter()
                    .map(|o| component_name(plan, o.transform, o.role))
                    .collect(),
                inputs: s
                    .inputs
                    .iter()
                    .map(|i| {
                        let from: Vec<String> =
                            i.from_stages.iter().map(|&x| plan.stages[x].id()).collect();
                        format!(
                            "{} <- {} via {}",
                            i.collection,
                            from.join(", "),
                            exchange_name(&i.exchange)
                        )
                    })
                    .collect(),
                outputs: s
                    .outputs
                    .iter()
                    .map(|(c, e)| format!("{c} -> {}", exchange_name(e)))
                    .collect(),
            })
            .collect()
    }
}
