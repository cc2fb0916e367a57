//! Starting SDK harnesses for an environment: EXTERNAL (a worker pool the SDK runs, which is
//! what LOOPBACK submits) by `StartWorker`, PROCESS by running its command with Beam's boot
//! flags. A DOCKER environment needs a container runtime, which the job server does not have:
//! on Kubernetes its image runs as Beam's worker pool in the job's SDK worker pods, and its
//! harnesses are started there by `StartWorker` as an EXTERNAL environment's are.
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use prost::Message;
use tokio::process::{Child, Command};

use super::{FnServer, python_harness};
use crate::artifacts;
use crate::error::PortableError;
use crate::fn_api::beam_fn_external_worker_pool_client::BeamFnExternalWorkerPoolClient;
use crate::fn_api::{ProvisionInfo, StartWorkerRequest, StopWorkerRequest};
use crate::runner_api::{ApiServiceDescriptor, Environment, ExternalPayload, ProcessPayload};
use crate::urns;

/// How long a harness has to dial back after being started, and an EXTERNAL pool (the
/// submitter's, for LOOPBACK) to answer.
const CONNECT_WAIT: Duration = Duration::from_secs(120);

/// Harnesses started for one job; stops them when dropped.
pub struct Harnesses {
    pub ids: Vec<String>,
    children: Vec<Child>,
    /// The worker pool they were started in, if any.
    pool: Option<String>,
    /// PROCESS harnesses' semi-persistent directories (their staged artifacts), removed at stop.
    dirs: Vec<PathBuf>,
}

impl Harnesses {
    /// The worker pool (`host:port`) these harnesses run in; None for PROCESS harnesses.
    pub fn pool(&self) -> Option<&str> {
        self.pool.as_deref()
    }

    /// Stops what this job started: asks an external pool to stop its workers (for a few
    /// seconds at most: the pool's pod may be gone), kills processes and removes their
    /// directories.
    pub async fn stop(mut self) {
        if let Some(url) = self.pool.take() {
            let ids = std::mem::take(&mut self.ids);
            let ask = async move {
                if let Ok(mut client) =
                    BeamFnExternalWorkerPoolClient::connect(format!("http://{url}")).await
                {
                    for worker_id in ids {
                        let _ = client.stop_worker(StopWorkerRequest { worker_id }).await;
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(5), ask).await;
        }
        for child in &mut self.children {
            let _ = child.kill().await;
        }
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn endpoint(url: &str) -> Option<ApiServiceDescriptor> {
    Some(ApiServiceDescriptor {
        url: url.to_string(),
        authentication: None,
    })
}

/// The options as Python's `sdk_worker_main` reads them from `PIPELINE_OPTIONS`: the job's
/// `beam:option:NAME:v1` keys, which it strips to `NAME`.
fn options_json(options: &prost_types::Struct) -> String {
    fn value(v: &prost_types::Value) -> serde_json::Value {
        use prost_types::value::Kind;
        match &v.kind {
            Some(Kind::BoolValue(b)) => (*b).into(),
            Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
                .map(Into::into)
                .unwrap_or(serde_json::Value::Null),
            Some(Kind::StringValue(s)) => s.clone().into(),
            Some(Kind::ListValue(l)) => l.values.iter().map(value).collect::<Vec<_>>().into(),
            Some(Kind::StructValue(s)) => serde_json::Value::Object(
                s.fields
                    .iter()
                    .map(|(k, v)| (k.clone(), value(v)))
                    .collect(),
            ),
            _ => serde_json::Value::Null,
        }
    }
    let fields: serde_json::Map<String, serde_json::Value> = options
        .fields
        .iter()
        .map(|(k, v)| (k.clone(), value(v)))
        .collect();
    serde_json::Value::Object(fields).to_string()
}

/// Asks the worker pool at `url` to start a harness. The pool may still be starting (an SDK
/// worker pod pulls its image, then imports the SDK): while it cannot be reached it is asked
/// again, for up to `wait`.
async fn start_in_pool(
    url: &str,
    request: &StartWorkerRequest,
    started: tokio::time::Instant,
    wait: Duration,
) -> Result<(), PortableError> {
    loop {
        let unreachable =
            match BeamFnExternalWorkerPoolClient::connect(format!("http://{url}")).await {
                Err(e) => e.to_string(),
                Ok(mut client) => match client.start_worker(request.clone()).await {
                    Ok(response) => {
                        let error = response.into_inner().error;
                        if !error.is_empty() {
                            return Err(PortableError::Harness(format!(
                                "the SDK worker pool at {url}: {error}"
                            )));
                        }
                        return Ok(());
                    }
                    Err(status) if status.code() == tonic::Code::Unavailable => status.to_string(),
                    Err(status) => {
                        return Err(PortableError::Harness(format!(
                            "the SDK worker pool at {url} refused to start a worker: {status}"
                        )));
                    }
                },
            };
        if started.elapsed() >= wait {
            return Err(PortableError::Harness(format!(
                "cannot reach the SDK worker pool at {url} within {wait:?}: {unreachable}"
            )));
        }
        tracing::debug!("the SDK worker pool at {url} is not up yet: {unreachable}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Where a DOCKER environment's harnesses start: the worker pool (`host:port`) that runs its
/// image, and how long it may take to answer (its pod may be pulling the image).
#[derive(Clone, Copy, Debug)]
pub struct Pool<'a> {
    pub url: &'a str,
    pub wait: Duration,
}

/// Starts `count` harnesses for `environment` and waits until each has dialled back. A DOCKER
/// environment's are started in `pool` (none: refused).
pub async fn start(
    server: &FnServer,
    job: &str,
    environment_id: &str,
    environment: &Environment,
    options: &prost_types::Struct,
    count: usize,
    pool: Option<Pool<'_>>,
) -> Result<Harnesses, PortableError> {
    let ids: Vec<String> = (0..count)
        .map(|i| format!("{job}-{environment_id}-{i}"))
        .collect();
    for id in &ids {
        server.workers.set_provision(
            id,
            ProvisionInfo {
                pipeline_options: Some(options.clone()),
                control_endpoint: endpoint(&server.url),
                logging_endpoint: endpoint(&server.url),
                artifact_endpoint: endpoint(&server.url),
                retrieval_token: job.to_string(),
                dependencies: environment.dependencies.clone(),
                runner_capabilities: Vec::new(),
                ..Default::default()
            },
        );
    }
    let mut harnesses = Harnesses {
        ids: ids.clone(),
        children: Vec::new(),
        pool: None,
        dirs: Vec::new(),
    };
    let in_pool = |url: String, params: HashMap<String, String>, wait: Duration| {
        let server_url = server.url.clone();
        let ids = ids.clone();
        async move {
            let started = tokio::time::Instant::now();
            for id in &ids {
                let request = StartWorkerRequest {
                    worker_id: id.clone(),
                    control_endpoint: endpoint(&server_url),
                    logging_endpoint: endpoint(&server_url),
                    artifact_endpoint: endpoint(&server_url),
                    provision_endpoint: endpoint(&server_url),
                    params: params.clone(),
                };
                start_in_pool(&url, &request, started, wait).await?;
            }
            Ok::<_, PortableError>(url)
        }
    };
    match (environment.urn.as_str(), pool) {
        (urns::ENV_EXTERNAL, _) => {
            let payload = ExternalPayload::decode(environment.payload.as_slice()).map_err(|e| {
                PortableError::Harness(format!(
                    "environment '{environment_id}': bad external payload: {e}"
                ))
            })?;
            let url = payload.endpoint.map(|e| e.url).unwrap_or_default();
            harnesses.pool = Some(in_pool(url, payload.params, CONNECT_WAIT).await?);
        }
        (urns::ENV_DOCKER, Some(pool)) => {
            harnesses.pool = Some(in_pool(pool.url.to_string(), HashMap::new(), pool.wait).await?);
        }
        (urns::ENV_PROCESS, _) => {
            let payload = ProcessPayload::decode(environment.payload.as_slice()).map_err(|e| {
                PortableError::Harness(format!(
                    "environment '{environment_id}': bad process payload: {e}"
                ))
            })?;
            // The staged packages, installed once for the job's harnesses (the first one's
            // directory holds them).
            let mut site_packages = None;
            for (n, id) in ids.iter().enumerate() {
                // Unique: job ids repeat across job servers (each counts from job-1).
                let dir = match tempfile::Builder::new()
                    .prefix(&format!("riverbank-sdk-{id}-"))
                    .tempdir()
                {
                    Ok(d) => d.keep(),
                    Err(e) => {
                        harnesses.stop().await;
                        return Err(PortableError::Harness(format!(
                            "cannot make the directory of SDK harness '{id}': {e}"
                        )));
                    }
                };
                harnesses.dirs.push(dir.clone());
                // What Beam's boot would have fetched and installed before starting the SDK.
                let staged = dir.join("staged");
                let mut prepared = artifacts::materialize(&environment.dependencies, &staged);
                if prepared.is_ok() && n == 0 {
                    let packages = dir.join("packages");
                    prepared = artifacts::install::install(&payload.command, &staged, &packages)
                        .await
                        .map(|site| site_packages = site);
                }
                if let Err(e) = prepared {
                    harnesses.stop().await;
                    return Err(e);
                }
                match spawn(
                    &payload,
                    id,
                    &server.url,
                    options,
                    &dir,
                    site_packages.as_deref(),
                ) {
                    Ok(child) => harnesses.children.push(child),
                    Err(e) => {
                        harnesses.stop().await;
                        return Err(e);
                    }
                }
            }
        }
        (urns::ENV_DOCKER, None) => {
            return Err(PortableError::Harness(
                "a DOCKER environment needs a container runtime the job server does not have; submit with --environment_type=LOOPBACK, PROCESS or EXTERNAL".into(),
            ));
        }
        (other, _) => {
            return Err(PortableError::Harness(format!(
                "environment '{environment_id}' has an unknown type '{other}'"
            )));
        }
    }
    for id in &ids {
        if server.workers.wait_for(id, CONNECT_WAIT).await.is_none() {
            harnesses.stop().await;
            return Err(PortableError::Harness(format!(
                "SDK harness '{id}' did not connect within {CONNECT_WAIT:?}"
            )));
        }
    }
    Ok(harnesses)
}

/// Runs a PROCESS environment's command with Beam's boot flags, and with the variables
/// Python's `sdk_worker_main` reads, so that a plain Python interpreter can be the command.
fn spawn(
    payload: &ProcessPayload,
    id: &str,
    url: &str,
    options: &prost_types::Struct,
    dir: &std::path::Path,
    site_packages: Option<&std::path::Path>,
) -> Result<Child, PortableError> {
    let descriptor = format!("url: \"{url}\"");
    let _ = std::fs::create_dir_all(dir);
    let env: HashMap<&str, String> = HashMap::from([
        ("WORKER_ID", id.to_string()),
        ("CONTROL_API_SERVICE_DESCRIPTOR", descriptor.clone()),
        ("LOGGING_API_SERVICE_DESCRIPTOR", descriptor),
        ("PIPELINE_OPTIONS", options_json(options)),
        ("SEMI_PERSISTENT_DIRECTORY", dir.display().to_string()),
    ]);
    // Beam's Python harness runs as Riverbank's (its package written beside the harness).
    let (command, harness_package) = match python_harness::command_for(&payload.command, options) {
        Some(command) => {
            let package = python_harness::write_under(dir).map_err(|e| {
                PortableError::Harness(format!(
                    "cannot write Riverbank's harness package under {}: {e}",
                    dir.display()
                ))
            })?;
            (command, Some(package))
        }
        None => (payload.command.clone(), None),
    };
    // The installed packages first, then what the path held already, then Riverbank's package.
    let before = payload
        .env
        .get("PYTHONPATH")
        .cloned()
        .or_else(|| std::env::var("PYTHONPATH").ok())
        .filter(|p| !p.is_empty());
    let path: Vec<String> = site_packages
        .map(|site| site.display().to_string())
        .into_iter()
        .chain(before)
        .chain(harness_package.map(|p| p.display().to_string()))
        .collect();
    // The command may carry its own arguments ("python -m ..."): a shell splits it.
    Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("exec {command} \"$@\""))
        .arg("sh")
        .arg(format!("--id={id}"))
        .arg(format!("--provision_endpoint={url}"))
        .arg(format!("--logging_endpoint={url}"))
        .arg(format!("--control_endpoint={url}"))
        .envs(env)
        .envs(&payload.env)
        .envs((!path.is_empty()).then(|| ("PYTHONPATH", path.join(":"))))
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            PortableError::Harness(format!(
                "cannot run the PROCESS environment's command '{}': {e}",
                payload.command
            ))
        })
}
