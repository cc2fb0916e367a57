//! Talking to a job's coordinator: `GET /v1/status` (its `JobProgress`; with `?wait_ms=N` a long
//! poll that answers as soon as something changes, at most 5 s later) and `POST /v1/cancel`;
//! for streaming jobs `POST /v1/job/{drain,snapshot,update-check,stop}`; for a Beam SDK job's
//! runner `POST /v1/sdk-workers` (the SDK worker pods it may use).
//!
//! Behind the [`Coordinator`] trait so the reconciler's tests substitute a fake. The real client
//! is plain HTTP/1 over the cluster network with hyper-util's pooled client: hyper and hyper-util
//! are already in the operator through kube's client, so this adds no crate (reqwest would add
//! its own stack for two requests). The coordinator is in-cluster and unauthenticated by design
//! (headless Service, pod DNS), so there is no TLS here.
use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use riverbank_pipeline::progress::JobProgress;
use riverbank_pipeline::{SnapshotRequest, SnapshotTaken, StopRequest, UpdateCheck, UpdateVerdict};
use serde::de::DeserializeOwned;
use std::time::Duration;

/// Largest status document accepted (it lists workers and stages; a few hundred KB at most).
const MAX_BODY_BYTES: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error("the coordinator at {address} is not reachable: {reason}")]
    Unreachable { address: String, reason: String },
    #[error("the coordinator at {address} did not answer within {seconds} s")]
    Timeout { address: String, seconds: u64 },
    #[error("the coordinator at {address} answered {status} to {path}: {body}")]
    Status {
        address: String,
        path: String,
        status: u16,
        body: String,
    },
    #[error("the coordinator at {address} sent an answer that is not the JSON expected: {source}")]
    Decode {
        address: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The longest wait the coordinator grants a long poll.
pub const MAX_WAIT: Duration = Duration::from_secs(5);

/// What the reconciler asks of a job's coordinator. `address` is `host:port`.
pub trait Coordinator: Send + Sync + 'static {
    /// The job's progress (`GET /v1/status`). With `wait`, a long poll (`?wait_ms=`): the answer
    /// comes when the job changes (an item finished, the job ended) or after `wait` (at most
    /// [`MAX_WAIT`]), so a watcher sees a transition at once without polling fast.
    fn status<'a>(
        &'a self,
        address: &'a str,
        wait: Option<Duration>,
    ) -> BoxFuture<'a, Result<JobProgress, CoordinatorError>>;
    /// Stop the job now and abort its sinks (`POST /v1/cancel`).
    fn cancel<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<(), CoordinatorError>>;
    /// Streaming: stop reading, fire every window, commit, end (`POST /v1/job/drain`).
    fn drain<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<(), CoordinatorError>>;
    /// Streaming: keep the last completed checkpoint as snapshot `name` (`POST /v1/job/snapshot`).
    fn snapshot<'a>(
        &'a self,
        address: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<SnapshotTaken, CoordinatorError>>;
    /// Streaming: could this plan continue the job with its state (`POST /v1/job/update-check`)?
    fn update_check<'a>(
        &'a self,
        address: &'a str,
        check: &'a UpdateCheck,
    ) -> BoxFuture<'a, Result<UpdateVerdict, CoordinatorError>>;
    /// Streaming: finish the checkpoint under way, snapshot the state as `snapshot`, end
    /// (`POST /v1/job/stop`): the first step of an update.
    fn stop<'a>(
        &'a self,
        address: &'a str,
        snapshot: &'a str,
    ) -> BoxFuture<'a, Result<(), CoordinatorError>>;
    /// A Beam SDK job's runner: the worker pools of the SDK worker pods it may use now, as
    /// they are scaled (`POST /v1/sdk-workers`).
    fn sdk_workers<'a>(
        &'a self,
        address: &'a str,
        pools: &'a [String],
    ) -> BoxFuture<'a, Result<(), CoordinatorError>>;
}

/// The coordinator over HTTP.
pub struct HttpCoordinator {
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl HttpCoordinator {
    /// `timeout` bounds each request, connection included: a reconcile must not hang on a
    /// coordinator that is starting or gone.
    pub fn new(timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        HttpCoordinator { client, timeout }
    }

    /// One request; `extra` is how long the coordinator may hold it (a long poll) on top of
    /// the timeout.
    async fn call(
        &self,
        address: &str,
        method: Method,
        path: String,
        body: Option<Vec<u8>>,
        extra: Duration,
    ) -> Result<Bytes, CoordinatorError> {
        let unreachable = |reason: String| CoordinatorError::Unreachable {
            address: address.to_string(),
            reason,
        };
        let request = Request::builder()
            .method(method)
            .uri(format!("http://{address}{path}"))
            .header(hyper::header::ACCEPT, "application/json")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| unreachable(e.to_string()))?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| unreachable(error_chain(&e)))?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
                .collect()
                .await
                .map_err(|e| unreachable(e.to_string()))?
                .to_bytes();
            Ok::<_, CoordinatorError>((status, body))
        };
        let limit = self.timeout + extra;
        let (status, body) = tokio::time::timeout(limit, exchange).await.map_err(|_| {
            CoordinatorError::Timeout {
                address: address.to_string(),
                seconds: limit.as_secs(),
            }
        })??;
        if status != StatusCode::OK && status != StatusCode::ACCEPTED {
            let mut text = String::from_utf8_lossy(&body).into_owned();
            text.truncate(200);
            return Err(CoordinatorError::Status {
                address: address.to_string(),
                path,
                status: status.as_u16(),
                body: text,
            });
        }
        Ok(body)
    }
}

/// hyper-util's error says only "client error (Connect)"; the cause (DNS, refused) is below.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

impl Coordinator for HttpCoordinator {
    fn status<'a>(
        &'a self,
        address: &'a str,
        wait: Option<Duration>,
    ) -> BoxFuture<'a, Result<JobProgress, CoordinatorError>> {
        Box::pin(async move {
            let wait = wait.map(|w| w.min(MAX_WAIT)).filter(|w| !w.is_zero());
            let (path, extra) = match wait {
                Some(w) => (format!("/v1/status?wait_ms={}", w.as_millis()), w),
                None => ("/v1/status".to_string(), Duration::ZERO),
            };
            let body = self.call(address, Method::GET, path, None, extra).await?;
            serde_json::from_slice(&body).map_err(|source| CoordinatorError::Decode {
                address: address.to_string(),
                source,
            })
        })
    }

    fn cancel<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<(), CoordinatorError>> {
        Box::pin(async move {
            self.call(
                address,
                Method::POST,
                "/v1/cancel".into(),
                None,
                Duration::ZERO,
            )
            .await?;
            Ok(())
        })
    }

    fn sdk_workers<'a>(
        &'a self,
        address: &'a str,
        pools: &'a [String],
    ) -> BoxFuture<'a, Result<(), CoordinatorError>> {
        Box::pin(async move {
            let body = serde_json::json!({ "pools": pools });
            self.post::<_, serde_json::Value>(address, "/v1/sdk-workers", &body, Duration::ZERO)
                .await?;
            Ok(())
        })
    }

    fn drain<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<(), CoordinatorError>> {
        Box::pin(async move {
            self.call(
                address,
                Method::POST,
                "/v1/job/drain".into(),
                None,
                Duration::ZERO,
            )
            .await?;
            Ok(())
        })
    }

    fn snapshot<'a>(
        &'a self,
        address: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<SnapshotTaken, CoordinatorError>> {
        Box::pin(async move {
            let request = SnapshotRequest { name: name.into() };
            // Copying a large state takes a while: up to a minute more than a status request.
            self.post(
                address,
                "/v1/job/snapshot",
                &request,
                Duration::from_secs(60),
            )
            .await
        })
    }

    fn update_check<'a>(
        &'a self,
        address: &'a str,
        check: &'a UpdateCheck,
    ) -> BoxFuture<'a, Result<UpdateVerdict, CoordinatorError>> {
        Box::pin(async move {
            // The coordinator compiles the plan against its data (schemas, brokers).
            self.post(
                address,
                "/v1/job/update-check",
                check,
                Duration::from_secs(30),
            )
            .await
        })
    }

    fn stop<'a>(
        &'a self,
        address: &'a str,
        snapshot: &'a str,
    ) -> BoxFuture<'a, Result<(), CoordinatorError>> {
        Box::pin(async move {
            let request = StopRequest {
                snapshot: snapshot.into(),
            };
            let _: JobProgress = self
                .post(address, "/v1/job/stop", &request, Duration::ZERO)
                .await?;
            Ok(())
        })
    }
}

impl HttpCoordinator {
    async fn post<B: serde::Serialize, T: DeserializeOwned>(
        &self,
        address: &str,
        path: &str,
        body: &B,
        extra: Duration,
    ) -> Result<T, CoordinatorError> {
        let json = serde_json::to_vec(body).map_err(|source| CoordinatorError::Decode {
            address: address.to_string(),
            source,
        })?;
        let answer = self
            .call(address, Method::POST, path.into(), Some(json), extra)
            .await?;
        serde_json::from_slice(&answer).map_err(|source| CoordinatorError::Decode {
            address: address.to_string(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;
    use hyper::body::Incoming;
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use std::sync::{Arc, Mutex};
    use tokio::net::TcpListener;

    const PROGRESS: &str = r#"{"jobName":"nyc-taxi","phase":"Running","message":"2 of 3 stages",
        "workItemsTotal":10,"workItemsDone":4,"workItemsRunning":2,"fractionConsumed":0.4,
        "remainingBytes":600,"throughputBytesPerSec":100.0,"throughputElementsPerSec":25.0,
        "backlogSeconds":6.0}"#;

    /// A coordinator on loopback that records the requests it gets.
    async fn fake_coordinator(
        status: u16,
        body: &'static str,
    ) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(vec![]));
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let log = log.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        log.lock()
                            .unwrap()
                            .push(format!("{} {}", req.method(), req.uri()));
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .status(status)
                                    .body(Full::new(Bytes::from_static(body.as_bytes())))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (address, seen)
    }

    #[tokio::test]
    async fn reads_progress_and_cancels() {
        let (address, seen) = fake_coordinator(200, PROGRESS).await;
        let client = HttpCoordinator::new(Duration::from_secs(2));
        let progress = client.status(&address, None).await.unwrap();
        assert_eq!(progress.job_name, "nyc-taxi");
        assert_eq!(progress.backlog_seconds, Some(6.0));
        client
            .status(&address, Some(Duration::from_millis(2500)))
            .await
            .unwrap();
        // The coordinator grants at most 5 s; asking for more asks for 5 s.
        client
            .status(&address, Some(Duration::from_secs(60)))
            .await
            .unwrap();
        client.cancel(&address).await.unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "GET /v1/status",
                "GET /v1/status?wait_ms=2500",
                "GET /v1/status?wait_ms=5000",
                "POST /v1/cancel"
            ]
        );
    }

    #[tokio::test]
    async fn reports_bad_answers_and_unreachable_coordinators() {
        let (address, _) = fake_coordinator(503, "starting").await;
        let client = HttpCoordinator::new(Duration::from_secs(2));
        let err = client.status(&address, None).await.unwrap_err();
        assert!(
            matches!(&err, CoordinatorError::Status { status: 503, body, .. } if body == "starting"),
            "{err}"
        );

        let (address, _) = fake_coordinator(200, "{\"phase\":").await;
        let err = client.status(&address, None).await.unwrap_err();
        assert!(matches!(err, CoordinatorError::Decode { .. }), "{err}");

        // A port nothing listens on: refused, reported with its cause.
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = closed.local_addr().unwrap().to_string();
        drop(closed);
        let err = client.status(&address, None).await.unwrap_err();
        assert!(
            matches!(&err, CoordinatorError::Unreachable { reason, .. } if reason.contains("refused")),
            "{err}"
        );
    }
}
