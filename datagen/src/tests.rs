use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::OnceLock;

use arrow::array::{Array, AsArray};
use arrow::compute::concat_batches;
use arrow::datatypes::{
    DataType, Float64Type, Int32Type, Int64Type, TimeUnit, TimestampMicrosecondType,
};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::*;

fn opts(days: u32, rows: u64) -> TaxiOptions {
    TaxiOptions::new(days, Some(rows), DEFAULT_SEED)
}

fn all(o: &TaxiOptions) -> RecordBatch {
    let batches: Vec<RecordBatch> = taxi_batches(o).collect();
    concat_batches(&taxi_schema(), &batches).unwrap()
}

fn i32s(b: &RecordBatch, name: &str) -> Vec<i32> {
    b.column_by_name(name)
        .unwrap()
        .as_primitive::<Int32Type>()
        .values()
        .to_vec()
}

fn i64s(b: &RecordBatch, name: &str) -> Vec<i64> {
    b.column_by_name(name)
        .unwrap()
        .as_primitive::<Int64Type>()
        .values()
        .to_vec()
}

fn f64s(b: &RecordBatch, name: &str) -> Vec<f64> {
    b.column_by_name(name)
        .unwrap()
        .as_primitive::<Float64Type>()
        .values()
        .to_vec()
}

fn micros(b: &RecordBatch, name: &str) -> Vec<i64> {
    b.column_by_name(name)
        .unwrap()
        .as_primitive::<TimestampMicrosecondType>()
        .values()
        .to_vec()
}

/// Shared sample for the statistical tests: one full default-sized weekday.
fn jan15() -> &'static RecordBatch {
    static DAY: OnceLock<RecordBatch> = OnceLock::new();
    DAY.get_or_init(|| all(&TaxiOptions::default()))
}
#[test]
fn options_defaults() {
    let d = TaxiOptions::default();
    assert_eq!(d.days, 1);
    assert_eq!(d.rows_per_day, 77_000);
    assert_eq!(d.seed, 2024);
    assert_eq!(d.batch_rows, 65_536);
    assert_eq!(d.start, NaiveDate::from_ymd_opt(2024, 1, 15).unwrap());
    let m = TaxiOptions::new(31, None, 7);
    assert_eq!(m.start, NaiveDate::from_ymd_opt(2024, 1, 1).unwrap());
    assert_eq!(m.total_rows(), 31 * 77_000);
    let err = TaxiOptions::new(0, None, 1).validate().unwrap_err();
    assert!(
        matches!(&err, DatagenError::InvalidOptions(m) if m == "days must be at least 1"),
        "{err}"
    );
}

#[test]
fn format_parse_and_display() {
    for f in [
        OutputFormat::Parquet,
        OutputFormat::Csv,
        OutputFormat::Jsonl,
    ] {
        assert_eq!(f.to_string().parse::<OutputFormat>().unwrap(), f);
    }
    assert_eq!("CSV".parse::<OutputFormat>().unwrap(), OutputFormat::Csv);
    assert!(matches!(
        "xml".parse::<OutputFormat>(),
        Err(DatagenError::UnknownFormat(_))
    ));
}

#[test]
fn schema_matches_tlc_2024() {
    let s = taxi_schema();
    let expected = [
        ("VendorID", DataType::Int32),
        (
            "tpep_pickup_datetime",
            DataType::Timestamp(TimeUnit::Microsecond, None),
        ),
        (
            "tpep_dropoff_datetime",
            DataType::Timestamp(TimeUnit::Microsecond, None),
        ),
        ("passenger_count", DataType::Int64),
        ("trip_distance", DataType::Float64),
        ("RatecodeID", DataType::Int64),
        ("store_and_fwd_flag", DataType::Utf8),
        ("PULocationID", DataType::Int32),
        ("DOLocationID", DataType::Int32),
        ("payment_type", DataType::Int64),
        ("fare_amount", DataType::Float64),
        ("extra", DataType::Float64),
        ("mta_tax", DataType::Float64),
        ("tip_amount", DataType::Float64),
        ("tolls_amount", DataType::Float64),
        ("improvement_surcharge", DataType::Float64),
        ("total_amount", DataType::Float64),
        ("congestion_surcharge", DataType::Float64),
        ("Airport_fee", DataType::Float64),
    ];
    assert_eq!(s.fields().len(), expected.len());
    for (f, (name, dt)) in s.fields().iter().zip(expected) {
        assert_eq!(f.name(), name);
        assert_eq!(f.data_type(), &dt, "{name}");
    }
    assert_eq!(jan15().schema(), s);
}

#[test]
fn deterministic_and_independent_of_batch_size() {
    let mut a = opts(2, 3_000);
    let first = all(&a);
    assert_eq!(first, all(&a));
    a.batch_rows = 977;
    assert!(taxi_batches(&a).all(|b| b.num_rows() <= 977));
    assert_eq!(first, all(&a));
    let other_seed = TaxiOptions {
        seed: 1,
        ..a.clone()
    };
    assert_ne!(first, all(&other_seed));
}

#[test]
fn a_date_is_the_same_alone_or_in_a_month() {
    let month = TaxiOptions::new(31, Some(2_000), DEFAULT_SEED);
    let single = TaxiOptions::new(1, Some(2_000), DEFAULT_SEED);
    assert_eq!(taxi_day(&month, 14), taxi_day(&single, 0));
    assert!(taxi_day(&month, 31).is_none());
}

#[test]
fn row_count_is_exact() {
    let o = TaxiOptions {
        batch_rows: 1_000,
        ..opts(3, 2_500)
    };
    let batches: Vec<_> = taxi_batches(&o).collect();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 7_500);
    // Batches never span days: 3 per day (1000, 1000, 500).
    assert_eq!(batches.len(), 9);
    assert_eq!(jan15().num_rows(), 77_000);
}

#[test]
fn timestamps_are_whole_seconds_within_the_day() {
    let b = jan15();
    let day0 = NaiveDate::from_ymd_opt(2024, 1, 15)
        .unwrap()
        .and_hms_opt(0, 0, 0)
        .unwrap()
        .and_utc()
        .timestamp_micros();
    let pu = micros(b, "tpep_pickup_datetime");
    let dz = micros(b, "tpep_dropoff_datetime");
    let dist = f64s(b, "trip_distance");
    for i in 0..pu.len() {
        assert!(pu[i] >= day0 && pu[i] < day0 + 86_400_000_000);
        assert_eq!(pu[i] % 1_000_000, 0);
        assert!(dz[i] > pu[i]);
        if i > 0 {
            assert!(pu[i] >= pu[i - 1], "sorted by pickup");
        }
        // Long trips take long: at most ~60 mph on average.
        let hours = (dz[i] - pu[i]) as f64 / 3.6e9;
        assert!(dist[i] <= 60.0 * hours + 0.5, "row {i}: {} mi", dist[i]);
    }
}

#[test]
fn hourly_curve_has_night_trough_and_evening_peak() {
    let mut per_hour = [0usize; 24];
    for t in micros(jan15(), "tpep_pickup_datetime") {
        per_hour[((t / 3_600_000_000) % 24) as usize] += 1;
    }
    assert!(per_hour[4] < per_hour[18] / 5, "{per_hour:?}");
    assert!(per_hour[4] < per_hour[0]);
    assert!(per_hour[6] > per_hour[4]);
    let peak = (0..24).max_by_key(|&h| per_hour[h]).unwrap();
    assert!((17..=19).contains(&peak), "peak at {peak}: {per_hour:?}");
}

#[test]
fn about_one_percent_non_positive_totals() {
    let totals = f64s(jan15(), "total_amount");
    let bad = totals.iter().filter(|&&t| t <= 0.0).count() as f64 / totals.len() as f64;
    assert!((0.005..=0.02).contains(&bad), "{bad}");
    assert!(totals.contains(&0.0));
    assert!(totals.iter().any(|&t| t < 0.0));
}

#[test]
fn total_is_the_sum_of_the_parts() {
    let b = jan15();
    let parts = [
        "fare_amount",
        "extra",
        "mta_tax",
        "tip_amount",
        "tolls_amount",
        "improvement_surcharge",
        "congestion_surcharge",
        "Airport_fee",
    ]
    .map(|n| f64s(b, n));
    for (i, t) in f64s(b, "total_amount").iter().enumerate() {
        let sum: f64 = parts.iter().map(|p| p[i]).sum();
        assert!((sum - t).abs() < 1e-6, "row {i}: {sum} != {t}");
    }
}

#[test]
fn fares_follow_the_meter() {
    let b = jan15();
    let (fare, dist, rate) = (
        f64s(b, "fare_amount"),
        f64s(b, "trip_distance"),
        i64s(b, "RatecodeID"),
    );
    let (pu, dz) = (
        micros(b, "tpep_pickup_datetime"),
        micros(b, "tpep_dropoff_datetime"),
    );
    let rate_valid = b.column_by_name("RatecodeID").unwrap().nulls().cloned();
    let mut checked = 0;
    for i in 0..fare.len() {
        let known = rate_valid.as_ref().is_none_or(|n| n.is_valid(i));
        if known && rate[i] == 1 && fare[i] > 0.0 {
            let minutes = (dz[i] - pu[i]) as f64 / 6e7;
            let expect = 3.0 + 2.8 * dist[i] + 0.35 * minutes;
            assert!((fare[i] - expect).abs() <= 0.36, "row {i}");
            checked += 1;
        }
    }
    assert!(checked > 60_000);
}

#[test]
fn zone_skew_and_airport_revenue() {
    let b = jan15();
    let (zones, totals) = (i32s(b, "PULocationID"), f64s(b, "total_amount"));
    let mut count: HashMap<i32, usize> = HashMap::new();
    let mut revenue: HashMap<i32, f64> = HashMap::new();
    for (&z, &t) in zones.iter().zip(&totals) {
        assert!((1..=263).contains(&z));
        *count.entry(z).or_default() += 1;
        if t > 0.0 {
            *revenue.entry(z).or_default() += t;
        }
    }
    let mut by_count: Vec<_> = count.iter().map(|(&z, &c)| (c, z)).collect();
    by_count.sort_unstable_by(|a, b| b.cmp(a));
    let mut top5: Vec<i32> = by_count[..5].iter().map(|&(_, z)| z).collect();
    top5.sort_unstable();
    assert_eq!(top5, vec![132, 138, 161, 236, 237], "{by_count:?}");
    assert!((200..=260).contains(&count.len()), "{} zones", count.len());

    let mut by_rev: Vec<_> = revenue.iter().map(|(&z, &r)| (r, z)).collect();
    by_rev.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
    assert_eq!(by_rev[0].1, 132);
    // Real January 2024: JFK ~1.8x LaGuardia, ~3x Midtown Center.
    assert!(by_rev[0].0 > 1.5 * by_rev[1].0, "{:?}", &by_rev[..3]);

    let dropoffs: std::collections::HashSet<i32> = i32s(b, "DOLocationID").into_iter().collect();
    assert!(dropoffs.len() >= 200 && dropoffs.iter().all(|z| (1..=263).contains(z)));
}

#[test]
fn tips_mostly_on_cards_and_few_nulls() {
    let b = jan15();
    let (tips, pay) = (f64s(b, "tip_amount"), i64s(b, "payment_type"));
    let total: f64 = tips.iter().sum();
    let card: f64 = tips
        .iter()
        .zip(&pay)
        .filter(|(_, p)| **p == 1)
        .map(|(t, _)| t)
        .sum();
    assert!(card / total > 0.9);
    assert!(
        tips.iter().zip(&pay).all(|(t, p)| *p != 2 || *t == 0.0),
        "no cash tips"
    );
    for name in [
        "passenger_count",
        "RatecodeID",
        "store_and_fwd_flag",
        "congestion_surcharge",
        "Airport_fee",
    ] {
        let nulls = b.column_by_name(name).unwrap().null_count() as f64 / b.num_rows() as f64;
        assert!((0.01..0.08).contains(&nulls), "{name}: {nulls}");
    }
    let flags = b
        .column_by_name("store_and_fwd_flag")
        .unwrap()
        .as_string::<i32>();
    assert!(flags.iter().flatten().all(|f| f == "N" || f == "Y"));
}

fn read_parquet(path: &Path) -> usize {
    let file = File::open(path).unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    reader.map(|b| b.unwrap().num_rows()).sum()
}

#[test]
fn writes_readable_files_in_all_formats() {
    let tmp = tempfile::tempdir().unwrap();
    let o = TaxiOptions {
        batch_rows: 700,
        ..opts(2, 1_500)
    };

    // Directory mode: one file per day, named by date.
    let s = write_taxi(&o, OutputFormat::Parquet, &tmp.path().join("pq")).unwrap();
    assert_eq!(s.rows, 3_000);
    let names: Vec<_> = s
        .files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "yellow_tripdata_2024-01-01.parquet",
            "yellow_tripdata_2024-01-02.parquet"
        ]
    );
    assert_eq!(
        s.files.iter().map(|f| read_parquet(f)).sum::<usize>(),
        3_000
    );
    assert_eq!(
        s.bytes,
        s.files
            .iter()
            .map(|f| f.metadata().unwrap().len())
            .sum::<u64>()
    );
    // No temporary files left behind.
    assert_eq!(std::fs::read_dir(tmp.path().join("pq")).unwrap().count(), 2);

    // Rows read back equal the generated ones (threads do not change data).
    let file = File::open(&s.files[1]).unwrap();
    let back: Vec<_> = ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    let back = concat_batches(&taxi_schema(), &back).unwrap();
    assert_eq!(back, taxi_day(&o, 1).unwrap());

    // Single-file mode for each format.
    let pq = tmp.path().join("one/all.parquet");
    write_taxi(&o, OutputFormat::Parquet, &pq).unwrap();
    assert_eq!(read_parquet(&pq), 3_000);

    let csv = tmp.path().join("all.csv");
    let s = write_taxi(&o, OutputFormat::Csv, &csv).unwrap();
    assert_eq!(s.files, vec![csv.clone()]);
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert!(
        lines
            .next()
            .unwrap()
            .starts_with("VendorID,tpep_pickup_datetime,")
    );
    let first = lines.next().unwrap();
    assert!(first.contains(",2024-01-01 00:"), "{first}");
    let reader = arrow::csv::ReaderBuilder::new(taxi_schema())
        .with_header(true)
        .build(File::open(&csv).unwrap())
        .unwrap();
    assert_eq!(reader.map(|b| b.unwrap().num_rows()).sum::<usize>(), 3_000);

    let jsonl = tmp.path().join("all.jsonl");
    write_taxi(&o, OutputFormat::Jsonl, &jsonl).unwrap();
    let text = std::fs::read_to_string(&jsonl).unwrap();
    assert!(
        text.lines()
            .next()
            .unwrap()
            .contains(r#""tpep_pickup_datetime":"2024-01-01T00:"#)
    );
    let reader = arrow::json::ReaderBuilder::new(taxi_schema())
        .build(BufReader::new(File::open(&jsonl).unwrap()))
        .unwrap();
    assert_eq!(reader.map(|b| b.unwrap().num_rows()).sum::<usize>(), 3_000);
}

#[test]
fn write_errors_are_reported_not_panicked() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(1, 100);
    // Extension contradicts the format.
    assert!(matches!(
        write_taxi(&o, OutputFormat::Csv, &tmp.path().join("x.parquet")),
        Err(DatagenError::InvalidOptions(_))
    ));
    // A directory cannot be created below a regular file.
    let blocker = tmp.path().join("file");
    std::fs::write(&blocker, b"x").unwrap();
    let err = write_taxi(&o, OutputFormat::Parquet, &blocker.join("dir")).unwrap_err();
    assert!(matches!(err, DatagenError::Io { .. }), "{err}");
    let err = write_taxi(&o, OutputFormat::Csv, &blocker.join("a.csv")).unwrap_err();
    assert!(matches!(err, DatagenError::Io { .. }), "{err}");
    let err = write_taxi(
        &TaxiOptions { batch_rows: 0, ..o },
        OutputFormat::Csv,
        tmp.path(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, DatagenError::InvalidOptions(m) if m == "batch_rows must be at least 1"),
        "{err}"
    );
}

/// Release-mode timing of the full benchmark month; run with
/// `cargo test --release -p riverbank-datagen -- --ignored --nocapture`.
#[test]
#[ignore]
fn time_31_days() {
    let tmp = tempfile::tempdir().unwrap();
    let o = TaxiOptions::new(31, Some(95_500), DEFAULT_SEED);
    let t = std::time::Instant::now();
    let n: usize = taxi_batches(&o).map(|b| b.num_rows()).sum();
    let gen_s = t.elapsed().as_secs_f64();
    for f in [
        OutputFormat::Parquet,
        OutputFormat::Csv,
        OutputFormat::Jsonl,
    ] {
        let t = std::time::Instant::now();
        let s = write_taxi(&o, f, &tmp.path().join(f.extension())).unwrap();
        eprintln!(
            "{f}: {} rows, {:.1} MB, {:.2}s",
            s.rows,
            s.bytes as f64 / 1e6,
            t.elapsed().as_secs_f64()
        );
    }
    eprintln!("generate only: {n} rows in {gen_s:.2}s");
}
