//! File sources: planning (list files, fix the schema, cut splits) and reading one
//! split as a stream of record batches.
//!
//! Schema rules:
//! - Parquet: from file footers; every file must have the same field names and
//!   types (error naming the odd file); nullability is OR-ed across files.
//! - CSV: inferred by arrow-csv from the first [`INFER_RECORDS`] records of the
//!   first non-empty file (arrow infers `2024-01-15 08:12:33` as
//!   `Timestamp(Second, None)`; we keep that). Columns that are empty in the whole
//!   sample would infer as `Null` and silently drop later values, so they become
//!   `Utf8` instead.
//! - JSON lines: arrow-json inference over the first [`INFER_RECORDS`] records of
//!   the first non-empty file, same `Null` → `Utf8` rule (numbers are coerced to
//!   strings for such columns).
//! - Text: one non-null `Utf8` column `line`, like Beam's `ReadFromText`.
//!
//! Other files matched by a glob are not read at planning time (that would cost
//! a request per file): a CSV file whose header differs from the first file's
//! fails when read, naming the file; JSON fields outside the inferred schema are
//! ignored, and fields absent from a record read as null.
//!
//! Splits: Parquet is cut into runs of whole row groups holding at most the
//! target (compressed) bytes, a larger row group being a split of its own; line
//! formats into equal byte ranges of at most the target size, each reading the
//! lines that *start* inside it (see `lines.rs`). CSV byte-range splitting
//! assumes no quoted field contains a newline, as Beam's splittable text sources
//! do. A target of 0 means one split per file.

mod csv;
mod decode;
mod json;
mod lines;
mod parquet;
mod text;

use std::sync::Arc;

use arrow::array::{RecordBatch, RecordBatchOptions};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::error::ArrowError;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::{ObjectMeta, ObjectStoreExt};
use serde::{Deserialize, Serialize};

use super::location::{Resolved, expand, resolve};
use super::{FileFormat, IoError};
use decode::decode_stream;
use lines::{
    BLOCK_BYTES, LOOKAHEAD_BYTES, LineRange, count_newlines, line_splits, spawn_line_reader,
};
pub use parquet::{FooterMemo, RecentFooters};

/// Records sampled for CSV/JSON schema inference.
pub const INFER_RECORDS: usize = 1000;
/// Default rows per batch; large batches keep per-batch overhead negligible.
pub const DEFAULT_BATCH_SIZE: usize = 65536;
/// Default split size (bytes; compressed bytes for Parquet).
pub const DEFAULT_TARGET_SPLIT_BYTES: u64 = 32 << 20;

/// What to read and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadOptions {
    pub format: FileFormat,
    /// File, directory or glob; see [`crate::location`].
    pub path: String,
    /// Read only these columns, in this order (CSV, JSON, Parquet).
    pub columns: Option<Vec<String>>,
    pub csv_delimiter: u8,
    pub csv_has_header: bool,
    /// Rows per batch; 0 means [`DEFAULT_BATCH_SIZE`].
    pub batch_size: usize,
}

impl ReadOptions {
    /// Defaults: all columns, `,` delimiter, header on, [`DEFAULT_BATCH_SIZE`].
    pub fn new(format: FileFormat, path: impl Into<String>) -> Self {
        ReadOptions {
            format,
            path: path.into(),
            columns: None,
            csv_delimiter: b',',
            csv_has_header: true,
            batch_size: DEFAULT_BATCH_SIZE,
        }
    }

    fn batch_size(&self) -> usize {
        if self.batch_size == 0 {
            DEFAULT_BATCH_SIZE
        } else {
            self.batch_size
        }
    }
}

/// A unit of read work: a byte range of a line-oriented file, or a run of Parquet
/// row groups. Serializable so the coordinator can ship it to workers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    /// The file, in the user's style (relative path, absolute path or URL).
    pub location: String,
    pub kind: SplitKind,
    /// Bytes this split will read (compressed bytes for Parquet); for balancing.
    pub estimated_bytes: u64,
    /// Size of the whole file, so readers need no extra HEAD request.
    pub file_size: u64,
    /// Exact for Parquet; unknown for line formats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_rows: Option<u64>,
    /// CSV only: the file's column count and which columns to keep, because
    /// splits after the first cannot see the header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csv: Option<CsvLayout>,
}

/// The part of a file a [`Split`] covers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SplitKind {
    /// Bytes `[start, end)`; the split reads every line whose first byte is in it.
    Lines { start: u64, end: u64 },
    /// Parquet row groups `first .. first + count`.
    RowGroups { first: usize, count: usize },
    /// Offsets `[from, until)` of partition `partition` of an unbounded source (one
    /// checkpoint's share; `location` names the source).
    Offsets {
        partition: u32,
        from: u64,
        until: u64,
    },
}

/// Column layout of a CSV file, carried by each CSV split.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsvLayout {
    /// All column names of the file (the header), in file order.
    pub columns: Vec<String>,
    /// File column indices to output, in output order (`None`: all).
    pub projection: Option<Vec<usize>>,
}

/// The result of planning a source.
#[derive(Clone, Debug)]
pub struct SourcePlan {
    /// Schema of the batches [`read_split`] yields (after projection).
    pub schema: SchemaRef,
    /// In file order, then offset order. Empty files produce no splits.
    pub splits: Vec<Split>,
}

/// Lists the files of `opts.path`, determines the output schema and cuts splits of
/// about `target_split_bytes` (0: one split per file, or per whole Parquet file).
pub async fn plan_source(
    opts: &ReadOptions,
    target_split_bytes: u64,
) -> Result<SourcePlan, IoError> {
    plan_source_with(opts, target_split_bytes, &FooterMemo::default()).await
}

/// [`plan_source`], taking Parquet footers from `memo` when it has them, and keeping them there.
pub async fn plan_source_with(
    opts: &ReadOptions,
    target_split_bytes: u64,
    memo: &FooterMemo,
) -> Result<SourcePlan, IoError> {
    let (resolved, files) = expand(&opts.path).await?;
    let target = if target_split_bytes == 0 {
        u64::MAX
    } else {
        target_split_bytes
    };
    match opts.format {
        FileFormat::Parquet => parquet::plan(opts, &resolved, &files, target, memo).await,
        FileFormat::Text => text::plan(opts, &resolved, &files, target),
        FileFormat::Csv | FileFormat::Json => plan_sampled(opts, &resolved, &files, target).await,
    }
}

/// Plans a CSV or JSON source: its schema is inferred from a sample of the first
/// non-empty file.
async fn plan_sampled(
    opts: &ReadOptions,
    resolved: &Resolved,
    files: &[ObjectMeta],
    target: u64,
) -> Result<SourcePlan, IoError> {
    let Some(first) = files.iter().find(|f| f.size > 0) else {
        // Nothing to read at all: no splits, and the requested columns (if any) as strings.
        let fields: Vec<Field> = opts
            .columns
            .iter()
            .flatten()
            .map(|c| Field::new(c, DataType::Utf8, true))
            .collect();
        return Ok(SourcePlan {
            schema: Arc::new(Schema::new(fields)),
            splits: Vec::new(),
        });
    };
    let shown = resolved.display_path(&first.location);
    let head = read_head(resolved, first, &shown).await?;
    let file_schema = if opts.format == FileFormat::Csv {
        csv::infer_schema(opts, &head, &shown)?
    } else {
        json::infer_schema(&head, &shown)?
    };
    let file_schema = null_to_utf8(&file_schema);
    let (schema, projection) = project(&file_schema, opts.columns.as_deref(), &opts.path)?;
    let layout = (opts.format == FileFormat::Csv).then(|| CsvLayout {
        columns: file_schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect(),
        projection,
    });
    Ok(SourcePlan {
        schema,
        splits: line_splits(resolved, files, target, layout),
    })
}

/// Opens one split as a stream of batches with exactly `schema` (the plan's schema).
pub async fn read_split(
    opts: &ReadOptions,
    schema: SchemaRef,
    split: &Split,
) -> Result<BoxStream<'static, Result<RecordBatch, IoError>>, IoError> {
    read_split_with(opts, schema, split, &RecentFooters::default()).await
}

/// [`read_split`], taking a Parquet footer from `memo` when it has the file's (same location
/// and size), and keeping it there.
pub async fn read_split_with(
    opts: &ReadOptions,
    schema: SchemaRef,
    split: &Split,
    memo: &RecentFooters,
) -> Result<BoxStream<'static, Result<RecordBatch, IoError>>, IoError> {
    let resolved = resolve(&split.location)?;
    let shown = split.location.clone();
    match (opts.format, &split.kind) {
        (FileFormat::Parquet, SplitKind::RowGroups { first, count }) => {
            parquet::read(opts, schema, &resolved, split, *first, *count, memo).await
        }
        (
            FileFormat::Csv | FileFormat::Json | FileFormat::Text,
            SplitKind::Lines { start, end },
        ) => {
            let rx = spawn_line_reader(LineRange {
                store: Arc::clone(&resolved.store),
                path: resolved.path()?,
                shown: shown.clone(),
                file_size: split.file_size,
                start: *start,
                end: *end,
                block: BLOCK_BYTES,
                lookahead: LOOKAHEAD_BYTES,
            });
            Ok(match opts.format {
                FileFormat::Csv => {
                    let decoder = csv::decoder(opts, &schema, split, *start, &shown)?;
                    decode_stream(rx, decoder, schema, shown)
                }
                FileFormat::Json => {
                    let decoder = json::decoder(opts, &schema, *start, &shown)?;
                    decode_stream(rx, decoder, schema, shown)
                }
                _ => {
                    let decoder = text::decoder(opts, &schema, *start, &shown);
                    decode_stream(rx, decoder, schema, shown)
                }
            })
        }
        (format, kind) => Err(IoError::InvalidLocation {
            location: shown,
            message: format!("a {kind:?} split cannot be read as {format}"),
        }),
    }
}

fn parse_error(format: &'static str, location: &str, position: String, e: ArrowError) -> IoError {
    IoError::Parse {
        format,
        location: location.to_string(),
        position,
        message: e.to_string(),
    }
}

/// Reads enough of the start of a file to see [`INFER_RECORDS`] records, cut at a line end.
async fn read_head(resolved: &Resolved, meta: &ObjectMeta, shown: &str) -> Result<Bytes, IoError> {
    const MAX_HEAD: u64 = 64 << 20;
    let mut len = meta.size.min(1 << 20);
    loop {
        let head = resolved
            .store
            .get_range(&meta.location, 0..len)
            .await
            .map_err(|e| IoError::store("read", shown, e))?;
        if len >= meta.size {
            return Ok(head);
        }
        if count_newlines(&head) > INFER_RECORDS + 1 || len >= MAX_HEAD {
            let cut = head
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(head.len(), |i| i + 1);
            return Ok(head.slice(..cut));
        }
        len = (len * 4).min(meta.size);
    }
}

/// Columns that were empty in the sample become strings rather than `Null`.
fn null_to_utf8(schema: &Schema) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            if f.data_type() == &DataType::Null {
                Field::new(f.name(), DataType::Utf8, true)
            } else {
                f.as_ref().clone()
            }
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// Applies a column projection; returns the output schema and file column indices.
fn project(
    schema: &SchemaRef,
    columns: Option<&[String]>,
    shown: &str,
) -> Result<(SchemaRef, Option<Vec<usize>>), IoError> {
    let Some(columns) = columns else {
        return Ok((Arc::clone(schema), None));
    };
    let mut indices = Vec::with_capacity(columns.len());
    for column in columns {
        let index = schema
            .index_of(column)
            .map_err(|_| IoError::MissingColumn {
                column: column.clone(),
                location: shown.to_string(),
                available: schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        if indices.contains(&index) {
            return Err(IoError::schema(
                shown,
                format!("column {column:?} is listed twice"),
            ));
        }
        indices.push(index);
    }
    let projected = schema
        .project(&indices)
        .map_err(|e| IoError::schema(shown, e.to_string()))?;
    Ok((Arc::new(projected), Some(indices)))
}

/// Re-labels a batch with the plan's schema (same types; metadata and
/// nullability may differ between files), so every batch of a source has one schema.
fn conform(batch: RecordBatch, schema: &SchemaRef, shown: &str) -> Result<RecordBatch, IoError> {
    if batch.schema_ref() == schema {
        return Ok(batch);
    }
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(Arc::clone(schema), batch.columns().to_vec(), &options)
        .map_err(|e| IoError::schema(shown, format!("batch does not fit the source schema: {e}")))
}
