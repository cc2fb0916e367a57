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

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::array::{ArrayBuilder, RecordBatch, RecordBatchOptions, StringBuilder};
use arrow::csv::reader::Format;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::error::ArrowError;
use bytes::Bytes;
use futures::stream::{self, BoxStream};
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectMeta, ObjectStoreExt};
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::lines::{BLOCK_BYTES, LOOKAHEAD_BYTES, LineRange, count_newlines, spawn_line_reader};
use super::location::{Resolved, expand, resolve};
use super::parquet_io::{StoreReader, load_metadata};
use super::{FileFormat, IoError};

/// Records sampled for CSV/JSON schema inference.
pub const INFER_RECORDS: usize = 1000;
/// Default rows per batch; large batches keep per-batch overhead negligible.
pub const DEFAULT_BATCH_SIZE: usize = 65536;
/// Default split size (bytes; compressed bytes for Parquet).
pub const DEFAULT_TARGET_SPLIT_BYTES: u64 = 32 << 20;
/// Parquet footers loaded concurrently while planning many files.
const PLAN_CONCURRENCY: usize = 8;

/// What to read and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadOptions {
    pub format: FileFormat,
    /// File, directory or glob; see [`crate::io::location`].
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

/// Parquet footers already read, by file (and its size and modification time, so a changed
/// file is read again). Planning compiles a pipeline twice (the second time with its sources
/// narrowed to the fields used), and on an object store every footer is a request.
#[derive(Default)]
pub struct FooterMemo {
    footers: std::sync::Mutex<std::collections::HashMap<FooterKey, ArrowReaderMetadata>>,
}

type FooterKey = (String, u64, chrono::DateTime<chrono::Utc>);

impl FooterMemo {
    fn get(&self, key: &FooterKey) -> Option<ArrowReaderMetadata> {
        self.footers.lock().ok()?.get(key).cloned()
    }

    fn put(&self, key: FooterKey, md: &ArrowReaderMetadata) {
        if let Ok(mut m) = self.footers.lock() {
            m.insert(key, md.clone());
        }
    }
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
        FileFormat::Parquet => plan_parquet(opts, &resolved, &files, target, memo).await,
        FileFormat::Text => {
            if let Some(cols) = &opts.columns
                && cols.iter().any(|c| c != "line")
            {
                let column = cols
                    .iter()
                    .find(|c| *c != "line")
                    .cloned()
                    .unwrap_or_default();
                return Err(IoError::MissingColumn {
                    column,
                    location: opts.path.clone(),
                    available: "line".into(),
                });
            }
            Ok(SourcePlan {
                schema: text_schema(),
                splits: line_splits(&resolved, &files, target, None),
            })
        }
        FileFormat::Csv | FileFormat::Json => {
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
            let head = read_head(&resolved, first, &shown).await?;
            let file_schema = if opts.format == FileFormat::Csv {
                Format::default()
                    .with_header(opts.csv_has_header)
                    .with_delimiter(opts.csv_delimiter)
                    .infer_schema(&head[..], Some(INFER_RECORDS))
                    .map_err(|e| parse_error("CSV", &shown, String::new(), e))?
                    .0
            } else {
                arrow::json::reader::infer_json_schema(&head[..], Some(INFER_RECORDS))
                    .map_err(|e| parse_error("JSON", &shown, String::new(), e))?
                    .0
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
                splits: line_splits(&resolved, &files, target, layout),
            })
        }
    }
}

/// Opens one split as a stream of batches with exactly `schema` (the plan's schema).
pub async fn read_split(
    opts: &ReadOptions,
    schema: SchemaRef,
    split: &Split,
) -> Result<BoxStream<'static, Result<RecordBatch, IoError>>, IoError> {
    let resolved = resolve(&split.location)?;
    let shown = split.location.clone();
    match (opts.format, &split.kind) {
        (FileFormat::Parquet, SplitKind::RowGroups { first, count }) => {
            read_parquet(opts, schema, &resolved, split, *first, *count).await
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
            let batch_size = opts.batch_size();
            match opts.format {
                FileFormat::Csv => {
                    let decoder = csv_decoder(opts, &schema, split, *start, &shown)?;
                    Ok(decode_stream(rx, decoder, schema, shown))
                }
                FileFormat::Json => {
                    let decoder = arrow::json::ReaderBuilder::new(Arc::clone(&schema))
                        .with_batch_size(batch_size)
                        .with_coerce_primitive(true)
                        .build_decoder()
                        .map_err(|e| IoError::schema(&shown, e.to_string()))?;
                    let chunks = JsonChunks {
                        decoder,
                        position: Position::new(&shown, *start),
                        batch_first_line: 1,
                    };
                    Ok(decode_stream(rx, chunks, schema, shown))
                }
                _ => {
                    let chunks = TextChunks {
                        builder: StringBuilder::new(),
                        batch_size,
                        schema: Arc::clone(&schema),
                        position: Position::new(&shown, *start),
                    };
                    Ok(decode_stream(rx, chunks, schema, shown))
                }
            }
        }
        (format, kind) => Err(IoError::InvalidLocation {
            location: shown,
            message: format!("a {kind:?} split cannot be read as {format}"),
        }),
    }
}

fn text_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("line", DataType::Utf8, false)]))
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

/// Byte-range splits of about `target` bytes for each non-empty file.
fn line_splits(
    resolved: &Resolved,
    files: &[ObjectMeta],
    target: u64,
    csv: Option<CsvLayout>,
) -> Vec<Split> {
    let mut splits = Vec::new();
    for file in files.iter().filter(|f| f.size > 0) {
        let location = resolved.display_path(&file.location);
        let n = file.size.div_ceil(target).max(1);
        let chunk = file.size.div_ceil(n);
        let mut start = 0;
        while start < file.size {
            let end = (start + chunk).min(file.size);
            splits.push(Split {
                location: location.clone(),
                kind: SplitKind::Lines { start, end },
                estimated_bytes: end - start,
                file_size: file.size,
                estimated_rows: None,
                csv: csv.clone(),
            });
            start = end;
        }
    }
    splits
}

async fn plan_parquet(
    opts: &ReadOptions,
    resolved: &Resolved,
    files: &[ObjectMeta],
    target: u64,
    memo: &FooterMemo,
) -> Result<SourcePlan, IoError> {
    let footers: Vec<_> = stream::iter(files.iter().cloned())
        .map(|meta| async move {
            let shown = resolved.display_path(&meta.location);
            let key = (shown.clone(), meta.size, meta.last_modified);
            if let Some(md) = memo.get(&key) {
                return Ok::<_, IoError>((shown, meta.size, md));
            }
            let mut reader = StoreReader {
                store: Arc::clone(&resolved.store),
                path: meta.location.clone(),
                file_size: meta.size,
            };
            let md = load_metadata(&mut reader, &shown).await?;
            memo.put(key, &md);
            Ok::<_, IoError>((shown, meta.size, md))
        })
        .buffered(PLAN_CONCURRENCY)
        .try_collect()
        .await?;

    // All files must agree on names and types; nullability is merged.
    let (first_shown, _, first_md) = &footers[0];
    let first_schema = Arc::clone(first_md.schema());
    let mut nullable: Vec<bool> = first_schema
        .fields()
        .iter()
        .map(|f| f.is_nullable())
        .collect();
    for (shown, _, md) in &footers[1..] {
        let schema = md.schema();
        let same_shape = schema.fields().len() == first_schema.fields().len()
            && schema
                .fields()
                .iter()
                .zip(first_schema.fields())
                .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
        if !same_shape {
            return Err(IoError::schema(
                shown,
                format!(
                    "its schema ({}) differs from that of {first_shown} ({})",
                    describe_fields(schema),
                    describe_fields(&first_schema)
                ),
            ));
        }
        for (n, f) in nullable.iter_mut().zip(schema.fields()) {
            *n |= f.is_nullable();
        }
    }
    let merged: Vec<Field> = first_schema
        .fields()
        .iter()
        .zip(&nullable)
        .map(|(f, &n)| f.as_ref().clone().with_nullable(n))
        .collect();
    let file_schema = Arc::new(Schema::new_with_metadata(
        merged,
        first_schema.metadata().clone(),
    ));
    let (schema, _) = project(&file_schema, opts.columns.as_deref(), &opts.path)?;

    let mut splits = Vec::new();
    for (shown, size, md) in &footers {
        let groups = md.metadata().row_groups();
        let mut first = 0;
        while first < groups.len() {
            let mut bytes = 0u64;
            let mut rows = 0u64;
            let mut count = 0;
            // Greedy: add row groups while the split stays within the target
            // (a single oversized row group is a split of its own).
            while first + count < groups.len() {
                let g = &groups[first + count];
                let next = g.compressed_size().max(0) as u64;
                if count > 0 && bytes.saturating_add(next) > target {
                    break;
                }
                bytes += next;
                rows += g.num_rows().max(0) as u64;
                count += 1;
            }
            splits.push(Split {
                location: shown.clone(),
                kind: SplitKind::RowGroups { first, count },
                estimated_bytes: bytes,
                file_size: *size,
                estimated_rows: Some(rows),
                csv: None,
            });
            first += count;
        }
    }
    Ok(SourcePlan { schema, splits })
}

fn describe_fields(schema: &Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn read_parquet(
    opts: &ReadOptions,
    schema: SchemaRef,
    resolved: &Resolved,
    split: &Split,
    first: usize,
    count: usize,
) -> Result<BoxStream<'static, Result<RecordBatch, IoError>>, IoError> {
    let shown = split.location.clone();
    let mut reader = StoreReader {
        store: Arc::clone(&resolved.store),
        path: resolved.path()?,
        file_size: split.file_size,
    };
    let md = load_metadata(&mut reader, &shown).await?;
    let num_groups = md.metadata().num_row_groups();
    if first + count > num_groups {
        return Err(IoError::schema(
            &shown,
            format!(
                "split asks for row groups {first}..{} but the file has {num_groups}",
                first + count
            ),
        ));
    }
    let (mask, reorder) = match &opts.columns {
        None => (ProjectionMask::all(), None),
        Some(columns) => {
            let (_, indices) = project(md.schema(), Some(columns), &shown)?;
            let indices = indices.unwrap_or_default();
            let mut sorted = indices.clone();
            sorted.sort_unstable();
            // The reader yields columns in file order; put them back in the requested order.
            let reorder: Vec<usize> = indices
                .iter()
                .map(|i| sorted.iter().position(|s| s == i).unwrap_or(0))
                .collect();
            let identity = reorder.iter().enumerate().all(|(a, &b)| a == b);
            let mask = ProjectionMask::roots(md.parquet_schema(), sorted);
            (mask, (!identity).then_some(reorder))
        }
    };
    let stream = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, md)
        .with_row_groups((first..first + count).collect())
        .with_projection(mask)
        .with_batch_size(opts.batch_size())
        .build()
        .map_err(|e| IoError::parquet(&shown, e))?;
    Ok(stream
        .map(move |batch| {
            let batch = batch.map_err(|e| IoError::parquet(&shown, e))?;
            let batch = match &reorder {
                Some(order) => batch
                    .project(order)
                    .map_err(|e| IoError::schema(&shown, e.to_string()))?,
                None => batch,
            };
            conform(batch, &schema, &shown)
        })
        .boxed())
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

/// Where in a file a decoder is, to name lines in errors.
struct Position {
    shown: String,
    start: u64,
    /// Lines fully consumed so far in this split.
    lines: u64,
}

impl Position {
    fn new(shown: &str, start: u64) -> Self {
        Position {
            shown: shown.to_string(),
            start,
            lines: 0,
        }
    }

    /// " line N" (1-based); relative to the split when it does not start the file.
    fn line(&self, line: u64) -> String {
        if self.start == 0 {
            format!(" line {line}")
        } else {
            format!(" line {line} of the split starting at byte {}", self.start)
        }
    }

    fn lines(&self, first: u64, last: u64) -> String {
        if first >= last {
            return self.line(first);
        }
        if self.start == 0 {
            format!(" lines {first}-{last}")
        } else {
            format!(
                " lines {first}-{last} of the split starting at byte {}",
                self.start
            )
        }
    }
}

/// Turns line-aligned chunks into batches.
trait ChunkDecoder: Send + 'static {
    fn push(&mut self, chunk: &[u8], out: &mut VecDeque<RecordBatch>) -> Result<(), IoError>;
    fn finish(&mut self, out: &mut VecDeque<RecordBatch>) -> Result<(), IoError>;
}

/// Drives a [`ChunkDecoder`] from the chunk channel. Batches decoded before an
/// error are still yielded, then the error, then the stream ends.
fn decode_stream<D: ChunkDecoder>(
    rx: mpsc::Receiver<Result<Bytes, IoError>>,
    decoder: D,
    schema: SchemaRef,
    shown: String,
) -> BoxStream<'static, Result<RecordBatch, IoError>> {
    struct State<D> {
        rx: mpsc::Receiver<Result<Bytes, IoError>>,
        decoder: D,
        out: VecDeque<RecordBatch>,
        error: Option<IoError>,
        done: bool,
        schema: SchemaRef,
        shown: String,
    }
    let state = State {
        rx,
        decoder,
        out: VecDeque::new(),
        error: None,
        done: false,
        schema,
        shown,
    };
    stream::unfold(state, |mut st| async move {
        loop {
            if let Some(batch) = st.out.pop_front() {
                let batch = conform(batch, &st.schema, &st.shown);
                return Some((batch, st));
            }
            if let Some(e) = st.error.take() {
                st.done = true;
                return Some((Err(e), st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some(Ok(chunk)) => {
                    if let Err(e) = st.decoder.push(&chunk, &mut st.out) {
                        st.error = Some(e);
                    }
                }
                Some(Err(e)) => st.error = Some(e),
                None => {
                    st.done = true;
                    if let Err(e) = st.decoder.finish(&mut st.out) {
                        st.error = Some(e);
                    }
                }
            }
        }
    })
    .boxed()
}

fn csv_decoder(
    opts: &ReadOptions,
    schema: &SchemaRef,
    split: &Split,
    start: u64,
    shown: &str,
) -> Result<CsvChunks, IoError> {
    let layout = split.csv.clone().unwrap_or(CsvLayout {
        columns: schema.fields().iter().map(|f| f.name().clone()).collect(),
        projection: None,
    });
    let num_columns = layout.columns.len();
    // The decoder needs every file column; unprojected ones are placeholders it never parses.
    let file_schema = match &layout.projection {
        None => Arc::clone(schema),
        Some(projection) => {
            if projection.len() != schema.fields().len()
                || projection.iter().any(|&i| i >= num_columns)
            {
                return Err(IoError::schema(
                    shown,
                    "CSV split layout does not match the schema",
                ));
            }
            let fields: Vec<Field> = layout
                .columns
                .iter()
                .enumerate()
                .map(|(i, name)| match projection.iter().position(|&p| p == i) {
                    Some(out) => schema.field(out).clone(),
                    None => Field::new(name, DataType::Utf8, true),
                })
                .collect();
            Arc::new(Schema::new(fields))
        }
    };
    // The first split of each file checks its header against the planned columns,
    // so a file with other columns is an error rather than misread data.
    let header = start == 0 && opts.csv_has_header;
    let format = Format::default()
        .with_header(header)
        .with_header_validation(header)
        .with_delimiter(opts.csv_delimiter);
    let mut builder = arrow::csv::ReaderBuilder::new(file_schema)
        .with_format(format)
        .with_batch_size(opts.batch_size());
    if let Some(projection) = layout.projection {
        builder = builder.with_projection(projection);
    }
    Ok(CsvChunks {
        decoder: builder.build_decoder(),
        shown: shown.to_string(),
        start,
    })
}

struct CsvChunks {
    decoder: arrow::csv::reader::Decoder,
    shown: String,
    start: u64,
}

impl CsvChunks {
    fn error(&self, e: ArrowError) -> IoError {
        // arrow-csv numbers lines from where this decoder started: 0-based in
        // value errors ("at line N"), 1-based in shape errors ("for line N").
        // Move the number into our position text, 1-based.
        let position = Position::new(&self.shown, self.start);
        let (message, line) = match &e {
            ArrowError::ParseError(m) => match take_line(m, " at line ") {
                Some((rest, n)) => (rest, Some(n + 1)),
                None => (e.to_string(), None),
            },
            ArrowError::CsvError(m) => match take_line(m, " for line ") {
                Some((rest, n)) => (rest, Some(n)),
                None => (e.to_string(), None),
            },
            _ => (e.to_string(), None),
        };
        let position = match line {
            Some(n) => position.line(n),
            None if self.start == 0 => String::new(),
            None => format!(" (split starting at byte {})", self.start),
        };
        IoError::Parse {
            format: "CSV",
            location: self.shown.clone(),
            position,
            message,
        }
    }

    fn flush(&mut self, out: &mut VecDeque<RecordBatch>) -> Result<(), IoError> {
        if let Some(batch) = self.decoder.flush().map_err(|e| self.error(e))? {
            out.push_back(batch);
        }
        Ok(())
    }
}

impl ChunkDecoder for CsvChunks {
    fn push(&mut self, chunk: &[u8], out: &mut VecDeque<RecordBatch>) -> Result<(), IoError> {
        let mut buf = chunk;
        while !buf.is_empty() {
            if self.decoder.capacity() == 0 {
                self.flush(out)?;
            }
            let n = self.decoder.decode(buf).map_err(|e| self.error(e))?;
            if n == 0 && self.decoder.capacity() > 0 {
                return Err(self.error(ArrowError::CsvError("decoder made no progress".into())));
            }
            buf = &buf[n..];
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut VecDeque<RecordBatch>) -> Result<(), IoError> {
        loop {
            if self.decoder.capacity() == 0 {
                self.flush(out)?;
            }
            // An empty buffer tells the decoder the input ended (delimits a last line without '\n').
            if self.decoder.decode(&[]).map_err(|e| self.error(e))? == 0 {
                break;
            }
        }
        self.flush(out)
    }
}

/// Removes `{marker}N` from an arrow message, returning the rest and N.
fn take_line(message: &str, marker: &str) -> Option<(String, u64)> {
    let at = message.find(marker)?;
    let digits_start = at + marker.len();
    let digits_len = message[digits_start..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .count();
    let n = message[digits_start..digits_start + digits_len]
        .parse()
        .ok()?;
    Some((
        format!(
            "{}{}",
            &message[..at],
            &message[digits_start + digits_len..]
        ),
        n,
    ))
}

struct JsonChunks {
    decoder: arrow::json::reader::Decoder,
    position: Position,
    /// First line of the batch being built (1-based), for conversion errors.
    batch_first_line: u64,
}

impl JsonChunks {
    fn flush(&mut self, out: &mut VecDeque<RecordBatch>, last_line: u64) -> Result<(), IoError> {
        match self.decoder.flush() {
            Ok(Some(batch)) => out.push_back(batch),
            Ok(None) => {}
            Err(e) => {
                let position = self
                    .position
                    .lines(self.batch_first_line, last_line.max(self.batch_first_line));
                return Err(parse_error("JSON", &self.position.shown, position, e));
            }
        }
        self.batch_first_line = last_line + 1;
        Ok(())
    }

    /// Finds the first line of `chunk` that is not valid JSON, to name it in the error.
    fn syntax_error(&self, chunk: &[u8], lines_before: u64, e: ArrowError) -> IoError {
        let mut line = lines_before;
        for raw in chunk.split(|&b| b == b'\n') {
            line += 1;
            let trimmed = raw.strip_suffix(b"\r").unwrap_or(raw);
            if trimmed.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            if let Err(bad) = serde_json::from_slice::<serde::de::IgnoredAny>(trimmed) {
                return IoError::Parse {
                    format: "JSON",
                    location: self.position.shown.clone(),
                    position: self.position.line(line),
                    message: format!("{bad} ({e})"),
                };
            }
        }
        parse_error(
            "JSON",
            &self.position.shown,
            self.position.line(lines_before + 1),
            e,
        )
    }
}

impl ChunkDecoder for JsonChunks {
    fn push(&mut self, chunk: &[u8], out: &mut VecDeque<RecordBatch>) -> Result<(), IoError> {
        let lines_before = self.position.lines;
        let mut buf = chunk;
        let mut lines = lines_before;
        while !buf.is_empty() {
            let n = match self.decoder.decode(buf) {
                Ok(n) => n,
                Err(e) => return Err(self.syntax_error(chunk, lines_before, e)),
            };
            lines += count_newlines(&buf[..n]) as u64;
            buf = &buf[n..];
            if !buf.is_empty() {
                // The decoder stops when a batch is full.
                if n == 0 && self.decoder.is_empty() {
                    return Err(parse_error(
                        "JSON",
                        &self.position.shown,
                        self.position.line(lines + 1),
                        ArrowError::JsonError("decoder made no progress".into()),
                    ));
                }
                self.flush(out, lines)?;
            }
        }
        self.position.lines = lines;
        Ok(())
    }

    fn finish(&mut self, out: &mut VecDeque<RecordBatch>) -> Result<(), IoError> {
        if self.decoder.has_partial_record() {
            return Err(parse_error(
                "JSON",
                &self.position.shown,
                self.position.line(self.position.lines.max(1)),
                ArrowError::JsonError("the last record is incomplete".into()),
            ));
        }
        let last = self.position.lines + 1;
        self.flush(out, last)
    }
}

struct TextChunks {
    builder: StringBuilder,
    batch_size: usize,
    schema: SchemaRef,
    position: Position,
}

impl TextChunks {
    fn emit(&mut self, out: &mut VecDeque<RecordBatch>) -> Result<(), IoError> {
        let array = Arc::new(self.builder.finish());
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), vec![array])
            .map_err(|e| IoError::schema(&self.position.shown, e.to_string()))?;
        out.push_back(batch);
        Ok(())
    }
}

impl ChunkDecoder for TextChunks {
    fn push(&mut self, chunk: &[u8], out: &mut VecDeque<RecordBatch>) -> Result<(), IoError> {
        let text = std::str::from_utf8(chunk).map_err(|e| {
            let line = self.position.lines + count_newlines(&chunk[..e.valid_up_to()]) as u64 + 1;
            IoError::Parse {
                format: "text",
                location: self.position.shown.clone(),
                position: self.position.line(line),
                message: "invalid UTF-8".into(),
            }
        })?;
        for line in text.split_terminator('\n') {
            self.builder
                .append_value(line.strip_suffix('\r').unwrap_or(line));
            if self.builder.len() >= self.batch_size {
                self.emit(out)?;
            }
        }
        self.position.lines += count_newlines(chunk) as u64;
        Ok(())
    }

    fn finish(&mut self, out: &mut VecDeque<RecordBatch>) -> Result<(), IoError> {
        if self.builder.len() > 0 {
            self.emit(out)?;
        }
        Ok(())
    }
}
