//! Every error path: compile-time errors name the transform and what is wrong; runtime
//! failures are retried as Dataflow retries bundles (4 attempts), name the transform, the cause
//! and the record, and leave no output behind; error outputs catch bad records instead.
mod common;

use arrow::array::{Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use common::{Failure, entries, read_jsonl, run_full, run_with, sorted};
use riverbank_engine::{Metrics, RunError};
use serde_json::{Map, json};
use std::path::Path;
use std::sync::Arc;

fn at(yaml: &str, dir: &Path) -> String {
    yaml.replace("$DIR", dir.to_string_lossy().as_ref())
}

/// The compile-time issues of a pipeline that must not compile.
async fn plan_issues(yaml: &str) -> (Vec<riverbank_pipeline::Issue>, String) {
    match run_with(yaml, &Map::new(), |_| {}).await {
        Err(Failure::Run(e @ RunError::Plan(_))) => {
            let msg = e.to_string();
            let RunError::Plan(issues) = e else {
                unreachable!()
            };
            (issues, msg)
        }
        Err(other) => panic!("expected a compile (plan) error, got: {other}"),
        Ok(_) => panic!("pipeline unexpectedly succeeded:\n{yaml}"),
    }
}

/// `rows` lines of `{"id": i, "name": "<i>"}`, except that row `bad` has a non-numeric name.
fn write_ids(path: &Path, rows: i64, bad: i64) {
    let mut s = String::new();
    for i in 0..rows {
        let name = if i == bad {
            "oops".to_string()
        } else {
            i.to_string()
        };
        s.push_str(&json!({"id": i, "name": name}).to_string());
        s.push('\n');
    }
    std::fs::write(path, s).unwrap();
}

// ---------------------------------------------------------------- compile-time errors

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sql_expressions_name_the_transform_and_the_expression() {
    let (issues, msg) = plan_issues(
        r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{n: 1, name: a}]}}
    - type: Filter
      name: BadFilter
      input: In
      config: {language: sql, keep: "n +* 1 > 0"}
    - type: MapToFields
      name: BadMap
      input: In
      config: {language: sql, fields: {x: "CASE WHEN n THEN"}}
    - type: Filter
      name: NotBoolean
      input: In
      config: {language: sql, keep: "n + 1"}
    - {type: LogForTesting, input: BadFilter}
    - {type: LogForTesting, input: BadMap}
    - {type: LogForTesting, input: NotBoolean}
"#,
    )
    .await;
    // Every problem is reported at once, each with its transform and field.
    assert_eq!(issues.len(), 3, "{msg}");
    let find = |t: &str| {
        issues
            .iter()
            .find(|i| i.transform.as_deref() == Some(t))
            .unwrap_or_else(|| panic!("no issue for {t}: {msg}"))
            .to_string()
    };
    let f = find("BadFilter");
    assert!(f.contains("'keep'") && f.contains("n +* 1 > 0"), "{f}");
    let m = find("BadMap");
    assert!(
        m.contains("'fields.x'") && m.contains("CASE WHEN n THEN"),
        "{m}"
    );
    let b = find("NotBoolean");
    assert!(b.contains("n + 1") && b.contains("boolean"), "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generic_comparison_ordering_a_string_and_a_number_is_refused() {
    // Python raises for every element; refused before running instead.
    let (issues, msg) = plan_issues(
        r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{n: 1, name: a}]}}
    - {type: Filter, name: Order, input: In, config: {keep: "name > 1"}}
    - {type: Filter, name: Missing, input: In, config: {keep: "nope > 1"}}
    - {type: LogForTesting, input: Order}
    - {type: LogForTesting, input: Missing}
"#,
    )
    .await;
    assert_eq!(issues.len(), 2, "{msg}");
    assert!(
        msg.contains("transform 'Order', field 'keep': cannot compile 'name > 1': it orders a string and a number"),
        "{msg}"
    );
    assert!(
        msg.contains("transform 'Missing', field 'keep'") && msg.contains("nope"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_are_named_with_the_fields_that_exist() {
    let (issues, msg) = plan_issues(
        r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{amount: 1, city: a}]}}
    - type: MapToFields
      name: SqlField
      input: In
      config: {language: sql, fields: {x: "amout * 2"}}
    - type: MapToFields
      name: GenericField
      input: In
      config: {fields: {y: cty}}
    - type: Combine
      name: Grouped
      input: In
      config: {group_by: [town], combine: {amount: sum}}
    - type: Explode
      name: Exploded
      input: In
      config: {fields: tags}
    - {type: LogForTesting, input: SqlField}
    - {type: LogForTesting, input: GenericField}
    - {type: LogForTesting, input: Grouped}
    - {type: LogForTesting, input: Exploded}
"#,
    )
    .await;
    assert_eq!(issues.len(), 4, "{msg}");
    for (t, field) in [
        ("SqlField", "amout"),
        ("GenericField", "cty"),
        ("Grouped", "town"),
        ("Exploded", "tags"),
    ] {
        let i = issues
            .iter()
            .find(|i| i.transform.as_deref() == Some(t))
            .unwrap_or_else(|| panic!("no issue for {t}: {msg}"))
            .to_string();
        assert!(i.contains(field), "{t}: names the unknown field: {i}");
        assert!(
            i.contains("amount") && i.contains("city"),
            "{t}: lists the fields that exist: {i}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_input_paths_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let (issues, msg) = plan_issues(&at(
        r#"
pipeline:
  transforms:
    - {type: ReadFromParquet, name: P, config: {path: "$DIR/nowhere/*.parquet"}}
    - {type: ReadFromCsv, name: C, config: {path: "$DIR/missing.csv"}}
    - {type: LogForTesting, input: P}
    - {type: LogForTesting, input: C}
"#,
        dir.path(),
    ))
    .await;
    assert_eq!(issues.len(), 2, "{msg}");
    let p = issues
        .iter()
        .find(|i| i.transform.as_deref() == Some("P"))
        .expect("P")
        .to_string();
    assert!(
        p.contains("nowhere/*.parquet") && p.contains("'path'"),
        "{p}"
    );
    let c = issues
        .iter()
        .find(|i| i.transform.as_deref() == Some("C"))
        .expect("C")
        .to_string();
    assert!(c.contains("missing.csv"), "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_mismatches_are_reported_before_running() {
    let (issues, msg) = plan_issues(
        r#"
pipeline:
  transforms:
    - {type: Create, name: A, config: {elements: [{x: 1, s: a}]}}
    - {type: Create, name: B, config: {elements: [{x: [1, 2]}]}}
    - {type: WindowInto, name: W, input: B, config: {windowing: {type: fixed, size: 10}}}
    - {type: Flatten, name: Mixed, input: [A, W]}
    - {type: WriteToText, name: NotText, input: A, config: {path: /tmp/never-written}}
    - {type: LogForTesting, input: Mixed}
"#,
    )
    .await;
    assert_eq!(issues.len(), 2, "{msg}");
    assert!(
        msg.contains("'Mixed'") && msg.contains("inputs have different windowing"),
        "{msg}"
    );
    assert!(
        msg.contains("'NotText'") && msg.contains("one string field"),
        "{msg}"
    );
}

// ---------------------------------------------------------------- runtime failures

const PARSE: &str = r#"
pipeline:
  transforms:
    - type: ReadFromJson
      name: Read
      config: {path: "$DIR/ids.jsonl"}
    - type: MapToFields
      name: Parse
      input: Read
      config:
        language: sql
        fields:
          id: id
          num: "CAST(name AS INT)"
    - type: WriteToJson
      name: WriteGood
      input: Parse
      config: {path: "$DIR/out/good.jsonl"}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_record_fails_the_run_after_four_attempts_and_leaves_no_output() {
    let dir = tempfile::tempdir().unwrap();
    write_ids(&dir.path().join("ids.jsonl"), 1000, 950);
    // Batches of 100 rows: nine bundles are written to the sink before the tenth fails.
    let (result, metrics) =
        run_full(&at(PARSE, dir.path()), &Map::new(), |c| c.batch_size = 100).await;
    let e = match result {
        Err(Failure::Run(e)) => e,
        Err(other) => panic!("unexpected failure: {other}"),
        Ok(_) => panic!("the run must fail"),
    };
    let msg = e.to_string();
    let RunError::BundleRetriesExhausted {
        attempts, source, ..
    } = e
    else {
        panic!("expected exhausted retries: {msg}")
    };
    assert_eq!(attempts, 4, "{msg}");
    assert!(msg.contains("failed 4 times"), "{msg}");
    assert!(matches!(*source, RunError::Transform { .. }), "{msg}");
    assert!(msg.contains("'Parse'"), "names the transform: {msg}");
    assert!(
        msg.contains("oops") && msg.to_lowercase().contains("cast"),
        "names the cause: {msg}"
    );
    assert!(
        msg.contains(r#"offending record: {"id":950,"name":"oops"}"#),
        "shows the record as JSON: {msg}"
    );
    // Exactly 4 attempts: 3 retries of the one failing bundle.
    let metrics = metrics.expect("it ran");
    assert_eq!(Metrics::get(&metrics.stages[0].bundle_retries), 3);
    // Nothing committed, and the temp parts of the nine good bundles are gone too.
    assert_eq!(entries(&dir.path().join("out")), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_row_without_error_handling_fails_validate_with_schema() {
    // As Beam: without error_handling, a row that breaks the schema fails the pipeline.
    let (result, _) = run_full(
        r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{n: 4}, {n: -1}]}}
    - {type: ValidateWithSchema, name: Check, input: In, config: {schema: {properties: {n: {minimum: 0}}}}}
    - {type: LogForTesting, input: Check}
"#,
        &Map::new(),
        |_| {},
    )
    .await;
    let msg = match result {
        Err(Failure::Run(e @ RunError::BundleRetriesExhausted { .. })) => e.to_string(),
        Err(other) => panic!("expected exhausted retries, got: {other}"),
        Ok(_) => panic!("the run must fail"),
    };
    assert!(
        msg.contains("transform 'Check' failed: field 'n': -1 is less than the minimum of 0"),
        "{msg}"
    );
    assert!(msg.contains(r#"offending record: {"n":-1}"#), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn division_by_zero_is_a_record_failure() {
    let (result, _) = run_full(
        r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{a: 4, b: 2}, {a: 1, b: 0}]}}
    - {type: MapToFields, name: Divide, input: In, config: {language: sql, fields: {q: a / b}}}
    - {type: LogForTesting, input: Divide}
"#,
        &Map::new(),
        |_| {},
    )
    .await;
    let msg = result.expect_err("must fail").to_string();
    assert!(
        msg.contains("failed 4 times")
            && msg.contains("'Divide'")
            && msg.to_lowercase().contains("divide by zero"),
        "{msg}"
    );
    assert!(msg.contains(r#"{"a":1,"b":0}"#), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_handling_sends_bad_records_to_the_error_output() {
    let dir = tempfile::tempdir().unwrap();
    write_ids(&dir.path().join("ids.jsonl"), 1000, 950);
    let yaml = PARSE.replace(
        "          num: \"CAST(name AS INT)\"\n",
        "          num: \"CAST(name AS INT)\"\n        error_handling: {output: bad}\n",
    ) + r#"
    - type: WriteToJson
      name: WriteBad
      input: Parse.bad
      config: {path: "$DIR/out/bad.jsonl"}
"#;
    let o = run_with(&at(&yaml, dir.path()), &Map::new(), |c| c.batch_size = 100)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(o.count("Read"), 1000);
    assert_eq!(o.count("Parse"), 999, "the good rows");
    assert_eq!(o.count("WriteBad"), 1);
    let good = read_jsonl(&dir.path().join("out"), "good");
    assert_eq!(good.len(), 999);
    assert!(
        good.iter().all(|r| r["num"] == r["id"]),
        "good rows are intact"
    );
    let bad = read_jsonl(&dir.path().join("out"), "bad");
    assert_eq!(bad.len(), 1);
    assert_eq!(
        bad[0]["element"],
        json!({"id": 950, "name": "oops"}),
        "{}",
        bad[0]
    );
    assert!(
        bad[0]["msg"].as_str().is_some_and(|m| m.contains("oops")),
        "{}",
        bad[0]
    );
    assert_eq!(
        bad[0]["stack"], "in transform 'Parse'",
        "Beam's third error field"
    );
}

const RETRIED: &str = r#"
pipeline:
  transforms:
    - type: ReadFromJson
      name: Read
      config: {path: "$DIR/ids.jsonl"}
    - type: MapToFields
      name: Keyed
      input: Read
      config:
        language: sql
        fields:
          k: id % 7
          id: id
    - type: Combine
      name: PerKey
      input: Keyed
      config: {group_by: k, combine: {n: {fn: count}, total: {fn: sum, value: id}}}
    - type: WriteToJson
      name: WriteRows
      input: Keyed
      config: {path: "$DIR/$OUT/rows.jsonl"}
    - type: WriteToJson
      name: WriteSums
      input: PerKey
      config: {path: "$DIR/$OUT/sums.jsonl"}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_bundles_are_not_counted_twice() {
    let dir = tempfile::tempdir().unwrap();
    write_ids(&dir.path().join("ids.jsonl"), 1000, -1);
    let run = |out: &'static str, failures: u32| {
        let yaml = at(RETRIED, dir.path()).replace("$OUT", out);
        async move {
            run_full(&yaml, &Map::new(), |c| {
                c.batch_size = 100;
                c.chaos.inject_failures = failures;
            })
            .await
        }
    };
    let (clean, clean_metrics) = run("clean", 0).await;
    let clean = clean.unwrap_or_else(|e| panic!("{e}"));
    let (flaky, flaky_metrics) = run("flaky", 3).await;
    let flaky = flaky.unwrap_or_else(|e| panic!("with 3 injected failures per bundle: {e}"));
    assert_eq!(flaky.elements_out, clean.elements_out, "same counts");
    let (cm, fm) = (clean_metrics.unwrap(), flaky_metrics.unwrap());
    let retries = |m: &Metrics| {
        m.stages
            .iter()
            .map(|s| Metrics::get(&s.bundle_retries))
            .sum::<u64>()
    };
    let bundles = |m: &Metrics| {
        m.stages
            .iter()
            .map(|s| Metrics::get(&s.bundles))
            .sum::<u64>()
    };
    assert_eq!(retries(&cm), 0);
    assert_eq!(bundles(&fm), bundles(&cm));
    assert_eq!(
        retries(&fm),
        3 * bundles(&fm),
        "every bundle was retried 3 times"
    );
    for f in ["rows", "sums"] {
        let a = sorted(read_jsonl(&dir.path().join("clean"), f));
        let b = sorted(read_jsonl(&dir.path().join("flaky"), f));
        assert_eq!(a, b, "{f}: identical output");
    }
    assert_eq!(read_jsonl(&dir.path().join("flaky"), "rows").len(), 1000);
    let sums = read_jsonl(&dir.path().join("flaky"), "sums");
    assert_eq!(
        sums.iter().map(|r| r["n"].as_i64().unwrap()).sum::<i64>(),
        1000
    );
    assert_eq!(
        sums.iter()
            .map(|r| r["total"].as_i64().unwrap())
            .sum::<i64>(),
        999 * 1000 / 2
    );

    // One more failure than the retry budget: the run fails, and writes nothing.
    let (failed, _) = run("failed", 4).await;
    let msg = failed
        .expect_err("4 injected failures exhaust the 4 attempts")
        .to_string();
    assert!(
        msg.contains("failed 4 times") && msg.contains("injected failure of attempt 4"),
        "{msg}"
    );
    assert_eq!(entries(&dir.path().join("failed")), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_in_one_branch_discards_the_output_of_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let (result, _) = run_full(
        &at(
            r#"
pipeline:
  transforms:
    - {type: Create, name: Good, config: {elements: [{x: 1}, {x: 2}]}}
    - {type: WriteToJson, name: WriteGood, input: Good, config: {path: "$DIR/out/good.jsonl"}}
    - {type: Create, name: Bad, config: {elements: [{s: a}]}}
    - {type: Reshuffle, name: Later, input: Bad}
    - {type: MapToFields, name: Cast, input: Later, config: {language: sql, fields: {n: "CAST(s AS BIGINT)"}}}
    - {type: WriteToJson, name: WriteBad, input: Cast, config: {path: "$DIR/out/bad.jsonl"}}
"#,
            dir.path(),
        ),
        &Map::new(),
        |_| {},
    )
    .await;
    let msg = result.expect_err("must fail").to_string();
    assert!(msg.contains("'Cast'"), "{msg}");
    assert_eq!(
        entries(&dir.path().join("out")),
        Vec::<String>::new(),
        "no final files and no temp directory"
    );
}

// ---------------------------------------------------------------- memory

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_combine_over_its_memory_limit_spills_and_gives_the_same_result() {
    const N: i64 = 200_000;
    let dir = tempfile::tempdir().unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]));
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(dir.path().join("keys.parquet")).unwrap(),
        schema.clone(),
        None,
    )
    .unwrap();
    for chunk in 0..4 {
        let ks: Vec<i64> = (chunk * N / 4..(chunk + 1) * N / 4).collect();
        let vs: Vec<i64> = ks.iter().map(|k| k % 10).collect();
        w.write(
            &RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(ks)),
                    Arc::new(Int64Array::from(vs)),
                ],
            )
            .unwrap(),
        )
        .unwrap();
    }
    w.close().unwrap();
    let total: i64 = (0..N).map(|k| k % 10).sum();
    let yaml = at(
        &format!(
            r#"
pipeline:
  transforms:
    - {{type: ReadFromParquet, name: Read, config: {{path: "$DIR/keys.parquet"}}}}
    - type: Combine
      name: PerKey
      input: Read
      config: {{group_by: k, combine: {{s: {{fn: sum, value: v}}, c: {{fn: count}}}}}}
    - type: Combine
      name: Summary
      input: PerKey
      config:
        group_by: []
        combine:
          groups: {{fn: count}}
          total: {{fn: sum, value: s}}
          rows: {{fn: sum, value: c}}
          most: {{fn: max, value: c}}
    - type: AssertEqual
      input: Summary
      config: {{elements: [{{groups: {N}, total: {total}, rows: {N}, most: 1}}]}}
"#
        ),
        dir.path(),
    );
    let roomy = run_with(&yaml, &Map::new(), |_| {})
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(Metrics::get(&roomy.metrics.spills), 0);
    let tight = run_with(&yaml, &Map::new(), |c| c.memory_limit = 64 << 10)
        .await
        .unwrap_or_else(|e| panic!("with 64 KiB: {e}"));
    assert!(
        Metrics::get(&tight.metrics.spills) > 0,
        "64 KiB for 200k keys must spill"
    );
    assert_eq!(tight.count("PerKey"), N as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_outputs_of_partition_assign_timestamps_and_filter() {
    let dir = tempfile::tempdir().unwrap();
    let o = run_with(
        &at(
            r#"
pipeline:
  transforms:
    - type: Create
      name: In
      config:
        elements: [{kind: fruit, t: "2024-01-01T00:00:00Z", s: "1"}, {kind: rock, t: "not a time", s: x}]
    - type: Partition
      name: P
      input: In
      config: {by: kind, outputs: [fruit], error_handling: {output: bad}}
    - {type: AssertEqual, name: Fruit, input: P.fruit, config: {elements: [{kind: fruit, t: "2024-01-01T00:00:00Z", s: "1"}]}}
    - {type: WriteToJson, name: PBad, input: P.bad, config: {path: "$DIR/p_bad.jsonl"}}
    - type: AssignTimestamps
      name: Stamp
      input: In
      config: {timestamp: t, error_handling: {output: bad}}
    - {type: WriteToJson, name: StampBad, input: Stamp.bad, config: {path: "$DIR/stamp_bad.jsonl"}}
    - {type: AssertEqual, name: Stamped, input: Stamp, config: {elements: [{kind: fruit, t: "2024-01-01T00:00:00Z", s: "1"}]}}
    - type: Filter
      name: F
      input: In
      config: {language: sql, keep: "CAST(s AS INT) > 0", error_handling: {output: bad}}
    - {type: WriteToJson, name: FBad, input: F.bad, config: {path: "$DIR/f_bad.jsonl"}}
    - {type: AssertEqual, name: Kept, input: F, config: {elements: [{kind: fruit, t: "2024-01-01T00:00:00Z", s: "1"}]}}
"#,
            dir.path(),
        ),
        &Map::new(),
        |_| {},
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    for (t, file) in [
        ("PBad", "p_bad"),
        ("StampBad", "stamp_bad"),
        ("FBad", "f_bad"),
    ] {
        assert_eq!(o.count(t), 1, "{t}");
        let rows = read_jsonl(dir.path(), file);
        assert_eq!(rows.len(), 1, "{file}");
        assert_eq!(rows[0]["element"]["kind"], "rock", "{file}: {}", rows[0]);
        assert!(
            rows[0]["msg"].as_str().is_some_and(|m| !m.is_empty()),
            "{file}: {}",
            rows[0]
        );
    }
    // An error output that is also a partition output is rejected.
    let e = run_with(
        r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{kind: a}]}}
    - {type: Partition, name: P, input: In, config: {by: kind, outputs: [a, bad], error_handling: {output: bad}}}
    - {type: LogForTesting, input: P.a}
"#,
        &Map::new(),
        |_| {},
    )
    .await
    .err()
    .expect("must be rejected")
    .to_string();
    assert!(e.contains("'P'") && e.contains("error output 'bad'"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_scanning_one_input_twice_fails_instead_of_seeing_nothing() {
    let (result, _) = run_full(
        r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{n: 1}, {n: 2}]}}
    - type: Sql
      name: Twice
      input: In
      config: {query: "SELECT a.n FROM PCOLLECTION a JOIN PCOLLECTION b ON a.n = b.n"}
    - {type: LogForTesting, input: Twice}
"#,
        &Map::new(),
        |_| {},
    )
    .await;
    let msg = result.expect_err("must fail").to_string();
    assert!(msg.contains("'Twice'") && msg.contains("twice"), "{msg}");
}

/// (From the connectors' tests: a Kafka source's schema is checked without a broker.)
#[tokio::test]
async fn validation_checks_the_schema_offline() {
    let yaml = |ts: &str| {
        format!(
            r#"
pipeline:
  type: chain
  transforms:
    - type: ReadFromKafka
      name: Rides
      config:
        topic: rides
        bootstrap_servers: localhost:9
        format: JSON
        schema: {{type: object, properties: {{at: {{type: string}}}}}}
        timestamp: {ts}
    - type: WriteToKafka
      config: {{topic: out, bootstrap_servers: localhost:9, format: JSON}}
"#
        )
    };
    let compile = |y: String| async move {
        let plan = riverbank_pipeline::load_plan(&y, &Default::default(), "t").unwrap();
        riverbank_engine::compile(plan, 1024)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let e = compile(yaml("nope")).await.unwrap_err();
    assert!(
        e.contains("Rides") && e.contains("timestamp field 'nope'"),
        "{e}"
    );
    // No broker is asked: the schema comes from the config.
    compile(yaml("at")).await.unwrap();
}
