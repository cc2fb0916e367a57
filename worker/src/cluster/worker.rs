//! `riverbank worker`: pulls work items from the coordinator, runs them, keeps their shuffle
//! output on its disk and serves it to other workers, heartbeats its progress (and splits an
//! item when asked), and on SIGTERM stops taking work and hands back what it cannot finish.
use super::ClusterError;
use super::client::{CoordinatorClient, RemoteFetch};
use super::protocol::{
    Accepted, AttemptFailed, CompiledJob, Completion, Heartbeat, HeartbeatReply, JobConfig,
    SplitOffer, WorkerId,
};
use super::telemetry::{CpuMeter, Sample, encode_samples, rss_bytes};
use crate::compile::compile_known_sources;
use crate::engine::exec::{ExecContext, ItemControl, SplitProposer, execute};
use crate::engine::shuffle::{file_chunks, safe_relative};
use crate::engine::tracker::{ItemFailure, Lease};
use crate::metrics::Metrics;
use crate::runner::RunConfig;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt;
use riverbank_pipeline::Plan;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How a worker runs (the CLI's flags).
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    pub plan: Plan,
    /// `host:port` of the coordinator.
    pub coordinator: String,
    pub name: String,
    /// Where shuffle files are served.
    pub listen: SocketAddr,
    /// How other workers reach `listen` (default: 127.0.0.1 and the bound port).
    pub advertise: Option<String>,
    pub metrics_listen: Option<SocketAddr>,
    pub health_listen: Option<SocketAddr>,
    /// The worker's disk: shuffle files and spills.
    pub data_dir: PathBuf,
    /// Work items run at once.
    pub slots: usize,
    /// Exit when the job is over (local runs); in a pod the worker idles until scaled away.
    pub exit_when_done: bool,
    /// How long to keep trying an unreachable coordinator before giving up.
    pub patience: Duration,
}

struct WorkerState {
    id: WorkerId,
    client: CoordinatorClient,
    ctx: ExecContext,
    running: Mutex<HashMap<(u64, u32), Arc<ItemControl>>>,
    draining: AtomicBool,
    finished: AtomicBool,
    items_done: AtomicU64,
    items_failed: AtomicU64,
    cpu: Mutex<CpuMeter>,
    last_cpu: Mutex<f64>,
}

impl WorkerState {
    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, u32), Arc<ItemControl>>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Runs a worker until the job is over (with `exit_when_done`), or until SIGTERM.
pub async fn run_worker(opts: WorkerOptions) -> Result<(), ClusterError> {
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|e| ClusterError::Bind(opts.listen.to_string(), e.to_string()))?;
    let bound = listener
        .local_addr()
        .map_err(|e| ClusterError::Bind(opts.listen.to_string(), e.to_string()))?;
    let address = opts
        .advertise
        .clone()
        .unwrap_or_else(|| format!("127.0.0.1:{}", bound.port()));
    let client = CoordinatorClient::new(&opts.coordinator, opts.patience);
    let job: JobConfig = client.get("/v1/job").await?;
    let cfg = RunConfig {
        partitions: opts.slots.max(1),
        shuffle_partitions: job.shuffle_partitions,
        batch_size: job.batch_size,
        memory_limit: job.memory_limit,
        spill_dir: opts.data_dir.join("spill"),
        job_token: job.job_token.clone(),
        max_attempts: job.max_attempts,
        chaos: job.chaos,
    };
    std::fs::create_dir_all(&cfg.spill_dir).map_err(|e| ClusterError::State {
        path: cfg.spill_dir.display().to_string(),
        message: e.to_string(),
    })?;
    if job.job_name != opts.plan.job_name {
        return Err(ClusterError::Protocol(format!(
            "the coordinator at {} runs job '{}', not '{}' of --plan",
            opts.coordinator, job.job_name, opts.plan.job_name
        )));
    }
    // The coordinator's compiled plan and source schemas: no second listing of the input.
    let compiled: CompiledJob = client.get("/v1/compiled").await?;
    let sources = compiled
        .source_schemas()
        .map_err(|e| ClusterError::Protocol(e.to_string()))?;
    let plan = Arc::new(compile_known_sources(compiled.plan, cfg.batch_size, &sources).await?);
    let metrics = Arc::new(Metrics::new(
        plan.plan.graph.transforms.len(),
        plan.plan.stages.len(),
    ));
    let shuffle_root = opts.data_dir.join("shuffle");
    let state = Arc::new(WorkerState {
        id: WorkerId {
            worker: opts.name.clone(),
            address: address.clone(),
        },
        client,
        ctx: ExecContext {
            plan,
            cfg,
            shuffle_root: shuffle_root.clone(),
            metrics,
            fetch: Arc::new(RemoteFetch {
                // Shuffle fetches speak HTTP/2 (h2c): many partition streams share a connection.
                http: reqwest::Client::builder()
                    .connect_timeout(Duration::from_secs(2))
                    .http2_prior_knowledge()
                    .tls_built_in_root_certs(false)
                    .build()
                    .unwrap_or_default(),
                own_address: address.clone(),
                root: shuffle_root.clone(),
            }),
        },
        running: Mutex::new(HashMap::new()),
        draining: AtomicBool::new(false),
        finished: AtomicBool::new(false),
        items_done: AtomicU64::new(0),
        items_failed: AtomicU64::new(0),
        cpu: Mutex::new(CpuMeter::new(opts.slots)),
        last_cpu: Mutex::new(0.0),
    });
    let app = Router::new()
        .route("/v1/shuffle/{offset}/{len}/{*path}", get(serve_shuffle))
        .merge(ops_routes())
        .with_state(state.clone());
    super::spawn_server(listener, app);
    super::serve_ops(
        [opts.metrics_listen, opts.health_listen],
        ops_routes().with_state(state.clone()),
    )
    .await?;
    tracing::info!(worker = %opts.name, %address, "worker ready");

    let heartbeat = tokio::spawn(heartbeat_loop(state.clone()));
    let mut slots = tokio::task::JoinSet::new();
    for _ in 0..opts.slots.max(1) {
        slots.spawn(slot_loop(state.clone()));
    }
    let mut first_error = None;
    loop {
        tokio::select! {
            r = slots.join_next() => match r {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => { first_error.get_or_insert(e); }
                Some(Err(e)) => { first_error.get_or_insert(ClusterError::Protocol(format!("a work slot panicked: {e}"))); }
            },
            _ = super::terminate_signal(), if !state.draining.load(Ordering::SeqCst) => {
                tracing::info!("draining: finishing the running items, taking no more");
                state.draining.store(true, Ordering::SeqCst);
                let _: Result<Accepted, _> = state.client.post("/v1/drain", &state.id).await;
            }
        }
    }
    if let Some(e) = first_error {
        heartbeat.abort();
        return Err(e);
    }
    if state.finished.load(Ordering::SeqCst) && opts.exit_when_done {
        heartbeat.abort();
        let _ = std::fs::remove_dir_all(shuffle_root.join(&state.ctx.cfg.job_token));
        return Ok(());
    }
    if state.draining.load(Ordering::SeqCst) {
        heartbeat.abort();
        return Ok(());
    }
    // The job is over but this worker stays up (in a pod) until it is scaled away.
    let _ = heartbeat.await;
    Ok(())
}

/// One work slot: lease, run, report; until the job is over or the worker drains.
async fn slot_loop(s: Arc<WorkerState>) -> Result<(), ClusterError> {
    loop {
        if s.draining.load(Ordering::SeqCst) {
            return Ok(());
        }
        let lease: Lease = s.client.post("/v1/lease", &s.id).await?;
        let a = match lease {
            Lease::Finished(phase) => {
                tracing::info!(?phase, "job is over");
                s.finished.store(true, Ordering::SeqCst);
                return Ok(());
            }
            // The coordinator already held the request while nothing was runnable.
            Lease::Wait => continue,
            Lease::Work(a) => a,
        };
        let key = (a.item.id, a.attempt);
        let control = Arc::new(ItemControl::default());
        s.running().insert(key, control.clone());
        let proposer: Box<SplitProposer> = {
            let s = s.clone();
            Box::new(move |keep, give| {
                let s = s.clone();
                Box::pin(async move {
                    let offer = SplitOffer {
                        from: s.id.clone(),
                        item: key.0,
                        attempt: key.1,
                        keep,
                        give,
                    };
                    s.client
                        .post::<_, Accepted>("/v1/split", &offer)
                        .await
                        .map(|a| a.accepted)
                        .unwrap_or(false)
                })
            })
        };
        tracing::debug!(
            item = a.item.id,
            attempt = a.attempt,
            stage = a.item.stage,
            "running"
        );
        let result = execute(&s.ctx, &a, &control, &proposer).await;
        s.running().remove(&key);
        match result {
            Ok(report) => {
                let dir = s.ctx.shuffle_root.join(crate::engine::shuffle::attempt_dir(
                    &s.ctx.cfg.job_token,
                    a.item.stage,
                    a.item.id,
                    a.attempt,
                ));
                let parts = report.sink_parts.clone();
                let done = Completion {
                    from: s.id.clone(),
                    item: a.item.id,
                    attempt: a.attempt,
                    report,
                };
                let accepted: Accepted = s.client.post("/v1/complete", &done).await?;
                if accepted.accepted {
                    s.items_done.fetch_add(1, Ordering::Relaxed);
                } else {
                    // Someone else's attempt counts: drop ours.
                    let _ = std::fs::remove_dir_all(dir);
                    for (t, p) in parts {
                        if let crate::compile::CompiledTransform::Write { options, .. } =
                            &s.ctx.plan.transforms[t]
                        {
                            crate::io::abort_sink(options, vec![p]).await;
                        }
                    }
                }
            }
            Err(e) => {
                let failure = ItemFailure::of(&e);
                if matches!(failure, ItemFailure::Fatal(_)) {
                    s.items_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(item = a.item.id, "work item failed: {e}");
                }
                let msg = AttemptFailed {
                    from: s.id.clone(),
                    item: a.item.id,
                    attempt: a.attempt,
                    failure,
                };
                let _: Accepted = s.client.post("/v1/fail", &msg).await?;
            }
        }
    }
}

/// Reports progress every half second; splits and stops items as the coordinator says.
async fn heartbeat_loop(s: Arc<WorkerState>) {
    loop {
        let running: Vec<(u64, u32, u64, u64)> = s
            .running()
            .iter()
            .map(|(&(id, attempt), c)| {
                (
                    id,
                    attempt,
                    c.units_started.load(Ordering::SeqCst),
                    c.units_total.load(Ordering::SeqCst),
                )
            })
            .collect();
        let cpu = s.cpu.lock().unwrap_or_else(|p| p.into_inner()).sample();
        *s.last_cpu.lock().unwrap_or_else(|p| p.into_inner()) = cpu;
        let hb = Heartbeat {
            from: s.id.clone(),
            running,
            cpu,
            rss: rss_bytes(),
        };
        match s
            .client
            .post::<_, HeartbeatReply>("/v1/heartbeat", &hb)
            .await
        {
            Ok(reply) => {
                let running = s.running();
                for id in reply.split {
                    for ((i, _), c) in running.iter() {
                        if *i == id {
                            c.split_requested.store(true, Ordering::SeqCst);
                        }
                    }
                }
                for key in reply.stale {
                    if let Some(c) = running.get(&key) {
                        c.cancelled.store(true, Ordering::SeqCst);
                    }
                }
                if reply.phase.is_terminal() {
                    for c in running.values() {
                        c.cancelled.store(true, Ordering::SeqCst);
                    }
                }
            }
            Err(e) => tracing::warn!("heartbeat failed: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Serves one shuffle stream (`len` bytes at `offset` of one of this worker's files),
/// streamed, with its length (so a reader sees a truncated transfer as an error).
async fn serve_shuffle(
    State(s): State<Arc<WorkerState>>,
    UrlPath((offset, len, path)): UrlPath<(u64, u64, String)>,
) -> Response {
    if !safe_relative(&path) {
        return (StatusCode::BAD_REQUEST, "bad shuffle path").into_response();
    }
    let full = s.ctx.shuffle_root.join(&path);
    match tokio::fs::metadata(&full).await {
        Ok(meta) if offset.checked_add(len).is_some_and(|end| end <= meta.len()) => {}
        Ok(_) => return (StatusCode::RANGE_NOT_SATISFIABLE, "beyond the file").into_response(),
        Err(_) => return (StatusCode::NOT_FOUND, "no such shuffle file").into_response(),
    }
    Response::builder()
        .header(header::CONTENT_TYPE, "application/vnd.apache.arrow.stream")
        .header(header::CONTENT_LENGTH, len)
        .body(Body::from_stream(
            file_chunks(full, offset, len).map(|r| r.map_err(std::io::Error::other)),
        ))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn ops_routes() -> Router<Arc<WorkerState>> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(s): State<Arc<WorkerState>>| async move {
                if s.draining.load(Ordering::SeqCst) {
                    (StatusCode::SERVICE_UNAVAILABLE, "draining")
                } else {
                    (StatusCode::OK, "ok")
                }
            }),
        )
        .route("/metrics", get(metrics))
}

async fn metrics(State(s): State<Arc<WorkerState>>) -> String {
    let m = &s.ctx.metrics;
    let mut out = vec![
        Sample::new(
            "worker_rows_read",
            "Rows read from sources by this worker.",
            Metrics::get(&m.rows_read) as f64,
        ),
        Sample::new(
            "worker_bytes_read",
            "Source bytes read by this worker.",
            Metrics::get(&m.bytes_read) as f64,
        ),
        Sample::new(
            "worker_items_done",
            "Work items this worker finished (accepted).",
            s.items_done.load(Ordering::Relaxed) as f64,
        ),
        Sample::new(
            "worker_items_failed",
            "Work items that failed on this worker.",
            s.items_failed.load(Ordering::Relaxed) as f64,
        ),
        Sample::new(
            "worker_items_running",
            "Work items running now.",
            s.running().len() as f64,
        ),
        Sample::new(
            "worker_cpu",
            "CPU use over the last heartbeat, fraction of the slots' cores.",
            *s.last_cpu.lock().unwrap_or_else(|p| p.into_inner()),
        ),
        Sample::new(
            "worker_memory_bytes",
            "Resident memory of the worker process.",
            rss_bytes() as f64,
        ),
        Sample::new(
            "worker_spills",
            "Combine spills to disk.",
            Metrics::get(&m.spills) as f64,
        ),
    ];
    for (stage, sm) in s.ctx.plan.plan.stages.iter().zip(&m.stages) {
        out.push(
            Sample::new(
                "worker_stage_bundles",
                "Bundles processed per stage.",
                Metrics::get(&sm.bundles) as f64,
            )
            .label("stage", stage.id()),
        );
        out.push(
            Sample::new(
                "worker_stage_bundle_retries",
                "Bundle retries per stage.",
                Metrics::get(&sm.bundle_retries) as f64,
            )
            .label("stage", stage.id()),
        );
    }
    encode_samples(out)
}
