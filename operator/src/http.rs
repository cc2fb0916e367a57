//! The operator's two small HTTP listeners: Prometheus `/metrics` on the metrics port, and
//! `/healthz` (liveness) and `/readyz` (readiness) on the health port, as the chart's probes
//! and metrics Service expect. hyper's HTTP/1 server directly: it is already in the tree through
//! kube's client, and three GET routes need no framework.
use crate::metrics::Metrics;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::net::TcpListener;

/// What a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routes {
    Metrics,
    Health,
}

/// Shared with the rest of the operator: readiness is set once it reached the API server.
#[derive(Default)]
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    pub ready: AtomicBool,
}

/// Binds `addr` (fails now if the port is taken) and serves `routes` until the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    routes: Routes,
    state: Arc<HttpState>,
) -> std::io::Result<impl Future<Output = ()>> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(%addr, ?routes, "listening");
    Ok(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            };
            let state = state.clone();
            tokio::spawn(async move {
                let service =
                    service_fn(move |req| std::future::ready(handle(routes, &state, &req)));
                if let Err(e) = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            });
        }
    })
}

fn handle(
    routes: Routes,
    state: &HttpState,
    req: &Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let text = |status: StatusCode, content_type: &str, body: String| {
        Ok(Response::builder()
            .status(status)
            .header(hyper::header::CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(body)))
            .expect("static headers are valid"))
    };
    if req.method() != Method::GET {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    match (routes, req.uri().path()) {
        (Routes::Metrics, "/metrics") => text(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            state.metrics.encode(),
        ),
        (Routes::Health, "/healthz") => text(StatusCode::OK, "text/plain", "ok\n".into()),
        (Routes::Health, "/readyz") if state.ready.load(Ordering::Relaxed) => {
            text(StatusCode::OK, "text/plain", "ready\n".into())
        }
        (Routes::Health, "/readyz") => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready: the API server has not been reached yet\n".into(),
        ),
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Outcome;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).await.unwrap();
        out
    }

    async fn start(routes: Routes, state: Arc<HttpState>) -> SocketAddr {
        // Bind on an ephemeral port first to learn a free one, then serve there.
        let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let server = serve(addr, routes, state).await.unwrap();
        tokio::spawn(server);
        addr
    }

    #[tokio::test]
    async fn serves_metrics_and_health_on_their_own_ports() {
        let state = Arc::new(HttpState::default());
        state
            .metrics
            .reconciled(Outcome::Applied, std::time::Duration::from_millis(3));
        let metrics = start(Routes::Metrics, state.clone()).await;
        let health = start(Routes::Health, state.clone()).await;

        let m = get(metrics, "/metrics").await;
        assert!(m.starts_with("HTTP/1.1 200"), "{m}");
        assert!(m.contains("riverbank_operator_reconciles_total{outcome=\"applied\"} 1"));
        assert!(get(metrics, "/healthz").await.starts_with("HTTP/1.1 404"));

        assert!(get(health, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(health, "/readyz").await.starts_with("HTTP/1.1 503"));
        state.ready.store(true, Ordering::Relaxed);
        assert!(get(health, "/readyz").await.starts_with("HTTP/1.1 200"));
        assert!(get(health, "/metrics").await.starts_with("HTTP/1.1 404"));
    }
}
