//! Sharded, atomic file sinks in the manner of Beam's `WriteFiles`.
//!
//! Each worker partition writes one temp part with a [`SinkWriter`] under
//! `{dir of prefix}/.temp-riverbank-{job_token}/{sink name}/`; nothing appears
//! under the final names until [`commit_sink`] runs after the whole stage
//! succeeded. (The per-sink subdirectory keeps two sinks of one job that write
//! into the same directory from deleting each other's temps.)
//!
//! Final names are `{prefix}{shard_name_template}{suffix}`; in the template a run
//! of `S` is the zero-padded shard index and a run of `N` the zero-padded shard
//! count, default `-SSSSS-of-NNNNN`. A template without `S` names a single file
//! (so an empty template gives exactly `{prefix}{suffix}`). Without an explicit
//! suffix, a known extension at the end of the path (`.jsonl`, `.json`, `.csv`,
//! `.parquet`, `.txt`) becomes the suffix: `out/zones.jsonl` →
//! `out/zones-00000-of-00001.jsonl`.
//!
//! Encodings: JSON lines via arrow-json (nulls omitted; floats shortest
//! round-trip such as `0.1`, `12.0`, `1.0e21`; UTC timestamps as RFC 3339 with
//! `Z`, fraction only when non-zero: `2024-01-15T00:00:00Z`,
//! `2024-01-15T00:00:00.250Z`); CSV via arrow-csv with a header line (same
//! timestamp text; naive timestamps as `2024-01-15T08:12:33`); Parquet via
//! `AsyncArrowWriter`, snappy; text writes the single string field one value per
//! line (a null becomes an empty line).
//!
//! Buffering: parts go through `object_store::buffered::BufWriter`, which keeps
//! up to 10 MiB in memory and switches to a multipart upload (a staging file for
//! local paths) beyond that, so memory stays bounded for big outputs.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Schema, SchemaRef};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStoreExt};
use parquet::arrow::{AsyncArrowWriter, ParquetRecordBatchStreamBuilder};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::location::{Resolved, TEMP_DIR_PREFIX, key_to_path, resolve};
use super::parquet_io::{StoreReader, load_metadata, writer_properties};
use super::{FileFormat, IoError};

/// Beam's default shard name template.
pub const DEFAULT_SHARD_TEMPLATE: &str = "-SSSSS-of-NNNNN";

/// Extensions recognised at the end of a sink path when no suffix is given.
const KNOWN_EXTENSIONS: [&str; 5] = [".jsonl", ".json", ".csv", ".parquet", ".txt"];

/// Bytes per request when concatenating parts.
const COPY_BLOCK: u64 = 8 << 20;

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
}

/// How final file names are formed.
#[derive(Clone, Debug)]
struct Naming {
    prefix: String,
    template: String,
    suffix: String,
}

impl Naming {
    fn new(opts: &WriteOptions) -> Result<Self, IoError> {
        if opts.path.is_empty() {
            return Err(IoError::SinkOptions {
                location: opts.path.clone(),
                message: "the output path is empty".into(),
            });
        }
        let template = opts
            .shard_name_template
            .clone()
            .unwrap_or_else(|| DEFAULT_SHARD_TEMPLATE.to_string());
        let (prefix, suffix) = match &opts.file_name_suffix {
            Some(suffix) => (opts.path.clone(), suffix.clone()),
            None => {
                let name_start = opts.path.rfind('/').map_or(0, |i| i + 1);
                let name = &opts.path[name_start..];
                match KNOWN_EXTENSIONS
                    .iter()
                    .find(|ext| name.len() > ext.len() && name.ends_with(*ext))
                {
                    Some(ext) => (
                        opts.path[..opts.path.len() - ext.len()].to_string(),
                        ext.to_string(),
                    ),
                    None => (opts.path.clone(), String::new()),
                }
            }
        };
        Ok(Naming {
            prefix,
            template,
            suffix,
        })
    }

    fn has_shard_placeholder(&self) -> bool {
        self.template.contains('S')
    }

    fn shard_count(&self, requested: Option<usize>, parts: usize) -> Result<usize, IoError> {
        let requested = requested.filter(|&n| n > 0);
        if !self.has_shard_placeholder() {
            return match requested {
                None | Some(1) => Ok(1),
                Some(n) => Err(IoError::SinkOptions {
                    location: self.prefix.clone(),
                    message: format!(
                        "shard_name_template {:?} has no S placeholder, so only one file can be written, but num_shards is {n}",
                        self.template
                    ),
                }),
            };
        }
        Ok(requested.unwrap_or(parts.max(1)))
    }

    /// Expands runs of `S`/`N` in the template; `digit` renders a run of `width` letters.
    fn expand(&self, mut digit: impl FnMut(char, usize) -> String) -> String {
        let mut out = String::new();
        let chars: Vec<char> = self.template.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if c == 'S' || c == 'N' {
                let run = chars[i..].iter().take_while(|&&x| x == c).count();
                out.push_str(&digit(c, run));
                i += run;
            } else {
                out.push(c);
                i += 1;
            }
        }
        out
    }

    fn file_name(&self, shard: usize, shards: usize) -> String {
        let middle = self.expand(|c, width| {
            let value = if c == 'S' { shard } else { shards };
            format!("{value:0width$}")
        });
        format!("{}{middle}{}", self.prefix, self.suffix)
    }

    /// Glob over file names (not paths) matching any shard count, for stale files.
    fn stale_name_glob(&self) -> Option<String> {
        if !self.has_shard_placeholder() || self.template.contains('/') || self.suffix.contains('/')
        {
            return None;
        }
        let name_prefix = match self.prefix.rfind('/') {
            Some(i) => &self.prefix[i + 1..],
            None => self.prefix.as_str(),
        };
        let middle = self.expand(|_, width| "?".repeat(width));
        let escaped_middle: String = {
            // Escape everything but the `?` placeholders.
            let mut s = String::new();
            let mut literal = String::new();
            for ch in middle.chars() {
                if ch == '?' {
                    s.push_str(&globset::escape(&literal));
                    literal.clear();
                    s.push('?');
                } else {
                    literal.push(ch);
                }
            }
            s.push_str(&globset::escape(&literal));
            s
        };
        Some(format!(
            "{}{escaped_middle}{}",
            globset::escape(name_prefix),
            globset::escape(&self.suffix)
        ))
    }

    /// The prefix resolved, plus the key of the directory it lives in.
    fn dir(&self) -> Result<(Resolved, String), IoError> {
        let resolved = resolve(&self.prefix)?;
        let dir = if self.prefix.ends_with('/') {
            resolved.key.clone()
        } else {
            resolved.parent_key()
        };
        Ok((resolved, dir))
    }

    /// Temp directory for this sink within the job's temp directory.
    fn temp_dir_key(&self, job_token: &str) -> Result<(Resolved, String), IoError> {
        let (resolved, dir) = self.dir()?;
        let name_prefix = if self.prefix.ends_with('/') {
            ""
        } else {
            self.prefix.rsplit('/').next().unwrap_or("")
        };
        let sink_name = sanitize(&format!("{name_prefix}{}", self.suffix));
        let sink_name = if sink_name.is_empty() {
            "_".to_string()
        } else {
            sink_name
        };
        let key = join_key(
            &dir,
            &format!("{TEMP_DIR_PREFIX}{}/{sink_name}", sanitize(job_token)),
        );
        Ok((resolved, key))
    }
}

fn join_key(dir: &str, rest: &str) -> String {
    if dir.is_empty() {
        rest.to_string()
    } else {
        format!("{dir}/{rest}")
    }
}

/// Keeps names safe for every store: ASCII alphanumerics and `-_.`.
fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Distinguishes retries of the same part so they never overwrite each other.
fn unique_tag() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:x}{:x}{count:x}",
        std::process::id(),
        nanos & 0xffff_ffff_ffff
    )
}

enum WriterState {
    /// Nothing written yet: no file exists.
    Empty,
    /// CSV, JSON or text: encoded bytes go straight to the store writer.
    Lines(Box<BufWriter>),
    Parquet(Box<AsyncArrowWriter<BufWriter>>),
}

/// Writes one temp part of a sink (one per sink and worker partition).
pub struct SinkWriter {
    format: FileFormat,
    target: Resolved,
    path: Path,
    part: usize,
    /// The sink's output path, for messages.
    sink: String,
    state: WriterState,
    schema: Option<SchemaRef>,
    rows: u64,
    bytes: u64,
    header_bytes: u64,
}

impl std::fmt::Debug for SinkWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkWriter")
            .field("format", &self.format)
            .field("temp", &self.target.display())
            .field("part", &self.part)
            .field("rows", &self.rows)
            .finish()
    }
}

impl SinkWriter {
    /// Prepares a temp part; no file is created until the first non-empty batch.
    pub async fn create(
        opts: &WriteOptions,
        job_token: &str,
        part: usize,
    ) -> Result<Self, IoError> {
        let naming = Naming::new(opts)?;
        let (resolved, temp_dir) = naming.temp_dir_key(job_token)?;
        let key = join_key(
            &temp_dir,
            &format!("part-{part:05}-{}{}", unique_tag(), naming.suffix),
        );
        let target = resolved.with_key(key);
        let path = target.path()?;
        Ok(SinkWriter {
            format: opts.format,
            target,
            path,
            part,
            sink: opts.path.clone(),
            state: WriterState::Empty,
            schema: None,
            rows: 0,
            bytes: 0,
            header_bytes: 0,
        })
    }

    /// Location of the temp file this writer produces.
    pub fn temp_location(&self) -> String {
        self.target.display()
    }

    /// Appends a batch. Batches of one writer must share a schema.
    pub async fn write(&mut self, batch: &RecordBatch) -> Result<(), IoError> {
        self.check_schema(batch.schema_ref())?;
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let shown = self.target.display();
        match self.format {
            FileFormat::Parquet => {
                if matches!(self.state, WriterState::Empty) {
                    let out = BufWriter::new(Arc::clone(&self.target.store), self.path.clone());
                    let writer =
                        AsyncArrowWriter::try_new(out, batch.schema(), Some(writer_properties()))
                            .map_err(|e| IoError::parquet(&shown, e))?;
                    self.state = WriterState::Parquet(Box::new(writer));
                }
                if let WriterState::Parquet(writer) = &mut self.state {
                    writer
                        .write(batch)
                        .await
                        .map_err(|e| IoError::parquet(&shown, e))?;
                }
            }
            FileFormat::Csv | FileFormat::Json | FileFormat::Text => {
                let mut encoded = Vec::new();
                if matches!(self.state, WriterState::Empty) {
                    if self.format == FileFormat::Csv {
                        encoded = csv_header(batch.schema_ref(), &shown)?;
                        self.header_bytes = encoded.len() as u64;
                    }
                    self.state = WriterState::Lines(Box::new(BufWriter::new(
                        Arc::clone(&self.target.store),
                        self.path.clone(),
                    )));
                }
                encode_lines(self.format, batch, &mut encoded, &shown, &self.sink)?;
                self.bytes += encoded.len() as u64;
                if let WriterState::Lines(out) = &mut self.state {
                    out.put(Bytes::from(encoded))
                        .await
                        .map_err(|e| IoError::store("write", &shown, e))?;
                }
            }
        }
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    fn check_schema(&mut self, schema: &SchemaRef) -> Result<(), IoError> {
        if self.format == FileFormat::Text {
            check_text_schema(schema, &self.sink)?;
        }
        match &self.schema {
            None => self.schema = Some(Arc::clone(schema)),
            Some(first) if self.format != FileFormat::Json => {
                let same = first.fields().len() == schema.fields().len()
                    && first
                        .fields()
                        .iter()
                        .zip(schema.fields())
                        .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
                if !same {
                    return Err(IoError::schema(
                        &self.sink,
                        format!("batch schema changed while writing: {first:?} then {schema:?}"),
                    ));
                }
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Finishes the temp file. `None` when no row was written (no file exists).
    pub async fn close(self) -> Result<Option<TempPart>, IoError> {
        let location = self.target.display();
        let bytes = match self.state {
            WriterState::Empty => return Ok(None),
            WriterState::Lines(mut out) => {
                out.shutdown()
                    .await
                    .map_err(|e| IoError::local("finish", &location, e))?;
                self.bytes
            }
            WriterState::Parquet(mut writer) => {
                writer
                    .finish()
                    .await
                    .map_err(|e| IoError::parquet(&location, e))?;
                writer.bytes_written() as u64
            }
        };
        Ok(Some(TempPart {
            location,
            part: self.part,
            rows: self.rows,
            bytes,
            header_bytes: self.header_bytes,
        }))
    }

    /// Gives up on this part: cancels any upload and deletes what was written.
    pub async fn abort(self) {
        let mut out = match self.state {
            WriterState::Empty => return,
            WriterState::Lines(out) => *out,
            WriterState::Parquet(writer) => writer.into_inner(),
        };
        let _ = out.abort().await;
        let _ = self.target.store.delete(&self.path).await;
    }
}

fn check_text_schema(schema: &Schema, sink: &str) -> Result<(), IoError> {
    let fields = schema.fields();
    let ok = fields.len() == 1
        && matches!(
            fields[0].data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        );
    if ok {
        return Ok(());
    }
    Err(IoError::TextSinkSchema {
        fields: fields
            .iter()
            .map(|f| format!("{}: {}", f.name(), f.data_type()))
            .collect::<Vec<_>>()
            .join(", "),
        location: sink.to_string(),
    })
}

/// The CSV header line for a schema.
fn csv_header(schema: &SchemaRef, shown: &str) -> Result<Vec<u8>, IoError> {
    let mut writer = arrow::csv::WriterBuilder::new()
        .with_header(true)
        .build(Vec::new());
    writer
        .write(&RecordBatch::new_empty(Arc::clone(schema)))
        .map_err(|e| IoError::Arrow {
            op: "write CSV header to",
            location: shown.to_string(),
            source: e,
        })?;
    Ok(writer.into_inner())
}

/// Encodes a batch as CSV rows (no header), JSON lines or text lines.
fn encode_lines(
    format: FileFormat,
    batch: &RecordBatch,
    out: &mut Vec<u8>,
    shown: &str,
    sink: &str,
) -> Result<(), IoError> {
    let arrow_error = |op: &'static str| {
        move |e| IoError::Arrow {
            op,
            location: shown.to_string(),
            source: e,
        }
    };
    match format {
        FileFormat::Csv => {
            let mut writer = arrow::csv::WriterBuilder::new()
                .with_header(false)
                .build(std::mem::take(out));
            writer.write(batch).map_err(arrow_error("write CSV to"))?;
            *out = writer.into_inner();
        }
        FileFormat::Json => {
            let mut writer = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(false)
                .build::<_, arrow::json::writer::LineDelimited>(std::mem::take(out));
            writer.write(batch).map_err(arrow_error("write JSON to"))?;
            writer.finish().map_err(arrow_error("write JSON to"))?;
            *out = writer.into_inner();
        }
        FileFormat::Text => {
            check_text_schema(batch.schema_ref(), sink)?;
            let column = batch.column(0);
            // Nulls are written as empty lines.
            let mut push = |value: Option<&str>| {
                out.extend_from_slice(value.unwrap_or("").as_bytes());
                out.push(b'\n');
            };
            match column.data_type() {
                DataType::Utf8 => column.as_string::<i32>().iter().for_each(&mut push),
                DataType::LargeUtf8 => column.as_string::<i64>().iter().for_each(&mut push),
                _ => column.as_string_view().iter().for_each(&mut push),
            }
        }
        FileFormat::Parquet => unreachable!("parquet is not a line format"),
    }
    Ok(())
}

/// Moves parts into their final names and returns those names (in shard order).
///
/// - Shard count: `num_shards` if set; else one shard per part (at least one).
///   With nothing written at all, empty shard(s) are still written: CSV gets a
///   header when the schema is known, Parquet a zero-row file with the schema,
///   JSON/text an empty file.
/// - When the shard count differs from the number of parts, shard `i` gets a
///   contiguous run of parts (runs differ in length by at most one; when there
///   are fewer parts than shards, the last shards are empty). Text formats are
///   concatenated byte-wise (CSV keeps only the first header); Parquet parts are
///   re-read and re-written.
/// - Moving: a lone part is renamed (an atomic `rename(2)` locally; copy + delete
///   on stores without rename). Merged shards are written through a staging
///   file / multipart upload, so they appear atomically too.
/// - Stale shards: Beam does not do this, but existing files matching the
///   template with any shard count (`{prefix}-?????-of-?????{suffix}` by
///   default) that are not part of this commit are deleted, because shards of an
///   earlier run with a different count would be read together with the new ones.
/// - Re-running after a failure (a coordinator that died mid-commit commits again
///   after its restart): a lone part whose temp file is gone but whose final file
///   exists counts as already moved. Merged parts are only deleted once every
///   shard is written, so a merged shard with a part gone was written by the
///   earlier run and is kept (gone with no shard written is data lost: an error);
///   otherwise merged shards are rebuilt from their parts.
/// - Finally the sink's temp directory is removed (best effort).
pub async fn commit_sink(
    opts: &WriteOptions,
    schema: Option<SchemaRef>,
    parts: Vec<TempPart>,
) -> Result<Vec<String>, IoError> {
    let naming = Naming::new(opts)?;
    let mut parts = parts;
    parts.sort_by(|a, b| (a.part, &a.location).cmp(&(b.part, &b.location)));
    let shards = naming.shard_count(opts.num_shards, parts.len())?;
    let finals = (0..shards)
        .map(|i| resolve(&naming.file_name(i, shards)))
        .collect::<Result<Vec<_>, _>>()?;
    let temps = parts
        .iter()
        .map(|p| resolve(&p.location))
        .collect::<Result<Vec<_>, _>>()?;

    for (shard, range) in shard_ranges(parts.len(), shards).into_iter().enumerate() {
        let target = &finals[shard];
        if range.len() == 1 {
            move_part(&temps[range.start], target).await?;
        } else if merged_by_an_earlier_run(&temps[range.clone()], target).await? {
            tracing::info!(shard, location = %target.display(), "written by an earlier commit");
        } else {
            let group: Vec<(&TempPart, &Resolved)> =
                parts[range.clone()].iter().zip(&temps[range]).collect();
            write_merged(opts.format, &schema, &group, &parts, &temps, target).await?;
        }
        tracing::debug!(shard, location = %target.display(), "committed shard");
    }

    delete_stale(&naming, &finals).await?;
    remove_temps(&temps).await;
    Ok(finals.iter().map(Resolved::display).collect())
}

/// True when a merged shard's part is gone, which only the cleanup after every shard was
/// written does, and the shard exists. A part gone with the shard missing is data lost.
async fn merged_by_an_earlier_run(temps: &[Resolved], target: &Resolved) -> Result<bool, IoError> {
    for temp in temps {
        if !exists(temp).await? {
            return if exists(target).await? {
                Ok(true)
            } else {
                Err(IoError::Commit {
                    location: target.display(),
                    detail: format!(
                        "temp part {} is gone but this shard was never written",
                        temp.display()
                    ),
                })
            };
        }
    }
    Ok(false)
}

async fn exists(r: &Resolved) -> Result<bool, IoError> {
    match r.store.head(&r.path()?).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(IoError::store("check", r.display(), e)),
    }
}

/// Deletes the temp files of `parts` (best effort; failures are logged). Only those files:
/// the sink's temp directory also holds the parts of other items, which a discarded attempt
/// must not take with it ([`cleanup_temp`] removes the directory at the job's end). Final
/// files are never touched.
pub async fn abort_sink(opts: &WriteOptions, parts: Vec<TempPart>) {
    let temps: Vec<Resolved> = parts
        .iter()
        .filter_map(|p| match resolve(&p.location) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(sink = %opts.path, error = %e, "cannot resolve temp part");
                None
            }
        })
        .collect();
    delete_temp_files(&temps).await;
}

/// Removes this sink's whole temp directory for a job, including files of
/// writers that never reported a part (crashed workers). Best effort.
pub async fn cleanup_temp(opts: &WriteOptions, job_token: &str) {
    let result = async {
        let naming = Naming::new(opts)?;
        let (resolved, dir) = naming.temp_dir_key(job_token)?;
        remove_temp_dir(&resolved.with_key(dir)).await;
        Ok::<_, IoError>(())
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(sink = %opts.path, error = %e, "cannot clean up sink temp directory");
    }
}

/// Contiguous part ranges per shard: boundaries at ceil(i * parts / shards).
fn shard_ranges(parts: usize, shards: usize) -> Vec<Range<usize>> {
    let bound = |i: usize| (i * parts).div_ceil(shards);
    (0..shards).map(|i| bound(i)..bound(i + 1)).collect()
}

async fn move_part(temp: &Resolved, target: &Resolved) -> Result<(), IoError> {
    let from = temp.path()?;
    let to = target.path()?;
    let err = match temp.store.rename(&from, &to).await {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    if matches!(err, object_store::Error::NotFound { .. }) && target.store.head(&to).await.is_ok() {
        // Moved by an earlier, interrupted commit.
        return Ok(());
    }
    Err(IoError::store(
        "move temp part into place:",
        format!("{} -> {}", temp.display(), target.display()),
        err,
    ))
}

/// Writes one shard from zero or more parts (through a staging upload, so the
/// final name appears complete or not at all).
async fn write_merged(
    format: FileFormat,
    schema: &Option<SchemaRef>,
    group: &[(&TempPart, &Resolved)],
    all_parts: &[TempPart],
    all_temps: &[Resolved],
    target: &Resolved,
) -> Result<(), IoError> {
    let shown = target.display();
    let path = target.path()?;
    let mut out = BufWriter::new(Arc::clone(&target.store), path);
    match format {
        FileFormat::Parquet => {
            let schema = match (group.first(), schema) {
                (Some((_, temp)), _) => parquet_schema(temp).await?,
                (None, Some(schema)) => Arc::clone(schema),
                (None, None) => match all_temps.first() {
                    Some(temp) => parquet_schema(temp).await?,
                    None => Arc::new(Schema::empty()),
                },
            };
            let mut writer = AsyncArrowWriter::try_new(out, schema, Some(writer_properties()))
                .map_err(|e| IoError::parquet(&shown, e))?;
            for (_, temp) in group {
                let temp_shown = temp.display();
                let meta = head(temp).await?;
                let mut reader = StoreReader {
                    store: Arc::clone(&temp.store),
                    path: meta.location.clone(),
                    file_size: meta.size,
                };
                let md = load_metadata(&mut reader, &temp_shown).await?;
                let mut batches = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, md)
                    .build()
                    .map_err(|e| IoError::parquet(&temp_shown, e))?;
                while let Some(batch) = batches.next().await {
                    let batch = batch.map_err(|e| IoError::parquet(&temp_shown, e))?;
                    writer
                        .write(&batch)
                        .await
                        .map_err(|e| IoError::parquet(&shown, e))?;
                }
            }
            writer
                .close()
                .await
                .map_err(|e| IoError::parquet(&shown, e))?;
            return Ok(());
        }
        FileFormat::Csv if group.is_empty() => {
            // An empty CSV shard still gets a header when we know the columns.
            let header = match (schema, all_parts.first().zip(all_temps.first())) {
                (Some(schema), _) => csv_header(schema, &shown)?,
                (None, Some((part, temp))) if part.header_bytes > 0 => {
                    let path = temp.path()?;
                    temp.store
                        .get_range(&path, 0..part.header_bytes)
                        .await
                        .map_err(|e| IoError::store("read", temp.display(), e))?
                        .to_vec()
                }
                _ => Vec::new(),
            };
            if !header.is_empty() {
                out.put(Bytes::from(header))
                    .await
                    .map_err(|e| IoError::store("write", &shown, e))?;
            }
        }
        FileFormat::Csv | FileFormat::Json | FileFormat::Text => {
            for (index, (part, temp)) in group.iter().enumerate() {
                let skip = if index > 0 && format == FileFormat::Csv {
                    part.header_bytes
                } else {
                    0
                };
                copy_bytes(temp, skip, &mut out, &shown).await?;
            }
        }
    }
    out.shutdown()
        .await
        .map_err(|e| IoError::local("finish", &shown, e))?;
    Ok(())
}

async fn head(temp: &Resolved) -> Result<ObjectMeta, IoError> {
    let path = temp.path()?;
    temp.store
        .head(&path)
        .await
        .map_err(|e| IoError::store("read", temp.display(), e))
}

async fn parquet_schema(temp: &Resolved) -> Result<SchemaRef, IoError> {
    let meta = head(temp).await?;
    let mut reader = StoreReader {
        store: Arc::clone(&temp.store),
        path: meta.location,
        file_size: meta.size,
    };
    let md = load_metadata(&mut reader, &temp.display()).await?;
    Ok(Arc::clone(md.schema()))
}

/// Appends the bytes of `temp` from offset `skip` to `out`, in blocks.
async fn copy_bytes(
    temp: &Resolved,
    skip: u64,
    out: &mut BufWriter,
    shown: &str,
) -> Result<(), IoError> {
    let meta = head(temp).await?;
    let mut pos = skip.min(meta.size);
    while pos < meta.size {
        let to = (pos + COPY_BLOCK).min(meta.size);
        let data = temp
            .store
            .get_range(&meta.location, pos..to)
            .await
            .map_err(|e| IoError::store("read", temp.display(), e))?;
        out.put(data)
            .await
            .map_err(|e| IoError::store("write", shown, e))?;
        pos = to;
    }
    Ok(())
}

/// Deletes files from earlier runs that match the shard pattern but are not ours.
async fn delete_stale(naming: &Naming, finals: &[Resolved]) -> Result<(), IoError> {
    let Some(glob) = naming.stale_name_glob() else {
        return Ok(());
    };
    let matcher = globset::GlobBuilder::new(&glob)
        .literal_separator(true)
        .build()
        .map_err(|e| IoError::SinkOptions {
            location: naming.prefix.clone(),
            message: format!("cannot build a pattern for stale shards: {e}"),
        })?
        .compile_matcher();
    let (resolved, dir) = naming.dir()?;
    let dir_path = key_to_path(&dir, &resolved.display_key(&dir))?;
    let listing = match resolved.store.list_with_delimiter(Some(&dir_path)).await {
        Ok(listing) => listing,
        Err(object_store::Error::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(IoError::store("list", resolved.display_key(&dir), e)),
    };
    for object in listing.objects {
        let is_ours = finals.iter().any(|f| f.key == object.location.as_ref());
        let matches = object
            .location
            .filename()
            .is_some_and(|name| matcher.is_match(name));
        if matches && !is_ours {
            tracing::info!(location = %resolved.display_path(&object.location), "deleting stale shard");
            match resolved.store.delete(&object.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    return Err(IoError::store(
                        "delete stale shard",
                        resolved.display_path(&object.location),
                        e,
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Deletes temp files, and nothing else.
async fn delete_temp_files(temps: &[Resolved]) {
    for temp in temps {
        if let Ok(path) = temp.path() {
            match temp.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    tracing::warn!(location = %temp.display(), error = %e, "cannot delete temp part")
                }
            }
        }
    }
}

/// Deletes temp files and then their (sink) temp directories: after a commit, when every
/// part of the sink has been moved or merged.
async fn remove_temps(temps: &[Resolved]) {
    delete_temp_files(temps).await;
    let mut dirs: Vec<Resolved> = Vec::new();
    for temp in temps {
        let dir = temp.with_key(temp.parent_key());
        if !dirs.iter().any(|d| d.key == dir.key) {
            dirs.push(dir);
        }
    }
    for dir in dirs {
        remove_temp_dir(&dir).await;
    }
}

/// Removes a sink temp dir (`.../.temp-riverbank-{token}/{sink}`) and everything in
/// it, then the job dir if that became empty. Refuses any other directory.
async fn remove_temp_dir(dir: &Resolved) {
    let parent = dir.parent_key();
    let job_dir_name = parent.rsplit('/').next().unwrap_or("");
    if !job_dir_name.starts_with(TEMP_DIR_PREFIX) {
        tracing::warn!(location = %dir.display(), "not a sink temp directory; leaving it alone");
        return;
    }
    if dir.is_local() {
        let local = dir.local_path(&dir.key);
        if let Err(e) = tokio::fs::remove_dir_all(&local).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(location = %dir.display(), error = %e, "cannot remove temp directory");
        }
        // Succeeds only once every sink of the job has cleaned up.
        let _ = tokio::fs::remove_dir(dir.local_path(&parent)).await;
        return;
    }
    let Ok(path) = dir.path() else { return };
    let listed: Result<Vec<ObjectMeta>, _> = dir.store.list(Some(&path)).try_collect().await;
    match listed {
        Ok(objects) => {
            for object in objects {
                if let Err(e) = dir.store.delete(&object.location).await {
                    tracing::warn!(location = %dir.display_path(&object.location), error = %e, "cannot delete temp file");
                }
            }
        }
        Err(e) => {
            tracing::warn!(location = %dir.display(), error = %e, "cannot list temp directory")
        }
    }
}

#[cfg(test)]
mod naming_tests {
    use super::*;

    fn naming(path: &str, template: Option<&str>, suffix: Option<&str>) -> Naming {
        let mut opts = WriteOptions::new(FileFormat::Csv, path);
        opts.shard_name_template = template.map(str::to_string);
        opts.file_name_suffix = suffix.map(str::to_string);
        Naming::new(&opts).expect("naming")
    }

    #[test]
    fn names_follow_beam() {
        let n = naming("out/zones.jsonl", None, None);
        assert_eq!(n.file_name(0, 1), "out/zones-00000-of-00001.jsonl");
        assert_eq!(n.file_name(12, 300), "out/zones-00012-of-00300.jsonl");
        assert_eq!(
            naming("out/zones.json", None, None).file_name(1, 2),
            "out/zones-00001-of-00002.json"
        );
        assert_eq!(
            naming("out/zones", None, None).file_name(0, 1),
            "out/zones-00000-of-00001"
        );
        assert_eq!(
            naming("out/zones", None, Some(".csv")).file_name(0, 1),
            "out/zones-00000-of-00001.csv"
        );
        assert_eq!(
            naming("out/z.csv", Some(""), None).file_name(0, 1),
            "out/z.csv"
        );
        assert_eq!(
            naming("out/z", Some("_SS_of_N"), Some(".txt")).file_name(3, 12),
            "out/z_03_of_12.txt"
        );
        assert_eq!(
            naming("out/.csv", None, None).file_name(0, 1),
            "out/.csv-00000-of-00001"
        );
    }

    #[test]
    fn shard_counts() {
        let n = naming("o", None, None);
        assert_eq!(n.shard_count(None, 0).expect("count"), 1);
        assert_eq!(n.shard_count(None, 4).expect("count"), 4);
        assert_eq!(n.shard_count(Some(0), 4).expect("count"), 4);
        assert_eq!(n.shard_count(Some(3), 4).expect("count"), 3);
        let single = naming("o", Some(""), None);
        assert_eq!(single.shard_count(None, 4).expect("count"), 1);
        assert!(single.shard_count(Some(2), 4).is_err());
    }

    #[test]
    fn ranges_are_contiguous_and_balanced() {
        assert_eq!(shard_ranges(5, 3), [0..2, 2..4, 4..5]);
        assert_eq!(shard_ranges(2, 3), [0..1, 1..2, 2..2]);
        assert_eq!(shard_ranges(0, 2), [0..0, 0..0]);
        assert_eq!(shard_ranges(4, 4), [0..1, 1..2, 2..3, 3..4]);
    }

    #[test]
    fn stale_glob() {
        let n = naming("out/x[1].csv", None, None);
        let glob = n.stale_name_glob().expect("glob");
        let m = globset::Glob::new(&glob).expect("glob").compile_matcher();
        assert!(m.is_match("x[1]-00000-of-00003.csv"));
        assert!(!m.is_match("x[1]-keep.csv"));
        assert!(!m.is_match("x1-00000-of-00003.csv"));
        assert!(
            naming("out/x.csv", Some(""), None)
                .stale_name_glob()
                .is_none()
        );
    }
}
