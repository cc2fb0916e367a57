//! The reconciler: a kube-runtime `Controller` on DataflowJobs that owns their ConfigMaps,
//! Services and StatefulSets and watches their pods.
//!
//! One reconcile is `reconcile::reconcile_job`, a sequence of named phases (admit, plan,
//! control streaming, run, scale, apply, report, finish); here the controller around it: the
//! watches, the metrics of each reconcile, the retry backoff.
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
use crate::children::labels;
use crate::crd::DataflowJob;
use crate::metrics::Outcome;
use crate::reconcile::reconcile_job;
use crate::reconcile::{Context, Error, key};
use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Predicate, WatchStreamExt, predicates, watcher};
use kube::{Client, Resource, ResourceExt};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Retry delays after failed reconciles: 5 s, doubling, at most 5 minutes.
const BACKOFF_FIRST: Duration = Duration::from_secs(5);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

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
/// `reconcile::next_action` when it wants to look again.
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
