//! `riverbank-operator`: `run` reconciles DataflowJobs; `crd` prints the CRD.
use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use kube::Client;
use kube::runtime::events::Reporter;
use riverbank_operator::OperatorSettings;
use riverbank_operator::controller::{self, Context};
use riverbank_operator::coordinator_client::HttpCoordinator;
use riverbank_operator::crd::ImagePullPolicy;
use riverbank_operator::http::{self, HttpState, Routes};
use riverbank_operator::leader::{self, Leadership};
use riverbank_operator::metrics::Metrics;
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
    Run(RunArgs),
    /// Print the DataflowJob CustomResourceDefinition as YAML (what crds/dataflowjob.yaml holds).
    Crd,
}

#[derive(Args)]
struct RunArgs {
    /// Image of job pods when a job sets no spec.worker.image.
    #[arg(long, default_value_t = OperatorSettings::default().worker_image)]
    worker_image: String,
    /// Pull policy of job pods when a job sets no spec.worker.imagePullPolicy.
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
    /// Port of /healthz and /readyz.
    #[arg(long, default_value_t = 8081)]
    health_port: u16,
    /// Seconds between looks at an active job (its coordinator's progress).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    status_interval_seconds: u64,
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
                .block_on(run(args))
        }
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let settings = OperatorSettings {
        worker_image: args.worker_image.clone(),
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

    let client = Client::try_default()
        .await
        .context("no Kubernetes client configuration (in-cluster or kubeconfig)")?;
    let version = client
        .apiserver_version()
        .await
        .context("the API server is not reachable")?;
    tracing::info!(server = %version.git_version, "connected to the API server");
    state.ready.store(true, Ordering::Relaxed);

    // One stop signal for everything: SIGTERM/Ctrl+C, or leadership lost.
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    {
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("shutting down");
            let _ = stop_tx.send(true);
        });
    }

    let identity = args
        .leader_election_identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("riverbank-operator-{}", std::process::id()));
    let lost = Arc::new(AtomicBool::new(false));
    let leadership = match &args.leader_election_namespace {
        Some(namespace) => {
            let mut leadership = Leadership::start(
                client.clone(),
                namespace,
                &args.leader_election_lease,
                &identity,
            )
            .await?;
            tracing::info!(%identity, lease = %args.leader_election_lease, %namespace, "waiting to become the leader");
            let mut stopping = stop_rx.clone();
            tokio::select! {
                acquired = leadership.acquired() => acquired?,
                _ = stopping.wait_for(|stop| *stop) => {
                    leadership.release().await;
                    return Ok(());
                }
            }
            tracing::info!(%identity, "leading");
            let (lost, stop_tx, leading) = (lost.clone(), stop_tx.clone(), leadership.subscribe());
            tokio::spawn(async move {
                leader::lost(leading).await;
                lost.store(true, Ordering::Relaxed);
                let _ = stop_tx.send(true);
            });
            Some(leadership)
        }
        None => {
            tracing::warn!(
                "leader election is off (no --leader-election-namespace): run one replica only"
            );
            None
        }
    };
    metrics.set_leader(true);

    let reporter = Reporter {
        controller: controller::FIELD_MANAGER.into(),
        instance: Some(identity),
    };
    let coordinator = Arc::new(HttpCoordinator::new(Duration::from_secs(
        args.coordinator_timeout_seconds,
    )));
    let ctx = Arc::new(Context::new(
        client,
        reporter,
        settings,
        coordinator,
        metrics.clone(),
        Duration::from_secs(args.status_interval_seconds),
    ));
    controller::run(ctx, &args.namespaces, stop_rx).await;
    metrics.set_leader(false);
    if let Some(leadership) = leadership {
        leadership.release().await;
    }
    if lost.load(Ordering::Relaxed) {
        // Exit non-zero: Kubernetes restarts this replica as a standby.
        anyhow::bail!("lost the leader Lease; stopped reconciling");
    }
    Ok(())
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
