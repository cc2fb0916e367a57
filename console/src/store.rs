//! The console's memory: each job's latest observation, and bounded histories (samples for the
//! charts, autoscaling markers, events), so a long-running operator with many jobs stays small.
use crate::model::{
    Event, Graph, JobDetail, JobSummary, Marker, Observation, Sample, StageRate, WorkerSample,
};
use std::collections::{BTreeMap, VecDeque};
use std::sync::RwLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Chart points kept per job: 15 minutes at one a second.
pub const HISTORY_LEN: usize = 900;
/// Samples closer together than this replace the last one (the operator may observe a job
/// several times a second while it reconciles).
pub const MIN_SAMPLE_GAP_SECS: f64 = 0.5;
/// Stage rates are averaged over at least this long: a stream's stages move a checkpoint at
/// a time, so a rate between two samples would be nothing or a burst.
pub const RATE_WINDOW_SECS: f64 = 10.0;
pub const MARKERS_LEN: usize = 200;
pub const EVENTS_LEN: usize = 200;

/// A namespace and a name.
pub type JobKey = (String, String);

#[derive(Default)]
struct JobRecord {
    latest: Observation,
    graph: Graph,
    history: VecDeque<Sample>,
    markers: VecDeque<Marker>,
    events: VecDeque<Event>,
    /// The evaluation time a marker was last made from: each decision marks the chart once.
    marked: Option<String>,
    /// Per stage, elements and bytes in at the samples of the last [`RATE_WINDOW_SECS`] (and
    /// the one before), with their times: the stages' rates.
    counts: VecDeque<(f64, Vec<(u64, u64)>)>,
    rates: Vec<StageRate>,
    /// When the newest sample was appended (later ones within the gap replace it).
    appended_at: f64,
}

/// The jobs the console shows. Feeders write, the HTTP handlers read.
#[derive(Default)]
pub struct Console {
    jobs: RwLock<BTreeMap<JobKey, JobRecord>>,
}

pub fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

fn push_bounded<T>(q: &mut VecDeque<T>, v: T, cap: usize) {
    if q.len() == cap {
        q.pop_front();
    }
    q.push_back(v);
}

impl Console {
    pub fn new() -> Console {
        Console::default()
    }

    /// Records what a feeder knows of a job now.
    pub fn observe(&self, namespace: &str, name: &str, obs: Observation) {
        self.observe_at(namespace, name, obs, now_secs());
    }

    /// [`Console::observe`] at a given time (tests).
    pub fn observe_at(&self, namespace: &str, name: &str, mut obs: Observation, t: f64) {
        let mut jobs = self.jobs.write().unwrap_or_else(|p| p.into_inner());
        let r = jobs
            .entry((namespace.to_string(), name.to_string()))
            .or_default();
        if let Some(g) = obs.graph.take() {
            r.graph = g;
        }
        if let Some(e) = &obs.evaluation
            && r.marked.as_ref() != Some(&e.time)
        {
            r.marked = Some(e.time.clone());
            if e.target_workers != e.current_workers {
                push_bounded(
                    &mut r.markers,
                    Marker {
                        t,
                        decision: e.decision.clone(),
                        from: e.current_workers,
                        to: e.target_workers,
                        reason: e.reason.clone(),
                        message: e.message.clone(),
                    },
                    MARKERS_LEN,
                );
            }
        }
        if let Some(p) = &obs.progress {
            let sample = Sample {
                t,
                workers: obs.current_workers,
                target_workers: obs.target_workers,
                throughput_bytes: p.throughput_bytes_per_sec,
                throughput_elements: p.throughput_elements_per_sec,
                backlog_seconds: p.backlog_seconds,
                remaining_bytes: p.remaining_bytes,
                watermark_lag_seconds: p.streaming.as_ref().and_then(|s| s.watermark_lag_seconds),
                backlog_elements: p.streaming.as_ref().map(|s| s.backlog_elements),
                backlog_bytes: p.streaming.as_ref().map(|s| s.backlog_bytes),
                worker_samples: p
                    .workers
                    .iter()
                    .filter(|w| w.alive)
                    .map(|w| WorkerSample {
                        name: w.name.clone(),
                        cpu: w.cpu,
                        rss_bytes: w.rss_bytes,
                    })
                    .collect(),
            };
            let counts: Vec<(u64, u64)> = p
                .stages
                .iter()
                .map(|s| (s.elements_in, s.bytes_in))
                .collect();
            match r.history.back_mut() {
                Some(last) if t - r.appended_at < MIN_SAMPLE_GAP_SECS => *last = sample,
                _ => {
                    if let Some((t0, before)) = r.counts.front()
                        && t > *t0
                    {
                        let dt = t - t0;
                        r.rates = p
                            .stages
                            .iter()
                            .zip(before)
                            .map(|(s, (e0, b0))| StageRate {
                                id: s.name.clone(),
                                elements_per_sec: s.elements_in.saturating_sub(*e0) as f64 / dt,
                                bytes_per_sec: s.bytes_in.saturating_sub(*b0) as f64 / dt,
                            })
                            .collect();
                    }
                    r.counts.push_back((t, counts));
                    while r.counts.len() > 1 && t - r.counts[1].0 >= RATE_WINDOW_SECS {
                        r.counts.pop_front();
                    }
                    r.appended_at = t;
                    push_bounded(&mut r.history, sample, HISTORY_LEN);
                }
            }
        }
        // A job that ended keeps its last known progress on its page.
        if obs.progress.is_none() {
            obs.progress = r.latest.progress.take();
        }
        r.latest = obs;
    }

    /// Records an Event of a job (one already known or not).
    pub fn event(&self, namespace: &str, name: &str, event: Event) {
        let mut jobs = self.jobs.write().unwrap_or_else(|p| p.into_inner());
        let r = jobs
            .entry((namespace.to_string(), name.to_string()))
            .or_default();
        push_bounded(&mut r.events, event, EVENTS_LEN);
    }

    /// Forgets a deleted job.
    pub fn remove(&self, namespace: &str, name: &str) {
        let mut jobs = self.jobs.write().unwrap_or_else(|p| p.into_inner());
        jobs.remove(&(namespace.to_string(), name.to_string()));
    }

    pub fn list(&self) -> Vec<JobSummary> {
        let jobs = self.jobs.read().unwrap_or_else(|p| p.into_inner());
        jobs.iter().map(|(k, r)| summary(k, r)).collect()
    }

    pub fn job(&self, namespace: &str, name: &str) -> Option<JobDetail> {
        let jobs = self.jobs.read().unwrap_or_else(|p| p.into_inner());
        let key = (namespace.to_string(), name.to_string());
        let r = jobs.get(&key)?;
        Some(JobDetail {
            summary: summary(&key, r),
            message: r.latest.message.clone(),
            streaming: r.latest.streaming,
            graph: r.graph.clone(),
            progress: r.latest.progress.clone(),
            stage_rates: r.rates.clone(),
            history: r.history.iter().cloned().collect(),
            markers: r.markers.iter().cloned().collect(),
            events: r.events.iter().cloned().collect(),
            insights: r.latest.insights.clone(),
            evaluation: r.latest.evaluation.clone(),
            now: now_secs(),
        })
    }
}

fn summary((namespace, name): &JobKey, r: &JobRecord) -> JobSummary {
    let o = &r.latest;
    JobSummary {
        namespace: namespace.clone(),
        name: name.clone(),
        state: o.state.clone(),
        current_workers: o.current_workers,
        target_workers: o.target_workers,
        backlog_seconds: o.progress.as_ref().and_then(|p| p.backlog_seconds),
        progress: o.progress.as_ref().map(|p| p.fraction_consumed),
        created: o.created,
        insights: o.insights.iter().map(|i| i.code.clone()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Evaluation;
    use riverbank_pipeline::{JobPhase, JobProgress, StageProgress};

    fn progress(bytes_in: u64) -> JobProgress {
        JobProgress {
            job_name: "j".into(),
            phase: JobPhase::Running,
            message: String::new(),
            failure: None,
            started_at: None,
            finished_at: None,
            work_items_total: 4,
            work_items_done: 1,
            work_items_running: 1,
            fraction_consumed: 0.25,
            remaining_bytes: 100,
            throughput_bytes_per_sec: 10.0,
            throughput_elements_per_sec: 1.0,
            backlog_seconds: Some(10.0),
            active_keys: None,
            runnable_items: 0,
            splittable_items: 0,
            workers: vec![],
            stages: vec![StageProgress {
                name: "S00".into(),
                bytes_in,
                elements_in: bytes_in / 10,
                ..Default::default()
            }],
            work_items: vec![],
            streaming: None,
        }
    }

    fn running(bytes_in: u64, evaluation: Option<Evaluation>) -> Observation {
        Observation {
            state: "Running".into(),
            current_workers: 2,
            target_workers: 3,
            progress: Some(progress(bytes_in)),
            evaluation,
            ..Default::default()
        }
    }

    fn evaluation(time: &str, from: u32, to: u32) -> Evaluation {
        Evaluation {
            time: time.into(),
            decision: if to > from { "ScaleUp" } else { "Hold" }.into(),
            current_workers: from,
            target_workers: to,
            reason: "HIGH_BACKLOG".into(),
            message: "m".into(),
            dry_run: false,
        }
    }

    #[test]
    fn history_is_bounded_and_close_samples_replace_the_last() {
        let c = Console::new();
        for i in 0..HISTORY_LEN + 10 {
            c.observe_at("ns", "j", running(i as u64, None), i as f64);
        }
        // Within the minimum gap of the last appended sample: replaces it, does not add.
        let last = (HISTORY_LEN + 9) as f64;
        c.observe_at("ns", "j", running(0, None), last + 0.3);
        c.observe_at("ns", "j", running(0, None), last + 0.45);
        let d = c.job("ns", "j").unwrap();
        assert_eq!(d.history.len(), HISTORY_LEN);
        assert_eq!(d.history[0].t, 10.0);
        assert_eq!(d.history.last().unwrap().t, last + 0.45);
        // Observed more often than the gap, samples are still appended once per gap.
        c.observe_at("ns", "j", running(0, None), last + 0.6);
        assert_eq!(
            c.job("ns", "j").unwrap().history[HISTORY_LEN - 2].t,
            last + 0.45
        );
    }

    #[test]
    fn each_rescale_decision_marks_the_chart_once_and_stage_rates_follow_the_counters() {
        let c = Console::new();
        c.observe_at("ns", "j", running(0, Some(evaluation("a", 2, 2))), 0.0);
        c.observe_at("ns", "j", running(100, Some(evaluation("b", 2, 3))), 1.0);
        c.observe_at("ns", "j", running(300, Some(evaluation("b", 2, 3))), 3.0);
        let d = c.job("ns", "j").unwrap();
        assert_eq!(d.markers.len(), 1, "{:?}", d.markers);
        assert_eq!(
            (d.markers[0].from, d.markers[0].to, d.markers[0].t),
            (2, 3, 1.0)
        );
        assert_eq!(d.stage_rates[0].bytes_per_sec, 100.0);
        assert_eq!(d.stage_rates[0].elements_per_sec, 10.0);
        assert_eq!(c.list()[0].backlog_seconds, Some(10.0));
    }

    /// A stream's counters move a checkpoint at a time: its stage rates are averaged over the
    /// rate window, not a burst between two samples nor nothing between checkpoints.
    #[test]
    fn stage_rates_average_a_streams_checkpoint_bursts() {
        let c = Console::new();
        for (t, bytes) in [
            (0.0, 0),
            (1.0, 0),
            (2.0, 1000),
            (3.0, 1000),
            (4.0, 2000),
            (5.0, 2000),
        ] {
            c.observe_at("ns", "j", running(bytes, None), t);
        }
        assert_eq!(
            c.job("ns", "j").unwrap().stage_rates[0].bytes_per_sec,
            400.0
        );
        // Past the window, the oldest samples no longer count.
        for i in 6..=20 {
            c.observe_at("ns", "j", running(2000 + (i - 5) * 100, None), i as f64);
        }
        let rate = c.job("ns", "j").unwrap().stage_rates[0].bytes_per_sec;
        assert!((rate - 100.0).abs() < 1e-9, "{rate}");
    }

    /// A Beam SDK job's stream has its sources' bytes left as backlog, not elements.
    #[test]
    fn a_streams_backlog_in_bytes_is_charted() {
        let c = Console::new();
        let mut o = running(0, None);
        let p = o.progress.as_mut().unwrap();
        p.streaming = Some(riverbank_pipeline::progress::StreamingProgress {
            backlog_bytes: 36_000,
            ..Default::default()
        });
        c.observe_at("ns", "j", o, 0.0);
        let sample = &c.job("ns", "j").unwrap().history[0];
        assert_eq!(
            (sample.backlog_bytes, sample.backlog_elements),
            (Some(36_000), Some(0))
        );
        let json = serde_json::to_value(sample).unwrap();
        assert_eq!(json["backlogBytes"], 36_000);
    }

    /// The job list stays small however long 100 jobs have run: it carries no history.
    #[test]
    fn a_hundred_jobs_with_full_histories_list_in_a_few_kilobytes() {
        let c = Console::new();
        for j in 0..100 {
            for i in 0..HISTORY_LEN {
                c.observe_at(
                    "ns",
                    &format!("job-{j:03}"),
                    running(i as u64, None),
                    i as f64,
                );
            }
        }
        let list = serde_json::to_string(&c.list()).unwrap();
        assert_eq!(c.list().len(), 100);
        assert!(list.len() < 100 * 300, "{} bytes", list.len());
        let page = serde_json::to_string(&c.job("ns", "job-042").unwrap()).unwrap();
        assert!(page.len() < HISTORY_LEN * 400, "{} bytes", page.len());
    }

    #[test]
    fn a_finished_job_keeps_its_last_progress_and_a_deleted_one_goes() {
        let c = Console::new();
        c.observe_at("ns", "j", running(5, None), 0.0);
        c.observe_at(
            "ns",
            "j",
            Observation {
                state: "Done".into(),
                ..Default::default()
            },
            1.0,
        );
        let d = c.job("ns", "j").unwrap();
        assert_eq!(d.summary.state, "Done");
        assert_eq!(d.progress.unwrap().stages[0].bytes_in, 5);
        c.remove("ns", "j");
        assert!(c.job("ns", "j").is_none() && c.list().is_empty());
    }
}
