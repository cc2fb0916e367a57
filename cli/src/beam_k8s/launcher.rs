//! `riverbank job-server --kubernetes`: Beam's job service on a cluster (the chart's
//! `jobService`). Prepare plans and refuses here as on one machine; Run writes the job to object
//! storage (`stored`) and creates a `DataflowJob` whose `spec.beamPipeline` points at it, then
//! follows the resource: its status is the job's state and messages for the SDK's client, a
//! Cancel from the client is `desiredState: Cancelled`, and the runner pod's `metrics.pb` is the
//! job's metrics. `kubectl get dfj`, the console and the operator's deletion handling therefore
//! apply to SDK jobs as to YAML ones.
use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use prost::Message;
use riverbank_operator::crd::{
    BeamPipelineSpec, DataflowJob, DataflowJobSpec, DesiredState, JobState,
};
use riverbank_portable::job_api::{MetricResults, job_message, job_state};
use riverbank_portable::launch::{JobEvents, Launcher, Submitted, docker_images, relocate_files};
use riverbank_portable::plan::Plan;
use riverbank_portable::runner_api::{ExternalPayload, Pipeline};
use riverbank_portable::{PortableError, options, urns};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::stored::{self, Folder};

/// Labels and annotations on the DataflowJobs the job service creates.
pub const JOB_ID_LABEL: &str = "riverbank.dev/beam-job-id";
pub const SUBMITTED_BY_LABEL: &str = "riverbank.dev/submitted-by";
pub const JOB_NAME_ANNOTATION: &str = "riverbank.dev/beam-job-name";

/// `job-server`'s flags for running jobs as DataflowJobs.
#[derive(clap::Args)]
pub struct KubernetesArgs {
    /// Run each submitted job as a DataflowJob in this namespace (in a pod: its own,
    /// `$POD_NAMESPACE`), with the in-cluster credentials, instead of in this process.
    #[arg(long, value_name = "NAMESPACE", requires = "staging_location")]
    kubernetes_namespace: Option<String>,
    /// Where submitted jobs are written, a folder each (`s3://bucket/prefix`): the job's pods
    /// read them from there.
    #[arg(long, value_name = "URL")]
    staging_location: Option<String>,
    /// What every created DataflowJob's spec starts from, as JSON (`pods`: env, credentials;
    /// `options`): how the pods reach the staging location.
    #[arg(long, value_name = "JSON")]
    job_template: Option<String>,
    /// The SDK container's image when a pipeline names none (no DOCKER environment).
    #[arg(long)]
    default_sdk_image: Option<String>,
    /// SDK harnesses each job's runner starts (default: the runner's, 2).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=64))]
    sdk_worker_parallelism: Option<i32>,
}

impl KubernetesArgs {
    /// Whether jobs run as DataflowJobs.
    pub fn is_on(&self) -> bool {
        self.kubernetes_namespace.is_some()
    }

    /// The launcher these flags ask for, if any.
    pub async fn launcher(self) -> anyhow::Result<Option<std::sync::Arc<dyn Launcher>>> {
        use anyhow::Context;
        let Some(namespace) = self.kubernetes_namespace else {
            return Ok(None);
        };
        let template = match &self.job_template {
            None => serde_json::Map::new(),
            Some(text) => match serde_json::from_str(text).context("--job-template")? {
                Value::Object(m) => m,
                _ => anyhow::bail!("--job-template must be a JSON object (a DataflowJob spec)"),
            },
        };
        let client = Client::try_default()
            .await
            .context("connecting to the Kubernetes API")?;
        Ok(Some(std::sync::Arc::new(KubernetesLauncher {
            client,
            namespace,
            staging_location: self.staging_location.unwrap_or_default(),
            template,
            default_sdk_image: self.default_sdk_image,
            sdk_worker_parallelism: self.sdk_worker_parallelism,
        })))
    }
}

/// How the job service makes DataflowJobs.
pub struct KubernetesLauncher {
    pub client: Client,
    pub namespace: String,
    /// The folder under which each job gets its own (`<staging>/<DataflowJob name>/`).
    pub staging_location: String,
    /// Fields every created DataflowJob's spec starts from (`pods`, `options`): the chart's
    /// `jobService.jobTemplate`, where the object store's endpoint and credentials go.
    pub template: serde_json::Map<String, Value>,
    /// The SDK container's image for a pipeline with no DOCKER environment.
    pub default_sdk_image: Option<String>,
    pub sdk_worker_parallelism: Option<i32>,
}

/// A DataflowJob name for job service id `id`: a DNS label of at most 40 characters (the
/// operator's limit), unique by `suffix`.
pub fn resource_name(job_name: &str, suffix: &str) -> String {
    let mut base: String = job_name
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    base = base.trim_matches('-').to_string();
    while base.contains("--") {
        base = base.replace("--", "-");
    }
    if !base.starts_with(|c: char| c.is_ascii_lowercase()) {
        base = format!("beam-{base}");
    }
    let room = 40 - suffix.len() - 1;
    base.truncate(room);
    format!("{}-{suffix}", base.trim_end_matches('-'))
}

/// The job's name: its `--job_name` option (Python's client sends Prepare the name `job`),
/// else the name it was prepared under.
pub fn job_name(job: &Submitted) -> String {
    options::text(&job.options, "job_name").unwrap_or_else(|| job.name.clone())
}

/// A whole-number pipeline option such as `--num_workers` (Python's client sends a string or a
/// number), when it is at least 1.
fn count_option(job: &Submitted, name: &str) -> Option<i32> {
    use prost_types::value::Kind;
    let n = match options::value(&job.options, name)? {
        Kind::NumberValue(n) => *n,
        Kind::StringValue(s) => s.parse().ok()?,
        _ => return None,
    };
    (n >= 1.0 && n <= f64::from(i32::MAX)).then_some(n as i32)
}

/// The SDK container image `pipeline` runs with, or why it cannot run on the cluster.
pub fn sdk_image(pipeline: &Pipeline, default: Option<&str>) -> Result<String, PortableError> {
    for (id, environment) in pipeline.components.iter().flat_map(|c| &c.environments) {
        match environment.urn.as_str() {
            urns::ENV_DOCKER => {}
            urns::ENV_EXTERNAL => {
                let at = ExternalPayload::decode(environment.payload.as_slice())
                    .ok()
                    .and_then(|p| p.endpoint)
                    .map(|e| e.url)
                    .unwrap_or_default();
                return Err(PortableError::Harness(format!(
                    "environment '{id}' runs its harnesses in a worker pool at {at} (EXTERNAL or LOOPBACK), which the job's pod cannot be sure to reach: submit with --environment_type=DOCKER --environment_config=IMAGE, the SDK container's image"
                )));
            }
            urns::ENV_PROCESS => {
                return Err(PortableError::Harness(format!(
                    "environment '{id}' runs a command on the job server's machine (PROCESS): on the cluster the user code runs in an SDK container; submit with --environment_type=DOCKER --environment_config=IMAGE"
                )));
            }
            _ => {}
        }
    }
    let images = docker_images(pipeline)?;
    match images.as_slice() {
        [one] => Ok(one.clone()),
        [] => default.map(String::from).ok_or_else(|| {
            PortableError::Harness(
                "the pipeline names no SDK container image: submit with --environment_type=DOCKER --environment_config=IMAGE".into(),
            )
        }),
        many => Err(PortableError::Harness(format!(
            "the pipeline's environments use {} SDK images ({}); a job runs one SDK container",
            many.len(),
            many.join(", ")
        ))),
    }
}

/// The DataflowJob of a submitted job: the template's spec with `beamPipeline` set.
pub fn dataflow_job(
    name: &str,
    namespace: &str,
    job: &Submitted,
    beam: BeamPipelineSpec,
    template: &serde_json::Map<String, Value>,
) -> Result<DataflowJob, PortableError> {
    let mut spec = template.clone();
    spec.remove("pipeline");
    spec.insert(
        "beamPipeline".into(),
        serde_json::to_value(&beam).map_err(|e| PortableError::Malformed(e.to_string()))?,
    );
    let options = spec
        .entry("options")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or_else(|| {
            PortableError::Malformed("the job template's options is not a mapping".into())
        })?;
    options
        .entry("jobName")
        .or_insert_with(|| Value::String(job_name(job).chars().take(128).collect()));
    // The pipeline's own Dataflow worker options win over the template's: --num_workers (the
    // SDK worker pods it starts with), --max_num_workers and --autoscaling_algorithm
    // (THROUGHPUT_BASED or NONE; another value is refused with the template's error).
    for (option, field) in [
        ("num_workers", "numWorkers"),
        ("max_num_workers", "maxNumWorkers"),
    ] {
        if let Some(n) = count_option(job, option) {
            options.insert(field.into(), n.into());
        }
    }
    if let Some(algorithm) = options::text(&job.options, "autoscaling_algorithm") {
        options.insert("autoscalingAlgorithm".into(), algorithm.into());
    }
    // A streaming job checkpoints to its --temp_location (else the template's tempLocation,
    // which the runner is given): the operator requires one of a streaming job.
    if job.streaming {
        options.insert("streaming".into(), true.into());
    }
    if let Some(temp) = options::text(&job.options, "temp_location") {
        options.insert("tempLocation".into(), temp.into());
    }
    let spec: DataflowJobSpec = serde_json::from_value(Value::Object(spec))
        .map_err(|e| PortableError::Malformed(format!("the job template: {e}")))?;
    let mut resource = DataflowJob::new(name, spec);
    resource.metadata.namespace = Some(namespace.into());
    resource.metadata.labels = Some(BTreeMap::from([
        (JOB_ID_LABEL.into(), label_value(&job.id)),
        (SUBMITTED_BY_LABEL.into(), "riverbank-job-service".into()),
    ]));
    resource.metadata.annotations = Some(BTreeMap::from([(
        JOB_NAME_ANNOTATION.into(),
        job.name.clone(),
    )]));
    Ok(resource)
}

/// A label value: at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both ends.
fn label_value(s: &str) -> String {
    let v: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// The job service's state for a DataflowJob's.
fn beam_state(state: Option<JobState>) -> job_state::Enum {
    use job_state::Enum as S;
    match state {
        None | Some(JobState::Pending) => S::Starting,
        Some(JobState::Running | JobState::Updating) => S::Running,
        Some(JobState::Draining) => S::Draining,
        Some(JobState::Done) => S::Done,
        Some(JobState::Failed) => S::Failed,
        Some(JobState::Cancelled) => S::Cancelled,
        Some(JobState::Drained) => S::Drained,
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> PortableError {
    PortableError::Harness(format!("{what}: {e}"))
}

#[tonic::async_trait]
impl Launcher for KubernetesLauncher {
    async fn run(
        &self,
        job: Submitted,
        events: &dyn JobEvents,
        mut cancel: watch::Receiver<bool>,
        mut drain: watch::Receiver<bool>,
    ) -> Result<job_state::Enum, PortableError> {
        let image = sdk_image(&job.pipeline, self.default_sdk_image.as_deref())?;
        let suffix = format!(
            "{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() % 0xff_ffff_ffff)
                .unwrap_or(0)
        );
        let api: Api<DataflowJob> = Api::namespaced(self.client.clone(), &self.namespace);
        let (name, location) = if options::flag(&job.options, "update") {
            self.update(&api, &job, image, &suffix, events).await?
        } else {
            let name = resource_name(&job_name(&job), &suffix);
            let location = format!("{}/{name}/", self.staging_location.trim_end_matches('/'));
            store(&job, &location).await?;
            let beam = BeamPipelineSpec {
                location: location.clone(),
                sdk_container_image: image,
                sdk_container_args: None,
                sdk_worker_parallelism: self.sdk_worker_parallelism,
            };
            let resource = dataflow_job(&name, &self.namespace, &job, beam, &self.template)?;
            api.create(&PostParams::default(), &resource)
                .await
                .map_err(|e| failed("creating the DataflowJob", e))?;
            events.say(
                job_message::MessageImportance::JobMessageBasic,
                format!(
                    "submitted as DataflowJob {}/{name} (kubectl -n {} get dfj {name}); pipeline in {location}",
                    self.namespace, self.namespace
                ),
            );
            (name, location)
        };
        let state = follow(&api, &name, &location, events, &mut cancel, &mut drain).await?;
        let folder = Folder::at(&location).map_err(|e| failed("the job's folder", e))?;
        match folder.get_if_there(stored::METRICS).await {
            Ok(Some(bytes)) => match MetricResults::decode(bytes) {
                Ok(metrics) => events.metrics(metrics),
                Err(e) => tracing::warn!("{name}: unreadable metrics: {e}"),
            },
            Ok(None) => {}
            Err(e) => tracing::warn!("{name}: {e:#}"),
        }
        Ok(state)
    }
}

impl KubernetesLauncher {
    /// `--update` of a streaming job (Dataflow's): the running DataflowJob of the same job name
    /// takes the new pipeline in place, if it can take over that job's state (the same
    /// transforms and stages, but for `--transform_name_mapping`'s renames; else refused, and the
    /// running job runs on). The new pipeline's folder holds the old pipeline too (`replaces/`);
    /// `spec.beamPipeline` is pointed at it, so the operator restarts the runner pod on it, and
    /// the new runner goes on from the checkpoint the old one left. Its name and folder.
    async fn update(
        &self,
        api: &Api<DataflowJob>,
        job: &Submitted,
        image: String,
        suffix: &str,
        events: &dyn JobEvents,
    ) -> Result<(String, String), PortableError> {
        use kube::ResourceExt;
        let refuse = |why: String| PortableError::Update(why);
        let wanted: String = job_name(job).chars().take(128).collect();
        let listed = api
            .list(
                &kube::api::ListParams::default()
                    .labels(&format!("{SUBMITTED_BY_LABEL}=riverbank-job-service")),
            )
            .await
            .map_err(|e| failed("listing the DataflowJobs", e))?;
        let running = listed
            .items
            .into_iter()
            .find(|d| {
                d.spec.options.job_name.as_deref() == Some(wanted.as_str())
                    && d.spec.beam_pipeline.is_some()
                    && d.spec.desired_state == DesiredState::Running
                    && !d
                        .status
                        .as_ref()
                        .and_then(|s| s.state)
                        .is_some_and(JobState::is_terminal)
            })
            .ok_or_else(|| {
                refuse(format!(
                    "no DataflowJob of job name '{wanted}' runs in namespace {}: nothing to update",
                    self.namespace
                ))
            })?;
        let name = running.name_any();
        let old_location = running
            .spec
            .beam_pipeline
            .as_ref()
            .map(|b| b.location.clone())
            .unwrap_or_default();
        let old = Folder::at(&old_location).map_err(|e| failed("the running job's folder", e))?;
        let read = |name: &'static str| async {
            old.get(name)
                .await
                .map_err(|e| failed("reading the running job's pipeline", format!("{e:#}")))
        };
        let old_pipeline = Pipeline::decode(read(stored::PIPELINE).await?)
            .map_err(|e| PortableError::Malformed(format!("the running job's pipeline: {e}")))?;
        let old_options = prost_types::Struct::decode(read(stored::OPTIONS).await?)
            .map_err(|e| PortableError::Malformed(format!("the running job's options: {e}")))?;
        // The checkpoint it takes over is under the running job's temp location.
        let (old_temp, new_temp) = (
            options::text(&old_options, "temp_location"),
            options::text(&job.options, "temp_location"),
        );
        if new_temp.is_some() && new_temp != old_temp {
            return Err(refuse(format!(
                "--temp_location {} is not the running job's ({}): its checkpoint is there",
                new_temp.unwrap_or_default(),
                old_temp.unwrap_or_else(|| "its DataflowJob's tempLocation".into())
            )));
        }
        let was = Plan::with_options(&old_pipeline, &old_options)?;
        let is = Plan::with_options(&job.pipeline, &job.options)?;
        riverbank_portable::update::check(&was, &is, &job.options).map_err(|why| {
            refuse(format!(
                "it cannot take the place of DataflowJob {name}'s pipeline: {why}"
            ))
        })?;
        let location = format!(
            "{}/{name}-u{suffix}/",
            self.staging_location.trim_end_matches('/')
        );
        store(job, &location).await?;
        let folder = Folder::at(&location).map_err(|e| failed("the staging location", e))?;
        for (file, bytes) in [
            (stored::REPLACED_PIPELINE, old_pipeline.encode_to_vec()),
            (stored::REPLACED_OPTIONS, old_options.encode_to_vec()),
        ] {
            folder
                .put(file, bytes)
                .await
                .map_err(|e| failed("storing the job", format!("{e:#}")))?;
        }
        let beam = json!({"location": location, "sdkContainerImage": image});
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"beamPipeline": beam}})),
        )
        .await
        .map_err(|e| failed("updating the DataflowJob", e))?;
        events.say(
            job_message::MessageImportance::JobMessageBasic,
            format!(
                "updates DataflowJob {}/{name} in place: its runner restarts on this pipeline (in {location}) and goes on from the checkpoint the running one left",
                self.namespace
            ),
        );
        Ok((name, location))
    }
}

/// Writes the job's folder: its staged files, then the pipeline naming them, then its options.
async fn store(job: &Submitted, location: &str) -> Result<(), PortableError> {
    let folder = Folder::at(location).map_err(|e| failed("the staging location", e))?;
    let mut pipeline = job.pipeline.clone();
    let mut files: Vec<(String, String)> = Vec::new();
    relocate_files(&mut pipeline, |path| {
        let name = stored::artifact_name(files.len(), path);
        files.push((path.to_string(), name.clone()));
        Ok(name)
    })?;
    for (path, name) in &files {
        let bytes = tokio::fs::read(path)
            .await
            .map_err(|e| PortableError::Artifacts(format!("{path}: {e}")))?;
        folder
            .put(name, bytes)
            .await
            .map_err(|e| PortableError::Artifacts(format!("{e:#}")))?;
    }
    for (name, bytes) in [
        (stored::PIPELINE, pipeline.encode_to_vec()),
        (stored::OPTIONS, job.options.encode_to_vec()),
    ] {
        folder
            .put(name, bytes)
            .await
            .map_err(|e| failed("storing the job", format!("{e:#}")))?;
    }
    Ok(())
}

/// Follows the DataflowJob running the pipeline in `location` until a final state: each new
/// state and message is told; a cancelled client sets `desiredState: Cancelled`, a drained one
/// `Drained`. A job deleted before it ended is Cancelled; one whose pipeline another replaced
/// (`--update`) is Updated.
async fn follow(
    api: &Api<DataflowJob>,
    name: &str,
    location: &str,
    events: &dyn JobEvents,
    cancel: &mut watch::Receiver<bool>,
    drain: &mut watch::Receiver<bool>,
) -> Result<job_state::Enum, PortableError> {
    let mut changes = watcher::watch_object(api.clone(), name).boxed();
    let mut told_state = None;
    let mut told_message: Option<String> = None;
    // A client that cancelled or drained while the job was being stored.
    let mut cancelled = *cancel.borrow_and_update();
    if cancelled {
        events.state(job_state::Enum::Cancelling);
        desire(api, name, "Cancelled").await?;
    }
    let mut drained = *drain.borrow_and_update();
    if drained && !cancelled {
        desire(api, name, "Drained").await?;
    }
    loop {
        tokio::select! {
            change = changes.next() => {
                let resource = match change {
                    None => return Err(failed("following the DataflowJob", "the watch ended")),
                    Some(Err(e)) => {
                        tracing::warn!("{name}: watch: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                    Some(Ok(None)) => {
                        events.say(
                            job_message::MessageImportance::JobMessageWarning,
                            format!("DataflowJob {name} was deleted"),
                        );
                        return Ok(job_state::Enum::Cancelled);
                    }
                    Some(Ok(Some(resource))) => resource,
                };
                if resource
                    .spec
                    .beam_pipeline
                    .as_ref()
                    .is_some_and(|b| b.location != location)
                {
                    events.say(
                        job_message::MessageImportance::JobMessageBasic,
                        format!("DataflowJob {name} was updated: it runs the pipeline submitted with --update"),
                    );
                    events.state(job_state::Enum::Updated);
                    return Ok(job_state::Enum::Updated);
                }
                let status = resource.status.clone().unwrap_or_default();
                if let Some(message) = status.message.clone()
                    && told_message.as_ref() != Some(&message)
                {
                    let importance = if status.state == Some(JobState::Failed) {
                        job_message::MessageImportance::JobMessageError
                    } else {
                        job_message::MessageImportance::JobMessageBasic
                    };
                    events.say(importance, message.clone());
                    told_message = Some(message);
                }
                let state = beam_state(status.state);
                if told_state != Some(state) {
                    events.state(state);
                    told_state = Some(state);
                }
                if status.state.is_some_and(JobState::is_terminal) {
                    return Ok(state);
                }
            }
            changed = cancel.changed(), if !cancelled => {
                if changed.is_err() || !*cancel.borrow() {
                    continue;
                }
                cancelled = true;
                events.state(job_state::Enum::Cancelling);
                desire(api, name, "Cancelled").await?;
            }
            changed = drain.changed(), if !drained && !cancelled => {
                if changed.is_err() || !*drain.borrow() {
                    continue;
                }
                drained = true;
                desire(api, name, "Drained").await?;
            }
        }
    }
}

/// The client cancelled (`Cancelled`: the operator stops the job's pods and aborts its sinks)
/// or drained a streaming job (`Drained`: its sources stop, every window fires); the job's
/// final state comes from its status.
async fn desire(api: &Api<DataflowJob>, name: &str, state: &str) -> Result<(), PortableError> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"desiredState": state}})),
    )
    .await
    .map_err(|e| {
        failed(
            &format!("setting the DataflowJob's desiredState to {state}"),
            e,
        )
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use riverbank_portable::runner_api::{Components, DockerPayload, Environment};

    fn submitted(environments: Vec<Environment>) -> Submitted {
        Submitted {
            id: "wordcount-3".into(),
            name: "Word Count: daily".into(),
            pipeline: Pipeline {
                components: Some(Components {
                    environments: environments
                        .into_iter()
                        .enumerate()
                        .map(|(i, e)| (format!("env{i}"), e))
                        .collect(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            options: Default::default(),
            streaming: false,
        }
    }

    fn docker(image: &str) -> Environment {
        Environment {
            urn: urns::ENV_DOCKER.into(),
            payload: DockerPayload {
                container_image: image.into(),
            }
            .encode_to_vec(),
            ..Default::default()
        }
    }

    /// What the launcher told the job service.
    #[derive(Default)]
    struct Told(std::sync::Mutex<Vec<String>>);

    impl JobEvents for Told {
        fn state(&self, state: job_state::Enum) {
            self.0.lock().unwrap().push(format!("{state:?}"));
        }
        fn say(&self, _: job_message::MessageImportance, text: String) {
            self.0.lock().unwrap().push(text);
        }
        fn metrics(&self, metrics: MetricResults) {
            self.0
                .lock()
                .unwrap()
                .push(format!("{} committed metrics", metrics.committed.len()));
        }
    }

    /// The answer to the watch's first list: the created DataflowJob with `status`.
    /// Answers the DataflowJob's creation as the API server does (201, the object back): the
    /// request's path and the object.
    /// A launcher on a mocked API server (namespace `jobs`), staging under `dir`.
    fn mocked(
        dir: &std::path::Path,
    ) -> (
        KubernetesLauncher,
        tower_test::mock::Handle<http::Request<kube::client::Body>, MockResponse>,
    ) {
        let (service, api) = tower_test::mock::pair();
        let launcher = KubernetesLauncher {
            client: Client::new(service, "jobs"),
            namespace: "jobs".into(),
            staging_location: dir.display().to_string(),
            template: Default::default(),
            default_sdk_image: None,
            sdk_worker_parallelism: None,
        };
        (launcher, api)
    }

    async fn answer_create(
        api: &mut tower_test::mock::Handle<http::Request<kube::client::Body>, MockResponse>,
    ) -> (String, Value) {
        use http::{Method, Response};
        use kube::client::Body;
        let (request, send) = api.next_request().await.unwrap();
        assert_eq!(request.method(), Method::POST);
        let path = request.uri().path().to_string();
        let body = request.into_body().collect_bytes().await.unwrap();
        let created: Value = serde_json::from_slice(&body).unwrap();
        send.send_response(
            Response::builder()
                .status(201)
                .body(Body::from(body.to_vec()))
                .unwrap(),
        );
        (path, created)
    }

    type MockResponse = http::Response<kube::client::Body>;

    fn watched(mut created: Value, status: Value) -> MockResponse {
        created["metadata"]["resourceVersion"] = json!("2");
        created["status"] = status;
        let list = json!({
            "apiVersion": "riverbank.dev/v1alpha1", "kind": "DataflowJobList",
            "metadata": {"resourceVersion": "2"}, "items": [created]
        });
        http::Response::builder()
            .body(kube::client::Body::from(serde_json::to_vec(&list).unwrap()))
            .unwrap()
    }

    /// Against a mock API server (tower-test): the job's folder is written (the staged file
    /// copied in and renamed in the pipeline, the options), the DataflowJob created with the
    /// template and `beamPipeline`, then followed to Done, its message and the runner's
    /// metrics passed on.
    #[tokio::test]
    async fn a_submitted_job_is_stored_created_and_followed_to_its_end() {
        use http::{Method, Request, Response};
        use kube::client::Body;
        use riverbank_portable::runner_api::{ArtifactFilePayload, ArtifactInformation};

        let dir = tempfile::tempdir().unwrap();
        let staged = dir.path().join("main_session.pickle");
        std::fs::write(&staged, b"pickled").unwrap();
        let mut job = submitted(vec![Environment {
            dependencies: vec![ArtifactInformation {
                type_urn: urns::ARTIFACT_FILE.into(),
                type_payload: ArtifactFilePayload {
                    path: staged.display().to_string(),
                    sha256: String::new(),
                }
                .encode_to_vec(),
                ..Default::default()
            }],
            ..docker("beam:py")
        }]);
        job.options = prost_types::Struct::default();
        let staging = dir.path().join("staging");
        let (service, mut api) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let launcher = KubernetesLauncher {
            client: Client::new(service, "jobs"),
            namespace: "jobs".into(),
            staging_location: staging.display().to_string(),
            template: json!({"options": {"tempLocation": "s3://b/tmp"}})
                .as_object()
                .unwrap()
                .clone(),
            default_sdk_image: None,
            sdk_worker_parallelism: Some(3),
        };
        let server = tokio::spawn(async move {
            let (path, created) = answer_create(&mut api).await;
            assert_eq!(
                path,
                "/apis/riverbank.dev/v1alpha1/namespaces/jobs/dataflowjobs"
            );
            let name = created["metadata"]["name"].as_str().unwrap().to_string();
            assert!(name.starts_with("word-count-daily-"), "{name}");
            let beam = created["spec"]["beamPipeline"].clone();
            assert_eq!(beam["sdkContainerImage"], "beam:py");
            assert_eq!(beam["sdkWorkerParallelism"], 3);
            assert_eq!(created["spec"]["options"]["tempLocation"], "s3://b/tmp");
            // The watch: its first list already shows the job Done.
            let (request, send) = api.next_request().await.unwrap();
            assert_eq!(request.method(), Method::GET);
            assert!(
                request.uri().query().unwrap_or_default().contains(&name),
                "{}",
                request.uri()
            );
            send.send_response(watched(
                created,
                json!({"state": "Done", "message": "done: 7 stages"}),
            ));
            beam["location"].as_str().unwrap().to_string()
        });
        let told = Told::default();
        let ended = tokio::time::timeout(
            Duration::from_secs(10),
            launcher.run(job, &told, watch::channel(false).1, watch::channel(false).1),
        )
        .await
        .expect("the launcher followed the job to its end")
        .unwrap();
        assert_eq!(ended, job_state::Enum::Done);
        let location = server.await.unwrap();
        let told = told.0.lock().unwrap().clone();
        assert!(told[0].starts_with("submitted as DataflowJob jobs/word-count-daily-"));
        assert_eq!(told[1..], ["done: 7 stages", "Done"]);

        let folder = Folder::at(&location).unwrap();
        let pipeline = Pipeline::decode(folder.get(stored::PIPELINE).await.unwrap()).unwrap();
        let dependency = &pipeline.components.unwrap().environments["env0"].dependencies[0];
        let path = ArtifactFilePayload::decode(dependency.type_payload.as_slice())
            .unwrap()
            .path;
        assert_eq!(path, "artifacts/0-main_session.pickle");
        assert_eq!(folder.get(&path).await.unwrap().as_ref(), b"pickled");
        assert!(
            folder
                .get_if_there(stored::OPTIONS)
                .await
                .unwrap()
                .is_some()
        );
    }

    /// A client that cancels (or drains) before its job is even created: the DataflowJob is
    /// created, then set to `desiredState: Cancelled` (`Drained`), and followed to its end.
    #[tokio::test]
    async fn a_job_cancelled_or_drained_by_its_client_is_set_so_and_followed() {
        use http::{Method, Response};
        use kube::client::Body;

        for desired in ["Cancelled", "Drained"] {
            let dir = tempfile::tempdir().unwrap();
            let (launcher, mut api) = mocked(dir.path());
            let server = tokio::spawn(async move {
                let (_, created) = answer_create(&mut api).await;
                assert_eq!(created["spec"]["options"]["streaming"], json!(true));
                let (request, send) = api.next_request().await.unwrap();
                assert_eq!(request.method(), Method::PATCH);
                let patch: Value =
                    serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap())
                        .unwrap();
                assert_eq!(patch, json!({"spec": {"desiredState": desired}}));
                let body = serde_json::to_vec(&created).unwrap();
                send.send_response(Response::builder().body(Body::from(body)).unwrap());
                let (_, send) = api.next_request().await.unwrap();
                send.send_response(watched(created, json!({"state": desired})));
            });
            let told = Told::default();
            let (cancel, cancelled) = watch::channel(false);
            let (drain, drained) = watch::channel(false);
            match desired {
                "Cancelled" => cancel.send_replace(true),
                _ => drain.send_replace(true),
            };
            let mut job = submitted(vec![docker("beam:py")]);
            job.streaming = true;
            let ended = tokio::time::timeout(
                Duration::from_secs(10),
                launcher.run(job, &told, cancelled, drained),
            )
            .await
            .expect("the launcher followed the job to its end")
            .unwrap();
            server.await.unwrap();
            let told = told.0.lock().unwrap().clone();
            match desired {
                "Cancelled" => {
                    assert_eq!(ended, job_state::Enum::Cancelled);
                    assert_eq!(told[1..], ["Cancelling", "Cancelled"]);
                }
                _ => {
                    assert_eq!(ended, job_state::Enum::Drained);
                    assert_eq!(told[1..], ["Drained"]);
                }
            }
        }
    }

    /// `--update` with no running DataflowJob of that job name: refused, naming the job name,
    /// and nothing is created.
    #[tokio::test]
    async fn an_update_of_no_running_job_is_refused() {
        use http::{Method, Response};
        use kube::client::Body;

        let dir = tempfile::tempdir().unwrap();
        let (launcher, mut api) = mocked(dir.path());
        let server = tokio::spawn(async move {
            let (request, send) = api.next_request().await.unwrap();
            assert_eq!(request.method(), Method::GET);
            assert!(
                request
                    .uri()
                    .query()
                    .unwrap_or_default()
                    .contains("riverbank-job-service"),
                "{}",
                request.uri()
            );
            let list = json!({
                "apiVersion": "riverbank.dev/v1alpha1", "kind": "DataflowJobList",
                "metadata": {"resourceVersion": "1"}, "items": []
            });
            send.send_response(
                Response::builder()
                    .body(Body::from(serde_json::to_vec(&list).unwrap()))
                    .unwrap(),
            );
        });
        let mut job = submitted(vec![docker("beam:py")]);
        job.streaming = true;
        for (option, value) in [
            ("update", prost_types::value::Kind::BoolValue(true)),
            (
                "job_name",
                prost_types::value::Kind::StringValue("counts".into()),
            ),
        ] {
            job.options.fields.insert(
                format!("beam:option:{option}:v1"),
                prost_types::Value { kind: Some(value) },
            );
        }
        let told = Told::default();
        let e = launcher
            .run(job, &told, watch::channel(false).1, watch::channel(false).1)
            .await
            .unwrap_err()
            .to_string();
        server.await.unwrap();
        assert!(
            e.contains("--update") && e.contains("'counts'") && e.contains("nothing to update"),
            "{e}"
        );
    }

    #[test]
    fn the_job_is_named_by_its_job_name_option_first() {
        let mut job = submitted(vec![]);
        assert_eq!(job_name(&job), "Word Count: daily");
        job.options.fields.insert(
            "beam:option:job_name:v1".into(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue("taxi-sdk".into())),
            },
        );
        assert_eq!(job_name(&job), "taxi-sdk");
    }

    #[test]
    fn resource_names_are_dns_labels_within_the_operators_limit() {
        let n = resource_name("Word Count: daily", "18c2f3a9b1");
        assert_eq!(n, "word-count-daily-18c2f3a9b1");
        let long = resource_name(&"x".repeat(100), "18c2f3a9b1");
        assert_eq!(long.len(), 40);
        assert!(resource_name("2026 report", "1").starts_with("beam-2026-report"));
        assert_eq!(resource_name("", "1"), "beam-1");
    }

    #[test]
    fn the_sdk_image_is_the_pipelines_docker_environment() {
        let job = submitted(vec![docker("beam:py"), docker("beam:py")]);
        assert_eq!(sdk_image(&job.pipeline, None).unwrap(), "beam:py");
        let none = submitted(vec![]);
        assert_eq!(sdk_image(&none.pipeline, Some("d:1")).unwrap(), "d:1");
        assert!(sdk_image(&none.pipeline, None).is_err());
        let two = submitted(vec![docker("a:1"), docker("b:1")]);
        let e = sdk_image(&two.pipeline, None).unwrap_err().to_string();
        assert!(e.contains("a:1, b:1"), "{e}");
        let loopback = submitted(vec![Environment {
            urn: urns::ENV_EXTERNAL.into(),
            ..Default::default()
        }]);
        let e = sdk_image(&loopback.pipeline, Some("d:1"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--environment_type=DOCKER"), "{e}");
    }

    #[test]
    fn the_dataflow_job_is_the_template_with_the_beam_pipeline() {
        let job = submitted(vec![docker("beam:py")]);
        let template = json!({
            "pods": {"env": [{"name": "AWS_ENDPOINT", "value": "http://s3:9000"}]},
            "options": {"tempLocation": "s3://b/tmp"},
            "pipeline": {"transforms": []}
        });
        let beam = BeamPipelineSpec {
            location: "s3://b/beam/j/".into(),
            sdk_container_image: "beam:py".into(),
            sdk_container_args: None,
            sdk_worker_parallelism: Some(2),
        };
        let resource = dataflow_job(
            "word-count-1",
            "jobs",
            &job,
            beam.clone(),
            template.as_object().unwrap(),
        )
        .unwrap();
        assert_eq!(resource.spec.beam_pipeline, Some(beam));
        assert_eq!(
            resource.spec.pipeline, None,
            "a template's pipeline is dropped"
        );
        assert_eq!(
            resource.spec.options.job_name.as_deref(),
            Some("Word Count: daily")
        );
        assert_eq!(
            resource.spec.options.temp_location.as_deref(),
            Some("s3://b/tmp")
        );
        assert_eq!(resource.spec.pods.unwrap().env[0].name, "AWS_ENDPOINT");
        let labels = resource.metadata.labels.unwrap();
        assert_eq!(labels[JOB_ID_LABEL], "wordcount-3");
        assert_eq!(resource.metadata.namespace.as_deref(), Some("jobs"));
        assert_eq!(resource.spec.options.num_workers, None);
    }

    /// `--num_workers` (as Python's client sends it: a string or a number) sizes the job's SDK
    /// worker pods, over the template's numWorkers.
    #[test]
    fn the_pipelines_num_workers_wins_over_the_template() {
        let template = json!({"options": {"numWorkers": 2, "maxNumWorkers": 10}});
        let beam = BeamPipelineSpec {
            location: "s3://b/beam/j/".into(),
            sdk_container_image: "beam:py".into(),
            sdk_container_args: None,
            sdk_worker_parallelism: None,
        };
        let sized = |value: prost_types::value::Kind| {
            let mut job = submitted(vec![docker("beam:py")]);
            job.options.fields.insert(
                "beam:option:num_workers:v1".into(),
                prost_types::Value { kind: Some(value) },
            );
            let r = dataflow_job(
                "j",
                "jobs",
                &job,
                beam.clone(),
                template.as_object().unwrap(),
            );
            r.unwrap().spec.options.num_workers
        };
        use prost_types::value::Kind;
        assert_eq!(sized(Kind::NumberValue(5.0)), Some(5));
        assert_eq!(sized(Kind::StringValue("4".into())), Some(4));
        assert_eq!(
            sized(Kind::NumberValue(0.0)),
            Some(2),
            "not a count: the template's"
        );
    }

    /// `--max_num_workers` and `--autoscaling_algorithm` bound and choose the SDK worker pods'
    /// autoscaling, over the template's; an algorithm Riverbank does not know is refused.
    #[test]
    fn the_pipelines_autoscaling_options_win_over_the_template() {
        use prost_types::value::Kind;
        use riverbank_operator::crd::AutoscalingAlgorithm;
        let template = json!({"options": {"maxNumWorkers": 10}});
        let beam = BeamPipelineSpec {
            location: "s3://b/beam/j/".into(),
            sdk_container_image: "beam:py".into(),
            sdk_container_args: None,
            sdk_worker_parallelism: None,
        };
        let with = |options: &[(&str, Kind)]| {
            let mut job = submitted(vec![docker("beam:py")]);
            for (name, value) in options {
                job.options.fields.insert(
                    format!("beam:option:{name}:v1"),
                    prost_types::Value {
                        kind: Some(value.clone()),
                    },
                );
            }
            dataflow_job(
                "j",
                "jobs",
                &job,
                beam.clone(),
                template.as_object().unwrap(),
            )
        };
        let r = with(&[
            ("max_num_workers", Kind::StringValue("4".into())),
            ("autoscaling_algorithm", Kind::StringValue("NONE".into())),
        ])
        .unwrap();
        assert_eq!(r.spec.options.max_num_workers, Some(4));
        assert_eq!(
            r.spec.options.autoscaling_algorithm,
            Some(AutoscalingAlgorithm::None)
        );
        let r = with(&[]).unwrap();
        assert_eq!(r.spec.options.max_num_workers, Some(10));
        assert_eq!(r.spec.options.autoscaling_algorithm, None);
        let e = with(&[("autoscaling_algorithm", Kind::StringValue("BASIC".into()))]);
        assert!(e.unwrap_err().to_string().contains("BASIC"));
    }
}
