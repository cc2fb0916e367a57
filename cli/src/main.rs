//! The `riverbank` command: a thin CLI over the pipeline model and the worker runtime.
mod beam_k8s;
mod beam_sdk;
mod bind;
mod cluster;
mod generate;
mod local_pools;
mod progress;
mod python_sdk;
mod streaming;
mod udf;
mod ui;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use riverbank_engine::{BundleChaos, Metrics, RunConfig, RunError, compile, run_observed};
use riverbank_pipeline::config::Language;
use riverbank_pipeline::{PipelineError, Plan, display};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "riverbank",
    version,
    about = "Run Beam YAML pipelines, locally or as DataflowJobs on Kubernetes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
pub(crate) struct PipelineArgs {
    /// A Beam YAML file (top-level `pipeline:`), a DataflowJob manifest, or a Beam Python SDK
    /// pipeline (`.py`, run and planned through Riverbank's portable runner).
    pub(crate) file: PathBuf,
    /// Jinja variables for the pipeline file, as a JSON object.
    #[arg(long, value_name = "JSON")]
    pub(crate) jinja_variables: Option<String>,
    /// A Python pipeline's own arguments (after `--`).
    #[arg(last = true, value_name = "ARGS")]
    pub(crate) sdk_args: Vec<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a pipeline on this machine, using all cores.
    Run {
        #[command(flatten)]
        pipeline: PipelineArgs,
        /// Work slots: work items run at once (default: the number of cores; with --workers,
        /// the cores shared among the workers).
        #[arg(long, visible_alias = "parallelism")]
        slots: Option<usize>,
        /// Memory for combines and SQL (a Python pipeline's materialized data) before they
        /// spill to disk, in MiB. With --workers, also
        /// each worker process's memory limit: a worker over it is killed, as a pod over its
        /// limit is.
        #[arg(long, default_value_t = 512)]
        memory_mb: usize,
        /// With --workers: after a worker is killed for memory, the workers' memory grows a step
        /// (x1.5, as the operator's vertical autoscaling) up to this many MiB (default: no growth).
        #[arg(long, requires = "workers")]
        max_memory_mb: Option<usize>,
        /// Serve the web console for this run (job graph, charts, insights) while it runs (a
        /// streaming job then runs on one worker process beside its coordinator, unless
        /// --workers says more).
        #[arg(long)]
        ui: bool,
        /// With --ui: the console's port (0: any free port).
        #[arg(long, default_value_t = 8080, requires = "ui")]
        ui_port: u16,
        /// With --ui: the address the console listens on.
        #[arg(long, default_value = "127.0.0.1", requires = "ui")]
        ui_bind: String,
        /// Directory for spill files (default: the system temp dir).
        #[arg(long)]
        spill_dir: Option<PathBuf>,
        /// Never show live progress, even on a terminal.
        #[arg(long)]
        no_progress: bool,
        /// Run on a coordinator and this many worker processes on loopback, as the operator
        /// runs a job on pods (default: in this process).
        #[arg(long)]
        workers: Option<usize>,
        /// Partitions of every shuffle; results are byte-identical across worker counts at the
        /// same value.
        #[arg(long, default_value_t = riverbank_engine::config::DEFAULT_SHUFFLE_PARTITIONS)]
        shuffle_partitions: u32,
        /// Batch: neighbouring shuffle partitions whose data together stays within this many
        /// MiB run as one work item (as Spark's adaptive coalescing); the output is the same.
        /// 0: every partition is its own item.
        #[arg(long, default_value_t = riverbank_engine::config::DEFAULT_COALESCE_PARTITIONS_MB, value_name = "MIB")]
        coalesce_partitions_mb: u64,
        /// With --workers: add and stop worker processes by the operator's autoscaling engine.
        #[arg(long, requires = "workers")]
        autoscale: bool,
        /// With --autoscale: the most workers to run.
        #[arg(long, default_value_t = 4)]
        max_workers: u32,
        /// With --autoscale: engine seconds per real second (compresses its 30 s batch
        /// interval and its windows, so a short local job can be watched scaling).
        #[arg(long, default_value_t = 1.0)]
        autoscale_time_scale: f64,
        /// Chaos testing: sleep after every bundle.
        #[arg(long, default_value_t = 0, hide = true)]
        bundle_delay_ms: u64,
        /// Testing: keep a core busy after every bundle, as a CPU-bound transform would.
        #[arg(long, default_value_t = 0, hide = true)]
        bundle_busy_ms: u64,
        /// Testing: and this many microseconds per row of a bundle (CPU that follows the load).
        #[arg(long, default_value_t = 0, hide = true)]
        row_busy_us: u64,
        /// With --workers: the LONG_WORK_ITEM insight's minimum, in seconds (the operator's
        /// is 60; a local test of a few seconds needs less).
        #[arg(long, default_value_t = 60.0, hide = true)]
        long_work_item_secs: f64,
        /// Streaming: where the checkpoints go (default: `tempLocation`/JOB, else
        /// .riverbank/JOB). A run given the same directory resumes after its last checkpoint.
        #[arg(long, value_name = "DIR_OR_URL")]
        checkpoint_dir: Option<String>,
        /// Streaming: seconds between checkpoints (default: options.checkpointIntervalSec, 10).
        #[arg(long, value_name = "SECS")]
        checkpoint_interval: Option<f64>,
        /// Streaming: most elements one partition reads in one checkpoint (its offsets; more
        /// offsets where they are sparse, as a Nexmark reader of one kind's event numbers).
        #[arg(long, default_value_t = 200_000)]
        max_per_checkpoint: u64,
        /// Streaming: start a new job from a snapshot (`riverbank snapshot`), keeping its state;
        /// the pipeline may be an updated one (Dataflow's update).
        #[arg(long, value_name = "DIR_OR_URL")]
        from_snapshot: Option<String>,
        /// With --from-snapshot: renamed transforms, as JSON `{"old name": "new name"}` (an
        /// empty new name drops that state), as Dataflow's transformNameMapping.
        #[arg(long, value_name = "JSON", requires = "from_snapshot")]
        transform_name_mapping: Option<String>,
    },
    /// Keep a streaming job's last completed checkpoint under a name, to start new jobs from
    /// (`run --from-snapshot`): `CHECKPOINT_DIR/snapshots/NAME`. Of a running job through its
    /// coordinator (`--coordinator`), or of a stopped one from its checkpoint directory.
    Snapshot {
        /// The job's checkpoint directory (its `--checkpoint-dir`).
        #[arg(
            long,
            value_name = "DIR_OR_URL",
            required_unless_present = "coordinator",
            conflicts_with = "coordinator"
        )]
        checkpoint_dir: Option<String>,
        /// `host:port` of the running job's coordinator.
        #[arg(long)]
        coordinator: Option<String>,
        #[arg(long)]
        name: String,
    },
    /// Update a running streaming job to a new pipeline, keeping its state (Dataflow's
    /// `--update`): its coordinator checks that the new pipeline can take the state, stops the
    /// job after a checkpoint and keeps that state as a snapshot; start the new pipeline from
    /// it with `run --from-snapshot`. An incompatible pipeline is refused and the job runs on.
    Update {
        #[command(flatten)]
        pipeline: PipelineArgs,
        /// `host:port` of the running job's coordinator.
        #[arg(long)]
        coordinator: String,
        /// Renamed transforms, as JSON `{"old name": "new name"}` (an empty new name drops
        /// that state), as Dataflow's transformNameMapping.
        #[arg(long, value_name = "JSON")]
        transform_name_mapping: Option<String>,
        /// Only check compatibility; stop nothing.
        #[arg(long)]
        check_only: bool,
    },
    /// Run a job's coordinator (one per job; what the operator's coordinator pod runs).
    Coordinator(cluster::CoordinatorArgs),
    /// The pod of a Beam SDK pipeline's DataflowJob (the operator's): reads the submitted job
    /// from object storage and runs it, its user code in the SDK container's worker pool.
    RunnerHarness(beam_k8s::runner::RunnerArgs),
    /// Run a worker that pulls work from a coordinator (what the operator's worker pods run).
    Worker(cluster::WorkerArgs),
    /// Run Python UDF batches for a worker over stdin/stdout (started by the worker itself).
    #[command(name = "udf-host", hide = true)]
    UdfHost,
    /// Show the fused stages the pipeline runs as.
    Plan {
        #[command(flatten)]
        pipeline: PipelineArgs,
        #[arg(long, value_enum, default_value_t = PlanFormat::Text)]
        format: PlanFormat,
    },
    /// Check a pipeline and report every error found (structure, then fields and types).
    Validate {
        #[command(flatten)]
        pipeline: PipelineArgs,
        /// Check only the structure; do not open the sources to check fields and types.
        #[arg(long)]
        structure_only: bool,
    },
    /// Autoscaling: replay load traces through the scaling policies.
    Autoscale {
        #[command(subcommand)]
        command: riverbank_autoscale::AutoscaleCommand,
    },
    /// Run Beam's job service: Beam SDK pipelines submitted with `--runner=PortableRunner
    /// --job_endpoint=HOST:PORT` run here, their user code on SDK harnesses (LOOPBACK, PROCESS
    /// or EXTERNAL environments).
    JobServer {
        /// The Job API's port (Beam's default).
        #[arg(long, default_value_t = 8099)]
        port: u16,
        /// The address the Job and Fn APIs listen on.
        #[arg(long, default_value = "127.0.0.1")]
        bind: std::net::IpAddr,
        /// The host SDK harnesses dial back (default: the bind address).
        #[arg(long)]
        advertise: Option<String>,
        /// SDK harnesses per environment when the pipeline does not set
        /// `--sdk_worker_parallelism` (default: the number of cores).
        #[arg(long)]
        sdk_workers: Option<usize>,
        /// Where the artifacts SDKs stage with their jobs are kept while the jobs run
        /// (default: a temporary directory, removed when the server stops).
        #[arg(long)]
        artifacts_dir: Option<std::path::PathBuf>,
        /// MiB of each job's materialized PCollections held in memory; past it they wait in a
        /// spill file, and a larger GroupByKey groups a hash partition of its keys at a time.
        #[arg(long, default_value_t = 1024)]
        memory_mb: usize,
        /// Start N Beam worker pools on this machine, a process each, as a DataflowJob's SDK
        /// worker pods: jobs with a DOCKER environment (the SDK's default) start their
        /// harnesses there, on RIVERBANK_BEAM_PYTHON's Python (else python3's), without Docker.
        #[arg(long, default_value_t = 0)]
        workers: usize,
        /// Run each job on the Kubernetes cluster this runs in, as a DataflowJob (the chart's
        /// job service), instead of in this process.
        #[command(flatten)]
        kubernetes: beam_k8s::launcher::KubernetesArgs,
    },
    /// Generate a synthetic data set.
    Generate {
        #[command(subcommand)]
        dataset: generate::Dataset,
    },
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum PlanFormat {
    Text,
    /// Dataflow-shaped stages (`executionPipelineStage`).
    Json,
    Dot,
    /// The serializable plan the coordinator and workers run (what the operator's ConfigMap
    /// holds, and what an update check takes).
    Plan,
}

/// glibc serves every allocation over 128 KiB (one Arrow column of a 64 K-row batch) with its own
/// mmap and hands freed heap back to the kernel eagerly, so each work item faulted its pages in
/// again: a fifth of the taxi job's CPU. Allocations up to 32 MiB stay on the heap, which is
/// trimmed only past 256 MiB free (taxi: 48 k → 9 k page faults, 0.20 → 0.17 s, RSS +7 MB).
/// One arena: the other threads' arenas are 64-MiB mmapped heaps, each deleted as soon as its
/// last chunk is freed, so a thread's encoded output and batches (megabytes each) faulted a
/// new heap in again and again (Nexmark Q0 at 3 M events: 101 k → 24 k page faults, 1.36 →
/// 1.05 s; Q4 paced for 90 s: peak RSS 3.6 → 2.6 GB). Small allocations stay in each thread's
/// cache, so the one arena's lock is taken by large ones only.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_malloc() {
    // SAFETY: mallopt only sets allocator parameters; called first thing, before any thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_malloc() {}

fn main() -> std::process::ExitCode {
    tune_malloc();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RIVERBANK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // No colour codes in files and pod logs.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
    match real_main(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main(cli: Cli) -> Result<()> {
    // A PyTransform's stage runs on Beam's Python SDK, whichever command compiles or runs it.
    python_sdk::install();
    match cli.command {
        Command::Plan { pipeline, format } if beam_sdk::is_python_pipeline(&pipeline) => {
            if format == PlanFormat::Plan {
                bail!(
                    "--format plan is the serializable plan of a Beam YAML pipeline; a Python pipeline's is shown as text, json or dot"
                );
            }
            for job in beam_sdk::plan_python(&pipeline)? {
                match format {
                    PlanFormat::Json => println!(
                        "{}",
                        serde_json::to_string_pretty(&job.plan.to_json(&job.name))?
                    ),
                    PlanFormat::Dot => print!("{}", job.plan.to_dot()),
                    _ => println!("{}:\n{}", job.name, job.plan),
                }
            }
            Ok(())
        }
        Command::Plan { pipeline, format } => {
            let plan = load(&pipeline)?;
            match format {
                PlanFormat::Text => {
                    print!("{}", display::to_text(&plan));
                    // Which path each python UDF takes is known once compiled (against the
                    // sources' schemas): only then are the sources opened.
                    if riverbank_udf::uses(&plan, Language::Python) {
                        let rt = runtime(1)?;
                        match rt.block_on(compile(plan.clone(), 1024)) {
                            Ok(c) => print!("{}", udf::paths(&c)),
                            Err(e) => println!("Python UDFs: not compiled ({e})"),
                        }
                    }
                }
                PlanFormat::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&display::to_json(&plan))?
                ),
                PlanFormat::Dot => print!("{}", display::to_dot(&plan)),
                PlanFormat::Plan => println!("{}", serde_json::to_string(&plan)?),
            }
            Ok(())
        }
        Command::Validate {
            pipeline,
            structure_only,
        } => {
            let plan = load(&pipeline)?;
            if !structure_only {
                let rt = runtime(1)?;
                rt.block_on(compile(plan.clone(), 1024)).map_err(explain)?;
            }
            println!(
                "{}: valid ({} transforms, {} stages)",
                pipeline.file.display(),
                plan.graph.transforms.len(),
                plan.stages.len()
            );
            Ok(())
        }
        Command::Run {
            pipeline,
            slots,
            memory_mb,
            max_memory_mb,
            ui,
            ui_port,
            ui_bind,
            spill_dir,
            no_progress,
            workers,
            shuffle_partitions,
            coalesce_partitions_mb,
            autoscale,
            max_workers,
            autoscale_time_scale,
            bundle_delay_ms,
            bundle_busy_ms,
            row_busy_us,
            long_work_item_secs,
            checkpoint_dir,
            checkpoint_interval,
            max_per_checkpoint,
            from_snapshot,
            transform_name_mapping,
        } => {
            if beam_sdk::is_python_pipeline(&pipeline) {
                if workers.is_some() || checkpoint_dir.is_some() || ui {
                    bail!(
                        "a Python pipeline runs on Riverbank's portable runner in this process: not with --workers, --checkpoint-dir or --ui"
                    );
                }
                let harnesses = slots.unwrap_or_else(|| {
                    std::thread::available_parallelism()
                        .map(|n| n.get())
                        .unwrap_or(2)
                });
                return beam_sdk::run_python(&pipeline, harnesses, memory_mb);
            }
            if let Some(beam) = beam_sdk::streaming_with_py_transform(&pipeline)? {
                if workers.is_some() || checkpoint_dir.is_some() {
                    bail!(
                        "a streaming pipeline with a PyTransform runs on Beam's Python SDK through Riverbank's portable runner, in this process: not with --workers or --checkpoint-dir"
                    );
                }
                return beam_sdk::run(beam, memory_mb);
            }
            let from_snapshot = match from_snapshot {
                None => None,
                Some(path) => Some(riverbank_streaming::driver::FromSnapshot {
                    path,
                    transform_name_mapping: match transform_name_mapping {
                        None => Default::default(),
                        Some(j) => serde_json::from_str(&j).context(
                            "--transform-name-mapping must be a JSON object of names to names",
                        )?,
                    },
                }),
            };
            let chaos = BundleChaos {
                inject_failures: 0,
                delay_ms: bundle_delay_ms,
                busy_ms: bundle_busy_ms,
                busy_us_per_row: row_busy_us,
            };
            let mut plan = load(&pipeline)?;
            // The option the coordinator reads (with --workers it gets the plan, not the flag).
            if let Some(secs) = checkpoint_interval {
                plan.options.checkpoint_interval_sec = Some(secs);
            }
            let ui = ui.then_some(ui::UiOptions {
                bind: ui_bind,
                port: ui_port,
            });
            // A stream's console is its coordinator's: with --ui and no --workers, it runs on
            // one worker process (an in-process stream has no coordinator to show).
            let workers = match (workers, &ui) {
                (None, Some(_)) if plan.is_streaming() => {
                    eprintln!("streaming with --ui: one worker process beside its coordinator");
                    Some(1)
                }
                (w, _) => w,
            };
            if let Some(n) = workers {
                return cluster::run_local_cluster(
                    plan,
                    cluster::LocalCluster {
                        workers: n.max(1),
                        slots,
                        memory_mb,
                        max_memory_mb,
                        shuffle_partitions,
                        coalesce_partitions_mb,
                        work_dir: spill_dir,
                        ui,
                        show_progress: !no_progress && std::io::stderr().is_terminal(),
                        autoscale: autoscale.then_some(cluster::LocalAutoscale {
                            max_workers,
                            time_scale: autoscale_time_scale,
                        }),
                        chaos,
                        insights: riverbank_autoscale::InsightConfig {
                            long_item_min_secs: long_work_item_secs,
                            ..Default::default()
                        },
                        checkpoint_dir,
                        max_per_checkpoint,
                        from_snapshot,
                    },
                );
            }
            let mut cfg = RunConfig::local(spill_dir.unwrap_or_else(std::env::temp_dir));
            if let Some(n) = slots {
                cfg.slots = n.max(1);
            }
            cfg.memory_limit = memory_mb.max(1) << 20;
            cfg.shuffle_partitions = shuffle_partitions.max(1);
            cfg.coalesce_bytes = coalesce_partitions_mb << 20;
            cfg.chaos = chaos;
            udf::enable_hosts(cfg.slots);
            udf::set_env_root(&cfg.spill_dir);
            python_sdk::set_scratch(&cfg.spill_dir, false);
            if plan.is_streaming() {
                return streaming::run(
                    plan,
                    cfg,
                    streaming::StreamingRun {
                        checkpoint_dir,
                        checkpoint_interval,
                        max_per_partition: max_per_checkpoint,
                        show_progress: !no_progress,
                        from_snapshot,
                    },
                );
            }
            let rt = runtime(cfg.slots)?;
            let show = !no_progress && std::io::stderr().is_terminal();
            rt.block_on(async move {
                let compiled = compile(plan, cfg.batch_size).await.map_err(explain)?;
                let metrics = Arc::new(Metrics::new(
                    compiled.plan.graph.transforms.len(),
                    compiled.plan.stages.len(),
                ));
                let names: Vec<String> = compiled.plan.stages.iter().map(|s| s.id()).collect();
                let local_ui = match &ui {
                    Some(o) => Some(ui::LocalUi::start(o, &compiled.plan).await?),
                    None => None,
                };
                let bar = show.then(|| progress::Live::start(metrics.clone(), names));
                let observer = local_ui.clone().map(ui::in_process_observer);
                let result = run_observed(compiled, cfg, metrics.clone(), observer).await;
                udf::stop_hosts();
                if let Some(b) = bar {
                    b.stop().await;
                }
                if let Some(u) = &local_ui {
                    u.finished(result.as_ref().err().map(|e| e.to_string()), 1);
                }
                let summary = result.map_err(explain)?;
                progress::print_summary(&summary, &metrics);
                Ok(())
            })
        }
        Command::Generate { dataset } => generate::run(dataset),
        Command::JobServer {
            port,
            bind,
            advertise,
            sdk_workers,
            artifacts_dir,
            memory_mb,
            workers,
            kubernetes,
        } => {
            if workers > 0 && kubernetes.is_on() {
                bail!(
                    "--workers runs jobs on this machine: it does not go with --kubernetes-namespace"
                );
            }
            // Jobs launched on Kubernetes run their harnesses in their own pods: the Fn API
            // here serves none, so it listens on loopback only.
            let fn_host = if kubernetes.is_on() {
                std::net::IpAddr::from([127, 0, 0, 1])
            } else {
                bind
            };
            let options = riverbank_portable::JobServerOptions {
                bind: (bind, port).into(),
                fn_bind: (fn_host, 0).into(),
                fn_advertise: advertise.unwrap_or_else(|| bind.to_string()),
                sdk_workers: sdk_workers.unwrap_or_else(|| {
                    std::thread::available_parallelism()
                        .map(|n| n.get())
                        .unwrap_or(2)
                }),
                artifacts_dir,
                plan_only: false,
                progress_every: std::time::Duration::from_secs(10),
                memory_mb,
                object_storage: Some(beam_k8s::stored::object_storage()),
                worker_pools: Vec::new(),
            };
            runtime(2)?.block_on(async {
                let mut options = options;
                let _pools = match workers {
                    0 => None,
                    n => {
                        let python = beam_sdk::python_with("apache_beam", "job-server --workers")?;
                        let (urls, pools) = local_pools::start(n, &python)?;
                        eprintln!("{n} Beam worker pools on {}", urls.join(", "));
                        options.worker_pools = urls;
                        Some(pools)
                    }
                };
                let server = match kubernetes.launcher().await? {
                    Some(launcher) => {
                        riverbank_portable::JobServer::start_launching(options, launcher).await?
                    }
                    None => riverbank_portable::JobServer::start(options).await?,
                };
                eprintln!(
                    "Beam job service on {} (--runner=PortableRunner --job_endpoint={})",
                    server.addr, server.addr
                );
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
                tokio::select! {
                    _ = server.wait() => Ok(()),
                    _ = tokio::signal::ctrl_c() => Ok(()),
                    _ = term.recv() => Ok(()),
                }
            })
        }
        Command::Snapshot {
            checkpoint_dir,
            coordinator,
            name,
        } => match (checkpoint_dir, coordinator) {
            (Some(dir), _) => streaming::snapshot(&dir, &name),
            (None, Some(address)) => streaming::snapshot_through(&address, &name),
            (None, None) => bail!("give --checkpoint-dir or --coordinator"),
        },
        Command::Update {
            pipeline,
            coordinator,
            transform_name_mapping,
            check_only,
        } => {
            let mapping = match transform_name_mapping {
                None => Default::default(),
                Some(j) => serde_json::from_str(&j)
                    .context("--transform-name-mapping must be a JSON object of names to names")?,
            };
            streaming::update(&coordinator, load(&pipeline)?, mapping, check_only)
        }
        Command::Coordinator(args) => cluster::coordinator(args),
        Command::RunnerHarness(args) => beam_k8s::runner::runner_harness(args),
        Command::Autoscale { command } => {
            print!("{}", riverbank_autoscale::run(command)?);
            Ok(())
        }
        Command::Worker(args) => cluster::worker(args),
        Command::UdfHost => udf::host(),
    }
}

pub(crate) fn runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(2))
        .enable_all()
        .build()
        .context("starting the runtime")
}

pub(crate) fn load(args: &PipelineArgs) -> Result<Plan> {
    if !args.sdk_args.is_empty() {
        bail!(
            "arguments after `--` are a Python pipeline's own; {} is read as Beam YAML",
            args.file.display()
        );
    }
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let vars = match &args.jinja_variables {
        None => serde_json::Map::new(),
        Some(s) => match serde_json::from_str(s) {
            Ok(serde_json::Value::Object(m)) => m,
            Ok(_) => bail!("--jinja-variables must be a JSON object"),
            Err(e) => bail!("--jinja-variables is not valid JSON: {e}"),
        },
    };
    let default_name = Path::new(&args.file)
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "job".into());
    riverbank_pipeline::load_plan(&text, &vars, &default_name)
        .map_err(|e: PipelineError| anyhow::anyhow!("{}: {e}", args.file.display()))
}

fn explain(e: RunError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arguments of a pod's container in the operator's snapshot of its StatefulSet.
    fn pod_args(file: &str) -> Vec<String> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../operator/tests/snapshots")
            .join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        text.lines()
            .skip_while(|l| !l.trim_start().starts_with("- args:"))
            .skip(1)
            .take_while(|l| l.trim_start().starts_with("- "))
            .map(|l| {
                l.trim_start()
                    .trim_start_matches("- ")
                    .trim_matches('\'')
                    .to_string()
            })
            .collect()
    }

    fn parse(args: &[String]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("riverbank".to_string()).chain(args.iter().cloned()))
    }

    /// The operator's pods run `riverbank coordinator …` / `riverbank worker …` (a Beam SDK
    /// job's `riverbank runner-harness …`) with the
    /// arguments in its snapshots: the binary parses every one of them, and the contract is
    /// real: without a required flag the same command line is refused.
    #[test]
    fn the_binary_parses_the_pod_commands_the_operator_writes() {
        for (file, sub, required) in [
            ("taxi-coordinator.yaml", "coordinator", &["--plan"][..]),
            (
                "taxi-workers.yaml",
                "worker",
                &["--coordinator", "--plan"][..],
            ),
            (
                "beam-sdk-runner.yaml",
                "runner-harness",
                &["--pipeline-location"][..],
            ),
        ] {
            let args = pod_args(file);
            assert_eq!(args.first().map(String::as_str), Some(sub), "{file}");
            let cli = parse(&args).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert!(
                matches!(
                    (&cli.command, sub),
                    (Command::Coordinator(_), "coordinator")
                        | (Command::Worker(_), "worker")
                        | (Command::RunnerHarness(_), "runner-harness")
                ),
                "{file}"
            );
            for flag in required {
                let i = args.iter().position(|a| a == flag).unwrap();
                let mut without = args.clone();
                without.drain(i..i + 2);
                let err = parse(&without)
                    .err()
                    .unwrap_or_else(|| panic!("{file} without {flag} parsed"));
                assert_eq!(
                    err.kind(),
                    clap::error::ErrorKind::MissingRequiredArgument,
                    "{file} without {flag}: {err}"
                );
            }
        }
    }
}
