//! The objects that run a DataflowJob, computed as a pure function of the job, its plan and the
//! operator's settings.
//!
//! Per job: the plan ConfigMap, a headless Service that gives every pod a stable DNS name, the
//! coordinator StatefulSet (one pod, its own disk for the progress log) and the worker
//! StatefulSet (one persistent disk per worker, Dataflow's worker disks). The reconciler applies
//! exactly these objects with server-side apply; their names are fixed per job, so there is
//! never a stale one to prune. Nothing here talks to the API server, so every detail is covered
//! by snapshot tests.
//!
//! The pods run entry points of the `riverbank` binary that the distributed runtime provides:
//! `riverbank coordinator` and `riverbank worker`, with the flags documented in the operator's
//! README ("The pod contract").
use crate::crd::{DataflowJob, ImagePullPolicy, SecretCredential, StageStatus};
use crate::scaling::Replicas;
use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, HTTPGetAction, KeyToPath, ObjectFieldSelector, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ProjectedVolumeSource, ResourceRequirements, SeccompProfile, SecretKeySelector,
    SecretProjection, SecurityContext, Service, ServicePort, ServiceSpec, TopologySpreadConstraint,
    Volume, VolumeMount, VolumeProjection, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use riverbank_pipeline::Plan;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Port of the coordinator's work-item service (workers connect to it).
pub const COORDINATOR_PORT: i32 = 7070;
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

/// What the cluster administrator configures once for all jobs (Helm values of the operator).
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorSettings {
    /// Image of the job pods when spec.pods.image is not set.
    pub worker_image: String,
    /// Pull policy when spec.pods.imagePullPolicy is not set.
    pub image_pull_policy: ImagePullPolicy,
    /// The cluster's DNS domain, for the coordinator's address.
    pub cluster_domain: String,
    /// Size of the coordinator's disk (its progress log).
    pub coordinator_disk: Quantity,
    /// Resources of the coordinator container.
    pub coordinator_resources: ResourceRequirements,
    /// Worker resources when neither spec.pods.resources nor resource hints say otherwise.
    pub worker_resources: ResourceRequirements,
    /// Worker disk size when options.diskSizeGb is not set (None: Dataflow's 250/400 GB).
    pub default_disk_size_gb: Option<i32>,
}

impl Default for OperatorSettings {
    fn default() -> Self {
        OperatorSettings {
            worker_image: format!("riverbank/worker:{}", env!("CARGO_PKG_VERSION")),
            image_pull_policy: ImagePullPolicy::IfNotPresent,
            cluster_domain: "cluster.local".into(),
            coordinator_disk: Quantity("1Gi".into()),
            coordinator_resources: requests(&[("cpu", "250m"), ("memory", "512Mi")]),
            worker_resources: requests(&[("cpu", "1"), ("memory", "2Gi")]),
            default_disk_size_gb: None,
        }
    }
}

fn requests(pairs: &[(&str, &str)]) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect(),
        ),
        ..Default::default()
    }
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
    #[error("serializing the plan: {0}")]
    Json(#[from] serde_json::Error),
}

/// Everything a job needs, in the order the reconciler applies them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Children {
    pub plan: ConfigMap,
    pub service: Service,
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

/// The objects that run `job` with `plan`, with the pod counts decided for this reconcile
/// (`scaling::replicas`: zero for a stopped job, whose objects and disks stay until the job is
/// deleted). Pure: the same inputs always give the same objects.
pub fn desired_children(
    job: &DataflowJob,
    plan: &Plan,
    settings: &OperatorSettings,
    replicas: Replicas,
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
    let plan_hash = format!("{:016x}", fnv1a64(plan_json.as_bytes()));

    let config_map = ConfigMap {
        metadata: ctx.meta(plan_config_map_name(&ctx.name), None),
        data: Some(BTreeMap::from([
            ("plan.json".to_string(), plan_json),
            ("stages.json".to_string(), stages_json),
        ])),
        ..Default::default()
    };
    let pods = PodParts::new(job, &ctx)?;
    Ok(Children {
        plan: config_map,
        service: ctx.service(),
        coordinator: ctx.coordinator(&pods, &plan_hash, replicas.coordinator),
        workers: ctx.workers(job, &pods, &plan_hash, replicas.workers)?,
    })
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

    fn coordinator(&self, pods: &PodParts, plan_hash: &str, replicas: i32) -> StatefulSet {
        let args = vec![
            "coordinator".to_string(),
            "--plan".into(),
            format!("{PLAN_DIR}/plan.json"),
            "--port".into(),
            COORDINATOR_PORT.to_string(),
            "--state-dir".into(),
            DATA_DIR.into(),
            "--health-port".into(),
            HEALTH_PORT.to_string(),
            "--metrics-port".into(),
            METRICS_PORT.to_string(),
        ];
        let container = pods.container(
            COORDINATOR,
            args,
            ("coordinator", COORDINATOR_PORT),
            self.settings.coordinator_resources.clone(),
            "state",
        );
        let template = pods.template(self, COORDINATOR, container, plan_hash, 30);
        let claim = self.claim("state", self.settings.coordinator_disk.clone(), COORDINATOR);
        self.stateful_set(COORDINATOR, replicas, template, claim)
    }

    fn workers(
        &self,
        job: &DataflowJob,
        pods: &PodParts,
        plan_hash: &str,
        replicas: i32,
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
        let resources = worker_resources(job, self.settings)?;
        let container = pods.container(WORKER, args, ("shuffle", SHUFFLE_PORT), resources, "data");
        let mut template = pods.template(
            self,
            WORKER,
            container,
            plan_hash,
            WORKER_TERMINATION_GRACE_SECS,
        );
        if let Some(spec) = template.spec.as_mut()
            && spec.affinity.is_none()
        {
            // Prefer spreading workers over nodes, so one node's loss or pressure costs few.
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
        let disk = Quantity(format!(
            "{}Gi",
            options.disk_size_gb(self.settings.default_disk_size_gb)
        ));
        let claim = self.claim("data", disk, WORKER);
        Ok(self.stateful_set(WORKER, replicas, template, claim))
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
        claim: PersistentVolumeClaim,
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
                persistent_volume_claim_retention_policy: Some(
                    StatefulSetPersistentVolumeClaimRetentionPolicy {
                        when_deleted: Some("Delete".into()),
                        when_scaled: Some("Retain".into()),
                    },
                ),
                volume_claim_templates: Some(vec![claim]),
                template,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// The parts of the coordinator's and workers' pods that come from spec.pods.
struct PodParts {
    image: String,
    pull_policy: String,
    env: Vec<EnvVar>,
    volumes: Vec<Volume>,
    mounts: Vec<VolumeMount>,
    spec: crate::crd::PodsSpec,
    service_account: Option<String>,
}

/// Mount points the pods use themselves; credential files may not shadow them.
const RESERVED_DIRS: &[&str] = &["/tmp", PLAN_DIR, DATA_DIR];
/// System directories a credential volume must not hide (CA certificates, libraries).
const SYSTEM_DIRS: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc/ssl", "/lib", "/lib64", "/proc", "/sbin", "/sys", "/usr",
];

impl PodParts {
    fn new(job: &DataflowJob, ctx: &Ctx) -> Result<Self, ChildrenError> {
        let spec = job.pods().cloned().unwrap_or_default();
        let image = spec
            .image
            .clone()
            .unwrap_or_else(|| ctx.settings.worker_image.clone());
        let pull_policy = spec
            .image_pull_policy
            .unwrap_or(ctx.settings.image_pull_policy)
            .as_str()
            .to_string();

        let field = |path: &str| EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut env = vec![
            EnvVar {
                name: "POD_NAME".into(),
                value_from: Some(field("metadata.name")),
                ..Default::default()
            },
            EnvVar {
                name: "POD_NAMESPACE".into(),
                value_from: Some(field("metadata.namespace")),
                ..Default::default()
            },
            EnvVar {
                name: "RIVERBANK_JOB".into(),
                value: Some(ctx.name.clone()),
                ..Default::default()
            },
        ];
        let mut seen: BTreeSet<String> = env.iter().map(|e| e.name.clone()).collect();
        for e in &spec.env {
            if e.name == "POD_NAME" || e.name == "POD_NAMESPACE" || e.name.starts_with("RIVERBANK_")
            {
                return Err(ChildrenError::ReservedEnv(e.name.clone()));
            }
        }
        for c in &spec.credentials {
            if let Some(name) = &c.env {
                if !seen.insert(name.clone()) {
                    return Err(ChildrenError::DuplicateEnv(name.clone()));
                }
                env.push(EnvVar {
                    name: name.clone(),
                    value_from: Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: c.name.clone(),
                            key: c.key.clone(),
                            optional: Some(false),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
            }
        }
        for e in &spec.env {
            if !seen.insert(e.name.clone()) {
                return Err(ChildrenError::DuplicateEnv(e.name.clone()));
            }
            env.push(e.clone());
        }
        let (volumes, mounts) = credential_volumes(&spec.credentials)?;
        let service_account = job.service_account().map(String::from);
        Ok(PodParts {
            image,
            pull_policy,
            env,
            volumes,
            mounts,
            spec,
            service_account,
        })
    }

    fn container(
        &self,
        name: &str,
        args: Vec<String>,
        service_port: (&str, i32),
        resources: ResourceRequirements,
        disk: &str,
    ) -> Container {
        let port = |name: &str, port: i32| ContainerPort {
            name: Some(name.into()),
            container_port: port,
            protocol: Some("TCP".into()),
            ..Default::default()
        };
        let probe = |path: &str, period: i32, failures: i32| Probe {
            http_get: Some(HTTPGetAction {
                path: Some(path.into()),
                port: IntOrString::String("health".into()),
                ..Default::default()
            }),
            period_seconds: Some(period),
            timeout_seconds: Some(5),
            failure_threshold: Some(failures),
            ..Default::default()
        };
        let mount = |name: &str, path: &str, read_only: bool| VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            read_only: read_only.then_some(true),
            ..Default::default()
        };
        let mut mounts = vec![
            mount("plan", PLAN_DIR, true),
            mount(disk, DATA_DIR, false),
            mount("tmp", "/tmp", false),
        ];
        mounts.extend(self.mounts.iter().cloned());
        Container {
            name: name.into(),
            image: Some(self.image.clone()),
            image_pull_policy: Some(self.pull_policy.clone()),
            // The image's `riverbank` binary, found on PATH, so custom images need not copy
            // our ENTRYPOINT.
            command: Some(vec!["riverbank".into()]),
            args: Some(args),
            ports: Some(vec![
                port(service_port.0, service_port.1),
                port("health", HEALTH_PORT),
                port("metrics", METRICS_PORT),
            ]),
            env: Some(self.env.clone()),
            resources: Some(resources),
            // Generous startup: opening sources and compiling the plan can take a while.
            startup_probe: Some(probe("/healthz", 5, 60)),
            liveness_probe: Some(probe("/healthz", 10, 6)),
            readiness_probe: Some(probe("/readyz", 5, 3)),
            security_context: Some(SecurityContext {
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                run_as_non_root: Some(true),
                capabilities: Some(Capabilities {
                    drop: Some(vec!["ALL".into()]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            volume_mounts: Some(mounts),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            ..Default::default()
        }
    }

    /// A pod template under the restricted Pod Security Standard.
    fn template(
        &self,
        ctx: &Ctx,
        component: &str,
        container: Container,
        plan_hash: &str,
        grace_seconds: i64,
    ) -> PodTemplateSpec {
        // User labels first: the operator's (which the selectors match) win.
        let mut pod_labels = self.spec.labels.clone();
        pod_labels.extend(ctx.labels(Some(component)));
        let mut annotations = self.spec.annotations.clone();
        annotations.insert(labels::PLAN_HASH.into(), plan_hash.into());
        let mut volumes = vec![
            Volume {
                name: "plan".into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: plan_config_map_name(&ctx.name),
                    ..Default::default()
                }),
                ..Default::default()
            },
            Volume {
                name: "tmp".into(),
                empty_dir: Some(EmptyDirVolumeSource {
                    size_limit: Some(Quantity("1Gi".into())),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ];
        volumes.extend(self.volumes.iter().cloned());
        let non_empty = |v: &BTreeMap<String, String>| (!v.is_empty()).then(|| v.clone());
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(pod_labels),
                annotations: Some(annotations),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                containers: vec![container],
                volumes: Some(volumes),
                service_account_name: self.service_account.clone(),
                // The pods never call the Kubernetes API: no token to steal.
                automount_service_account_token: Some(false),
                // No Docker-links-style env vars for every Service in the namespace.
                enable_service_links: Some(false),
                security_context: Some(PodSecurityContext {
                    run_as_non_root: Some(true),
                    run_as_user: Some(RUN_AS),
                    run_as_group: Some(RUN_AS),
                    // The disks are writable by the pod's group; only chown them when needed
                    // (a recursive chown of a large disk would delay every start).
                    fs_group: Some(RUN_AS),
                    fs_group_change_policy: Some("OnRootMismatch".into()),
                    seccomp_profile: Some(SeccompProfile {
                        type_: "RuntimeDefault".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                termination_grace_period_seconds: Some(grace_seconds),
                node_selector: non_empty(&self.spec.node_selector),
                tolerations: (!self.spec.tolerations.is_empty())
                    .then(|| self.spec.tolerations.clone()),
                affinity: self.spec.affinity.clone(),
                image_pull_secrets: (!self.spec.image_pull_secrets.is_empty())
                    .then(|| self.spec.image_pull_secrets.clone()),
                ..Default::default()
            }),
        }
    }
}

/// Credential files, grouped by directory: one read-only projected volume per directory, so
/// several keys (of one or more Secrets) can sit side by side, and rotated Secrets show up
/// without a restart (which subPath mounts would prevent).
fn credential_volumes(
    credentials: &[SecretCredential],
) -> Result<(Vec<Volume>, Vec<VolumeMount>), ChildrenError> {
    let mut by_dir: BTreeMap<String, Vec<(&SecretCredential, String)>> = BTreeMap::new();
    let mut files = BTreeSet::new();
    for c in credentials {
        let Some(path) = &c.path else { continue };
        let bad = |reason| ChildrenError::CredentialPath {
            path: path.clone(),
            reason,
        };
        if !path.starts_with('/') || path.ends_with('/') {
            return Err(bad("must be an absolute file path"));
        }
        if path.split('/').any(|s| s == "." || s == "..") {
            return Err(bad("must not contain '.' or '..' segments"));
        }
        let (dir, file) = path.rsplit_once('/').expect("starts with '/'");
        if dir.is_empty() || dir.matches('/').count() < 2 {
            return Err(bad(
                "must be in a directory at least two levels deep, e.g. /var/run/secrets/NAME/FILE (the directory is replaced by a volume)",
            ));
        }
        let under = |root: &str| dir == root || dir.starts_with(&format!("{root}/"));
        if RESERVED_DIRS.iter().any(|r| under(r)) {
            return Err(bad(
                "is under /tmp, /etc/riverbank or /var/lib/riverbank, which the pods use themselves",
            ));
        }
        if SYSTEM_DIRS.iter().any(|r| under(r)) {
            return Err(bad("would hide a system directory of the image"));
        }
        if !files.insert(path.clone()) {
            return Err(bad("is used by more than one credential"));
        }
        by_dir
            .entry(dir.to_string())
            .or_default()
            .push((c, file.to_string()));
    }
    let mut volumes = vec![];
    let mut mounts = vec![];
    for (i, (dir, entries)) in by_dir.into_iter().enumerate() {
        let name = format!("credentials-{i}");
        // One source per Secret, keys in the order the user listed them.
        let mut sources: Vec<SecretProjection> = vec![];
        for (c, file) in entries {
            let item = KeyToPath {
                key: c.key.clone(),
                path: file,
                mode: None,
            };
            match sources.iter_mut().find(|s| s.name == c.name) {
                Some(s) => s.items.get_or_insert_with(Vec::new).push(item),
                None => sources.push(SecretProjection {
                    name: c.name.clone(),
                    items: Some(vec![item]),
                    optional: Some(false),
                }),
            }
        }
        volumes.push(Volume {
            name: name.clone(),
            projected: Some(ProjectedVolumeSource {
                // Readable by the pod's group (fsGroup) only.
                default_mode: Some(0o440),
                sources: Some(
                    sources
                        .into_iter()
                        .map(|s| VolumeProjection {
                            secret: Some(s),
                            ..Default::default()
                        })
                        .collect(),
                ),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name,
            mount_path: dir,
            read_only: Some(true),
            ..Default::default()
        });
    }
    Ok((volumes, mounts))
}

/// spec.pods.resources when set; else the operator's defaults with the resource hints
/// (options.cpuCount, options.minRam) as requests in their place.
fn worker_resources(
    job: &DataflowJob,
    settings: &OperatorSettings,
) -> Result<ResourceRequirements, ChildrenError> {
    if let Some(r) = job.pods().and_then(|p| p.resources.clone()) {
        return Ok(r);
    }
    let options = &job.spec.options;
    let mut resources = settings.worker_resources.clone();
    let requests = resources.requests.get_or_insert_with(BTreeMap::new);
    if let Some(cpu) = options.cpu_count {
        requests.insert("cpu".into(), Quantity(cpu.to_string()));
    }
    if let Some(ram) = &options.min_ram {
        let q = memory_quantity(ram).ok_or_else(|| ChildrenError::MinRam(ram.clone()))?;
        requests.insert("memory".into(), q);
    }
    Ok(resources)
}

/// Cores one worker processes with, as `riverbank worker` sizes its work slots: its harness
/// threads when set, else its CPU limit (what the process sees as available parallelism), else
/// its CPU request; at least 1. The autoscaler compares the job's cores with its active keys.
pub fn worker_cores(job: &DataflowJob, settings: &OperatorSettings) -> u32 {
    if let Some(threads) = job.spec.options.number_of_worker_harness_threads {
        return u32::try_from(threads).unwrap_or(1).max(1);
    }
    let Ok(resources) = worker_resources(job, settings) else {
        return 1;
    };
    let cpu = |m: &Option<BTreeMap<String, Quantity>>| {
        m.as_ref()
            .and_then(|m| m.get("cpu"))
            .and_then(|q| cpu_cores(&q.0))
    };
    cpu(&resources.limits)
        .or_else(|| cpu(&resources.requests))
        .unwrap_or(1)
}

/// A CPU quantity (`2`, `1.5`, `500m`) in whole cores, rounded up.
fn cpu_cores(quantity: &str) -> Option<u32> {
    let q = quantity.trim();
    let cores = match q.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().ok()? / 1000.0,
        None => q.parse::<f64>().ok()?,
    };
    (cores.is_finite() && cores > 0.0).then(|| (cores.ceil() as u32).max(1))
}

/// Beam's resource hint sizes (`16GB`, `16GiB`, bytes) as a Kubernetes quantity (`16G`,
/// `16Gi`). Kubernetes spells the decimal kilo `k`.
pub fn memory_quantity(hint: &str) -> Option<Quantity> {
    let s = hint.trim();
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(digits_end);
    if number.is_empty()
        || number.starts_with('.')
        || number.ends_with('.')
        || number.matches('.').count() > 1
    {
        return None;
    }
    let unit = unit.strip_suffix('B').unwrap_or(unit);
    let unit = match unit {
        "" => "",
        "k" | "K" => "k",
        "Ki" | "KI" | "ki" => "Ki",
        "M" | "G" | "T" | "P" | "E" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => unit,
        _ => return None,
    };
    Some(Quantity(format!("{number}{unit}")))
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
    fn memory_hints_become_quantities() {
        let q = |s: &str| memory_quantity(s).map(|q| q.0);
        assert_eq!(q("16GB").as_deref(), Some("16G"));
        assert_eq!(q("16GiB").as_deref(), Some("16Gi"));
        assert_eq!(q("16Gi").as_deref(), Some("16Gi"));
        assert_eq!(q("512MiB").as_deref(), Some("512Mi"));
        assert_eq!(q("1.5GB").as_deref(), Some("1.5G"));
        assert_eq!(q("640KB").as_deref(), Some("640k"));
        assert_eq!(q("1073741824").as_deref(), Some("1073741824"));
        assert_eq!(q("16 apples"), None);
        assert_eq!(q("GB"), None);
        assert_eq!(q("1..5G"), None);
    }

    #[test]
    fn worker_cores_follow_threads_then_limit_then_request() {
        let settings = OperatorSettings::default();
        let mut job = crate::fixtures::JobBuilder::new("j").build();
        assert_eq!(
            worker_cores(&job, &settings),
            1,
            "the default request, 1 CPU"
        );
        job.spec.options.cpu_count = Some(4);
        assert_eq!(worker_cores(&job, &settings), 4);
        job.spec.pods = Some(crate::crd::PodsSpec {
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([("cpu".into(), Quantity("500m".into()))])),
                limits: Some(BTreeMap::from([("cpu".into(), Quantity("2.5".into()))])),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(worker_cores(&job, &settings), 3, "the limit, rounded up");
        job.spec.options.number_of_worker_harness_threads = Some(6);
        assert_eq!(worker_cores(&job, &settings), 6);
        assert_eq!(cpu_cores("1500m"), Some(2));
        assert_eq!(cpu_cores("lots"), None);
    }

    #[test]
    fn fnv_is_stable() {
        // Pinned: a change would roll every job's pods on upgrade.
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"riverbank"), 0xda1e_d5f7_457b_ea2b);
        assert_eq!(format!("{:016x}", fnv1a64(b"a")), "af63dc4c8601ec8c");
    }
}
