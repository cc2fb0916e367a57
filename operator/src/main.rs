//! `riverbank-operator`: `run` reconciles DataflowJobs; `crd` prints the CRD.
use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use kube::Client;
use kube::runtime::events::Reporter;
use riverbank_operator::OperatorSettings;
use riverbank_operator::controller;
use riverbank_operator::coordinator_client::HttpCoordinator;
use riverbank_operator::crd::ImagePullPolicy;
use riverbank_operator::http::{self, HttpState, Routes};
use riverbank_operator::leader::{self, Leadership};
use riverbank_operator::metrics::Metrics;
use riverbank_operator::reconcile::{Context, FIELD_MANAGER};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::watch;

#[derive(Parser)]
#[command(
    name = "riverbank-operator",
    version,
    about = "The Riverbank Kubernetes operator (DataflowJob, riverbank.dev/v1alpha1)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Reconcile DataflowJobs: run their coordinator and workers, report their state.
    Run(Box<RunArgs>),
    /// Print the DataflowJob CustomResourceDefinition as YAML (what crds/dataflowjob.yaml holds).
    Crd,
}

#[derive(Args)]
struct RunArgs {
    /// Image of job pods when a job sets no spec.pods.image.
    #[arg(long, default_value_t = OperatorSettings::default().worker_image)]
    worker_image: String,
    /// Image of job pods whose pipeline has a PyTransform, when a job sets no spec.pods.image:
    /// the worker image with Beam's Python SDK.
    #[arg(long, default_value_t = OperatorSettings::default().beam_worker_image)]
    beam_worker_image: String,
    /// Pull policy of job pods when a job sets no spec.pods.imagePullPolicy.
    #[arg(long, default_value = "IfNotPresent", value_parser = ["Always", "IfNotPresent", "Never"])]
    worker_image_pull_policy: String,
    /// The cluster's DNS domain (pods reach the coordinator at <job>-coordinator-0.<job>-headless.<ns>.svc.<domain>).
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// Worker disk size in GB when a job sets no options.diskSizeGb (default: Dataflow's 250 batch / 400 streaming).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    default_disk_size_gb: Option<i32>,
    /// Reconcile DataflowJobs in these namespaces only (comma-separated); default: all.
    #[arg(long, value_delimiter = ',')]
    namespaces: Vec<String>,
    /// Namespace of the leader-election Lease (the operator's own). Without it, leader election
    /// is off: run a single replica.
    #[arg(long)]
    leader_election_namespace: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "riverbank-operator")]
    leader_election_lease: String,
    /// This replica's identity in the Lease (default: the pod's name).
    #[arg(long, env = "POD_NAME")]
    leader_election_identity: Option<String>,
    /// Port of the Prometheus /metrics endpoint.
    #[arg(long, default_value_t = 9090)]
    metrics_port: u16,
    /// Port of the read-only web console (job list, stage graphs, charts, insights); off
    /// without it.
    #[arg(long)]
    console_port: Option<u16>,
    /// Port of /healthz and /readyz.
    #[arg(long, default_value_t = 8081)]
    health_port: u16,
    /// A running job's status follows its coordinator (a long poll, about every second); changes
    /// of its numbers alone (throughput, backlog, progress) are written at most this often.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    status_interval_seconds: u64,
    /// Seconds a deleted, running job waits for its coordinator to confirm the cancel (which
    /// aborts its sinks' temporary files) before it is released anyway.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    cleanup_timeout_seconds: u64,
    /// Seconds a request to a coordinator may take.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    coordinator_timeout_seconds: u64,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => {
            print!("{}", riverbank_operator::crd_yaml());
            Ok(())
        }
        Command::Run(args) => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info".into()),
                )
                .init();
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(run(*args))
        }
    }
}

/// After the stop signal, in-flight reconciles get this long to finish (each is bounded by the
/// coordinator's long poll and request timeouts); then the operator exits anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Releasing the leader Lease is one API request; it must not hold the exit either.
const RELEASE_GRACE: Duration = Duration::from_secs(3);

/// Why the operator stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Signal,
    LostLease,
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    // First of all: the operator is PID 1 in its container, where a signal without a handler is
    // ignored, so SIGTERM must be handled from the very start (before the API server is reached).
    let mut signals = Signals::install()?;
    let (stop_tx, mut stop_rx) = watch::channel(None::<Stop>);
    let stop_tx = Arc::new(stop_tx);

    let settings = OperatorSettings {
        worker_image: args.worker_image.clone(),
        beam_worker_image: args.beam_worker_image.clone(),
        image_pull_policy: match args.worker_image_pull_policy.as_str() {
            "Always" => ImagePullPolicy::Always,
            "Never" => ImagePullPolicy::Never,
            _ => ImagePullPolicy::IfNotPresent,
        },
        cluster_domain: args.cluster_domain.clone(),
        default_disk_size_gb: args.default_disk_size_gb,
        ..OperatorSettings::default()
    };
    let metrics = Arc::new(Metrics::default());
    let state = Arc::new(HttpState {
        metrics: metrics.clone(),
        ready: AtomicBool::new(false),
    });
    let any = |port: u16| SocketAddr::from(([0, 0, 0, 0], port));
    tokio::spawn(http::serve(any(args.metrics_port), Routes::Metrics, state.clone()).await?);
    tokio::spawn(http::serve(any(args.health_port), Routes::Health, state.clone()).await?);
    {
        let (stop_tx, state) = (stop_tx.clone(), state.clone());
        tokio::spawn(async move {
            signals.recv().await;
            tracing::info!("shutting down");
            // Not ready: no new traffic while the last reconciles finish.
            state.ready.store(false, Ordering::Relaxed);
            stop_tx.send_replace(Some(Stop::Signal));
        });
    }

    let client = tokio::select! {
        client = connect() => client?,
        _ = stop_rx.wait_for(Option::is_some) => return Ok(()),
    };
    state.ready.store(true, Ordering::Relaxed);

    let identity = args
        .leader_election_identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("riverbank-operator-{}", std::process::id()));
    let (leadership, watching_lease) = match &args.leader_election_namespace {
        Some(namespace) => {
            let mut leadership = Leadership::start(
                client.clone(),
                namespace,
                &args.leader_election_lease,
                &identity,
            )
            .await?;
            tracing::info!(%identity, lease = %args.leader_election_lease, %namespace, "waiting to become the leader");
            tokio::select! {
                acquired = leadership.acquired() => acquired?,
                _ = stop_rx.wait_for(Option::is_some) => {
                    release(leadership).await;
                    return Ok(());
                }
            }
            tracing::info!(%identity, "leading");
            // Turns a lost Lease into the stop signal. It ends on either signal, dropping its
            // receiver of the Lease's state: the lease loop releases the Lease only once every
            // receiver is gone (a receiver kept for the process's life held the exit until the
            // kubelet's SIGKILL: 27 of the pod's 30-s grace period).
            let (leading, stop_tx, mut stopped) =
                (leadership.subscribe(), stop_tx.clone(), stop_rx.clone());
            let watching = tokio::spawn(async move {
                tokio::select! {
                    _ = leader::lost(leading) => {
                        stop_tx.send_replace(Some(Stop::LostLease));
                    }
                    _ = stopped.wait_for(Option::is_some) => {}
                }
            });
            (Some(leadership), Some(watching))
        }
        None => {
            tracing::warn!(
                "leader election is off (no --leader-election-namespace): run one replica only"
            );
            (None, None)
        }
    };
    metrics.set_leader(true);

    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some(identity),
    };
    let coordinator = Arc::new(HttpCoordinator::new(Duration::from_secs(
        args.coordinator_timeout_seconds,
    )));
    let mut ctx = Context::new(
        client,
        reporter,
        settings,
        coordinator,
        metrics.clone(),
        Duration::from_secs(args.status_interval_seconds),
    )
    .with_cleanup_timeout(Duration::from_secs(args.cleanup_timeout_seconds));
    if let Some(port) = args.console_port {
        let console = Arc::new(riverbank_console::Console::new());
        let (_, server) = riverbank_console::serve(any(port), console.clone()).await?;
        tokio::spawn(server);
        ctx.console = console;
    }
    let ctx = Arc::new(ctx);
    // The controller stops on a plain bool; `stop_rx` carries why.
    let (controller_stop_tx, controller_stop) = watch::channel(false);
    let mut why = stop_rx.clone();
    tokio::spawn(async move {
        let _ = why.wait_for(Option::is_some).await;
        controller_stop_tx.send_replace(true);
    });
    let controller = controller::run(ctx, &args.namespaces, controller_stop);
    tokio::pin!(controller);
    tokio::select! {
        _ = &mut controller => {}
        _ = async {
            let _ = stop_rx.wait_for(Option::is_some).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => tracing::warn!("reconciles still running {SHUTDOWN_GRACE:?} after the stop signal; exiting anyway"),
    }
    metrics.set_leader(false);
    if let Some(watching) = watching_lease {
        let _ = watching.await;
    }
    if let Some(leadership) = leadership {
        release(leadership).await;
    }
    let why = *stop_rx.borrow();
    if why == Some(Stop::LostLease) {
        // Exit non-zero: Kubernetes restarts this replica as a standby.
        anyhow::bail!("lost the leader Lease; stopped reconciling");
    }
    tracing::info!("stopped");
    Ok(())
}

async fn connect() -> anyhow::Result<Client> {
    let client = Client::try_default()
        .await
        .context("no Kubernetes client configuration (in-cluster or kubeconfig)")?;
    let version = client
        .apiserver_version()
        .await
        .context("the API server is not reachable")?;
    tracing::info!(server = %version.git_version, "connected to the API server");
    Ok(client)
}

/// Hands the Lease over (so a standby takes over at once), within [`RELEASE_GRACE`].
async fn release(leadership: Leadership) {
    if tokio::time::timeout(RELEASE_GRACE, leadership.release())
        .await
        .is_err()
    {
        tracing::warn!(
            "releasing the leader Lease took over {RELEASE_GRACE:?}; it expires on its own"
        );
    }
}

/// SIGTERM (the kubelet) and SIGINT (Ctrl+C), with handlers installed at once.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("installing a SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing a SIGINT handler")?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
