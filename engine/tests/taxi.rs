//! The taxi example end to end, checked against an independent computation on the same rows.
mod common;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float64Type, Int32Type, TimestampMicrosecondType};
use common::{files, read_jsonl, run_with, vars};
use riverbank_datagen::{OutputFormat, TaxiOptions, taxi_batches, write_taxi};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;

const TAXI: &str = include_str!("../../examples/taxi/taxi.yaml");
const HOUR_US: i64 = 3_600_000_000;

/// What the pipeline must produce, computed directly on the generated batches.
struct Expected {
    /// PULocationID → sum of total_amount over trips with total_amount > 0.
    revenue: BTreeMap<i64, f64>,
    /// Hour start (µs since the epoch, UTC) → trips picked up in that hour.
    trips: BTreeMap<i64, u64>,
}

fn expected(opts: &TaxiOptions) -> Expected {
    let mut revenue = BTreeMap::new();
    let mut trips = BTreeMap::new();
    for b in taxi_batches(opts) {
        let zone = b
            .column_by_name("PULocationID")
            .expect("PULocationID")
            .as_primitive::<Int32Type>();
        let total = b
            .column_by_name("total_amount")
            .expect("total_amount")
            .as_primitive::<Float64Type>();
        let pickup = b
            .column_by_name("tpep_pickup_datetime")
            .expect("pickup")
            .as_primitive::<TimestampMicrosecondType>();
        for i in 0..b.num_rows() {
            if total.is_valid(i) && total.value(i) > 0.0 {
                *revenue.entry(zone.value(i) as i64).or_insert(0.0) += total.value(i);
            }
            *trips
                .entry(pickup.value(i).div_euclid(HOUR_US) * HOUR_US)
                .or_insert(0) += 1;
        }
    }
    Expected { revenue, trips }
}

fn fmt_hour(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us)
        .expect("in range")
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn check_zones(rows: &[Value], want: &Expected) {
    let mut got: BTreeMap<i64, f64> = BTreeMap::new();
    for r in rows {
        let obj = r.as_object().expect("object");
        assert_eq!(obj.len(), 2, "zone rows have exactly zone and revenue: {r}");
        let zone = r["zone"].as_i64().unwrap_or_else(|| panic!("zone in {r}"));
        let rev = r["revenue"]
            .as_f64()
            .unwrap_or_else(|| panic!("revenue in {r}"));
        assert!(got.insert(zone, rev).is_none(), "zone {zone} appears twice");
    }
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.revenue.keys().collect::<Vec<_>>(),
        "the set of zones"
    );
    for (zone, w) in &want.revenue {
        let g = got[zone];
        assert!(
            (g - w).abs() <= 1e-9 * w.abs().max(1.0),
            "zone {zone}: revenue {g} vs expected {w}"
        );
    }
}

fn check_hours(rows: &[Value], want: &Expected) {
    let mut got: BTreeMap<String, u64> = BTreeMap::new();
    for r in rows {
        let obj = r.as_object().expect("object");
        assert_eq!(
            obj.keys().collect::<Vec<_>>(),
            ["window_start", "window_end", "trips"],
            "hour rows: {r}"
        );
        let ws = r["window_start"]
            .as_str()
            .unwrap_or_else(|| panic!("window_start in {r}"))
            .to_string();
        let we = r["window_end"]
            .as_str()
            .unwrap_or_else(|| panic!("window_end in {r}"));
        let start = chrono::DateTime::parse_from_rfc3339(&ws)
            .unwrap_or_else(|e| panic!("{ws}: {e}"))
            .timestamp_micros();
        assert_eq!(ws, fmt_hour(start), "window_start is YYYY-MM-DDTHH:00:00Z");
        assert_eq!(
            we,
            fmt_hour(start + HOUR_US),
            "window_end is one hour after window_start"
        );
        assert!(
            got.insert(
                ws,
                r["trips"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("trips in {r}"))
            )
            .is_none(),
            "hour twice: {r}"
        );
    }
    let want: BTreeMap<String, u64> = want.trips.iter().map(|(h, n)| (fmt_hour(*h), *n)).collect();
    assert_eq!(got, want, "trips per hour");
}

/// Runs the taxi pipeline (with its read transform swapped for `read_type`) over `input`.
async fn run_taxi(
    read_type: &str,
    input: &str,
    out: &Path,
    partitions: usize,
    extra: Value,
) -> common::Outcome {
    let yaml = TAXI.replace("type: ReadFromParquet", &format!("type: {read_type}"));
    let mut v = vars(json!({"input": input, "output": out.to_string_lossy()}));
    v.extend(vars(extra));
    run_with(&yaml, &v, |c| c.slots = partitions)
        .await
        .unwrap_or_else(|e| panic!("taxi pipeline ({read_type}) failed: {e}"))
}

fn day(rows: u64) -> TaxiOptions {
    TaxiOptions::new(1, Some(rows), 7)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taxi_parquet_matches_an_independent_computation() {
    let opts = day(12_000);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("trips.parquet");
    write_taxi(&opts, OutputFormat::Parquet, &input).unwrap();
    let want = expected(&opts);
    let out = dir.path().join("out");
    let o = run_taxi(
        "ReadFromParquet",
        &input.to_string_lossy(),
        &out,
        2,
        json!({}),
    )
    .await;

    assert_eq!(
        files(&out, ""),
        ["hours.jsonl-00000-of-00001", "zones.jsonl-00000-of-00001"]
    );
    let zones = read_jsonl(&out, "zones");
    let hours = read_jsonl(&out, "hours");
    check_zones(&zones, &want);
    check_hours(&hours, &want);
    // The summary counts what went through each transform.
    assert_eq!(o.count("ReadTrips"), 12_000);
    assert_eq!(o.count("Stamp"), 12_000);
    assert_eq!(o.count("SumPerZone"), want.revenue.len() as u64);
    assert_eq!(o.count("WriteZones"), want.revenue.len() as u64);
    assert_eq!(o.count("WriteHours"), want.trips.len() as u64);
    let sinks: Vec<&str> = o.summary.files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(sinks, ["WriteZones", "WriteHours"]);
    // A day of trips has a few non-positive totals, so the filter must have dropped some.
    assert!(
        o.count("Valid") < 12_000 && o.count("Valid") > 11_000,
        "Valid kept {}",
        o.count("Valid")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taxi_csv_and_jsonl_give_the_same_results() {
    let opts = day(6_000);
    let want = expected(&opts);
    let dir = tempfile::tempdir().unwrap();
    for (fmt, ext, read) in [
        (OutputFormat::Csv, "csv", "ReadFromCsv"),
        (OutputFormat::Jsonl, "jsonl", "ReadFromJson"),
    ] {
        let input = dir.path().join(format!("trips.{ext}"));
        write_taxi(&opts, fmt, &input).unwrap();
        let out = dir.path().join(format!("out-{ext}"));
        let o = run_taxi(read, &input.to_string_lossy(), &out, 2, json!({})).await;
        assert_eq!(o.count("ReadTrips"), 6_000, "{read}");
        check_zones(&read_jsonl(&out, "zones"), &want);
        check_hours(&read_jsonl(&out, "hours"), &want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taxi_results_do_not_depend_on_partitions_and_shards() {
    // Three days in three files: several splits, read by 1 or 4 tasks per stage.
    let opts = TaxiOptions::new(3, Some(3_000), 11);
    let want = expected(&opts);
    let dir = tempfile::tempdir().unwrap();
    write_taxi(&opts, OutputFormat::Parquet, &dir.path().join("in")).unwrap();
    let input = format!("{}/*.parquet", dir.path().join("in").display());

    for partitions in [1, 4] {
        let out = dir.path().join(format!("out-{partitions}"));
        assert_eq!(files(&out, ""), Vec::<String>::new());
        let o = run_taxi("ReadFromParquet", &input, &out, partitions, json!({})).await;
        assert_eq!(o.count("ReadTrips"), 9_000);
        check_zones(&read_jsonl(&out, "zones"), &want);
        check_hours(&read_jsonl(&out, "hours"), &want);
    }

    // Re-run into a directory that holds a one-shard result: only the 3 new shards remain.
    let out = dir.path().join("out-1");
    assert_eq!(files(&out, "zones"), ["zones.jsonl-00000-of-00001"]);
    let o = run_taxi(
        "ReadFromParquet",
        &input,
        &out,
        2,
        json!({"zone_shards": 3}),
    )
    .await;
    let shards = files(&out, "zones");
    assert_eq!(
        shards,
        [
            "zones.jsonl-00000-of-00003",
            "zones.jsonl-00001-of-00003",
            "zones.jsonl-00002-of-00003"
        ]
    );
    let committed = &o
        .summary
        .files
        .iter()
        .find(|(n, _)| n == "WriteZones")
        .expect("WriteZones committed")
        .1;
    assert_eq!(committed.len(), 3, "{committed:?}");
    check_zones(&read_jsonl(&out, "zones"), &want);
    check_hours(&read_jsonl(&out, "hours"), &want);
    // Nothing but the final files is left behind (no temp directory).
    assert_eq!(files(&out, "").len(), 4, "{:?}", files(&out, ""));
}

/// A Sql stage's output does not depend on how many workers ran the job: with 1 or 4 worker
/// loops and a small batch size (many bundles, items finishing in varying order) the files
/// are the same to the byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_output_is_the_same_bytes_for_any_number_of_workers() {
    let opts = TaxiOptions::new(3, Some(4_000), 5);
    let dir = tempfile::tempdir().unwrap();
    write_taxi(&opts, OutputFormat::Parquet, &dir.path().join("in")).unwrap();
    let yaml = r#"
pipeline:
  transforms:
    - {type: ReadFromParquet, name: Trips, config: {path: "{{ input }}"}}
    - type: Sql
      name: PerZone
      input: Trips
      config:
        query: "SELECT PULocationID AS zone, COUNT(*) AS trips, SUM(total_amount) AS revenue, MAX(trip_distance) AS longest FROM PCOLLECTION GROUP BY PULocationID"
    - type: Sql
      name: Busy
      input: {zones: PerZone, trips: Trips}
      config:
        query: "SELECT t.PULocationID AS zone, t.total_amount, z.trips FROM trips t JOIN zones z ON t.PULocationID = z.zone WHERE z.trips > 20"
    - {type: WriteToJson, name: WriteZones, input: PerZone, config: {path: "{{ output }}/zones.jsonl"}}
    - {type: WriteToJson, name: WriteBusy, input: Busy, config: {path: "{{ output }}/busy.jsonl"}}
"#;
    let mut outputs = vec![];
    for partitions in [1, 4] {
        let out = dir.path().join(format!("out-{partitions}"));
        let v = vars(json!({
            "input": format!("{}/*.parquet", dir.path().join("in").display()),
            "output": out.to_string_lossy(),
        }));
        run_with(yaml, &v, |c| {
            c.slots = partitions;
            c.batch_size = 500;
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let bytes: Vec<(String, Vec<u8>)> = files(&out, "")
            .into_iter()
            .map(|f| (f.clone(), std::fs::read(out.join(&f)).unwrap()))
            .collect();
        assert!(
            bytes
                .iter()
                .any(|(f, b)| f.starts_with("busy") && !b.is_empty())
        );
        outputs.push(bytes);
    }
    assert!(
        outputs[0] == outputs[1],
        "Sql output differs between 1 and 4 workers"
    );
}
