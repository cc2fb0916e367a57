//! The runner's side of Beam's Fn API: one gRPC server (control, data, state, logging,
//! provisioning) that every SDK harness of a job dials. Harnesses are told apart by the
//! `worker_id` header each sends; [`Workers`] holds their streams, and [`bundle`] runs one
//! bundle on one harness.
pub mod bundle;
pub mod environment;
mod python_harness;
mod services;

pub(crate) use services::worker_id;
pub mod state;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc, oneshot};
use tonic::transport::Server;

use crate::error::PortableError;
use crate::fn_api::{
    Elements, InstructionRequest, InstructionResponse, ProcessBundleDescriptor, ProvisionInfo,
    elements,
};

pub use bundle::{BundleFailure, BundleInputs, BundleOutput, OutputSink, TimerFamily};
pub use state::{BundleState, SideInputStore, UserState};

/// What a harness sends for a bundle on the data plane.
pub(crate) enum Incoming {
    Data(elements::Data),
    Timers(elements::Timers),
}

/// One connected SDK harness.
pub struct Worker {
    pub id: String,
    control: mpsc::UnboundedSender<Result<InstructionRequest, tonic::Status>>,
    data: Mutex<Option<mpsc::UnboundedSender<Result<Elements, tonic::Status>>>>,
    data_ready: Notify,
    pending: Mutex<HashMap<String, oneshot::Sender<InstructionResponse>>>,
    routes: Mutex<HashMap<String, mpsc::UnboundedSender<Incoming>>>,
    alive: AtomicBool,
}

impl Worker {
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    fn lost(&self) {
        self.alive.store(false, Ordering::SeqCst);
        // Dropping the waiters tells every bundle in flight that its harness is gone.
        self.pending.lock().expect("pending").clear();
        self.routes.lock().expect("routes").clear();
        self.data_ready.notify_waiters();
    }
}

/// Every harness of the server, and what they ask the runner for.
#[derive(Default)]
pub struct Workers {
    workers: Mutex<HashMap<String, Arc<Worker>>>,
    arrived: Notify,
    descriptors: Mutex<HashMap<String, ProcessBundleDescriptor>>,
    states: Mutex<HashMap<String, BundleState>>,
    provision: Mutex<HashMap<String, ProvisionInfo>>,
    next_instruction: AtomicU64,
}

impl Workers {
    pub fn get(&self, id: &str) -> Option<Arc<Worker>> {
        self.workers.lock().expect("workers").get(id).cloned()
    }

    /// Waits until harness `id` has opened its control stream, or `timeout` passes.
    pub async fn wait_for(&self, id: &str, timeout: std::time::Duration) -> Option<Arc<Worker>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let arrived = self.arrived.notified();
            if let Some(w) = self.get(id).filter(|w| w.is_alive()) {
                return Some(w);
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return None;
            }
        }
    }

    pub fn register_descriptor(&self, descriptor: ProcessBundleDescriptor) {
        self.descriptors
            .lock()
            .expect("descriptors")
            .insert(descriptor.id.clone(), descriptor);
    }

    pub fn set_provision(&self, worker_id: &str, info: ProvisionInfo) {
        self.provision
            .lock()
            .expect("provision")
            .insert(worker_id.to_string(), info);
    }

    /// Whether harness `worker_id` was provisioned with `artifact` (all it may retrieve).
    pub fn provides(
        &self,
        worker_id: &str,
        artifact: &crate::runner_api::ArtifactInformation,
    ) -> bool {
        self.provision
            .lock()
            .expect("provision")
            .get(worker_id)
            .is_some_and(|info| info.dependencies.contains(artifact))
    }

    /// A new instruction id (a bundle's, or a split request's).
    pub fn new_instruction(&self) -> String {
        format!(
            "bundle-{}",
            self.next_instruction.fetch_add(1, Ordering::Relaxed)
        )
    }
}

/// The Fn API server of one job service: harnesses reach it at [`FnServer::url`].
pub struct FnServer {
    pub url: String,
    pub workers: Arc<Workers>,
    stop: Option<oneshot::Sender<()>>,
}

impl FnServer {
    /// Listens on `bind` (port 0 picks one); harnesses are told to dial `advertise:port`.
    pub async fn start(bind: SocketAddr, advertise: &str) -> Result<FnServer, PortableError> {
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .map_err(|e| PortableError::Harness(format!("cannot listen on {bind}: {e}")))?;
        let port = listener
            .local_addr()
            .map_err(|e| PortableError::Harness(e.to_string()))?
            .port();
        let workers = Arc::new(Workers::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let router = services::router(Server::builder(), workers.clone());
        let incoming = no_delay(listener);
        tokio::spawn(async move {
            if let Err(e) = router
                .serve_with_incoming_shutdown(incoming, async {
                    stopped.await.ok();
                })
                .await
            {
                tracing::error!("Fn API server stopped: {e}");
            }
        });
        Ok(FnServer {
            url: format!("{advertise}:{port}"),
            workers,
            stop: Some(stop),
        })
    }
}

/// Accepted connections without Nagle's delay: the Fn and Job APIs are request-response
/// protocols of small messages, where waiting to fill a packet costs a round trip each time.
pub(crate) fn no_delay(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use futures::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|s| {
        let s = s?;
        s.set_nodelay(true)?;
        Ok(s)
    })
}

impl Drop for FnServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
