//! The operator's web console (riverbank-console): each reconcile shows its job there as its
//! status says (state, workers, insights, the autoscaler's last evaluation), with the fused
//! stage graph from its plan and the coordinator's progress; Events as they are published.
//! Read-only, and nothing else: no Secret, no pod spec or environment reaches it.
use crate::crd::{DataflowJob, DataflowJobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::events::{Event, EventType};
use riverbank_console::{Console, Evaluation, Graph, Insight, Observation};
use riverbank_pipeline::JobProgress;

fn unix(t: &Time) -> f64 {
    t.0.as_millisecond() as f64 / 1000.0
}

/// What the console shows of `job` given the status just decided for it.
pub fn observation(
    job: &DataflowJob,
    status: &DataflowJobStatus,
    graph: Option<Graph>,
    progress: Option<&JobProgress>,
) -> Observation {
    Observation {
        state: status
            .state
            .map(|s| format!("{s:?}"))
            .unwrap_or_else(|| "Pending".into()),
        message: status.message.clone().unwrap_or_default(),
        created: job.metadata.creation_timestamp.as_ref().map(unix),
        current_workers: status.current_workers.unwrap_or_default().max(0) as u32,
        target_workers: status.target_workers.unwrap_or_default().max(0) as u32,
        streaming: job.spec.options.streaming(),
        graph,
        progress: progress.cloned(),
        insights: status
            .insights
            .iter()
            .map(|i| Insight {
                code: i.type_.clone(),
                subject: i.subject.clone(),
                message: i.message.clone(),
                recommendation: i.recommendation.clone(),
                since: i.since.0.to_string(),
            })
            .collect(),
        evaluation: status
            .autoscaling
            .as_ref()
            .and_then(|a| a.last_evaluation.as_ref())
            .map(|e| Evaluation {
                time: e.time.0.to_string(),
                decision: format!("{:?}", e.decision),
                current_workers: e.current_workers.max(0) as u32,
                target_workers: e.target_workers.max(0) as u32,
                reason: e.reason.clone(),
                message: e.message.clone(),
                dry_run: e.dry_run,
            }),
    }
}

pub fn show(
    console: &Console,
    job: &DataflowJob,
    status: &DataflowJobStatus,
    graph: Option<Graph>,
    progress: Option<&JobProgress>,
) {
    console.observe(
        &job.namespace().unwrap_or_default(),
        &job.name_any(),
        observation(job, status, graph, progress),
    );
}

/// An Event published about `job`, on its page.
pub fn event(console: &Console, job: &DataflowJob, event: &Event) {
    console.event(
        &job.namespace().unwrap_or_default(),
        &job.name_any(),
        riverbank_console::Event {
            time: riverbank_console::store::now_secs(),
            type_: match event.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .into(),
            reason: event.reason.clone(),
            message: event.note.clone().unwrap_or_default(),
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{
        AutoscalingStatus, EvaluationStatus, InsightStatus, JobState, ScalingDecision,
    };

    #[test]
    fn shows_the_status_the_reconcile_decided() {
        let mut job = crate::fixtures::JobBuilder::new("taxi").numbers().build();
        job.metadata.creation_timestamp = Some(Time("2026-01-01T00:00:00Z".parse().unwrap()));
        let t = Time("2026-01-01T00:01:00Z".parse().unwrap());
        let status = DataflowJobStatus {
            state: Some(JobState::Running),
            current_workers: Some(2),
            target_workers: Some(3),
            insights: vec![InsightStatus {
                type_: "MAX_NUM_WORKERS".into(),
                subject: None,
                since: t.clone(),
                message: "m".into(),
                recommendation: "r".into(),
            }],
            autoscaling: Some(AutoscalingStatus {
                last_evaluation: Some(EvaluationStatus {
                    time: t.clone(),
                    decision: ScalingDecision::ScaleUp,
                    current_workers: 2,
                    target_workers: 3,
                    reason: "HIGH_BACKLOG".into(),
                    message: "backlog".into(),
                    dry_run: false,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let o = observation(&job, &status, None, None);
        assert_eq!(
            (o.state.as_str(), o.current_workers, o.target_workers),
            ("Running", 2, 3)
        );
        assert_eq!(o.created, Some(1767225600.0));
        assert_eq!(o.insights[0].code, "MAX_NUM_WORKERS");
        let e = o.evaluation.unwrap();
        assert_eq!(
            (e.decision.as_str(), e.reason.as_str()),
            ("ScaleUp", "HIGH_BACKLOG")
        );
        assert_eq!(e.time, "2026-01-01T00:01:00Z");
    }
}
