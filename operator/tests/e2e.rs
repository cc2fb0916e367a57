//! End-to-end: the operator on a real cluster runs the taxi job to Done, and cleans up after a
//! job deleted while it runs. Ignored (reported as skipped) unless run with `--ignored`, and
//! then RIVERBANK_E2E_KUBECONFIG must name a kubeconfig (see e2e/README.md).
//!
//! Needs only the project's own images (`riverbank/operator`, `riverbank/worker`, loaded into
//! the cluster) and an S3-compatible server that both this test and the pods reach, given by
//! RIVERBANK_E2E_S3_* (any server: s3s-fs, MinIO, Ceph, a cloud bucket); no third-party image.
//!
//! Steps: apply the CRD; `helm upgrade --install` the chart (operator watching one namespace);
//! generate taxi trips with the worker image and copy them into the bucket (`riverbank run` of
//! a copy pipeline, in a pod); apply examples/taxi/dataflowjob.yaml pointed at that bucket; wait
//! for Done, and time how long its pods take to go after Done; read the outputs back and check
//! them; check no temporary object is left; delete the job and wait until every object it owned
//! is gone. Then a streaming job that runs until it is deleted, deleted while it runs: the
//! finalizer has its coordinator cancel it, and no temporary object (`.temp-riverbank-*`) may
//! remain in the bucket. Then streaming from a Kafka broker pod: a job drained, another updated.
mod common;

use common::root;
use futures::TryStreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, CustomResourceExt, Resource};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use riverbank_operator::DataflowJob;
use riverbank_operator::crd::{JobState, UpdatePhase};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use std::fmt::Debug;
use std::process::Command;
use std::time::{Duration, Instant};

const NS: &str = "riverbank-e2e";
const JOB: &str = "nyc-taxi";
/// A batch job with a `language: python` callable.
const PYTHON_JOB: &str = "python-squares";
/// A batch job with a `PyTransform` (Beam's Python SDK, on the worker image with Beam).
const PY_TRANSFORM_JOB: &str = "py-transform-squares";
/// The job deleted while it runs (an unbounded streaming job: it runs until deleted).
const CANCELLED_JOB: &str = "stream-deleted";
const TRIPS: u64 = 20_000;
/// The streaming jobs: one drained, one updated; the events they count.
const DRAINED_JOB: &str = "stream-drained";
const UPDATED_JOB: &str = "stream-updated";
const STREAM_EVENTS: u64 = 20_000;
const MANAGER: &str = "riverbank-e2e";
/// Worker pods get 60 s after SIGTERM, the coordinator 30 s: after Done they must be gone well
/// before either (a process that ignores SIGTERM sits in Terminating for the whole period).
const POD_EXIT_LIMIT: Duration = Duration::from_secs(20);

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// Ignored by default, so the test runner reports it as skipped: it needs a cluster.
/// `RIVERBANK_E2E_KUBECONFIG=... cargo test -p riverbank-operator --test e2e -- --ignored`.
#[tokio::test]
#[ignore = "needs a Kubernetes cluster: set RIVERBANK_E2E_KUBECONFIG and run with --ignored (e2e/README.md)"]
async fn taxi_job_runs_to_done_and_cleans_up() {
    let kubeconfig = std::env::var_os("RIVERBANK_E2E_KUBECONFIG").expect(
        "set RIVERBANK_E2E_KUBECONFIG to a kubeconfig of a disposable cluster; see e2e/README.md",
    );
    let s3 = S3::from_env().unwrap_or_else(|e| panic!("{e}"));
    let kubeconfig = std::path::PathBuf::from(kubeconfig);
    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig).expect("RIVERBANK_E2E_KUBECONFIG is a kubeconfig"),
        &KubeConfigOptions::default(),
    )
    .await
    .expect("a usable kubeconfig");
    let client = Client::try_from(config).expect("a client");
    let outcome = run(&client, &kubeconfig, &s3).await;
    if std::env::var_os("RIVERBANK_E2E_KEEP").is_none() {
        cleanup(&client, &kubeconfig).await;
        if let Err(e) = s3.delete_all("").await {
            eprintln!("cleanup: {e}");
        }
    }
    if let Err(e) = outcome {
        panic!("{e}");
    }
}

type Result<T = ()> = std::result::Result<T, String>;

/// The S3 server, as this test reaches it (`endpoint`) and as the pods do (`pod_endpoint`).
struct S3 {
    endpoint: String,
    pod_endpoint: String,
    bucket: String,
    /// Everything the test writes is under this prefix of the bucket.
    prefix: String,
    access_key: String,
    secret_key: String,
    region: String,
    store: AmazonS3,
}

impl S3 {
    fn from_env() -> Result<S3> {
        let endpoint = std::env::var("RIVERBANK_E2E_S3_ENDPOINT").map_err(|_| {
            "set RIVERBANK_E2E_S3_ENDPOINT to an S3-compatible server this test can reach (and RIVERBANK_E2E_S3_POD_ENDPOINT if the pods reach it at another address); see e2e/README.md".to_string()
        })?;
        let pod_endpoint = env_or("RIVERBANK_E2E_S3_POD_ENDPOINT", &endpoint);
        let bucket = env_or("RIVERBANK_E2E_S3_BUCKET", "riverbank-e2e");
        let access_key = env_or("RIVERBANK_E2E_S3_ACCESS_KEY_ID", "riverbank");
        let secret_key = env_or("RIVERBANK_E2E_S3_SECRET_ACCESS_KEY", "riverbank-e2e-secret");
        let region = env_or("RIVERBANK_E2E_S3_REGION", "us-east-1");
        let store = AmazonS3Builder::new()
            .with_endpoint(&endpoint)
            .with_allow_http(true)
            .with_virtual_hosted_style_request(false)
            .with_bucket_name(&bucket)
            .with_access_key_id(&access_key)
            .with_secret_access_key(&secret_key)
            .with_region(&region)
            .build()
            .map_err(|e| format!("an S3 client for {endpoint}: {e}"))?;
        Ok(S3 {
            endpoint,
            pod_endpoint,
            bucket,
            prefix: env_or("RIVERBANK_E2E_S3_PREFIX", "e2e"),
            access_key,
            secret_key,
            region,
            store,
        })
    }

    /// `s3://bucket/prefix/rest`, as the pods address it.
    fn url(&self, rest: &str) -> String {
        format!("s3://{}/{}/{rest}", self.bucket, self.prefix)
    }

    fn path(&self, rest: &str) -> ObjectPath {
        ObjectPath::from(format!("{}/{rest}", self.prefix))
    }

    /// Keys (relative to the prefix) of the objects under `rest`.
    async fn list(&self, rest: &str) -> Result<Vec<String>> {
        let at = self.path(rest);
        let objects: Vec<_> = self
            .store
            .list(Some(&at))
            .try_collect()
            .await
            .map_err(|e| format!("listing {at} on {}: {e}", self.endpoint))?;
        let strip = format!("{}/", self.prefix);
        Ok(objects
            .into_iter()
            .map(|o| {
                let key = o.location.to_string();
                key.strip_prefix(&strip).unwrap_or(&key).to_string()
            })
            .collect())
    }

    /// Sink temporary objects (`.temp-riverbank-<job token>/...`) under `rest`.
    async fn temporary(&self, rest: &str) -> Result<Vec<String>> {
        Ok(self
            .list(rest)
            .await?
            .into_iter()
            .filter(|k| k.contains(".temp-riverbank-"))
            .collect())
    }

    async fn read(&self, rest: &str) -> Result<String> {
        let at = self.path(rest);
        let bytes = self
            .store
            .get(&at)
            .await
            .map_err(|e| format!("reading {at}: {e}"))?
            .bytes()
            .await
            .map_err(|e| format!("reading {at}: {e}"))?;
        String::from_utf8(bytes.to_vec()).map_err(|e| format!("{at}: {e}"))
    }

    async fn delete_all(&self, rest: &str) -> Result {
        for key in self.list(rest).await? {
            let at = self.path(&key);
            self.store
                .delete(&at)
                .await
                .map_err(|e| format!("deleting {at}: {e}"))?;
        }
        Ok(())
    }

    /// A DataflowJob's `pods` (or `worker`) for this server: `requests`, endpoint and region in
    /// plain values, the keys as credentials from the Secret `s3-keys` (never in a spec).
    fn job_pods(&self, cpu: &str, memory: &str) -> Value {
        json!({
            "resources": {"requests": {"cpu": cpu, "memory": memory}},
            "env": [
                {"name": "AWS_ENDPOINT_URL", "value": self.pod_endpoint},
                {"name": "AWS_ALLOW_HTTP", "value": "true"},
                {"name": "AWS_REGION", "value": self.region}
            ],
            "credentials": [
                {"name": "s3-keys", "key": "id", "env": "AWS_ACCESS_KEY_ID"},
                {"name": "s3-keys", "key": "secret", "env": "AWS_SECRET_ACCESS_KEY"}
            ]
        })
    }

    /// The pods' environment for this server: endpoint and region in plain values, the keys
    /// from the Secret `s3-keys` (never in a spec).
    fn pod_env(&self) -> Value {
        json!([
            {"name": "AWS_ENDPOINT_URL", "value": self.pod_endpoint},
            {"name": "AWS_ALLOW_HTTP", "value": "true"},
            {"name": "AWS_REGION", "value": self.region},
            {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "s3-keys", "key": "id"}}},
            {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "s3-keys", "key": "secret"}}}
        ])
    }
}

async fn run(client: &Client, kubeconfig: &std::path::Path, s3: &S3) -> Result {
    let tag = env_or("RIVERBANK_E2E_IMAGE_TAG", env!("CARGO_PKG_VERSION"));
    let worker_image = format!("riverbank/worker:{tag}");

    step(&format!(
        "the bucket {} at {} (pods: {}) is reachable; clearing {}/",
        s3.bucket, s3.endpoint, s3.pod_endpoint, s3.prefix
    ));
    s3.delete_all("").await?;

    step("the CRD (server-side apply) and its Established condition");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    apply(&crds, &DataflowJob::crd()).await?;
    wait_for(
        "the CRD to be established",
        Duration::from_secs(60),
        || async {
            let crd = crds.get(DataflowJob::crd_name()).await.ok()?;
            crd.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        },
    )
    .await?;

    // Before the chart: its job service reads them.
    step("the S3 keys in a Secret of the test namespace");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    apply(
        &namespaces,
        &object::<k8s_openapi::api::core::v1::Namespace>(json!({"metadata": {"name": NS}})),
    )
    .await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    apply(
        &secrets,
        &object::<Secret>(json!({
            "metadata": {"name": "s3-keys"},
            "stringData": {"id": s3.access_key, "secret": s3.secret_key}
        })),
    )
    .await?;

    step("the chart (helm upgrade --install, operator watching only the test namespace)");
    helm(
        kubeconfig,
        &[
            "upgrade",
            "--install",
            "riverbank",
            root().join("charts/riverbank").to_str().unwrap(),
            "--namespace",
            NS,
            "--create-namespace",
            "--skip-crds",
            "--wait",
            "--timeout",
            "5m",
            "--set",
            &format!("image.tag={tag}"),
            "--set",
            &format!("jobDefaults.workerImage.tag={tag}"),
            "--set",
            &format!("jobDefaults.beamWorkerImage.tag={tag}"),
            "--set",
            &format!("watchNamespaces[0]={NS}"),
            "--set",
            "jobService.enabled=true",
            "--set",
            &format!("jobService.stagingLocation={}", s3.url("beam-staging")),
            "--set-json",
            &format!("jobService.env={}", s3.pod_env()),
            "--set-json",
            &format!(
                "jobService.jobTemplate={}",
                json!({"pods": s3.job_pods("250m", "1Gi")})
            ),
        ],
    )?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    step("taxi trips generated by the worker image and copied into the bucket");
    upload_trips(client, s3, &worker_image, "in", 1, TRIPS).await?;

    step("the taxi DataflowJob, reading and writing the bucket with keys from the Secret");
    let jobs: Api<DataflowJob> = Api::namespaced(client.clone(), NS);
    apply(&jobs, &taxi_job(JOB, s3, "in", "out")).await?;
    let done = wait_for_state(&jobs, JOB, Duration::from_secs(900), |s| {
        s == Some(JobState::Done)
    })
    .await?;
    if done.completion_time.is_none() || done.stages.is_empty() {
        return Err(format!("Done without completionTime or stages: {done:?}"));
    }

    step("after Done every pod exits promptly (scaled to zero, they stop on SIGTERM)");
    let after_done = Instant::now();
    let selector = format!("riverbank.dev/job={JOB}");
    wait_for_every("the job's pods to be gone", POD_EXIT_LIMIT, || async {
        let lp = ListParams::default().labels(&selector);
        (count(&pods, &lp).await? == 0).then_some(())
    })
    .await
    .map_err(|e| format!("{e}: pods that outlive Done sit in Terminating (SIGTERM ignored?)"))?;
    eprintln!(
        "    pods gone {:.1} s after Done was seen",
        after_done.elapsed().as_secs_f64()
    );

    step("the outputs, read back from the bucket, and no temporary object left");
    let hours = s3.read("out/hours.jsonl-00000-of-00001").await?;
    let trips: u64 = json_lines(&hours)?
        .iter()
        .map(|h| h["trips"].as_u64().unwrap_or(0))
        .sum();
    if trips != TRIPS {
        return Err(format!(
            "hours.jsonl counts {trips} trips, generated {TRIPS}:\n{hours}"
        ));
    }
    let zones = json_lines(&s3.read("out/zones.jsonl-00000-of-00001").await?)?;
    if zones.is_empty()
        || zones
            .iter()
            .any(|z| z["zone"].is_null() || z["revenue"].as_f64().is_none_or(|r| r <= 0.0))
    {
        return Err(format!(
            "zones.jsonl is not one revenue per zone: {zones:?}"
        ));
    }
    let left = s3.temporary("out").await?;
    if !left.is_empty() {
        return Err(format!("temporary objects left after Done: {left:?}"));
    }

    step("deleting the job removes every object it owned");
    delete_and_wait_for_children(client, &jobs, JOB).await?;

    beam_sdk_pipeline(client, s3, &tag, &zones).await?;
    beam_sdk_autoscaling(client, s3, &tag).await?;
    beam_sdk_streaming(client, s3, &tag).await?;

    step("a batch job with a Python callable (the worker image's embedded Python)");
    apply(&jobs, &python_job(PYTHON_JOB, s3, "python")).await?;
    wait_for_state(&jobs, PYTHON_JOB, Duration::from_secs(600), |s| {
        s == Some(JobState::Done)
    })
    .await?;
    squares_written(s3, "python").await?;
    delete_and_wait_for_children(client, &jobs, PYTHON_JOB).await?;

    step("a batch job with a PyTransform (Beam's Python SDK, on the worker image with Beam)");
    apply(
        &jobs,
        &py_transform_job(PY_TRANSFORM_JOB, s3, "pytransform"),
    )
    .await?;
    wait_for_state(&jobs, PY_TRANSFORM_JOB, Duration::from_secs(600), |s| {
        s == Some(JobState::Done)
    })
    .await?;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    let beam_image = format!("riverbank/worker-beam:{tag}");
    for role in ["coordinator", "worker"] {
        let name = format!("{PY_TRANSFORM_JOB}-{role}");
        let sts = sets.get(&name).await.map_err(|e| format!("{name}: {e}"))?;
        let image = sts
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|p| p.containers.first().and_then(|c| c.image.clone()));
        if image.as_deref() != Some(beam_image.as_str()) {
            return Err(format!("{name} ran {image:?}, not {beam_image}"));
        }
    }
    squares_written(s3, "pytransform").await?;
    delete_and_wait_for_children(client, &jobs, PY_TRANSFORM_JOB).await?;

    step("a job that runs until it is deleted (an unbounded source), deleted while it runs");
    apply(&jobs, &unbounded_job(CANCELLED_JOB, s3, "cancelled")).await?;
    wait_for_state(&jobs, CANCELLED_JOB, Duration::from_secs(600), |s| {
        s == Some(JobState::Running)
    })
    .await?;
    // Deleted once its sink has written (each checkpoint writes temporary parts, then commits
    // them), so a checkpoint's parts are likely in flight when the cancel comes.
    let written = wait_for(
        "the running job's sink to write",
        Duration::from_secs(180),
        || async {
            let written = s3.list("cancelled").await.ok()?;
            (!written.is_empty()).then_some(written)
        },
    )
    .await?;
    eprintln!("    deleting with {} objects written", written.len());
    // Background propagation (kubectl's default): the children go once the job is released.
    let deleting = Instant::now();
    jobs.delete(CANCELLED_JOB, &DeleteParams::background())
        .await
        .map_err(|e| e.to_string())?;
    wait_for(
        "the deleted job to be released",
        Duration::from_secs(60),
        || async {
            matches!(jobs.get(CANCELLED_JOB).await, Err(kube::Error::Api(e)) if e.code == 404)
                .then_some(())
        },
    )
    .await?;
    eprintln!(
        "    released {:.1} s after the delete",
        deleting.elapsed().as_secs_f64()
    );
    let left = s3.temporary("cancelled").await?;
    if !left.is_empty() {
        return Err(format!(
            "temporary objects left after the running job was deleted: {left:?}"
        ));
    }
    // What the cancel stopped is not committed later: the output no longer changes.
    let committed = s3.list("cancelled").await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let later = s3.list("cancelled").await?;
    if later != committed {
        return Err(format!(
            "the cancelled job's output changed after it was released: {committed:?} then {later:?}"
        ));
    }
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let cleaned = events.items.iter().any(|e| {
        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(CANCELLED_JOB)
            && e.reason.as_deref() == Some("CleanedUp")
    });
    if !cleaned {
        return Err("no CleanedUp Event: the job was released without its coordinator confirming the cancel".into());
    }
    streaming(client, s3, &worker_image, &tag).await
}

/// Streaming from a Kafka broker pod: a job drained, and another updated with its state kept
/// (an incompatible update refused first); each counts every event once.
async fn streaming(client: &Client, s3: &S3, worker_image: &str, tag: &str) -> Result {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let broker_image = env_or(
        "RIVERBANK_E2E_KAFKA_IMAGE",
        &format!("riverbank/kafka-broker:{tag}"),
    );
    step(&format!(
        "a Kafka-protocol broker pod ({broker_image}) behind the Service `kafka`"
    ));
    let bootstrap = format!("kafka.{NS}.svc:9092");
    apply(
        &services,
        &object::<Service>(json!({
            "metadata": {"name": "kafka"},
            "spec": {"selector": {"app": "kafka"},
                     "ports": [{"name": "kafka", "port": 9092, "targetPort": 9092}]}
        })),
    )
    .await?;
    let _ = pods.delete("kafka", &DeleteParams::default()).await;
    wait_for(
        "an old broker pod to go",
        Duration::from_secs(60),
        || async {
            matches!(pods.get("kafka").await, Err(kube::Error::Api(e)) if e.code == 404)
                .then_some(())
        },
    )
    .await?;
    pods.create(
        &PostParams::default(),
        &object::<Pod>(json!({
            "metadata": {"name": "kafka", "labels": {"app": "kafka"}},
            "spec": {
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532},
                "containers": [{
                    "name": "broker", "image": broker_image,
                    "args": ["broker", "--listener-url", "tcp://0.0.0.0:9092",
                             "--advertised-listener-url", format!("tcp://{bootstrap}"),
                             "--storage-engine", "memory://tansu/"],
                    "workingDir": "/tmp",
                    "ports": [{"containerPort": 9092}],
                    "readinessProbe": {"tcpSocket": {"port": 9092}, "periodSeconds": 2},
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]
                }],
                "volumes": [{"name": "tmp", "emptyDir": {}}]
            }
        })),
    )
    .await
    .map_err(|e| format!("creating the broker pod: {e}"))?;
    wait_for(
        "the broker to be ready",
        Duration::from_secs(120),
        || async {
            let status = pods.get("kafka").await.ok()?.status?;
            status
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
                .then_some(())
        },
    )
    .await?;

    step("topic `events` (2 partitions), created with the broker's own CLI in a pod");
    // A pod started right after the Service may not resolve its name yet: tried again.
    run_pod_retrying(
        &pods,
        json!({
            "metadata": {"name": "create-topic"},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532},
                "containers": [{"name": "create", "image": broker_image,
                    "args": ["topic", "create", "events", "--broker", format!("tcp://{bootstrap}"),
                             "--partitions", "2"]}]
            }
        }),
    )
    .await?;

    step(&format!(
        "{STREAM_EVENTS} events into topic `events`, by a streaming `riverbank run` in a pod"
    ));
    let produce = json!({"pipeline": {"type": "chain", "transforms": [
        {"type": "ReadFromSynthetic", "name": "Events",
         "config": {"rate": 2000, "keys": 7, "count": STREAM_EVENTS, "event_time_skew": "0s"}},
        {"type": "WriteToKafka", "config": {"topic": "events", "bootstrap_servers": bootstrap, "format": "JSON"}}
    ]}, "options": {"streaming": true, "checkpointIntervalSec": 1, "tempLocation": "/tmp/rb"}});
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    apply(
        &configs,
        &object::<ConfigMap>(json!({
            "metadata": {"name": "produce"},
            "data": {"produce.yaml": serde_norway::to_string(&produce).unwrap()}
        })),
    )
    .await?;
    run_pod(
        &pods,
        json!({
            "metadata": {"name": "produce"},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "fsGroup": 65532},
                "containers": [{"name": "produce", "image": worker_image, "command": ["riverbank"],
                    "args": ["run", "/etc/produce/produce.yaml", "--no-progress",
                             "--checkpoint-dir", "/tmp/checkpoints", "--spill-dir", "/tmp/spill"],
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                                     {"name": "produce", "mountPath": "/etc/produce"}]}],
                "volumes": [{"name": "tmp", "emptyDir": {}},
                            {"name": "produce", "configMap": {"name": "produce"}}]
            }
        }),
    )
    .await?;

    let jobs: Api<DataflowJob> = Api::namespaced(client.clone(), NS);
    step("a streaming job counting the topic per key and window, drained once it read it all");
    apply(
        &jobs,
        &counting_job(
            DRAINED_JOB,
            s3,
            &bootstrap,
            "Count",
            "count",
            "stream-drained",
        ),
    )
    .await?;
    wait_for_streaming(&jobs, DRAINED_JOB, "every event read", |s| {
        s.streaming
            .as_ref()
            .is_some_and(|st| st.backlog_messages == 0 && st.checkpoint >= 2)
    })
    .await?;
    patch_spec(&jobs, DRAINED_JOB, json!({"desiredState": "Drained"})).await?;
    wait_for_state(&jobs, DRAINED_JOB, Duration::from_secs(300), |s| {
        s == Some(JobState::Drained)
    })
    .await?;
    counted_exactly(s3, "stream-drained").await?;

    step("another, updated while it runs: an incompatible change refused, a rename kept");
    apply(
        &jobs,
        &counting_job(
            UPDATED_JOB,
            s3,
            &bootstrap,
            "Count",
            "count",
            "stream-updated",
        ),
    )
    .await?;
    wait_for_streaming(&jobs, UPDATED_JOB, "a checkpoint with state", |s| {
        s.streaming
            .as_ref()
            .is_some_and(|st| st.checkpoint >= 2 && st.state_bytes > 0)
    })
    .await?;
    // Sums where it counted: the state cannot be taken; the job runs on.
    let refused = counting_job(
        UPDATED_JOB,
        s3,
        &bootstrap,
        "CountPerKey",
        "sum",
        "stream-updated",
    );
    patch_spec(
        &jobs,
        UPDATED_JOB,
        json!({"pipeline": refused.spec.pipeline, "transformNameMapping": {"Count": "CountPerKey"}}),
    )
    .await?;
    let s = wait_for_streaming(&jobs, UPDATED_JOB, "the update to be refused", |s| {
        s.update
            .as_ref()
            .is_some_and(|u| u.phase == UpdatePhase::Refused)
    })
    .await?;
    if s.state != Some(JobState::Running) {
        return Err(format!("a refused update stopped the job: {s:?}"));
    }
    let renamed = counting_job(
        UPDATED_JOB,
        s3,
        &bootstrap,
        "CountPerKey",
        "count",
        "stream-updated",
    );
    patch_spec(
        &jobs,
        UPDATED_JOB,
        json!({"pipeline": renamed.spec.pipeline}),
    )
    .await?;
    let s = wait_for_streaming(&jobs, UPDATED_JOB, "the update to be done", |s| {
        s.update
            .as_ref()
            .is_some_and(|u| u.phase == UpdatePhase::Done)
            && s.state == Some(JobState::Running)
    })
    .await?;
    if !s.snapshots.iter().any(|t| t.name.starts_with("update-g")) {
        return Err(format!("no update snapshot in status: {:?}", s.snapshots));
    }
    patch_spec(&jobs, UPDATED_JOB, json!({"desiredState": "Drained"})).await?;
    wait_for_state(&jobs, UPDATED_JOB, Duration::from_secs(300), |s| {
        s == Some(JobState::Drained)
    })
    .await?;
    counted_exactly(s3, "stream-updated").await?;
    for name in [DRAINED_JOB, UPDATED_JOB] {
        delete_and_wait_for_children(client, &jobs, name).await?;
    }
    let _ = pods.delete("kafka", &DeleteParams::default()).await;
    Ok(())
}

/// A streaming DataflowJob: `events` from the broker, a per-key count (or `fun`) per 10-s window
/// by the Combine `combine`, written under `<prefix>/<output>/`; checkpoints in the bucket.
fn counting_job(
    name: &str,
    s3: &S3,
    bootstrap: &str,
    combine: &str,
    fun: &str,
    output: &str,
) -> DataflowJob {
    let value = if fun == "count" {
        json!({"fn": "count"})
    } else {
        json!({"fn": fun, "value": "value"})
    };
    let job = json!({
        "apiVersion": "riverbank.dev/v1alpha1", "kind": "DataflowJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "pipeline": {"type": "chain", "transforms": [
                {"type": "ReadFromKafka", "name": "Events", "config": {
                    "topic": "events", "bootstrap_servers": bootstrap, "format": "JSON",
                    "schema": "{\"type\": \"object\", \"properties\": {\"key\": {\"type\": \"string\"}, \"value\": {\"type\": \"integer\"}}, \"required\": [\"key\", \"value\"]}",
                    "consumer_config": {"auto.offset.reset": "earliest"}}},
                {"type": "WindowInto", "windowing": {"type": "fixed", "size": "10s", "allowed_lateness": "1h"}},
                {"type": "Combine", "name": combine, "config": {"group_by": "key", "combine": {"events": value}}},
                {"type": "WriteToJson", "config": {"path": s3.url(&format!("{output}/counts.jsonl"))}}
            ]},
            "options": {"streaming": true, "numWorkers": 2, "maxNumWorkers": 4,
                        "autoscalingAlgorithm": "NONE", "checkpointIntervalSec": 2,
                        "tempLocation": s3.url("streaming-tmp")},
            "pods": s3.job_pods("250m", "512Mi")
        }
    });
    serde_json::from_value(job).expect("a DataflowJob")
}

/// A batch job whose MapToFields is a Python callable (numbers 1..=20 and their squares),
/// written under `<prefix>/<output>/`.
fn python_job(name: &str, s3: &S3, output: &str) -> DataflowJob {
    let square = json!({"type": "MapToFields", "name": "Square", "config": {"language": "python", "fields": {
        "n": "n",
        "square": {"callable": "def square(row):\n    return row.n * row.n\n"}}}});
    squares_job(name, s3, output, square, "256Mi")
}

/// A batch job whose squares come from a `PyTransform` (a Beam `Map` to `beam.Row`s, run by
/// Beam's Python SDK in the worker pods), written under `<prefix>/<output>/`. No image in its
/// spec: the operator picks the worker image with Beam.
fn py_transform_job(name: &str, s3: &S3, output: &str) -> DataflowJob {
    let source = "def squares(pcoll):\n  import apache_beam as beam\n  return pcoll | beam.Map(lambda r: beam.Row(n=r.n, square=r.n * r.n))\n";
    let square = json!({"type": "PyTransform", "name": "Squares", "config": {
        "constructor": "__callable__", "kwargs": {"source": source}}});
    // Beam's import in each pod: more memory than the callable's job.
    squares_job(name, s3, output, square, "1Gi")
}

/// Create (1..=20) → `square` → WriteToJson under `<prefix>/<output>/`, on 2 workers.
fn squares_job(name: &str, s3: &S3, output: &str, square: Value, memory: &str) -> DataflowJob {
    let job = json!({
        "apiVersion": "riverbank.dev/v1alpha1", "kind": "DataflowJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "pipeline": {"type": "chain", "transforms": [
                {"type": "Create", "config": {"elements": (1..=20).map(|n| json!({"n": n})).collect::<Vec<_>>()}},
                square,
                {"type": "WriteToJson", "config": {"path": s3.url(&format!("{output}/squares.jsonl"))}}
            ]},
            "options": {"numWorkers": 2, "autoscalingAlgorithm": "NONE",
                        "tempLocation": s3.url(&format!("{output}-tmp"))},
            "pods": s3.job_pods("100m", memory)
        }
    });
    serde_json::from_value(job).expect("a DataflowJob")
}

/// What a squares job wrote under `<prefix>/<output>/` is 1..=20 and their squares, once each.
async fn squares_written(s3: &S3, output: &str) -> Result {
    let mut rows: Vec<(i64, i64)> = Vec::new();
    for key in s3.list(output).await? {
        for row in json_lines(&s3.read(&key).await?)? {
            let field = |f: &str| row[f].as_i64().unwrap_or(-1);
            rows.push((field("n"), field("square")));
        }
    }
    rows.sort_unstable();
    if rows != (1..=20).map(|n| (n, n * n)).collect::<Vec<_>>() {
        return Err(format!("{output}: {rows:?}, not 1..=20 and their squares"));
    }
    Ok(())
}

/// A streaming job that runs until it is stopped: an unbounded synthetic source, its events
/// written as they come (global window: a set of parts per checkpoint) under
/// `<prefix>/<output>/`; checkpoints in the bucket.
fn unbounded_job(name: &str, s3: &S3, output: &str) -> DataflowJob {
    let job = json!({
        "apiVersion": "riverbank.dev/v1alpha1", "kind": "DataflowJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "pipeline": {"type": "chain", "transforms": [
                {"type": "ReadFromSynthetic", "name": "Events", "config": {"rate": 2000, "keys": 7}},
                {"type": "WriteToJson", "config": {"path": s3.url(&format!("{output}/events.jsonl"))}}
            ]},
            "options": {"streaming": true, "numWorkers": 2, "autoscalingAlgorithm": "NONE",
                        "checkpointIntervalSec": 2, "tempLocation": s3.url("streaming-tmp")},
            "pods": s3.job_pods("250m", "512Mi")
        }
    });
    serde_json::from_value(job).expect("a DataflowJob")
}

/// A merge patch of a job's spec, as `kubectl patch --type merge` sends it.
async fn patch_spec(jobs: &Api<DataflowJob>, name: &str, spec: Value) -> Result {
    jobs.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": spec})),
    )
    .await
    .map_err(|e| format!("patching {name}: {e}"))?;
    Ok(())
}

/// Polls a streaming job's status until `done` holds; fails on a final state.
async fn wait_for_streaming(
    jobs: &Api<DataflowJob>,
    name: &str,
    what: &str,
    done: impl Fn(&riverbank_operator::DataflowJobStatus) -> bool,
) -> Result<riverbank_operator::DataflowJobStatus> {
    wait_for(
        &format!("{name}: {what}"),
        Duration::from_secs(300),
        || async {
            let s = jobs.get(name).await.ok()?.status?;
            if s.state.is_some_and(JobState::is_terminal) || done(&s) {
                return Some(s);
            }
            None
        },
    )
    .await
    .and_then(|s| {
        if done(&s) {
            Ok(s)
        } else {
            Err(format!("{name} ended before {what}: {s:?}"))
        }
    })
}

/// The committed counts under `<prefix>/<output>/` add up to every event produced, and no
/// temporary object is left.
async fn counted_exactly(s3: &S3, output: &str) -> Result {
    let mut total = 0;
    for key in s3.list(output).await? {
        if key.contains(".temp-riverbank-") {
            return Err(format!("a temporary object is left: {key}"));
        }
        for row in json_lines(&s3.read(&key).await?)? {
            total += row["events"].as_u64().unwrap_or(0);
        }
    }
    if total != STREAM_EVENTS {
        return Err(format!(
            "{output}: the committed counts add up to {total}, {STREAM_EVENTS} events were produced"
        ));
    }
    eprintln!("    {output}: {total} events counted once each");
    Ok(())
}

/// Generates `days` of taxi trips (`rows` a day) with the worker image and copies them to
/// `<prefix>/<to>/` with `riverbank run` (the same S3 client as the jobs'), in one pod.
async fn upload_trips(
    client: &Client,
    s3: &S3,
    image: &str,
    to: &str,
    days: u32,
    rows: u64,
) -> Result {
    let copy = json!({"pipeline": {"transforms": [
        {"type": "ReadFromParquet", "name": "Trips", "config": {"path": "/data/taxi/*.parquet"}},
        {"type": "WriteToParquet", "name": "Upload", "input": "Trips", "config": {"path": s3.url(&format!("{to}/trips")), "file_name_suffix": ".parquet"}}
    ]}});
    let name = format!("upload-{to}");
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    apply(
        &configs,
        &object::<ConfigMap>(json!({
            "metadata": {"name": name},
            "data": {"copy.yaml": serde_norway::to_string(&copy).unwrap()}
        })),
    )
    .await?;
    let tmp = json!({"name": "tmp", "mountPath": "/tmp"});
    let data = json!({"name": "data", "mountPath": "/data"});
    run_pod(
        &pods,
        json!({
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "fsGroup": 65532},
                "initContainers": [
                    {"name": "generate", "image": image, "command": ["riverbank"],
                     "args": ["generate", "taxi", "--days", days.to_string(), "--rows-per-day", rows.to_string(), "--out", "/data/taxi"],
                     "volumeMounts": [data]}
                ],
                "containers": [
                    {"name": "copy", "image": image, "command": ["riverbank"],
                     "args": ["run", "/etc/copy/copy.yaml", "--no-progress"],
                     "env": s3.pod_env(),
                     "volumeMounts": [data, tmp, {"name": "copy", "mountPath": "/etc/copy"}]}
                ],
                "volumes": [
                    {"name": "data", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}},
                    {"name": "copy", "configMap": {"name": name}}
                ]
            }
        }),
    )
    .await?;
    let uploaded = s3.list(to).await?;
    if uploaded.is_empty() {
        return Err(format!("nothing was uploaded to {}", s3.url(to)));
    }
    Ok(())
}

/// Polls the job every second until `done` holds for its state (printing each new status line);
/// fails at once on a final state that is not the one waited for.
/// The tutorial's Beam Python SDK pipeline (`examples/taxi/trips_pipeline.py`), submitted from a
/// pod to the chart's job service with `--runner=PortableRunner --environment_type=DOCKER`: it
/// must run as a DataflowJob (a runner pod and `--num_workers=2` SDK worker pods, behind its
/// NetworkPolicy), reach Done although one SDK worker pod is force-deleted while it runs, and
/// write the same revenue per zone as the YAML job on the same trips, and an hourly count of
/// every trip.
async fn beam_sdk_pipeline(client: &Client, s3: &S3, tag: &str, yaml_zones: &[Value]) -> Result {
    let sdk_image = env_or(
        "RIVERBANK_E2E_BEAM_SDK_IMAGE",
        &format!("riverbank/beam-python-sdk:{tag}"),
    );
    step(&format!(
        "the tutorial's Beam Python SDK pipeline, submitted to the job service, its user code in {sdk_image}"
    ));
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let jobs: Api<DataflowJob> = Api::namespaced(client.clone(), NS);
    pipeline_script(&configs, "beam-pipeline", "examples/taxi/trips_pipeline.py").await?;
    let submitted = Instant::now();
    // While the job runs: the most SDK worker pods running at once (their only container is
    // the SDK's), and 10 s after both run, one of them force-deleted (a lost node): its
    // harnesses' bundles must be retried on the other's, the job still Done and exact.
    let watching = pods.clone();
    let most_sdk_pods = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most_seen = most_sdk_pods.clone();
    let killed_at = std::sync::Arc::new(std::sync::Mutex::new(None::<(String, f64)>));
    let kill = killed_at.clone();
    let sdk_pods = tokio::spawn(async move {
        let mut most = 0;
        let mut both_since: Option<Instant> = None;
        loop {
            let selector = ListParams::default().labels("app.kubernetes.io/component=worker");
            if let Ok(list) = watching.list(&selector).await {
                let running = running_sdk_pods(&list.items, "taxi-sdk");
                if running > most {
                    most = running;
                    most_seen.store(most, std::sync::atomic::Ordering::SeqCst);
                    eprintln!("    {most} SDK worker pods running");
                }
                if running == 2 && both_since.is_none() {
                    both_since = Some(Instant::now());
                }
                let victim = list.items.iter().find_map(|p| {
                    let name = p.metadata.name.clone()?;
                    (name.starts_with("taxi-sdk-") && name.ends_with("-worker-1")).then_some(name)
                });
                if let (Some(since), Some(victim)) = (both_since, victim)
                    && since.elapsed() > Duration::from_secs(10)
                    && kill.lock().unwrap().is_none()
                {
                    let now = DeleteParams {
                        grace_period_seconds: Some(0),
                        ..DeleteParams::default()
                    };
                    if watching.delete(&victim, &now).await.is_ok() {
                        let at = submitted.elapsed().as_secs_f64();
                        eprintln!("    {victim} force-deleted {at:.1} s after the submission");
                        *kill.lock().unwrap() = Some((victim, at));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    // The client waits for the job: its pod runs as long as the job does.
    let args = [
        "--input".to_string(),
        s3.url("in/*.parquet"),
        "--output".into(),
        s3.url("beam"),
        "--job_name=taxi-sdk".into(),
        "--num_workers=2".into(),
        // Two pods throughout: this case is about losing one.
        "--autoscaling_algorithm=NONE".into(),
    ];
    let submit = beam_submit_pod(
        "beam-submit",
        &sdk_image,
        "beam-pipeline",
        "trips_pipeline.py",
        &args,
        s3,
    );
    let log = run_pod_within(&pods, submit, Duration::from_secs(900)).await;
    sdk_pods.abort();
    let log = log?;
    let most = most_sdk_pods.load(std::sync::atomic::Ordering::SeqCst);
    if most != 2 {
        return Err(format!(
            "{most} SDK worker pods ran at once, not the pipeline's --num_workers=2"
        ));
    }
    let killed = killed_at.lock().unwrap().clone();
    match killed {
        Some((_, at)) if at + 5.0 < submitted.elapsed().as_secs_f64() => {}
        other => {
            return Err(format!(
                "no SDK worker pod was deleted well before the job ended: {other:?}"
            ));
        }
    }
    let mut last: Vec<&str> = log.lines().rev().take(4).collect();
    last.reverse();
    eprintln!(
        "    submitted and Done in {:.1} s; the client's last lines:\n{}",
        submitted.elapsed().as_secs_f64(),
        last.join("\n")
    );
    // The tutorial's own summary, read back from the bucket through Beam's file systems.
    let trips = TRIPS.to_string();
    let (thousands, rest) = trips.split_at(trips.len() - 3);
    let summary = format!("trips in all windows: {thousands},{rest}");
    if !log.contains(&summary) {
        return Err(format!(
            "the client's summary does not say \"{summary}\":\n{log}"
        ));
    }

    let job = &submitted_job(&jobs, "taxi-sdk").await?;
    let name = job.metadata.name.clone().unwrap_or_default();
    let status = job.status.clone().unwrap_or_default();
    if status.state != Some(JobState::Done)
        || job.spec.beam_pipeline.is_none()
        || status.stages.is_empty()
    {
        return Err(format!("{name}: {:?}: {:?}", status.state, status.message));
    }
    eprintln!("    DataflowJob {name}: {:?}", status.message);
    if job.spec.options.num_workers != Some(2) {
        return Err(format!(
            "{name}: numWorkers {:?}, not the pipeline's --num_workers=2",
            job.spec.options.num_workers
        ));
    }
    let workers: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    let sdk_set = workers
        .get(&format!("{name}-worker"))
        .await
        .map_err(|e| e.to_string())?;
    let containers = sdk_set
        .spec
        .and_then(|s| s.template.spec)
        .map(|s| s.containers)
        .unwrap_or_default();
    if containers.len() != 1 || containers[0].image.as_deref() != Some(sdk_image.as_str()) {
        return Err(format!(
            "{name}'s SDK worker pods do not run {sdk_image} alone"
        ));
    }
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), NS);
    policies
        .get(&name)
        .await
        .map_err(|e| format!("{name}'s NetworkPolicy: {e}"))?;

    let hours: u64 = s3
        .read("beam/hours")
        .await?
        .lines()
        .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
        .sum();
    if hours != TRIPS {
        return Err(format!(
            "the SDK job's hours count {hours} trips of {TRIPS}"
        ));
    }
    let sdk_zones: std::collections::BTreeMap<i64, f64> = s3
        .read("beam/zones")
        .await?
        .lines()
        .filter_map(|l| {
            let (amount, zone) = l.split_once(" zone ")?;
            Some((zone.trim().parse().ok()?, amount.trim().parse().ok()?))
        })
        .collect();
    let yaml: std::collections::BTreeMap<i64, f64> = yaml_zones
        .iter()
        .filter_map(|z| Some((z["zone"].as_i64()?, z["revenue"].as_f64()?)))
        .collect();
    let differ: Vec<_> = yaml
        .iter()
        .filter(|(zone, revenue)| {
            sdk_zones
                .get(zone)
                .is_none_or(|sdk| (sdk - *revenue).abs() > 0.005)
        })
        .collect();
    if sdk_zones.len() != yaml.len() || !differ.is_empty() {
        return Err(format!(
            "the SDK job's revenue per zone ({} zones) differs from the YAML job's ({} zones) in {differ:?}",
            sdk_zones.len(),
            yaml.len()
        ));
    }
    eprintln!(
        "    {} zones and {hours} trips, as the YAML job computed them",
        sdk_zones.len()
    );
    delete_and_wait_for_children(client, &jobs, &name).await
}

async fn wait_for_state(
    jobs: &Api<DataflowJob>,
    name: &str,
    limit: Duration,
    done: impl Fn(Option<JobState>) -> bool,
) -> Result<riverbank_operator::DataflowJobStatus> {
    let started = Instant::now();
    let mut last = String::new();
    loop {
        if started.elapsed() > limit {
            return Err(format!(
                "{name}: not there in {limit:?}; last status: {last}"
            ));
        }
        let job = jobs.get(name).await.map_err(|e| e.to_string())?;
        let status = job.status.clone().unwrap_or_default();
        let line = format!(
            "{:?} workers={:?}/{:?} progress={:?}: {}",
            status.state,
            status.current_workers,
            status.target_workers,
            status.progress,
            status.message.clone().unwrap_or_default()
        );
        if line != last {
            eprintln!("    {name}: {line}");
            last = line;
        }
        if done(status.state) {
            return Ok(status);
        }
        if status.state.is_some_and(JobState::is_terminal) {
            return Err(format!("{name} ended {last}"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Deletes `name` and waits until it and every object labelled with it are gone.
async fn delete_and_wait_for_children(
    client: &Client,
    jobs: &Api<DataflowJob>,
    name: &str,
) -> Result {
    jobs.delete(name, &DeleteParams::background())
        .await
        .map_err(|e| e.to_string())?;
    let selector = format!("riverbank.dev/job={name}");
    wait_for(
        "every child to be gone",
        Duration::from_secs(300),
        || async {
            let lp = ListParams::default().labels(&selector);
            let remaining = count(&Api::<ConfigMap>::namespaced(client.clone(), NS), &lp).await?
                + count(&Api::<Service>::namespaced(client.clone(), NS), &lp).await?
                + count(&Api::<StatefulSet>::namespaced(client.clone(), NS), &lp).await?
                + count(&Api::<Pod>::namespaced(client.clone(), NS), &lp).await?
                + count(
                    &Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS),
                    &lp,
                )
                .await?;
            let job_gone =
                matches!(jobs.get(name).await, Err(kube::Error::Api(e)) if e.code == 404);
            (remaining == 0 && job_gone).then_some(())
        },
    )
    .await
}

fn step(what: &str) {
    eprintln!("e2e: {what}");
}

fn object<K: DeserializeOwned>(mut value: Value) -> K {
    value["metadata"]["namespace"] = NS.into();
    serde_json::from_value(value).expect("a valid object")
}

async fn apply<K>(api: &Api<K>, object: &K) -> Result<K>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    let name = object.meta().name.clone().expect("named");
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map_err(|e| format!("applying {name}: {e}"))
}

async fn count<K>(api: &Api<K>, lp: &ListParams) -> Option<usize>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    api.list(lp).await.ok().map(|l| l.items.len())
}

/// Polls `check` every 2 s until it gives Some, or fails after `limit`.
async fn wait_for<F, Fut, T>(what: &str, limit: Duration, check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll(what, limit, Duration::from_secs(2), check).await
}

/// Polls `check` every 250 ms: for what is timed.
async fn wait_for_every<F, Fut, T>(what: &str, limit: Duration, check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll(what, limit, Duration::from_millis(250), check).await
}

async fn poll<F, Fut, T>(what: &str, limit: Duration, every: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if started.elapsed() > limit {
            return Err(format!("timed out after {limit:?} waiting for {what}"));
        }
        tokio::time::sleep(every).await;
    }
}

/// `run_pod` until it succeeds, for steps that are safe to repeat (a name that does not resolve
/// yet, a broker still starting): up to 6 tries over about a minute.
async fn run_pod_retrying(pods: &Api<Pod>, spec: Value) -> Result<String> {
    let mut tries = 0;
    loop {
        tries += 1;
        match run_pod(pods, spec.clone()).await {
            Ok(log) => return Ok(log),
            Err(e) if tries < 6 => {
                eprintln!("    try {tries} failed, again in 5 s: {e}");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            Err(e) => return Err(format!("{e} (after {tries} tries)")),
        }
    }
}

/// Runs a one-off pod to completion (5 minutes at most) and returns its main container's log.
async fn run_pod(pods: &Api<Pod>, spec: Value) -> Result<String> {
    run_pod_within(pods, spec, Duration::from_secs(300)).await
}

/// A Beam Python SDK pipeline with one long stage (`e2e/beam_slow_count.py`: 3,000 elements of
/// 100 ms, about 150 s on one SDK worker pod's harness), submitted with `--num_workers=1
/// --max_num_workers=3`: the operator's autoscaler must scale its SDK worker pods up on the
/// backlog the runner reports, the pods added must join the running stage, and every element
/// must be counted once.
async fn beam_sdk_autoscaling(client: &Client, s3: &S3, tag: &str) -> Result {
    const ELEMENTS: u64 = 3000;
    let sdk_image = env_or(
        "RIVERBANK_E2E_BEAM_SDK_IMAGE",
        &format!("riverbank/beam-python-sdk:{tag}"),
    );
    step("a Beam SDK pipeline's SDK worker pods autoscaled on its backlog (1 to at most 3)");
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let jobs: Api<DataflowJob> = Api::namespaced(client.clone(), NS);
    pipeline_script(&configs, "beam-slow-count", "e2e/beam_slow_count.py").await?;
    let submitted = Instant::now();
    // The most SDK worker pods running at once while the job runs.
    let watching = pods.clone();
    let most_sdk_pods = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most_seen = most_sdk_pods.clone();
    let sdk_pods = tokio::spawn(async move {
        let mut most = 0;
        loop {
            let selector = ListParams::default().labels("app.kubernetes.io/component=worker");
            if let Ok(list) = watching.list(&selector).await {
                let running = running_sdk_pods(&list.items, "slow-count");
                if running > most {
                    most = running;
                    most_seen.store(most, std::sync::atomic::Ordering::SeqCst);
                    eprintln!(
                        "    {most} SDK worker pods running, {:.0} s after the submission",
                        submitted.elapsed().as_secs_f64()
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let args = [
        "--output".to_string(),
        s3.url("beam-slow/count"),
        "--elements".into(),
        ELEMENTS.to_string(),
        "--job_name=slow-count".into(),
        "--num_workers=1".into(),
        "--max_num_workers=3".into(),
    ];
    let submit = beam_submit_pod(
        "beam-slow-submit",
        &sdk_image,
        "beam-slow-count",
        "beam_slow_count.py",
        &args,
        s3,
    );
    let log = run_pod_within(&pods, submit, Duration::from_secs(900)).await;
    sdk_pods.abort();
    let log = log?;
    let mut last: Vec<&str> = log.lines().rev().take(3).collect();
    last.reverse();
    eprintln!(
        "    submitted and Done in {:.1} s; the client's last lines:\n{}",
        submitted.elapsed().as_secs_f64(),
        last.join("\n")
    );
    let job = &submitted_job(&jobs, "slow-count").await?;
    let name = job.metadata.name.clone().unwrap_or_default();
    let status = job.status.clone().unwrap_or_default();
    if status.state != Some(JobState::Done) {
        return Err(format!("{name}: {:?}: {:?}", status.state, status.message));
    }
    if (
        job.spec.options.num_workers,
        job.spec.options.max_num_workers,
    ) != (Some(1), Some(3))
    {
        return Err(format!(
            "{name}: numWorkers {:?}, maxNumWorkers {:?}: not the pipeline's 1 and 3",
            job.spec.options.num_workers, job.spec.options.max_num_workers
        ));
    }
    let most = most_sdk_pods.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!(
        "    {name}: at most {most} SDK worker pods; last autoscaling decision: {:?}",
        status.autoscaling.as_ref().map(|a| &a.last_evaluation)
    );
    if most < 2 {
        return Err(format!(
            "{name}'s SDK worker pods were never scaled up from numWorkers 1 (at most {most} ran)"
        ));
    }
    let counted = s3.read("beam-slow/count").await?;
    let expected = format!("{ELEMENTS} {}", (0..ELEMENTS).sum::<u64>());
    if counted.trim() != expected {
        return Err(format!(
            "{name} counted '{}', not '{expected}'",
            counted.trim()
        ));
    }
    jobs.delete(&name, &DeleteParams::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// A streaming Beam Python SDK pipeline (`e2e/beam_stream_count.py`: an unbounded
/// PeriodicImpulse, 4 elements a second, summed per key and 10-s window, each window's sum
/// written to the bucket) submitted with `--streaming` and a `--temp_location` in the bucket: it
/// must run as a streaming DataflowJob reporting its watermark and checkpoints, go on from its
/// checkpoint when its runner pod is force-deleted, take version 2 (its CombinePerKey renamed)
/// submitted with `--update --transform_name_mapping` in place (the same DataflowJob; the first
/// client sees UPDATED), end Drained when drained (the update's client sees DRAINED), its
/// windows counting every element the source read once over both versions, its checkpoint gone.
async fn beam_sdk_streaming(client: &Client, s3: &S3, tag: &str) -> Result {
    const INTERVAL: f64 = 0.25;
    const WINDOW: i64 = 10;
    let sdk_image = env_or(
        "RIVERBANK_E2E_BEAM_SDK_IMAGE",
        &format!("riverbank/beam-python-sdk:{tag}"),
    );
    step(
        "a streaming Beam SDK pipeline: checkpoints in the bucket, its runner pod force-deleted, drained",
    );
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let jobs: Api<DataflowJob> = Api::namespaced(client.clone(), NS);
    pipeline_script(&configs, "beam-stream-count", "e2e/beam_stream_count.py").await?;
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs() as f64;
    let args = |version: u32, expect: &str| -> Vec<String> {
        let mut args = vec![
            "--output".to_string(),
            s3.url("beam-stream"),
            "--start".into(),
            start.to_string(),
            "--version".into(),
            version.to_string(),
            "--expect".into(),
            expect.into(),
            "--streaming".into(),
            format!("--temp_location={}", s3.url("beam-temp")),
            "--experiments=checkpointing_interval=2000".into(),
            "--job_name=stream-count".into(),
            "--num_workers=1".into(),
            "--autoscaling_algorithm=NONE".into(),
        ];
        if version == 2 {
            args.extend([
                "--update".into(),
                r#"--transform_name_mapping={"Sum": "Total"}"#.into(),
            ]);
        }
        args
    };
    let submit = |pod: &str, version: u32, expect: &str| {
        let spec = beam_submit_pod(
            pod,
            &sdk_image,
            "beam-stream-count",
            "beam_stream_count.py",
            &args(version, expect),
            s3,
        );
        let pods = pods.clone();
        tokio::spawn(async move { run_pod_within(&pods, spec, Duration::from_secs(900)).await })
    };
    let client_run = submit("beam-stream-submit", 1, "UPDATED");
    let windows_written = || async { s3.list("beam-stream").await.map(|l| l.len()).unwrap_or(0) };
    let job = wait_for(
        "the streaming DataflowJob",
        Duration::from_secs(300),
        || async { submitted_job(&jobs, "stream-count").await.ok() },
    )
    .await?;
    let name = job.metadata.name.clone().unwrap_or_default();
    if !job.spec.options.streaming()
        || job.spec.options.temp_location.as_deref() != Some(s3.url("beam-temp").as_str())
    {
        return Err(format!(
            "{name}: streaming {:?}, tempLocation {:?}: not the pipeline's",
            job.spec.options.streaming, job.spec.options.temp_location
        ));
    }
    wait_for(
        "4 windows written and a checkpoint",
        Duration::from_secs(300),
        || async {
            let checkpointed = jobs
                .get(&name)
                .await
                .ok()?
                .status?
                .streaming
                .is_some_and(|s| s.checkpoint > 0 && s.watermark.is_some());
            (checkpointed && windows_written().await >= 4).then_some(())
        },
    )
    .await?;
    let status = jobs
        .get(&name)
        .await
        .map_err(|e| e.to_string())?
        .status
        .unwrap_or_default();
    eprintln!(
        "    {name}: {:?}: {}",
        status.state,
        status.message.unwrap_or_default()
    );

    let runner = format!("{name}-coordinator-0");
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    pods.delete(&runner, &now)
        .await
        .map_err(|e| format!("force-deleting {runner}: {e}"))?;
    let before = windows_written().await;
    eprintln!("    {runner} force-deleted with {before} windows written");
    wait_for(
        "4 more windows after the runner's restart",
        Duration::from_secs(300),
        || async { (windows_written().await >= before + 4).then_some(()) },
    )
    .await?;

    // Version 2, submitted with --update: the same DataflowJob runs it, from the checkpoint.
    let update_run = submit("beam-stream-update", 2, "DRAINED");
    let log = client_run.await.map_err(|e| e.to_string())??;
    if !log.contains("the job ended UPDATED") {
        return Err(format!("the first client did not see UPDATED:\n{log}"));
    }
    let updated = submitted_job(&jobs, "stream-count").await?;
    let location = updated
        .spec
        .beam_pipeline
        .map(|b| b.location)
        .unwrap_or_default();
    if updated.metadata.name.as_deref() != Some(name.as_str()) || !location.contains("-u") {
        return Err(format!(
            "the update did not run in place: {:?} at {location}",
            updated.metadata.name
        ));
    }
    eprintln!("    updated in place: {name} runs version 2 from {location}");
    wait_for(
        "4 windows written by version 2",
        Duration::from_secs(300),
        || async {
            let mut v2 = 0;
            for key in s3.list("beam-stream").await.ok()? {
                let file = key.rsplit('/').next()?.to_string();
                let text = s3.read(&format!("beam-stream/{file}")).await.ok()?;
                v2 += usize::from(text.ends_with(" v2"));
            }
            (v2 >= 4).then_some(())
        },
    )
    .await?;

    patch_spec(&jobs, &name, json!({"desiredState": "Drained"})).await?;
    let drained = wait_for_state(&jobs, &name, Duration::from_secs(300), |s| {
        s == Some(JobState::Drained)
    })
    .await?;
    eprintln!("    {name}: {}", drained.message.unwrap_or_default());
    let log = update_run.await.map_err(|e| e.to_string())??;
    if !log.contains("the job ended DRAINED") {
        return Err(format!("the update's client did not see DRAINED:\n{log}"));
    }

    // Each (key, window) once (an object per window); together, the source's first n elements.
    let mut got = std::collections::BTreeMap::new();
    for key in s3.list("beam-stream").await? {
        let file = key.rsplit('/').next().unwrap_or(&key).to_string();
        let text = s3.read(&format!("beam-stream/{file}")).await?;
        let count: u64 = text
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .parse()
            .map_err(|e| format!("{file}: {text}: {e}"))?;
        got.insert(file, count);
    }
    let n: u64 = got.values().sum();
    let mut want = std::collections::BTreeMap::new();
    for k in 0..n {
        let t = start + k as f64 * INTERVAL;
        let window = (t as i64).div_euclid(WINDOW) * WINDOW;
        let key = if k % 2 == 0 { "even" } else { "odd" };
        *want.entry(format!("{key}-{window}")).or_insert(0u64) += 1;
    }
    if got != want {
        return Err(format!(
            "the windows do not count the stream's first {n} elements once: got {got:?}, want {want:?}"
        ));
    }
    let left = s3.list("beam-temp/riverbank-checkpoints").await?;
    if !left.is_empty() {
        return Err(format!("the drained job's checkpoint is left: {left:?}"));
    }
    eprintln!(
        "    {} windows, {n} elements counted once over the restart and the update",
        got.len()
    );
    delete_and_wait_for_children(client, &jobs, &name).await
}

/// The Beam pipeline at `path` (from the repository's root) in ConfigMap `name`, under its file
/// name, for a submitting pod to mount.
async fn pipeline_script(configs: &Api<ConfigMap>, name: &str, path: &str) -> Result {
    let script = std::fs::read_to_string(root().join(path)).map_err(|e| e.to_string())?;
    let file = path.rsplit('/').next().unwrap_or(path);
    apply(
        configs,
        &object::<ConfigMap>(json!({
            "metadata": {"name": name},
            "data": {file: script}
        })),
    )
    .await?;
    Ok(())
}

/// The SDK worker pods of the job submitted with `--job_name` that are running (their only
/// container is the SDK's).
fn running_sdk_pods(pods: &[Pod], job_name: &str) -> usize {
    pods.iter()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(&format!("{job_name}-")))
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                && p.spec
                    .as_ref()
                    .is_some_and(|s| s.containers[0].name == "sdk")
        })
        .count()
}

/// The one DataflowJob the job service created for the pipeline submitted with `--job_name`.
async fn submitted_job(jobs: &Api<DataflowJob>, job_name: &str) -> Result<DataflowJob> {
    let created: Vec<DataflowJob> = jobs
        .list(&ListParams::default().labels("riverbank.dev/submitted-by=riverbank-job-service"))
        .await
        .map_err(|e| e.to_string())?
        .items
        .into_iter()
        .filter(|j| {
            j.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(&format!("{job_name}-")))
        })
        .collect();
    match <[DataflowJob; 1]>::try_from(created) {
        Ok([job]) => Ok(job),
        Err(created) => Err(format!(
            "the job service should have created one DataflowJob named after --job_name={job_name}, it created {}",
            created.len()
        )),
    }
}

/// A pod that submits the Beam Python pipeline `script` (from ConfigMap `config`) with `args` to
/// the chart's job service, its user code to run in `sdk_image`; it runs as long as the job.
fn beam_submit_pod(
    name: &str,
    sdk_image: &str,
    config: &str,
    script: &str,
    args: &[String],
    s3: &S3,
) -> Value {
    let mut args = args.to_vec();
    args.extend([
        "--runner=PortableRunner".into(),
        "--job_endpoint=riverbank-job-service:8099".into(),
        "--environment_type=DOCKER".into(),
        format!("--environment_config={sdk_image}"),
    ]);
    json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532},
            "containers": [{
                "name": "submit",
                "image": sdk_image,
                "command": ["python", format!("/pipeline/{script}")],
                "args": args,
                "env": s3.pod_env(),
                "volumeMounts": [
                    {"name": "pipeline", "mountPath": "/pipeline"},
                    {"name": "tmp", "mountPath": "/tmp"}
                ]
            }],
            "volumes": [
                {"name": "pipeline", "configMap": {"name": config}},
                {"name": "tmp", "emptyDir": {}}
            ]
        }
    })
}

async fn run_pod_within(pods: &Api<Pod>, spec: Value, limit: Duration) -> Result<String> {
    let pod: Pod = object(spec);
    let name = pod.metadata.name.clone().unwrap();
    let _ = pods.delete(&name, &DeleteParams::default()).await;
    wait_for(
        &format!("an old pod {name} to go"),
        Duration::from_secs(60),
        || async {
            matches!(pods.get(&name).await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
        },
    )
    .await?;
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(|e| format!("creating pod {name}: {e}"))?;
    let phase = wait_for(&format!("pod {name} to finish"), limit, || async {
        let phase = pods.get(&name).await.ok()?.status?.phase?;
        matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
    })
    .await?;
    let container = pod.spec.as_ref().unwrap().containers[0].name.clone();
    let log = pods
        .logs(
            &name,
            &LogParams {
                container: Some(container),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("logs of {name}: {e}"))?;
    if phase != "Succeeded" {
        return Err(format!("pod {name} failed:\n{log}"));
    }
    Ok(log)
}

fn json_lines(text: &str) -> Result<Vec<Value>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| format!("{e}: {l}")))
        .collect()
}

/// examples/taxi/dataflowjob.yaml named `name`, rendered to read `<prefix>/<input>/*.parquet`
/// and write under `<prefix>/<output>`, light enough for a laptop cluster, with the S3
/// endpoint in the pods' environment and the keys as credentials (Secret references).
fn taxi_job(name: &str, s3: &S3, input: &str, output: &str) -> DataflowJob {
    let text = std::fs::read_to_string(root().join("examples/taxi/dataflowjob.yaml")).unwrap();
    let vars: Map<String, Value> =
        json!({"input": s3.url(&format!("{input}/*.parquet")), "output": s3.url(output)})
            .as_object()
            .unwrap()
            .clone();
    let rendered = riverbank_pipeline::template::render(&text, &vars).unwrap();
    let mut job: Value = serde_norway::from_str(&rendered).unwrap();
    job["metadata"]["name"] = name.into();
    job["metadata"]["namespace"] = NS.into();
    job["spec"]["options"]["numWorkers"] = 2.into();
    job["spec"]["worker"] = s3.job_pods("250m", "512Mi");
    serde_json::from_value(job).expect("the example is a DataflowJob")
}

fn helm(kubeconfig: &std::path::Path, args: &[&str]) -> Result {
    let out = Command::new(env_or("RIVERBANK_E2E_HELM", "helm"))
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .map_err(|e| format!("running helm (install it, or set RIVERBANK_E2E_HELM): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "helm {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// Removes what the test made (the CRD stays: other releases may use it).
async fn cleanup(client: &Client, kubeconfig: &std::path::Path) {
    // Every job, the job service's too, while the operator is there to release them.
    let jobs: Api<DataflowJob> = Api::namespaced(client.clone(), NS);
    let _ = jobs
        .delete_collection(&DeleteParams::background(), &ListParams::default())
        .await;
    // Released by the operator (a job whose coordinator does not answer: after its timeout)
    // before the operator goes, or their finalizers would hold the namespace.
    let released = wait_for(
        "every DataflowJob to be released",
        Duration::from_secs(90),
        || {
            let jobs = jobs.clone();
            async move { (count(&jobs, &ListParams::default()).await? == 0).then_some(()) }
        },
    )
    .await;
    if let Err(e) = released {
        eprintln!("cleanup: {e}");
    }
    if let Err(e) = helm(
        kubeconfig,
        &["uninstall", "riverbank", "--namespace", NS, "--wait"],
    ) {
        eprintln!("cleanup: {e}");
    }
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(NS, &DeleteParams::default()).await;
}
