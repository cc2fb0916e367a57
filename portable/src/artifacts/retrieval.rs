//! The Fn API server's `ArtifactRetrievalService`: what Beam's container boot calls to fetch
//! its environment's dependencies before it starts the SDK. A harness (by its `worker_id`
//! header) gets the artifacts its provisioning lists and nothing else from this machine.
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio::io::AsyncReadExt;
use tonic::{Request, Response, Status};

use super::{Content, content};
use crate::fnapi::Workers;
use crate::job_api::artifact_retrieval_service_server::ArtifactRetrievalService;
use crate::job_api::{
    GetArtifactRequest, GetArtifactResponse, ResolveArtifactsRequest, ResolveArtifactsResponse,
};

/// Chunks of a file artifact on the wire (Beam's own servers send 2 MiB).
const CHUNK: usize = 2 << 20;

#[derive(Clone)]
pub struct RetrievalService(pub Arc<Workers>);

type Chunks = Pin<Box<dyn Stream<Item = Result<GetArtifactResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl ArtifactRetrievalService for RetrievalService {
    /// The job server has already made every dependency a file here (or embedded data).
    async fn resolve_artifacts(
        &self,
        request: Request<ResolveArtifactsRequest>,
    ) -> Result<Response<ResolveArtifactsResponse>, Status> {
        Ok(Response::new(ResolveArtifactsResponse {
            replacements: request.into_inner().artifacts,
        }))
    }

    type GetArtifactStream = Chunks;

    async fn get_artifact(
        &self,
        request: Request<GetArtifactRequest>,
    ) -> Result<Response<Chunks>, Status> {
        let worker = crate::fnapi::worker_id(&request)?;
        let artifact = request
            .into_inner()
            .artifact
            .ok_or_else(|| Status::invalid_argument("GetArtifact names no artifact"))?;
        if !self.0.provides(&worker, &artifact) {
            return Err(Status::permission_denied(format!(
                "worker '{worker}' was not provisioned with that artifact"
            )));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        match content(&artifact).map_err(Status::unimplemented)? {
            Content::Embedded(data) => {
                let _ = tx.send(Ok(GetArtifactResponse { data })).await;
            }
            Content::File(path) => {
                let mut file = tokio::fs::File::open(&path)
                    .await
                    .map_err(|e| Status::not_found(format!("{}: {e}", path.display())))?;
                tokio::spawn(async move {
                    loop {
                        let mut data = Vec::with_capacity(CHUNK);
                        match (&mut file).take(CHUNK as u64).read_to_end(&mut data).await {
                            Ok(0) => return,
                            Ok(_) => {
                                if tx.send(Ok(GetArtifactResponse { data })).await.is_err() {
                                    return;
                                }
                            }
                            Err(e) => {
                                let status = Status::internal(format!("{}: {e}", path.display()));
                                let _ = tx.send(Err(status)).await;
                                return;
                            }
                        }
                    }
                });
            }
        }
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use futures::StreamExt;

    use super::*;
    use crate::fn_api::ProvisionInfo;
    use crate::runner_api::ArtifactInformation;

    fn request(worker: &str, artifact: &ArtifactInformation) -> Request<GetArtifactRequest> {
        let mut r = Request::new(GetArtifactRequest {
            artifact: Some(artifact.clone()),
        });
        r.metadata_mut()
            .insert("worker_id", worker.parse().unwrap());
        r
    }

    #[tokio::test]
    async fn a_harness_gets_its_own_dependencies_in_chunks_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..(CHUNK + 10)).map(|i| (i % 251) as u8).collect();
        let path = dir.path().join("deps.tar.gz");
        std::fs::write(&path, &bytes).unwrap();
        let like = ArtifactInformation::default();
        let own = super::super::file_artifact(&path, String::new(), &like);
        let secret = super::super::file_artifact(Path::new("/etc/hostname"), String::new(), &like);
        let workers = Arc::new(Workers::default());
        workers.set_provision(
            "w1",
            ProvisionInfo {
                dependencies: vec![own.clone()],
                ..Default::default()
            },
        );
        let service = RetrievalService(workers);

        let chunks: Vec<Vec<u8>> = service
            .get_artifact(request("w1", &own))
            .await
            .unwrap()
            .into_inner()
            .map(|c| c.unwrap().data)
            .collect()
            .await;
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks.concat(), bytes);

        let refused = service.get_artifact(request("w1", &secret)).await;
        assert_eq!(refused.err().unwrap().code(), tonic::Code::PermissionDenied);
        let stranger = service.get_artifact(request("w2", &own)).await;
        assert_eq!(
            stranger.err().unwrap().code(),
            tonic::Code::PermissionDenied
        );
    }
}
