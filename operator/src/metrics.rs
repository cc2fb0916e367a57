//! The operator's own Prometheus metrics (prometheus-client): reconciles and their durations
//! by outcome, errors by kind, and whether this replica leads.
use crate::crd::{DataflowJobStatus, JobState};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::time::Duration;

/// How a reconcile ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Children applied and status up to date.
    Applied,
    /// The spec can't run; reported in status, not retried.
    Invalid,
    /// Nothing to do (an invalid spec already reported, or a deleted job already released).
    Skipped,
    /// A deleted job: its coordinator told to cancel, or the job released (finalizer removed).
    Cleanup,
    /// Failed; retried with backoff.
    Error,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Invalid => "invalid",
            Outcome::Skipped => "skipped",
            Outcome::Cleanup => "cleanup",
            Outcome::Error => "error",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    namespace: String,
    job_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobStateLabels {
    namespace: String,
    job_name: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RescaleLabels {
    namespace: String,
    job_name: String,
    direction: String,
}

/// Every state a job can report (status.state), so each has its gauge.
const JOB_STATES: [JobState; 8] = [
    JobState::Pending,
    JobState::Running,
    JobState::Done,
    JobState::Failed,
    JobState::Cancelled,
    JobState::Draining,
    JobState::Drained,
    JobState::Updating,
];

pub struct Metrics {
    registry: Registry,
    job_state: Family<JobStateLabels, Gauge>,
    job_current_workers: Family<JobLabels, Gauge>,
    job_target_workers: Family<JobLabels, Gauge>,
    rescales: Family<RescaleLabels, Counter>,
    reconciles: Family<OutcomeLabels, Counter>,
    durations: Family<OutcomeLabels, Histogram, fn() -> Histogram>,
    errors: Family<ErrorLabels, Counter>,
    leader: Gauge,
}

fn duration_histogram() -> Histogram {
    // 5 ms .. ~20 s: a reconcile is a handful of API calls plus one coordinator request.
    Histogram::new(exponential_buckets(0.005, 2.0, 12))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("riverbank_operator");
        let reconciles = Family::<OutcomeLabels, Counter>::default();
        let durations = Family::<OutcomeLabels, Histogram>::new_with_constructor(
            duration_histogram as fn() -> Histogram,
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        let leader = Gauge::default();
        let job_state = Family::<JobStateLabels, Gauge>::default();
        let job_current_workers = Family::<JobLabels, Gauge>::default();
        let job_target_workers = Family::<JobLabels, Gauge>::default();
        let rescales = Family::<RescaleLabels, Counter>::default();
        registry.register(
            "job_state",
            "1 for a DataflowJob's status.state, 0 for its other states",
            job_state.clone(),
        );
        registry.register(
            "job_current_workers",
            "A DataflowJob's workers running now (status.currentWorkers)",
            job_current_workers.clone(),
        );
        registry.register(
            "job_target_workers",
            "The worker count the operator runs a DataflowJob at (status.targetWorkers)",
            job_target_workers.clone(),
        );
        registry.register(
            "job_rescales",
            "Autoscaling rescales of a DataflowJob, by direction (up, down)",
            rescales.clone(),
        );
        registry.register(
            "reconciles",
            "DataflowJob reconciles, by outcome (applied, invalid, skipped, error)",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time one DataflowJob reconcile took, by outcome",
            durations.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles, by kind of error (kube, coordinator, ...)",
            errors.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease and reconciles, else 0",
            leader.clone(),
        );
        Metrics {
            registry,
            job_state,
            job_current_workers,
            job_target_workers,
            rescales,
            reconciles,
            durations,
            errors,
            leader,
        }
    }
}

impl Metrics {
    pub fn reconciled(&self, outcome: Outcome, took: Duration) {
        let labels = OutcomeLabels {
            outcome: outcome.as_str().into(),
        };
        self.reconciles.get_or_create(&labels).inc();
        self.durations
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    pub fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&ErrorLabels { error: kind.into() })
            .inc();
    }

    /// A job's state and worker counts, as its status now says.
    pub fn job(&self, namespace: &str, name: &str, status: &DataflowJobStatus) {
        let job = JobLabels {
            namespace: namespace.into(),
            job_name: name.into(),
        };
        for state in JOB_STATES {
            self.job_state
                .get_or_create(&JobStateLabels {
                    namespace: namespace.into(),
                    job_name: name.into(),
                    state: format!("{state:?}"),
                })
                .set(i64::from(status.state == Some(state)));
        }
        self.job_current_workers
            .get_or_create(&job)
            .set(status.current_workers.unwrap_or_default().into());
        self.job_target_workers
            .get_or_create(&job)
            .set(status.target_workers.unwrap_or_default().into());
    }

    /// An autoscaling rescale the operator applied.
    pub fn rescaled(&self, namespace: &str, name: &str, up: bool) {
        self.rescales
            .get_or_create(&RescaleLabels {
                namespace: namespace.into(),
                job_name: name.into(),
                direction: if up { "up" } else { "down" }.into(),
            })
            .inc();
    }

    /// A released (deleted) job's series go.
    pub fn forget_job(&self, namespace: &str, name: &str) {
        let job = JobLabels {
            namespace: namespace.into(),
            job_name: name.into(),
        };
        for state in JOB_STATES {
            self.job_state.remove(&JobStateLabels {
                namespace: namespace.into(),
                job_name: name.into(),
                state: format!("{state:?}"),
            });
        }
        self.job_current_workers.remove(&job);
        self.job_target_workers.remove(&job);
        for direction in ["up", "down"] {
            self.rescales.remove(&RescaleLabels {
                namespace: namespace.into(),
                job_name: name.into(),
                direction: direction.into(),
            });
        }
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// The Prometheus text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_reconciles_errors_durations_and_leadership() {
        let m = Metrics::default();
        m.reconciled(Outcome::Applied, Duration::from_millis(20));
        m.reconciled(Outcome::Applied, Duration::from_millis(30));
        m.reconciled(Outcome::Error, Duration::from_millis(1));
        m.error("kube");
        m.set_leader(true);
        let text = m.encode();
        assert!(
            text.contains("riverbank_operator_reconciles_total{outcome=\"applied\"} 2"),
            "{text}"
        );
        assert!(text.contains("riverbank_operator_reconciles_total{outcome=\"error\"} 1"));
        assert!(text.contains("riverbank_operator_reconcile_errors_total{error=\"kube\"} 1"));
        assert!(text.contains(
            "riverbank_operator_reconcile_duration_seconds_count{outcome=\"applied\"} 2"
        ));
        assert!(text.contains("riverbank_operator_leader 1"));
    }

    #[test]
    fn exposes_each_jobs_state_and_workers_until_it_is_released() {
        let m = Metrics::default();
        let status = DataflowJobStatus {
            state: Some(JobState::Failed),
            current_workers: Some(2),
            target_workers: Some(3),
            ..Default::default()
        };
        m.job("ns", "taxi", &status);
        m.rescaled("ns", "taxi", true);
        let text = m.encode();
        for line in [
            r#"riverbank_operator_job_state{namespace="ns",job_name="taxi",state="Failed"} 1"#,
            r#"riverbank_operator_job_state{namespace="ns",job_name="taxi",state="Running"} 0"#,
            r#"riverbank_operator_job_current_workers{namespace="ns",job_name="taxi"} 2"#,
            r#"riverbank_operator_job_target_workers{namespace="ns",job_name="taxi"} 3"#,
            r#"riverbank_operator_job_rescales_total{namespace="ns",job_name="taxi",direction="up"} 1"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        m.forget_job("ns", "taxi");
        assert!(!m.encode().contains("taxi"));
    }
}
