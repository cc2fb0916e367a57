//! The console's HTTP side: the page and its assets (built into the binary), and the JSON the
//! page polls. GET only; it serves what feeders put in the [`Console`], nothing else.
use crate::store::Console;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use std::net::SocketAddr;
use std::sync::Arc;

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");

/// The console's routes: `/` and `/jobs/{namespace}/{name}` (the page), its script and style,
/// `/api/jobs` and `/api/jobs/{namespace}/{name}`.
pub fn router(console: Arc<Console>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/jobs/{namespace}/{name}", get(page))
        .route("/console.js", get(script))
        .route("/console.css", get(style))
        .route("/api/jobs", get(jobs))
        .route("/api/jobs/{namespace}/{name}", get(job))
        .with_state(console)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn page() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

async fn jobs(State(c): State<Arc<Console>>) -> Response {
    Json(c.list()).into_response()
}

async fn job(
    State(c): State<Arc<Console>>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    match c.job(&namespace, &name) {
        Some(d) => Json(d).into_response(),
        None => (StatusCode::NOT_FOUND, "no such job\n").into_response(),
    }
}

/// Binds `addr` now (an error if the port is taken) and returns the bound address (for port 0)
/// and the server, to spawn.
pub async fn serve(
    addr: SocketAddr,
    console: Arc<Console>,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()> + Send + 'static)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tracing::info!(addr = %bound, "console listening");
    let app = router(console);
    Ok((bound, async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "the console stopped");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Observation;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_the_page_its_assets_and_the_jobs_as_json() {
        let c = Arc::new(Console::new());
        c.observe(
            "ns",
            "taxi",
            Observation {
                state: "Running".into(),
                ..Default::default()
            },
        );
        let (addr, server) = serve("127.0.0.1:0".parse().unwrap(), c).await.unwrap();
        tokio::spawn(server);
        let page = get(addr, "/jobs/ns/taxi").await;
        assert!(page.starts_with("HTTP/1.1 200"), "{page}");
        assert!(page.contains("<script src=\"/console.js\""), "{page}");
        assert!(get(addr, "/console.js").await.contains("function "));
        let list = get(addr, "/api/jobs").await;
        assert!(list.contains("\"name\":\"taxi\"") && list.contains("\"state\":\"Running\""));
        assert!(get(addr, "/api/jobs/ns/taxi").await.contains("\"graph\""));
        assert!(
            get(addr, "/api/jobs/ns/nope")
                .await
                .starts_with("HTTP/1.1 404")
        );
        let post = {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"POST /api/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        assert!(post.starts_with("HTTP/1.1 405"), "read-only: {post}");
    }
}
