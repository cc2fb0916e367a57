//! The reconciler: a kube-runtime `Controller` on DataflowJobs that owns their ConfigMaps,
//! Services and StatefulSets and watches their pods.
//!
//! One reconcile: plan the pipeline (the same code as `riverbank validate`/`plan`); ask the
//! coordinator how the job is doing (or tell it to cancel); look at the pods; feed the progress
//! to the job's autoscaler and take its worker target (`scaling.rs`); compute the next status
//! (`status.rs`, pure); server-side apply the four children with one field manager; write status
//! through the status subresource only when it changed; publish an Event per transition or
//! scaling decision. Everything is idempotent, so a restarted operator (or a second replica after
//! a leader change) repeats no side effect except re-applying identical objects; what it loses is
//! the autoscaler's window, which refills.
use crate::children::{self, Children, OperatorSettings, labels};
use crate::coordinator_client::Coordinator;
use crate::crd::{AutoscalingAlgorithm, DataflowJob, DataflowJobStatus, DesiredState, StageStatus};
use crate::metrics::{Metrics, Outcome};
use crate::scaling::{Autoscaled, Autoscalers, Clock, InsightState, MonotonicClock};
use crate::{pods, scaling, status};
use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use riverbank_autoscale::Decision;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The one field manager of everything the operator writes (children and status).
pub const FIELD_MANAGER: &str = "riverbank-operator";

/// Retry delays after failed reconciles: 5 s, doubling, at most 5 minutes.
const BACKOFF_FIRST: Duration = Duration::from_secs(5);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("the DataflowJob has no metadata.{0}")]
    MissingMetadata(&'static str),
}

impl Error {
    /// The `error` label of the errors metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "kube",
            Error::MissingMetadata(_) => "metadata",
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub settings: OperatorSettings,
    pub coordinator: Arc<dyn Coordinator>,
    pub metrics: Arc<Metrics>,
    /// How often an active job is looked at again (the coordinator's progress is polled).
    pub poll_interval: Duration,
    /// Consecutive failures per job, for the retry backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// When each job's status was last written, to throttle metrics-only updates.
    written: Mutex<HashMap<String, Instant>>,
    /// Each autoscaled job's window of observations and engine state.
    pub autoscalers: Autoscalers,
    /// The autoscaler's time.
    clock: Arc<dyn Clock>,
}

impl Context {
    pub fn new(
        client: Client,
        reporter: Reporter,
        settings: OperatorSettings,
        coordinator: Arc<dyn Coordinator>,
        metrics: Arc<Metrics>,
        poll_interval: Duration,
    ) -> Self {
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            settings,
            coordinator,
            metrics,
            poll_interval,
            failures: Mutex::default(),
            written: Mutex::default(),
            autoscalers: Autoscalers::default(),
            clock: Arc::new(MonotonicClock::default()),
        }
    }

    /// Replaces the autoscaler's clock (tests move time by hand).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
}

fn key(job: &DataflowJob) -> String {
    format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any())
}

/// The controller's reconcile function.
pub async fn reconcile(job: Arc<DataflowJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_job(&job, &ctx).await;
    let outcome = match &result {
        Ok((_, outcome)) => *outcome,
        Err(_) => Outcome::Error,
    };
    ctx.metrics.reconciled(outcome, started.elapsed());
    if result.is_ok() {
        ctx.failures
            .lock()
            .expect("not poisoned")
            .remove(&key(&job));
    }
    result.map(|(action, _)| action)
}

/// After a failed reconcile: retry with exponential backoff per job.
pub fn error_policy(job: Arc<DataflowJob>, error: &Error, ctx: Arc<Context>) -> Action {
    let failures = {
        let mut map = ctx.failures.lock().expect("not poisoned");
        let n = map.entry(key(&job)).or_insert(0);
        *n += 1;
        *n
    };
    let delay = backoff(failures);
    tracing::warn!(job = %key(&job), %error, failures, retry_in = ?delay, "reconcile failed");
    ctx.metrics.error(error.kind());
    Action::requeue(delay)
}

/// Delay before retry number `failures` (1-based).
pub fn backoff(failures: u32) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    BACKOFF_FIRST.saturating_mul(factor).min(BACKOFF_MAX)
}

async fn reconcile_job(job: &DataflowJob, ctx: &Context) -> Result<(Action, Outcome), Error> {
    let namespace = job.namespace().ok_or(Error::MissingMetadata("namespace"))?;
    let name = job.name_any();
    if job.metadata.deletion_timestamp.is_some() {
        // The children go with it: garbage collection follows their owner references.
        return Ok((Action::await_change(), Outcome::Skipped));
    }
    let old = job.status.clone().unwrap_or_default();
    if status::is_invalid_spec(&old) && old.observed_generation == job.metadata.generation {
        // Reported once; only a new spec (generation) can change the answer.
        return Ok((Action::await_change(), Outcome::Skipped));
    }
    let now = Timestamp::now();
    let plan = match job.plan() {
        Ok(plan) => plan,
        Err(e) => {
            let error = e.to_string();
            return invalid(ctx, job, &namespace, status::INVALID_PIPELINE, &error, now).await;
        }
    };
    // The pod settings are checked before the coordinator is asked anything; the children
    // are built again below with this reconcile's worker target (pure and cheap).
    if let Err(e) = children::desired_children(job, &plan, &ctx.settings) {
        let error = e.to_string();
        return invalid(ctx, job, &namespace, status::INVALID_SPEC, &error, now).await;
    }

    let previous = status::previous_state(&old);
    let active = previous.is_none_or(|s| !s.is_terminal());
    let cancelling = active && job.spec.desired_state == DesiredState::Cancelled;
    // Only a job that was started has a coordinator to ask or to stop.
    let started = previous.is_some();
    let address = children::coordinator_address(&name, &namespace, &ctx.settings.cluster_domain);
    let cancel = if cancelling && started {
        let answer = ctx.coordinator.cancel(&address).await;
        if let Err(e) = &answer {
            tracing::warn!(job = %key(job), error = %e, "cancel: the coordinator did not answer; scaling to zero anyway");
        }
        Some(answer.map_err(|e| e.to_string()))
    } else {
        None
    };
    let (progress, pod_problem) = if active && !cancelling && started {
        let progress = ctx
            .coordinator
            .status(&address)
            .await
            .map_err(|e| e.to_string());
        let pods = list_pods(ctx, &namespace, &name).await?;
        (Some(progress), pods::diagnose(&pods))
    } else {
        (None, None)
    };

    let scaler = Autoscalers::key(job);
    let autoscaled = if active
        && !cancelling
        && job.spec.options.autoscaling() == AutoscalingAlgorithm::ThroughputBased
    {
        let reading = progress.as_ref().and_then(|p| p.as_ref().ok());
        let cores = children::worker_cores(job, &ctx.settings);
        let cfg = scaling::engine_config(job);
        let stored = job.status.as_ref().and_then(|s| s.autoscaling.as_ref());
        let autoscaled = ctx.autoscalers.observe(
            &scaler,
            &cfg,
            reading,
            stored,
            ctx.clock.now_secs(),
            now,
            cores,
        );
        if let Some(d) = &autoscaled.decided {
            log_decision(job, d);
        }
        autoscaled
    } else {
        ctx.autoscalers.forget(&scaler);
        Autoscaled {
            insight: InsightState::Clear,
            ..Autoscaled::default()
        }
    };
    let target = scaling::target_workers(job, autoscaled.target);
    let children =
        match children::desired_children(&job_for_children(job, target), &plan, &ctx.settings) {
            Ok(children) => children,
            Err(e) => {
                let error = e.to_string();
                return invalid(ctx, job, &namespace, status::INVALID_SPEC, &error, now).await;
            }
        };

    let mut next = status::planned_status(
        job,
        status::Observed {
            stages: StageStatus::from_plan(&plan),
            target_workers: target,
            progress,
            pod_problem,
            cancel,
            insight: autoscaled.insight,
            autoscaling: autoscaled.memory,
            now,
        },
    );
    let workers = apply_children(ctx, &namespace, children).await?;
    next.current_workers = Some(
        workers
            .status
            .and_then(|s| s.ready_replicas)
            .unwrap_or_default(),
    );
    let decision = autoscaled.event.as_ref();
    write_status(ctx, job, &namespace, &old, &next, decision).await?;
    if let Some(d) = decision {
        ctx.autoscalers.published(&scaler, d.at_secs);
    }
    let action = if next.state.is_some_and(|s| s.is_terminal()) {
        // Nothing to poll; a change to the job or a child brings us back.
        Action::await_change()
    } else {
        Action::requeue(scaling::requeue_after(job, next.state, ctx.poll_interval))
    };
    Ok((action, Outcome::Applied))
}

fn log_decision(job: &DataflowJob, d: &Decision) {
    let reason = scaling::reason_code(d.reason);
    if d.is_rescale() {
        tracing::info!(job = %key(job), current = d.current_workers, target = d.target_workers, dry_run = d.dry_run, %reason, message = %d.message, "autoscaling decision");
    } else {
        tracing::debug!(job = %key(job), workers = d.current_workers, %reason, message = %d.message, "autoscaling decision");
    }
}

/// The job as `desired_children` should see it: with this reconcile's worker target, and an
/// invalid-spec Failed (now fixed) no longer counting as stopped. A job that has just finished
/// is still seen as active here, so its pods are scaled down only after its final state is
/// recorded (the next reconcile): a failed status write never loses a Done.
fn job_for_children(job: &DataflowJob, target: i32) -> DataflowJob {
    let mut job = job.clone();
    let status = job.status.get_or_insert_with(DataflowJobStatus::default);
    if status::is_invalid_spec(status) {
        status.state = None;
    }
    status.target_workers = Some(target);
    job
}

/// The spec can't run: record it (once) and stop the pods of an earlier, valid generation.
async fn invalid(
    ctx: &Context,
    job: &DataflowJob,
    namespace: &str,
    reason: &str,
    error: &str,
    now: Timestamp,
) -> Result<(Action, Outcome), Error> {
    tracing::info!(job = %key(job), reason, error, "the spec cannot run");
    let old = job.status.clone().unwrap_or_default();
    let next = status::invalid_status(job, reason, error, now);
    ctx.autoscalers.forget(&Autoscalers::key(job));
    if !old.stages.is_empty() {
        let name = job.name_any();
        scale_to_zero(ctx, namespace, &children::coordinator_name(&name)).await?;
        scale_to_zero(ctx, namespace, &children::workers_name(&name)).await?;
    }
    write_status(ctx, job, namespace, &old, &next, None).await?;
    Ok((Action::await_change(), Outcome::Invalid))
}

/// Scales a StatefulSet that may not exist to zero replicas (its disks stay).
async fn scale_to_zero(ctx: &Context, namespace: &str, name: &str) -> Result<(), Error> {
    let api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), namespace);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let patch = serde_json::json!({"spec": {"replicas": 0}});
    match api.patch(name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn list_pods(ctx: &Context, namespace: &str, job: &str) -> Result<Vec<Pod>, Error> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = format!("{}={job}", labels::JOB);
    Ok(api
        .list(&ListParams::default().labels(&selector))
        .await?
        .items)
}

/// Server-side applies the children in dependency order; returns the worker StatefulSet as
/// the API server has it (its status says how many workers are ready).
async fn apply_children(
    ctx: &Context,
    namespace: &str,
    children: Children,
) -> Result<StatefulSet, Error> {
    apply(ctx, namespace, &children.plan).await?;
    apply(ctx, namespace, &children.service).await?;
    apply(ctx, namespace, &children.coordinator).await?;
    apply(ctx, namespace, &children.workers).await
}

async fn apply<K>(ctx: &Context, namespace: &str, object: &K) -> Result<K, Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Serialize
        + DeserializeOwned
        + Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let name = object.meta().name.clone().expect("children are named");
    // force: this operator is the owner of these fields; take them back from anyone who
    // changed them (drift is undone).
    let params = PatchParams::apply(FIELD_MANAGER).force();
    Ok(api.patch(&name, &params, &Patch::Apply(object)).await?)
}

/// Writes status (when it changed) and then the Events for the change, so a failed write
/// publishes nothing and the retry publishes them once. Changes of metrics alone are written at
/// most once per poll interval: every write brings the job back for another reconcile, which
/// would otherwise poll the coordinator and write again, about once a second.
async fn write_status(
    ctx: &Context,
    job: &DataflowJob,
    namespace: &str,
    old: &DataflowJobStatus,
    next: &DataflowJobStatus,
    decision: Option<&Decision>,
) -> Result<(), Error> {
    let key = key(job);
    let recently_written = ctx
        .written
        .lock()
        .expect("not poisoned")
        .get(&key)
        .is_some_and(|at| at.elapsed() < ctx.poll_interval);
    let throttled = recently_written && status::only_metrics_changed(old, next);
    if job.status.as_ref() != Some(next) && !throttled {
        let api: Api<DataflowJob> = Api::namespaced(ctx.client.clone(), namespace);
        let patch = serde_json::json!({
            "apiVersion": DataflowJob::api_version(&()),
            "kind": DataflowJob::kind(&()),
            "status": next,
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        api.patch_status(&job.name_any(), &params, &Patch::Apply(&patch))
            .await?;
        ctx.written
            .lock()
            .expect("not poisoned")
            .insert(key, Instant::now());
    }
    for event in status::events(old, next, decision) {
        publish(ctx, job, &event).await;
    }
    Ok(())
}

/// Events are for people: a failure to publish one is logged, never retried.
async fn publish(ctx: &Context, job: &DataflowJob, event: &Event) {
    tracing::info!(job = %key(job), reason = %event.reason, note = ?event.note, "event");
    if let Err(e) = ctx.recorder.publish(event, &job.object_ref(&())).await {
        tracing::warn!(job = %key(job), error = %e, "could not publish an event");
        ctx.metrics.error("event");
    }
}

fn scoped<K>(client: Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    }
}

/// Runs the controller over `namespaces` (all when empty; one controller per listed namespace,
/// so namespaced RBAC suffices) until `stop` turns true.
pub async fn run(ctx: Arc<Context>, namespaces: &[String], stop: watch::Receiver<bool>) {
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().cloned().map(Some).collect()
    };
    futures::future::join_all(
        scopes
            .into_iter()
            .map(|ns| run_scope(ctx.clone(), ns, stop.clone())),
    )
    .await;
}

async fn run_scope(ctx: Arc<Context>, namespace: Option<String>, mut stop: watch::Receiver<bool>) {
    let client = ctx.client.clone();
    let ns = namespace.as_deref();
    // Watch (and cache) only our own children, not every ConfigMap in the cluster.
    let ours =
        watcher::Config::default().labels(&format!("{}=riverbank-operator", labels::MANAGED_BY));
    let job_pods = watcher::Config::default().labels(labels::JOB);
    tracing::info!(
        namespace = ns.unwrap_or("<all>"),
        "starting the DataflowJob controller"
    );
    Controller::new(
        scoped::<DataflowJob>(client.clone(), ns),
        watcher::Config::default(),
    )
    .with_config(ControllerConfig::default().debounce(Duration::from_secs(1)))
    .owns(scoped::<ConfigMap>(client.clone(), ns), ours.clone())
    .owns(scoped::<Service>(client.clone(), ns), ours.clone())
    .owns(scoped::<StatefulSet>(client.clone(), ns), ours)
    .watches(scoped::<Pod>(client, ns), job_pods, |pod: Pod| {
        let job = pod.labels().get(labels::JOB)?.clone();
        Some(ObjectRef::new(&job).within(&pod.namespace()?))
    })
    .graceful_shutdown_on(async move {
        let _ = stop.wait_for(|stop| *stop).await;
    })
    .run(reconcile, error_policy, ctx)
    .for_each(|result| async move {
        match result {
            Ok((job, action)) => tracing::debug!(%job, ?action, "reconciled"),
            Err(e) => tracing::debug!(error = %e, "controller"),
        }
    })
    .await;
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;
