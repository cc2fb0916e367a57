//! The one error type of the IO layer. Every variant names the location it is about,
//! because a pipeline author reading the message needs to know which file to look at.

use arrow::error::ArrowError;

/// Errors from file sources and sinks.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// The location string could not be understood or its store could not be built.
    #[error("invalid location {location:?}: {message}")]
    InvalidLocation { location: String, message: String },

    /// A read path (file, directory or glob) matched nothing.
    #[error("no files match {location}")]
    NoMatch { location: String },

    /// An object store operation failed.
    #[error("cannot {op} {location}: {source}")]
    Store {
        op: &'static str,
        location: String,
        #[source]
        source: object_store::Error,
    },

    /// A local filesystem operation that bypasses object_store failed.
    #[error("cannot {op} {location}: {source}")]
    Local {
        op: &'static str,
        location: String,
        #[source]
        source: std::io::Error,
    },

    /// A record could not be parsed; `position` says where (line or byte offset).
    #[error("bad {format} record at {location}{position}: {message}")]
    Parse {
        format: &'static str,
        location: String,
        position: String,
        message: String,
    },

    /// Schema inference failed, files disagree, or a batch does not fit the schema.
    #[error("schema problem in {location}: {message}")]
    Schema { location: String, message: String },

    /// A projected column does not exist.
    #[error("column {column:?} not found in {location} (columns: {available})")]
    MissingColumn {
        column: String,
        location: String,
        available: String,
    },

    /// Parquet encoding or decoding failed.
    #[error("parquet error in {location}: {source}")]
    Parquet {
        location: String,
        #[source]
        source: parquet::errors::ParquetError,
    },

    /// Arrow encoding (CSV/JSON writers) failed.
    #[error("cannot {op} {location}: {source}")]
    Arrow {
        op: &'static str,
        location: String,
        #[source]
        source: ArrowError,
    },

    /// `WriteToText` got rows that are not a single string.
    #[error(
        "WriteToText needs rows with one string field; got fields [{fields}] (writing {location})"
    )]
    TextSinkSchema { fields: String, location: String },

    /// Sink options that cannot be satisfied (e.g. no shard placeholder but many shards).
    #[error("invalid sink options for {location}: {message}")]
    SinkOptions { location: String, message: String },

    /// A commit found a shard that can no longer be written.
    #[error("cannot commit {location}: {detail}")]
    Commit { location: String, detail: String },

    /// A background reader task died (panicked or was cancelled).
    #[error("reader task for {location} failed: {message}")]
    Task { location: String, message: String },
}

impl IoError {
    /// Whether reading again may succeed: a file gone or not there yet (replaced while it was
    /// listed), a store's or the file system's failure, a Parquet file read while written. Not
    /// a bad record, schema or location, which another try reads the same.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            IoError::NoMatch { .. }
                | IoError::Store { .. }
                | IoError::Local { .. }
                | IoError::Parquet { .. }
        )
    }

    pub(crate) fn store(
        op: &'static str,
        location: impl Into<String>,
        source: object_store::Error,
    ) -> Self {
        IoError::Store {
            op,
            location: location.into(),
            source,
        }
    }

    pub(crate) fn local(
        op: &'static str,
        location: impl Into<String>,
        source: std::io::Error,
    ) -> Self {
        IoError::Local {
            op,
            location: location.into(),
            source,
        }
    }

    pub(crate) fn parquet(
        location: impl Into<String>,
        source: parquet::errors::ParquetError,
    ) -> Self {
        IoError::Parquet {
            location: location.into(),
            source,
        }
    }

    pub(crate) fn schema(location: impl Into<String>, message: impl Into<String>) -> Self {
        IoError::Schema {
            location: location.into(),
            message: message.into(),
        }
    }
}
