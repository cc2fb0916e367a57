//! `riverbank coordinator`: one per job. Holds the plan and the [`Tracker`], serves the
//! workers' API and the job's status, logs every durable change before answering, expires
//! silent workers, commits the sinks once when every item is done, and aborts them when the job
//! fails or is cancelled.
use super::ClusterError;
use super::protocol::{
    Accepted, AttemptFailed, CompiledJob, Completion, CompletionReply, Heartbeat, HeartbeatReply,
    JobConfig, SplitOffer, Summary, WorkerId,
};
use super::telemetry::{Sample, encode_samples};
use super::wal::Wal;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use riverbank_engine::compile::{CompiledPlan, compile};
use riverbank_engine::config::BundleChaos;
use riverbank_engine::error::RunError;
use riverbank_engine::finish::{abort_sinks, commit_sinks};
use riverbank_engine::tracker::{Event, Report, Tracker};
use riverbank_engine::work::Lease;
use riverbank_pipeline::{
    JobPhase, JobProgress, Plan, SnapshotRequest, SnapshotTaken, StopRequest, UpdateCheck,
    UpdateVerdict,
};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How a coordinator runs (the CLI's flags).
#[derive(Clone, Debug)]
pub struct CoordinatorOptions {
    pub plan: Plan,
    /// The workers' API and the status endpoint.
    pub listen: SocketAddr,
    /// A socket already bound and listening, inherited from the process that started this
    /// one (`run --workers`): used instead of binding `listen`, so nothing can take the port
    /// between its choice and the coordinator's start, or across a restart.
    pub listen_fd: Option<i32>,
    /// Separate listeners for `/metrics` and `/healthz` `/readyz` (they are on `listen` too).
    pub metrics_listen: Option<SocketAddr>,
    pub health_listen: Option<SocketAddr>,
    /// Where the progress log lives (the coordinator's persistent volume).
    pub state_dir: PathBuf,
    pub shuffle_partitions: u32,
    /// Batch: coalesce neighbouring shuffle partitions up to this many bytes per item (0: never).
    pub coalesce_bytes: u64,
    pub lease_timeout: Duration,
    /// How long a done item's output may stay unreachable to its readers before the job fails
    /// (see [`riverbank_engine::tracker::OUTPUT_PATIENCE`]).
    pub output_patience: Duration,
    pub batch_size: usize,
    pub memory_limit: usize,
    pub max_attempts: u32,
    pub chaos: BundleChaos,
    /// Exit once the job is over (local runs); in a pod the coordinator stays up for the
    /// operator to read the final status.
    pub exit_when_done: bool,
    /// Write the bound API address here (for `--port 0`).
    pub address_file: Option<PathBuf>,
    /// Streaming: where the checkpoints go (default: `tempLocation`/JOB, else the state dir).
    pub checkpoint_dir: Option<String>,
    /// Streaming: most offsets one source partition reads in one checkpoint.
    pub max_per_checkpoint: u64,
    /// Streaming: a new job starts from this snapshot (an update).
    pub from_snapshot: Option<riverbank_streaming::driver::FromSnapshot>,
    /// Streaming: this run's id, reported in its status (the operator gives each pipeline
    /// version of a job its own, so it can tell the new run's numbers from the old one's).
    pub run_id: Option<String>,
}

pub(crate) struct Coord {
    tracker: Mutex<Tracker>,
    wal: Mutex<Wal>,
    pub(crate) job: JobConfig,
    plan: Arc<CompiledPlan>,
    compiled: CompiledJob,
    /// Taken by whoever commits or aborts the sinks (once).
    finishing: AtomicBool,
    /// True once the sinks are committed or aborted: a cancel is answered, and a stopping
    /// coordinator exits, only after that.
    sinks_finished: tokio::sync::watch::Sender<bool>,
    /// Signalled on every change that may make work runnable or the job finishable.
    pub(crate) changed: tokio::sync::Notify,
    /// A streaming job's checkpoint loop: its control and its numbers.
    streaming: Option<super::streaming::Streaming>,
}

impl Coord {
    pub(crate) fn tracker(&self) -> MutexGuard<'_, Tracker> {
        self.tracker.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Logs events (see `wal` for when they are synced). A coordinator that cannot write its
    /// log must not go on answering as if it had: it exits, and its restart replays what was
    /// written.
    fn log(&self, events: &[Event]) {
        // A streaming job's durable state is its checkpoint log: a checkpoint in flight runs
        // again after a restart, so its items' events need no log.
        if events.is_empty() || self.streaming.is_some() {
            return;
        }
        let mut wal = self.wal.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = wal.append(events) {
            tracing::error!(path = %wal.path().display(), "cannot write the progress log: {e}");
            std::process::exit(3);
        }
    }

    /// Makes the log durable up to here (batch jobs; a failure exits, as in [`Self::log`]).
    fn sync_log(&self) {
        if self.streaming.is_some() {
            return;
        }
        let mut wal = self.wal.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = wal.sync() {
            tracing::error!(path = %wal.path().display(), "cannot sync the progress log: {e}");
            std::process::exit(3);
        }
    }

    /// Registers a worker's request (a restarted worker's old leases are given up here) and
    /// logs what that changed.
    fn contact(&self, t: &mut Tracker, w: &WorkerId) {
        let events = t.seen(w, Instant::now());
        if !events.is_empty() {
            self.log(&events);
            self.changed.notify_waiters();
        }
    }

    fn progress(&self) -> JobProgress {
        let mut p = self.tracker().progress(&self.job.job_name, Instant::now());
        if let Some(s) = &self.streaming {
            // The autoscaler reads a streaming job's backlog and throughput where it reads a
            // batch job's: in elements, the unit a stream's backlog is counted in.
            let sp = s.progress();
            p.backlog_seconds = sp.backlog_seconds;
            p.throughput_bytes_per_sec = s
                .status
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .throughput_bytes;
            p.throughput_elements_per_sec = sp.throughput_elements_per_sec;
            p.active_keys = Some(sp.active_keys);
            p.remaining_bytes = sp.backlog_bytes;
            if sp.draining && !p.phase.is_terminal() {
                p.message = "draining: firing every window".into();
            }
            let marks = self.tracker().stage_watermarks();
            let past = s.past_stages.lock().unwrap_or_else(|p| p.into_inner());
            super::streaming::stream_stages(&mut p.stages, &past, &marks, p.phase.is_terminal());
            p.streaming = Some(sp);
        }
        p
    }
}

/// Runs the coordinator until the job is over (with `exit_when_done`) or forever.
pub async fn run_coordinator(opts: CoordinatorOptions) -> Result<JobProgress, ClusterError> {
    let mut signals = super::Signals::new();
    let job_name = opts.plan.job_name.clone();
    let plan = Arc::new(compile(opts.plan.clone(), opts.batch_size).await?);
    let job = job_config(&opts, &job_name)?;
    let (wal, mut events) = Wal::open(&opts.state_dir).map_err(|e| ClusterError::State {
        path: opts.state_dir.display().to_string(),
        message: e.to_string(),
    })?;
    let streaming = opts.plan.is_streaming();
    if streaming {
        // Resumed from the checkpoint log instead (see `crate::streaming`).
        events.retain(|e| matches!(e, Event::Started { .. }));
    }
    let mut tracker = Tracker::new(
        plan.clone(),
        job.shuffle_partitions,
        opts.lease_timeout,
        Instant::now(),
    )
    .coalescing(opts.coalesce_bytes)
    .with_output_patience(opts.output_patience);
    if streaming {
        tracker = tracker.awaiting_checkpoint();
    }
    let now = Instant::now();
    for e in &events {
        tracker.apply(e, now);
    }
    if !events.is_empty() {
        tracing::info!(events = events.len(), phase = ?tracker.phase(), "resumed from the progress log");
    }
    let started = tracker.start_epoch();
    let compiled = CompiledJob::new(&plan).map_err(|e| ClusterError::Protocol(e.to_string()))?;
    let coord = Arc::new(Coord {
        tracker: Mutex::new(tracker),
        wal: Mutex::new(wal),
        job,
        compiled,
        plan,
        finishing: AtomicBool::new(false),
        sinks_finished: tokio::sync::watch::channel(false).0,
        changed: tokio::sync::Notify::new(),
        streaming: streaming.then(|| {
            super::streaming::Streaming::new(checkpoint_root(&opts, &job_name), opts.run_id.clone())
        }),
    });
    if streaming {
        spawn_checkpoints(&coord, &opts);
    }
    coord.log(&[started]);
    if coord.tracker().committed().is_some() {
        // Replayed a finished job: its sinks were committed before the restart.
        coord.sinks_finished.send_replace(true);
    }

    let api = Router::new()
        .route(
            "/v1/job",
            get(|State(c): State<Arc<Coord>>| async move { Json(c.job.clone()) }),
        )
        .route(
            "/v1/compiled",
            get(|State(c): State<Arc<Coord>>| async move { Json(c.compiled.clone()) }),
        )
        .route("/v1/lease", post(lease))
        .route("/v1/heartbeat", post(heartbeat))
        .route("/v1/complete", post(complete))
        .route("/v1/fail", post(fail))
        .route("/v1/split", post(split))
        .route("/v1/drain", post(drain))
        .route("/v1/cancel", post(cancel))
        .route("/v1/job/drain", post(drain_job))
        .route("/v1/job/snapshot", post(snapshot_job))
        .route("/v1/job/stop", post(stop_job))
        .route("/v1/job/update-check", post(update_check))
        .route("/v1/status", get(status))
        .route("/v1/summary", get(summary))
        .merge(ops_routes())
        .with_state(coord.clone());
    let listener = match opts.listen_fd {
        Some(fd) => inherited_listener(fd),
        None => tokio::net::TcpListener::bind(opts.listen).await,
    }
    .map_err(|e| ClusterError::Bind(opts.listen.to_string(), e.to_string()))?;
    let bound = listener
        .local_addr()
        .map_err(|e| ClusterError::Bind(opts.listen.to_string(), e.to_string()))?;
    tracing::info!(%bound, job = %job_name, "coordinator listening");
    super::spawn_server(listener, api);
    super::serve_ops(
        [opts.metrics_listen, opts.health_listen],
        ops_routes().with_state(coord.clone()),
    )
    .await?;
    if let Some(f) = &opts.address_file {
        super::write_address(f, &bound.to_string())?;
    }

    let mut terminal_since: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = coord.changed.notified() => {}
            _ = signals.recv() => {
                // A failed or cancelled job's temp files go first: nobody else will remove them.
                if coord.streaming.is_none() {
                    finish_if_due(&coord).await;
                }
                if coord.tracker().phase().is_terminal() {
                    wait_sinks_finished(&coord, Duration::from_secs(20)).await;
                }
                tracing::info!("stopping on signal; the progress log keeps the job's state");
                return Ok(coord.progress());
            }
        }
        let events = coord.tracker().expire(Instant::now());
        if !events.is_empty() {
            coord.log(&events);
            coord.changed.notify_waiters();
        }
        if coord.streaming.is_none() {
            finish_if_due(&coord).await;
        }
        let phase = coord.tracker().phase();
        if phase.is_terminal() {
            let since = *terminal_since.get_or_insert_with(Instant::now);
            // Linger so that workers hear the outcome from their next request.
            if opts.exit_when_done && since.elapsed() > Duration::from_millis(1500) {
                return Ok(coord.progress());
            }
        }
    }
}

/// The job's identity and settings: created at the first start, read back on every restart so
/// temp files and attempts of the old run stay recognisable.
fn job_config(opts: &CoordinatorOptions, job_name: &str) -> Result<JobConfig, ClusterError> {
    let path = opts.state_dir.join("job.json");
    let state_err = |e: String| ClusterError::State {
        path: path.display().to_string(),
        message: e,
    };
    if let Ok(text) = std::fs::read_to_string(&path) {
        return serde_json::from_str(&text).map_err(|e| state_err(e.to_string()));
    }
    let job = JobConfig {
        job_name: job_name.to_string(),
        job_token: riverbank_engine::config::new_token(),
        shuffle_partitions: opts.shuffle_partitions.max(1),
        max_attempts: opts.max_attempts.max(1),
        batch_size: opts.batch_size,
        memory_limit: opts.memory_limit,
        chaos: opts.chaos,
    };
    std::fs::create_dir_all(&opts.state_dir).map_err(|e| state_err(e.to_string()))?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&job).unwrap_or_default())
        .and_then(|_| std::fs::rename(&tmp, &path))
        .map_err(|e| state_err(e.to_string()))?;
    Ok(job)
}

/// Commits the sinks once every item is done; aborts them once the job failed or was cancelled.
async fn finish_if_due(coord: &Arc<Coord>) {
    // Decided and taken under the tracker's lock, so a cancel cannot slip in between the
    // decision to commit and the commit (it sees `finishing` and lets the commit end the job).
    let abort = {
        let t = coord.tracker();
        let phase = t.phase();
        let commit = !phase.is_terminal() && t.all_done() && t.committed().is_none();
        let abort = matches!(phase, JobPhase::Failed | JobPhase::Cancelled);
        if !(commit || abort) || coord.finishing.swap(true, Ordering::SeqCst) {
            return;
        }
        abort
    };
    finish_sinks(coord, abort).await;
    coord.sinks_finished.send_replace(true);
}

/// Waits (at most `limit`) until the sinks are committed or aborted.
async fn wait_sinks_finished(coord: &Coord, limit: Duration) {
    let mut rx = coord.sinks_finished.subscribe();
    let _ = tokio::time::timeout(limit, rx.wait_for(|done| *done)).await;
}

async fn finish_sinks(coord: &Arc<Coord>, abort: bool) {
    let parts = coord.tracker().sink_parts();
    if abort {
        abort_sinks(&coord.plan, parts, &coord.job.job_token).await;
        return;
    }
    // The reports that chose these parts are durable before any of them is committed: a
    // restart after a machine crash must not run an item again and commit another attempt.
    coord.sync_log();
    let event = match commit_sinks(&coord.plan, parts, &coord.job.job_token).await {
        Ok(files) => Event::Committed { files },
        Err(e) => Event::Failed {
            failure: riverbank_pipeline::JobFailure {
                transform: None,
                message: e.to_string(),
                record: None,
                attempts: 1,
            },
        },
    };
    let mut t = coord.tracker();
    t.apply(&event, Instant::now());
    coord.log(&[event]);
    tracing::info!(phase = ?t.phase(), "job finished");
    coord.changed.notify_waiters();
}

/// `/metrics`, `/healthz`, `/readyz`.
fn ops_routes() -> Router<Arc<Coord>> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
}

/// The listening socket passed down as file descriptor `fd`.
fn inherited_listener(fd: i32) -> std::io::Result<tokio::net::TcpListener> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: `fd` is checked to be an open socket before it is owned; the parent passed it
    // for this process alone (it is closed-on-exec everywhere else).
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let listener = std::net::TcpListener::from(unsafe { OwnedFd::from_raw_fd(fd) });
    listener.local_addr()?;
    listener.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(listener)
}

/// `?wait_ms=N`: how long a status request may wait for the job to change.
#[derive(serde::Deserialize)]
struct StatusQuery {
    wait_ms: Option<u64>,
}

/// The job's progress. With `wait_ms`, a long poll: it answers when something changes (an item
/// finished, the job ended) or after `wait_ms` (at most 5 s), so a watcher sees the end at once
/// without polling fast. A job that is over answers at once.
async fn status(
    State(c): State<Arc<Coord>>,
    axum::extract::Query(q): axum::extract::Query<StatusQuery>,
) -> Json<JobProgress> {
    if let Some(ms) = q.wait_ms.filter(|&ms| ms > 0) {
        let changed = c.changed.notified();
        if !c.tracker().phase().is_terminal() {
            let _ = tokio::time::timeout(Duration::from_millis(ms.min(5000)), changed).await;
        }
    }
    Json(c.progress())
}

/// Long-polls: a worker with nothing to do waits here (up to a second) for work to appear,
/// so handing out the next stage costs no polling delay.
async fn lease(State(c): State<Arc<Coord>>, Json(w): Json<WorkerId>) -> Json<Lease> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        let changed = c.changed.notified();
        let lease = {
            let mut t = c.tracker();
            c.contact(&mut t, &w);
            c.log(&t.coalesce(Instant::now()));
            t.lease(&w, Instant::now())
        };
        if !matches!(lease, Lease::Wait) || tokio::time::Instant::now() >= deadline {
            return Json(lease);
        }
        let _ = tokio::time::timeout_at(deadline, changed).await;
    }
}

async fn heartbeat(State(c): State<Arc<Coord>>, Json(h): Json<Heartbeat>) -> Json<HeartbeatReply> {
    let mut t = c.tracker();
    c.contact(&mut t, &h.from);
    let (split, events) = t.heartbeat(&h.from, &h.running, h.cpu, h.rss, Instant::now());
    if !events.is_empty() {
        c.log(&events);
        c.changed.notify_waiters();
    }
    let stale = h
        .running
        .iter()
        .filter(|p| !t.is_current(p.item, p.attempt))
        .map(|p| (p.item, p.attempt))
        .collect();
    Json(HeartbeatReply {
        phase: t.phase(),
        split,
        stale,
    })
}

async fn complete(State(c): State<Arc<Coord>>, Json(r): Json<Completion>) -> Json<CompletionReply> {
    let mut t = c.tracker();
    c.contact(&mut t, &r.from);
    let report = t.complete(&r.from, r.item, r.attempt, r.report, Instant::now());
    let accepted = report.accepted();
    if let Report::Accepted(e) = report {
        c.log(&[*e]);
        c.changed.notify_waiters();
    }
    // The slot's next item in the same answer; with nothing runnable, it asks in a lease
    // (which waits for work to appear).
    let next = (accepted && r.then_lease)
        .then(|| {
            c.log(&t.coalesce(Instant::now()));
            t.lease(&r.from, Instant::now())
        })
        .filter(|l| !matches!(l, Lease::Wait));
    Json(CompletionReply { accepted, next })
}

async fn fail(State(c): State<Arc<Coord>>, Json(f): Json<AttemptFailed>) -> Json<Accepted> {
    let mut t = c.tracker();
    c.contact(&mut t, &f.from);
    let events = t.fail(f.item, f.attempt, f.failure, Instant::now());
    c.log(&events);
    c.changed.notify_waiters();
    Json(Accepted { accepted: true })
}

async fn split(State(c): State<Arc<Coord>>, Json(s): Json<SplitOffer>) -> Json<Accepted> {
    let mut t = c.tracker();
    c.contact(&mut t, &s.from);
    let report = t.propose_split(s.item, s.attempt, s.keep, s.give, Instant::now());
    let accepted = report.accepted();
    if let Report::Accepted(e) = report {
        c.log(&[*e]);
        c.changed.notify_waiters();
    }
    Json(Accepted { accepted })
}

async fn drain(State(c): State<Arc<Coord>>, Json(w): Json<WorkerId>) -> Json<Accepted> {
    c.tracker().drain(&w);
    Json(Accepted { accepted: true })
}

/// Where a streaming job's checkpoints go: `--checkpoint-dir`, else `tempLocation`/JOB, else
/// the state dir (one machine only: workers elsewhere could not restore a shard from it).
fn checkpoint_root(opts: &CoordinatorOptions, job_name: &str) -> String {
    opts.checkpoint_dir
        .clone()
        .unwrap_or_else(|| match &opts.plan.options.temp_location {
            Some(t) => format!("{}/{}", t.trim_end_matches('/'), job_name),
            None => opts.state_dir.join("checkpoints").display().to_string(),
        })
}

/// Runs a checkpoint's items on the coordinator's workers.
pub(crate) struct OnWorkers {
    pub(crate) coord: Arc<Coord>,
}

impl riverbank_streaming::driver::CheckpointRunner for OnWorkers {
    fn job_token(&self, _id: u64) -> String {
        // The workers name their temporary files with the job's token; checkpoints never
        // overlap, so each commit's cleanup removes only its own.
        self.coord.job.job_token.clone()
    }

    async fn run(
        &self,
        mut tracker: Tracker,
        id: u64,
        mut cancel: tokio::sync::watch::Receiver<bool>,
    ) -> riverbank_streaming::driver::Checkpointed {
        {
            let mut t = self.coord.tracker();
            tracker.inherit_workers(&t);
            if id > 1 {
                // Checkpoints were taken before this one (a coordinator that restarted resumes
                // the job): the job runs, whether or not a worker has asked yet.
                tracker.set_running();
            }
            if let Some(s) = &self.coord.streaming {
                let done = t.progress(&self.coord.job.job_name, Instant::now());
                let mut past = s.past_stages.lock().unwrap_or_else(|p| p.into_inner());
                super::streaming::add_stages(&mut past, &done.stages);
            }
            *t = tracker;
        }
        self.coord.changed.notify_waiters();
        loop {
            {
                let t = self.coord.tracker();
                if t.all_done() || t.phase().is_terminal() {
                    let error = t.failure().map(failure_error);
                    return riverbank_streaming::driver::Checkpointed::of(&t, error);
                }
            }
            tokio::select! {
                _ = self.coord.changed.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                r = cancel.wait_for(|c| *c) => {
                    if r.is_ok() {
                        let mut t = self.coord.tracker();
                        t.cancel(Instant::now());
                        self.coord.changed.notify_waiters();
                        return riverbank_streaming::driver::Checkpointed::of(&t, Some(RunError::Cancelled));
                    }
                }
            }
        }
    }
}

fn failure_error(f: &riverbank_pipeline::JobFailure) -> RunError {
    match &f.transform {
        Some(t) => RunError::Transform {
            transform: t.clone(),
            message: f.message.clone(),
            record: f.record.clone(),
        },
        None => RunError::Internal(f.message.clone()),
    }
}

/// The checkpoint loop of a streaming job, in the background; its end ends the job.
fn spawn_checkpoints(coord: &Arc<Coord>, opts: &CoordinatorOptions) {
    let Some(s) = &coord.streaming else {
        return;
    };
    let root = s.root.clone();
    let scfg = super::streaming::config(
        &opts.plan,
        root,
        opts.max_per_checkpoint,
        opts.from_snapshot.clone(),
    );
    let metrics = Arc::new(riverbank_engine::metrics::Metrics::new(
        coord.plan.plan.graph.transforms.len(),
        coord.plan.plan.stages.len(),
    ));
    let (control, status) = (s.control.subscribe(), s.status.clone());
    let coord = coord.clone();
    tokio::spawn(async move {
        let runner = OnWorkers {
            coord: coord.clone(),
        };
        let plan = coord.plan.clone();
        let shards = coord.job.shuffle_partitions;
        let result = riverbank_streaming::driver::drive(
            plan, &runner, shards, scfg, metrics, control, status,
        )
        .await;
        let stop_snapshot = coord.streaming.as_ref().and_then(|s| {
            s.stop_snapshot
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        });
        if matches!(result, Err(riverbank_engine::error::RunError::Cancelled))
            && let Some(s) = &coord.streaming
            && let Some(name) = stop_snapshot
        {
            // Stopped for an update: keep the state as the last checkpoint left it.
            match s.snapshot(&name).await {
                Ok(taken) => tracing::info!(checkpoint = taken.checkpoint, "stopped for an update"),
                Err(e) => tracing::warn!("stopped for an update, without a snapshot: {e}"),
            }
        }
        let mut t = coord.tracker();
        match result {
            Ok(summary) => {
                t.apply(
                    &Event::Committed {
                        files: summary.files.clone(),
                    },
                    Instant::now(),
                );
                if let Some(s) = &coord.streaming {
                    *s.summary.lock().unwrap_or_else(|p| p.into_inner()) = Some(summary);
                }
                tracing::info!("streaming job drained");
            }
            Err(riverbank_engine::error::RunError::Cancelled) => {
                t.cancel(Instant::now());
                tracing::info!("streaming job ended: cancelled or stopped");
            }
            Err(e) => {
                tracing::error!("streaming job failed: {e}");
                t.apply(
                    &Event::Failed {
                        failure: riverbank_engine::work::failure_of(&e),
                    },
                    Instant::now(),
                );
            }
        }
        drop(t);
        coord.sinks_finished.send_replace(true);
        coord.changed.notify_waiters();
    });
}

/// A streaming job: stop reading, fire every window, commit, end (Dataflow's drain).
async fn drain_job(State(c): State<Arc<Coord>>) -> Json<JobProgress> {
    if let Some(s) = &c.streaming {
        s.control.send_if_modified(|now| {
            let changed = *now == riverbank_streaming::driver::Control::Run;
            if changed {
                *now = riverbank_streaming::driver::Control::Drain;
            }
            changed
        });
        c.changed.notify_waiters();
    }
    Json(c.progress())
}

/// A streaming job: keep its last completed checkpoint as a named snapshot (it runs on).
async fn snapshot_job(
    State(c): State<Arc<Coord>>,
    Json(r): Json<SnapshotRequest>,
) -> Result<Json<SnapshotTaken>, (StatusCode, String)> {
    let s = streaming_only(&c)?;
    match s.snapshot(&r.name).await {
        Ok(taken) => {
            c.changed.notify_waiters();
            Ok(Json(taken))
        }
        Err(e) => Err((StatusCode::CONFLICT, e)),
    }
}

/// A streaming job: finish the checkpoint under way, start no other, snapshot the state and
/// end (the first step of an update). Answers at once; the status says when it is over.
async fn stop_job(
    State(c): State<Arc<Coord>>,
    Json(r): Json<StopRequest>,
) -> Result<Json<JobProgress>, (StatusCode, String)> {
    let s = streaming_only(&c)?;
    super::streaming::valid_snapshot_name(&r.snapshot).map_err(|e| (StatusCode::BAD_REQUEST, e))?;
    *s.stop_snapshot.lock().unwrap_or_else(|p| p.into_inner()) = Some(r.snapshot);
    s.control.send_if_modified(|now| {
        let changed = *now == riverbank_streaming::driver::Control::Run;
        if changed {
            *now = riverbank_streaming::driver::Control::Stop;
        }
        changed
    });
    c.changed.notify_waiters();
    Ok(Json(c.progress()))
}

/// A streaming job: could this plan continue it, keeping its state? Compiles the plan here,
/// where its data is, and checks it against the last completed checkpoint.
async fn update_check(
    State(c): State<Arc<Coord>>,
    Json(r): Json<UpdateCheck>,
) -> Result<Json<UpdateVerdict>, (StatusCode, String)> {
    let s = streaming_only(&c)?;
    let refuse = |reason: String| {
        Ok(Json(UpdateVerdict {
            compatible: false,
            reason: Some(reason),
        }))
    };
    if !r.plan.is_streaming() {
        return refuse("the new pipeline is not a streaming pipeline".into());
    }
    let plan = match compile(r.plan, 65_536).await {
        Ok(p) => p,
        Err(e) => return refuse(e.to_string()),
    };
    match riverbank_streaming::snapshot::check_update(
        &s.root,
        &plan,
        c.job.shuffle_partitions,
        &r.transform_name_mapping,
    )
    .await
    {
        Ok(()) => Ok(Json(UpdateVerdict {
            compatible: true,
            reason: None,
        })),
        Err(e) => refuse(e.to_string()),
    }
}

fn streaming_only(c: &Coord) -> Result<&super::streaming::Streaming, (StatusCode, String)> {
    c.streaming.as_ref().ok_or((
        StatusCode::CONFLICT,
        "this is a batch job: snapshots, stops and updates are for streaming jobs".to_string(),
    ))
}

/// Cancels the job and answers once its sinks' temp files are gone, so a caller that sees
/// `Cancelled` may delete the job's pods. A commit already under way is let finish (the job
/// ends Done): stopping it halfway would leave some shards committed and others not.
async fn cancel(State(c): State<Arc<Coord>>) -> Json<JobProgress> {
    if let Some(s) = &c.streaming {
        s.control
            .send_replace(riverbank_streaming::driver::Control::Cancel);
        wait_sinks_finished(&c, Duration::from_secs(20)).await;
        return Json(c.progress());
    }
    let e = {
        let mut t = c.tracker();
        if c.finishing.load(Ordering::SeqCst) {
            None
        } else {
            t.cancel(Instant::now())
        }
    };
    if let Some(e) = e {
        c.log(&[e]);
        c.changed.notify_waiters();
    }
    finish_if_due(&c).await;
    if c.tracker().phase().is_terminal() {
        wait_sinks_finished(&c, Duration::from_secs(20)).await;
    }
    Json(c.progress())
}

async fn summary(State(c): State<Arc<Coord>>) -> Json<Summary> {
    if let Some(s) = &c.streaming
        && let Some(done) = s.summary.lock().unwrap_or_else(|p| p.into_inner()).clone()
    {
        let st = s.status.lock().unwrap_or_else(|p| p.into_inner()).clone();
        return Json(Summary {
            elements_out: done.elements_out,
            files: done.files,
            items_per_worker: c.tracker().items_per_worker(),
            dynamic_splits: 0,
            rows_read: st.elements_read,
            bytes_read: 0,
            shuffle_bytes: 0,
        });
    }
    let t = c.tracker();
    let (bytes_read, rows_read) = t.read_totals();
    Json(Summary {
        elements_out: c
            .plan
            .plan
            .graph
            .transforms
            .iter()
            .zip(t.elements_out())
            .map(|(tr, n)| (tr.name.clone(), n))
            .collect(),
        files: t.committed().cloned().unwrap_or_default(),
        items_per_worker: t.items_per_worker(),
        dynamic_splits: t.dynamic_splits(),
        rows_read,
        bytes_read,
        shuffle_bytes: t.shuffle_bytes(),
    })
}

async fn metrics(State(c): State<Arc<Coord>>) -> String {
    let p = c.progress();
    let mut s = vec![
        Sample::new(
            "work_items_total",
            "Work items of the job so far.",
            p.work_items_total as f64,
        ),
        Sample::new(
            "work_items_done",
            "Work items finished.",
            p.work_items_done as f64,
        ),
        Sample::new(
            "work_items_running",
            "Work items running now.",
            p.work_items_running as f64,
        ),
        Sample::new(
            "work_items_remaining",
            "Work items not finished.",
            (p.work_items_total - p.work_items_done) as f64,
        ),
        Sample::new(
            "fraction_consumed",
            "Estimated fraction of the job done.",
            p.fraction_consumed,
        ),
        Sample::new(
            "remaining_bytes",
            "Estimated input bytes left to process.",
            p.remaining_bytes as f64,
        ),
        Sample::new(
            "throughput_bytes_per_second",
            "Input bytes processed per second over the last 30 s.",
            p.throughput_bytes_per_sec,
        ),
        Sample::new(
            "backlog_seconds",
            "Remaining bytes over throughput (Dataflow's backlog time).",
            p.backlog_seconds.unwrap_or(0.0),
        ),
        Sample::new(
            "workers_alive",
            "Workers heard from within the lease timeout.",
            p.workers.iter().filter(|w| w.alive).count() as f64,
        ),
        Sample::new(
            "dynamic_splits",
            "Work items created by dynamic work rebalancing.",
            c.tracker().dynamic_splits() as f64,
        ),
    ];
    for phase in ["Pending", "Running", "Done", "Failed", "Cancelled"] {
        s.push(
            Sample::new(
                "job_phase",
                "1 for the job's current phase.",
                (format!("{:?}", p.phase) == phase) as u8 as f64,
            )
            .label("phase", phase),
        );
    }
    // A streaming job's data freshness, backlog, state and checkpoints (the chart's dashboard
    // and its watermark-lag alert read them).
    if let Some(st) = &p.streaming {
        if let Some(lag) = st.watermark_lag_seconds {
            s.push(Sample::new(
                "watermark_lag_seconds",
                "How far the output watermark is behind wall time (data freshness).",
                lag,
            ));
        }
        s.push(Sample::new(
            "streaming_backlog_elements",
            "Source elements not read yet, over all partitions.",
            st.backlog_elements as f64,
        ));
        s.push(Sample::new(
            "streaming_state_bytes",
            "Bytes of the state shards on the workers' disks.",
            st.state_bytes as f64,
        ));
        s.push(Sample::new(
            "checkpoints_completed",
            "The last completed checkpoint's number.",
            st.checkpoint as f64,
        ));
    }
    for st in &p.stages {
        for (name, help, v) in [
            (
                "stage_elements_in",
                "Elements into a stage (finished items).",
                st.elements_in,
            ),
            (
                "stage_elements_out",
                "Elements out of a stage (finished items).",
                st.elements_out,
            ),
            (
                "stage_bytes_in",
                "Bytes into a stage: source bytes read and shuffle bytes.",
                st.bytes_in,
            ),
            (
                "stage_bytes_out",
                "Shuffle bytes written by a stage.",
                st.bytes_out,
            ),
            (
                "stage_items_done",
                "Finished work items of a stage.",
                st.items_done,
            ),
            (
                "stage_items_total",
                "Work items of a stage.",
                st.items_total,
            ),
        ] {
            s.push(Sample::new(name, help, v as f64).label("stage", st.name.clone()));
        }
    }
    for w in &p.workers {
        s.push(
            Sample::new(
                "worker_cpu",
                "A worker's CPU use, fraction of its cores.",
                w.cpu,
            )
            .label("worker", w.name.clone()),
        );
        s.push(
            Sample::new(
                "worker_items_done",
                "Work items a worker finished.",
                w.items_done as f64,
            )
            .label("worker", w.name.clone()),
        );
    }
    encode_samples(s)
}
