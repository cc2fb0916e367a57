//! The operator's own Prometheus metrics (prometheus-client): reconciles and their durations
//! by outcome, errors by kind, and whether this replica leads.
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

pub struct Metrics {
    registry: Registry,
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
}
