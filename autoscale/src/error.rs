//! Errors of the simulator and its CLI. The engine itself cannot fail: bad or missing metrics
//! become a "hold" decision with a reason, never an error.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum AutoscaleError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Trace {
        path: String,
        line: usize,
        message: String,
    },
    #[error("options in {path}: {message}")]
    Options { path: String, message: String },
    #[error("{0}")]
    Invalid(String),
}
