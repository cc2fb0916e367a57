//! Generate taxi data and print summary statistics plus timing, to eyeball realism.
//!
//! `cargo run --release -p riverbank-datagen --example taxi_stats -- [DAYS] [ROWS_PER_DAY] [OUT]`
//! With OUT (a directory or a `.parquet`/`.csv`/`.jsonl` file) the data is also written.

use std::collections::HashMap;
use std::time::Instant;

use arrow::array::AsArray;
use arrow::datatypes::{Float64Type, Int32Type, Int64Type, TimestampMicrosecondType};
use riverbank_datagen::{OutputFormat, TaxiOptions, taxi_batches, write_taxi};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let days = args.first().map(|s| s.parse()).transpose()?.unwrap_or(1);
    let rows = args.get(1).map(|s| s.parse()).transpose()?;
    let opts = TaxiOptions::new(days, rows, riverbank_datagen::DEFAULT_SEED);

    let t = Instant::now();
    let mut n = 0usize;
    let mut hours = [0u64; 24];
    let mut zone_count: HashMap<i32, u64> = HashMap::new();
    let mut zone_rev: HashMap<i32, f64> = HashMap::new();
    let mut payment: HashMap<i64, u64> = HashMap::new();
    let (mut dist, mut fare, mut total, mut tip, mut dur) = (0.0, 0.0, 0.0, 0.0, 0.0);
    let mut nonpos = 0u64;
    for b in taxi_batches(&opts) {
        n += b.num_rows();
        let col = |name: &str| b.column_by_name(name).unwrap().clone();
        let pu = col("tpep_pickup_datetime");
        let pu = pu.as_primitive::<TimestampMicrosecondType>().values();
        let dz = col("tpep_dropoff_datetime");
        let dz = dz.as_primitive::<TimestampMicrosecondType>().values();
        let zones = col("PULocationID");
        let zones = zones.as_primitive::<Int32Type>().values();
        let pay = col("payment_type");
        let pay = pay.as_primitive::<Int64Type>().values();
        let f = |name: &str| col(name).as_primitive::<Float64Type>().values().to_vec();
        let (d, fa, to, ti) = (
            f("trip_distance"),
            f("fare_amount"),
            f("total_amount"),
            f("tip_amount"),
        );
        for i in 0..b.num_rows() {
            hours[((pu[i] / 3_600_000_000) % 24) as usize] += 1;
            *zone_count.entry(zones[i]).or_default() += 1;
            *payment.entry(pay[i]).or_default() += 1;
            if to[i] > 0.0 {
                *zone_rev.entry(zones[i]).or_default() += to[i];
            } else {
                nonpos += 1;
            }
            dist += d[i];
            fare += fa[i];
            total += to[i];
            tip += ti[i];
            dur += (dz[i] - pu[i]) as f64 / 6e7;
        }
    }
    let gen_s = t.elapsed().as_secs_f64();
    let nf = n as f64;
    println!(
        "{n} rows generated in {gen_s:.2}s ({:.0} rows/s)",
        nf / gen_s
    );
    println!(
        "means: distance {:.2} mi, duration {:.1} min, fare ${:.2}, tip ${:.2}, total ${:.2}; non-positive totals {:.2}%",
        dist / nf,
        dur / nf,
        fare / nf,
        tip / nf,
        total / nf,
        100.0 * nonpos as f64 / nf
    );
    println!(
        "hours (per day): {:?}",
        hours.map(|h| h / u64::from(opts.days))
    );
    let mut pays: Vec<_> = payment.into_iter().collect();
    pays.sort();
    println!("payment_type: {pays:?}");
    let mut by_count: Vec<_> = zone_count.iter().map(|(z, c)| (*c, *z)).collect();
    by_count.sort_by(|a, b| b.cmp(a));
    println!(
        "distinct pickup zones: {}; top 10 by count: {:?}",
        by_count.len(),
        &by_count[..10]
    );
    let mut by_rev: Vec<_> = zone_rev.iter().map(|(z, r)| (*r as u64, *z)).collect();
    by_rev.sort_by(|a, b| b.cmp(a));
    println!("top 5 by revenue: {:?}", &by_rev[..5]);

    if let Some(out) = args.get(2) {
        let out = std::path::Path::new(out);
        let format = match out.extension().and_then(|e| e.to_str()) {
            Some(e) => e.parse()?,
            None => OutputFormat::Parquet,
        };
        let t = Instant::now();
        let s = write_taxi(&opts, format, out)?;
        println!(
            "wrote {} rows, {} files, {:.1} MB in {:.2}s",
            s.rows,
            s.files.len(),
            s.bytes as f64 / 1e6,
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
