//! `riverbank runner-harness`: the pod that runs a Beam SDK pipeline's DataflowJob, Dataflow's
//! runner harness. It reads the submitted job from object storage (`stored`), fetches its staged
//! files onto its disk, starts the SDK harnesses in the job's SDK worker pods (Beam's worker
//! pool in each, `--sdk-worker-pool`, so the user's code runs spread over them), plans and runs
//! the stages (`riverbank_portable::execute`: the runner-native ones here, the SDK stages'
//! bundles on the harnesses), and answers the operator as a coordinator does: `GET /v1/status`
//! (the job's `JobProgress`, a long poll with `?wait_ms=`, with what the autoscaler reads: the
//! running stage's backlog and throughput, each SDK worker pod's harnesses and how busy they
//! are; a streaming job's watermark and checkpoints), `POST /v1/cancel` and, for a streaming
//! job, `POST /v1/job/drain`; `POST /v1/sdk-workers` gives it the SDK worker pods' pools as the
//! operator scales them. The harnesses dial back to its Fn API at `--fn-api-advertise` (on
//! Kubernetes the runner pod's IP).
//!
//! A finished job's outcome is kept on the pod's disk, so a restarted pod reports it instead of
//! running the job again; the metrics go beside the pipeline (`metrics.pb`) for the job service.
//! A streaming job checkpoints to its `--temp_location` (else the DataflowJob's tempLocation)
//! in object storage, so a restarted pod, on any node, goes on from its last checkpoint; one
//! that updates another pipeline in place (`replaces/` in its folder) takes over that
//! pipeline's checkpoint. On SIGTERM (the pod deleted, rolled for an update, evicted) a
//! streaming job stops between two rounds after a last checkpoint, within [`STOP_WAIT`] of the
//! pod's 30-s grace period, so the pod after it goes on from there: nothing it did is done
//! again.
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::extract::{Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use prost::Message;
use riverbank_pipeline::JobFailure;
use riverbank_pipeline::progress::{
    JobPhase, JobProgress, StageProgress, StreamingProgress, WorkerProgress,
};
use riverbank_portable::PortableError;
use riverbank_portable::execute::progress::Live;
use riverbank_portable::execute::{self, Ended, RunSettings};
use riverbank_portable::fnapi::FnServer;
use riverbank_portable::job_api::MetricResults;
use riverbank_portable::launch::relocate_files;
use riverbank_portable::metrics::JobMetrics;
use riverbank_portable::plan::Plan;
use riverbank_portable::runner_api::Pipeline;
use tokio::sync::{Notify, watch};

use super::stored::{self, Folder};

#[derive(clap::Args)]
pub struct RunnerArgs {
    /// The submitted job's folder (`spec.beamPipeline.location`).
    #[arg(long, value_name = "URL")]
    pipeline_location: String,
    /// Beam's SDK worker pools (`host:port`, repeated: one per SDK worker pod) in which the
    /// pipeline's DOCKER environments get their harnesses, until `POST /v1/sdk-workers` says
    /// otherwise.
    #[arg(long = "sdk-worker-pool", default_value = "localhost:50000")]
    sdk_worker_pools: Vec<String>,
    /// Seconds the pools have to answer at first (their pods may be pulling the SDK image); a
    /// pool that does not is done without while others have harnesses.
    #[arg(long, default_value_t = 600)]
    sdk_pool_wait_secs: u64,
    /// SDK harnesses per environment in each pool, unless the pipeline sets
    /// `--sdk_worker_parallelism`.
    #[arg(long, default_value_t = 2)]
    sdk_workers: usize,
    /// Where the Fn API listens (port 0: any free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    fn_api_bind: std::net::SocketAddr,
    /// The host harnesses dial for the Fn API (its port is the bound one).
    #[arg(long, default_value = "127.0.0.1")]
    fn_api_advertise: String,
    /// Port of `/v1/status` and `/v1/cancel` (the operator's).
    #[arg(long, default_value_t = 7070)]
    port: u16,
    #[arg(long, default_value = "0.0.0.0")]
    bind: IpAddr,
    /// The pod's disk: the staged files and the job's outcome.
    #[arg(long, default_value = "/var/lib/riverbank")]
    state_dir: PathBuf,
    /// Also serve /healthz and /readyz on this port.
    #[arg(long)]
    health_port: Option<u16>,
    /// Also serve /metrics on this port.
    #[arg(long)]
    metrics_port: Option<u16>,
    /// MiB of materialized PCollections held in memory; the rest waits on disk.
    #[arg(long, default_value_t = 1024)]
    memory_mb: usize,
    /// The job's name in harness ids and logs (default: `$RIVERBANK_JOB`, else `beam`).
    #[arg(long)]
    job_name: Option<String>,
    /// Exit once the job is over (default: keep serving its final status until stopped).
    #[arg(long)]
    exit_when_done: bool,
    /// Where a streaming job checkpoints when its pipeline sets no `--temp_location` (the
    /// DataflowJob's `options.tempLocation`).
    #[arg(long, value_name = "URL")]
    temp_location: Option<String>,
}

/// The outcome kept on the pod's disk.
const OUTCOME: &str = "beam-job.json";

/// The job as `/v1/status` shows it.
struct Status {
    progress: Mutex<JobProgress>,
    changed: Notify,
    cancel: watch::Sender<bool>,
    /// A streaming job is drained.
    drain: watch::Sender<bool>,
    /// A streaming job stops after a last checkpoint (the pod is stopping).
    stop: watch::Sender<bool>,
    /// The SDK worker pools the job may use now.
    pools: watch::Sender<Vec<String>>,
    /// Those it started with (`--sdk-worker-pool`).
    started_pools: Vec<String>,
}

impl Status {
    fn update(&self, f: impl FnOnce(&mut JobProgress)) {
        f(&mut self.progress.lock().expect("status"));
        self.changed.notify_waiters();
    }

    fn get(&self) -> JobProgress {
        self.progress.lock().expect("status").clone()
    }
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339()
}

fn pending(job_name: &str) -> JobProgress {
    JobProgress {
        started_at: Some(now()),
        ..JobProgress::new(job_name, JobPhase::Pending, "reading the pipeline")
    }
}

pub fn runner_harness(args: RunnerArgs) -> Result<()> {
    crate::runtime(2)?.block_on(serve(args))
}

/// How long a stopping pod waits for its streaming job's last checkpoint: within the pod's
/// grace period (30 s) before Kubernetes kills it.
const STOP_WAIT: Duration = Duration::from_secs(20);

async fn serve(args: RunnerArgs) -> Result<()> {
    let job_name = args
        .job_name
        .clone()
        .or_else(|| std::env::var("RIVERBANK_JOB").ok())
        .unwrap_or_else(|| "beam".into());
    std::fs::create_dir_all(&args.state_dir)
        .with_context(|| format!("creating {}", args.state_dir.display()))?;
    let outcome = args.state_dir.join(OUTCOME);
    let kept = std::fs::read(&outcome)
        .ok()
        .and_then(|b| serde_json::from_slice::<JobProgress>(&b).ok())
        .filter(|p| p.phase.is_terminal());
    let status = Arc::new(Status {
        progress: Mutex::new(kept.clone().unwrap_or_else(|| pending(&job_name))),
        changed: Notify::new(),
        cancel: watch::channel(false).0,
        drain: watch::channel(false).0,
        stop: watch::channel(false).0,
        pools: watch::channel(args.sdk_worker_pools.clone()).0,
        started_pools: args.sdk_worker_pools.clone(),
    });
    let listener = tokio::net::TcpListener::bind((args.bind, args.port))
        .await
        .with_context(|| format!("listening on {}:{}", args.bind, args.port))?;
    tracing::info!("runner harness of {job_name} on {}", listener.local_addr()?);
    let api = Router::new()
        .route("/v1/status", get(status_route))
        .route("/v1/cancel", post(cancel_route))
        .route("/v1/job/drain", post(drain_route))
        .route("/v1/sdk-workers", post(sdk_workers_route))
        .merge(ops_routes())
        .with_state(status.clone());
    tokio::spawn(async move { axum::serve(listener, api).await });
    for port in [args.health_port, args.metrics_port].into_iter().flatten() {
        let listener = tokio::net::TcpListener::bind((args.bind, port))
            .await
            .with_context(|| format!("listening on {}:{port}", args.bind))?;
        let ops = ops_routes().with_state(status.clone());
        tokio::spawn(async move { axum::serve(listener, ops).await });
    }

    if kept.is_none() {
        let job = run(&args, &job_name, &status, &outcome);
        tokio::pin!(job);
        tokio::select! {
            _ = &mut job => {}
            _ = terminated() => {
                let streaming = status.get().streaming.is_some();
                status.stop.send_replace(true);
                let stopped = streaming && tokio::time::timeout(STOP_WAIT, &mut job).await.is_ok();
                match stopped {
                    true => tracing::info!("stopped after a last checkpoint: the next pod goes on from it"),
                    false => tracing::info!("stopped before the job ended"),
                }
                return Ok(());
            }
        }
    } else {
        tracing::info!("the job already ended: {}", status.get().message);
    }
    if !args.exit_when_done {
        terminated().await;
    }
    Ok(())
}

/// Runs the job, keeps its final progress in `outcome`, then sets it in `status`: in that order,
/// so a pod stopped as soon as it reports the end finds the end when it restarts (and does not
/// run the batch job again).
async fn run(args: &RunnerArgs, job_name: &str, status: &Status, outcome: &Path) {
    let live = Arc::new(Live::default());
    let result = match Folder::at(&args.pipeline_location) {
        Ok(folder) => {
            let result = execute_job(&folder, args, job_name, status, live.clone()).await;
            let metrics = MetricResults {
                attempted: live.attempted().infos(),
                committed: live.committed().infos(),
            };
            if let Err(e) = folder.put(stored::METRICS, metrics.encode_to_vec()).await {
                tracing::warn!("cannot write the job's metrics: {e:#}");
            }
            result
        }
        Err(e) => Err(e),
    };
    let mut end = status.get();
    let p = &mut end;
    p.finished_at = Some(now());
    p.work_items_running = 0;
    match result {
        Ok(Ended::Done) => {
            p.phase = JobPhase::Done;
            p.fraction_consumed = 1.0;
            p.message = format!("done: {} stages", p.work_items_total);
        }
        // The pod is stopping: the job is not over, the next pod resumes it from the checkpoint
        // just written. No outcome is kept.
        Ok(Ended::Stopped(_)) => return,
        Ok(Ended::Drained) => {
            p.phase = JobPhase::Done;
            p.fraction_consumed = 1.0;
            p.message = "drained: every window fired".into();
            let sp = p.streaming.get_or_insert_with(Default::default);
            sp.draining = true;
        }
        Err(e) => {
            let cancelled = e
                .downcast_ref::<PortableError>()
                .is_some_and(|e| matches!(e, PortableError::Cancelled));
            let message = format!("{e:#}");
            tracing::error!("{message}");
            if cancelled {
                p.phase = JobPhase::Cancelled;
                p.message = "cancelled".into();
            } else {
                p.phase = JobPhase::Failed;
                p.message = message.clone();
                p.failure = Some(JobFailure {
                    transform: None,
                    message,
                    record: None,
                    attempts: 1,
                });
            }
        }
    }
    // Best effort: without it a restarted pod runs the batch job again. Written aside and
    // renamed, so a pod stopped mid-write finds the old state or the new, never half of one.
    let aside = outcome.with_extension("tmp");
    let kept = serde_json::to_vec(&end)
        .map_err(std::io::Error::other)
        .and_then(|json| std::fs::write(&aside, json))
        .and_then(|()| std::fs::rename(&aside, outcome));
    if let Err(e) = kept {
        tracing::warn!("cannot keep the outcome in {}: {e}", outcome.display());
    }
    status.update(|p| *p = end);
}

async fn execute_job(
    folder: &Folder,
    args: &RunnerArgs,
    job_name: &str,
    status: &Status,
    live: Arc<Live>,
) -> Result<Ended> {
    let pipeline = Pipeline::decode(folder.get(stored::PIPELINE).await?).with_context(|| {
        format!(
            "{} is not a Beam pipeline",
            folder.display(stored::PIPELINE)
        )
    })?;
    let mut options = prost_types::Struct::decode(folder.get(stored::OPTIONS).await?)
        .with_context(|| {
            format!(
                "{} is not pipeline options",
                folder.display(stored::OPTIONS)
            )
        })?;
    let pipeline = fetch_artifacts(folder, pipeline, &args.state_dir.join("artifacts")).await?;
    let plan = Plan::with_options(&pipeline, &options)?;
    let replaces = replaced_plan(folder).await?;
    if plan.streaming
        && riverbank_portable::options::text(&options, "temp_location").is_none()
        && let Some(temp) = &args.temp_location
    {
        options.fields.insert(
            "beam:option:temp_location:v1".into(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(temp.clone())),
            },
        );
    }
    let total = plan.stages.len();
    status.update(|p| {
        p.phase = JobPhase::Running;
        p.message = format!("running {total} stages");
        p.work_items_total = total as u64;
        p.stages = stages(&plan, 0, &JobMetrics::default());
        p.work_items_running = 1;
        // Known streaming from the plan on, not from the first rounds' figures: a SIGTERM
        // before those still waits for the last checkpoint.
        if plan.streaming {
            p.streaming.get_or_insert_with(Default::default);
        }
    });
    tracing::info!("plan:\n{plan}");
    let fn_server = FnServer::start(args.fn_api_bind, &args.fn_api_advertise).await?;
    let settings = RunSettings {
        job_id: job_name.to_string(),
        job_name: job_name.to_string(),
        sdk_workers: args.sdk_workers,
        worker_pools: status.pools.subscribe(),
        pool_wait: Duration::from_secs(args.sdk_pool_wait_secs),
        pipeline_options: options,
        progress_every: Duration::from_secs(10),
        memory_budget: args.memory_mb << 20,
        drain: status.drain.subscribe(),
        stop: status.stop.subscribe(),
        resume: None,
        replaces,
        object_storage: Some(stored::object_storage()),
    };
    let say = |text: String| {
        tracing::info!("{text}");
        let done = live.stages_done();
        status.update(|p| {
            p.work_items_done = done as u64;
            p.fraction_consumed = done as f64 / total.max(1) as f64;
            p.stages = stages(&plan, done, &live.attempted());
            p.message = text;
        });
    };
    let running = execute::run(
        &plan,
        &fn_server,
        &settings,
        status.cancel.subscribe(),
        &say,
        live.clone(),
    );
    tokio::select! {
        ran = running => Ok(ran?),
        _ = report_work(status, &live, &fn_server) => unreachable!("reports until the job ends"),
    }
}

/// The plan of the pipeline this job updates in place (`--update`: the job service stored it
/// beside the new one), whose checkpoint it takes over.
async fn replaced_plan(folder: &Folder) -> Result<Option<Box<Plan>>> {
    let Some(bytes) = folder.get_if_there(stored::REPLACED_PIPELINE).await? else {
        return Ok(None);
    };
    let shown = folder.display(stored::REPLACED_PIPELINE);
    let pipeline =
        Pipeline::decode(bytes).with_context(|| format!("{shown} is not a Beam pipeline"))?;
    let options = prost_types::Struct::decode(folder.get(stored::REPLACED_OPTIONS).await?)
        .with_context(|| {
            format!(
                "{} is not pipeline options",
                folder.display(stored::REPLACED_OPTIONS)
            )
        })?;
    let plan =
        Plan::with_options(&pipeline, &options).with_context(|| format!("planning {shown}"))?;
    Ok(Some(Box::new(plan)))
}

/// How often the autoscaler's figures are refreshed, and over how long throughput is averaged
/// (the coordinator's 30 s, which the engine expects).
const WORK_EVERY: Duration = Duration::from_secs(5);
const THROUGHPUT_WINDOW: Duration = Duration::from_secs(30);

/// Keeps the figures the operator's autoscaler reads in the status while the job runs: the
/// running SDK stage's bundles and input bytes left, the job's throughput in input bytes read
/// (as the SDK's progress counts them: running bundles are asked each time), and each SDK worker
/// pod as a worker (busy as its harnesses' bundle slots are).
async fn report_work(status: &Status, live: &Live, fn_server: &FnServer) {
    let mut done = Rate::default();
    // A streaming job's sources: the bytes they emitted, as the SDK samples them.
    let mut read = Rate::default();
    let mut tick = tokio::time::interval(WORK_EVERY);
    loop {
        tick.tick().await;
        live.poll(&fn_server.workers).await;
        let now = std::time::Instant::now();
        let backlog = live.backlog();
        let throughput = done.add(now, backlog.processed_bytes);
        let places = live.places();
        let rounds = live.rounds();
        let sources = rounds.as_ref().map(|r| {
            let bytes = live.attempted().bytes_of(&r.source_pcollections);
            (r.source_backlog_bytes, read.add(now, bytes))
        });
        status.update(|p| {
            if p.phase.is_terminal() {
                return;
            }
            if let Some(r) = &rounds {
                p.streaming = Some(streaming_progress(r, p.streaming.take()));
            }
            p.remaining_bytes = backlog.remaining_bytes;
            p.throughput_bytes_per_sec = throughput;
            p.backlog_seconds = (throughput > 0.0).then(|| p.remaining_bytes as f64 / throughput);
            // A streaming job's backlog is its sources' (the autoscaler reads it here, as a
            // coordinator's): what they say is left, at the rate they are read.
            if let (Some((Some(left), rate)), Some(s)) = (sources, p.streaming.as_mut()) {
                s.backlog_bytes = left;
                s.backlog_seconds = (rate > 0.0).then(|| left as f64 / rate);
                p.remaining_bytes = left;
                p.throughput_bytes_per_sec = rate;
                p.backlog_seconds = s.backlog_seconds;
            }
            p.runnable_items = backlog.queued_bundles;
            p.splittable_items = backlog.splittable_bundles;
            p.work_items_running = backlog.running_bundles.max(1);
            p.workers = places
                .iter()
                .map(|place| WorkerProgress {
                    name: place.name.clone(),
                    address: place.name.clone(),
                    alive: place.harnesses_alive > 0,
                    items_running: place.bundles_running as u64,
                    cpu: place.busy(),
                    ..Default::default()
                })
                .collect();
        });
    }
}

/// A figure's rate of growth over the last [`THROUGHPUT_WINDOW`], per second.
#[derive(Default)]
struct Rate(std::collections::VecDeque<(std::time::Instant, u64)>);

impl Rate {
    /// Adds the figure's value `at`; its rate since the window's first value.
    fn add(&mut self, at: std::time::Instant, value: u64) -> f64 {
        self.0.push_back((at, value));
        while self
            .0
            .front()
            .is_some_and(|(t, _)| at.duration_since(*t) > THROUGHPUT_WINDOW)
        {
            self.0.pop_front();
        }
        match (self.0.front(), self.0.back()) {
            (Some((t0, v0)), Some((t1, v1))) if *t1 > *t0 => {
                v1.saturating_sub(*v0) as f64 / t1.duration_since(*t0).as_secs_f64()
            }
            _ => 0.0,
        }
    }
}

/// A streaming job's figures as the operator reads them (a coordinator's `StreamingProgress`):
/// its checkpoints are rounds written to object storage; its sources' backlog, which the SDK
/// tells, is set by [`report_work`].
fn streaming_progress(
    r: &riverbank_portable::execute::progress::Rounds,
    before: Option<StreamingProgress>,
) -> StreamingProgress {
    let now = chrono::Utc::now().timestamp_millis();
    let watermark = r.watermark_ms.filter(|&w| w != i64::MAX).and_then(|ms| {
        chrono::DateTime::from_timestamp_millis(ms).map(|t| (t, (now - ms) as f64 / 1000.0))
    });
    StreamingProgress {
        checkpoint: r.checkpoint_round,
        watermark: watermark.map(|(t, _)| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        watermark_lag_seconds: watermark.map(|(_, lag)| lag),
        late_elements_dropped: r.late_dropped,
        active_keys: r.waiting,
        last_checkpoint_age_seconds: r.checkpoint_at_ms.map(|at| (now - at) as f64 / 1000.0),
        last_checkpoint_ms: r.checkpoint_took_ms,
        // Once asked to drain, the job is draining until it ends.
        draining: r.draining || before.is_some_and(|b| b.draining),
        ..Default::default()
    }
}

/// The job's stored artifacts onto `dir`, and the pipeline naming them there (what the SDK
/// harnesses fetch from the Fn API's artifact service).
async fn fetch_artifacts(folder: &Folder, mut pipeline: Pipeline, dir: &Path) -> Result<Pipeline> {
    let mut wanted: Vec<(String, PathBuf)> = Vec::new();
    relocate_files(&mut pipeline, |name| {
        if !stored::is_stored_artifact(name) {
            return Err(PortableError::Artifacts(format!(
                "'{name}' is not one of the job's stored artifacts ({}/…)",
                stored::ARTIFACTS
            )));
        }
        let local = dir.join(
            name.trim_start_matches(stored::ARTIFACTS)
                .trim_start_matches('/'),
        );
        if !wanted.iter().any(|(n, _)| n == name) {
            wanted.push((name.to_string(), local.clone()));
        }
        Ok(local.display().to_string())
    })?;
    if !wanted.is_empty() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    for (name, local) in &wanted {
        let bytes = folder.get(name).await?;
        std::fs::write(local, &bytes).with_context(|| format!("writing {}", local.display()))?;
    }
    tracing::info!("fetched {} staged artifacts", wanted.len());
    Ok(pipeline)
}

/// The plan's stages as the operator shows them: they run in order, `done` of them have
/// ended; each stage's elements in and out are the SDK's element counts of the PCollections it
/// reads and writes (finished bundles', and running ones' so far). A PCollection only the
/// runner touches (a GroupByKey's output before a stage reads it) is not counted yet.
fn stages(plan: &Plan, done: usize, counted: &JobMetrics) -> Vec<StageProgress> {
    plan.stages
        .iter()
        .enumerate()
        .map(|(index, stage)| {
            let state = match index.cmp(&done) {
                std::cmp::Ordering::Less => "Done",
                std::cmp::Ordering::Equal => "Running",
                std::cmp::Ordering::Greater => "Waiting",
            };
            StageProgress {
                index,
                name: stage.name.clone(),
                state: state.into(),
                items_total: 1,
                items_done: u64::from(index < done),
                items_running: u64::from(index == done),
                elements_in: counted.elements_of(stage.kind.inputs()),
                elements_out: counted.elements_of(stage.kind.outputs()),
                ..Default::default()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::pod_family;

    #[test]
    fn pools_are_known_by_their_statefulsets_pod_names() {
        let a = "j-worker-0.j-headless.ns.svc.cluster.local:50000";
        let b = "j-worker-12.j-headless.ns.svc.cluster.local:50000";
        assert_eq!(pod_family(a), pod_family(b));
        assert_eq!(
            pod_family(a),
            Some(("j-worker-", "j-headless.ns.svc.cluster.local"))
        );
        assert_ne!(
            pod_family(a),
            pod_family("evil-0.j-headless.ns.svc.cluster.local:50000")
        );
        assert_ne!(
            pod_family(a),
            pod_family("j-worker-1.other.ns.svc.cluster.local:50000")
        );
        assert_eq!(pod_family("localhost:1"), pod_family("localhost:2"));
        assert_eq!(pod_family("no-port"), None);
    }
}

#[derive(serde::Deserialize)]
struct StatusQuery {
    wait_ms: Option<u64>,
}

/// The job's progress; with `wait_ms`, answered when it changes or after at most 5 s.
async fn status_route(
    State(s): State<Arc<Status>>,
    Query(q): Query<StatusQuery>,
) -> Json<JobProgress> {
    if let Some(ms) = q.wait_ms.filter(|&ms| ms > 0) {
        let changed = s.changed.notified();
        if !s.get().phase.is_terminal() {
            let _ = tokio::time::timeout(Duration::from_millis(ms.min(5000)), changed).await;
        }
    }
    Json(s.get())
}

#[derive(serde::Deserialize, serde::Serialize)]
struct SdkWorkers {
    pools: Vec<String>,
}

/// The pods a pool host names, as a StatefulSet names them: its first label without the
/// ordinal, and the rest (`job-worker-3.svc.ns.svc.cluster.local` is `job-worker-` of
/// `svc.ns.svc.cluster.local`).
fn pod_family(pool: &str) -> Option<(&str, &str)> {
    let (host, _port) = pool.rsplit_once(':')?;
    let (first, rest) = host.split_once('.').unwrap_or((host, ""));
    Some((first.trim_end_matches(|c: char| c.is_ascii_digit()), rest))
}

/// The SDK worker pods' pools (`host:port` each) as the operator has scaled them: pools added
/// get harnesses that join the running stage; pools gone are not asked again. Only pools of
/// the pods the runner was started with (the same StatefulSet's) are taken: the runner starts
/// harnesses where it is told, so it is told nothing else.
async fn sdk_workers_route(
    State(s): State<Arc<Status>>,
    Json(body): Json<SdkWorkers>,
) -> Result<Json<SdkWorkers>, (axum::http::StatusCode, String)> {
    let refuse = |why: String| Err((axum::http::StatusCode::BAD_REQUEST, why));
    if body.pools.is_empty() {
        return refuse("pools: one host:port or more".into());
    }
    let known: Vec<_> = s
        .started_pools
        .iter()
        .filter_map(|p| pod_family(p))
        .collect();
    if let Some(stranger) = body
        .pools
        .iter()
        .find(|p| pod_family(p).is_none_or(|f| !known.contains(&f)))
    {
        return refuse(format!(
            "pools: {stranger} is not one of this job's SDK worker pods ({:?})",
            s.started_pools
        ));
    }
    s.pools.send_if_modified(|pools| {
        let changed = *pools != body.pools;
        if changed {
            tracing::info!("SDK worker pools now {:?}", body.pools);
            *pools = body.pools.clone();
        }
        changed
    });
    Ok(Json(body))
}

/// Drains a streaming job: its sources stop where they are, what they read goes through, every
/// window fires, and it ends (Done, drained). The coordinator's route, so the operator drains
/// both alike.
async fn drain_route(State(s): State<Arc<Status>>) -> &'static str {
    s.drain.send_replace(true);
    s.update(|p| {
        if let Some(sp) = p.streaming.as_mut().filter(|_| !p.phase.is_terminal()) {
            sp.draining = true;
        }
    });
    "draining"
}

async fn cancel_route(State(s): State<Arc<Status>>) -> &'static str {
    s.cancel.send_replace(true);
    s.update(|p| {
        if !p.phase.is_terminal() {
            p.message = "cancelling".into();
        }
    });
    "cancelling"
}

fn ops_routes() -> Router<Arc<Status>> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .route("/metrics", get(metrics_route))
}

async fn metrics_route(State(s): State<Arc<Status>>) -> String {
    use riverbank_cluster::telemetry::{Sample, encode_samples, rss_bytes};
    let p = s.get();
    encode_samples(vec![
        Sample::new(
            "work_items_total",
            "Stages of the Beam pipeline.",
            p.work_items_total as f64,
        ),
        Sample::new(
            "work_items_done",
            "Stages finished.",
            p.work_items_done as f64,
        ),
        Sample::new(
            "fraction_consumed",
            "Fraction of the stages done.",
            p.fraction_consumed,
        ),
        Sample::new(
            "process_resident_memory_bytes",
            "Resident memory of the runner.",
            rss_bytes() as f64,
        ),
    ])
}

/// SIGTERM (the pod stopping) or Ctrl-C.
async fn terminated() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
