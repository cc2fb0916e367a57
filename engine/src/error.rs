//! Runtime errors. A failure names the transform, the cause and, where there is one, the record.
use crate::combine::CombineError;
use riverbank_io::IoError;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A transform failed on data.
    #[error("transform '{transform}' failed: {message}{}", record.as_ref().map(|r| format!("\n  offending record: {r}")).unwrap_or_default())]
    Transform {
        transform: String,
        message: String,
        record: Option<String>,
    },
    /// A bundle kept failing: the job fails, as Dataflow's batch jobs do after 4 attempts.
    #[error(
        "a bundle of stage {stage} failed {attempts} times; giving up.\n  last error: {source}"
    )]
    BundleRetriesExhausted {
        stage: String,
        attempts: u32,
        source: Box<RunError>,
    },
    /// The pipeline does not fit the data (field names, types, expressions).
    #[error("{}", format_plan_errors(.0))]
    Plan(Vec<riverbank_pipeline::Issue>),
    #[error("{0}")]
    Io(#[from] IoError),
    #[error("transform '{transform}': {source}")]
    Combine {
        transform: String,
        source: CombineError,
    },
    #[error("AssertEqual '{transform}' failed: {message}")]
    Assertion { transform: String, message: String },
    /// Shuffle input written by another item could not be read (its worker is gone): the
    /// producer is recomputed and the reader retried; never fatal by itself.
    #[error("shuffle data of work item {producer} at '{address}' is unreachable: {message}")]
    ShuffleLost {
        producer: u64,
        address: String,
        message: String,
    },
    /// The attempt was stopped (the job failed or was cancelled, or the lease was lost).
    #[error("cancelled")]
    Cancelled,
    /// A streaming state shard could not be opened, restored, read or checkpointed.
    #[error("transform '{transform}': state: {source}")]
    State {
        transform: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<riverbank_io::unbounded::SourceError> for RunError {
    fn from(e: riverbank_io::unbounded::SourceError) -> Self {
        RunError::Transform {
            transform: e.transform,
            message: e.message,
            record: e.record,
        }
    }
}

impl RunError {
    pub fn transform(transform: &str, message: impl Into<String>) -> Self {
        RunError::Transform {
            transform: transform.to_string(),
            message: message.into(),
            record: None,
        }
    }
}

fn format_plan_errors(issues: &[riverbank_pipeline::Issue]) -> String {
    let mut s = format!(
        "pipeline does not fit its data ({} error{}):",
        issues.len(),
        if issues.len() == 1 { "" } else { "s" }
    );
    for i in issues {
        s.push_str("\n  - ");
        s.push_str(&i.to_string());
    }
    s
}

pub type Result<T, E = RunError> = std::result::Result<T, E>;
