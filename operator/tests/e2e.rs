//! End-to-end: the operator on a real cluster runs the taxi job to Done. Runs only when
//! RIVERBANK_E2E_KUBECONFIG names a kubeconfig (see e2e/README.md); otherwise it says why and
//! passes without touching anything.
//!
//! Steps: apply the CRD; `helm upgrade --install` the chart (operator watching one namespace);
//! start an S3 server (MinIO) with its keys in a Secret; generate taxi trips with the worker
//! image and upload them; apply examples/taxi/dataflowjob.yaml pointed at that bucket; wait for
//! Done; read the outputs back and check them against the generated input; delete the job and
//! wait until every object it owned (StatefulSets, pods, disks, Service, ConfigMap) is gone.
mod common;

use common::root;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, CustomResourceExt, Resource};
use riverbank_operator::DataflowJob;
use riverbank_operator::crd::JobState;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use std::fmt::Debug;
use std::process::Command;
use std::time::{Duration, Instant};

const NS: &str = "riverbank-e2e";
const JOB: &str = "nyc-taxi";
const TRIPS: u64 = 20_000;
const MANAGER: &str = "riverbank-e2e";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

#[tokio::test]
async fn taxi_job_runs_to_done_and_cleans_up() {
    let Some(kubeconfig) = std::env::var_os("RIVERBANK_E2E_KUBECONFIG") else {
        eprintln!(
            "skipped: set RIVERBANK_E2E_KUBECONFIG to a kubeconfig of a disposable cluster (kind) to run the end-to-end test; see e2e/README.md"
        );
        return;
    };
    let kubeconfig = std::path::PathBuf::from(kubeconfig);
    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig).expect("RIVERBANK_E2E_KUBECONFIG is a kubeconfig"),
        &KubeConfigOptions::default(),
    )
    .await
    .expect("a usable kubeconfig");
    let client = Client::try_from(config).expect("a client");
    let outcome = run(&client, &kubeconfig).await;
    if std::env::var_os("RIVERBANK_E2E_KEEP").is_none() {
        cleanup(&client, &kubeconfig).await;
    }
    if let Err(e) = outcome {
        panic!("{e}");
    }
}

type Result<T = ()> = std::result::Result<T, String>;

async fn run(client: &Client, kubeconfig: &std::path::Path) -> Result {
    let tag = env_or("RIVERBANK_E2E_IMAGE_TAG", env!("CARGO_PKG_VERSION"));
    let worker_image = format!("riverbank/worker:{tag}");
    let minio_image = env_or(
        "RIVERBANK_E2E_MINIO_IMAGE",
        "quay.io/minio/minio:RELEASE.2024-12-18T13-15-44Z",
    );
    let mc_image = env_or(
        "RIVERBANK_E2E_MC_IMAGE",
        "quay.io/minio/mc:RELEASE.2024-11-21T17-21-54Z",
    );

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
            &format!("watchNamespaces[0]={NS}"),
        ],
    )?;

    step("an S3 server (MinIO) with its keys in a Secret");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    apply(
        &secrets,
        &object::<Secret>(json!({
            "metadata": {"name": "s3-keys"},
            "stringData": {"user": "riverbank", "password": "riverbank-e2e-secret"}
        })),
    )
    .await?;
    let key = |k: &str| json!({"secretKeyRef": {"name": "s3-keys", "key": k}});
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    apply(
        &deployments,
        &object::<Deployment>(json!({
            "metadata": {"name": "minio"},
            "spec": {
                "selector": {"matchLabels": {"app": "minio"}},
                "template": {
                    "metadata": {"labels": {"app": "minio"}},
                    "spec": {"containers": [{
                        "name": "minio", "image": minio_image, "args": ["server", "/data"],
                        "env": [{"name": "MINIO_ROOT_USER", "valueFrom": key("user")},
                                {"name": "MINIO_ROOT_PASSWORD", "valueFrom": key("password")}],
                        "ports": [{"containerPort": 9000}],
                        "readinessProbe": {"httpGet": {"path": "/minio/health/ready", "port": 9000}},
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]
                    }],
                    "volumes": [{"name": "data", "emptyDir": {}}]}
                }
            }
        })),
    )
    .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    apply(
        &services,
        &object::<Service>(json!({
            "metadata": {"name": "minio"},
            "spec": {"selector": {"app": "minio"}, "ports": [{"port": 9000, "targetPort": 9000}]}
        })),
    )
    .await?;
    wait_for("MinIO to be ready", Duration::from_secs(180), || async {
        let d = deployments.get("minio").await.ok()?;
        (d.status?.ready_replicas? >= 1).then_some(())
    })
    .await?;

    step("taxi trips generated by the worker image and uploaded to s3://taxi/in/");
    let mc_env = json!([
        {"name": "MC_CONFIG_DIR", "value": "/tmp/mc"},
        {"name": "MC_HOST_local", "value": "http://riverbank:riverbank-e2e-secret@minio:9000"}
    ]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    run_pod(
        &pods,
        json!({
            "metadata": {"name": "taxi-data"},
            "spec": {
                "restartPolicy": "Never",
                "initContainers": [
                    {"name": "generate", "image": worker_image, "command": ["riverbank"],
                     "args": ["generate", "taxi", "--days", "1", "--rows-per-day", TRIPS.to_string(), "--out", "/data/taxi"],
                     "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                    {"name": "bucket", "image": mc_image, "args": ["mb", "--ignore-existing", "local/taxi"],
                     "env": mc_env, "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}
                ],
                "containers": [
                    {"name": "upload", "image": mc_image, "args": ["cp", "--recursive", "/data/taxi/", "local/taxi/in/"],
                     "env": mc_env, "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "tmp", "mountPath": "/tmp"}]}
                ],
                "volumes": [{"name": "data", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]
            }
        }),
    )
    .await?;

    step("the taxi DataflowJob, reading and writing the bucket with keys from the Secret");
    let jobs: Api<DataflowJob> = Api::namespaced(client.clone(), NS);
    apply(&jobs, &taxi_job()).await?;
    let started = Instant::now();
    let mut last = String::new();
    let done = loop {
        if started.elapsed() > Duration::from_secs(900) {
            return Err(format!(
                "the job did not finish in 15 minutes; last status: {last}"
            ));
        }
        let job = jobs.get(JOB).await.map_err(|e| e.to_string())?;
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
            eprintln!("    {line}");
            last = line;
        }
        match status.state {
            Some(JobState::Done) => break status,
            Some(JobState::Failed | JobState::Cancelled) => {
                return Err(format!("the job ended {last}"));
            }
            _ => tokio::time::sleep(Duration::from_secs(5)).await,
        }
    };
    if done.completion_time.is_none() || done.stages.is_empty() {
        return Err(format!("Done without completionTime or stages: {done:?}"));
    }

    step("the outputs, read back from the bucket");
    let hours = run_pod(
        &pods,
        mc_pod(
            "read-hours",
            &mc_image,
            &mc_env,
            "local/taxi/out/hours-00000-of-00001.jsonl",
        ),
    )
    .await?;
    let trips: u64 = json_lines(&hours)?
        .iter()
        .map(|h| h["trips"].as_u64().unwrap_or(0))
        .sum();
    if trips != TRIPS {
        return Err(format!(
            "hours.jsonl counts {trips} trips, generated {TRIPS}:\n{hours}"
        ));
    }
    let zones = run_pod(
        &pods,
        mc_pod(
            "read-zones",
            &mc_image,
            &mc_env,
            "local/taxi/out/zones-00000-of-00001.jsonl",
        ),
    )
    .await?;
    let zones = json_lines(&zones)?;
    if zones.is_empty()
        || zones
            .iter()
            .any(|z| z["zone"].is_null() || z["revenue"].as_f64().is_none_or(|r| r <= 0.0))
    {
        return Err(format!(
            "zones.jsonl is not one revenue per zone: {zones:?}"
        ));
    }

    step("after Done the workers are scaled to zero");
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    wait_for(
        "workers scaled to zero",
        Duration::from_secs(120),
        || async {
            let s = sets.get(&format!("{JOB}-worker")).await.ok()?;
            (s.spec?.replicas == Some(0)).then_some(())
        },
    )
    .await?;

    step("deleting the job removes every object it owned");
    jobs.delete(JOB, &DeleteParams::foreground())
        .await
        .map_err(|e| e.to_string())?;
    let selector = format!("riverbank.dev/job={JOB}");
    wait_for(
        "every child to be gone",
        Duration::from_secs(300),
        || async {
            let lp = ListParams::default().labels(&selector);
            let remaining = count(&Api::<ConfigMap>::namespaced(client.clone(), NS), &lp).await?
                + count(&services, &lp).await?
                + count(&sets, &lp).await?
                + count(&pods, &lp).await?
                + count(
                    &Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS),
                    &lp,
                )
                .await?;
            let job_gone = matches!(jobs.get(JOB).await, Err(kube::Error::Api(e)) if e.code == 404);
            (remaining == 0 && job_gone).then_some(())
        },
    )
    .await?;
    Ok(())
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
async fn wait_for<F, Fut, T>(what: &str, limit: Duration, mut check: F) -> Result<T>
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
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Runs a one-off pod to completion and returns its main container's log.
async fn run_pod(pods: &Api<Pod>, spec: Value) -> Result<String> {
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
    let phase = wait_for(
        &format!("pod {name} to finish"),
        Duration::from_secs(300),
        || async {
            let phase = pods.get(&name).await.ok()?.status?.phase?;
            matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
        },
    )
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

fn mc_pod(name: &str, image: &str, env: &Value, object: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "cat", "image": image, "args": ["cat", object], "env": env,
                            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}],
            "volumes": [{"name": "tmp", "emptyDir": {}}]
        }
    })
}

fn json_lines(text: &str) -> Result<Vec<Value>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| format!("{e}: {l}")))
        .collect()
}

/// examples/taxi/dataflowjob.yaml rendered for the bucket, light enough for a laptop cluster,
/// with the S3 endpoint and keys (by Secret reference) in the pods' environment.
fn taxi_job() -> DataflowJob {
    let text = std::fs::read_to_string(root().join("examples/taxi/dataflowjob.yaml")).unwrap();
    let vars: Map<String, Value> =
        json!({"input": "s3://taxi/in/*.parquet", "output": "s3://taxi/out"})
            .as_object()
            .unwrap()
            .clone();
    let rendered = riverbank_pipeline::template::render(&text, &vars).unwrap();
    let mut job: Value = serde_norway::from_str(&rendered).unwrap();
    job["metadata"]["namespace"] = NS.into();
    job["spec"]["options"]["numWorkers"] = 2.into();
    job["spec"]["worker"] = json!({
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}},
        "env": [
            {"name": "AWS_ENDPOINT_URL", "value": "http://minio:9000"},
            {"name": "AWS_ALLOW_HTTP", "value": "true"},
            {"name": "AWS_REGION", "value": "us-east-1"}
        ],
        "credentials": [
            {"name": "s3-keys", "key": "user", "env": "AWS_ACCESS_KEY_ID"},
            {"name": "s3-keys", "key": "password", "env": "AWS_SECRET_ACCESS_KEY"}
        ]
    });
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
    let jobs: Api<DataflowJob> = Api::namespaced(client.clone(), NS);
    let _ = jobs.delete(JOB, &DeleteParams::foreground()).await;
    if let Err(e) = helm(
        kubeconfig,
        &["uninstall", "riverbank", "--namespace", NS, "--wait"],
    ) {
        eprintln!("cleanup: {e}");
    }
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(NS, &DeleteParams::default()).await;
}
