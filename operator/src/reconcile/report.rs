//! Phase 7, report: the one place that turns the phases' results into what people and tools
//! see — the next status (`status::planned_status`, pure), the Events of the change (the
//! status's transitions, streaming control's steps, vertical autoscaling's), the console's
//! observation and the job's metrics — and then writes them: status through the status
//! subresource (a change of numbers alone at most once per status interval), then the Events.
use super::admit::{Admitted, Invalid};
use super::apply::Applied;
use super::context::{Context, Error, key};
use super::control::Steered;
use super::run::Ran;
use super::scale::Scaled;
use super::write;
use crate::console;
use crate::crd::{DataflowJob, DataflowJobStatus, StageStatus};
use crate::lifecycle::current_workers;
use crate::status::{self, Observed, StreamingObserved};
use crate::streaming;
use kube::runtime::events::Event;
use kube::{Resource, ResourceExt};
use riverbank_console::Graph;
use riverbank_pipeline::progress::JobProgress;
use std::time::Instant;

/// What this reconcile reports about a job.
pub struct Report {
    /// The status it was found with.
    pub old: DataflowJobStatus,
    pub next: DataflowJobStatus,
    /// The Events to publish once `next` is written, in order.
    pub events: Vec<Event>,
    /// For the console: the plan's stages and the coordinator's reading.
    pub graph: Option<Graph>,
    pub progress: Option<JobProgress>,
}

/// The report of a job that was planned, observed, scaled and applied.
pub fn planned(
    job: &DataflowJob,
    admitted: &Admitted,
    steered: &Steered,
    ran: Ran,
    scaled: &Scaled,
    applied: &Applied,
) -> Report {
    // The console's copy: `ran.progress` itself goes into the status.
    let shown = ran.reading().cloned();
    let mut next = status::planned_status(
        job,
        Observed {
            stages: if job.is_beam_sdk() {
                // Planned by the runner pod, from the pipeline proto: as it reports them.
                ran.reading()
                    .map(StageStatus::from_progress)
                    .unwrap_or_else(|| {
                        job.status
                            .as_ref()
                            .map(|s| s.stages.clone())
                            .unwrap_or_default()
                    })
            } else {
                StageStatus::from_plan(&steered.plan)
            },
            target_workers: scaled.replicas.workers,
            progress: ran.progress,
            pod_problem: ran.pod_problem,
            cancel: ran.cancel,
            insights: scaled.found.clone(),
            autoscaling: scaled.autoscaled.memory.clone(),
            memory: scaled.memory.status.clone(),
            streaming: StreamingObserved {
                run: applied.run.clone(),
                control: steered.control.clone(),
            },
            now: admitted.now,
        },
    );
    next.current_workers = Some(current_workers(shown.as_ref(), applied.ready_workers));
    if let Some(st) = next.streaming.as_mut() {
        // The shards of the plan that runs (a refused update's spec may ask for others); a
        // Beam SDK pipeline's state is in its runner, in no shard.
        st.shards = match job.is_beam_sdk() {
            true => 0,
            false => streaming::shards(&steered.plan),
        };
        st.shards_per_worker = next
            .current_workers
            .filter(|&w| w > 0 && st.shards > 0)
            .map(|w| (st.shards + w - 1) / w);
    }
    let mut events = status::events(&admitted.old, &next, scaled.autoscaled.event.as_ref());
    events.extend(
        steered
            .control
            .iter()
            .flat_map(|c| &c.events)
            .map(streaming::Note::event),
    );
    events.extend(scaled.memory.event.as_ref().map(|e| e.event()));
    Report {
        old: admitted.old.clone(),
        next,
        events,
        graph: Some(Graph::from_plan(&steered.plan)),
        progress: shown,
    }
}

/// The report of a job whose spec can't run: Failed, once per generation.
pub fn invalid(job: &DataflowJob, invalid: &Invalid) -> Report {
    tracing::info!(job = %key(job), reason = invalid.reason, error = %invalid.error, "the spec cannot run");
    let old = job.status.clone().unwrap_or_default();
    let next = status::invalid_status(job, invalid.reason, &invalid.error, invalid.now);
    let events = status::events(&old, &next, None);
    Report {
        old,
        next,
        events,
        graph: None,
        progress: None,
    }
}

/// A job whose invalid spec was reported already: shown as it is.
pub fn unchanged(ctx: &Context, job: &DataflowJob, status: &DataflowJobStatus) {
    console::show(&ctx.console, job, status, None, None);
}

/// The report's metrics and console observation.
pub fn show(ctx: &Context, job: &DataflowJob, report: &Report) {
    let namespace = job.namespace().unwrap_or_default();
    ctx.metrics.job(&namespace, &job.name_any(), &report.next);
    console::show(
        &ctx.console,
        job,
        &report.next,
        report.graph.clone(),
        report.progress.as_ref(),
    );
}

/// Writes status (when it changed) and then the report's Events, so a failed write publishes
/// nothing and the retry publishes them once. A change of the numbers alone
/// (`status::only_metrics_changed`) is written at most once per status interval: a running job
/// is reconciled about every second, and its throughput moves every time.
pub async fn write(
    ctx: &Context,
    job: &DataflowJob,
    namespace: &str,
    report: Report,
) -> Result<DataflowJobStatus, Error> {
    let key = key(job);
    let recently_written = ctx
        .written
        .lock()
        .expect("not poisoned")
        .get(&key)
        .is_some_and(|at| at.elapsed() < ctx.status_interval);
    let spaced_out = recently_written && status::only_metrics_changed(&report.old, &report.next);
    if job.status.as_ref() != Some(&report.next) && !spaced_out {
        write::status(ctx, job, namespace, &report.next).await?;
        ctx.written
            .lock()
            .expect("not poisoned")
            .insert(key, Instant::now());
    }
    for event in &report.events {
        publish(ctx, job, event).await;
    }
    Ok(report.next)
}

/// Events are for people: a failure to publish one is logged, never retried.
pub async fn publish(ctx: &Context, job: &DataflowJob, event: &Event) {
    tracing::info!(job = %key(job), reason = %event.reason, note = ?event.note, "event");
    console::event(&ctx.console, job, event);
    if let Err(e) = ctx.recorder.publish(event, &job.object_ref(&())).await {
        tracing::warn!(job = %key(job), error = %e, "could not publish an event");
        ctx.metrics.error("event");
    }
}

/// A deleted job being released leaves the console and the metrics (a failed release shows it
/// again at the retry).
pub fn forget(ctx: &Context, job: &DataflowJob, namespace: &str) {
    ctx.console.remove(namespace, &job.name_any());
    ctx.metrics.forget_job(namespace, &job.name_any());
}
