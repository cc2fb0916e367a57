//! The reconciler: a kube-runtime `Controller` on DataflowJobs that owns their ConfigMaps,
//! Services and StatefulSets and watches their pods.
//!
//! One reconcile: plan the pipeline (the same code as `riverbank validate`/`plan`); ask the
//! coordinator how the job is doing (a long poll while the job runs, so status follows it
//! closely) or tell it to cancel; look at the pods (from a reflector's store, not a list per
//! reconcile); feed the progress to the job's autoscaler and decide the pod counts once
//! (`scaling::replicas`); compute the next status (`status.rs`, pure); server-side apply the
//! four children with one field manager; write status through the status subresource only when
//! it changed meaningfully; publish an Event per transition or scaling decision.
//!
//! The job stream is filtered by predicates (generation, annotations, finalizers, deletion), so
//! the operator's own status writes do not bring a job back: the reconciler says when it wants
//! to look again (`next_action`). Deleting a job goes through the `riverbank.dev/cleanup`
//! finalizer, which only active jobs hold: an active job's coordinator is told to cancel (which
//! aborts its sinks' temporary files) and is given a bounded time to report a final phase
//! before the job is released; a final job loses the finalizer once its pods are at zero.
//! Everything is idempotent, so a restarted operator (or a second replica after a leader change)
//! repeats no side effect except re-applying identical objects; what it loses is the
//! autoscaler's window, which refills.
use crate::children::{self, Children, OperatorSettings, labels};
use crate::coordinator_client::{self, Coordinator};
use crate::crd::{
    AutoscalingAlgorithm, DataflowJob, DataflowJobStatus, DesiredState, JobState, StageStatus,
};
use crate::insights::Found;
use crate::metrics::{Metrics, Outcome};
use crate::scaling::{Autoscaled, Autoscalers, Clock, InsightState, MonotonicClock, Replicas};
use crate::{console, memory, pods, scaling, status};
use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Predicate, WatchStreamExt, predicates, watcher};
use kube::{Client, Resource, ResourceExt};
use riverbank_autoscale::{Decision, InsightConfig, insights};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The one field manager of everything the operator writes (children and status).
pub const FIELD_MANAGER: &str = "riverbank-operator";
/// The field manager of the replicas of an invalid job's StatefulSets (see `scale_to_zero`).
pub const STOP_FIELD_MANAGER: &str = "riverbank-operator-stop";
/// The finalizer on every *active* job: its deletion waits until the coordinator cancelled the
/// job (and aborted its sinks' temporary files), or until [`Context::cleanup_timeout`] has
/// passed. A job loses it once it is final and its pods are at zero (or its spec is invalid),
/// so a job that is over never holds up its deletion, or its namespace's, once no operator is
/// left to remove it (after `helm uninstall`). Nothing is done about it on shutdown: SIGTERM is
/// a rollout or a leader change as often as an uninstall.
pub const FINALIZER: &str = "riverbank.dev/cleanup";

/// Retry delays after failed reconciles: 5 s, doubling, at most 5 minutes.
const BACKOFF_FIRST: Duration = Duration::from_secs(5);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// A running job is looked at again this soon after each reconcile, whose long poll of the
/// coordinator (up to [`coordinator_client::MAX_WAIT`]) paces it while nothing happens.
pub const FOLLOW_REQUEUE: Duration = Duration::from_secs(1);
/// A starting job (Pending) is looked at again this soon: its coordinator may not answer yet.
pub const STARTING_REQUEUE: Duration = Duration::from_secs(2);
/// A deleted job whose coordinator has not confirmed the cancel yet is looked at this often.
pub const CLEANUP_RETRY: Duration = Duration::from_secs(2);
/// How long the coordinator may hold the request that follows a cancel, waiting for the job to
/// reach its final phase.
const CLEANUP_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("the DataflowJob has no metadata.{0}")]
    MissingMetadata(&'static str),
    /// A streaming job's coordinator did not take a control request (update check, stop).
    #[error("the coordinator: {0}")]
    Coordinator(String),
    #[error("{0}")]
    Stale(String),
}

impl Error {
    /// The `error` label of the errors metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "kube",
            Error::MissingMetadata(_) => "metadata",
            Error::Coordinator(_) => "coordinator",
            Error::Stale(_) => "stale",
        }
    }
}

/// The pods of the watched namespaces, as reflectors keep them (one per controller scope).
#[derive(Default)]
pub struct PodStores(Mutex<Vec<(Option<String>, Store<Pod>)>>);

impl PodStores {
    /// Registers the store of the pods in `namespace` (None: all namespaces).
    pub fn register(&self, namespace: Option<String>, store: Store<Pod>) {
        self.0
            .lock()
            .expect("not poisoned")
            .push((namespace, store));
    }

    /// The pods of job `name` in `namespace`, by name.
    pub fn of_job(&self, namespace: &str, name: &str) -> Vec<Arc<Pod>> {
        let stores = self.0.lock().expect("not poisoned");
        let Some((_, store)) = stores
            .iter()
            .find(|(ns, _)| ns.as_deref() == Some(namespace))
            .or_else(|| stores.iter().find(|(ns, _)| ns.is_none()))
        else {
            return vec![];
        };
        let mut pods: Vec<Arc<Pod>> = store
            .state()
            .into_iter()
            .filter(|p| {
                p.namespace().as_deref() == Some(namespace)
                    && p.labels().get(labels::JOB).map(String::as_str) == Some(name)
            })
            .collect();
        pods.sort_by_key(|p| p.name_any());
        pods
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub settings: OperatorSettings,
    pub coordinator: Arc<dyn Coordinator>,
    pub metrics: Arc<Metrics>,
    /// Changes of a running job's numbers alone (throughput, backlog, progress, the
    /// coordinator's message) are written to status at most this often; transitions at once.
    pub status_interval: Duration,
    /// How long a deleted, active job waits for its coordinator to confirm the cancel before
    /// it is released anyway (counted from its deletionTimestamp).
    pub cleanup_timeout: Duration,
    /// The jobs' pods, from the controllers' reflectors.
    pub pods: PodStores,
    /// Consecutive failures per job, for the retry backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// When each job's status was last written, to space out writes of numbers alone.
    written: Mutex<HashMap<String, Instant>>,
    /// Each autoscaled job's window of observations and engine state.
    pub autoscalers: Autoscalers,
    /// The autoscaler's time.
    clock: Arc<dyn Clock>,
    /// The web console's jobs (served when the operator has a console port).
    pub console: Arc<riverbank_console::Console>,
}

impl Context {
    pub fn new(
        client: Client,
        reporter: Reporter,
        settings: OperatorSettings,
        coordinator: Arc<dyn Coordinator>,
        metrics: Arc<Metrics>,
        status_interval: Duration,
    ) -> Self {
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            settings,
            coordinator,
            metrics,
            status_interval,
            cleanup_timeout: Duration::from_secs(30),
            pods: PodStores::default(),
            failures: Mutex::default(),
            written: Mutex::default(),
            autoscalers: Autoscalers::default(),
            clock: Arc::new(MonotonicClock::default()),
            console: Arc::default(),
        }
    }

    /// Replaces the autoscaler's clock (tests move time by hand).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn with_cleanup_timeout(mut self, timeout: Duration) -> Self {
        self.cleanup_timeout = timeout;
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
        return cleanup(ctx, job, &namespace).await;
    }
    let old = job.status.clone().unwrap_or_default();
    if status::is_invalid_spec(&old) && old.observed_generation == job.metadata.generation {
        console::show(&ctx.console, job, &old, None, None);
        // Reported once; only a new spec (generation) can change the answer. Its pods are at
        // zero: nothing to cancel, so nothing to hold its deletion for.
        release_finalizer(ctx, job, &namespace).await?;
        return Ok((Action::await_change(), Outcome::Skipped));
    }
    // The finalizer is there to cancel an *active* job when it is deleted: a job that is over
    // never gets it (and loses it once its pods are at zero, below), so a finished job cannot
    // keep its namespace Terminating when no operator is left to remove it.
    if status::previous_state(&old).is_none_or(|s| !s.is_terminal()) && !has_finalizer(job) {
        add_finalizer(ctx, job, &namespace).await?;
    }
    let now = Timestamp::now();
    let streaming = job.spec.options.streaming();
    if streaming && job.spec.options.temp_location.is_none() {
        let error = "a streaming job needs options.tempLocation (an object store URL, or a path every pod mounts): its checkpoints and state shards are kept there so that any worker can restore them";
        return invalid(ctx, job, &namespace, status::INVALID_SPEC, error, now).await;
    }
    let previous = status::previous_state(&old);
    let active = previous.is_none_or(|s| !s.is_terminal());
    let cancelling = active && job.spec.desired_state == DesiredState::Cancelled;
    // Only a job that was started has a coordinator to ask or to stop.
    let started = previous.is_some();
    let address = children::coordinator_address(&name, &namespace, &ctx.settings.cluster_domain);
    // A streaming job whose coordinator runs it: drains, snapshots and updates go through it,
    // and an invalid new pipeline is an update refused, not a stopped job.
    let mut control = None;
    if streaming
        && active
        && !cancelling
        && matches!(
            previous,
            Some(JobState::Running | JobState::Draining | JobState::Updating)
        )
    {
        let has_plan = job.plan().is_ok() || old.run.is_some();
        if has_plan {
            control = Some(
                crate::streaming::before_poll(ctx, job, &namespace, &address, job.plan(), now)
                    .await?,
            );
        }
    }
    let plan = match &control {
        Some(c) => c.plan.clone(),
        None => match job.plan() {
            Ok(plan) => plan,
            Err(e) => {
                let error = e.to_string();
                return invalid(ctx, job, &namespace, status::INVALID_PIPELINE, &error, now).await;
            }
        },
    };

    let cancel = if cancelling && started {
        let answer = ctx.coordinator.cancel(&address).await;
        if let Err(e) = &answer {
            tracing::warn!(job = %key(job), error = %e, "cancel: the coordinator did not answer; scaling to zero anyway");
        }
        Some(answer.map_err(|e| e.to_string()))
    } else {
        None
    };
    let following = active && !cancelling && started;
    let mut progress = if following {
        let wait = follow_wait(previous, &ctx.pods.of_job(&namespace, &name));
        Some(
            ctx.coordinator
                .status(&address, wait)
                .await
                .map_err(|e| e.to_string()),
        )
    } else {
        None
    };
    let mut plan = plan;
    if let Some(c) = control.as_mut() {
        progress = crate::streaming::after_poll(job, c, progress, now);
        // An update whose old pipeline has stopped: the children switch to the new one now.
        if c.update.as_ref().is_some_and(|u| {
            u.phase == crate::crd::UpdatePhase::Restarting
                && Some(u.generation) == job.metadata.generation
        }) && let Ok(p) = job.plan()
        {
            c.plan = p.clone();
            plan = p;
        }
    }
    // The pods as they are after the wait.
    let pods = ctx.pods.of_job(&namespace, &name);
    let pod_problem = following
        .then(|| pods::diagnose(pods.iter().map(AsRef::as_ref)))
        .flatten();

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
    let reading = progress.as_ref().and_then(|p| p.as_ref().ok());
    // The console's copy: `progress` itself goes into the status.
    let shown = reading.cloned();
    // Vertical autoscaling: the workers' memory, from their pods and their memory use.
    let memory = memory::decide(
        job,
        &ctx.settings,
        &pods,
        reading,
        active && !cancelling,
        scaling::engine_config(job).dry_run,
        now,
    );
    let found = Found {
        engine: autoscaled.insight,
        progress: reading.map(|p| insights::from_progress(p, &InsightConfig::default())),
        pods: insights::worker_out_of_memory(&memory.oom_kills, memory.what_next.clone())
            .into_iter()
            .collect(),
    };
    // The one decision of this reconcile's pod counts, and the one build of the children.
    let replicas = scaling::replicas(job, autoscaled.target);
    let run = match &control {
        Some(c) => Some(c.run.clone()),
        None => streaming.then(|| crate::streaming::current_run(job)),
    };
    let children = match children::desired_children_run(
        job,
        &plan,
        &ctx.settings,
        replicas,
        memory.apply.as_ref(),
        run.as_ref(),
    ) {
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
            target_workers: replicas.workers,
            progress,
            pod_problem,
            cancel,
            insights: found,
            autoscaling: autoscaled.memory,
            memory: memory.status,
            streaming: status::StreamingObserved {
                run,
                control: control.clone(),
            },
            now,
        },
    );
    let workers = apply_children(ctx, &namespace, children).await?;
    next.current_workers = Some(status::current_workers(
        shown.as_ref(),
        workers
            .status
            .and_then(|s| s.ready_replicas)
            .unwrap_or_default(),
    ));
    if let Some(st) = next.streaming.as_mut() {
        // The shards of the plan that runs (a refused update's spec may ask for others).
        st.shards = crate::streaming::shards(&plan);
        st.shards_per_worker = next
            .current_workers
            .filter(|&w| w > 0)
            .map(|w| (st.shards + w - 1) / w);
    }
    let decision = autoscaled.event.as_ref();
    ctx.metrics.job(&namespace, &name, &next);
    console::show(
        &ctx.console,
        job,
        &next,
        Some(riverbank_console::Graph::from_plan(&plan)),
        shown.as_ref(),
    );
    write_status(ctx, job, &namespace, &old, &next, decision).await?;
    for note in control.iter().flat_map(|c| &c.events) {
        publish(ctx, job, &note.event()).await;
    }
    if let Some(event) = &memory.event {
        publish(ctx, job, &event.event()).await;
    }
    if let Some(d) = decision {
        ctx.autoscalers.published(&scaler, d.at_secs);
        if d.is_rescale() && !d.dry_run {
            ctx.metrics
                .rescaled(&namespace, &name, d.target_workers > d.current_workers);
        }
    }
    if next.state.is_some_and(JobState::is_terminal) && replicas == Replicas::STOPPED {
        // Over, its final state stored and its pods at zero: nothing is left to cancel.
        release_finalizer(ctx, job, &namespace).await?;
    }
    let action = next_action(next.state, replicas, ctx.status_interval);
    Ok((action, Outcome::Applied))
}

/// How long the coordinator may hold this reconcile's status request: a long poll while the job
/// runs, or is starting with its coordinator pod up, so that a transition (Running, Done) is
/// seen as it happens, even on a job of a few seconds.
fn follow_wait(previous: Option<JobState>, pods: &[Arc<Pod>]) -> Option<Duration> {
    let coordinator_up = pods.iter().any(|p| {
        p.labels().get(labels::COMPONENT).map(String::as_str) == Some(children::COORDINATOR)
            && p.metadata.deletion_timestamp.is_none()
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    });
    match previous {
        Some(JobState::Running | JobState::Draining | JobState::Updating) => {
            Some(coordinator_client::MAX_WAIT)
        }
        Some(JobState::Pending) if coordinator_up => Some(coordinator_client::MAX_WAIT),
        _ => None,
    }
}

/// When to look at a job again: the operator's own status writes do not bring it back (the job
/// stream is filtered), so this is the only clock of a job that nothing else changes.
pub fn next_action(state: Option<JobState>, applied: Replicas, interval: Duration) -> Action {
    match state {
        // Just finished: scale its pods to zero now that the final state is stored.
        Some(s) if s.is_terminal() && applied != Replicas::STOPPED => {
            Action::requeue(Duration::ZERO)
        }
        // Nothing to poll; a change to the job or a child brings it back.
        Some(s) if s.is_terminal() => Action::await_change(),
        Some(JobState::Running | JobState::Draining | JobState::Updating) => {
            Action::requeue(FOLLOW_REQUEUE)
        }
        Some(JobState::Pending) | None => Action::requeue(STARTING_REQUEUE),
        Some(_) => Action::requeue(interval),
    }
}

fn log_decision(job: &DataflowJob, d: &Decision) {
    let reason = scaling::reason_code(d.reason);
    if d.is_rescale() {
        tracing::info!(job = %key(job), current = d.current_workers, target = d.target_workers, dry_run = d.dry_run, %reason, message = %d.message, "autoscaling decision");
    } else {
        tracing::debug!(job = %key(job), workers = d.current_workers, %reason, message = %d.message, "autoscaling decision");
    }
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
    console::show(&ctx.console, job, &next, None, None);
    ctx.metrics.job(namespace, &job.name_any(), &next);
    ctx.autoscalers.forget(&Autoscalers::key(job));
    if !old.stages.is_empty() {
        let name = job.name_any();
        scale_to_zero(ctx, namespace, &children::coordinator_name(&name)).await?;
        scale_to_zero(ctx, namespace, &children::workers_name(&name)).await?;
    }
    write_status(ctx, job, namespace, &old, &next, None).await?;
    // Its pods are at zero: nothing to cancel; a fixed spec brings the finalizer back.
    release_finalizer(ctx, job, namespace).await?;
    Ok((Action::await_change(), Outcome::Invalid))
}

/// Scales a StatefulSet that may not exist to zero replicas (its disks stay): a server-side
/// apply of the replicas alone, under [`STOP_FIELD_MANAGER`]. (Under the main field manager a
/// partial apply would give up every other field it owns, and so delete them.) The next full
/// apply of the children takes the replicas back (`force`).
async fn scale_to_zero(ctx: &Context, namespace: &str, name: &str) -> Result<(), Error> {
    let api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), namespace);
    if api.get_opt(name).await?.is_none() {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "spec": {"replicas": 0},
    });
    let params = PatchParams::apply(STOP_FIELD_MANAGER).force();
    match api.patch(name, &params, &Patch::Apply(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
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
/// publishes nothing and the retry publishes them once. A change of the numbers alone
/// (`status::only_metrics_changed`) is written at most once per status interval: a running job
/// is reconciled about every second, and its throughput moves every time.
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
        .is_some_and(|at| at.elapsed() < ctx.status_interval);
    let spaced_out = recently_written && status::only_metrics_changed(old, next);
    if job.status.as_ref() != Some(next) && !spaced_out {
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
    console::event(&ctx.console, job, event);
    if let Err(e) = ctx.recorder.publish(event, &job.object_ref(&())).await {
        tracing::warn!(job = %key(job), error = %e, "could not publish an event");
        ctx.metrics.error("event");
    }
}

fn has_finalizer(job: &DataflowJob) -> bool {
    job.finalizers().iter().any(|f| f == FINALIZER)
}

/// Adds the finalizer with a JSON patch that first tests the list it extends, so a concurrent
/// change of the finalizers fails the patch (and the reconcile is retried) instead of being lost.
async fn add_finalizer(ctx: &Context, job: &DataflowJob, namespace: &str) -> Result<(), Error> {
    let patch = if job.finalizers().is_empty() {
        serde_json::json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
        ])
    } else {
        serde_json::json!([
            {"op": "test", "path": "/metadata/finalizers", "value": job.finalizers()},
            {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER},
        ])
    };
    json_patch(ctx, job, namespace, patch).await
}

/// Removes the finalizer of a deleted job, which then leaves the console and the metrics.
async fn remove_finalizer(ctx: &Context, job: &DataflowJob, namespace: &str) -> Result<(), Error> {
    // Released: the job leaves the console (a failed patch shows it again at the retry).
    ctx.console.remove(namespace, &job.name_any());
    ctx.metrics.forget_job(namespace, &job.name_any());
    release_finalizer(ctx, job, namespace).await
}

/// Removes the finalizer (at its index, tested first), if the job has it; a job already gone
/// is fine.
async fn release_finalizer(ctx: &Context, job: &DataflowJob, namespace: &str) -> Result<(), Error> {
    let Some(i) = job.finalizers().iter().position(|f| f == FINALIZER) else {
        return Ok(());
    };
    tracing::info!(job = %key(job), "removing the finalizer");
    let path = format!("/metadata/finalizers/{i}");
    let patch = serde_json::json!([
        {"op": "test", "path": path, "value": FINALIZER},
        {"op": "remove", "path": path},
    ]);
    match json_patch(ctx, job, namespace, patch).await {
        Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => Ok(()),
        other => other,
    }
}

async fn json_patch(
    ctx: &Context,
    job: &DataflowJob,
    namespace: &str,
    patch: serde_json::Value,
) -> Result<(), Error> {
    let api: Api<DataflowJob> = Api::namespaced(ctx.client.clone(), namespace);
    let patch: json_patch::Patch = serde_json::from_value(patch).expect("a well-formed JSON patch");
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    api.patch(&job.name_any(), &params, &Patch::Json::<()>(patch))
        .await?;
    Ok(())
}

/// A deleted job. One that is final (or never ran) is released at once: its children go by
/// garbage collection (owner references). An active one is first cancelled through its
/// coordinator, which aborts its sinks' temporary files; the job is released once the
/// coordinator reports a final phase, or, if it does not within [`Context::cleanup_timeout`]
/// of the deletion, released anyway with a Warning Event: a coordinator that is gone or stuck
/// must not keep the job forever.
async fn cleanup(
    ctx: &Context,
    job: &DataflowJob,
    namespace: &str,
) -> Result<(Action, Outcome), Error> {
    ctx.autoscalers.forget(&Autoscalers::key(job));
    if !has_finalizer(job) {
        return Ok((Action::await_change(), Outcome::Skipped));
    }
    let name = job.name_any();
    let old = job.status.clone().unwrap_or_default();
    let previous = status::previous_state(&old);
    let coordinator_up =
        follow_wait(Some(JobState::Pending), &ctx.pods.of_job(namespace, &name)).is_some();
    let nothing_to_stop = match previous {
        Some(s) if s.is_terminal() => Some(format!(
            "The job was {} when deleted: nothing to cancel",
            status::state_name(s)
        )),
        // A job that is starting is cancelled only if its coordinator runs.
        None | Some(JobState::Pending) if !coordinator_up => Some(
            "The job's coordinator was not running when the job was deleted: nothing to cancel"
                .into(),
        ),
        _ => None,
    };
    if let Some(why) = nothing_to_stop {
        tracing::info!(job = %key(job), "{why}; releasing");
        remove_finalizer(ctx, job, namespace).await?;
        return Ok((Action::await_change(), Outcome::Cleanup));
    }

    let address = children::coordinator_address(&name, namespace, &ctx.settings.cluster_domain);
    let answer = match ctx.coordinator.cancel(&address).await {
        Ok(()) => ctx
            .coordinator
            .status(&address, Some(CLEANUP_WAIT))
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let deleted_at = job
        .metadata
        .deletion_timestamp
        .as_ref()
        .map_or_else(Timestamp::now, |t| t.0);
    let waited = Timestamp::now().duration_since(deleted_at);
    let timeout = SignedDuration::try_from(ctx.cleanup_timeout).unwrap_or(SignedDuration::MAX);
    let event = match &answer {
        Ok(p) if p.phase.is_terminal() => Event {
            type_: EventType::Normal,
            reason: "CleanedUp".into(),
            note: Some(format!(
                "Deleted while active: the coordinator cancelled the job ({:?}) and aborted its sinks' temporary files",
                p.phase
            )),
            action: "Cleanup".into(),
            secondary: None,
        },
        _ if waited < timeout => {
            let state = answer
                .as_ref()
                .map_or_else(|e| e.clone(), |p| format!("still {:?}", p.phase));
            tracing::info!(job = %key(job), %state, "deleted: waiting for the coordinator to cancel");
            return Ok((Action::requeue(CLEANUP_RETRY), Outcome::Cleanup));
        }
        _ => {
            let why = match &answer {
                Ok(p) => format!("it still reported {:?}", p.phase),
                Err(e) => e.clone(),
            };
            Event {
                type_: EventType::Warning,
                reason: "CleanupTimedOut".into(),
                note: Some(format!(
                    "Deleted while active, and the coordinator did not confirm the cancel within {} s ({why}); releasing the job: its sinks' temporary files (.temp-riverbank-*) may remain",
                    ctx.cleanup_timeout.as_secs()
                )),
                action: "Cleanup".into(),
                secondary: None,
            }
        }
    };
    publish(ctx, job, &event).await;
    remove_finalizer(ctx, job, namespace).await?;
    Ok((Action::await_change(), Outcome::Cleanup))
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

/// What brings a job to the reconciler: a new spec (generation), a change of its annotations or
/// finalizers, and its deletion. Not its status: the operator writes that itself, and says in
/// [`next_action`] when it wants to look again.
pub fn job_trigger(job: &DataflowJob) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    predicates::generation
        .combine(predicates::annotations)
        .combine(predicates::finalizers)
        .hash_property(job)
        .hash(&mut h);
    job.metadata.deletion_timestamp.is_some().hash(&mut h);
    Some(h.finish())
}

/// Runs the controller over `namespaces` (all when empty; one controller per listed namespace,
/// so namespaced RBAC suffices) until `stop` turns true. In-flight reconciles finish first
/// (kube-runtime's graceful shutdown); none takes longer than a long poll of the coordinator.
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

async fn run_scope(ctx: Arc<Context>, namespace: Option<String>, stop: watch::Receiver<bool>) {
    let client = ctx.client.clone();
    let ns = namespace.as_deref();
    // Watch (and cache) only our own children, not every ConfigMap in the cluster.
    let ours =
        watcher::Config::default().labels(&format!("{}=riverbank-operator", labels::MANAGED_BY));
    tracing::info!(
        namespace = ns.unwrap_or("<all>"),
        "starting the DataflowJob controller"
    );
    let (jobs_reader, jobs_writer) = reflector::store();
    let jobs_ready = jobs_reader.clone();
    let jobs = watcher(
        scoped::<DataflowJob>(client.clone(), ns),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(jobs_writer)
    .applied_objects()
    .predicate_filter(job_trigger, Default::default());
    let (pods_reader, pods_writer) = reflector::store();
    ctx.pods.register(namespace.clone(), pods_reader);
    let pods = watcher(
        scoped::<Pod>(client.clone(), ns),
        watcher::Config::default().labels(labels::JOB),
    )
    .default_backoff()
    .reflect(pods_writer)
    .touched_objects();
    let mut graceful = stop.clone();
    let controller = Controller::for_stream(jobs, jobs_reader)
        .with_config(ControllerConfig::default().debounce(Duration::from_millis(500)))
        .owns(scoped::<ConfigMap>(client.clone(), ns), ours.clone())
        .owns(scoped::<Service>(client.clone(), ns), ours.clone())
        .owns(scoped::<StatefulSet>(client.clone(), ns), ours)
        .watches_stream(pods, |pod: Pod| {
            let job = pod.labels().get(labels::JOB)?.clone();
            Some(ObjectRef::new(&job).within(&pod.namespace()?))
        })
        .graceful_shutdown_on(async move {
            let _ = graceful.wait_for(|stop| *stop).await;
        })
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((job, action)) => tracing::debug!(%job, ?action, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "controller"),
            }
        });
    // kube-runtime's graceful shutdown waits for the reconciles under way, but also, before the
    // first list of jobs has arrived, for that list: a stop before then ends at once (nothing
    // has been reconciled yet).
    let mut stopping = stop;
    let before_ready = async move {
        let _ = stopping.wait_for(|stop| *stop).await;
        if futures::FutureExt::now_or_never(jobs_ready.wait_until_ready()).is_none() {
            return;
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = controller => {}
        () = before_ready => tracing::info!(namespace = ns.unwrap_or("<all>"), "stopped before the first list of jobs arrived"),
    }
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;
