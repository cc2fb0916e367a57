//! Writing generated trips to Parquet, CSV or JSON-lines files.
//!
//! Files are written under a hidden temporary name in the destination directory and
//! renamed into place, so a reader globbing `*.parquet` never sees a half-written file.
//! Days are generated and encoded on all cores; the rows do not depend on it.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;

use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::{DatagenError, GenerateSummary, OutputFormat, TaxiOptions, slices, taxi_day};

/// Rows per Parquet row group: one ~100k-row day fits in one group.
const TIMESTAMP_CSV: &str = "%Y-%m-%d %H:%M:%S";
const TIMESTAMP_JSON: &str = "%Y-%m-%dT%H:%M:%S";

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DatagenError + '_ {
    move |source| DatagenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where the output goes: a single file or one file per day in a directory.
enum Target {
    File(PathBuf),
    Dir(PathBuf),
}

/// A path whose extension names a data format is a file; anything else is a directory.
fn classify(out: &Path, format: OutputFormat) -> Result<Target, DatagenError> {
    let ext = out
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let named = match ext.as_deref() {
        Some("parquet") => Some(OutputFormat::Parquet),
        Some("csv") => Some(OutputFormat::Csv),
        Some("jsonl" | "ndjson" | "json") => Some(OutputFormat::Jsonl),
        _ => None,
    };
    match named {
        None => Ok(Target::Dir(out.to_path_buf())),
        Some(f) if f == format => Ok(Target::File(out.to_path_buf())),
        Some(f) => Err(DatagenError::InvalidOptions(format!(
            "output {} looks like a {f} file but the format is {format}",
            out.display()
        ))),
    }
}

/// Generate the trips described by `opts` and write them to `out`.
///
/// If `out` ends in `.parquet`, `.csv` or `.jsonl` all days go into that one file;
/// otherwise `out` is a directory (created if needed) receiving one
/// `yellow_tripdata_YYYY-MM-DD.<ext>` per day.
pub fn write_taxi(
    opts: &TaxiOptions,
    format: OutputFormat,
    out: &Path,
) -> Result<GenerateSummary, DatagenError> {
    opts.validate()?;
    match classify(out, format)? {
        Target::File(path) => write_single(opts, format, &path),
        Target::Dir(dir) => write_dir(opts, format, &dir),
    }
}

fn write_single(
    opts: &TaxiOptions,
    format: OutputFormat,
    path: &Path,
) -> Result<GenerateSummary, DatagenError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    // One thread generates day N+1 while this one encodes day N.
    let (tx, rx) = mpsc::sync_channel::<RecordBatch>(1);
    let step = opts.batch_rows;
    std::thread::scope(|s| {
        s.spawn(move || {
            for d in 0..opts.days {
                let Some(day) = taxi_day(opts, d) else { break };
                if tx.send(day).is_err() {
                    break; // the writer failed and hung up
                }
            }
        });
        write_atomic(
            path,
            format,
            opts.row_group_rows,
            rx.into_iter().flat_map(|b| slices(b, step)),
        )
    })?;
    Ok(GenerateSummary {
        rows: opts.total_rows(),
        bytes: file_len(path)?,
        files: vec![path.to_path_buf()],
    })
}

fn write_dir(
    opts: &TaxiOptions,
    format: OutputFormat,
    dir: &Path,
) -> Result<GenerateSummary, DatagenError> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let workers = std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(1)
        .min(opts.days as usize)
        .max(1);
    let next = AtomicU32::new(0);
    let failed = AtomicBool::new(false);
    let results: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());
    let first_error: Mutex<Option<DatagenError>> = Mutex::new(None);

    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                while !failed.load(Ordering::Relaxed) {
                    let d = next.fetch_add(1, Ordering::Relaxed);
                    let (Some(date), Some(day)) = (opts.date(d), taxi_day(opts, d)) else {
                        break;
                    };
                    let name = format!("yellow_tripdata_{date}.{}", format.extension());
                    let path = dir.join(name);
                    match write_atomic(
                        &path,
                        format,
                        opts.row_group_rows,
                        slices(day, opts.batch_rows),
                    ) {
                        Ok(()) => lock(&results).push((d, path)),
                        Err(e) => {
                            failed.store(true, Ordering::Relaxed);
                            lock(&first_error).get_or_insert(e);
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = lock(&first_error).take() {
        return Err(e);
    }
    let mut done = std::mem::take(&mut *lock(&results));
    done.sort_by_key(|(d, _)| *d);
    let files: Vec<PathBuf> = done.into_iter().map(|(_, p)| p).collect();
    let mut bytes = 0;
    for f in &files {
        bytes += file_len(f)?;
    }
    Ok(GenerateSummary {
        rows: opts.total_rows(),
        bytes,
        files,
    })
}

/// Poison-tolerant lock: a panicking worker must not turn into a second panic here.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn file_len(path: &Path) -> Result<u64, DatagenError> {
    Ok(fs::metadata(path).map_err(io_err(path))?.len())
}

/// Write `batches` to a hidden temporary file next to `path`, then rename it over
/// `path`. The temporary file is removed on failure.
fn write_atomic(
    path: &Path,
    format: OutputFormat,
    row_group_rows: usize,
    batches: impl Iterator<Item = RecordBatch>,
) -> Result<(), DatagenError> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = File::create(&tmp)
        .map_err(io_err(&tmp))
        .and_then(|file| encode(file, &tmp, format, row_group_rows, batches))
        .and_then(|()| fs::rename(&tmp, path).map_err(io_err(path)));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn encode(
    file: File,
    path: &Path,
    format: OutputFormat,
    row_group_rows: usize,
    batches: impl Iterator<Item = RecordBatch>,
) -> Result<(), DatagenError> {
    let schema = crate::taxi_schema();
    // Text writers emit their header on the first batch, so an empty data set still
    // gets one empty batch and thus a header.
    let mut batches = batches.peekable();
    let empty = batches
        .peek()
        .is_none()
        .then(|| RecordBatch::new_empty(schema.clone()));
    let batches = batches.chain(empty);
    match format {
        OutputFormat::Parquet => {
            let props = WriterProperties::builder()
                .set_compression(Compression::SNAPPY)
                .set_max_row_group_row_count(Some(row_group_rows.max(1)))
                .build();
            let mut w = ArrowWriter::try_new(BufWriter::new(file), schema, Some(props))?;
            for b in batches {
                w.write(&b)?;
            }
            let mut inner = w.into_inner()?;
            inner.flush().map_err(io_err(path))?;
        }
        OutputFormat::Csv => {
            let mut w = arrow::csv::WriterBuilder::new()
                .with_header(true)
                .with_timestamp_format(TIMESTAMP_CSV.to_string())
                .build(BufWriter::new(file));
            for b in batches {
                w.write(&b)?;
            }
            w.into_inner().flush().map_err(io_err(path))?;
        }
        OutputFormat::Jsonl => {
            let mut w = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .with_timestamp_format(TIMESTAMP_JSON.to_string())
                .build::<_, arrow::json::writer::LineDelimited>(BufWriter::new(file));
            for b in batches {
                w.write(&b)?;
            }
            w.finish()?;
            w.into_inner().flush().map_err(io_err(path))?;
        }
    }
    Ok(())
}
