//! The distributed runtime: a coordinator process and worker processes running the work-item
//! engine (`riverbank_engine`) over HTTP. `protocol` is the coordinator's API, `coordinator` and
//! `worker` the two processes, `client` their HTTP clients, `wal` the coordinator's progress
//! log, `telemetry` their metrics. Both processes run the same engine as `riverbank run`:
//! the slot loop of `riverbank_engine::slot`, the tracker, the sink finish of
//! `riverbank_engine::finish`.
pub mod client;
pub mod coordinator;
pub mod protocol;
pub mod streaming;
pub mod telemetry;
pub mod wal;
pub mod worker;

use riverbank_engine::error::RunError;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{0}")]
    Run(#[from] RunError),
    #[error("cannot listen on {0}: {1}")]
    Bind(String, String),
    #[error("{0} is unreachable: {1}")]
    Unreachable(String, String),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("state in {path}: {message}")]
    State { path: String, message: String },
}

/// Serves `app` on `listener` in the background. TCP_NODELAY: replies are small and written in
/// pieces, and Nagle's algorithm with delayed ACKs would stall each one by ~40 ms.
pub(crate) fn spawn_server(listener: tokio::net::TcpListener, app: axum::Router) {
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("server stopped: {e}");
        }
    });
}

/// Serves the metrics and health routes also on their own ports, when given.
pub(crate) async fn serve_ops(
    listen: [Option<std::net::SocketAddr>; 2],
    ops: axum::Router,
) -> Result<(), ClusterError> {
    for addr in listen.into_iter().flatten() {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| ClusterError::Bind(addr.to_string(), e.to_string()))?;
        spawn_server(l, ops.clone());
    }
    Ok(())
}

/// Writes `address` to `path` atomically (readers never see half of it).
pub(crate) fn write_address(path: &std::path::Path, address: &str) -> Result<(), ClusterError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, address)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| ClusterError::State {
            path: path.display().to_string(),
            message: e.to_string(),
        })
}

/// SIGTERM and SIGINT, caught from creation on: a signal that arrives while nobody awaits
/// `recv` is kept for the next call instead of being lost (or, in PID 1, ignored).
pub(crate) struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    pub(crate) fn new() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Signals {
                term: signal(SignalKind::terminate()).ok(),
                int: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// Resolves at the next SIGTERM or SIGINT.
    pub(crate) async fn recv(&mut self) {
        #[cfg(unix)]
        {
            async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                _ = next(&mut self.term) => {}
                _ = next(&mut self.int) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
