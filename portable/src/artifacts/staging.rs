//! The job server's `ArtifactStagingService`: Beam's reverse retrieval, where the client serves
//! its artifacts over a stream the server drives. For each environment the server sends a
//! `resolve_artifact` request with what the pipeline lists, then a `get_artifact` for each
//! replacement, whose bytes come back in chunks ended by `is_last`; embedded artifacts are kept
//! as they are. When the server has them all it ends its side, and the client's call returns.
use std::collections::HashMap;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use prost::Message;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use super::{ArtifactStore, Dependencies, file_artifact, staged_name};
use crate::job_api::artifact_request_wrapper::Request as Ask;
use crate::job_api::artifact_response_wrapper::Response as Answer;
use crate::job_api::artifact_staging_service_server::ArtifactStagingService;
use crate::job_api::{
    ArtifactRequestWrapper, ArtifactResponseWrapper, GetArtifactRequest, ResolveArtifactsRequest,
};
use crate::runner_api::ArtifactInformation;
use crate::urns;

/// The staging service over a job server's store.
#[derive(Clone)]
pub struct StagingService(pub Arc<ArtifactStore>);

type Asks = Pin<Box<dyn Stream<Item = Result<ArtifactRequestWrapper, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl ArtifactStagingService for StagingService {
    type ReverseArtifactRetrievalServiceStream = Asks;

    async fn reverse_artifact_retrieval_service(
        &self,
        request: Request<Streaming<ArtifactResponseWrapper>>,
    ) -> Result<Response<Asks>, Status> {
        let mut answers = request.into_inner();
        let token = answers
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("staging starts with the staging token"))?
            .staging_token;
        let (offered, dir) = self.0.begin(&token).map_err(Status::failed_precondition)?;
        let (asks, rx) = mpsc::channel(4);
        let store = self.0.clone();
        tokio::spawn(async move {
            let result = stage(&mut answers, &asks, &offered, &dir).await;
            match &result {
                Ok(staged) => tracing::info!(
                    job = %token,
                    artifacts = staged.values().map(Vec::len).sum::<usize>(),
                    "artifacts staged"
                ),
                Err(e) => {
                    tracing::warn!(job = %token, "staging failed: {e}");
                    let _ = asks.send(Err(Status::aborted(e.clone()))).await;
                }
            }
            store.finish(&token, result);
            // Dropping `asks` ends the server's side: the client's call returns.
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// Fetches every offered artifact into `dir`; the same artifact offered by two environments is
/// fetched once.
async fn stage(
    answers: &mut Streaming<ArtifactResponseWrapper>,
    asks: &mpsc::Sender<Result<ArtifactRequestWrapper, Status>>,
    offered: &Dependencies,
    dir: &Path,
) -> Result<Dependencies, String> {
    let mut staged = Dependencies::new();
    let mut fetched: HashMap<Vec<u8>, ArtifactInformation> = HashMap::new();
    for (environment, dependencies) in offered {
        if dependencies.is_empty() {
            continue;
        }
        ask(
            asks,
            Ask::ResolveArtifact(ResolveArtifactsRequest {
                artifacts: dependencies.clone(),
                preferred_urns: vec![urns::ARTIFACT_FILE.into(), urns::ARTIFACT_EMBEDDED.into()],
            }),
        )
        .await?;
        let replacements = match answer(answers).await?.response {
            Some(Answer::ResolveArtifactResponse(r)) => r.replacements,
            _ => {
                return Err(format!(
                    "environment '{environment}': the client did not answer the resolve request"
                ));
            }
        };
        let mut kept = Vec::with_capacity(replacements.len());
        for artifact in replacements {
            if artifact.type_urn == urns::ARTIFACT_EMBEDDED {
                kept.push(artifact);
                continue;
            }
            let key = artifact.encode_to_vec();
            if let Some(done) = fetched.get(&key) {
                kept.push(done.clone());
                continue;
            }
            let name = format!(
                "{:04}-{}",
                fetched.len(),
                staged_name(&artifact).unwrap_or_else(|| "artifact".into())
            );
            let path = dir.join(name);
            ask(
                asks,
                Ask::GetArtifact(GetArtifactRequest {
                    artifact: Some(artifact.clone()),
                }),
            )
            .await?;
            let sha256 = receive(answers, &path).await?;
            let file = file_artifact(&path, sha256, &artifact);
            fetched.insert(key, file.clone());
            kept.push(file);
        }
        staged.insert(environment.clone(), kept);
    }
    Ok(staged)
}

async fn ask(
    asks: &mpsc::Sender<Result<ArtifactRequestWrapper, Status>>,
    request: Ask,
) -> Result<(), String> {
    asks.send(Ok(ArtifactRequestWrapper {
        request: Some(request),
    }))
    .await
    .map_err(|_| "the client closed the staging stream".to_string())
}

async fn answer(
    answers: &mut Streaming<ArtifactResponseWrapper>,
) -> Result<ArtifactResponseWrapper, String> {
    match answers.message().await {
        Ok(Some(a)) => Ok(a),
        Ok(None) => Err("the client ended the staging stream before it was done".into()),
        Err(e) => Err(format!("the staging stream failed: {}", e.message())),
    }
}

/// Writes one artifact's chunks to `path`; returns the hex SHA-256 of its bytes.
async fn receive(
    answers: &mut Streaming<ArtifactResponseWrapper>,
    path: &Path,
) -> Result<String, String> {
    let failed = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir).await.map_err(failed)?;
    }
    let mut file = tokio::fs::File::create(path).await.map_err(failed)?;
    let mut hash = Sha256::new();
    loop {
        let a = answer(answers).await?;
        match a.response {
            Some(Answer::GetArtifactResponse(chunk)) => {
                hash.update(&chunk.data);
                file.write_all(&chunk.data).await.map_err(failed)?;
            }
            _ if a.is_last => {}
            _ => return Err("the client answered a get request with something else".into()),
        }
        if a.is_last {
            break;
        }
    }
    file.flush().await.map_err(failed)?;
    Ok(hex::encode(hash.finalize()))
}
