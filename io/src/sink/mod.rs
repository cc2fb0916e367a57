//! Sharded, atomic file sinks in the manner of Beam's `WriteFiles`.
//!
//! Each worker partition writes one temp part with a [`SinkWriter`] under
//! `{dir of prefix}/.temp-riverbank-{job_token}/{sink name}/`; nothing appears
//! under the final names until [`commit_sink`] runs after the whole stage
//! succeeded. (The per-sink subdirectory keeps two sinks of one job that write
//! into the same directory from deleting each other's temps.)
//!
//! Files: `naming` forms final and temp names, `writer` encodes a temp part
//! (`behind` writes a local one while the next rows are encoded),
//! `commit` moves parts into place (merging them in `merge` when shards and
//! parts differ) or throws them away.

mod behind;
mod commit;
mod far_instants;
mod merge;
mod naming;
mod writer;

use serde::{Deserialize, Serialize};

use super::FileFormat;
pub use commit::{abort_sink, cleanup_temp, commit_sink, commit_sink_set};
pub use naming::has_shard_placeholder;
pub use writer::{SinkWriter, is_text_schema};

/// Beam's default shard name template.
pub const DEFAULT_SHARD_TEMPLATE: &str = "-SSSSS-of-NNNNN";

/// Where and how a sink writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteOptions {
    pub format: FileFormat,
    /// Beam-style output prefix, e.g. `out/zones` or `s3://b/out/zones.jsonl`.
    pub path: String,
    /// Exact shard count; `None` (or 0) means one shard per non-empty part.
    pub num_shards: Option<usize>,
    /// Defaults to [`DEFAULT_SHARD_TEMPLATE`].
    pub shard_name_template: Option<String>,
    /// Defaults to a known extension found at the end of `path`, else none.
    pub file_name_suffix: Option<String>,
}

impl WriteOptions {
    /// Defaults: runner-chosen shard count, default template, inferred suffix.
    pub fn new(format: FileFormat, path: impl Into<String>) -> Self {
        WriteOptions {
            format,
            path: path.into(),
            num_shards: None,
            shard_name_template: None,
            file_name_suffix: None,
        }
    }
}

/// A finished temp file, reported by a worker to the committer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TempPart {
    /// Location of the temp file.
    pub location: String,
    /// Worker partition index; parts are committed in this order.
    pub part: usize,
    pub rows: u64,
    pub bytes: u64,
    /// CSV: length of the header line at the start of the file, dropped when
    /// parts are concatenated. 0 for other formats.
    pub header_bytes: u64,
    /// Streaming: the window (start, end in µs) every row of the part belongs to; `None` for
    /// the global window. A windowed sink commits one set of shards per window and pane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<(i64, i64)>,
}
