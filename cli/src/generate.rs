//! `riverbank generate`: deterministic synthetic data sets for examples, tests and benchmarks.
use anyhow::{Context, Result};
use clap::Subcommand;
use riverbank_datagen::{OutputFormat, TaxiOptions, write_taxi};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Subcommand)]
pub enum Dataset {
    /// New York yellow-taxi trips with the TLC 2024 columns (default: one day like 15 Jan 2024).
    Taxi {
        /// Days of trips; one day is 2024-01-15, more start on 2024-01-01.
        #[arg(long, default_value_t = 1)]
        days: u32,
        /// Trips per day (default about 77,000, as on 15 January 2024).
        #[arg(long)]
        rows_per_day: Option<u64>,
        #[arg(long, default_value_t = 2024)]
        seed: u64,
        #[arg(long, default_value = "parquet")]
        format: OutputFormat,
        /// Rows per Parquet row group (smaller: more splits, as in a larger file).
        #[arg(long, default_value_t = riverbank_datagen::DEFAULT_ROW_GROUP_ROWS)]
        row_group_rows: usize,
        /// A file (ending in .parquet, .csv or .jsonl) or a directory for one file per day.
        #[arg(long)]
        out: PathBuf,
    },
}

pub fn run(d: Dataset) -> Result<()> {
    match d {
        Dataset::Taxi {
            days,
            rows_per_day,
            seed,
            format,
            row_group_rows,
            out,
        } => {
            let mut opts = TaxiOptions::new(days, rows_per_day, seed);
            opts.row_group_rows = row_group_rows;
            let start = Instant::now();
            let s = write_taxi(&opts, format, &out)
                .with_context(|| format!("generating taxi trips into {}", out.display()))?;
            eprintln!(
                "wrote {} rows ({} bytes) in {} file(s) under {} in {:.2}s",
                s.rows,
                s.bytes,
                s.files.len(),
                out.display(),
                start.elapsed().as_secs_f64()
            );
            Ok(())
        }
    }
}
