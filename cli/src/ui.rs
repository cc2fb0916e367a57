//! `riverbank run --ui`: the web console (riverbank-console, the operator's) on a local port,
//! fed from the run's own progress: the local coordinator's status with `--workers`, the
//! in-process tracker's otherwise.
use anyhow::{Context, Result};
use riverbank_autoscale::Decision;
use riverbank_autoscale::insights::InsightBook;
use riverbank_console::store::now_secs;
use riverbank_console::{Console, Evaluation, Event, Graph, Insight, Observation};
use riverbank_pipeline::{JobProgress, Plan};
use std::net::SocketAddr;
use std::sync::Arc;

/// The namespace local runs are listed under.
pub const NAMESPACE: &str = "local";

/// Where the console listens.
#[derive(Clone, Debug)]
pub struct UiOptions {
    pub bind: String,
    pub port: u16,
}

/// What a local run tells its console.
pub struct LocalUi {
    console: Arc<Console>,
    job: String,
    created: f64,
    streaming: bool,
    /// The insights last shown, kept on the page once the run is over.
    last_insights: std::sync::Mutex<Vec<Insight>>,
}

/// How a run stands, beyond its progress.
pub struct RunState<'a> {
    pub progress: Option<&'a JobProgress>,
    /// Overrides the progress's phase (the run's own outcome at its end).
    pub state: Option<&'a str>,
    pub workers: u32,
    pub target_workers: u32,
    pub insights: Vec<Insight>,
    pub evaluation: Option<Evaluation>,
}

impl LocalUi {
    /// Serves the console (on the current runtime) and prints its address.
    pub async fn start(opts: &UiOptions, plan: &Plan) -> Result<Arc<LocalUi>> {
        let addr: SocketAddr = crate::bind::addr(&opts.bind, opts.port)?;
        let console = Arc::new(Console::new());
        let (bound, server) = riverbank_console::serve(addr, console.clone())
            .await
            .with_context(|| format!("the console cannot listen on {addr}"))?;
        tokio::spawn(server);
        let ui = LocalUi {
            console,
            job: plan.job_name.clone(),
            created: now_secs(),
            streaming: plan.options.streaming,
            last_insights: Default::default(),
        };
        ui.console.observe(
            NAMESPACE,
            &ui.job,
            Observation {
                state: "Pending".into(),
                created: Some(ui.created),
                streaming: ui.streaming,
                graph: Some(Graph::from_plan(plan)),
                ..Default::default()
            },
        );
        eprintln!("console: http://{bound}/jobs/{NAMESPACE}/{}", ui.job);
        Ok(Arc::new(ui))
    }

    pub fn observe(&self, mut s: RunState<'_>) {
        {
            let mut last = self.last_insights.lock().unwrap_or_else(|e| e.into_inner());
            if s.progress.is_some() {
                *last = s.insights.clone();
            } else if s.insights.is_empty() {
                s.insights = last.clone();
            }
        }
        let state = match (s.state, s.progress) {
            (Some(state), _) => state.to_string(),
            (None, Some(p)) => format!("{:?}", p.phase),
            (None, None) => "Pending".into(),
        };
        self.console.observe(
            NAMESPACE,
            &self.job,
            Observation {
                message: s.progress.map(|p| p.message.clone()).unwrap_or_default(),
                state,
                created: Some(self.created),
                current_workers: s.workers,
                target_workers: s.target_workers,
                streaming: self.streaming,
                graph: None,
                progress: s.progress.cloned(),
                insights: s.insights,
                evaluation: s.evaluation,
            },
        );
    }

    /// An Event on the job's page (Normal or Warning).
    pub fn event(&self, warning: bool, reason: &str, message: &str) {
        self.console.event(
            NAMESPACE,
            &self.job,
            Event {
                time: now_secs(),
                type_: if warning { "Warning" } else { "Normal" }.into(),
                reason: reason.into(),
                message: message.into(),
            },
        );
    }
}

/// The insights standing now, as badges.
pub fn insights(book: &InsightBook) -> Vec<Insight> {
    book.standing()
        .map(|(at, f)| Insight {
            code: f.insight.code().to_string(),
            subject: Some(f.subject.clone()).filter(|s| s != f.insight.code()),
            message: f.message.clone(),
            recommendation: f.recommendation.clone(),
            since: format!("{at:.1} s into the run"),
        })
        .collect()
}

/// An autoscaling decision of `run --autoscale`, as status.autoscaling.lastEvaluation shows one.
pub fn evaluation(d: &Decision) -> Evaluation {
    use std::cmp::Ordering::*;
    Evaluation {
        time: format!("{:.1} s (engine clock)", d.at_secs),
        decision: match d.target_workers.cmp(&d.current_workers) {
            Greater => "ScaleUp",
            Less => "ScaleDown",
            Equal => "Hold",
        }
        .into(),
        current_workers: d.current_workers,
        target_workers: d.target_workers,
        reason: serde_json::to_value(d.reason)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_else(|| format!("{:?}", d.reason)),
        message: d.message.clone(),
        dry_run: d.dry_run,
    }
}

impl LocalUi {
    /// The run's outcome: Done, or Failed with why (an Event).
    pub fn finished(&self, error: Option<String>, workers: u32) {
        if let Some(e) = &error {
            self.event(true, "Failed", e);
        }
        self.observe(RunState {
            progress: None,
            state: Some(if error.is_some() { "Failed" } else { "Done" }),
            workers,
            target_workers: workers,
            insights: vec![],
            evaluation: None,
        });
    }
}

/// The in-process run's progress into the console, with the insights it shows.
pub fn in_process_observer(ui: Arc<LocalUi>) -> riverbank_engine::ProgressObserver {
    use riverbank_autoscale::{InsightConfig, insights::from_progress};
    use riverbank_cluster::telemetry::{CpuMeter, rss_bytes};
    let book = std::sync::Mutex::new(InsightBook::default());
    let start = std::time::Instant::now();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = std::sync::Mutex::new(CpuMeter::new(cores));
    Arc::new(move |mut p: JobProgress| {
        // One worker: this process (the tracker lists its slots, which have no CPU or memory
        // of their own).
        p.workers = vec![riverbank_pipeline::WorkerProgress {
            name: "local".into(),
            alive: true,
            items_done: p.work_items_done,
            items_running: p.work_items_running,
            cpu: cpu.lock().unwrap_or_else(|e| e.into_inner()).sample(),
            rss_bytes: rss_bytes(),
            ..Default::default()
        }];
        let insights = {
            let mut b = book.lock().unwrap_or_else(|e| e.into_inner());
            let raised = b.update(
                from_progress(&p, &InsightConfig::default()),
                start.elapsed().as_secs_f64(),
            );
            for f in raised {
                ui.event(true, f.insight.code(), &f.message);
            }
            insights(&b)
        };
        ui.observe(RunState {
            progress: Some(&p),
            state: None,
            workers: 1,
            target_workers: 1,
            insights,
            evaluation: None,
        });
    })
}
