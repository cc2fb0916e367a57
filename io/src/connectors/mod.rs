//! The unbounded connectors of the streaming runtime: Kafka (`kafka`) and NATS JetStream
//! (`nats`) sources read by offset ranges, and sinks that write an epoch's records exactly once;
//! `format` turns records into Arrow batches and back. The runtime drives them by epochs: it
//! asks a source for its partitions' ends, reads `[from, until)` ranges (the same range gives
//! the same records, so a replay is deterministic), and commits a sink's epoch, retrying the
//! same records after a failure. Offsets are Riverbank's own checkpoint (no consumer groups).
//!
//! `testing` (feature `test-brokers`, or the crate's own tests) starts real brokers.

pub mod format;
pub mod kafka;
pub mod nats;
mod sink_ids;
#[cfg(any(test, feature = "test-brokers"))]
pub mod testing;
#[cfg(test)]
mod tests;

use riverbank_pipeline::config::{ConnectorSinkConfig, ConnectorSourceConfig, Endpoint, StartAt};

pub use format::{BadRecord, Decoded, Decoder, Encoder, output_schema};

/// Where a job's connector sinks stage each checkpoint's rows before the commit writes them:
/// `{tempLocation}/{job}/staging`, else `.riverbank/{job}/staging` (local runs).
pub fn staging_root(plan: &riverbank_pipeline::Plan) -> String {
    format!(
        "{}/{}/staging",
        plan.options
            .temp_location
            .as_deref()
            .unwrap_or(".riverbank")
            .trim_end_matches('/'),
        plan.job_name
    )
}

/// One record of a partition, as a source read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    /// Kafka offset, or JetStream stream sequence.
    pub offset: u64,
    /// The record's timestamp (milliseconds since the epoch).
    pub timestamp_ms: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl LogRecord {
    /// Bytes the record takes, roughly as the broker stores it: what lag in bytes counts.
    pub fn size(&self) -> u64 {
        let h: usize = self.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        (self.key.as_ref().map_or(0, Vec::len) + self.value.as_ref().map_or(0, Vec::len) + h) as u64
    }
}

/// A record for a sink to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutRecord {
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
}

/// Where a partition stands at the start of an epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartitionEnds {
    pub partition: u32,
    /// The first offset still held (older ones were deleted by retention).
    pub earliest: u64,
    /// The next offset to be written: the lag of a checkpoint `c` is `end - c` records.
    pub end: u64,
    /// Mean stored bytes a record, for the lag in bytes (`lag_bytes`); `None` when the
    /// partition is empty and nothing was read from it yet.
    pub mean_record_bytes: Option<f64>,
    /// Whether `mean_record_bytes` is exact for the whole partition (NATS: the stream's byte
    /// count) or estimated from a sample of records (Kafka).
    pub bytes_exact: bool,
}

impl PartitionEnds {
    /// Records not read yet when the checkpoint is at `from`.
    pub fn lag(&self, from: u64) -> u64 {
        self.end.saturating_sub(from.max(self.earliest))
    }

    /// The lag in bytes: `lag(from)` times the mean record size.
    pub fn lag_bytes(&self, from: u64) -> u64 {
        (self.lag(from) as f64 * self.mean_record_bytes.unwrap_or(0.0)).round() as u64
    }

    /// The offset the first epoch starts from, without a checkpoint.
    pub fn start(&self, at: StartAt) -> u64 {
        match at {
            StartAt::Earliest => self.earliest,
            StartAt::Latest => self.end,
        }
    }
}

/// The runtime's view of a partition (a log never finishes).
/// Errors of the connectors; each names its topic or stream, and the partition and offset
/// where there is one.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    #[error("{what}: cannot connect to {servers}: {message}")]
    Connect {
        what: String,
        servers: String,
        message: String,
    },
    #[error("{what}: {message}")]
    Broker { what: String, message: String },
    #[error("{what} partition {partition} at offset {offset}: {message}")]
    Read {
        what: String,
        partition: u32,
        offset: u64,
        message: String,
    },
    #[error(
        "{what} partition {partition}: offsets [{from}, {until}) are outside [{earliest}, {end})"
    )]
    OutOfRange {
        what: String,
        partition: u32,
        from: u64,
        until: u64,
        earliest: u64,
        end: u64,
    },
    #[error("{what} epoch {epoch}: {message}")]
    Write {
        what: String,
        epoch: u64,
        message: String,
    },
    #[error("{transform}: {message}")]
    Format { transform: String, message: String },
    #[error("{0}")]
    Config(String),
}

/// An opened source of either system.
pub enum Source {
    Kafka(kafka::KafkaSource),
    Nats(Box<nats::NatsSource>),
}

impl Source {
    pub async fn open(cfg: &ConnectorSourceConfig) -> Result<Source, ConnectorError> {
        Ok(match &cfg.endpoint {
            Endpoint::Kafka { .. } => Source::Kafka(kafka::KafkaSource::open(&cfg.endpoint).await?),
            Endpoint::Nats { .. } => {
                Source::Nats(Box::new(nats::NatsSource::open(&cfg.endpoint).await?))
            }
        })
    }

    pub async fn partitions(&self) -> Result<Vec<PartitionEnds>, ConnectorError> {
        match self {
            Source::Kafka(s) => s.partitions().await,
            Source::Nats(s) => s.partitions().await,
        }
    }

    /// Exactly the records with offsets in `[from, until)`, in offset order.
    pub async fn read(
        &self,
        partition: u32,
        from: u64,
        until: u64,
    ) -> Result<Vec<LogRecord>, ConnectorError> {
        match self {
            Source::Kafka(s) => s.read(partition, from, until).await,
            Source::Nats(s) => s.read(partition, from, until).await,
        }
    }
}

/// An opened sink of either system.
pub enum Sink {
    Kafka(kafka::KafkaSink),
    Nats(Box<nats::NatsSink>),
}

impl Sink {
    pub async fn open(cfg: &ConnectorSinkConfig) -> Result<Sink, ConnectorError> {
        Ok(match &cfg.endpoint {
            Endpoint::Kafka { .. } => Sink::Kafka(kafka::KafkaSink::open(&cfg.endpoint).await?),
            Endpoint::Nats { .. } => {
                Sink::Nats(Box::new(nats::NatsSink::open(&cfg.endpoint).await?))
            }
        })
    }

    /// Writes epoch `epoch`'s records of job `job_id` exactly once: a retry of the same epoch
    /// with the same records (after a crash half-way, too) writes only what is missing.
    /// Returns how many records this call wrote.
    pub async fn write_epoch(
        &self,
        job_id: &str,
        epoch: u64,
        records: &[OutRecord],
    ) -> Result<usize, ConnectorError> {
        match self {
            Sink::Kafka(s) => s.write_epoch(job_id, epoch, records).await,
            Sink::Nats(s) => s.write_epoch(job_id, epoch, records).await,
        }
    }
}
