//! What every reconcile shares (clients, settings, the operator's memory of each job) and the
//! reconcile's errors.
use crate::children::labels;
use crate::coordinator_client::Coordinator;
use crate::crd::DataflowJob;
use crate::metrics::Metrics;
use crate::scaling::{Autoscalers, Clock, MonotonicClock};
use crate::settings::OperatorSettings;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("the DataflowJob has no metadata.{0}")]
    MissingMetadata(&'static str),
    /// A streaming job's coordinator did not take a control request (update check, stop).
    #[error("the coordinator: {0}")]
    Coordinator(String),
    #[error("{0}")]
    Stale(String),
}

impl Error {
    /// The `error` label of the errors metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "kube",
            Error::MissingMetadata(_) => "metadata",
            Error::Coordinator(_) => "coordinator",
            Error::Stale(_) => "stale",
        }
    }
}

/// The pods of the watched namespaces, as reflectors keep them (one per controller scope).
#[derive(Default)]
pub struct PodStores(Mutex<Vec<(Option<String>, Store<Pod>)>>);

impl PodStores {
    /// Registers the store of the pods in `namespace` (None: all namespaces).
    pub fn register(&self, namespace: Option<String>, store: Store<Pod>) {
        self.0
            .lock()
            .expect("not poisoned")
            .push((namespace, store));
    }

    /// The pods of job `name` in `namespace`, by name.
    pub fn of_job(&self, namespace: &str, name: &str) -> Vec<Arc<Pod>> {
        let stores = self.0.lock().expect("not poisoned");
        let Some((_, store)) = stores
            .iter()
            .find(|(ns, _)| ns.as_deref() == Some(namespace))
            .or_else(|| stores.iter().find(|(ns, _)| ns.is_none()))
        else {
            return vec![];
        };
        let mut pods: Vec<Arc<Pod>> = store
            .state()
            .into_iter()
            .filter(|p| {
                p.namespace().as_deref() == Some(namespace)
                    && p.labels().get(labels::JOB).map(String::as_str) == Some(name)
            })
            .collect();
        pods.sort_by_key(|p| p.name_any());
        pods
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub settings: OperatorSettings,
    pub coordinator: Arc<dyn Coordinator>,
    pub metrics: Arc<Metrics>,
    /// Changes of a running job's numbers alone (throughput, backlog, progress, the
    /// coordinator's message) are written to status at most this often; transitions at once.
    pub status_interval: Duration,
    /// How long a deleted, active job waits for its coordinator to confirm the cancel before
    /// it is released anyway (counted from its deletionTimestamp).
    pub cleanup_timeout: Duration,
    /// The jobs' pods, from the controllers' reflectors.
    pub pods: PodStores,
    /// Consecutive failures per job, for the retry backoff.
    pub(crate) failures: Mutex<HashMap<String, u32>>,
    /// When each job's status was last written, to space out writes of numbers alone.
    pub(crate) written: Mutex<HashMap<String, Instant>>,
    /// Each autoscaled job's window of observations and engine state.
    pub autoscalers: Autoscalers,
    /// The autoscaler's time.
    pub(crate) clock: Arc<dyn Clock>,
    /// The web console's jobs (served when the operator has a console port).
    pub console: Arc<riverbank_console::Console>,
}

impl Context {
    pub fn new(
        client: Client,
        reporter: Reporter,
        settings: OperatorSettings,
        coordinator: Arc<dyn Coordinator>,
        metrics: Arc<Metrics>,
        status_interval: Duration,
    ) -> Self {
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            settings,
            coordinator,
            metrics,
            status_interval,
            cleanup_timeout: Duration::from_secs(30),
            pods: PodStores::default(),
            failures: Mutex::default(),
            written: Mutex::default(),
            autoscalers: Autoscalers::default(),
            clock: Arc::new(MonotonicClock::default()),
            console: Arc::default(),
        }
    }

    /// Replaces the autoscaler's clock (tests move time by hand).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn with_cleanup_timeout(mut self, timeout: Duration) -> Self {
        self.cleanup_timeout = timeout;
        self
    }
}

/// `namespace/name`, as logs, the backoff and the status write spacing know a job.
pub fn key(job: &DataflowJob) -> String {
    format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any())
}
