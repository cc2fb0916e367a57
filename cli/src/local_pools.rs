//! `riverbank job-server --workers N`: N Beam worker pools on this machine, each a process of
//! its own, as the SDK worker pods of a DataflowJob run them (Beam's `worker_pool_main`, which
//! the SDK container starts with `--worker_pool`). A job's DOCKER environment (what an SDK
//! submits when given no `--environment_type`) starts its harnesses in them, without Docker:
//! they run the user's code on the Python that runs the pools. A pool that exits is started
//! again on its port, as a pod is; the pools end with the job server.
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::process::Command;

/// The pools' supervisors; dropping them kills the pools.
pub struct LocalPools {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for LocalPools {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// How long a pool that exited waits before it is started again.
const RESTART_AFTER: Duration = Duration::from_secs(1);

/// Starts `n` worker pools run by `python` (a Python with apache-beam) on free loopback ports;
/// their addresses, for the job server's [`riverbank_portable::JobServerOptions::worker_pools`].
pub fn start(n: usize, python: &Path) -> Result<(Vec<String>, LocalPools)> {
    let mut urls = Vec::with_capacity(n);
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port for a worker pool")?
            .port();
        urls.push(format!("127.0.0.1:{port}"));
        tasks.push(tokio::spawn(supervise(i, port, python.to_path_buf())));
    }
    Ok((urls, LocalPools { tasks }))
}

/// Runs pool `i` on `port`, again each time it exits.
async fn supervise(i: usize, port: u16, python: PathBuf) {
    loop {
        match pool(port, &python).spawn() {
            Ok(mut child) => match child.wait().await {
                Ok(status) => tracing::warn!(
                    pool = i,
                    port,
                    "worker pool exited ({status}); starting it again"
                ),
                Err(e) => tracing::warn!(pool = i, port, "worker pool: {e}; starting it again"),
            },
            Err(e) => tracing::error!(
                pool = i,
                port,
                "cannot start a worker pool with {}: {e}",
                python.display()
            ),
        }
        tokio::time::sleep(RESTART_AFTER).await;
    }
}

/// Beam's worker pool on `port`. It starts each harness as `python` from its PATH: `python`'s
/// own directory goes first there (a virtualenv's `bin`).
fn pool(port: u16, python: &Path) -> Command {
    let mut command = Command::new(python);
    command
        .args([
            "-m",
            "apache_beam.runners.worker.worker_pool_main",
            &format!("--service_port={port}"),
            "--worker_pool",
        ])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    // SAFETY: between fork and exec only prctl(2), which is async-signal-safe: a pool does not
    // outlive the job server, however that ends (SIGKILL included).
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    if let Some(bin) = python.parent().filter(|b| !b.as_os_str().is_empty()) {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let joined = std::env::join_paths(
            std::iter::once(bin.to_path_buf()).chain(std::env::split_paths(&path)),
        );
        if let Ok(joined) = joined {
            command.env("PATH", joined);
        }
    }
    command
}
