//! Phase 3, control streaming: a streaming job whose coordinator runs it is steered through
//! that coordinator, before its status is read (drain, named snapshots, an update's check and
//! stop: `before_poll`) and after (an update's old pipeline stopped, its new run started:
//! `after_poll`). What it decides (the plan the children run, the run, snapshots, update and
//! their Events) is this phase's [`Steered`], which the report records. The pure steps are in
//! `crate::streaming`.
use super::admit::Admitted;
use super::context::{Context, Error};
use super::plan::{Pipeline, Planned};
use super::run::Ran;
use crate::children::{self, without_worker_counts};
use crate::crd::{
    DataflowJob, DataflowJobStatus, DesiredState, SnapshotStatus, UpdatePhase, UpdateStatus,
};
use crate::streaming::{self, Control, current_run, event, shards, update_snapshot_name};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use riverbank_pipeline::{PipelineError, Plan, UpdateCheck};

/// The plan the children run, and the steering of a streaming job its coordinator runs.
#[derive(Debug, Clone)]
pub struct Steered {
    pub plan: Plan,
    pub control: Option<Control>,
}

/// Before the poll: the spec's plan as it is, or, for a steered job, what its coordinator was
/// told and which plan the children run.
pub async fn steer(
    ctx: &Context,
    job: &DataflowJob,
    admitted: &Admitted,
    planned: &Planned,
) -> Result<Steered, Error> {
    match &planned.pipeline {
        Pipeline::Spec(plan) => {
            if job.is_beam_sdk() && admitted.streaming {
                drain_if_asked(ctx, job, &admitted.address).await;
            }
            Ok(Steered {
                plan: plan.clone(),
                control: None,
            })
        }
        Pipeline::Steered(spec) => {
            let c = before_poll(
                ctx,
                job,
                &admitted.namespace,
                &admitted.address,
                spec.as_ref(),
                admitted.now,
            )
            .await?;
            Ok(Steered {
                plan: c.plan.clone(),
                control: Some(c),
            })
        }
    }
}

/// After the poll: the coordinator's answer as it belongs to the current run
/// (`streaming::after_poll`), and an update whose old pipeline has stopped switches the
/// children to the new one now.
pub fn after_poll(
    job: &DataflowJob,
    planned: &Planned,
    mut steered: Steered,
    mut ran: Ran,
    now: Timestamp,
) -> (Steered, Ran) {
    if let Some(c) = steered.control.as_mut() {
        ran.progress = streaming::after_poll(job, c, ran.progress, now);
        if c.update.as_ref().is_some_and(|u| {
            u.phase == UpdatePhase::Restarting && Some(u.generation) == job.metadata.generation
        }) && let Some(p) = planned.spec()
        {
            c.plan = p.clone();
            steered.plan = p.clone();
        }
    }
    (steered, ran)
}

/// Drains, snapshots and update steps that need the coordinator before its status is read, for
/// a job its coordinator runs. `new_plan` is the spec's plan.
async fn before_poll(
    ctx: &Context,
    job: &DataflowJob,
    namespace: &str,
    address: &str,
    new_plan: Result<&Plan, &PipelineError>,
    now: Timestamp,
) -> Result<Control, Error> {
    let old = job.status.clone().unwrap_or_default();
    let generation = job.metadata.generation.unwrap_or(1);
    let run = current_run(job);
    let mut c = Control {
        plan: match new_plan {
            Ok(p) => p.clone(),
            Err(_) => running_plan(ctx, job, namespace).await?.ok_or_else(|| {
                Error::Stale("an invalid pipeline and no running plan to keep".into())
            })?,
        },
        run,
        update: old.update.clone(),
        snapshots: old.snapshots.clone(),
        events: vec![],
    };
    drain_if_asked(ctx, job, address).await;
    take_snapshot(ctx, job, address, &old, &mut c, now).await;

    let pending = c.update.as_ref().filter(|u| u.generation == generation);
    match pending.map(|u| u.phase) {
        // Already decided for this generation: keep doing what was decided.
        Some(UpdatePhase::Refused) | Some(UpdatePhase::Stopping) => {
            if let Some(p) = running_plan(ctx, job, namespace).await? {
                c.plan = p;
            }
        }
        Some(UpdatePhase::Restarting) | Some(UpdatePhase::Done) => {}
        None if c.run.generation.max(c.run.spec_generation.unwrap_or(0)) >= generation => {}
        // A job being drained or cancelled is not updated.
        None if job.spec.desired_state != DesiredState::Running => {}
        None => decide_update(ctx, job, namespace, address, new_plan, &mut c, now).await?,
    }
    Ok(c)
}

/// `desiredState: Drained`: the coordinator (or a streaming Beam SDK job's runner) is told,
/// every reconcile while draining: a restarted one forgets it was asked.
async fn drain_if_asked(ctx: &Context, job: &DataflowJob, address: &str) {
    if job.spec.desired_state == DesiredState::Drained
        && let Err(e) = ctx.coordinator.drain(address).await
    {
        tracing::warn!(job = %job.name_any_ns(), error = %e, "drain: the coordinator did not answer");
    }
}

/// A new generation on a running streaming job: a rescale or pod change (applied as usual), or
/// an update, checked by the coordinator and then started (or refused).
async fn decide_update(
    ctx: &Context,
    job: &DataflowJob,
    namespace: &str,
    address: &str,
    new_plan: Result<&Plan, &PipelineError>,
    c: &mut Control,
    now: Timestamp,
) -> Result<(), Error> {
    let generation = job.metadata.generation.unwrap_or(1);
    let Some(running) = running_plan(ctx, job, namespace).await? else {
        // No plan on record (the ConfigMap is gone): nothing to compare; apply the new spec
        // to the run as it is (its pods restart from the last checkpoint).
        c.run.spec_generation = Some(generation);
        return Ok(());
    };
    let refuse = |c: &mut Control, message: String| {
        c.events.push(event(
            EventType::Warning,
            "UpdateRefused",
            "Update",
            format!(
                "Generation {generation} is not applied; the running pipeline runs on: {message}"
            ),
        ));
        c.update = Some(UpdateStatus {
            generation,
            phase: UpdatePhase::Refused,
            message,
            snapshot: None,
            time: Time(now),
        });
        c.plan = running.clone();
    };
    let new_plan = match new_plan {
        Ok(p) => p,
        Err(e) => {
            refuse(c, format!("the new pipeline is invalid: {e}"));
            return Ok(());
        }
    };
    if same_pipeline(new_plan, &running) {
        // Worker counts or pod settings: the job goes on under the same run.
        c.run.spec_generation = Some(generation);
        return Ok(());
    }
    // The shards are the state's partitioning: a new count would need a re-split.
    if shards(new_plan) != shards(&running) {
        refuse(
            c,
            format!(
                "options.maxNumWorkers is the number of state shards: the job's state is in {} and the new spec asks for {}; keep it, or start a new job",
                shards(&running),
                shards(new_plan)
            ),
        );
        return Ok(());
    }
    let check = UpdateCheck {
        plan: new_plan.clone(),
        transform_name_mapping: job.spec.transform_name_mapping.clone(),
    };
    let verdict = ctx
        .coordinator
        .update_check(address, &check)
        .await
        .map_err(|e| Error::Coordinator(e.to_string()))?;
    if !verdict.compatible {
        refuse(c, verdict.reason.unwrap_or_else(|| "incompatible".into()));
        return Ok(());
    }
    let snapshot = update_snapshot_name(generation);
    ctx.coordinator
        .stop(address, &snapshot)
        .await
        .map_err(|e| Error::Coordinator(e.to_string()))?;
    c.events.push(event(
        EventType::Normal,
        "Updating",
        "Update",
        format!(
            "Generation {generation} can take the job's state: stopping after the checkpoint under way, then starting the new pipeline from snapshot {snapshot}"
        ),
    ));
    c.update = Some(UpdateStatus {
        generation,
        phase: UpdatePhase::Stopping,
        message: "Finishing the checkpoint under way, then keeping the state as a snapshot".into(),
        snapshot: None,
        time: Time(now),
    });
    c.plan = running;
    Ok(())
}

/// `spec.snapshot` names a snapshot not taken yet: ask the coordinator for it. A failure (no
/// checkpoint completed yet) is retried at the next reconcile; it is reported once.
async fn take_snapshot(
    ctx: &Context,
    job: &DataflowJob,
    address: &str,
    old: &DataflowJobStatus,
    c: &mut Control,
    now: Timestamp,
) {
    let Some(name) = job.spec.snapshot.as_ref().map(|s| s.name.as_str()) else {
        return;
    };
    if old.snapshots.iter().any(|s| s.name == name) {
        return;
    }
    match ctx.coordinator.snapshot(address, name).await {
        Ok(taken) => {
            c.events.push(event(
                EventType::Normal,
                "SnapshotTaken",
                "Snapshot",
                format!(
                    "Snapshot {name} of checkpoint {}: {}",
                    taken.checkpoint, taken.location
                ),
            ));
            c.snapshots.push(SnapshotStatus {
                name: name.to_string(),
                checkpoint: i64::try_from(taken.checkpoint).unwrap_or(i64::MAX),
                location: taken.location,
                time: Time(now),
            });
        }
        Err(e) => {
            tracing::info!(job = %job.name_any_ns(), snapshot = name, error = %e, "snapshot not taken yet");
        }
    }
}

/// True when two plans differ only in the worker counts (a rescale, not an update).
fn same_pipeline(a: &Plan, b: &Plan) -> bool {
    without_worker_counts(a) == without_worker_counts(b)
}

/// The plan the job's pods run now, as the operator last wrote it (the plan ConfigMap).
async fn running_plan(
    ctx: &Context,
    job: &DataflowJob,
    namespace: &str,
) -> Result<Option<Plan>, Error> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
    let name = children::plan_config_map_name(&job.name_any());
    let Some(cm) = api.get_opt(&name).await? else {
        return Ok(None);
    };
    Ok(cm
        .data
        .as_ref()
        .and_then(|d| d.get("plan.json"))
        .and_then(|json| serde_json::from_str(json).ok()))
}

trait NameNs {
    fn name_any_ns(&self) -> String;
}

impl NameNs for DataflowJob {
    fn name_any_ns(&self) -> String {
        format!(
            "{}/{}",
            self.namespace().unwrap_or_default(),
            self.name_any()
        )
    }
}
