//! The distributed entry points: `riverbank coordinator`, `riverbank worker` (what the
//! operator's pods run), and `riverbank run --workers N`, which starts both on loopback as
//! separate processes and supervises them.
use crate::bind::addr;
use crate::{PipelineArgs, load, progress, runtime};
use anyhow::{Context, Result, bail};
use riverbank_autoscale::InsightConfig;
use riverbank_autoscale::insights::{self, InsightBook};
use riverbank_cluster::client::CoordinatorClient;
use riverbank_cluster::coordinator::{CoordinatorOptions, run_coordinator};
use riverbank_cluster::protocol::Summary;
use riverbank_cluster::worker::{WorkerOptions, run_worker};
use riverbank_engine::{BundleChaos, Metrics, RunSummary};
use riverbank_pipeline::{JobPhase, JobProgress, Plan};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

mod autoscale;
mod memory;
use crate::ui::{self, LocalUi, RunState, UiOptions};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct CoordinatorArgs {
    /// The plan: `plan.json` as the operator writes it, or a Beam YAML / DataflowJob file.
    #[arg(long)]
    plan: PathBuf,
    /// Jinja variables when `--plan` is a YAML file, as a JSON object.
    #[arg(long, value_name = "JSON")]
    jinja_variables: Option<String>,
    /// Port of the workers' API and of `/v1/status` (0: any free port).
    #[arg(long, default_value_t = 7070)]
    port: u16,
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    bind: String,
    /// Where the progress log lives (the coordinator's persistent volume).
    #[arg(long, default_value = "/var/lib/riverbank")]
    state_dir: PathBuf,
    /// Also serve /healthz and /readyz on this port.
    #[arg(long)]
    health_port: Option<u16>,
    /// Also serve /metrics on this port.
    #[arg(long)]
    metrics_port: Option<u16>,
    #[arg(long, default_value_t = riverbank_engine::config::DEFAULT_SHUFFLE_PARTITIONS)]
    shuffle_partitions: u32,
    /// Batch: neighbouring shuffle partitions within this many MiB together run as one item.
    #[arg(long, default_value_t = riverbank_engine::config::DEFAULT_COALESCE_PARTITIONS_MB, value_name = "MIB")]
    coalesce_partitions_mb: u64,
    /// A worker silent for this long is presumed dead and its work runs elsewhere.
    #[arg(long, default_value_t = 10_000)]
    lease_timeout_ms: u64,
    /// A finished work item's output that its readers cannot fetch is recomputed and read
    /// again, with a growing backoff, for this long before the job fails (a pod whose name does
    /// not resolve yet, a restarting pod, a slow node).
    #[arg(long, default_value_t = 180)]
    output_patience_secs: u64,
    /// Memory per combine/SQL operator before it spills, in MiB.
    #[arg(long, default_value_t = 512)]
    memory_mb: usize,
    /// Exit once the job is over (default: keep serving the final status).
    #[arg(long)]
    exit_when_done: bool,
    /// Write the bound address to this file (with `--port 0`).
    #[arg(long)]
    address_file: Option<PathBuf>,
    /// Listen on this inherited socket (`run --workers` binds it) instead of `--port`.
    #[arg(long, hide = true)]
    listen_fd: Option<i32>,
    /// Chaos testing: sleep after every bundle.
    #[arg(long, default_value_t = 0, hide = true)]
    bundle_delay_ms: u64,
    /// Testing: keep a core busy after every bundle, as a CPU-bound transform would.
    #[arg(long, default_value_t = 0, hide = true)]
    bundle_busy_ms: u64,
    /// Testing: and this many microseconds per row of a bundle.
    #[arg(long, default_value_t = 0, hide = true)]
    row_busy_us: u64,
    /// Streaming: where the checkpoints go, a directory or object-store URL every worker
    /// reaches (default: `tempLocation`/JOB, else STATE_DIR/checkpoints).
    #[arg(long, value_name = "DIR_OR_URL")]
    checkpoint_dir: Option<String>,
    /// Streaming: most elements one source partition reads in one checkpoint (more offsets
    /// where they are sparse, as a Nexmark reader of one kind's event numbers).
    #[arg(long, default_value_t = 200_000)]
    max_per_checkpoint: u64,
    /// Streaming: start a new job from this snapshot (ignored once the job has checkpoints).
    #[arg(long, value_name = "DIR_OR_URL")]
    from_snapshot: Option<String>,
    /// With --from-snapshot: renamed transforms, JSON `{"old": "new"}`.
    #[arg(long, value_name = "JSON")]
    transform_name_mapping: Option<String>,
    /// Streaming: this run's id, reported in its status (the operator's `g<generation>`). A run
    /// keeps its progress log in STATE_DIR/runs/ID: an updated pipeline is a new run.
    #[arg(long, value_parser = run_id)]
    run_id: Option<String>,
}

#[derive(clap::Args)]
pub struct WorkerArgs {
    /// `host:port` of the job's coordinator.
    #[arg(long)]
    coordinator: String,
    /// The plan: `plan.json`, or a Beam YAML / DataflowJob file. Checked against the
    /// coordinator's job; the worker then runs the plan as the coordinator compiled it.
    #[arg(long)]
    plan: PathBuf,
    #[arg(long, value_name = "JSON")]
    jinja_variables: Option<String>,
    /// Port serving this worker's shuffle files (0: any free port).
    #[arg(long, default_value_t = 7071)]
    port: u16,
    #[arg(long, default_value = "0.0.0.0")]
    bind: String,
    /// How other workers reach this one (`host:port`; default 127.0.0.1 and the bound port).
    #[arg(long)]
    advertise: Option<String>,
    /// The worker's disk: shuffle files and spills.
    #[arg(long, default_value = "/var/lib/riverbank")]
    data_dir: PathBuf,
    #[arg(long)]
    health_port: Option<u16>,
    #[arg(long)]
    metrics_port: Option<u16>,
    /// Work slots: work items run at once (default: the number of cores).
    #[arg(long, visible_alias = "threads")]
    slots: Option<usize>,
    /// The worker's name (the pod name in Kubernetes).
    #[arg(long, env = "POD_NAME")]
    name: Option<String>,
    /// Exit once the job is over (default: idle until stopped).
    #[arg(long)]
    exit_when_done: bool,
    /// Keep retrying an unreachable coordinator this long before giving up.
    #[arg(long, default_value_t = 300)]
    patience_secs: u64,
    /// Keep retrying another worker whose shuffle output cannot be fetched (its name does not
    /// resolve yet, it is restarting) this long before its output counts as lost and is
    /// recomputed.
    #[arg(long, default_value_t = 15)]
    fetch_patience_secs: u64,
}

fn plan_from(file: &Path, jinja_variables: Option<String>) -> Result<Plan> {
    if file.extension().is_some_and(|e| e == "json") {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        return serde_json::from_str(&text)
            .with_context(|| format!("{} is not a Riverbank plan", file.display()));
    }
    load(&PipelineArgs {
        file: file.to_path_buf(),
        jinja_variables,
        sdk_args: Vec::new(),
    })
}

fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
}

/// A run id names a directory: one path segment of safe characters.
fn run_id(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(s.to_string())
    } else {
        Err("a run id is 1 to 64 letters, digits, '-', '_' or '.'".into())
    }
}

pub fn coordinator(a: CoordinatorArgs) -> Result<()> {
    let plan = plan_from(&a.plan, a.jinja_variables)?;
    let opts = CoordinatorOptions {
        plan,
        listen: addr(&a.bind, a.port)?,
        listen_fd: a.listen_fd,
        metrics_listen: a.metrics_port.map(|p| addr(&a.bind, p)).transpose()?,
        health_listen: a.health_port.map(|p| addr(&a.bind, p)).transpose()?,
        state_dir: match &a.run_id {
            Some(id) => a.state_dir.join("runs").join(id),
            None => a.state_dir,
        },
        shuffle_partitions: a.shuffle_partitions,
        coalesce_bytes: a.coalesce_partitions_mb << 20,
        lease_timeout: Duration::from_millis(a.lease_timeout_ms),
        output_patience: Duration::from_secs(a.output_patience_secs),
        batch_size: 65_536,
        memory_limit: a.memory_mb.max(1) << 20,
        max_attempts: 4,
        chaos: BundleChaos {
            inject_failures: 0,
            delay_ms: a.bundle_delay_ms,
            busy_ms: a.bundle_busy_ms,
            busy_us_per_row: a.row_busy_us,
        },
        exit_when_done: a.exit_when_done,
        address_file: a.address_file,
        checkpoint_dir: a.checkpoint_dir,
        max_per_checkpoint: a.max_per_checkpoint,
        from_snapshot: match a.from_snapshot {
            None => None,
            Some(path) => Some(riverbank_streaming::driver::FromSnapshot {
                path,
                transform_name_mapping: match &a.transform_name_mapping {
                    None => Default::default(),
                    Some(j) => serde_json::from_str(j)
                        .context("--transform-name-mapping must be a JSON object")?,
                },
            }),
        },
        run_id: a.run_id,
    };
    let rt = runtime(2)?;
    let progress = rt
        .block_on(run_coordinator(opts))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    match progress.phase {
        JobPhase::Failed => bail!("job failed: {}", progress.message),
        _ => Ok(()),
    }
}

pub fn worker(a: WorkerArgs) -> Result<()> {
    let plan = plan_from(&a.plan, a.jinja_variables)?;
    let slots = a.slots.unwrap_or_else(cores).max(1);
    crate::python_sdk::set_scratch(&a.data_dir, true);
    let opts = WorkerOptions {
        plan,
        coordinator: a.coordinator,
        name: a
            .name
            .unwrap_or_else(|| format!("worker-{}", std::process::id())),
        listen: addr(&a.bind, a.port)?,
        advertise: a.advertise,
        metrics_listen: a.metrics_port.map(|p| addr(&a.bind, p)).transpose()?,
        health_listen: a.health_port.map(|p| addr(&a.bind, p)).transpose()?,
        data_dir: a.data_dir,
        slots,
        exit_when_done: a.exit_when_done,
        patience: Duration::from_secs(a.patience_secs),
        fetch_patience: Duration::from_secs(a.fetch_patience_secs),
    };
    crate::udf::enable_hosts(slots);
    let rt = runtime(slots)?;
    let result = rt.block_on(run_worker(opts));
    crate::udf::stop_hosts();
    result.map_err(|e| anyhow::anyhow!("{e}"))
}

/// `riverbank run --workers N`.
pub struct LocalCluster {
    pub workers: usize,
    /// Work slots per worker (default: the machine's cores shared among the initial workers).
    pub slots: Option<usize>,
    pub memory_mb: usize,
    /// How far the workers' memory limit (`memory_mb`) may grow after an out-of-memory kill.
    pub max_memory_mb: Option<usize>,
    pub shuffle_partitions: u32,
    pub coalesce_partitions_mb: u64,
    pub work_dir: Option<PathBuf>,
    /// Serve the web console.
    pub ui: Option<UiOptions>,
    pub show_progress: bool,
    pub autoscale: Option<LocalAutoscale>,
    pub chaos: BundleChaos,
    /// Thresholds of the insights found in the coordinator's status while the job runs.
    pub insights: InsightConfig,
    /// Streaming: where the checkpoints go (default: in the run's work directory).
    pub checkpoint_dir: Option<String>,
    pub max_per_checkpoint: u64,
    pub from_snapshot: Option<riverbank_streaming::driver::FromSnapshot>,
}

/// `--autoscale`: the operator's engine applied to local worker processes.
pub struct LocalAutoscale {
    pub max_workers: u32,
    /// Engine seconds per real second: compresses the engine's clock (its 30 s batch interval,
    /// its windows) so a short local job can be watched scaling. 1 = real time.
    pub time_scale: f64,
}

/// A child process and whether we asked it to leave.
struct Proc {
    name: String,
    child: Child,
    retiring: bool,
}

/// The coordinator (first) and the workers; all killed when dropped, so an error here leaves
/// nothing running.
struct Children(Vec<Proc>);

impl Drop for Children {
    fn drop(&mut self) {
        for p in &mut self.0 {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

impl Children {
    fn active_workers(&self) -> usize {
        self.0[1..].iter().filter(|p| !p.retiring).count()
    }
}

/// Restarts of processes that died before the job finished. A process killed by a signal
/// (SIGKILL from outside, the OOM killer) is always started again, as a kubelet would; one that
/// exits by itself with an error is a crash loop after a few tries, and the run gives up.
#[derive(Default)]
struct Restarts {
    crashes: usize,
    /// Out-of-memory kills with the memory already at its maximum: nothing will change.
    oom_at_max: usize,
}

/// Out-of-memory kills at the maximum memory before the run gives up (the tracker fails a job
/// whose item was lost this many times, too).
const OOM_AT_MAX_LIMIT: usize = 10;

impl Restarts {
    /// A worker killed for memory that cannot grow: a crash loop after [`OOM_AT_MAX_LIMIT`].
    fn out_of_memory_at_max(&mut self, name: &str, max_mb: u64) -> Result<()> {
        self.oom_at_max += 1;
        if self.oom_at_max >= OOM_AT_MAX_LIMIT {
            bail!(
                "workers keep running out of memory at their maximum of {max_mb} MiB ({name}, {} kills); giving up: raise --memory-mb or --max-memory-mb",
                self.oom_at_max
            );
        }
        Ok(())
    }

    fn count(
        &mut self,
        name: &str,
        status: std::process::ExitStatus,
        workers: usize,
    ) -> Result<()> {
        use std::os::unix::process::ExitStatusExt;
        if status.signal().is_some() {
            return Ok(());
        }
        self.crashes += 1;
        if self.crashes > 3 * workers.max(1) {
            bail!("processes keep failing ({name}: {status}); giving up");
        }
        Ok(())
    }
}

/// Starts the coordinator (again, after a crash: same port, same state directory).
struct CoordinatorSpawner {
    exe: PathBuf,
    plan_file: PathBuf,
    /// The coordinator's listening socket, bound here and held for the whole run: each
    /// coordinator process (a restarted one too) inherits it, so its port never changes hands.
    listener: std::net::TcpListener,
    dir: PathBuf,
    address_file: PathBuf,
    shuffle_partitions: u32,
    coalesce_partitions_mb: u64,
    memory_mb: usize,
    chaos: BundleChaos,
    checkpoint_dir: String,
    max_per_checkpoint: u64,
    from_snapshot: Option<riverbank_streaming::driver::FromSnapshot>,
    /// Streaming: children in their own process group, so a terminal's Ctrl-C reaches only
    /// this launcher, which drains the job (the children would otherwise just stop).
    own_group: bool,
}

/// Prepares a child of the launcher (the coordinator, a worker): in its own process group when
/// `own_group`, and killed with the launcher, so a launcher that is itself killed (SIGKILL, the
/// OOM killer) leaves no coordinator or workers running on without it; a streaming job resumes
/// from its last checkpoint when it is run again. The signal follows the *thread* that forked:
/// every child is spawned from `run_local_cluster`, on the launcher's main thread.
fn launched(c: &mut Command, own_group: bool) -> &mut Command {
    use std::os::unix::process::CommandExt;
    let launcher = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec only prctl(2) and getppid(2), which are async-signal-safe.
    unsafe {
        c.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher died before the line above: nothing would signal this child.
            if libc::getppid() != launcher {
                return Err(std::io::Error::other("the launcher is gone"));
            }
            Ok(())
        });
    }
    if own_group {
        c.process_group(0);
    }
    c
}

impl CoordinatorSpawner {
    fn spawn(&self) -> Result<Proc> {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let fd = self.listener.as_raw_fd();
        let port = self.listener.local_addr()?.port();
        let mut cmd = Command::new(&self.exe);
        // SAFETY: between fork and exec only fcntl(2), which is async-signal-safe: the socket
        // stays open across exec in this child alone.
        unsafe {
            cmd.pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = launched(&mut cmd, self.own_group)
            .arg("coordinator")
            .arg("--plan")
            .arg(&self.plan_file)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--listen-fd", &fd.to_string()])
            .args(["--lease-timeout-ms", "3000"])
            .arg("--state-dir")
            .arg(self.dir.join("coordinator"))
            .arg("--address-file")
            .arg(&self.address_file)
            .args(["--shuffle-partitions", &self.shuffle_partitions.to_string()])
            .args([
                "--coalesce-partitions-mb",
                &self.coalesce_partitions_mb.to_string(),
            ])
            .args(["--memory-mb", &self.memory_mb.to_string()])
            .args(["--bundle-delay-ms", &self.chaos.delay_ms.to_string()])
            .args(["--bundle-busy-ms", &self.chaos.busy_ms.to_string()])
            .args(["--row-busy-us", &self.chaos.busy_us_per_row.to_string()])
            .args(["--checkpoint-dir", &self.checkpoint_dir])
            .args(["--max-per-checkpoint", &self.max_per_checkpoint.to_string()])
            .args(self.from_snapshot.iter().flat_map(|s| {
                [
                    "--from-snapshot".to_string(),
                    s.path.clone(),
                    "--transform-name-mapping".to_string(),
                    serde_json::to_string(&s.transform_name_mapping).unwrap_or_default(),
                ]
            }))
            .arg("--exit-when-done")
            .stdin(Stdio::null())
            .spawn()
            .context("starting the coordinator")?;
        Ok(Proc {
            name: "coordinator".into(),
            child,
            retiring: false,
        })
    }
}

/// Starts worker processes.
struct Spawner {
    exe: PathBuf,
    address: String,
    plan_file: PathBuf,
    dir: PathBuf,
    slots: usize,
    own_group: bool,
}

impl Spawner {
    fn spawn(&self, i: usize) -> Result<Proc> {
        let name = format!("worker-{i}");
        let mut cmd = Command::new(&self.exe);
        let child = launched(&mut cmd, self.own_group)
            .arg("worker")
            .args(["--coordinator", &self.address])
            .arg("--plan")
            .arg(&self.plan_file)
            .args(["--bind", "127.0.0.1", "--port", "0"])
            .arg("--data-dir")
            .arg(self.dir.join(&name))
            .args(["--name", &name])
            .args(["--slots", &self.slots.to_string()])
            .arg("--exit-when-done")
            .stdin(Stdio::null())
            .spawn()
            .context("starting a worker")?;
        Ok(Proc {
            name,
            child,
            retiring: false,
        })
    }
}

pub fn run_local_cluster(plan: Plan, c: LocalCluster) -> Result<()> {
    let start = Instant::now();
    let streaming = plan.is_streaming();
    let base = c.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let dir = tempfile::Builder::new()
        .prefix("riverbank-cluster-")
        .tempdir_in(&base)
        .with_context(|| format!("creating a work directory in {}", base.display()))?;
    let plan_file = dir.path().join("plan.json");
    std::fs::write(&plan_file, serde_json::to_vec(&plan)?)?;
    let exe = std::env::current_exe().context("finding the riverbank binary")?;
    let address_file = dir.path().join("coordinator.addr");
    // The coordinator's socket, bound and listening here so that the workers can start with
    // the coordinator instead of after it (a connection waits in the backlog until it
    // accepts), and no other process can take the port in between.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding a loopback port")?;
    let address = listener.local_addr()?.to_string();
    let coordinator = CoordinatorSpawner {
        exe: exe.clone(),
        plan_file: plan_file.clone(),
        listener,
        dir: dir.path().to_path_buf(),
        address_file: address_file.clone(),
        shuffle_partitions: c.shuffle_partitions,
        coalesce_partitions_mb: c.coalesce_partitions_mb,
        memory_mb: c.memory_mb,
        chaos: c.chaos,
        checkpoint_dir: c
            .checkpoint_dir
            .clone()
            .unwrap_or_else(|| dir.path().join("checkpoints").display().to_string()),
        max_per_checkpoint: c.max_per_checkpoint,
        from_snapshot: c.from_snapshot.clone(),
        own_group: streaming,
    };
    let mut children = Children(vec![coordinator.spawn()?]);
    let spawner = Spawner {
        exe,
        address: address.clone(),
        plan_file,
        dir: dir.path().to_path_buf(),
        // Equal cores: the machine's cores shared among the initial workers.
        slots: c.slots.unwrap_or(cores() / c.workers).max(1),
        own_group: streaming,
    };
    let mut next_index = 0;
    for _ in 0..c.workers {
        children.0.push(spawner.spawn(next_index)?);
        next_index += 1;
    }
    // Listening, or it exited (its port taken): either way we know before watching the job.
    wait_for_address(&address_file, &mut children)?;
    let mut scaler = c
        .autoscale
        .as_ref()
        .map(|a| autoscale::Scaler::new(&plan, c.workers, spawner.slots, a));
    let rt = runtime(1)?;
    let console: Option<Arc<LocalUi>> =
        c.ui.as_ref()
            .map(|o| rt.block_on(LocalUi::start(o, &plan)))
            .transpose()?;
    let mut memory = memory::MemoryLimit::new(c.memory_mb, c.max_memory_mb);
    // Workers killed for memory, newest last: the WORKER_OUT_OF_MEMORY insight.
    let mut oom_kills: Vec<insights::OomKill> = vec![];
    let mut oom_next: Option<String> = None;
    // Short patience: while the coordinator is down this loop must go on to restart it.
    // A status long poll answers within its 250 ms; a coordinator that died leaves our socket
    // listening, so a request to it times out (and the loop restarts it) instead of failing.
    let client = CoordinatorClient::new(&address, Duration::from_millis(500))
        .with_timeout(Duration::from_secs(1));
    let bar = c.show_progress.then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {bar:30} {pos}/{len} work items  {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let mut restarts = Restarts::default();
    let mut unreachable_since: Option<Instant> = None;
    // Streaming: Ctrl-C (or SIGTERM) drains the job through its coordinator; again, cancels.
    let mut stops = streaming
        .then(|| rt.block_on(async { StopSignals::new() }))
        .flatten();
    if streaming {
        eprintln!("streaming: Ctrl-C drains the job, a second Ctrl-C cancels it");
    }
    // Dataflow's insights, from the same status the operator reads.
    let mut book = InsightBook::default();
    let progress: JobProgress = loop {
        // A long poll: back when the job changes, so its end is seen at once. Not while the
        // coordinator is down (it would wait for the timeout): it is restarted below first.
        let coordinator_up = matches!(children.0[0].child.try_wait(), Ok(None));
        let p: Option<JobProgress> = if coordinator_up {
            rt.block_on(client.get("/v1/status?wait_ms=250")).ok()
        } else {
            None
        };
        // A process that died is started again under its name and on its disk, as a
        // StatefulSet replaces a pod: the coordinator replays its log, a worker's running items
        // run again. Workers that were asked to leave are let go.
        // A worker over its memory limit is killed, as the kernel's OOM killer kills a pod's
        // container; it is started again below, at the size decided here.
        for p in children.0[1..].iter_mut().filter(|p| !p.retiring) {
            if let Some(rss) = memory.over(p.child.id()) {
                let _ = p.child.kill();
                let d = memory.killed(&p.name, rss);
                oom_kills.push(insights::OomKill {
                    pod: p.name.clone(),
                    memory: Some(format!("{} MiB", d.from >> 20)),
                });
                oom_next = Some(if d.to > d.from {
                    format!(
                        "The workers' memory was raised to {} MiB (--max-memory-mb {}).",
                        d.to >> 20,
                        d.max >> 20
                    )
                } else {
                    "The workers' memory is at its maximum: raise --max-memory-mb, or reduce the memory the pipeline needs.".into()
                });
                let line = format!("memory: {}", d.describe());
                match &bar {
                    Some(b) => b.suspend(|| eprintln!("{line}")),
                    None => eprintln!("{line}"),
                }
                if let Some(u) = &console {
                    u.event(true, "OOMKilled", &d.describe());
                }
                if d.to == d.from {
                    restarts.out_of_memory_at_max(&p.name, d.max >> 20)?;
                }
            }
        }
        let mut first = true;
        let mut replace = vec![];
        children.0.retain_mut(|p| {
            let coordinator = std::mem::take(&mut first);
            match p.child.try_wait() {
                // A worker that exits 0 was told the job is over (`--exit-when-done`): let it go
                // (started again, it would only exit again and count as a crash loop).
                Ok(Some(status)) if coordinator || (!p.retiring && !status.success()) => {
                    replace.push((p.name.clone(), status));
                    coordinator
                }
                Ok(Some(_)) => false,
                _ => true,
            }
        });
        for (name, status) in replace {
            restarts.count(&name, status, c.workers)?;
            tracing::warn!(%name, %status, "exited before the job finished; starting it again");
            if let Some(u) = &console {
                u.event(
                    true,
                    "Restarted",
                    &format!("{name} exited ({status}) before the job finished; started again"),
                );
            }
            if name == "coordinator" {
                children.0[0] = coordinator.spawn()?;
            } else {
                let i: usize = name
                    .trim_start_matches("worker-")
                    .parse()
                    .unwrap_or(next_index);
                children.0.push(spawner.spawn(i)?);
            }
        }
        if let Some(s) = &mut stops {
            match rt.block_on(async { s.take() }) {
                0 => {}
                1 => {
                    eprintln!("draining: no more reads; firing every window");
                    let _: Result<JobProgress, _> = rt.block_on(client.post("/v1/job/drain", &()));
                }
                _ => {
                    eprintln!("cancelling");
                    let _: Result<JobProgress, _> = rt.block_on(client.post("/v1/cancel", &()));
                }
            }
        }
        let Some(p) = p else {
            let since = *unreachable_since.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(120) {
                bail!("the coordinator at {address} has not answered for 2 minutes");
            }
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        unreachable_since = None;
        let at = start.elapsed().as_secs_f64();
        let mut found = insights::from_progress(&p, &c.insights);
        let mut newest_first = oom_kills.clone();
        newest_first.reverse();
        found.extend(insights::worker_out_of_memory(
            &newest_first,
            oom_next.clone(),
        ));
        // MAX_NUM_WORKERS and ACTIVE_KEYS: the autoscaler's, held until its next decision.
        if let Some(s) = &scaler
            && let Some(d) = s.last()
            && let Some(insight) = d.insight
        {
            found.push(insights::from_decision(insight, d, s.max_workers()));
        }
        for f in book.update(found, at) {
            let line = format!("insight {} at {at:.1} s: {}", f.insight.code(), f.message);
            if let Some(u) = &console {
                u.event(true, f.insight.code(), &f.message);
            }
            match &bar {
                Some(b) => b.suspend(|| eprintln!("{line}")),
                None => eprintln!("{line}"),
            }
        }
        if let Some(b) = &bar {
            b.set_length(p.work_items_total);
            b.set_position(p.work_items_done);
            b.set_message(p.message.clone());
            b.tick();
        }
        if let Some(u) = &console {
            let active = children.active_workers() as u32;
            let last = scaler.as_ref().and_then(|s| s.last());
            u.observe(RunState {
                progress: Some(&p),
                state: None,
                workers: active,
                target_workers: last.map_or(active, |d| d.workers_to_apply()),
                insights: ui::insights(&book),
                evaluation: last.map(ui::evaluation),
            });
        }
        if p.phase.is_terminal() {
            break p;
        }
        if let Some(s) = &mut scaler
            && let Some(target) = s.observe(&p, children.active_workers())
        {
            if let Some(u) = &console {
                u.event(
                    false,
                    "Rescaled",
                    &format!(
                        "{} -> {target} workers: {}",
                        children.active_workers(),
                        s.last().map(|d| d.message.as_str()).unwrap_or_default()
                    ),
                );
            }
            resize(&mut children, &spawner, &mut next_index, target)?;
        }
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let summary: Summary = rt
        .block_on(client.get("/v1/summary"))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let wall = start.elapsed();
    // The outcome is durable and read: everyone may go. Workers are told to stop, as they
    // would exit on their own once they hear the job is over, but one waiting out a backoff
    // then finds the coordinator gone and holds the exit until the deadline; with nothing
    // running, a stopped worker exits at once (its disk goes with the run's directory).
    // Whoever has not gone by the deadline is killed when `children` drops.
    for p in &mut children.0[1..] {
        terminate(p);
    }
    let _ = children.0[0].child.kill();
    // Polled finely: a worker's exit takes milliseconds, and this wait is the run's last.
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline
        && children
            .0
            .iter_mut()
            .any(|p| matches!(p.child.try_wait(), Ok(None)))
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    print_insights(&book);
    if let Some(u) = &console {
        u.observe(RunState {
            progress: Some(&progress),
            state: None,
            workers: 0,
            target_workers: 0,
            insights: ui::insights(&book),
            evaluation: scaler.as_ref().and_then(|s| s.last()).map(ui::evaluation),
        });
    }
    if let Some(sp) = &progress.streaming {
        eprintln!(
            "drained after checkpoint {}: {} elements read, {} late elements dropped; {} rescales{}",
            sp.checkpoint,
            sp.elements_read,
            sp.late_elements_dropped,
            sp.rescales,
            sp.last_rescale_pause_ms.map_or(String::new(), |ms| format!(
                ", the last paused the job {ms} ms"
            )),
        );
    }
    if progress.phase != JobPhase::Done {
        bail!(
            "job {}: {}",
            format!("{:?}", progress.phase).to_lowercase(),
            progress.message
        );
    }
    let metrics = Metrics::new(0, 0);
    Metrics::add(&metrics.rows_read, summary.rows_read);
    Metrics::add(&metrics.bytes_read, summary.bytes_read);
    progress::print_summary(
        &RunSummary {
            wall,
            elements_out: summary.elements_out,
            files: summary.files,
        },
        &metrics,
    );
    let per_worker: Vec<String> = summary
        .items_per_worker
        .iter()
        .map(|(w, n)| format!("{w}: {n}"))
        .collect();
    // A streaming job's checkpoints are not counted as work items: nothing to say then.
    if !per_worker.is_empty() {
        eprintln!(
            "work items per worker: {}; {} dynamic splits; {} shuffled",
            per_worker.join(", "),
            summary.dynamic_splits,
            progress::human_bytes(summary.shuffle_bytes)
        );
    }
    Ok(())
}

/// SIGINT and SIGTERM, counted.
struct StopSignals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    seen: usize,
    taken: usize,
}

impl StopSignals {
    fn new() -> Option<StopSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        Some(StopSignals {
            int: signal(SignalKind::interrupt()).ok()?,
            term: signal(SignalKind::terminate()).ok()?,
            seen: 0,
            taken: 0,
        })
    }

    /// 0 when no new signal came; else how many came in all (1: drain, more: cancel).
    fn take(&mut self) -> usize {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        while self.int.poll_recv(&mut cx).is_ready() || self.term.poll_recv(&mut cx).is_ready() {
            self.seen += 1;
        }
        if self.seen == self.taken {
            return 0;
        }
        self.taken = self.seen;
        self.seen
    }
}

/// The insights seen during the run, with what to do about them.
fn print_insights(book: &InsightBook) {
    if book.history().is_empty() {
        return;
    }
    eprintln!("insights:");
    for (at, f) in book.history() {
        eprintln!("  {} (from {at:.1} s): {}", f.insight.code(), f.message);
        eprintln!("    recommendation: {}", f.recommendation);
    }
}

/// Adds workers, or asks the newest ones to leave (SIGTERM: they finish their items first).
fn resize(
    children: &mut Children,
    spawner: &Spawner,
    next_index: &mut usize,
    target: usize,
) -> Result<()> {
    let active = children.active_workers();
    if target > active {
        for _ in active..target {
            children.0.push(spawner.spawn(*next_index)?);
            *next_index += 1;
        }
    } else {
        let mut leaving = active - target;
        for p in children.0[1..].iter_mut().rev() {
            if leaving == 0 {
                break;
            }
            if !p.retiring {
                terminate(p);
                p.retiring = true;
                leaving -= 1;
            }
        }
    }
    Ok(())
}

/// Sends SIGTERM to a child still running (a worker drains: it finishes its items and exits).
fn terminate(p: &mut Proc) {
    // Only a child not yet reaped: its pid cannot have gone to another process.
    if matches!(p.child.try_wait(), Ok(None)) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(p.child.id() as libc::pid_t, libc::SIGTERM) };
    }
}

/// Waits until the coordinator has written its address file (it listens).
fn wait_for_address(file: &Path, children: &mut Children) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if file.exists() {
            return Ok(());
        }
        if let Ok(Some(status)) = children.0[0].child.try_wait() {
            bail!("the coordinator exited ({status}) before listening");
        }
        if Instant::now() > deadline {
            bail!("the coordinator did not start listening within 2 minutes");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
