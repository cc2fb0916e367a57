//! The objects that run a DataflowJob, computed as a pure function of the job, its plan and the
//! operator's settings.
//!
//! Per job: the plan ConfigMap, a headless Service that gives every pod a stable DNS name, the
//! coordinator StatefulSet (one pod, its own disk for the progress log) and the worker
//! StatefulSet (one persistent disk per worker, Dataflow's worker disks). A Beam SDK job runs a
//! runner pod in the coordinator's place and SDK worker pods (the pipeline's SDK image, no disk)
//! in the workers', and a NetworkPolicy that keeps its SDK worker pools and Fn API to itself.
//! The reconciler applies exactly these objects with server-side apply; their names are fixed
//! per job, so there is never a stale one to prune. Nothing here talks to the API server, so
//! every detail is covered by snapshot tests.
//!
//! The pods run entry points of the `riverbank` binary that the distributed runtime provides:
//! `riverbank coordinator` and `riverbank worker`, with the flags documented in the operator's
//! README ("The pod contract").
mod credentials;
mod pod;
mod resources;

// One job per file: the objects and their names here; `pod` (what spec.pods makes of both
// pods, the container, the pod template), `credentials` (Secret keys as env vars and files),
// `resources` (requests from spec.pods or the resource hints, a worker's cores).

pub use resources::{cores, worker_cores, worker_requests, worker_resources};

use crate::crd::{DataflowJob, StageStatus};
use crate::lifecycle::Replicas;
use crate::settings::OperatorSettings;
use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, HTTPGetAction, ObjectFieldSelector, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecretKeySelector, SecurityContext, Service, ServicePort,
    ServiceSpec, TopologySpreadConstraint, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use pod::PodParts;
use resources::{check_max_memory, with_memory};
use riverbank_pipeline::Plan;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Port of the coordinator's work-item service (workers connect to it).
pub const COORDINATOR_PORT: i32 = 7070;
/// Port of Beam's SDK worker pool in a Beam SDK job's SDK worker pods (Beam's images' default).
pub const SDK_WORKER_POOL_PORT: i32 = 50000;
/// Port of a Beam SDK job's runner's Fn API, which the SDK harnesses in its worker pods dial.
pub const FN_API_PORT: i32 = 7072;
/// Port on which workers serve shuffle data to each other.
pub const SHUFFLE_PORT: i32 = 7071;
/// Port of `/healthz` (liveness) and `/readyz` (readiness) on every pod.
pub const HEALTH_PORT: i32 = 8081;
/// Port of the Prometheus `/metrics` endpoint on every pod.
pub const METRICS_PORT: i32 = 9090;
/// Where the plan ConfigMap is mounted.
pub const PLAN_DIR: &str = "/etc/riverbank";
/// Where each pod's persistent disk is mounted.
pub const DATA_DIR: &str = "/var/lib/riverbank";
/// UID and GID of the images (distroless `nonroot`); also the fsGroup that owns the disks.
pub const RUN_AS: i64 = 65532;
/// ConfigMaps hold at most 1 MiB in all; leave room for metadata.
pub const MAX_PLAN_BYTES: usize = 1_000_000;
/// Seconds a worker pod gets after SIGTERM (a scale-down, a new plan) before it is killed.
/// On SIGTERM `riverbank worker` asks the coordinator to drain it (no new leases), finishes the
/// work items it runs, reports them and exits; work items are splits of a source or a shuffle
/// partition, seconds to tens of seconds long. An item still running at the deadline is not
/// lost: the coordinator re-leases it once the worker's heartbeats stop (its lease timeout,
/// 10 s), and completions count once per item, so nothing is duplicated either.
pub const WORKER_TERMINATION_GRACE_SECS: i64 = 60;

/// Label keys the operator sets on everything it creates.
pub mod labels {
    pub const NAME: &str = "app.kubernetes.io/name";
    pub const INSTANCE: &str = "app.kubernetes.io/instance";
    pub const COMPONENT: &str = "app.kubernetes.io/component";
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    pub const JOB: &str = "riverbank.dev/job";
    /// Pod-template annotation: a hash of the plan, so pods restart when the plan changes.
    pub const PLAN_HASH: &str = "riverbank.dev/plan-hash";
}

/// A job's objects can't be made: a user mistake the API server's schema can't catch, reported
/// in the job's status by the reconciler.
#[derive(Debug, thiserror::Error)]
pub enum ChildrenError {
    #[error(
        "the DataflowJob has no metadata.{0}; its objects need it for names and owner references"
    )]
    MissingMetadata(&'static str),
    #[error(
        "the plan is {bytes} bytes, more than the {limit} a ConfigMap can hold; split the pipeline into smaller jobs"
    )]
    PlanTooLarge { bytes: usize, limit: usize },
    #[error("spec.pods.env sets {0}, which the operator sets itself")]
    ReservedEnv(String),
    #[error(
        "environment variable {0} is set more than once (spec.pods.env and spec.pods.credentials)"
    )]
    DuplicateEnv(String),
    #[error("credential path {path}: {reason}")]
    CredentialPath { path: String, reason: &'static str },
    #[error("options.minRam {0:?} is not a memory size like 16GB, 16GiB or 16Gi")]
    MinRam(String),
    #[error("options.maxWorkerMemory {0:?} is not a memory size like 16GB, 16GiB or 16Gi")]
    MaxWorkerMemory(String),
    #[error(
        "options.maxWorkerMemory {max} is less than the workers' memory ({base}): it bounds how far the operator may raise it"
    )]
    MaxWorkerMemoryBelowBase { max: String, base: String },
    #[error(
        "options.maxWorkerMemory needs the workers' memory to start from: set options.minRam or a memory request in spec.pods.resources"
    )]
    MaxWorkerMemoryWithoutBase,
    #[error("serializing the plan: {0}")]
    Json(#[from] serde_json::Error),
}

/// Everything a job needs, in the order the reconciler applies them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Children {
    pub plan: ConfigMap,
    pub service: Service,
    /// A Beam SDK job's: only its own pods reach its pods' SDK worker pools and Fn API.
    pub network_policy: Option<NetworkPolicy>,
    pub coordinator: StatefulSet,
    pub workers: StatefulSet,
}

/// Names of a job's objects.
pub fn plan_config_map_name(job: &str) -> String {
    format!("{job}-plan")
}
pub fn service_name(job: &str) -> String {
    format!("{job}-headless")
}
pub fn coordinator_name(job: &str) -> String {
    format!("{job}-coordinator")
}
pub fn workers_name(job: &str) -> String {
    format!("{job}-worker")
}

/// The stable DNS name and port workers reach the coordinator at (StatefulSet pod 0 behind the
/// headless Service).
pub fn coordinator_address(job: &str, namespace: &str, cluster_domain: &str) -> String {
    format!(
        "{}-0.{}.{namespace}.svc.{cluster_domain}:{COORDINATOR_PORT}",
        coordinator_name(job),
        service_name(job)
    )
}

/// The DNS names and port of a Beam SDK job's SDK worker pods' worker pools, for its runner.
pub fn sdk_worker_pools(
    job: &str,
    namespace: &str,
    cluster_domain: &str,
    pods: i32,
) -> Vec<String> {
    (0..pods)
        .map(|i| {
            format!(
                "{}-{i}.{}.{namespace}.svc.{cluster_domain}:{SDK_WORKER_POOL_PORT}",
                workers_name(job),
                service_name(job)
            )
        })
        .collect()
}

/// The objects that run `job` with `plan`, with the pod counts decided for this reconcile
/// (`scaling::replicas`: zero for a stopped job, whose objects and disks stay until the job is
/// deleted). Pure: the same inputs always give the same objects.
pub fn desired_children(
    job: &DataflowJob,
    plan: &Plan,
    settings: &OperatorSettings,
    replicas: Replicas,
) -> Result<Children, ChildrenError> {
    desired_children_sized(job, plan, settings, replicas, None)
}

/// [`desired_children`] with the workers' memory vertical autoscaling decided
/// (`memory::decide`): their pods' memory request and limit, in place of the configured ones.
pub fn desired_children_sized(
    job: &DataflowJob,
    plan: &Plan,
    settings: &OperatorSettings,
    replicas: Replicas,
    worker_memory: Option<&Quantity>,
) -> Result<Children, ChildrenError> {
    let run = job
        .spec
        .options
        .streaming()
        .then(|| crate::streaming::current_run(job));
    let sizing = Sizing {
        replicas,
        workers: worker_requests(job, settings, &plan.worker_resource_hints()),
        memory: worker_memory,
    };
    desired_children_run(job, plan, settings, sizing, run.as_ref())
}

/// How one reconcile sizes a job's pods.
#[derive(Debug)]
pub struct Sizing<'a> {
    /// The pod counts (`scaling::replicas`).
    pub replicas: Replicas,
    /// The workers' configured resources ([`worker_requests`]), or why they can't be made.
    pub workers: Result<ResourceRequirements, ChildrenError>,
    /// Vertical autoscaling's memory request and limit for the workers (`memory::decide`).
    pub memory: Option<&'a Quantity>,
}

/// The objects of `job` sized by the reconcile, for a streaming job's given run
/// (`streaming::Control::run`: the pipeline version its coordinator runs, with its run id,
/// checkpoints and starting snapshot).
pub fn desired_children_run(
    job: &DataflowJob,
    plan: &Plan,
    settings: &OperatorSettings,
    sizing: Sizing<'_>,
    run: Option<&crate::crd::RunStatus>,
) -> Result<Children, ChildrenError> {
    let ctx = Ctx::new(job, settings)?;
    let plan_json = serde_json::to_string(plan)?;
    let stages_json = serde_json::to_string_pretty(&StageStatus::from_plan(plan))?;
    let bytes = plan_json.len() + stages_json.len();
    if bytes > MAX_PLAN_BYTES {
        return Err(ChildrenError::PlanTooLarge {
            bytes,
            limit: MAX_PLAN_BYTES,
        });
    }
    // The worker counts are left out: a new numWorkers (or autoscaling algorithm) is a rescale
    // of the running job (the worker StatefulSet's replicas), not a restart of every pod.
    let plan_hash = format!(
        "{:016x}",
        fnv1a64(serde_json::to_string(&without_worker_counts(plan))?.as_bytes())
    );

    let config_map = ConfigMap {
        metadata: ctx.meta(plan_config_map_name(&ctx.name), None),
        data: Some(BTreeMap::from([
            ("plan.json".to_string(), plan_json),
            ("stages.json".to_string(), stages_json),
        ])),
        ..Default::default()
    };
    let pods = PodParts::new(job, &ctx, plan)?;
    if let Some(beam) = &job.spec.beam_pipeline {
        let resources = sizing.workers?;
        return Ok(Children {
            plan: config_map,
            service: ctx.service(),
            network_policy: Some(ctx.network_policy()),
            coordinator: ctx.beam_runner(
                job,
                beam,
                &pods,
                &plan_hash,
                sizing.replicas.coordinator,
                resources.clone(),
            ),
            workers: ctx.sdk_workers(beam, &pods, &plan_hash, sizing.replicas.workers, resources),
        });
    }
    Ok(Children {
        plan: config_map,
        service: ctx.service(),
        network_policy: None,
        coordinator: ctx.coordinator(
            &pods,
            &plan_hash,
            sizing.replicas.coordinator,
            run.map(|r| crate::streaming::coordinator_args(job, plan, r))
                .unwrap_or_default(),
        ),
        workers: ctx.workers(
            job,
            &pods,
            &plan_hash,
            sizing.replicas.workers,
            sizing.workers,
            sizing.memory,
        )?,
    })
}

/// `plan` without what only sizes the job (numWorkers, the autoscaling algorithm): two plans
/// equal after this run the same pipeline.
/// What the coordinator's pod and a Beam SDK job's runner pod both take: where the operator
/// reaches them, their disk, health and metrics ports.
fn coordinator_pod_args() -> [String; 8] {
    [
        "--port".into(),
        COORDINATOR_PORT.to_string(),
        "--state-dir".into(),
        DATA_DIR.into(),
        "--health-port".into(),
        HEALTH_PORT.to_string(),
        "--metrics-port".into(),
        METRICS_PORT.to_string(),
    ]
}

pub fn without_worker_counts(plan: &Plan) -> Plan {
    let mut p = plan.clone();
    p.options.num_workers = None;
    p.options.autoscaling_algorithm = None;
    p
}

/// What every object of one job shares.
struct Ctx<'a> {
    name: String,
    namespace: String,
    owner: OwnerReference,
    settings: &'a OperatorSettings,
    storage_class: Option<String>,
}

/// `app.kubernetes.io/component` of the coordinator's and the workers' StatefulSets and pods.
pub const COORDINATOR: &str = "coordinator";
pub const WORKER: &str = "worker";

impl<'a> Ctx<'a> {
    fn new(job: &DataflowJob, settings: &'a OperatorSettings) -> Result<Self, ChildrenError> {
        let name = job
            .metadata
            .name
            .clone()
            .ok_or(ChildrenError::MissingMetadata("name"))?;
        let namespace = job
            .metadata
            .namespace
            .clone()
            .ok_or(ChildrenError::MissingMetadata("namespace"))?;
        let uid = job
            .metadata
            .uid
            .clone()
            .ok_or(ChildrenError::MissingMetadata("uid"))?;
        // Controller reference: garbage collection deletes the children with the job, and
        // blockOwnerDeletion keeps a foreground deletion of the job waiting for them.
        let owner = OwnerReference {
            api_version: DataflowJob::api_version(&()).into_owned(),
            kind: DataflowJob::kind(&()).into_owned(),
            name: name.clone(),
            uid,
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        Ok(Ctx {
            name,
            namespace,
            owner,
            settings,
            storage_class: job.spec.options.worker_disk_type.clone(),
        })
    }

    /// Labels of every object of the job; `component` for the coordinator's and workers'.
    fn labels(&self, component: Option<&str>) -> BTreeMap<String, String> {
        let mut l = BTreeMap::from([
            (labels::NAME.to_string(), "riverbank".to_string()),
            (labels::INSTANCE.to_string(), self.name.clone()),
            (
                labels::MANAGED_BY.to_string(),
                "riverbank-operator".to_string(),
            ),
            (labels::JOB.to_string(), self.name.clone()),
        ]);
        if let Some(c) = component {
            l.insert(labels::COMPONENT.to_string(), c.to_string());
        }
        l
    }

    /// StatefulSet selectors are immutable: only labels that never change for a job.
    fn selector(&self, component: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (labels::JOB.to_string(), self.name.clone()),
            (labels::COMPONENT.to_string(), component.to_string()),
        ])
    }

    fn meta(&self, name: String, component: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(self.labels(component)),
            owner_references: Some(vec![self.owner.clone()]),
            ..Default::default()
        }
    }

    /// Headless: no virtual IP, one DNS record per pod, published before pods are ready so
    /// workers can reach a starting coordinator and each other while they start.
    fn service(&self) -> Service {
        let port = |name: &str, port: i32| ServicePort {
            name: Some(name.into()),
            port,
            target_port: Some(IntOrString::String(name.into())),
            protocol: Some("TCP".into()),
            ..Default::default()
        };
        Service {
            metadata: self.meta(service_name(&self.name), None),
            spec: Some(ServiceSpec {
                cluster_ip: Some("None".into()),
                publish_not_ready_addresses: Some(true),
                selector: Some(BTreeMap::from([(
                    labels::JOB.to_string(),
                    self.name.clone(),
                )])),
                ports: Some(vec![
                    port("coordinator", COORDINATOR_PORT),
                    port("shuffle", SHUFFLE_PORT),
                    port("metrics", METRICS_PORT),
                ]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn coordinator(
        &self,
        pods: &PodParts,
        plan_hash: &str,
        replicas: i32,
        streaming: Vec<String>,
    ) -> StatefulSet {
        let mut args = vec![
            "coordinator".to_string(),
            "--plan".into(),
            format!("{PLAN_DIR}/plan.json"),
        ];
        args.extend(coordinator_pod_args());
        args.extend(streaming);
        let container = pods.container(
            COORDINATOR,
            args,
            ("coordinator", COORDINATOR_PORT),
            self.settings.coordinator_resources.clone(),
            "state",
        );
        let template = pods.template(self, COORDINATOR, container, plan_hash, 30);
        let claim = self.claim("state", self.settings.coordinator_disk.clone(), COORDINATOR);
        self.stateful_set(COORDINATOR, replicas, template, Some(claim))
    }

    /// A Beam SDK pipeline's runner pod, in the coordinator's place: the runner harness
    /// (`riverbank runner-harness`: plans the pipeline proto, runs the runner-native stages,
    /// answers the operator as a coordinator does), which starts SDK harnesses in each of the
    /// job's SDK worker pods (sdkWorkerParallelism, else the workers' cores) and serves them the
    /// Fn API. It gets the workers' resources: it holds the materialized data between stages.
    fn beam_runner(
        &self,
        job: &DataflowJob,
        beam: &crate::crd::BeamPipelineSpec,
        pods: &PodParts,
        plan_hash: &str,
        replicas: i32,
        resources: ResourceRequirements,
    ) -> StatefulSet {
        let mut args = vec![
            "runner-harness".to_string(),
            "--pipeline-location".into(),
            beam.location.clone(),
        ];
        for pool in sdk_worker_pools(
            &self.name,
            &self.namespace,
            &self.settings.cluster_domain,
            crate::scaling::sdk_worker_pods(job),
        ) {
            args.extend(["--sdk-worker-pool".to_string(), pool]);
        }
        let per_pod = beam.sdk_worker_parallelism.map_or_else(
            || resources::cores(job, Some(&resources)),
            |n| u32::try_from(n).unwrap_or(1),
        );
        args.extend(["--sdk-workers".to_string(), per_pod.to_string()]);
        // Where a streaming pipeline that names no --temp_location checkpoints.
        if let Some(temp) = &job.spec.options.temp_location {
            args.extend(["--temp-location".to_string(), temp.clone()]);
        }
        // The harnesses in the SDK worker pods dial the runner's pod IP: its DNS name may not
        // resolve yet when the first harnesses start (a new pod's record comes with the
        // EndpointSlice's next update), and a restarted runner restarts its harnesses anyway.
        // Kubernetes expands $(POD_IP) from the container's env.
        args.extend([
            "--fn-api-bind".to_string(),
            format!("0.0.0.0:{FN_API_PORT}"),
            "--fn-api-advertise".into(),
            "$(POD_IP)".into(),
        ]);
        args.extend(coordinator_pod_args());
        // Half the container's memory for materialized data, the rest for the runner itself.
        if let Some(mb) = resources
            .limits
            .as_ref()
            .and_then(|l| l.get("memory"))
            .and_then(|q| crate::quantity::parse_bytes(&q.0))
            .map(|bytes| (bytes >> 21).max(64))
        {
            args.extend(["--memory-mb".to_string(), mb.to_string()]);
        }
        let mut runner = pods.container(
            COORDINATOR,
            args,
            ("coordinator", COORDINATOR_PORT),
            resources,
            "state",
        );
        runner.env.get_or_insert_with(Vec::new).push(EnvVar {
            name: "POD_IP".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "status.podIP".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        runner
            .ports
            .get_or_insert_with(Vec::new)
            .push(ContainerPort {
                name: Some("fn-api".into()),
                container_port: FN_API_PORT,
                protocol: Some("TCP".into()),
                ..Default::default()
            });
        let template = pods.template(self, COORDINATOR, runner, plan_hash, 30);
        let claim = self.claim("state", self.settings.coordinator_disk.clone(), COORDINATOR);
        self.stateful_set(COORDINATOR, replicas, template, Some(claim))
    }

    /// A Beam SDK job's SDK worker pods: the pipeline's SDK image as Beam's worker pool, in
    /// which the runner starts the harnesses that run the user's code. No disk: a harness keeps
    /// only its staged files, in its own emptyDir.
    fn sdk_workers(
        &self,
        beam: &crate::crd::BeamPipelineSpec,
        pods: &PodParts,
        plan_hash: &str,
        replicas: i32,
        resources: ResourceRequirements,
    ) -> StatefulSet {
        let sdk = pods.sdk_container(beam, resources);
        let mut template = pods.template(self, WORKER, sdk, plan_hash, 30);
        if let Some(spec) = template.spec.as_mut() {
            // The SDK reads no plan and has its own scratch space.
            let volumes = spec.volumes.get_or_insert_with(Vec::new);
            volumes.retain(|v| v.name != "plan" && v.name != "tmp");
            volumes.push(Volume {
                name: "sdk-tmp".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            });
        }
        self.spread_workers(&mut template);
        self.stateful_set(WORKER, replicas, template, None)
    }

    /// A Beam SDK job's pods take connections from each other (the runner starts harnesses in
    /// the SDK worker pools, which dial its Fn API: both would run or serve code and data to
    /// anyone who asked) and, from elsewhere, only on the ports the operator, the kubelet and a
    /// metrics scraper use.
    fn network_policy(&self) -> NetworkPolicy {
        let job_pods = || LabelSelector {
            match_labels: Some(BTreeMap::from([(
                labels::JOB.to_string(),
                self.name.clone(),
            )])),
            ..Default::default()
        };
        let port = |name: &str| NetworkPolicyPort {
            port: Some(IntOrString::String(name.into())),
            protocol: Some("TCP".into()),
            ..Default::default()
        };
        NetworkPolicy {
            metadata: self.meta(self.name.clone(), None),
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(job_pods()),
                policy_types: Some(vec!["Ingress".into()]),
                ingress: Some(vec![
                    NetworkPolicyIngressRule {
                        from: Some(vec![NetworkPolicyPeer {
                            pod_selector: Some(job_pods()),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    },
                    NetworkPolicyIngressRule {
                        ports: Some(vec![port("coordinator"), port("health"), port("metrics")]),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
        }
    }

    fn workers(
        &self,
        job: &DataflowJob,
        pods: &PodParts,
        plan_hash: &str,
        replicas: i32,
        resources: Result<ResourceRequirements, ChildrenError>,
        memory: Option<&Quantity>,
    ) -> Result<StatefulSet, ChildrenError> {
        let options = &job.spec.options;
        let mut args = vec![
            "worker".to_string(),
            "--coordinator".into(),
            coordinator_address(&self.name, &self.namespace, &self.settings.cluster_domain),
            "--plan".into(),
            format!("{PLAN_DIR}/plan.json"),
            "--port".into(),
            SHUFFLE_PORT.to_string(),
            // Kubernetes expands $(POD_NAME) from the container's env.
            "--advertise".into(),
            format!(
                "$(POD_NAME).{}.{}.svc.{}:{SHUFFLE_PORT}",
                service_name(&self.name),
                self.namespace,
                self.settings.cluster_domain
            ),
            "--data-dir".into(),
            DATA_DIR.into(),
            "--health-port".into(),
            HEALTH_PORT.to_string(),
            "--metrics-port".into(),
            METRICS_PORT.to_string(),
        ];
        // Concurrent work slots per worker (Dataflow's numberOfWorkerHarnessThreads).
        if let Some(slots) = options.number_of_worker_harness_threads {
            args.extend(["--slots".to_string(), slots.to_string()]);
        }
        let mut resources = resources?;
        check_max_memory(job, &resources)?;
        if let Some(memory) = memory {
            resources = with_memory(resources, memory);
        }
        let container = pods.container(WORKER, args, ("shuffle", SHUFFLE_PORT), resources, "data");
        let mut template = pods.template(
            self,
            WORKER,
            container,
            plan_hash,
            WORKER_TERMINATION_GRACE_SECS,
        );
        self.spread_workers(&mut template);
        let disk = Quantity(format!(
            "{}Gi",
            options.disk_size_gb(self.settings.default_disk_size_gb)
        ));
        let claim = self.claim("data", disk, WORKER);
        Ok(self.stateful_set(WORKER, replicas, template, Some(claim)))
    }

    /// Prefer spreading workers over nodes, so one node's loss or pressure costs few (unless
    /// spec.pods sets an affinity of its own).
    fn spread_workers(&self, template: &mut PodTemplateSpec) {
        if let Some(spec) = template.spec.as_mut()
            && spec.affinity.is_none()
        {
            spec.topology_spread_constraints = Some(vec![TopologySpreadConstraint {
                max_skew: 1,
                topology_key: "kubernetes.io/hostname".into(),
                when_unsatisfiable: "ScheduleAnyway".into(),
                label_selector: Some(LabelSelector {
                    match_labels: Some(self.selector(WORKER)),
                    ..Default::default()
                }),
                ..Default::default()
            }]);
        }
    }

    /// One disk per pod, from the job's StorageClass (options.workerDiskType).
    fn claim(&self, name: &str, size: Quantity, component: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(self.labels(Some(component))),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                storage_class_name: self.storage_class.clone(),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([("storage".to_string(), size)])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn stateful_set(
        &self,
        component: &str,
        replicas: i32,
        template: PodTemplateSpec,
        claim: Option<PersistentVolumeClaim>,
    ) -> StatefulSet {
        let name = match component {
            COORDINATOR => coordinator_name(&self.name),
            _ => workers_name(&self.name),
        };
        StatefulSet {
            metadata: self.meta(name, Some(component)),
            spec: Some(StatefulSetSpec {
                replicas: Some(replicas),
                service_name: Some(service_name(&self.name)),
                selector: LabelSelector {
                    match_labels: Some(self.selector(component)),
                    ..Default::default()
                },
                // Workers are peers: start and stop them all at once, not one by one.
                pod_management_policy: Some("Parallel".into()),
                update_strategy: Some(StatefulSetUpdateStrategy {
                    type_: Some("RollingUpdate".into()),
                    ..Default::default()
                }),
                revision_history_limit: Some(3),
                // Deleted with the job, so a finished job leaves no disks to pay for. Kept when
                // scaled down: like Dataflow's streaming disks, which stay fixed at
                // maxNumWorkers while workers come and go, a worker's disk holds shuffle data
                // and state that the worker with the same ordinal picks up again when the
                // autoscaler scales back up, instead of being re-provisioned and rebuilt.
                persistent_volume_claim_retention_policy: claim.is_some().then(|| {
                    StatefulSetPersistentVolumeClaimRetentionPolicy {
                        when_deleted: Some("Delete".into()),
                        when_scaled: Some("Retain".into()),
                    }
                }),
                volume_claim_templates: claim.map(|c| vec![c]),
                template,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// FNV-1a: a stable hash (std's hashers may change between Rust releases, which would restart
/// every job's pods on an operator upgrade).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_is_stable() {
        // Pinned: a change would roll every job's pods on upgrade.
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"riverbank"), 0xda1e_d5f7_457b_ea2b);
        assert_eq!(format!("{:016x}", fnv1a64(b"a")), "af63dc4c8601ec8c");
    }
}
