//! `riverbank worker`: runs the engine's work slots against the coordinator over HTTP (the
//! [`WorkSource`] `Remote`), keeps their shuffle output on its disk and serves it to other
//! workers, heartbeats its progress (and splits or stops items when told), and on SIGTERM stops
//! taking work: it finishes what runs (a drain) or, with nothing running, exits at once.
use super::ClusterError;
use super::client::{CoordinatorClient, RemoteFetch};
use super::protocol::{
    Accepted, AttemptFailed, CompiledJob, Completion, CompletionReply, Heartbeat, HeartbeatReply,
    JobConfig, SplitOffer, WorkerId,
};
use super::telemetry::{CpuMeter, Sample, encode_samples, rss_bytes};
use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt;
use riverbank_engine::compile::compile_with_known;
use riverbank_engine::config::RunConfig;
use riverbank_engine::error::RunError;
use riverbank_engine::exec::ExecContext;
use riverbank_engine::metrics::Metrics;
use riverbank_engine::shuffle::{file_chunks, safe_relative};
use riverbank_engine::slot::{RunningItems, WorkSource, run_slot};
use riverbank_engine::work::{Assignment, ItemFailure, ItemReport, Lease};
use riverbank_io::Split;
use riverbank_pipeline::Plan;
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
    /// How long a shuffle fetch keeps trying an unreachable worker (see
    /// [`super::client::FETCH_PATIENCE`]).
    pub fetch_patience: Duration,
}

/// The coordinator as a work slot sees it: over HTTP, as this worker incarnation.
struct Remote {
    id: WorkerId,
    client: CoordinatorClient,
    /// The coordinator said the job is over.
    finished: AtomicBool,
    items_done: AtomicU64,
    items_failed: AtomicU64,
}

impl WorkSource for Remote {
    type Error = ClusterError;

    /// The coordinator holds the request (up to a second) while nothing is runnable.
    async fn lease(&self) -> Result<Lease, ClusterError> {
        let lease: Lease = self.client.post("/v1/lease", &self.id).await?;
        Ok(self.seen(lease))
    }

    /// Reports the item and asks for the slot's next one in the same request.
    async fn complete(
        &self,
        a: &Assignment,
        report: ItemReport,
    ) -> Result<(bool, Option<Lease>), ClusterError> {
        let done = Completion {
            from: self.id.clone(),
            item: a.item.id,
            attempt: a.attempt,
            report,
            then_lease: true,
        };
        let reply: CompletionReply = self.client.post("/v1/complete", &done).await?;
        if reply.accepted {
            self.items_done.fetch_add(1, Ordering::Relaxed);
        }
        Ok((reply.accepted, reply.next.map(|l| self.seen(l))))
    }

    async fn fail(&self, a: &Assignment, error: RunError) -> Result<(), ClusterError> {
        let failure = ItemFailure::of(&error);
        if matches!(failure, ItemFailure::Fatal(_)) {
            self.items_failed.fetch_add(1, Ordering::Relaxed);
            tracing::error!(item = a.item.id, "work item failed: {error}");
        }
        let msg = AttemptFailed {
            from: self.id.clone(),
            item: a.item.id,
            attempt: a.attempt,
            failure,
        };
        let _: Accepted = self.client.post("/v1/fail", &msg).await?;
        Ok(())
    }

    async fn split(&self, item: u64, attempt: u32, keep: Split, give: Split) -> bool {
        let offer = SplitOffer {
            from: self.id.clone(),
            item,
            attempt,
            keep,
            give,
        };
        self.client
            .post::<_, Accepted>("/v1/split", &offer)
            .await
            .is_ok_and(|a| a.accepted)
    }
}

impl Remote {
    /// Notes a lease that ends the job.
    fn seen(&self, lease: Lease) -> Lease {
        if let Lease::Finished(phase) = lease {
            tracing::info!(?phase, "job is over");
            self.finished.store(true, Ordering::SeqCst);
        }
        lease
    }
}

struct WorkerState {
    source: Arc<Remote>,
    ctx: Arc<ExecContext>,
    running: Arc<RunningItems>,
    draining: AtomicBool,
    cpu: Mutex<CpuMeter>,
    last_cpu: Mutex<f64>,
}

/// Runs a worker until the job is over (with `exit_when_done`), or until SIGTERM: the first
/// stops it taking work and lets the running items finish (a drain); a worker with nothing
/// running exits at once, and a second signal gives the running items back and exits.
pub async fn run_worker(opts: WorkerOptions) -> Result<(), ClusterError> {
    // Signals are caught from the start, whatever the phase: as PID 1 of a container, a
    // signal without a handler would be ignored.
    let mut signals = super::Signals::new();
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
    // Health at once: the pod is alive while it waits for its coordinator (whose address may
    // not resolve yet) and compiles the plan; ready once it can take work.
    let ops = Arc::new(Ops::default());
    super::serve_ops(
        [opts.metrics_listen, opts.health_listen],
        ops_routes().with_state(ops.clone()),
    )
    .await?;
    let client = CoordinatorClient::new(&opts.coordinator, opts.patience);
    let job: JobConfig = tokio::select! {
        job = first_contact(&opts.coordinator, opts.patience) => job?,
        _ = signals.recv() => return Ok(()),
    };
    let cfg = RunConfig {
        slots: opts.slots.max(1),
        shuffle_partitions: job.shuffle_partitions,
        // The coordinator coalesces; a worker runs what it is given.
        coalesce_bytes: 0,
        batch_size: job.batch_size,
        memory_limit: job.memory_limit,
        spill_dir: opts.data_dir.join("spill"),
        job_token: job.job_token.clone(),
        max_attempts: job.max_attempts,
        chaos: job.chaos,
    };
    // A job's python dependencies are installed once on this disk and reused after a restart.
    #[cfg(feature = "python")]
    riverbank_udf::python::env::set_root(opts.data_dir.join("python-envs"));
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
    // The coordinator's compiled plan, source schemas and PyTransform outputs: no second
    // listing of the input, no second trip through Beam's Python SDK.
    let compiled: CompiledJob = client.get("/v1/compiled").await?;
    let known = compiled
        .known()
        .map_err(|e| ClusterError::Protocol(e.to_string()))?;
    let plan = Arc::new(compile_with_known(compiled.plan, cfg.batch_size, &known).await?);
    let metrics = Arc::new(Metrics::new(
        plan.plan.graph.transforms.len(),
        plan.plan.stages.len(),
    ));
    let shuffle_root = opts.data_dir.join("shuffle");
    let job_dir = shuffle_root.join(&cfg.job_token);
    // A streaming job's state shards on this worker's disk (a batch job leases none).
    let shards = riverbank_streaming::shards::StreamingShards::of_job(&cfg, &plan.plan.job_name);
    let state = Arc::new(WorkerState {
        source: Arc::new(Remote {
            id: WorkerId {
                worker: opts.name.clone(),
                incarnation: riverbank_engine::config::new_token(),
                address: address.clone(),
            },
            client,
            finished: AtomicBool::new(false),
            items_done: AtomicU64::new(0),
            items_failed: AtomicU64::new(0),
        }),
        ctx: Arc::new(ExecContext {
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
                patience: opts.fetch_patience,
            }),
            footers: Default::default(),
            shards: Some(shards),
            compress_shuffle: true,
        }),
        running: Arc::new(RunningItems::default()),
        draining: AtomicBool::new(false),
        cpu: Mutex::new(CpuMeter::new(opts.slots)),
        last_cpu: Mutex::new(0.0),
    });
    let _ = ops.0.set(state.clone());
    let app = Router::new()
        .route("/v1/shuffle/{offset}/{len}/{*path}", get(serve_shuffle))
        .with_state(state.clone())
        .merge(ops_routes().with_state(ops));
    super::spawn_server(listener, app);
    tracing::info!(worker = %opts.name, %address, "worker ready");

    let heartbeat = AbortOnDrop(tokio::spawn(heartbeat_loop(state.clone())));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut slots = tokio::task::JoinSet::new();
    for _ in 0..opts.slots.max(1) {
        slots.spawn(run_slot(
            state.source.clone(),
            state.ctx.clone(),
            state.running.clone(),
            stopped.clone(),
        ));
    }
    loop {
        tokio::select! {
            r = slots.join_next() => match r {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => return Err(e),
                Some(Err(e)) => return Err(ClusterError::Protocol(format!("a work slot panicked: {e}"))),
            },
            _ = signals.recv() => {
                if state.draining.swap(true, Ordering::SeqCst) {
                    tracing::info!("second signal: giving the running items back and exiting");
                    state.running.cancel_all();
                    continue;
                }
                let _ = stop.send(true);
                if state.running.is_empty() {
                    tracing::info!("stopping: no item running");
                    return Ok(());
                }
                tracing::info!(items = state.running.len(), "draining: finishing the running items, taking no more");
                // Told in the background: a coordinator that is gone must not hold the drain.
                let source = state.source.clone();
                tokio::spawn(async move {
                    let _: Result<Accepted, _> = source.client.post("/v1/drain", &source.id).await;
                });
            }
        }
    }
    if state.draining.load(Ordering::SeqCst) {
        return Ok(());
    }
    // The job is over: its shuffle files are no longer needed by anyone.
    if state.source.finished.load(Ordering::SeqCst) {
        let _ = tokio::fs::remove_dir_all(&job_dir).await;
    }
    if !opts.exit_when_done {
        // In a pod: stay up (heartbeating, serving health) until scaled away or stopped.
        signals.recv().await;
        tracing::info!("stopping on signal after the job's end");
    }
    drop(heartbeat);
    Ok(())
}

/// How often a worker that cannot reach its coordinator says so.
const UNREACHABLE_LOG_EVERY: Duration = Duration::from_secs(10);

/// The worker's first request: the job, from the coordinator at `address`, tried again (for up
/// to `patience`) while it does not answer. Says at once what it waits for, and why each
/// [`UNREACHABLE_LOG_EVERY`] (a name that does not resolve, a refused connection), so a pod
/// that waits is not silent.
async fn first_contact(address: &str, patience: Duration) -> Result<JobConfig, ClusterError> {
    let once = CoordinatorClient::new(address, Duration::ZERO);
    let started = std::time::Instant::now();
    let mut logged = started;
    let mut backoff = Duration::from_millis(50);
    tracing::info!(coordinator = %address, "reaching the coordinator");
    for attempt in 1u64.. {
        let error = match once.get::<JobConfig>("/v1/job").await {
            Ok(job) => {
                if attempt > 1 {
                    tracing::info!(coordinator = %address, attempt, waited_secs = started.elapsed().as_secs(), "reached the coordinator");
                }
                return Ok(job);
            }
            Err(ClusterError::Unreachable(_, why)) => why,
            Err(e) => return Err(e),
        };
        let waited = started.elapsed();
        if waited >= patience {
            tracing::error!(coordinator = %address, attempt, waited_secs = waited.as_secs(), %error, "giving up on the coordinator");
            return Err(ClusterError::Unreachable(address.to_string(), error));
        }
        if attempt == 1 || logged.elapsed() >= UNREACHABLE_LOG_EVERY {
            logged = std::time::Instant::now();
            tracing::warn!(coordinator = %address, attempt, waited_secs = waited.as_secs(), give_up_after_secs = patience.as_secs(), %error, "the coordinator does not answer yet; retrying");
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
    unreachable!("the attempts end by returning")
}

/// Aborts a background task when dropped, on every way out of a function.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reports progress every half second; splits and stops items as the coordinator says.
async fn heartbeat_loop(s: Arc<WorkerState>) {
    loop {
        let cpu = s.cpu.lock().unwrap_or_else(|p| p.into_inner()).sample();
        *s.last_cpu.lock().unwrap_or_else(|p| p.into_inner()) = cpu;
        let hb = Heartbeat {
            from: s.source.id.clone(),
            running: s.running.snapshot(),
            cpu,
            rss: rss_bytes(),
        };
        match s
            .source
            .client
            .post::<_, HeartbeatReply>("/v1/heartbeat", &hb)
            .await
        {
            Ok(reply) => {
                s.running.request_splits(reply.split);
                s.running.cancel(reply.stale);
                if reply.phase.is_terminal() {
                    s.running.cancel_all();
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

/// What the health and metrics ports serve from the worker's start: the worker once it is
/// set up (it has reached its coordinator and compiled the plan).
#[derive(Default)]
struct Ops(std::sync::OnceLock<Arc<WorkerState>>);

/// `/healthz` answers from the start; `/readyz` once the worker takes work (not while it
/// starts or drains); `/metrics` once it is set up (empty before).
fn ops_routes() -> Router<Arc<Ops>> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(ops): State<Arc<Ops>>| async move {
                match ops.0.get() {
                    None => (StatusCode::SERVICE_UNAVAILABLE, "starting"),
                    Some(s) if s.draining.load(Ordering::SeqCst) => {
                        (StatusCode::SERVICE_UNAVAILABLE, "draining")
                    }
                    Some(_) => (StatusCode::OK, "ok"),
                }
            }),
        )
        .route(
            "/metrics",
            get(|State(ops): State<Arc<Ops>>| async move {
                match ops.0.get() {
                    Some(s) => metrics(s).await,
                    None => String::new(),
                }
            }),
        )
}

async fn metrics(s: &WorkerState) -> String {
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
            s.source.items_done.load(Ordering::Relaxed) as f64,
        ),
        Sample::new(
            "worker_items_failed",
            "Work items that failed on this worker.",
            s.source.items_failed.load(Ordering::Relaxed) as f64,
        ),
        Sample::new(
            "worker_items_running",
            "Work items running now.",
            s.running.len() as f64,
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
