//! status.insights and their Events, as pure functions: what holds now (from the autoscaling
//! engine, the coordinator's progress and the pods; `riverbank_autoscale::insights` decides each
//! one) folded into the list the old status had, so an insight keeps its `since` and its first
//! message while it holds about the same subject (its numbers move every reading, and a status
//! write per reading would be a write storm), and the Events for what appeared or cleared.
use crate::crd::InsightStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event, EventType};
use riverbank_autoscale::{Finding, Insight};

/// An insight that held at the engine's last full evaluation, with its numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct StandingInsight {
    pub finding: Finding,
}

impl StandingInsight {
    pub fn code(&self) -> &'static str {
        self.finding.insight.code()
    }
}

/// What the autoscaler (`scaling::JobScaler`) says about a job's insights (MAX_NUM_WORKERS,
/// ACTIVE_KEYS).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum InsightState {
    /// No full evaluation since the operator started: the condition is left as it is.
    #[default]
    Unknown,
    /// Evaluated, and no insight holds.
    Clear,
    Holds(StandingInsight),
}

/// What one reconcile found, by where it comes from. Each source that was not looked at this
/// time leaves its insights as they were.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Found {
    /// MAX_NUM_WORKERS, ACTIVE_KEYS: the engine's verdict at its last full evaluation.
    pub engine: InsightState,
    /// HIGH_FAN_OUT, LONG_WORK_ITEM, STUCK, HOT_KEY: None when the coordinator did not answer.
    pub progress: Option<Vec<Finding>>,
    /// WORKER_OUT_OF_MEMORY, from the pod watch.
    pub pods: Vec<Finding>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Engine,
    Progress,
    Pods,
}

fn source(i: Insight) -> Source {
    match i {
        Insight::MaxNumWorkers | Insight::ActiveKeys => Source::Engine,
        Insight::WorkerOutOfMemory => Source::Pods,
        _ => Source::Progress,
    }
}

fn insight_of(s: &InsightStatus) -> Option<Insight> {
    Insight::from_code(&s.type_)
}

/// The next status.insights, most pressing first (Insight order), one per type.
pub fn next_insights(old: &[InsightStatus], found: &Found, now: Timestamp) -> Vec<InsightStatus> {
    let mut findings: Vec<&Finding> = found.pods.iter().collect();
    let carried = |src: Source| {
        old.iter()
            .filter(move |s| insight_of(s).is_some_and(|i| source(i) == src))
            .cloned()
    };
    let mut out: Vec<InsightStatus> = vec![];
    match &found.engine {
        InsightState::Holds(s) => findings.push(&s.finding),
        InsightState::Clear => {}
        InsightState::Unknown => out.extend(carried(Source::Engine)),
    }
    match &found.progress {
        Some(f) => findings.extend(f),
        None => out.extend(carried(Source::Progress)),
    }
    for f in findings {
        if out.iter().any(|s| s.type_ == f.insight.code()) {
            continue;
        }
        let same = old
            .iter()
            .find(|s| s.type_ == f.insight.code() && s.subject.as_deref() == Some(&f.subject));
        out.push(match same {
            Some(s) => s.clone(),
            None => InsightStatus {
                type_: f.insight.code().to_string(),
                subject: Some(f.subject.clone()),
                since: Time(now),
                message: f.message.clone(),
                recommendation: f.recommendation.clone(),
            },
        });
    }
    out.sort_by_key(|s| insight_of(s).map_or(usize::MAX, |i| i as usize));
    out
}

/// Events for the change: a Warning per insight that appeared (or holds about a new subject),
/// with its recommendation; a Normal one per insight that cleared while the job still runs.
pub fn events(old: &[InsightStatus], new: &[InsightStatus], running: bool) -> Vec<Event> {
    let mut out = vec![];
    for n in new {
        if !old
            .iter()
            .any(|o| o.type_ == n.type_ && o.subject == n.subject)
        {
            out.push(Event {
                type_: EventType::Warning,
                reason: n.type_.clone(),
                note: Some(format!(
                    "{} Recommendation: {}",
                    n.message, n.recommendation
                )),
                action: "Diagnose".into(),
                secondary: None,
            });
        }
    }
    if running {
        for o in old {
            if !new.iter().any(|n| n.type_ == o.type_) {
                let title = insight_of(o).map_or(o.type_.as_str(), |i| i.title());
                out.push(Event {
                    type_: EventType::Normal,
                    reason: o.type_.clone(),
                    note: Some(format!("Cleared: no longer holds ({title})")),
                    action: "Diagnose".into(),
                    secondary: None,
                });
            }
        }
    }
    out
}

/// Whether `reason` (a Degraded condition's) is an insight's name.
pub fn is_insight_reason(reason: &str) -> bool {
    Insight::from_code(reason).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(insight: Insight, subject: &str, message: &str) -> Finding {
        Finding {
            insight,
            subject: subject.into(),
            message: message.into(),
            recommendation: "do something".into(),
        }
    }

    fn at(t: i64) -> Timestamp {
        Timestamp::from_second(t).unwrap()
    }

    #[test]
    fn an_insight_keeps_its_since_and_first_message_while_its_subject_holds() {
        let found = |secs: &str| Found {
            progress: Some(vec![finding(
                Insight::LongWorkItem,
                "S00/item-7",
                &format!("running for {secs} s"),
            )]),
            ..Found::default()
        };
        let first = next_insights(&[], &found("70"), at(100));
        assert_eq!(first.len(), 1);
        assert_eq!(
            (
                first[0].type_.as_str(),
                first[0].since.0,
                first[0].message.as_str()
            ),
            ("LONG_WORK_ITEM", at(100), "running for 70 s")
        );
        let ev = events(&[], &first, true);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].reason, "LONG_WORK_ITEM");
        assert!(matches!(ev[0].type_, EventType::Warning));
        assert_eq!(
            ev[0].note.as_deref(),
            Some("running for 70 s Recommendation: do something")
        );
        // A second later the numbers moved: nothing to write, nothing to publish.
        let again = next_insights(&first, &found("71"), at(101));
        assert_eq!(again, first);
        assert!(events(&first, &again, true).is_empty());
        // The coordinator did not answer: the insight stays as it was.
        let unknown = next_insights(&first, &Found::default(), at(102));
        assert_eq!(unknown, first);
        // Another item is now the long one: a new subject, since and Event.
        let mut other = found("80");
        other.progress.as_mut().unwrap()[0].subject = "S00/item-9".into();
        let moved = next_insights(&first, &other, at(103));
        assert_eq!(moved[0].since.0, at(103));
        assert_eq!(events(&first, &moved, true).len(), 1);
        // It ends: cleared, with a Normal Event (none once the job is over).
        let none = Found {
            progress: Some(vec![]),
            ..Found::default()
        };
        let cleared = next_insights(&moved, &none, at(104));
        assert!(cleared.is_empty());
        let ev = events(&moved, &cleared, true);
        assert_eq!(
            (ev[0].reason.as_str(), ev[0].note.as_deref()),
            (
                "LONG_WORK_ITEM",
                Some("Cleared: no longer holds (Stage spending too long on work)")
            )
        );
        assert!(matches!(ev[0].type_, EventType::Normal));
        assert!(events(&moved, &cleared, false).is_empty());
    }

    #[test]
    fn sources_are_merged_in_insight_order_and_an_unknown_engine_keeps_its_own() {
        let found = Found {
            engine: InsightState::Holds(StandingInsight {
                finding: finding(Insight::MaxNumWorkers, "MAX_NUM_WORKERS", "busy"),
            }),
            progress: Some(vec![finding(Insight::HighFanOut, "S00/Explode", "fan")]),
            pods: vec![finding(Insight::WorkerOutOfMemory, "j-worker-1", "oom")],
        };
        let all = next_insights(&[], &found, at(1));
        let types: Vec<_> = all.iter().map(|s| s.type_.as_str()).collect();
        assert_eq!(
            types,
            ["WORKER_OUT_OF_MEMORY", "MAX_NUM_WORKERS", "HIGH_FAN_OUT"]
        );
        // After an operator restart the engine has no verdict: its insight stays; the pods no
        // longer show a kill: that one clears.
        let later = Found {
            engine: InsightState::Unknown,
            progress: Some(vec![finding(Insight::HighFanOut, "S00/Explode", "fan")]),
            pods: vec![],
        };
        let next = next_insights(&all, &later, at(2));
        let types: Vec<_> = next.iter().map(|s| s.type_.as_str()).collect();
        assert_eq!(types, ["MAX_NUM_WORKERS", "HIGH_FAN_OUT"]);
        assert_eq!(next[0].since.0, at(1));
        assert!(is_insight_reason("HIGH_FAN_OUT") && !is_insight_reason("CrashLoopBackOff"));
    }
}
