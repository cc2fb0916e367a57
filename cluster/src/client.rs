//! Talking to the coordinator and to other workers over HTTP.
use super::ClusterError;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use futures::FutureExt;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use riverbank_engine::shuffle::{Fetch, ShuffleRef, decode, read_local, read_range};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The coordinator's API. Requests are retried while the coordinator is unreachable (it may be
/// restarting) for up to `patience`.
#[derive(Clone)]
pub struct CoordinatorClient {
    http: reqwest::Client,
    base: String,
    patience: Duration,
    /// Per request, when shorter than the client's 30 s (see [`CoordinatorClient::with_timeout`]).
    timeout: Option<Duration>,
}

impl CoordinatorClient {
    pub fn new(address: &str, patience: Duration) -> Self {
        let base = if address.starts_with("http://") || address.starts_with("https://") {
            address.trim_end_matches('/').to_string()
        } else {
            format!("http://{address}")
        };
        let builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(30))
            // Plain HTTP inside the cluster: loading the system's CA store would only cost
            // start-up time (a hundred and fifty files, in every worker).
            .tls_built_in_root_certs(!base.starts_with("http://"));
        CoordinatorClient {
            http: builder.build().unwrap_or_default(),
            base,
            patience,
            timeout: None,
        }
    }

    /// Gives up on a request after `t`: for a caller that must go on with other duties while
    /// the coordinator does not answer (the launcher restarts it), since a connection to a
    /// listening socket whose coordinator died waits in its backlog rather than failing.
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClusterError> {
        self.call(path, None::<&()>).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClusterError> {
        self.call(path, Some(body)).await
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClusterError> {
        let url = format!("{}{path}", self.base);
        let body = match body {
            Some(b) => {
                Some(serde_json::to_vec(b).map_err(|e| ClusterError::Protocol(e.to_string()))?)
            }
            None => None,
        };
        let deadline = Instant::now() + self.patience;
        // Starts short: a worker started beside its coordinator connects within milliseconds of
        // it listening (a refused loopback connection costs nothing to retry).
        let mut backoff = Duration::from_millis(2);
        loop {
            let mut req = match &body {
                Some(b) => self
                    .http
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(b.clone()),
                None => self.http.get(&url),
            };
            if let Some(t) = self.timeout {
                req = req.timeout(t);
            }
            let err = match req.send().await {
                Ok(resp) if resp.status().is_success() => {
                    let bytes = resp
                        .bytes()
                        .await
                        .map_err(|e| ClusterError::Unreachable(url.clone(), e.to_string()))?;
                    return serde_json::from_slice(&bytes)
                        .map_err(|e| ClusterError::Protocol(format!("{url}: {e}")));
                }
                Ok(resp) if resp.status().is_client_error() => {
                    let status = resp.status();
                    let text = resp.text().await.unwrap_or_default();
                    return Err(ClusterError::Protocol(format!("{url}: {status}: {text}")));
                }
                Ok(resp) => format!("{}", resp.status()),
                // With its causes: reqwest's own text does not say why (a name that does not
                // resolve, a refused connection).
                Err(e) => error_chain(&e),
            };
            if Instant::now() >= deadline {
                return Err(ClusterError::Unreachable(url, err));
            }
            tracing::debug!(%url, "coordinator unreachable, retrying: {err}");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }
}

/// How long a shuffle fetch keeps trying a worker it cannot reach (its name does not resolve
/// yet, it is restarting on its disk, it does not answer) before the file counts as lost and
/// its producer is recomputed: `riverbank worker --fetch-patience-secs`.
pub const FETCH_PATIENCE: Duration = Duration::from_secs(15);

/// Reads shuffle files: its own from disk, other workers' over HTTP.
pub struct RemoteFetch {
    pub http: reqwest::Client,
    /// This worker's advertised address: files there are read from `root` directly.
    pub own_address: String,
    pub root: PathBuf,
    /// See [`FETCH_PATIENCE`].
    pub patience: Duration,
}

impl RemoteFetch {
    fn is_local(&self, file: &ShuffleRef) -> bool {
        file.address.is_empty() || file.address == self.own_address
    }

    fn url(file: &ShuffleRef) -> String {
        format!(
            "http://{}/v1/shuffle/{}/{}/{}",
            file.address, file.offset, file.len, file.path
        )
    }
}

/// An error with its causes (reqwest's own message leaves out the DNS or connect error).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// GETs a shuffle range from another worker. A worker that cannot be reached, or answers with
/// a server error, is tried again with a growing backoff for up to `patience`; an answer that
/// the file is not there (the worker lost its disk) is final at once.
async fn get_shuffle(
    http: reqwest::Client,
    url: String,
    patience: Duration,
) -> Result<reqwest::Response, String> {
    let started = Instant::now();
    let mut backoff = Duration::from_millis(100);
    let mut tries = 0u32;
    loop {
        tries += 1;
        let err = match http.get(&url).send().await {
            Ok(r) if r.status().is_success() => return Ok(r),
            Ok(r) if !r.status().is_server_error() => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                return Err(format!("{url}: {status} {text}"));
            }
            Ok(r) => format!("{}", r.status()),
            Err(e) => error_chain(&e),
        };
        let waited = started.elapsed();
        if waited + backoff > patience {
            return Err(format!(
                "{url}: {err} ({tries} tries over {:.1} s)",
                waited.as_secs_f64()
            ));
        }
        tracing::debug!(%url, tries, "a worker's shuffle file is unreachable, retrying: {err}");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

impl Fetch for RemoteFetch {
    fn read(&self, file: &ShuffleRef) -> BoxFuture<'static, Result<Bytes, String>> {
        if self.is_local(file) {
            return read_range(self.root.join(&file.path), file.offset, file.len).boxed();
        }
        let url = Self::url(file);
        let req = get_shuffle(self.http.clone(), url.clone(), self.patience);
        async move {
            let r = req.await?;
            r.bytes()
                .await
                .map_err(|e| format!("{url}: {}", error_chain(&e)))
        }
        .boxed()
    }

    fn open(&self, file: &ShuffleRef) -> BoxStream<'static, Result<RecordBatch, String>> {
        if self.is_local(file) {
            return read_local(self.root.join(&file.path), file.offset, file.len);
        }
        let url = Self::url(file);
        let req = get_shuffle(self.http.clone(), url, self.patience);
        futures::stream::once(async move {
            match req.await {
                Ok(r) => decode(r.bytes_stream().boxed()).boxed(),
                Err(msg) => futures::stream::once(async move { Err(msg) }).boxed(),
            }
        })
        .flatten()
        .boxed()
    }
}
