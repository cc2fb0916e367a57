//! The objects that run a job: snapshots of every object for the taxi example, and targeted
//! checks of what must hold for any job (owner references, Pod Security, disks, replicas,
//! credentials).
mod common;

use common::{check_snapshot, taxi_job};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use riverbank_operator::children::{self, Children, ChildrenError, desired_children};
use riverbank_operator::crd::{PodsSpec, SecretCredential};
use riverbank_operator::lifecycle::Replicas;
use riverbank_operator::scaling;
use riverbank_operator::{DataflowJob, OperatorSettings};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;

const REGENERATE: &str = "UPDATE_SNAPSHOTS=1 cargo test -p riverbank-operator --test children";

/// The children with the pod counts the reconciler would decide (no autoscaler decision yet).
fn children_of(job: &DataflowJob) -> Result<Children, ChildrenError> {
    let replicas = scaling::replicas(job, None);
    desired_children(
        job,
        &job.plan().unwrap(),
        &OperatorSettings::default(),
        replicas,
    )
}

fn taxi_children() -> Children {
    children_of(&taxi_job()).unwrap()
}

/// YAML of an object with what depends on other crates' serialization (the full plan JSON
/// and its hash) replaced by placeholders; those are checked by their own tests below.
fn snapshot_yaml(object: &impl Serialize) -> String {
    let mut v = serde_json::to_value(object).unwrap();
    if let Some(plan) = v.pointer_mut("/data/plan.json") {
        *plan = json!("<the serialized riverbank_pipeline::Plan; see plan_json_round_trips>");
    }
    if let Some(hash) =
        v.pointer_mut("/spec/template/metadata/annotations/riverbank.dev~1plan-hash")
    {
        *hash = json!("<hash of plan.json>");
    }
    serde_norway::to_string(&v).unwrap()
}

#[test]
fn taxi_snapshots() {
    let c = taxi_children();
    check_snapshot(
        "operator/tests/snapshots/taxi-plan-configmap.yaml",
        &snapshot_yaml(&c.plan),
        REGENERATE,
    );
    check_snapshot(
        "operator/tests/snapshots/taxi-service.yaml",
        &snapshot_yaml(&c.service),
        REGENERATE,
    );
    check_snapshot(
        "operator/tests/snapshots/taxi-coordinator.yaml",
        &snapshot_yaml(&c.coordinator),
        REGENERATE,
    );
    check_snapshot(
        "operator/tests/snapshots/taxi-workers.yaml",
        &snapshot_yaml(&c.workers),
        REGENERATE,
    );
}

#[test]
fn plan_json_round_trips_and_its_hash_follows_it() {
    let job = taxi_job();
    let plan = job.plan().unwrap();
    let c = taxi_children();
    let data = c.plan.data.as_ref().unwrap();
    let back: riverbank_pipeline::Plan = serde_json::from_str(&data["plan.json"]).unwrap();
    assert_eq!(
        back, plan,
        "the coordinator reads back exactly the operator's plan"
    );
    let stages: Value = serde_json::from_str(&data["stages.json"]).unwrap();
    assert_eq!(stages.as_array().unwrap().len(), plan.stages.len());

    let hash = |c: &Children| {
        [&c.coordinator, &c.workers].map(|s| {
            s.spec
                .as_ref()
                .unwrap()
                .template
                .metadata
                .as_ref()
                .unwrap()
                .annotations
                .as_ref()
                .unwrap()["riverbank.dev/plan-hash"]
                .clone()
        })
    };
    let [h1, h2] = hash(&c);
    assert_eq!(h1, h2);
    assert_eq!(h1.len(), 16);
    assert_eq!(hash(&taxi_children()), [h1.clone(), h2], "deterministic");
    let mut changed = taxi_job();
    changed.spec.pipeline.as_mut().unwrap()["transforms"][1]["config"]["keep"] =
        json!("total_amount > 1");
    assert_ne!(
        hash(&children_of(&changed).unwrap())[0],
        h1,
        "a new plan restarts the pods"
    );
}

#[test]
fn every_child_is_owned_by_the_job_and_labelled() {
    let c = taxi_children();
    let metas = [
        &c.plan.metadata,
        &c.service.metadata,
        &c.coordinator.metadata,
        &c.workers.metadata,
    ];
    for m in metas {
        let owners = m.owner_references.as_ref().unwrap();
        assert_eq!(owners.len(), 1);
        let o = &owners[0];
        assert_eq!(
            (o.api_version.as_str(), o.kind.as_str(), o.name.as_str()),
            ("riverbank.dev/v1alpha1", "DataflowJob", "nyc-taxi")
        );
        assert_eq!(o.uid, "3f6b1c2e-8d4a-4f0e-9b7a-2c5d8e1f0a93");
        assert_eq!(
            (o.controller, o.block_owner_deletion),
            (Some(true), Some(true))
        );
        assert_eq!(m.namespace.as_deref(), Some("data-eng"));
        let l = m.labels.as_ref().unwrap();
        assert_eq!(l["app.kubernetes.io/name"], "riverbank");
        assert_eq!(l["app.kubernetes.io/instance"], "nyc-taxi");
        assert_eq!(l["riverbank.dev/job"], "nyc-taxi");
    }
    for (sts, component) in [(&c.coordinator, "coordinator"), (&c.workers, "worker")] {
        assert_eq!(
            sts.metadata.labels.as_ref().unwrap()["app.kubernetes.io/component"],
            component
        );
        let spec = sts.spec.as_ref().unwrap();
        let selector = spec.selector.match_labels.as_ref().unwrap();
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap();
        for (k, v) in selector {
            assert_eq!(
                pod_labels.get(k),
                Some(v),
                "pods match their StatefulSet's selector"
            );
        }
        assert_eq!(pod_labels["app.kubernetes.io/component"], component);
        assert_eq!(spec.service_name.as_deref(), Some("nyc-taxi-headless"));
    }
}

fn pod(sts: &StatefulSet) -> &PodSpec {
    sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
}

fn container(sts: &StatefulSet) -> &Container {
    &pod(sts).containers[0]
}

/// The restricted Pod Security Standard (https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted),
/// as the admission controller checks it.
fn assert_restricted(p: &PodSpec) {
    let psc = p.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_ne!(psc.run_as_user, Some(0));
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    assert!(p.host_network.is_none() && p.host_pid.is_none() && p.host_ipc.is_none());
    for v in p.volumes.as_ref().unwrap() {
        let allowed = v.config_map.is_some()
            || v.empty_dir.is_some()
            || v.projected.is_some()
            || v.secret.is_some()
            || v.persistent_volume_claim.is_some()
            || v.downward_api.is_some();
        assert!(
            allowed && v.host_path.is_none(),
            "volume {} is not allowed under restricted",
            v.name
        );
    }
    for c in &p.containers {
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.run_as_non_root, Some(true));
        assert!(sc.privileged.is_none() || sc.privileged == Some(false));
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert!(caps.add.is_none());
        for port in c.ports.iter().flatten() {
            assert!(port.host_port.is_none());
        }
    }
}

#[test]
fn pods_meet_the_restricted_pod_security_standard() {
    let c = taxi_children();
    for sts in [&c.coordinator, &c.workers] {
        let p = pod(sts);
        assert_restricted(p);
        assert_eq!(p.automount_service_account_token, Some(false));
        let c = container(sts);
        // /tmp is writable although the root file system is not.
        let tmp = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.mount_path == "/tmp")
            .unwrap();
        let vol = p
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == tmp.name)
            .unwrap();
        assert!(vol.empty_dir.is_some());
        // Probes on the named health port, metrics on a named port.
        for probe in [&c.readiness_probe, &c.liveness_probe, &c.startup_probe] {
            let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
            assert_eq!(
                get.port,
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("health".into())
            );
        }
        let ports: Vec<(&str, i32)> = c
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| (p.name.as_deref().unwrap(), p.container_port))
            .collect();
        assert!(ports.contains(&("metrics", children::METRICS_PORT)));
        assert!(ports.contains(&("health", children::HEALTH_PORT)));
    }
}

#[test]
fn disks_are_per_pod_claims_deleted_with_the_job_and_kept_on_scale_down() {
    let c = taxi_children();
    let workers = c.workers.spec.as_ref().unwrap();
    let claims = workers.volume_claim_templates.as_ref().unwrap();
    assert_eq!(claims.len(), 1);
    let claim = claims[0].spec.as_ref().unwrap();
    // examples/taxi: diskSizeGb 10, no workerDiskType (the cluster's default StorageClass).
    assert_eq!(
        claim.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"],
        Quantity("10Gi".into())
    );
    assert_eq!(claim.storage_class_name, None);
    assert_eq!(
        claim.access_modes.as_deref(),
        Some(&["ReadWriteOnce".to_string()][..])
    );
    let mounted = container(&c.workers)
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.mount_path == children::DATA_DIR)
        .unwrap();
    assert_eq!(mounted.name, claims[0].metadata.name.clone().unwrap());
    for sts in [&c.coordinator, &c.workers] {
        let policy = sts
            .spec
            .as_ref()
            .unwrap()
            .persistent_volume_claim_retention_policy
            .as_ref()
            .unwrap();
        assert_eq!(policy.when_deleted.as_deref(), Some("Delete"));
        assert_eq!(policy.when_scaled.as_deref(), Some("Retain"));
    }

    let mut job = taxi_job();
    job.spec.options.worker_disk_type = Some("fast-ssd".into());
    job.spec.options.disk_size_gb = None;
    let c = children_of(&job).unwrap();
    let claim = c
        .workers
        .spec
        .as_ref()
        .unwrap()
        .volume_claim_templates
        .as_ref()
        .unwrap()[0]
        .spec
        .clone()
        .unwrap();
    assert_eq!(claim.storage_class_name.as_deref(), Some("fast-ssd"));
    assert_eq!(
        claim.resources.unwrap().requests.unwrap()["storage"],
        Quantity("250Gi".into()),
        "Dataflow's batch default"
    );
    job.spec.options.streaming = Some(true);
    let c = children_of(&job).unwrap();
    let claim = c
        .workers
        .spec
        .as_ref()
        .unwrap()
        .volume_claim_templates
        .as_ref()
        .unwrap()[0]
        .spec
        .clone()
        .unwrap();
    assert_eq!(
        claim.resources.unwrap().requests.unwrap()["storage"],
        Quantity("400Gi".into()),
        "Dataflow's streaming default"
    );
    let settings = OperatorSettings {
        default_disk_size_gb: Some(20),
        ..Default::default()
    };
    let c = desired_children(
        &job,
        &job.plan().unwrap(),
        &settings,
        scaling::replicas(&job, None),
    )
    .unwrap();
    let claim = c
        .workers
        .spec
        .as_ref()
        .unwrap()
        .volume_claim_templates
        .as_ref()
        .unwrap()[0]
        .spec
        .clone()
        .unwrap();
    assert_eq!(
        claim.resources.unwrap().requests.unwrap()["storage"],
        Quantity("20Gi".into()),
        "the administrator's default"
    );
}

fn replicas(c: &Children) -> (i32, i32) {
    (
        c.coordinator.spec.as_ref().unwrap().replicas.unwrap(),
        c.workers.spec.as_ref().unwrap().replicas.unwrap(),
    )
}

/// The pod counts are decided in one place (`scaling::replicas`, tested there); the children
/// carry exactly what they are given.
#[test]
fn stateful_sets_carry_the_decided_replicas() {
    // Taxi: autoscaling, maxNumWorkers 4, no numWorkers: starts with Dataflow's 3.
    assert_eq!(replicas(&taxi_children()), (1, 3));
    let job = taxi_job();
    let plan = job.plan().unwrap();
    let settings = OperatorSettings::default();
    for (coordinator, workers) in [(1, 7), (0, 0), (1, 1)] {
        let c = desired_children(
            &job,
            &plan,
            &settings,
            Replicas {
                coordinator,
                workers,
            },
        )
        .unwrap();
        assert_eq!(replicas(&c), (coordinator, workers));
    }
}

#[test]
fn pod_arguments_are_the_runtime_entry_points() {
    let c = taxi_children();
    let args = container(&c.coordinator).args.clone().unwrap();
    assert_eq!(
        &args[..3],
        ["coordinator", "--plan", "/etc/riverbank/plan.json"]
    );
    let args = container(&c.workers).args.clone().unwrap();
    assert_eq!(args[0], "worker");
    let at = args.iter().position(|a| a == "--coordinator").unwrap();
    assert_eq!(
        args[at + 1],
        "nyc-taxi-coordinator-0.nyc-taxi-headless.data-eng.svc.cluster.local:7070"
    );
    assert_eq!(
        container(&c.workers).command.as_deref(),
        Some(&["riverbank".to_string()][..])
    );

    let mut job = taxi_job();
    job.spec.options.number_of_worker_harness_threads = Some(8);
    let args = container(&children_of(&job).unwrap().workers)
        .args
        .clone()
        .unwrap();
    assert!(args.windows(2).any(|w| w == ["--slots", "8"]));
}

fn requests(c: &Container) -> BTreeMap<String, Quantity> {
    c.resources.as_ref().unwrap().requests.clone().unwrap()
}

#[test]
fn resources_come_from_hints_or_the_spec() {
    let c = taxi_children();
    assert_eq!(
        requests(container(&c.workers))["cpu"],
        Quantity("1".into()),
        "operator default"
    );
    let mut job = taxi_job();
    job.spec.options.cpu_count = Some(4);
    job.spec.options.min_ram = Some("16GB".into());
    let c = children_of(&job).unwrap();
    let r = requests(container(&c.workers));
    assert_eq!((r["cpu"].0.as_str(), r["memory"].0.as_str()), ("4", "16G"));
    assert!(
        container(&c.workers)
            .resources
            .as_ref()
            .unwrap()
            .limits
            .is_none(),
        "hints are requests, not limits"
    );
    assert_eq!(
        requests(container(&c.coordinator))["memory"],
        Quantity("512Mi".into()),
        "the coordinator keeps its own"
    );

    let explicit = ResourceRequirements {
        limits: Some(BTreeMap::from([(
            "memory".to_string(),
            Quantity("8Gi".into()),
        )])),
        requests: Some(BTreeMap::from([("cpu".to_string(), Quantity("2".into()))])),
        ..Default::default()
    };
    job.spec.pods = Some(PodsSpec {
        resources: Some(explicit.clone()),
        ..Default::default()
    });
    let c = children_of(&job).unwrap();
    assert_eq!(container(&c.workers).resources.as_ref(), Some(&explicit));

    job.spec.pods = None;
    job.spec.options.min_ram = Some("lots".into());
    assert!(matches!(children_of(&job), Err(ChildrenError::MinRam(_))));
}

fn credential(name: &str, key: &str, env: Option<&str>, path: Option<&str>) -> SecretCredential {
    SecretCredential {
        name: name.into(),
        key: key.into(),
        env: env.map(String::from),
        path: path.map(String::from),
    }
}

#[test]
fn worker_block_customizes_both_pods_and_secrets_stay_references() {
    let mut job = taxi_job();
    job.spec.pods = Some(PodsSpec {
        image: Some("registry.example/riverbank:1.2.3".into()),
        service_account_name: Some("taxi-jobs".into()),
        labels: BTreeMap::from([
            ("team".into(), "data".into()),
            ("app.kubernetes.io/name".into(), "mine".into()),
        ]),
        annotations: BTreeMap::from([("example.com/cost-center".into(), "42".into())]),
        node_selector: BTreeMap::from([("pool".into(), "batch".into())]),
        env: vec![k8s_openapi::api::core::v1::EnvVar {
            name: "RUST_LOG".into(),
            value: Some("debug".into()),
            ..Default::default()
        }],
        credentials: vec![
            credential("s3-keys", "id", Some("AWS_ACCESS_KEY_ID"), None),
            credential("s3-keys", "secret", Some("AWS_SECRET_ACCESS_KEY"), None),
            credential(
                "gcp",
                "key.json",
                None,
                Some("/var/run/secrets/cloud/gcp.json"),
            ),
            credential(
                "azure",
                "token",
                None,
                Some("/var/run/secrets/cloud/azure-token"),
            ),
            credential(
                "gcp",
                "other.json",
                None,
                Some("/var/run/secrets/other/other.json"),
            ),
        ],
        ..Default::default()
    });
    let c = children_of(&job).unwrap();
    for sts in [&c.coordinator, &c.workers] {
        let p = pod(sts);
        assert_restricted(p);
        assert_eq!(p.service_account_name.as_deref(), Some("taxi-jobs"));
        assert_eq!(p.node_selector.as_ref().unwrap()["pool"], "batch");
        let meta = sts
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap();
        let labels = meta.labels.as_ref().unwrap();
        assert_eq!(labels["team"], "data");
        assert_eq!(
            labels["app.kubernetes.io/name"], "riverbank",
            "the operator's labels win"
        );
        assert_eq!(
            meta.annotations.as_ref().unwrap()["example.com/cost-center"],
            "42"
        );
        let ctr = container(sts);
        assert_eq!(
            ctr.image.as_deref(),
            Some("registry.example/riverbank:1.2.3")
        );
        let env = ctr.env.as_ref().unwrap();
        let secret_env = env
            .iter()
            .find(|e| e.name == "AWS_SECRET_ACCESS_KEY")
            .unwrap();
        assert!(secret_env.value.is_none(), "never a value: a reference");
        let r = secret_env
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!((r.name.as_str(), r.key.as_str()), ("s3-keys", "secret"));
        assert!(env.iter().any(|e| e.name == "RUST_LOG"));
        // Files: one projected volume per directory, mounted read-only.
        let mounts: Vec<_> = ctr
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .filter(|m| m.name.starts_with("credentials-"))
            .collect();
        assert_eq!(
            mounts
                .iter()
                .map(|m| m.mount_path.as_str())
                .collect::<Vec<_>>(),
            ["/var/run/secrets/cloud", "/var/run/secrets/other"]
        );
        assert!(mounts.iter().all(|m| m.read_only == Some(true)));
        let vol = p
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == mounts[0].name)
            .unwrap();
        let sources = vol.projected.as_ref().unwrap().sources.as_ref().unwrap();
        let files: Vec<(String, String, String)> = sources
            .iter()
            .flat_map(|s| {
                let s = s.secret.as_ref().unwrap();
                s.items
                    .iter()
                    .flatten()
                    .map(|i| (s.name.clone(), i.key.clone(), i.path.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(
            files,
            [
                ("gcp".into(), "key.json".into(), "gcp.json".into()),
                ("azure".into(), "token".into(), "azure-token".into())
            ]
        );
    }
    // Nothing in any generated object carries secret material: only Secret names and keys.
    let text = serde_json::to_string(&c).unwrap();
    assert!(!text.contains("\"kind\":\"Secret\""));
}

#[test]
fn mistakes_the_schema_cannot_catch_are_errors() {
    let with_worker = |w: PodsSpec| {
        let mut job = taxi_job();
        job.spec.pods = Some(w);
        children_of(&job)
    };
    let env = |name: &str| k8s_openapi::api::core::v1::EnvVar {
        name: name.into(),
        value: Some("x".into()),
        ..Default::default()
    };
    assert!(matches!(
        with_worker(PodsSpec {
            env: vec![env("POD_NAME")],
            ..Default::default()
        }),
        Err(ChildrenError::ReservedEnv(_))
    ));
    assert!(matches!(
        with_worker(PodsSpec {
            env: vec![env("RIVERBANK_JOB")],
            ..Default::default()
        }),
        Err(ChildrenError::ReservedEnv(_))
    ));
    let dup = PodsSpec {
        env: vec![env("TOKEN")],
        credentials: vec![credential("s", "k", Some("TOKEN"), None)],
        ..Default::default()
    };
    assert!(matches!(with_worker(dup), Err(ChildrenError::DuplicateEnv(n)) if n == "TOKEN"));
    for bad in [
        "/key.json",
        "/etc/key.json",
        "/tmp/x/key",
        "/var/lib/riverbank/key",
        "/etc/riverbank/key",
        "/usr/local/key",
        "/etc/ssl/certs/ca.pem",
        "/var/run/../key/x",
    ] {
        let w = PodsSpec {
            credentials: vec![credential("s", "k", None, Some(bad))],
            ..Default::default()
        };
        assert!(
            matches!(with_worker(w), Err(ChildrenError::CredentialPath { .. })),
            "{bad} should be refused"
        );
    }
    let twice = PodsSpec {
        credentials: vec![
            credential("a", "k", None, Some("/var/run/x/k")),
            credential("b", "k", None, Some("/var/run/x/k")),
        ],
        ..Default::default()
    };
    assert!(matches!(
        with_worker(twice),
        Err(ChildrenError::CredentialPath { .. })
    ));

    let mut job = taxi_job();
    job.metadata.uid = None;
    assert!(matches!(
        children_of(&job),
        Err(ChildrenError::MissingMetadata("uid"))
    ));

    // A plan a ConfigMap cannot hold: many inline elements.
    let mut job = taxi_job();
    let elements: Vec<Value> = (0..30_000)
        .map(|i| json!({"id": i, "text": "a row of inline test data"}))
        .collect();
    job.spec.pipeline = Some(
        json!({"transforms": [
            {"type": "Create", "name": "Rows", "config": {"elements": elements}},
            {"type": "LogForTesting", "name": "Log", "input": "Rows"},
        ]})
        .as_object()
        .unwrap()
        .clone(),
    );
    let plan = job.plan().unwrap();
    assert!(matches!(
        desired_children(
            &job,
            &plan,
            &OperatorSettings::default(),
            scaling::replicas(&job, None)
        ),
        Err(ChildrenError::PlanTooLarge { .. })
    ));
}

#[test]
fn coordinator_address_and_names() {
    assert_eq!(
        children::coordinator_address("j", "ns", "cluster.local"),
        "j-coordinator-0.j-headless.ns.svc.cluster.local:7070"
    );
    let c = taxi_children();
    assert_eq!(c.plan.metadata.name.as_deref(), Some("nyc-taxi-plan"));
    assert_eq!(
        c.coordinator.metadata.name.as_deref(),
        Some("nyc-taxi-coordinator")
    );
    assert_eq!(c.workers.metadata.name.as_deref(), Some("nyc-taxi-worker"));
    let svc = c.service.spec.as_ref().unwrap();
    assert_eq!(svc.cluster_ip.as_deref(), Some("None"));
    assert_eq!(svc.publish_not_ready_addresses, Some(true));
    // The longest name the CRD allows still gives valid pod labels (63 characters).
    let longest = "a".repeat(riverbank_operator::crd::MAX_JOB_NAME_LEN);
    assert!(children::coordinator_name(&longest).len() + 11 <= 63);
}

/// id, name, kind, component transforms, inputs, outputs.
type Stage = (
    String,
    String,
    String,
    Vec<String>,
    Vec<String>,
    Vec<String>,
);

/// status.stages is built from the typed plan; it must say what `riverbank plan --format json`
/// (Dataflow's `executionPipelineStage`) says, for every kind of op and exchange.
#[test]
fn stages_match_the_plan_display() {
    let mut job = taxi_job();
    job.spec.pipeline = Some(json!({"transforms": [
        {"type": "Create", "name": "Rows", "config": {"elements": [{"k": "a", "v": 1}]}},
        {"type": "Reshuffle", "name": "Spread", "input": "Rows"},
        {"type": "Sql", "name": "Query", "input": "Spread", "config": {"query": "SELECT k, SUM(v) AS v FROM PCOLLECTION GROUP BY k"}},
        {"type": "Combine", "name": "PerKey", "input": "Rows", "config": {"group_by": ["k"], "combine": {"v": "sum"}}},
        {"type": "LogForTesting", "name": "Log", "input": "Query"},
        {"type": "LogForTesting", "name": "Log2", "input": "PerKey"}
    ]})
    .as_object()
    .unwrap()
    .clone());
    for job in [taxi_job(), job] {
        let plan = job.plan().unwrap();
        let shown = riverbank_pipeline::display::to_json(&plan);
        let text = |v: &Value, k: &str| v[k].as_str().unwrap().to_string();
        let expected: Vec<Stage> = shown["executionPipelineStage"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let list = |k: &str| s[k].as_array().unwrap().clone();
                (
                    text(s, "id"),
                    text(s, "name"),
                    text(s, "kind"),
                    list("componentTransform")
                        .iter()
                        .map(|c| text(c, "userName"))
                        .collect(),
                    list("inputSource")
                        .iter()
                        .map(|i| {
                            let from: Vec<String> = i["fromStages"]
                                .as_array()
                                .unwrap()
                                .iter()
                                .map(|f| f.as_str().unwrap().to_string())
                                .collect();
                            format!(
                                "{} <- {} via {}",
                                text(i, "userName"),
                                from.join(", "),
                                text(i, "shuffle")
                            )
                        })
                        .collect(),
                    list("outputSource")
                        .iter()
                        .map(|o| format!("{} -> {}", text(o, "userName"), text(o, "shuffle")))
                        .collect(),
                )
            })
            .collect();
        let actual: Vec<_> = riverbank_operator::crd::StageStatus::from_plan(&plan)
            .into_iter()
            .map(|s| {
                (
                    s.id,
                    s.name,
                    s.kind,
                    s.component_transforms,
                    s.inputs,
                    s.outputs,
                )
            })
            .collect();
        assert_eq!(actual, expected);
        assert!(actual.len() >= 3, "{actual:?}");
    }
}

/// The pod contract (operator/README.md, "The pod contract"): the flags `riverbank coordinator`
/// and `riverbank worker` must get, each with a value. Written out here, not taken from the
/// code, so that dropping or renaming one fails this test (the CLI's test only checks that the
/// binary accepts what the snapshots hold).
#[test]
fn pods_get_every_flag_of_the_pod_contract() {
    const COORDINATOR: &[&str] = &[
        "--plan",
        "--port",
        "--state-dir",
        "--health-port",
        "--metrics-port",
    ];
    const WORKER: &[&str] = &[
        "--coordinator",
        "--plan",
        "--port",
        "--advertise",
        "--data-dir",
        "--health-port",
        "--metrics-port",
    ];
    let flags = |args: &[String]| -> Vec<String> {
        args.iter()
            .filter(|a| a.starts_with("--"))
            .cloned()
            .collect()
    };
    let mut job = taxi_job();
    job.spec.options.number_of_worker_harness_threads = Some(4);
    let c = children_of(&job).unwrap();
    for (sts, entry, required, optional) in [
        (&c.coordinator, "coordinator", COORDINATOR, &[][..]),
        (&c.workers, "worker", WORKER, &["--slots"][..]),
    ] {
        let args = container(sts).args.clone().unwrap();
        assert_eq!(args[0], entry);
        for flag in required.iter().chain(optional) {
            let at = args
                .iter()
                .position(|a| a == flag)
                .unwrap_or_else(|| panic!("riverbank {entry} misses {flag}: {args:?}"));
            let value = args.get(at + 1).map(String::as_str).unwrap_or("--");
            assert!(!value.starts_with("--"), "{flag} has no value: {args:?}");
        }
        let mut expected: Vec<String> = required
            .iter()
            .chain(optional)
            .map(|f| f.to_string())
            .collect();
        expected.sort();
        let mut actual = flags(&args);
        actual.sort();
        assert_eq!(
            actual, expected,
            "riverbank {entry}: flags outside the contract"
        );
    }
}

/// A Beam SDK pipeline's job: its pod is the runner harness (in the coordinator's place, with the
/// workers' resources) and the SDK container beside it, Beam's worker pool on the pipeline's
/// image; no worker pods. The runner's arguments are the pod contract `riverbank
/// runner-harness` parses (`cli/src/main.rs`'s tests read this snapshot).
#[test]
fn a_beam_sdk_job_runs_a_runner_pod_and_sdk_worker_pods() {
    let mut job = taxi_job();
    job.spec.pipeline = None;
    job.spec.options.num_workers = Some(2);
    job.spec.beam_pipeline = Some(riverbank_operator::crd::BeamPipelineSpec {
        location: "s3://riverbank-examples/beam/wordcount-1/".into(),
        sdk_container_image: "example.com/beam-python-sdk:2.77.0".into(),
        sdk_container_args: None,
        sdk_worker_parallelism: Some(3),
    });
    let c = children_of(&job).unwrap();
    check_snapshot(
        "operator/tests/snapshots/beam-sdk-runner.yaml",
        &snapshot_yaml(&c.coordinator),
        REGENERATE,
    );
    check_snapshot(
        "operator/tests/snapshots/beam-sdk-workers.yaml",
        &snapshot_yaml(&c.workers),
        REGENERATE,
    );
    assert_eq!(c.coordinator.spec.as_ref().unwrap().replicas, Some(1));
    let workers = c.workers.spec.as_ref().unwrap();
    assert_eq!(workers.replicas, Some(2), "numWorkers SDK worker pods");
    assert!(workers.volume_claim_templates.is_none(), "no disks");
    let [runner] = pod(&c.coordinator).containers.as_slice() else {
        panic!("the runner alone: {:?}", pod(&c.coordinator).containers);
    };
    let args = runner.args.clone().unwrap();
    assert_eq!(args[0], "runner-harness");
    let at = |flag: &str| {
        let i = args.iter().position(|a| a == flag).unwrap();
        args[i + 1].clone()
    };
    let all = |flag: &str| -> Vec<String> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].clone())
            .collect()
    };
    assert_eq!(
        at("--pipeline-location"),
        "s3://riverbank-examples/beam/wordcount-1/"
    );
    // Each SDK worker pod's pool by its stable name, and the runner's own for dialling back.
    assert_eq!(
        all("--sdk-worker-pool"),
        [
            "nyc-taxi-worker-0.nyc-taxi-headless.data-eng.svc.cluster.local:50000",
            "nyc-taxi-worker-1.nyc-taxi-headless.data-eng.svc.cluster.local:50000"
        ]
    );
    assert_eq!(at("--sdk-workers"), "3");
    assert_eq!(at("--fn-api-bind"), "0.0.0.0:7072");
    assert_eq!(at("--fn-api-advertise"), "$(POD_IP)");
    let pod_ip = runner
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "POD_IP")
        .unwrap();
    let field = pod_ip
        .value_from
        .as_ref()
        .unwrap()
        .field_ref
        .as_ref()
        .unwrap();
    assert_eq!(field.field_path, "status.podIP");
    let [sdk] = pod(&c.workers).containers.as_slice() else {
        panic!("the SDK container alone: {:?}", pod(&c.workers).containers);
    };
    assert_eq!(
        sdk.image.as_deref(),
        Some("example.com/beam-python-sdk:2.77.0")
    );
    assert_eq!(sdk.args, Some(vec!["--worker_pool".to_string()]));
    let security = sdk.security_context.as_ref().unwrap();
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    // The user's code gets the job's credentials, as the runner does.
    let names =
        |c: &Container| -> Vec<String> { c.env.iter().flatten().map(|e| e.name.clone()).collect() };
    for name in names(runner).iter().filter(|n| n.starts_with("AWS_")) {
        assert!(names(sdk).contains(name), "{name}");
    }
    assert_eq!(runner.resources, sdk.resources);

    // Only the job's own pods reach its pools and Fn API; the operator, the kubelet and a
    // scraper reach the ports they use.
    let policy = c.network_policy.expect("an SDK job's NetworkPolicy");
    let spec = policy.spec.unwrap();
    let job_label = BTreeMap::from([("riverbank.dev/job".to_string(), "nyc-taxi".to_string())]);
    assert_eq!(
        spec.pod_selector.unwrap().match_labels,
        Some(job_label.clone())
    );
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
    let ingress = spec.ingress.unwrap();
    let from_job = ingress[0].from.as_ref().unwrap()[0].pod_selector.clone();
    assert_eq!(from_job.unwrap().match_labels, Some(job_label));
    assert!(
        ingress[0].ports.is_none(),
        "any port between the job's pods"
    );
    let open: Vec<String> = ingress[1]
        .ports
        .iter()
        .flatten()
        .map(|p| format!("{:?}", p.port.as_ref().unwrap()))
        .collect();
    assert_eq!(
        open,
        [
            r#"String("coordinator")"#,
            r#"String("health")"#,
            r#"String("metrics")"#
        ]
    );
    assert!(ingress[1].from.is_none());
    // A YAML job's pods have none (yet).
    assert!(children_of(&taxi_job()).unwrap().network_policy.is_none());
}

/// A pipeline with a `PyTransform` (run by Beam's Python SDK in the coordinator and the
/// workers) gets the worker image with Beam unless the job names its own image; a streaming one
/// is refused naming the transform (the coordinator's engine runs a PyTransform in batch only).
#[test]
fn a_py_transform_runs_on_the_worker_image_with_beam_and_only_in_batch() {
    let job_with = |streaming: bool, image: Option<&str>| {
        let mut job: DataflowJob = serde_json::from_value(json!({
            "apiVersion": "riverbank.dev/v1alpha1",
            "kind": "DataflowJob",
            "metadata": {"name": "squares", "namespace": "data-eng", "uid": "u-1"},
            "spec": {
                "pipeline": {"transforms": [
                    {"type": "Create", "name": "Numbers", "config": {"elements": [{"n": 1}, {"n": 2}]}},
                    {"type": "PyTransform", "name": "Squares", "input": "Numbers",
                     "config": {"constructor": "apache_beam.Map", "args": ["lambda r: r.n * r.n"]}},
                    {"type": "WriteToJson", "input": "Squares", "config": {"path": "/tmp/out/squares.jsonl"}},
                ]},
                "options": {"streaming": streaming, "tempLocation": "s3://b/tmp"},
            },
        }))
        .unwrap();
        if let Some(image) = image {
            job.spec.pods = Some(PodsSpec {
                image: Some(image.into()),
                ..Default::default()
            });
        }
        job
    };
    let settings = OperatorSettings::default();
    let images = |c: &Children| {
        [&c.coordinator, &c.workers].map(|sts| container(sts).image.as_deref().unwrap().to_string())
    };
    let both = |image: &str| [image.to_string(), image.to_string()];

    let beam = children_of(&job_with(false, None)).unwrap();
    assert_eq!(images(&beam), both(&settings.beam_worker_image));
    assert!(
        settings
            .beam_worker_image
            .starts_with("riverbank/worker-beam:")
    );
    let own = children_of(&job_with(false, Some("registry.example/mine:1"))).unwrap();
    assert_eq!(images(&own), both("registry.example/mine:1"));
    assert_eq!(images(&taxi_children()), both(&settings.worker_image));

    let err = job_with(true, None).plan().unwrap_err().to_string();
    assert!(
        err.contains("Squares") && err.contains("batch DataflowJobs only"),
        "{err}"
    );
}
