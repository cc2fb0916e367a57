//! Beam's Job API: Prepare plans the pipeline (refusing, with the transform's name, what
//! Riverbank cannot run) and returns where to stage its artifacts (this server, `artifacts`),
//! Run executes it in the background on this server's harnesses, and the state and message
//! streams follow it to its end. One Fn API server serves every job.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::Stream;
use tokio::sync::{Notify, oneshot, watch};
use tonic::codegen::http;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use crate::artifacts::staging::StagingService;
use crate::artifacts::{self, ArtifactStore, Dependencies};
use crate::error::PortableError;
use crate::execute::checkpoint::{Checkpoint, ObjectStorage};
use crate::execute::progress::Live;
use crate::execute::{self, RunSettings};
use crate::fnapi::{FnServer, no_delay};
use crate::job_api::artifact_staging_service_server::ArtifactStagingServiceServer;
use crate::job_api::job_service_server::{JobService, JobServiceServer};
use crate::job_api::{
    CancelJobRequest, CancelJobResponse, DescribePipelineOptionsRequest,
    DescribePipelineOptionsResponse, DrainJobRequest, DrainJobResponse, GetJobMetricsRequest,
    GetJobMetricsResponse, GetJobPipelineRequest, GetJobPipelineResponse, GetJobStateRequest,
    GetJobsRequest, GetJobsResponse, JobInfo, JobMessage, JobMessagesRequest, JobMessagesResponse,
    JobStateEvent, MetricResults, PrepareJobRequest, PrepareJobResponse, RunJobRequest,
    RunJobResponse, job_message, job_messages_response, job_state,
};
use crate::launch::{JobEvents, Launcher, Submitted};
use crate::options;
use crate::plan::Plan;
use crate::runner_api::{ApiServiceDescriptor, Components, Pipeline};

/// Where the job server listens and how many harnesses each environment gets.
#[derive(Debug, Clone)]
pub struct JobServerOptions {
    /// The Job API address (Beam's default port is 8099).
    pub bind: SocketAddr,
    /// The Fn API address harnesses dial (port 0 picks one).
    pub fn_bind: SocketAddr,
    /// The host harnesses are told to dial (this machine's name as they see it).
    pub fn_advertise: String,
    /// Harnesses per environment unless the pipeline sets `--sdk_worker_parallelism`.
    pub sdk_workers: usize,
    /// Where jobs' staged artifacts are kept while they run (default: a temporary directory).
    pub artifacts_dir: Option<std::path::PathBuf>,
    /// Plan the jobs submitted and refuse to run them (`riverbank plan` of an SDK pipeline).
    pub plan_only: bool,
    /// How often a running stage's progress is asked for and told in the job's messages.
    pub progress_every: Duration,
    /// MiB of each job's materialized PCollections held in memory; the rest waits on disk.
    pub memory_mb: usize,
    /// Opens a streaming job's `--temp_location` in object storage for its checkpoints.
    pub object_storage: Option<ObjectStorage>,
    /// Beam worker pools (`host:port`) that run DOCKER environments' harnesses, as SDK worker
    /// pods do on Kubernetes (`riverbank job-server --workers N` starts them on this machine);
    /// none: a DOCKER environment is refused.
    pub worker_pools: Vec<String>,
}

/// How long a job's first harnesses wait for the worker pools to answer (their Python starting).
const POOL_START_WAIT: Duration = Duration::from_secs(60);

/// A job as Prepare planned it.
pub struct PreparedJob {
    pub name: String,
    pub plan: Plan,
}

/// A running job server.
pub struct JobServer {
    pub addr: SocketAddr,
    jobs: Jobs,
    stop: Option<oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<()>>,
}

impl JobServer {
    /// A job server that runs its jobs itself.
    pub async fn start(options: JobServerOptions) -> Result<JobServer, PortableError> {
        Self::start_with(options, None).await
    }

    /// A job server that hands its jobs to `launcher` (planned and staged here, run there).
    pub async fn start_launching(
        options: JobServerOptions,
        launcher: Arc<dyn Launcher>,
    ) -> Result<JobServer, PortableError> {
        Self::start_with(options, Some(launcher)).await
    }

    async fn start_with(
        options: JobServerOptions,
        launcher: Option<Arc<dyn Launcher>>,
    ) -> Result<JobServer, PortableError> {
        let fn_server = FnServer::start(options.fn_bind, &options.fn_advertise).await?;
        let artifacts = Arc::new(ArtifactStore::new(options.artifacts_dir.clone())?);
        let listener = tokio::net::TcpListener::bind(options.bind)
            .await
            .map_err(|e| {
                PortableError::Harness(format!("cannot listen on {}: {e}", options.bind))
            })?;
        let addr = listener
            .local_addr()
            .map_err(|e| PortableError::Harness(e.to_string()))?;
        let jobs = Jobs {
            inner: Arc::new(Inner {
                fn_server,
                artifacts: artifacts.clone(),
                options,
                launcher,
                jobs: Default::default(),
                next: AtomicU64::new(1),
            }),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let service = jobs.clone();
        let incoming = no_delay(listener);
        let server = Server::builder()
            .layer(tower::util::MapRequestLayer::new(remember_authority))
            .add_service(
                JobServiceServer::new(service)
                    .max_decoding_message_size(usize::MAX)
                    .max_encoding_message_size(usize::MAX),
            )
            .add_service(
                ArtifactStagingServiceServer::new(StagingService(artifacts))
                    .max_decoding_message_size(usize::MAX),
            )
            .serve_with_incoming_shutdown(incoming, async {
                stopped.await.ok();
            });
        let done = tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!("job server stopped: {e}");
            }
        });
        tracing::info!("Beam job service listening on {addr}");
        Ok(JobServer {
            addr,
            jobs,
            stop: Some(stop),
            done: Some(done),
        })
    }

    /// The jobs prepared so far, in the order they were.
    pub fn prepared(&self) -> Vec<PreparedJob> {
        let mut jobs = self.jobs.all();
        jobs.sort_by_key(|j| j.seq);
        jobs.iter()
            .map(|j| PreparedJob {
                name: j.name.clone(),
                plan: j.plan.clone(),
            })
            .collect()
    }

    /// Stops every job running here (Ctrl-C in `riverbank run`): a streaming one drained, a
    /// batch one cancelled.
    pub fn stop_all(&self) -> Stopped {
        let mut stopped = Stopped::default();
        for job in self.jobs.all() {
            if terminal(job.state()) || !*job.started.lock().expect("started") {
                continue;
            }
            if job.plan.streaming && job.drain() {
                stopped.drained += 1;
            } else {
                job.set_state(job_state::Enum::Cancelling);
                job.cancel.send_replace(true);
                stopped.cancelled += 1;
            }
        }
        stopped
    }

    /// Serves until the process is stopped.
    pub async fn wait(mut self) {
        if let Some(done) = self.done.take() {
            let _ = done.await;
        }
    }
}

impl Drop for JobServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// What [`JobServer::stop_all`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    pub drained: usize,
    pub cancelled: usize,
}

/// The address a client dialled (its `:authority`), which it can dial again: the artifact
/// staging endpoint Prepare returns is this server as the client reaches it (through a
/// port-forward or a Service name alike).
#[derive(Clone)]
struct Authority(String);

fn remember_authority<B>(mut request: http::Request<B>) -> http::Request<B> {
    if let Some(authority) = request.uri().authority().map(|a| a.to_string()) {
        request.extensions_mut().insert(Authority(authority));
    }
    request
}

struct Inner {
    fn_server: FnServer,
    artifacts: Arc<ArtifactStore>,
    options: JobServerOptions,
    launcher: Option<Arc<dyn Launcher>>,
    jobs: Mutex<HashMap<String, Arc<Job>>>,
    next: AtomicU64,
}

#[derive(Clone)]
struct Jobs {
    inner: Arc<Inner>,
}

/// One job: what was submitted, and its history of states and messages (which every stream
/// replays from the start, as Beam's job servers do).
struct Job {
    id: String,
    /// Order of preparation (the oldest ended jobs are forgotten first).
    seq: u64,
    prepared_at: std::time::Instant,
    name: String,
    pipeline: Pipeline,
    plan: Plan,
    options: prost_types::Struct,
    events: Mutex<Vec<job_messages_response::Response>>,
    changed: watch::Sender<usize>,
    cancel: watch::Sender<bool>,
    /// Set to drain a streaming job run here.
    drain: watch::Sender<bool>,
    /// Set to stop a streaming job run here for its replacement (`--update`), which waits on
    /// `successor` for the state it stopped with.
    update: watch::Sender<bool>,
    successor: Mutex<Option<oneshot::Sender<Box<Checkpoint>>>>,
    /// The bundles' metrics, as they run and finish.
    live: Arc<Live>,
    /// A launched job's metrics, as its launcher last reported them.
    reported: Mutex<Option<MetricResults>>,
    started: Mutex<bool>,
    message_streams: AtomicUsize,
    streams_closed: Notify,
}

fn now() -> prost_types::Timestamp {
    prost_types::Timestamp::from(SystemTime::now())
}

fn terminal(state: i32) -> bool {
    use job_state::Enum as S;
    [
        S::Done as i32,
        S::Failed as i32,
        S::Cancelled as i32,
        S::Drained as i32,
        S::Updated as i32,
    ]
    .contains(&state)
}

impl Job {
    fn state(&self) -> i32 {
        state_of(&self.events.lock().expect("events"))
    }

    fn push(&self, event: job_messages_response::Response) {
        let len = {
            let mut events = self.events.lock().expect("events");
            events.push(event);
            events.len()
        };
        self.changed.send_replace(len);
    }

    fn set_state(&self, state: job_state::Enum) {
        if terminal(self.state()) {
            return;
        }
        self.push(job_messages_response::Response::StateResponse(
            JobStateEvent {
                state: state as i32,
                timestamp: Some(now()),
            },
        ));
    }

    fn say(&self, importance: job_message::MessageImportance, text: String) {
        // The server's log at the level Beam's Python client logs the message at.
        use job_message::MessageImportance as I;
        match importance {
            I::JobMessageError => tracing::error!(job = %self.id, "{text}"),
            I::JobMessageWarning => tracing::warn!(job = %self.id, "{text}"),
            I::JobMessageBasic => tracing::info!(job = %self.id, "{text}"),
            _ => tracing::debug!(job = %self.id, "{text}"),
        }
        let n = self.events.lock().expect("events").len();
        self.push(job_messages_response::Response::MessageResponse(
            JobMessage {
                message_id: format!("{}-{n}", self.id),
                time: humantime(SystemTime::now()),
                importance: importance as i32,
                message_text: text,
            },
        ));
    }

    /// Drains the job if it runs (or is draining already): its sources stop, what they read
    /// goes through. Whether it is draining.
    fn drain(&self) -> bool {
        let state = self.state();
        if state == job_state::Enum::Running as i32 {
            self.set_state(job_state::Enum::Draining);
            self.drain.send_replace(true);
        }
        self.state() == job_state::Enum::Draining as i32
    }

    /// The job failed on `e`: its message, then its state.
    fn fail(&self, e: &PortableError) {
        tracing::error!(job = %self.id, "failed: {e}");
        self.say(
            job_message::MessageImportance::JobMessageError,
            e.to_string(),
        );
        self.set_state(job_state::Enum::Failed);
    }

    /// Waits until no message stream of this job is open, or `timeout` passes.
    async fn message_streams_ended(&self, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let closed = self.streams_closed.notified();
            if self.message_streams.load(Ordering::SeqCst) == 0 {
                // Let the end of the stream reach the client before the state does.
                tokio::time::sleep(Duration::from_millis(20)).await;
                return;
            }
            if tokio::time::timeout_at(deadline, closed).await.is_err() {
                return;
            }
        }
    }

    /// Every event from the start, then each new one, until the job has ended. With
    /// `after_messages` (the state stream), the terminal state waits (up to 2 s) for the job's
    /// message streams to have ended, and the stream is then left for the client to close:
    /// Beam's Python client stops reading both at the terminal state and exits, and a gRPC event
    /// still being handled by one of its daemon threads at interpreter exit deadlocks the exit
    /// (grpc's `_Rendezvous.__del__` waits on a lock that thread holds).
    fn follow(
        self: &Arc<Self>,
        after_messages: bool,
    ) -> impl Stream<Item = job_messages_response::Response> + Send + 'static {
        let job = self.clone();
        let mut changed = self.changed.subscribe();
        async_stream(move |tx| async move {
            let mut sent = 0;
            loop {
                let (batch, ended) = {
                    let events = job.events.lock().expect("events");
                    (events[sent..].to_vec(), terminal(state_of(&events)))
                };
                sent += batch.len();
                for e in batch {
                    if after_messages
                        && matches!(&e, job_messages_response::Response::StateResponse(s) if terminal(s.state))
                    {
                        job.message_streams_ended(Duration::from_secs(2)).await;
                    }
                    if tx.send(e).is_err() {
                        return;
                    }
                }
                if ended && after_messages {
                    // Beam's Python client does not count UPDATED as an end: it reads on until
                    // the stream ends, so that one ends at once.
                    if job.state() == job_state::Enum::Updated as i32 {
                        return;
                    }
                    // Left open for the client to cancel: it stops reading at the terminal state,
                    // and an end of stream arriving as it exits races its own teardown the same way.
                    let _ = tokio::time::timeout(STATE_STREAM_LINGER, tx.closed()).await;
                    return;
                }
                if ended || changed.changed().await.is_err() {
                    return;
                }
            }
        })
    }
}

/// How long a state stream stays open after the terminal state, unless the client leaves first.
const STATE_STREAM_LINGER: Duration = Duration::from_secs(60);

/// A message stream of a job, counted while open.
struct OpenStream(Arc<Job>);

impl OpenStream {
    fn new(job: &Arc<Job>) -> OpenStream {
        job.message_streams.fetch_add(1, Ordering::SeqCst);
        OpenStream(job.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.message_streams.fetch_sub(1, Ordering::SeqCst);
        self.0.streams_closed.notify_waiters();
    }
}

/// The last state among `events` (Stopped before any).
fn state_of(events: &[job_messages_response::Response]) -> i32 {
    events
        .iter()
        .rev()
        .find_map(|e| match e {
            job_messages_response::Response::StateResponse(s) => Some(s.state),
            _ => None,
        })
        .unwrap_or(job_state::Enum::Stopped as i32)
}

fn humantime(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    format!("{secs:.3}")
}

/// A stream fed by a task (so that a slow reader never blocks the job).
fn async_stream<T, F, Fut>(f: F) -> impl Stream<Item = T> + Send + 'static
where
    T: Send + 'static,
    F: FnOnce(tokio::sync::mpsc::UnboundedSender<T>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(f(tx));
    tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
}

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The old job's state for `job`, its replacement, or `None` if `job` is cancelled first.
async fn wait_or_cancel(
    job: &Job,
    handed: oneshot::Receiver<Box<Checkpoint>>,
) -> Option<Result<Box<Checkpoint>, oneshot::error::RecvError>> {
    let mut cancel = job.cancel.subscribe();
    tokio::select! {
        handed = handed => Some(handed),
        _ = cancel.wait_for(|c| *c) => None,
    }
}

/// A running job told to stop for its replacement: its id, where its state will come, and
/// each of its transform ids as the replacement calls it.
struct Replaced {
    old: String,
    handed: oneshot::Receiver<Box<Checkpoint>>,
    ids: crate::update::Ids,
}

impl Jobs {
    /// `--update`: the running streaming job of `job`'s name on this server, told to stop
    /// between two rounds and hand over its state, if `job` can take its place
    /// (`crate::update`).
    #[allow(clippy::result_large_err)]
    fn replace(&self, job: &Job) -> Result<Replaced, Status> {
        let refuse = |why: String| {
            Status::failed_precondition(format!("--update of job '{}': {why}", job.name))
        };
        let running = [
            job_state::Enum::Running as i32,
            job_state::Enum::Starting as i32,
        ];
        let old = self
            .all()
            .into_iter()
            .find(|j| j.id != job.id && j.name == job.name && running.contains(&j.state()))
            .ok_or_else(|| refuse("no job of that name is running on this job server".into()))?;
        let ids = crate::update::ids(&old.plan, &job.plan, &job.options)
            .map_err(|why| refuse(format!("it cannot take the place of job {}: {why}", old.id)))?;
        let (handover, handed) = oneshot::channel();
        {
            let mut successor = old.successor.lock().expect("successor");
            if successor.is_some() {
                return Err(refuse(format!("job {} is being updated already", old.id)));
            }
            *successor = Some(handover);
        }
        if !running.contains(&old.state()) {
            // It ended meanwhile, perhaps before it could see the successor.
            drop(old.successor.lock().expect("successor").take());
            return Err(refuse(format!("job {} ended meanwhile", old.id)));
        }
        old.update.send_replace(true);
        Ok(Replaced {
            old: old.id.clone(),
            handed,
            ids,
        })
    }

    fn all(&self) -> Vec<Arc<Job>> {
        self.inner
            .jobs
            .lock()
            .expect("jobs")
            .values()
            .cloned()
            .collect()
    }

    fn job(&self, id: &str) -> Result<Arc<Job>, Status> {
        self.inner
            .jobs
            .lock()
            .expect("jobs")
            .get(id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("no job '{id}'")))
    }
}

#[tonic::async_trait]
impl JobService for Jobs {
    async fn prepare(
        &self,
        request: Request<PrepareJobRequest>,
    ) -> Result<Response<PrepareJobResponse>, Status> {
        let staging_url = match request.extensions().get::<Authority>() {
            Some(Authority(a)) => a.clone(),
            None => format!(
                "{}:{}",
                self.inner.options.fn_advertise,
                self.inner.options.bind.port()
            ),
        };
        let r = request.into_inner();
        let pipeline = r
            .pipeline
            .ok_or_else(|| Status::invalid_argument("Prepare needs a pipeline"))?;
        let options = r.pipeline_options.clone().unwrap_or_default();
        let plan = Plan::with_options(&pipeline, &options)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let seq = self.inner.next.fetch_add(1, Ordering::Relaxed);
        // Beam's Python client names every job "job"; its --job_name is in the options.
        let name = options::text(&options, "job_name").unwrap_or(r.job_name);
        let id = format!("{}-{seq}", sanitize(&name));
        let (changed, _) = watch::channel(0);
        let (cancel, _) = watch::channel(false);
        let job = Arc::new(Job {
            id: id.clone(),
            seq,
            prepared_at: std::time::Instant::now(),
            name,
            pipeline,
            plan,
            options,
            events: Mutex::new(Vec::new()),
            changed,
            cancel,
            drain: watch::channel(false).0,
            update: watch::channel(false).0,
            successor: Mutex::new(None),
            live: Arc::default(),
            reported: Mutex::new(None),
            started: Mutex::new(false),
            message_streams: AtomicUsize::new(0),
            streams_closed: Notify::new(),
        });
        job.set_state(job_state::Enum::Stopped);
        job.say(
            job_message::MessageImportance::JobMessageDetailed,
            format!("plan:\n{}", job.plan),
        );
        self.inner
            .artifacts
            .register(&id, submitted_dependencies(&job.plan));
        tracing::info!(job = %id, stages = job.plan.stages.len(), "prepared");
        {
            let mut jobs = self.inner.jobs.lock().expect("jobs");
            for forgotten in forget_old_jobs(&mut jobs, std::time::Instant::now()) {
                self.inner.artifacts.discard(&forgotten);
            }
            jobs.insert(id.clone(), job);
        }
        Ok(Response::new(PrepareJobResponse {
            preparation_id: id.clone(),
            artifact_staging_endpoint: Some(ApiServiceDescriptor {
                url: staging_url,
                authentication: None,
            }),
            staging_session_token: id,
        }))
    }

    async fn run(
        &self,
        request: Request<RunJobRequest>,
    ) -> Result<Response<RunJobResponse>, Status> {
        let id = request.into_inner().preparation_id;
        let job = self.job(&id)?;
        if self.inner.options.plan_only {
            return Err(Status::failed_precondition(format!(
                "job '{id}' was planned, not run: this job server only plans"
            )));
        }
        {
            let mut started = job.started.lock().expect("started");
            if *started {
                return Err(Status::failed_precondition(format!(
                    "job '{id}' was already run"
                )));
            }
            *started = true;
        }
        // A launched job's update is its launcher's (the DataflowJob it updates runs on).
        let replaces = match options::flag(&job.options, "update") && self.inner.launcher.is_none()
        {
            true => match self.replace(&job) {
                Ok(handover) => Some(handover),
                Err(refused) => {
                    *job.started.lock().expect("started") = false;
                    return Err(refused);
                }
            },
            false => None,
        };
        let inner = self.inner.clone();
        if let Some(launcher) = inner.launcher.clone() {
            tokio::spawn(launch(inner, launcher, job));
            return Ok(Response::new(RunJobResponse { job_id: id }));
        }
        tokio::spawn(async move {
            job.set_state(job_state::Enum::Starting);
            let resume = match replaces {
                Some(Replaced { old, handed, ids }) => {
                    let Some(handed) = wait_or_cancel(&job, handed).await else {
                        // Cancelled while it waited: the old job, told to stop, still writes
                        // its last checkpoint, from which a new submission resumes.
                        job.say(
                            job_message::MessageImportance::JobMessageBasic,
                            format!("cancelled while job {old} stopped for it"),
                        );
                        job.set_state(job_state::Enum::Cancelled);
                        return;
                    };
                    match handed {
                        Ok(state) => {
                            let renamed =
                                state.renamed(&|t| ids.transform(t), &|p| ids.pcollection(p));
                            let state = match renamed {
                                Ok(state) => Box::new(state),
                                Err(e) => {
                                    job.fail(&e);
                                    return;
                                }
                            };
                            job.say(
                                job_message::MessageImportance::JobMessageBasic,
                                format!("replaces job {old}, stopped between two rounds"),
                            );
                            Some(state)
                        }
                        Err(_) => {
                            job.fail(&PortableError::Checkpoint(format!(
                                "job {old} ended before it handed over its state: nothing to update"
                            )));
                            return;
                        }
                    }
                }
                None => None,
            };
            job.set_state(job_state::Enum::Running);
            let settings = RunSettings {
                job_id: job.id.clone(),
                job_name: job.name.clone(),
                sdk_workers: inner.options.sdk_workers,
                worker_pools: tokio::sync::watch::channel(inner.options.worker_pools.clone()).1,
                pool_wait: POOL_START_WAIT,
                pipeline_options: job.options.clone(),
                progress_every: inner.options.progress_every,
                memory_budget: inner.options.memory_mb << 20,
                drain: job.drain.subscribe(),
                stop: job.update.subscribe(),
                resume,
                replaces: None,
                object_storage: inner.options.object_storage.clone(),
            };
            let say = |text: String| job.say(job_message::MessageImportance::JobMessageBasic, text);
            let started = std::time::Instant::now();
            let result = match inner.artifacts.resolved(&job.id).await {
                Ok(staged) => {
                    if let Some(staged) = &staged {
                        job.say(
                            job_message::MessageImportance::JobMessageBasic,
                            staged_summary(staged),
                        );
                    }
                    let mut plan = job.plan.clone();
                    use_staged(&mut plan.components, staged);
                    execute::run(
                        &plan,
                        &inner.fn_server,
                        &settings,
                        job.cancel.subscribe(),
                        &say,
                        job.live.clone(),
                    )
                    .await
                }
                Err(e) => Err(e),
            };
            inner.artifacts.discard(&job.id);
            match result {
                Ok(ended) => {
                    let (what, state) = match ended {
                        execute::Ended::Done => ("done", job_state::Enum::Done),
                        execute::Ended::Drained => ("drained", job_state::Enum::Drained),
                        execute::Ended::Stopped(state) => {
                            if let Some(successor) = job.successor.lock().expect("successor").take()
                            {
                                let _ = successor.send(state);
                            }
                            ("stopped for its replacement", job_state::Enum::Updated)
                        }
                    };
                    job.say(
                        job_message::MessageImportance::JobMessageBasic,
                        format!("{what} in {:.1} s", started.elapsed().as_secs_f64()),
                    );
                    job.set_state(state);
                }
                Err(PortableError::Cancelled) => job.set_state(job_state::Enum::Cancelled),
                Err(e) => job.fail(&e),
            }
            // A replacement waiting for a job that ended otherwise learns it has nothing to
            // take over.
            drop(job.successor.lock().expect("successor").take());
        });
        Ok(Response::new(RunJobResponse { job_id: id }))
    }

    async fn get_jobs(
        &self,
        _: Request<GetJobsRequest>,
    ) -> Result<Response<GetJobsResponse>, Status> {
        let job_info = self
            .all()
            .iter()
            .map(|j| JobInfo {
                job_id: j.id.clone(),
                job_name: j.name.clone(),
                pipeline_options: Some(j.options.clone()),
                state: j.state(),
            })
            .collect();
        Ok(Response::new(GetJobsResponse { job_info }))
    }

    async fn get_state(
        &self,
        request: Request<GetJobStateRequest>,
    ) -> Result<Response<JobStateEvent>, Status> {
        let job = self.job(&request.into_inner().job_id)?;
        Ok(Response::new(JobStateEvent {
            state: job.state(),
            timestamp: Some(now()),
        }))
    }

    async fn get_pipeline(
        &self,
        request: Request<GetJobPipelineRequest>,
    ) -> Result<Response<GetJobPipelineResponse>, Status> {
        let job = self.job(&request.into_inner().job_id)?;
        Ok(Response::new(GetJobPipelineResponse {
            pipeline: Some(job.pipeline.clone()),
        }))
    }

    async fn cancel(
        &self,
        request: Request<CancelJobRequest>,
    ) -> Result<Response<CancelJobResponse>, Status> {
        let job = self.job(&request.into_inner().job_id)?;
        if !terminal(job.state()) {
            if *job.started.lock().expect("started") {
                job.set_state(job_state::Enum::Cancelling);
                job.cancel.send_replace(true);
            } else {
                job.set_state(job_state::Enum::Cancelled);
                self.inner.artifacts.discard(&job.id);
            }
        }
        Ok(Response::new(CancelJobResponse { state: job.state() }))
    }

    async fn drain(
        &self,
        request: Request<DrainJobRequest>,
    ) -> Result<Response<DrainJobResponse>, Status> {
        let job = self.job(&request.into_inner().job_id)?;
        if !job.plan.streaming {
            return Err(Status::failed_precondition(format!(
                "job '{}' is a batch job: drain applies to streaming jobs",
                job.id
            )));
        }
        if !job.drain() {
            return Err(Status::failed_precondition(format!(
                "job '{}' is not running: nothing to drain",
                job.id
            )));
        }
        Ok(Response::new(DrainJobResponse { state: job.state() }))
    }

    type GetStateStreamStream = Boxed<JobStateEvent>;

    async fn get_state_stream(
        &self,
        request: Request<GetJobStateRequest>,
    ) -> Result<Response<Self::GetStateStreamStream>, Status> {
        use futures::StreamExt;
        let job = self.job(&request.into_inner().job_id)?;
        let states = job.follow(true).filter_map(|e| async move {
            match e {
                job_messages_response::Response::StateResponse(s) => Some(Ok(s)),
                _ => None,
            }
        });
        Ok(Response::new(Box::pin(states)))
    }

    type GetMessageStreamStream = Boxed<JobMessagesResponse>;

    async fn get_message_stream(
        &self,
        request: Request<JobMessagesRequest>,
    ) -> Result<Response<Self::GetMessageStreamStream>, Status> {
        use futures::StreamExt;
        let job = self.job(&request.into_inner().job_id)?;
        // Counted open until tonic drops the stream, after its end was sent.
        let open = OpenStream::new(&job);
        let all = job.follow(false).map(move |e| {
            let _open = &open;
            Ok(JobMessagesResponse { response: Some(e) })
        });
        Ok(Response::new(Box::pin(all)))
    }

    async fn get_job_metrics(
        &self,
        request: Request<GetJobMetricsRequest>,
    ) -> Result<Response<GetJobMetricsResponse>, Status> {
        let job = self.job(&request.into_inner().job_id)?;
        if let Some(reported) = job.reported.lock().expect("metrics").clone() {
            return Ok(Response::new(GetJobMetricsResponse {
                metrics: Some(reported),
            }));
        }
        // Attempted adds the running bundles' progress to what finished bundles reported.
        Ok(Response::new(GetJobMetricsResponse {
            metrics: Some(MetricResults {
                attempted: job.live.attempted().infos(),
                committed: job.live.committed().infos(),
            }),
        }))
    }

    async fn describe_pipeline_options(
        &self,
        _: Request<DescribePipelineOptionsRequest>,
    ) -> Result<Response<DescribePipelineOptionsResponse>, Status> {
        Ok(Response::new(DescribePipelineOptionsResponse {
            options: Vec::new(),
        }))
    }
}

impl JobEvents for Job {
    fn state(&self, state: job_state::Enum) {
        self.set_state(state);
    }

    fn say(&self, importance: job_message::MessageImportance, text: String) {
        Job::say(self, importance, text);
    }

    fn metrics(&self, metrics: MetricResults) {
        *self.reported.lock().expect("metrics") = Some(metrics);
    }
}

/// Run of a job server with a launcher: the staged artifacts in place of the submitted paths,
/// then the launcher's run, its end the job's end.
async fn launch(inner: Arc<Inner>, launcher: Arc<dyn Launcher>, job: Arc<Job>) {
    job.set_state(job_state::Enum::Starting);
    let result = match inner.artifacts.resolved(&job.id).await {
        Ok(staged) => {
            let mut pipeline = job.pipeline.clone();
            if let Some(components) = pipeline.components.as_mut() {
                use_staged(components, staged);
            }
            let submitted = Submitted {
                id: job.id.clone(),
                name: job.name.clone(),
                pipeline,
                options: job.options.clone(),
                streaming: job.plan.streaming,
            };
            launcher
                .run(
                    submitted,
                    job.as_ref(),
                    job.cancel.subscribe(),
                    job.drain.subscribe(),
                )
                .await
        }
        Err(e) => Err(e),
    };
    inner.artifacts.discard(&job.id);
    match result {
        Ok(state) => job.set_state(state),
        Err(e) => job.fail(&e),
    }
}

/// What each environment of the plan lists as its dependencies, for the client to stage.
fn submitted_dependencies(plan: &Plan) -> Dependencies {
    plan.components
        .environments
        .iter()
        .filter(|(_, e)| !e.dependencies.is_empty())
        .map(|(id, e)| (id.clone(), e.dependencies.clone()))
        .collect()
}

/// The job message naming what was staged, per environment.
fn staged_summary(staged: &Dependencies) -> String {
    let mut lines = vec!["staged artifacts:".to_string()];
    for (environment, artifacts) in staged {
        let names: Vec<String> = artifacts
            .iter()
            .map(|a| artifacts::staged_name(a).unwrap_or_else(|| a.type_urn.clone()))
            .collect();
        lines.push(format!("  {environment}: {}", names.join(", ")));
    }
    lines.join("\n")
}

/// The environments' dependencies replaced by the staged ones (if staged).
fn use_staged(components: &mut Components, staged: Option<Dependencies>) {
    for (id, dependencies) in staged.into_iter().flatten() {
        if let Some(environment) = components.environments.get_mut(&id) {
            environment.dependencies = dependencies;
        }
    }
}

/// Ended jobs a long-running server keeps for GetJobs, GetState and metrics; older ones (by
/// preparation order) are forgotten, so the server's memory does not grow with every job.
const ENDED_JOBS_KEPT: usize = 100;

/// How long a prepared job that was never run is kept (with its staged artifacts).
const UNRUN_JOBS_KEPT: Duration = Duration::from_secs(3600);

/// Forgets the oldest ended jobs beyond [`ENDED_JOBS_KEPT`], and jobs prepared more than
/// [`UNRUN_JOBS_KEPT`] ago and never run (a client that went away between Prepare and Run);
/// returns their ids.
fn forget_old_jobs(jobs: &mut HashMap<String, Arc<Job>>, now: std::time::Instant) -> Vec<String> {
    let mut forgotten: Vec<String> = jobs
        .iter()
        .filter(|(_, j)| {
            !*j.started.lock().expect("started")
                && !terminal(j.state())
                && now.saturating_duration_since(j.prepared_at) > UNRUN_JOBS_KEPT
        })
        .map(|(id, _)| id.clone())
        .collect();
    let mut ended: Vec<(u64, String)> = jobs
        .iter()
        .filter(|(_, j)| terminal(j.state()))
        .map(|(id, j)| (j.seq, id.clone()))
        .collect();
    if ended.len() >= ENDED_JOBS_KEPT {
        ended.sort();
        forgotten.extend(
            ended[..ended.len() + 1 - ENDED_JOBS_KEPT]
                .iter()
                .map(|(_, id)| id.clone()),
        );
    }
    for id in &forgotten {
        jobs.remove(id);
    }
    forgotten
}

fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if s.is_empty() { "job".into() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(seq: u64, state: job_state::Enum) -> Arc<Job> {
        let job = Job {
            id: format!("j-{seq}"),
            seq,
            prepared_at: std::time::Instant::now(),
            name: "j".into(),
            pipeline: Pipeline::default(),
            plan: Plan::new(&Pipeline::default()).unwrap(),
            options: Default::default(),
            events: Mutex::new(Vec::new()),
            changed: watch::channel(0).0,
            cancel: watch::channel(false).0,
            drain: watch::channel(false).0,
            update: watch::channel(false).0,
            successor: Mutex::new(None),
            live: Arc::default(),
            reported: Mutex::new(None),
            started: Mutex::new(true),
            message_streams: AtomicUsize::new(0),
            streams_closed: Notify::new(),
        };
        job.set_state(state);
        Arc::new(job)
    }

    #[test]
    fn a_long_running_server_forgets_its_oldest_ended_jobs_only() {
        let mut jobs: HashMap<String, Arc<Job>> = HashMap::new();
        for seq in 0..120 {
            let state = if seq % 10 == 0 {
                job_state::Enum::Running
            } else {
                job_state::Enum::Done
            };
            let j = job(seq, state);
            jobs.insert(j.id.clone(), j);
        }
        forget_old_jobs(&mut jobs, std::time::Instant::now());
        let ended = jobs.values().filter(|j| terminal(j.state())).count();
        assert_eq!(
            ended,
            ENDED_JOBS_KEPT - 1,
            "room for the job being prepared"
        );
        assert_eq!(jobs.len() - ended, 12, "running jobs are never forgotten");
        assert!(!jobs.contains_key("j-1") && jobs.contains_key("j-119"));
    }

    #[test]
    fn a_job_prepared_and_never_run_is_forgotten_after_an_hour() {
        let mut jobs: HashMap<String, Arc<Job>> = HashMap::new();
        let unrun = |seq| {
            let j = job(seq, job_state::Enum::Stopped);
            *j.started.lock().unwrap() = false;
            j
        };
        for j in [unrun(1), unrun(2), job(3, job_state::Enum::Running)] {
            jobs.insert(j.id.clone(), j);
        }
        let later = std::time::Instant::now() + UNRUN_JOBS_KEPT / 2;
        assert!(forget_old_jobs(&mut jobs, later).is_empty());
        let much_later = std::time::Instant::now() + UNRUN_JOBS_KEPT * 2;
        let mut forgotten = forget_old_jobs(&mut jobs, much_later);
        forgotten.sort();
        assert_eq!(forgotten, ["j-1", "j-2"]);
        assert!(jobs.contains_key("j-3"), "a running job stays");
    }
}
