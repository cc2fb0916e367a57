//! Phase 5, scale: the job's pods, decided once. Horizontal: a THROUGHPUT_BASED job's
//! autoscaler takes the coordinator's reading (`scaling::Autoscalers`); vertical: the workers'
//! memory from their pods and their memory use (`memory::decide_for`); then the pod counts
//! (`scaling::replicas`) and the insights found on the way.
use super::admit::Admitted;
use super::context::{Context, key};
use super::plan::Planned;
use super::run::Ran;
use crate::children;
use crate::crd::{AutoscalingAlgorithm, DataflowJob};
use crate::insights::{Found, InsightState};
use crate::lifecycle::Replicas;
use crate::memory::{self, MemoryOutcome};
use crate::scaling::{self, Autoscaled, Autoscalers};
use riverbank_autoscale::{Decision, InsightConfig, insights};

pub struct Scaled {
    /// The autoscaler's view (its key in `Context::autoscalers`: `scaler`).
    pub autoscaled: Autoscaled,
    pub scaler: String,
    /// Vertical autoscaling: the workers' memory.
    pub memory: MemoryOutcome,
    /// The insights found, by source.
    pub found: Found,
    /// The pods the job runs with.
    pub replicas: Replicas,
}

pub fn scale(
    ctx: &Context,
    job: &DataflowJob,
    admitted: &Admitted,
    planned: &Planned,
    ran: &Ran,
) -> Scaled {
    let scaler = Autoscalers::key(job);
    let reading = ran.reading();
    let workers = planned.workers.as_ref().ok();
    let autoscaled = if admitted.going()
        && job.spec.options.autoscaling() == AutoscalingAlgorithm::ThroughputBased
    {
        let cores = children::cores(job, workers);
        let cfg = scaling::engine_config(job);
        let stored = job.status.as_ref().and_then(|s| s.autoscaling.as_ref());
        let autoscaled = ctx.autoscalers.observe(
            &scaler,
            &cfg,
            reading,
            stored,
            ctx.clock.now_secs(),
            admitted.now,
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
    // Vertical autoscaling: the workers' memory, from their pods and their memory use.
    let memory = memory::decide_for(
        job,
        workers,
        &ran.pods,
        reading,
        admitted.going(),
        scaling::engine_config(job).dry_run,
        admitted.now,
    );
    let found = Found {
        engine: autoscaled.insight.clone(),
        progress: reading.map(|p| insights::from_progress(p, &InsightConfig::default())),
        pods: insights::worker_out_of_memory(&memory.oom_kills, memory.what_next.clone())
            .into_iter()
            .collect(),
    };
    // The one decision of this reconcile's pod counts.
    let replicas = scaling::replicas(job, autoscaled.target);
    Scaled {
        autoscaled,
        scaler,
        memory,
        found,
        replicas,
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
