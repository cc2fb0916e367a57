//! The gRPC services harnesses call. Each stream is tied to the harness named by its
//! `worker_id` header; a closed control stream means the harness is gone.
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use futures::{Stream, StreamExt};
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::server::Router;
use tonic::{Request, Response, Status, Streaming};

use super::{Incoming, Worker, Workers};
use crate::fn_api::beam_fn_control_server::{BeamFnControl, BeamFnControlServer};
use crate::fn_api::beam_fn_data_server::{BeamFnData, BeamFnDataServer};
use crate::fn_api::beam_fn_logging_server::{BeamFnLogging, BeamFnLoggingServer};
use crate::fn_api::beam_fn_state_server::{BeamFnState, BeamFnStateServer};
use crate::fn_api::provision_service_server::{ProvisionService, ProvisionServiceServer};
use crate::fn_api::{
    Elements, GetProcessBundleDescriptorRequest, GetProvisionInfoRequest, GetProvisionInfoResponse,
    InstructionRequest, InstructionResponse, LogControl, LogEntry, ProcessBundleDescriptor,
    StateRequest, StateResponse, log_entry,
};

use crate::artifacts::retrieval::RetrievalService;
use crate::job_api::artifact_retrieval_service_server::ArtifactRetrievalServiceServer;

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

pub(super) fn router(mut server: tonic::transport::Server, workers: Arc<Workers>) -> Router {
    let svc = Services(workers);
    // Bundles and side inputs can be large; the harness decides its own message sizes.
    server
        .add_service(
            BeamFnControlServer::new(svc.clone())
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX),
        )
        .add_service(
            BeamFnDataServer::new(svc.clone())
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX),
        )
        .add_service(
            BeamFnStateServer::new(svc.clone())
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX),
        )
        .add_service(BeamFnLoggingServer::new(svc.clone()).max_decoding_message_size(usize::MAX))
        .add_service(ProvisionServiceServer::new(svc.clone()))
        .add_service(ArtifactRetrievalServiceServer::new(RetrievalService(svc.0)))
}

#[derive(Clone)]
struct Services(Arc<Workers>);

pub(crate) fn worker_id<T>(request: &Request<T>) -> Result<String, Status> {
    request
        .metadata()
        .get("worker_id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .ok_or_else(|| Status::invalid_argument("the Fn API needs a worker_id header"))
}

#[tonic::async_trait]
impl BeamFnControl for Services {
    type ControlStream = Boxed<InstructionRequest>;

    async fn control(
        &self,
        request: Request<Streaming<InstructionResponse>>,
    ) -> Result<Response<Self::ControlStream>, Status> {
        let id = worker_id(&request)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let worker = Arc::new(Worker {
            id: id.clone(),
            control: tx,
            data: Default::default(),
            data_ready: Notify::new(),
            pending: Default::default(),
            routes: Default::default(),
            alive: AtomicBool::new(true),
        });
        if let Some(old) = self
            .0
            .workers
            .lock()
            .expect("workers")
            .insert(id.clone(), worker.clone())
        {
            old.lost();
        }
        self.0.arrived.notify_waiters();
        tracing::debug!(worker = %id, "SDK harness connected");
        let mut responses = request.into_inner();
        let workers = self.0.clone();
        tokio::spawn(async move {
            while let Some(Ok(response)) = responses.next().await {
                let waiter = worker
                    .pending
                    .lock()
                    .expect("pending")
                    .remove(&response.instruction_id);
                if let Some(waiter) = waiter {
                    let _ = waiter.send(response);
                }
            }
            tracing::debug!(worker = %worker.id, "SDK harness disconnected");
            worker.lost();
            let mut all = workers.workers.lock().expect("workers");
            if all.get(&worker.id).is_some_and(|w| Arc::ptr_eq(w, &worker)) {
                all.remove(&worker.id);
            }
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }

    async fn get_process_bundle_descriptor(
        &self,
        request: Request<GetProcessBundleDescriptorRequest>,
    ) -> Result<Response<ProcessBundleDescriptor>, Status> {
        let id = request.into_inner().process_bundle_descriptor_id;
        let found = self
            .0
            .descriptors
            .lock()
            .expect("descriptors")
            .get(&id)
            .cloned();
        found
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("no process bundle descriptor '{id}'")))
    }
}

#[tonic::async_trait]
impl BeamFnData for Services {
    type DataStream = Boxed<Elements>;

    async fn data(
        &self,
        request: Request<Streaming<Elements>>,
    ) -> Result<Response<Self::DataStream>, Status> {
        let id = worker_id(&request)?;
        let worker = self.0.get(&id).ok_or_else(|| {
            Status::failed_precondition(format!("harness '{id}' has no control stream"))
        })?;
        let (tx, rx) = mpsc::unbounded_channel();
        *worker.data.lock().expect("data") = Some(tx);
        worker.data_ready.notify_waiters();
        let mut incoming = request.into_inner();
        tokio::spawn(async move {
            while let Some(Ok(elements)) = incoming.next().await {
                let routes = worker.routes.lock().expect("routes");
                let data = elements
                    .data
                    .into_iter()
                    .map(|d| (d.instruction_id.clone(), Incoming::Data(d)));
                let timers = elements
                    .timers
                    .into_iter()
                    .map(|t| (t.instruction_id.clone(), Incoming::Timers(t)));
                for (instruction, item) in data.chain(timers) {
                    match routes.get(&instruction) {
                        Some(route) => {
                            let _ = route.send(item);
                        }
                        None => tracing::warn!(%instruction, "data for a bundle no longer running"),
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }
}

#[tonic::async_trait]
impl BeamFnState for Services {
    type StateStream = Boxed<StateResponse>;

    async fn state(
        &self,
        request: Request<Streaming<StateRequest>>,
    ) -> Result<Response<Self::StateStream>, Status> {
        let mut incoming = request.into_inner();
        let workers = self.0.clone();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(Ok(req)) = incoming.next().await {
                let store = workers
                    .states
                    .lock()
                    .expect("states")
                    .get(&req.instruction_id)
                    .cloned();
                let response = match store {
                    Some(store) => store.answer(&req),
                    None => StateResponse {
                        id: req.id.clone(),
                        error: format!("no bundle '{}' is running", req.instruction_id),
                        response: None,
                    },
                };
                if tx.send(Ok(response)).is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }
}

#[tonic::async_trait]
impl BeamFnLogging for Services {
    type LoggingStream = Boxed<LogControl>;

    async fn logging(
        &self,
        request: Request<Streaming<crate::fn_api::log_entry::List>>,
    ) -> Result<Response<Self::LoggingStream>, Status> {
        let worker = worker_id(&request).unwrap_or_default();
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::unbounded_channel::<Result<LogControl, Status>>();
        tokio::spawn(async move {
            let _open = tx; // the response stream ends when the harness stops logging
            while let Some(Ok(list)) = incoming.next().await {
                for entry in list.log_entries {
                    log(&worker, &entry);
                }
            }
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }
}

fn log(worker: &str, entry: &LogEntry) {
    use log_entry::severity::Enum as S;
    let severity = S::try_from(entry.severity).unwrap_or(S::Info);
    let at = &entry.log_location;
    match severity {
        S::Critical | S::Error => {
            tracing::error!(target: "sdk", worker, at, "{}{}", entry.message, trace(entry))
        }
        S::Warn => tracing::warn!(target: "sdk", worker, at, "{}", entry.message),
        S::Notice | S::Info => tracing::info!(target: "sdk", worker, at, "{}", entry.message),
        _ => tracing::debug!(target: "sdk", worker, at, "{}", entry.message),
    }
}

fn trace(entry: &LogEntry) -> String {
    if entry.trace.is_empty() {
        String::new()
    } else {
        format!("\n{}", entry.trace)
    }
}

#[tonic::async_trait]
impl ProvisionService for Services {
    async fn get_provision_info(
        &self,
        request: Request<GetProvisionInfoRequest>,
    ) -> Result<Response<GetProvisionInfoResponse>, Status> {
        let id = worker_id(&request)?;
        let info = self
            .0
            .provision
            .lock()
            .expect("provision")
            .get(&id)
            .cloned();
        let info =
            info.ok_or_else(|| Status::not_found(format!("no provisioning for worker '{id}'")))?;
        Ok(Response::new(GetProvisionInfoResponse { info: Some(info) }))
    }
}
