//! What can go wrong between a submitted pipeline and its end.
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PortableError {
    /// The pipeline proto asks for something Riverbank cannot run; names the transform.
    #[error("transform '{transform}': {reason}")]
    Unsupported { transform: String, reason: String },
    /// The pipeline proto is not well formed (a dangling reference, an undecodable payload).
    #[error("malformed pipeline: {0}")]
    Malformed(String),
    /// Bytes on the data plane or in state do not decode with the coder that names them.
    #[error("coder {coder}: {reason}")]
    Coding { coder: String, reason: String },
    /// An SDK harness could not be started or reached.
    #[error("SDK harness: {0}")]
    Harness(String),
    /// A bundle failed on every attempt; the SDK's own message is kept.
    #[error("stage '{stage}' failed after {attempts} attempts: {message}")]
    Bundle {
        stage: String,
        attempts: usize,
        message: String,
    },
    /// The job's materialized data could not be written to, or read from, its spill file.
    #[error("spilling to disk: {0}")]
    Spill(String),
    /// The job's artifacts could not be staged, or given to a harness.
    #[error("artifacts: {0}")]
    Artifacts(String),
    /// A streaming job's checkpoint could not be written or read, or is another pipeline's.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A job submitted with `--update` cannot take the running job's place; says why.
    #[error("--update: {0}")]
    Update(String),
    #[error("the job was cancelled")]
    Cancelled,
}

impl PortableError {
    pub fn unsupported(transform: impl Into<String>, reason: impl Into<String>) -> Self {
        PortableError::Unsupported {
            transform: transform.into(),
            reason: reason.into(),
        }
    }
}
