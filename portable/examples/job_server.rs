//! A job server on its own, for trying the runner without the `riverbank` binary:
//! `cargo run -p riverbank-portable --example job_server -- 8099`.
use riverbank_portable::{JobServer, JobServerOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let port: u16 = std::env::args()
        .nth(1)
        .map(|p| p.parse())
        .transpose()?
        .unwrap_or(8099);
    let server = JobServer::start(JobServerOptions {
        bind: ([127, 0, 0, 1], port).into(),
        fn_bind: ([127, 0, 0, 1], 0).into(),
        fn_advertise: "127.0.0.1".into(),
        sdk_workers: 1,
        artifacts_dir: None,
        plan_only: false,
        progress_every: std::time::Duration::from_secs(10),
        memory_mb: 1024,
        object_storage: None,
        worker_pools: Vec::new(),
    })
    .await?;
    println!("listening on {}", server.addr);
    server.wait().await;
    Ok(())
}
