//! Beam YAML's `PyTransform` as one stage of a pipeline the Arrow engine runs: the engine asks
//! Beam's Python SDK (apache-beam 2.77 from `dev/setup.sh`'s venv) for the PTransform's output
//! schema when it compiles, and at its stage hands the gathered inputs to a job server in the
//! riverbank process, whose portable runner runs the PTransform on an SDK harness. The
//! transforms around it (Sql here, which Beam's Python SDK cannot run without Java) are the
//! engine's own.
use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::beam_python;

fn riverbank(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_riverbank"))
        .args(args)
        .env("RIVERBANK_BEAM_PYTHON", beam_python())
        .current_dir(dir)
        .output()
        .expect("run riverbank")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The JSON lines of every file under `dir` starting with `prefix`, sorted, each as
/// serde_json writes its value.
fn lines(dir: &Path, prefix: &str) -> Vec<String> {
    let mut all: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .flat_map(|p| {
            let t = std::fs::read_to_string(p).unwrap();
            t.lines()
                .map(|l| {
                    serde_json::from_str::<serde_json::Value>(l)
                        .unwrap()
                        .to_string()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    all.sort();
    all
}

const RIDES: &str = "
    - type: Create
      name: Rides
      config:
        elements:
          - {zone: a, fare: 3.5}
          - {zone: b, fare: 10.0}
          - {zone: a, fare: 4.0}
          - {zone: c, fare: 1.0}";

#[test]
fn a_py_transform_is_a_stage_between_the_engines_own_in_process_and_on_workers() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = format!(
        "pipeline:
  transforms:{RIDES}
    - type: PyTransform
      name: Tip
      input: Rides
      config:
        constructor: __callable__
        kwargs:
          rate: 0.5
          source: |
            def tip(pcoll, rate):
              import apache_beam as beam
              return pcoll | beam.Map(
                  lambda r: beam.Row(zone=str(r.zone), tip=float(r.fare) * rate))
    - type: Sql
      name: PerZone
      input: Tip
      config:
        query: SELECT zone, SUM(tip) AS tips, COUNT(*) AS n FROM PCOLLECTION GROUP BY zone
    - type: WriteToJson
      input: PerZone
      config:
        path: out/zones
"
    );
    std::fs::write(dir.path().join("p.yaml"), pipeline).unwrap();
    let want = [
        r#"{"zone":"a","tips":3.75,"n":2}"#,
        r#"{"zone":"b","tips":5.0,"n":1}"#,
        r#"{"zone":"c","tips":0.5,"n":1}"#,
    ];
    let out = riverbank(dir.path(), &["run", "p.yaml"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(lines(&dir.path().join("out"), "zones"), want);
    // The stage ran on Riverbank's portable runner: its stages' lines are the SDK's.
    assert!(
        text(&out.stderr).contains("Read input"),
        "{}",
        text(&out.stderr)
    );

    // The same on two worker processes, each compiling the plan with the SDK.
    std::fs::remove_dir_all(dir.path().join("out")).unwrap();
    let out = riverbank(dir.path(), &["run", "p.yaml", "--workers", "2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(lines(&dir.path().join("out"), "zones"), want);
}

#[test]
fn inputs_by_tag_side_inputs_and_untyped_fields_reach_beam_and_come_back() {
    let dir = tempfile::tempdir().unwrap();
    // Two tagged inputs, one a side input of the other's Map; the output's fields are typed Any
    // by Beam (a lambda's result), and written as the values themselves.
    let pipeline = format!(
        "pipeline:
  transforms:{RIDES}
    - type: Create
      name: Zones
      config:
        elements:
          - {{zone: a, name: Airport}}
          - {{zone: b, name: Bronx}}
    - type: PyTransform
      name: Named
      input: {{rides: Rides, zones: Zones}}
      config:
        constructor: __callable__
        kwargs:
          source: |
            def named(inputs):
              import apache_beam as beam
              names = inputs['zones'] | beam.Map(lambda z: (z.zone, z.name))
              return inputs['rides'] | beam.Map(
                  lambda r, names: beam.Row(name=names.get(r.zone), twice=r.fare * 2),
                  names=beam.pvalue.AsDict(names))
    - type: WriteToJson
      input: Named
      config:
        path: out/named
"
    );
    std::fs::write(dir.path().join("p.yaml"), pipeline).unwrap();
    let out = riverbank(dir.path(), &["run", "p.yaml"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        lines(&dir.path().join("out"), "named"),
        [
            r#"{"name":"Airport","twice":7.0}"#,
            r#"{"name":"Airport","twice":8.0}"#,
            r#"{"name":"Bronx","twice":20.0}"#,
            r#"{"name":null,"twice":2.0}"#,
        ]
    );
}

#[test]
fn a_py_transform_that_cannot_be_built_or_fails_names_itself() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = |constructor: &str, source: &str| {
        format!(
            "pipeline:
  transforms:{RIDES}
    - type: PyTransform
      name: Broken
      input: Rides
      config:
        constructor: {constructor}
        kwargs:
          source: |
            {source}
    - type: WriteToJson
      input: Broken
      config:
        path: out/x
"
        )
    };
    // Not found when Beam builds it: refused at compile time, before anything runs.
    let p = pipeline("no_such_module.Transform", "unused");
    std::fs::write(dir.path().join("p.yaml"), p).unwrap();
    let out = riverbank(dir.path(), &["validate", "p.yaml"]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("'Broken'") && err.contains("no_such_module"),
        "{err}"
    );

    // Failing on its rows: the job fails naming it and the user's exception; no output.
    let p = pipeline(
        "__callable__",
        "def f(pcoll):\n              import apache_beam as beam\n              return pcoll | beam.Map(lambda r: beam.Row(x=1 // int(r.fare < 2)))",
    );
    std::fs::write(dir.path().join("p.yaml"), p).unwrap();
    let out = riverbank(dir.path(), &["run", "p.yaml"]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("'Broken'") && err.contains("ZeroDivisionError"),
        "{err}"
    );
    assert!(!dir.path().join("out").exists() || lines(&dir.path().join("out"), "x").is_empty());
}

const EVENTS: &str = "
    - type: Create
      name: Events
      config:
        elements:
          - {user: a, t: 10}
          - {user: a, t: 20}
          - {user: b, t: 70}
          - {user: a, t: 130}
          - {user: a, t: 400}
    - type: AssignTimestamps
      name: Stamped
      input: Events
      config:
        language: python
        timestamp: t";

/// `EVENTS`, then `middle` (transforms reading `Stamped`, the last named `Py`), then a count per
/// user and window with the window's bounds, written to `out/counts`.
fn windowed(middle: &str) -> String {
    format!(
        "pipeline:
  transforms:{EVENTS}{middle}
    - type: Combine
      name: Counts
      input: Py
      config:
        group_by: [user]
        combine:
          n: {{value: t, fn: count}}
    - type: ExtractWindowingInfo
      name: Bounds
      input: Counts
      config:
        fields: {{start: window_start, end: window_end}}
    - type: MapToFields
      name: Seconds
      input: Bounds
      config:
        language: python
        fields:
          user: user
          n: n
          window: \"f'{{start.micros // 1000000}}-{{end.micros // 1000000}}'\"
    - type: WriteToJson
      input: Seconds
      config:
        path: out/counts
"
    )
}

/// Runs `pipeline` in `dir` (its last output gone first): the lines of `out/counts*`.
fn counts(dir: &Path, pipeline: &str) -> Vec<String> {
    let out = dir.join("out");
    if out.exists() {
        std::fs::remove_dir_all(&out).unwrap();
    }
    std::fs::write(dir.join("p.yaml"), pipeline).unwrap();
    let run = riverbank(dir, &["run", "p.yaml"]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    lines(&out, "counts")
}

#[test]
fn elements_go_to_beam_in_their_windows_and_come_back_in_beams() {
    let dir = tempfile::tempdir().unwrap();
    // Windowed before: Beam keeps each element's minute, the Combine after counts per minute.
    let before = "
    - type: WindowInto
      name: Minutes
      input: Stamped
      config:
        windowing: {type: fixed, size: 60s}
    - type: PyTransform
      name: Py
      input: Minutes
      config:
        constructor: __callable__
        kwargs:
          source: |
            def f(pcoll):
              import apache_beam as beam
              return pcoll | beam.Map(lambda r: beam.Row(user=str(r.user), t=int(r.t)))";
    assert_eq!(
        counts(dir.path(), &windowed(before)),
        [
            r#"{"user":"a","n":1,"window":"120-180"}"#,
            r#"{"user":"a","n":1,"window":"360-420"}"#,
            r#"{"user":"a","n":2,"window":"0-60"}"#,
            r#"{"user":"b","n":1,"window":"60-120"}"#,
        ]
    );

    // Windowed inside, into sessions that Beam merges when it groups; the Combine after sees
    // sessions (Beam's window fn, known at compile time) and merges them again, to the same.
    let inside = "
    - type: PyTransform
      name: Py
      input: Stamped
      config:
        constructor: __callable__
        kwargs:
          source: |
            def f(pcoll):
              import apache_beam as beam
              from apache_beam.transforms.window import Sessions
              return (pcoll | beam.WindowInto(Sessions(100))
                  | beam.Map(lambda r: (str(r.user), 1)) | beam.CombinePerKey(sum)
                  | beam.Map(lambda kv: beam.Row(user=kv[0], t=kv[1])))";
    assert_eq!(
        counts(dir.path(), &windowed(inside)),
        [
            r#"{"user":"a","n":1,"window":"10-120"}"#,
            r#"{"user":"a","n":1,"window":"130-230"}"#,
            r#"{"user":"a","n":1,"window":"400-500"}"#,
            r#"{"user":"b","n":1,"window":"70-170"}"#,
        ]
    );
}

#[test]
fn timestamp_fields_reach_beam_as_timestamps_and_come_back_as_timestamps() {
    let dir = tempfile::tempdir().unwrap();
    // Beam reads no Arrow timestamp as a row field: the stage hands it Beam `Timestamp`s, and
    // a `Timestamp` the PTransform returns is a timestamp again (a Sql can take its date).
    let pipeline = "pipeline:
  transforms:
    - type: Create
      name: Raw
      config:
        elements: [{s: '2024-01-15 10:30:00'}, {s: '2023-12-31 23:59:59'}]
    - type: MapToFields
      name: Dated
      input: Raw
      config:
        language: sql
        fields: {at: CAST(s AS TIMESTAMP)}
    - type: PyTransform
      name: Years
      input: Dated
      config:
        constructor: __callable__
        kwargs:
          source: |
            def years(pcoll):
              import apache_beam as beam
              from apache_beam.typehints.row_type import RowTypeConstraint
              from apache_beam.utils.timestamp import Timestamp
              row = RowTypeConstraint.from_fields([('at', Timestamp), ('year', int)])
              return pcoll | beam.Map(
                  lambda r: beam.Row(at=r.at, year=r.at.to_utc_datetime().year)
              ).with_output_types(row)
    - type: MapToFields
      name: Shown
      input: Years
      config:
        language: sql
        fields: {year: year, day: CAST(CAST(at AS DATE) AS VARCHAR)}
    - type: WriteToJson
      input: Shown
      config:
        path: out/counts
";
    assert_eq!(
        counts(dir.path(), pipeline),
        [
            r#"{"year":2023,"day":"2023-12-31"}"#,
            r#"{"year":2024,"day":"2024-01-15"}"#,
        ]
    );
}

#[test]
fn a_large_input_is_shared_by_a_harness_process_per_core_and_every_row_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    // 120,000 trips: past the size from which the stage starts a harness process per core.
    let opts = riverbank_datagen::TaxiOptions::new(1, Some(120_000), 7);
    let data = dir.path().join("taxi");
    riverbank_datagen::write_taxi(&opts, riverbank_datagen::OutputFormat::Parquet, &data).unwrap();
    let pipeline = format!(
        "pipeline:
  transforms:
    - type: ReadFromParquet
      name: Trips
      config: {{path: '{}/*.parquet'}}
    - type: PyTransform
      name: Py
      input: Trips
      config:
        constructor: __callable__
        kwargs:
          source: |
            def f(pcoll):
              import apache_beam as beam
              return pcoll | beam.Map(lambda r: beam.Row(n=int(r.passenger_count or 0) * 0 + 1))
    - type: Combine
      name: Counts
      input: Py
      config:
        group_by: []
        combine: {{n: {{value: n, fn: sum}}}}
    - type: WriteToJson
      input: Counts
      config:
        path: out/counts
",
        data.display()
    );
    std::fs::write(dir.path().join("p.yaml"), pipeline).unwrap();
    let run = riverbank(dir.path(), &["run", "p.yaml"]);
    let err = text(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert_eq!(
        lines(&dir.path().join("out"), "counts"),
        [r#"{"n":120000}"#]
    );
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    if cores > 1 {
        assert!(
            err.contains(&format!("started {cores} SDK harnesses")),
            "{err}"
        );
    }
}
