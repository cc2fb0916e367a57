//! Deterministic synthetic data sets for Riverbank's examples, tests and benchmarks.
//!
//! The main data set is New York yellow-taxi trips shaped like the TLC 2024 trip
//! records: same columns and Arrow types, a realistic hourly demand curve, zone skew
//! (Midtown, Upper East Side, JFK, LaGuardia), fares that follow the tariff, tips mostly
//! on card payments and about 1% refunds/voids with non-positive totals.
//!
//! Output depends only on `(seed, start, days, rows_per_day)`: not on batch size, thread
//! count or platform, so tests and benchmarks on different machines see the same rows.
//!
//! For streaming: `synthetic` (an endless keyed stream with a key distribution and event-time
//! skew) and `nexmark` (the Nexmark benchmark's people, auctions and bids), both addressable by
//! sequence number so a source can rewind to a checkpoint and replay exactly.

pub mod nexmark;
mod rng;
pub mod synthetic;
mod taxi;
mod write;
mod zones;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use arrow::record_batch::RecordBatch;
use chrono::NaiveDate;

pub use taxi::taxi_schema;
pub use write::write_taxi;

/// Rows per day by default: close to the 77,033 trips of Monday 2024-01-15.
pub const DEFAULT_ROWS_PER_DAY: u64 = 77_000;
/// Default RNG seed.
pub const DEFAULT_SEED: u64 = 2024;
/// Default Arrow batch size (rows).
pub const DEFAULT_BATCH_ROWS: usize = 65_536;
/// Rows per Parquet row group unless asked otherwise.
pub const DEFAULT_ROW_GROUP_ROWS: usize = 128 * 1024;

/// What to generate. Every day has exactly `rows_per_day` rows (predictable counts
/// matter more to tests than weekday volume variation; weekends differ in shape only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaxiOptions {
    /// Number of consecutive calendar days, starting at `start`.
    pub days: u32,
    /// Trips per day, exactly.
    pub rows_per_day: u64,
    /// RNG seed; each day's stream is derived from it and the calendar date.
    pub seed: u64,
    /// First day.
    pub start: NaiveDate,
    /// Maximum rows per emitted batch; does not affect the rows themselves.
    pub batch_rows: usize,
    /// Rows per Parquet row group (the unit of splitting and of dynamic rebalancing).
    pub row_group_rows: usize,
}

impl TaxiOptions {
    /// Options with the conventional start date: a single day is 2024-01-15 (a day we
    /// have real hourly counts for), several days start on 2024-01-01 (a month).
    pub fn new(days: u32, rows_per_day: Option<u64>, seed: u64) -> Self {
        let start = if days <= 1 {
            NaiveDate::from_ymd_opt(2024, 1, 15)
        } else {
            NaiveDate::from_ymd_opt(2024, 1, 1)
        }
        .unwrap_or_default();
        TaxiOptions {
            days,
            rows_per_day: rows_per_day.unwrap_or(DEFAULT_ROWS_PER_DAY),
            seed,
            start,
            batch_rows: DEFAULT_BATCH_ROWS,
            row_group_rows: DEFAULT_ROW_GROUP_ROWS,
        }
    }

    /// Total number of rows these options produce.
    pub fn total_rows(&self) -> u64 {
        u64::from(self.days) * self.rows_per_day
    }

    /// The calendar date of day `index` (0-based), if representable.
    pub fn date(&self, index: u32) -> Option<NaiveDate> {
        self.start
            .checked_add_days(chrono::Days::new(u64::from(index)))
    }

    /// Reject options that cannot be honoured, before any file is touched.
    pub fn validate(&self) -> Result<(), DatagenError> {
        if self.days == 0 {
            return Err(DatagenError::InvalidOptions(
                "days must be at least 1".into(),
            ));
        }
        if self.batch_rows == 0 {
            return Err(DatagenError::InvalidOptions(
                "batch_rows must be at least 1".into(),
            ));
        }
        if usize::try_from(self.rows_per_day).is_err() || self.rows_per_day > u64::from(u32::MAX) {
            return Err(DatagenError::InvalidOptions(format!(
                "rows_per_day {} is too large",
                self.rows_per_day
            )));
        }
        if self.date(self.days - 1).is_none() {
            return Err(DatagenError::InvalidOptions(
                "date range out of bounds".into(),
            ));
        }
        Ok(())
    }
}

impl Default for TaxiOptions {
    fn default() -> Self {
        TaxiOptions::new(1, None, DEFAULT_SEED)
    }
}

/// File format for [`write_taxi`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutputFormat {
    /// Apache Parquet, snappy-compressed (what the TLC publishes).
    Parquet,
    /// CSV with a header row; timestamps as `2024-01-15 08:12:33`.
    Csv,
    /// Newline-delimited JSON; timestamps as ISO-8601 strings, nulls explicit.
    Jsonl,
}

impl OutputFormat {
    /// File extension without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            OutputFormat::Parquet => "parquet",
            OutputFormat::Csv => "csv",
            OutputFormat::Jsonl => "jsonl",
        }
    }
}

impl FromStr for OutputFormat {
    type Err = DatagenError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "parquet" => Ok(OutputFormat::Parquet),
            "csv" => Ok(OutputFormat::Csv),
            "jsonl" => Ok(OutputFormat::Jsonl),
            _ => Err(DatagenError::UnknownFormat(s.to_string())),
        }
    }
}

impl fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.extension())
    }
}

/// What [`write_taxi`] produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenerateSummary {
    /// Rows written over all files.
    pub rows: u64,
    /// Bytes on disk over all files.
    pub bytes: u64,
    /// Files written, in date order.
    pub files: Vec<PathBuf>,
}

/// Errors from generating or writing data.
#[derive(thiserror::Error, Debug)]
pub enum DatagenError {
    /// Options that cannot be honoured (zero days, zero batch size, ...).
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// A format name other than parquet, csv or jsonl.
    #[error("unknown output format {0:?} (expected parquet, csv or jsonl)")]
    UnknownFormat(String),
    /// File-system failure, with the path involved.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory being accessed.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// CSV/JSON encoding failure.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// Parquet encoding failure.
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
}

/// The rows of day `index` (0-based) as one batch, sorted by pickup time.
/// Returns `None` past the end of the range.
pub fn taxi_day(opts: &TaxiOptions, index: u32) -> Option<RecordBatch> {
    if index >= opts.days {
        return None;
    }
    let rows = usize::try_from(opts.rows_per_day).ok()?;
    Some(taxi::generate_day(opts.seed, opts.date(index)?, rows))
}

/// All rows, day by day, in batches of at most `batch_rows` (a batch never spans two
/// days). Days are generated lazily, so memory stays at about one day.
pub fn taxi_batches(opts: &TaxiOptions) -> impl Iterator<Item = RecordBatch> + use<> {
    let opts = opts.clone();
    let step = opts.batch_rows.max(1);
    (0..opts.days)
        .map_while(move |d| taxi_day(&opts, d))
        .flat_map(move |day| slices(day, step))
}

/// Zero-copy slices of `batch` of at most `step` rows.
pub(crate) fn slices(batch: RecordBatch, step: usize) -> impl Iterator<Item = RecordBatch> {
    let n = batch.num_rows();
    (0..n)
        .step_by(step)
        .map(move |off| batch.slice(off, step.min(n - off)))
}

#[cfg(test)]
mod tests;
