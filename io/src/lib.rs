//! Riverbank's sources and sinks. Files over `object_store`, backing the Beam YAML transforms
//! `ReadFrom{Csv,Json,Parquet,Text}` and `WriteTo{Csv,Json,Parquet,Text}` (this module);
//! the Kafka and NATS connectors (`connectors`); and the unbounded sources a streaming job
//! reads by partition and offset (`unbounded`: the generators and the connectors).
//!
//! Locations are local paths (relative or absolute), `file://`, `s3://`, `gs://`,
//! `az://`/`abfs://` (credentials from the environment only) and `memory://` (an
//! in-process store, for tests). See [`location`].
//!
//! Reading is two-phase so the coordinator can fan work out: [`plan_source`] lists
//! files, fixes the schema and cuts [`Split`]s; [`read_split`] turns one split into
//! a stream of record batches, on any worker.
//!
//! Writing follows Beam's sharded, atomic file sinks: each worker partition writes
//! a temp part with a [`SinkWriter`]; [`commit_sink`] moves parts into their final
//! `{prefix}-SSSSS-of-NNNNN{suffix}` names once the whole stage has succeeded, and
//! [`abort_sink`] throws them away.

pub mod connectors;
mod error;
pub mod location;
mod parquet_io;
mod sink;
mod source;
pub mod unbounded;

pub use error::IoError;
pub use location::{LocatedFile, list_files, match_files};
pub use sink::{
    DEFAULT_SHARD_TEMPLATE, SinkWriter, TempPart, WriteOptions, abort_sink, cleanup_temp,
    commit_sink, commit_sink_set, has_shard_placeholder, is_text_schema,
};
pub use source::{
    CsvLayout, DEFAULT_BATCH_SIZE, DEFAULT_TARGET_SPLIT_BYTES, FooterMemo, INFER_RECORDS,
    ReadOptions, RecentFooters, SourcePlan, Split, SplitKind, plan_source, plan_source_with,
    read_split, read_split_with,
};

/// File formats supported by the sources and sinks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum FileFormat {
    /// Comma (or other delimiter) separated values with a header line.
    Csv,
    /// JSON lines: one object per line.
    Json,
    /// Apache Parquet.
    Parquet,
    /// Plain text: one row per line, in a single string field `line`.
    Text,
}

impl FileFormat {
    /// Upper-case name used in messages (`CSV`, `JSON`, ...).
    pub fn name(self) -> &'static str {
        match self {
            FileFormat::Csv => "CSV",
            FileFormat::Json => "JSON",
            FileFormat::Parquet => "Parquet",
            FileFormat::Text => "text",
        }
    }

    /// Conventional file extension, including the dot.
    pub fn extension(self) -> &'static str {
        match self {
            FileFormat::Csv => ".csv",
            FileFormat::Json => ".jsonl",
            FileFormat::Parquet => ".parquet",
            FileFormat::Text => ".txt",
        }
    }
}

impl std::fmt::Display for FileFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether two schemas have the same field names and types, in order (nullability and
/// metadata aside).
fn same_fields(a: &arrow::datatypes::Schema, b: &arrow::datatypes::Schema) -> bool {
    a.fields().len() == b.fields().len()
        && a.fields()
            .iter()
            .zip(b.fields())
            .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type())
}

/// `name: type, ...`, for messages.
fn describe_fields(schema: &arrow::datatypes::Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;
