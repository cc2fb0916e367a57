//! The address a process listens on, from `--bind` and a port (IPv4 or IPv6).
use anyhow::{Context, Result};
use std::net::SocketAddr;

pub(crate) fn addr(bind: &str, port: u16) -> Result<SocketAddr> {
    format!("{bind}:{port}")
        .parse()
        .or_else(|_| format!("[{bind}]:{port}").parse())
        .with_context(|| format!("--bind {bind} is not an IP address"))
}
