//! One focused test per Beam YAML transform (and per YAML form: chains, composites, implicit
//! flattens, windowing on a transform), driven through the whole stack with small inputs.
mod common;

use arrow::array::{AsArray, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use common::{Failure, files, read_jsonl, read_jsonl_file, run_err, run_ok, sorted};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;

/// `yaml` with `$DIR` replaced by `dir` (quoted for YAML).
fn at(yaml: &str, dir: &Path) -> String {
    yaml.replace("$DIR", dir.to_string_lossy().as_ref())
}

fn plan_error(e: Failure) -> String {
    match e {
        Failure::Pipeline(p) => p.to_string(),
        Failure::Run(r) => r.to_string(),
    }
}

// ---------------------------------------------------------------- sources and sinks

/// Beam's MatchAll: a row per file each row's pattern matches, with its size and mtime; a
/// pattern's field is named or the only one; a pattern that matches nothing is skipped,
/// or fails as `empty_match_treatment` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn match_all_lists_the_files_each_pattern_matches() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("file1.txt"), "data").unwrap();
    std::fs::write(data.join("file2.txt"), "more data").unwrap();
    std::fs::write(data.join("other.csv"), "x").unwrap();
    run_ok(&at(
        r#"
pipeline:
  transforms:
    - type: Create
      name: Patterns
      config:
        elements:
          - {pattern: "$DIR/data/file*.txt", n: 1}
          - {pattern: "$DIR/data/nothing*.txt", n: 2}
    - {type: MatchAll, input: Patterns, config: {file_pattern: pattern}}
    - {type: WriteToJson, input: MatchAll, config: {path: "$DIR/out/files.jsonl"}}
    - type: Create
      name: Sole
      config: {elements: ["$DIR/data/other.csv"]}
    - {type: MatchAll, name: One, input: Sole, config: {empty_match_treatment: DISALLOW}}
    - {type: WriteToJson, input: One, config: {path: "$DIR/out/one.jsonl"}}
"#,
        dir.path(),
    ))
    .await;
    let out = dir.path().join("out");
    let rows = sorted(read_jsonl(&out, "files"));
    let path = |f: &str| json!(data.join(f).to_string_lossy());
    assert_eq!(
        rows.iter()
            .map(|r| (r["path"].clone(), r["size_in_bytes"].clone()))
            .collect::<Vec<_>>(),
        [(path("file1.txt"), json!(4)), (path("file2.txt"), json!(9))]
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let mtime = rows[0]["last_updated_in_seconds"].as_f64().unwrap();
    assert!(
        (now - 600.0..=now + 1.0).contains(&mtime),
        "{mtime} vs {now}"
    );
    assert_eq!(read_jsonl(&out, "one")[0]["path"], path("other.csv"));

    for (config, want) in [
        ("{empty_match_treatment: DISALLOW}", "no file matches"),
        (
            "{empty_match_treatment: ALLOW_IF_WILDCARD}",
            "no file matches",
        ),
    ] {
        let e = run_err(&at(
            &format!(
                r#"
pipeline:
  transforms:
    - {{type: Create, config: {{elements: ["$DIR/data/missing.txt"]}}}}
    - {{type: MatchAll, input: Create, config: {config}}}
    - {{type: LogForTesting, input: MatchAll}}
"#
            ),
            dir.path(),
        ))
        .await;
        let e = plan_error(e);
        assert!(e.contains("MatchAll") && e.contains(want), "{config}: {e}");
    }
    for (config, want) in [
        (
            "{file_pattern: nope}",
            "field 'nope' not found in input schema fields",
        ),
        ("{}", "name the one holding the pattern in 'file_pattern'"),
        (
            "{empty_match_treatment: SOMETIMES}",
            "must be ALLOW, DISALLOW or ALLOW_IF_WILDCARD",
        ),
    ] {
        let e = run_err(&at(
            &format!(
                r#"
pipeline:
  transforms:
    - {{type: Create, config: {{elements: [{{pattern: "$DIR/data/*", n: 1}}]}}}}
    - {{type: MatchAll, input: Create, config: {config}}}
    - {{type: LogForTesting, input: MatchAll}}
"#
            ),
            dir.path(),
        ))
        .await;
        let e = plan_error(e);
        assert!(e.contains("MatchAll") && e.contains(want), "{config}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_builds_rows_and_wraps_scalars() {
    let o = run_ok(
        r#"
pipeline:
  transforms:
    - type: Create
      name: Rows
      config:
        elements:
          - {name: a, n: 1, x: 1.5, ok: true, tags: [p, q], pos: {lat: 1.0, lon: 2.0}}
          - {name: b, n: 2, x: 2.5, ok: false, tags: [], pos: {lat: 3.0, lon: 4.0}}
    - type: AssertEqual
      input: Rows
      config:
        elements:
          - {name: a, n: 1, x: 1.5, ok: true, tags: [p, q], pos: {lat: 1.0, lon: 2.0}}
          - {name: b, n: 2, x: 2.5, ok: false, tags: [], pos: {lat: 3.0, lon: 4.0}}
    - type: Create
      name: Scalars
      config:
        elements: [1, 2, 3]
    - type: AssertEqual
      input: Scalars
      config:
        elements: [3, 2, 1]
"#,
    )
    .await;
    assert_eq!(o.count("Rows"), 2);
    assert_eq!(o.count("Scalars"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_from_csv_json_parquet_and_text() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a.csv"),
        "id;name;score\n1;ann;1.5\n2;bob;2.5\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("a.jsonl"), "{\"id\": 1, \"name\": \"ann\", \"tags\": [\"x\"]}\n{\"id\": 2, \"name\": \"bob\", \"tags\": []}\n").unwrap();
    std::fs::write(dir.path().join("a.txt"), "first line\nsecond line\n").unwrap();
    // Parquet written directly with the parquet crate.
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("score", DataType::Float64, true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(vec![1, 2])),
            Arc::new(StringArray::from(vec![Some("ann"), None])),
            Arc::new(Float64Array::from(vec![1.5, 2.5])),
        ],
    )
    .unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(dir.path().join("a.parquet")).unwrap(),
        schema,
        None,
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();

    let o = run_ok(&at(
        r#"
pipeline:
  transforms:
    - type: ReadFromCsv
      name: Csv
      config: {path: "$DIR/a.csv", delimiter: ";"}
    - type: AssertEqual
      input: Csv
      config:
        elements: [{id: 1, name: ann, score: 1.5}, {id: 2, name: bob, score: 2.5}]
    - type: ReadFromCsv
      name: CsvColumns
      config: {path: "$DIR/a.csv", delimiter: ";", columns: [score, id]}
    - type: AssertEqual
      input: CsvColumns
      config:
        elements: [{id: 1, score: 1.5}, {id: 2, score: 2.5}]
    - type: ReadFromJson
      name: Json
      config: {path: "$DIR/a.jsonl"}
    - type: AssertEqual
      input: Json
      config:
        elements: [{id: 1, name: ann, tags: [x]}, {id: 2, name: bob, tags: []}]
    - type: ReadFromJson
      name: JsonColumns
      config: {path: "$DIR/*.jsonl", columns: [name]}
    - type: AssertEqual
      input: JsonColumns
      config:
        elements: [{name: ann}, {name: bob}]
    - type: ReadFromParquet
      name: Parquet
      config: {path: "$DIR/a.parquet"}
    - type: AssertEqual
      input: Parquet
      config:
        elements: [{id: 1, name: ann, score: 1.5}, {id: 2, score: 2.5}]
    - type: ReadFromText
      name: Text
      config: {path: "$DIR/a.txt"}
    - type: AssertEqual
      input: Text
      config:
        elements: [{line: first line}, {line: second line}]
"#,
        dir.path(),
    ))
    .await;
    for (t, n) in [("Csv", 2), ("Json", 2), ("Parquet", 2), ("Text", 2)] {
        assert_eq!(o.count(t), n, "{t}");
    }
}

/// Created elements carry Beam's minimum timestamp, about 290,000 years before the epoch: a
/// window around it and the timestamp itself print in the text sinks as Beam's Java SDK prints
/// them, not as an error string in place of the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_minimum_timestamp_and_its_window_print_in_text_sinks() {
    let dir = tempfile::tempdir().unwrap();
    run_ok(&at(
        r#"
pipeline:
  type: chain
  transforms:
    - type: Create
      config: {elements: [{k: a}]}
    - type: WindowInto
      windowing: {type: fixed, size: 10s}
    - type: ExtractWindowingInfo
      config: {fields: [timestamp, window_start, window_end]}
    - type: WriteToJson
      config: {path: "$DIR/json/rows.jsonl"}
"#,
        dir.path(),
    ))
    .await;
    let rows = read_jsonl(&dir.path().join("json"), "rows");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["timestamp"], "-290308-12-21T19:59:05.225Z");
    // The window starts before the first representable instant, where it is clamped.
    assert_eq!(rows[0]["window_start"], "-290308-12-21T19:59:05.224Z");
    assert_eq!(rows[0]["window_end"], "-290308-12-21T19:59:10.000Z");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_to_csv_json_parquet_and_text_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let o = run_ok(&at(
        r#"
pipeline:
  transforms:
    - type: Create
      name: Rows
      config:
        elements: [{id: 1, name: ann, score: 1.5}, {id: 2, name: bob, score: 2.5}, {id: 3, name: cy, score: -1.0}]
    - type: WriteToCsv
      input: Rows
      config: {path: "$DIR/csv/rows.csv"}
    - type: WriteToJson
      input: Rows
      config: {path: "$DIR/json/rows.jsonl"}
    - type: WriteToParquet
      input: Rows
      config: {path: "$DIR/parquet/rows.parquet", num_shards: 2}
    - type: MapToFields
      name: Lines
      input: Rows
      config:
        language: sql
        fields:
          line: "name || ':' || CAST(id AS VARCHAR)"
    - type: WriteToText
      input: Lines
      config: {path: "$DIR/text/lines", file_name_suffix: ".txt", shard_name_template: ""}
"#,
        dir.path(),
    ))
    .await;
    assert_eq!(o.summary.files.len(), 4);

    // CSV: one header, then the rows.
    let csv_files = files(&dir.path().join("csv"), "rows");
    assert_eq!(csv_files, ["rows.csv-00000-of-00001"]);
    let csv = std::fs::read_to_string(dir.path().join("csv").join(&csv_files[0])).unwrap();
    let mut lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.remove(0), "id,name,score");
    lines.sort();
    assert_eq!(lines, ["1,ann,1.5", "2,bob,2.5", "3,cy,-1.0"]);

    // JSON lines.
    let json = sorted(read_jsonl(&dir.path().join("json"), "rows"));
    assert_eq!(
        json,
        sorted(vec![
            json!({"id": 1, "name": "ann", "score": 1.5}),
            json!({"id": 2, "name": "bob", "score": 2.5}),
            json!({"id": 3, "name": "cy", "score": -1.0})
        ])
    );

    // Parquet, in exactly two shards, read back with the parquet crate.
    let pq = files(&dir.path().join("parquet"), "rows");
    assert_eq!(
        pq,
        ["rows.parquet-00000-of-00002", "rows.parquet-00001-of-00002"]
    );
    let mut ids = vec![];
    for f in &pq {
        let r = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            std::fs::File::open(dir.path().join("parquet").join(f)).unwrap(),
        )
        .unwrap()
        .build()
        .unwrap();
        for b in r {
            let b = b.unwrap();
            assert_eq!(b.schema().field(0).name(), "id");
            ids.extend(
                b.column(0)
                    .as_primitive::<arrow::datatypes::Int64Type>()
                    .values()
                    .iter()
                    .copied(),
            );
        }
    }
    ids.sort();
    assert_eq!(ids, [1, 2, 3]);

    // Text: an empty shard template names exactly one file.
    assert_eq!(files(&dir.path().join("text"), ""), ["lines.txt"]);
    let mut text: Vec<String> = std::fs::read_to_string(dir.path().join("text/lines.txt"))
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    text.sort();
    assert_eq!(text, ["ann:1", "bob:2", "cy:3"]);

    // And each format reads back into the same rows through the pipeline.
    run_ok(&at(
        r#"
pipeline:
  transforms:
    - type: ReadFromCsv
      name: C
      config: {path: "$DIR/csv/rows.csv-*"}
    - type: ReadFromJson
      name: J
      config: {path: "$DIR/json/*"}
    - type: ReadFromParquet
      name: P
      config: {path: "$DIR/parquet/"}
    - type: AssertEqual
      input: C
      config: &rows
        elements: [{id: 1, name: ann, score: 1.5}, {id: 2, name: bob, score: 2.5}, {id: 3, name: cy, score: -1.0}]
    - type: AssertEqual
      input: J
      config: *rows
    - type: AssertEqual
      input: P
      config: *rows
"#,
        dir.path(),
    ))
    .await;
}

// ---------------------------------------------------------------- element-wise

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_to_fields_generic_sql_append_and_drop() {
    run_ok(
        r#"
pipeline:
  transforms:
    - type: Create
      name: In
      config:
        elements: [{a: 1, b: 10, s: x, nested: {c: 5}}, {a: 2, b: 20, s: y, nested: {c: 6}}]
    # generic: field references (renames, nested paths)
    - type: MapToFields
      name: Generic
      input: In
      config:
        fields:
          first: a
          label: s
          c: nested.c
    - type: AssertEqual
      input: Generic
      config:
        elements: [{first: 1, label: x, c: 5}, {first: 2, label: y, c: 6}]
    # sql: expressions
    - type: MapToFields
      name: Sql
      input: In
      config:
        language: sql
        fields:
          total: a + b
          shout: upper(s)
          big: b > 15
    - type: AssertEqual
      input: Sql
      config:
        elements: [{total: 11, shout: X, big: false}, {total: 22, shout: Y, big: true}]
    # append keeps the input fields (minus drop) and adds the new ones
    - type: MapToFields
      name: Append
      input: In
      config:
        language: sql
        append: true
        drop: [nested, s]
        fields:
          ratio: "CAST(b AS DOUBLE) / a"
    - type: AssertEqual
      input: Append
      config:
        elements: [{a: 1, b: 10, ratio: 10.0}, {a: 2, b: 20, ratio: 10.0}]
    # append may redefine a field it drops
    - type: MapToFields
      name: Replace
      input: In
      config:
        language: sql
        append: true
        drop: [a, nested]
        fields:
          a: a * 100
    - type: AssertEqual
      input: Replace
      config:
        elements: [{b: 10, s: x, a: 100}, {b: 20, s: y, a: 200}]
"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_to_fields_append_rejects_redefinition_and_drop_needs_append() {
    // Beam: "Redefinition of field ... Cannot append a field that already exists".
    let e = plan_error(
        run_err(
            r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{a: 1}]}}
    - type: MapToFields
      name: M
      input: In
      config: {language: sql, append: true, fields: {a: a + 1}}
    - {type: LogForTesting, input: M}
"#,
        )
        .await,
    );
    assert!(
        e.contains("'M'") && e.contains("'a'") && e.contains("already"),
        "{e}"
    );
    // Beam: "Can only drop fields if append is true."
    let e = plan_error(
        run_err(
            r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{a: 1, b: 2}]}}
    - type: MapToFields
      name: M
      input: In
      config: {drop: [b], fields: {x: a}}
    - {type: LogForTesting, input: M}
"#,
        )
        .await,
    );
    assert!(e.contains("'M'") && e.contains("append"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_with_sql_and_generic() {
    let o = run_ok(
        r#"
pipeline:
  transforms:
    - type: Create
      name: In
      config:
        elements: [{n: 1, keep: true}, {n: 2, keep: false}, {n: 3, keep: true}, {n: 4}]
    - type: Filter
      name: Big
      input: In
      config: {language: sql, keep: "n >= 2 AND n <> 3"}
    - type: AssertEqual
      input: Big
      config: {elements: [{n: 2, keep: false}, {n: 4}]}
    - type: Filter
      name: Flagged
      input: In
      config: {keep: keep}
    - type: AssertEqual
      input: Flagged
      config: {elements: [{n: 1, keep: true}, {n: 3, keep: true}]}
"#,
    )
    .await;
    assert_eq!(o.count("Big"), 2);
    assert_eq!(o.count("Flagged"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explode_single_field_cross_product_and_zip() {
    run_ok(
        r#"
pipeline:
  transforms:
    - type: Create
      name: In
      config:
        elements:
          - {id: 1, a: [x, y], b: [1, 2]}
          - {id: 2, a: [z], b: [3]}
          - {id: 3, a: [], b: []}
    - type: Explode
      name: One
      input: In
      config: {fields: a}
    - type: AssertEqual
      input: One
      config:
        elements:
          - {id: 1, a: x, b: [1, 2]}
          - {id: 1, a: y, b: [1, 2]}
          - {id: 2, a: z, b: [3]}
    - type: Explode
      name: Cross
      input: In
      config: {fields: [a, b], cross_product: true}
    - type: AssertEqual
      input: Cross
      config:
        elements:
          - {id: 1, a: x, b: 1}
          - {id: 1, a: x, b: 2}
          - {id: 1, a: y, b: 1}
          - {id: 1, a: y, b: 2}
          - {id: 2, a: z, b: 3}
    - type: Explode
      name: Zip
      input: In
      config: {fields: [a, b], cross_product: false}
    - type: AssertEqual
      input: Zip
      config:
        elements:
          - {id: 1, a: x, b: 1}
          - {id: 1, a: y, b: 2}
          - {id: 2, a: z, b: 3}
"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explode_zips_lists_of_different_lengths_like_zip_longest() {
    // Beam's cross_product: false uses itertools.zip_longest (fill value null).
    run_ok(
        r#"
pipeline:
  transforms:
    - type: Create
      name: In
      config:
        elements:
          - {id: 1, a: [x, y, w], b: [1]}
    - type: Explode
      name: Zip
      input: In
      config: {fields: [a, b], cross_product: false}
    - type: AssertEqual
      input: Zip
      config:
        elements:
          - {id: 1, a: x, b: 1}
          - {id: 1, a: y}
          - {id: 1, a: w}
"#,
    )
    .await;
    // Beam requires cross_product to be given when exploding several fields.
    let e = plan_error(
        run_err(
            r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{a: [1], b: [2]}]}}
    - {type: Explode, name: E, input: In, config: {fields: [a, b]}}
    - {type: LogForTesting, input: E}
"#,
        )
        .await,
    );
    assert!(e.contains("'E'") && e.contains("cross_product"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flatten_two_sources_unzipped() {
    let yaml = r#"
pipeline:
  transforms:
    - {type: Create, name: A, config: {elements: [{x: 1, a: one}, {x: 2, a: two}]}}
    - {type: Create, name: B, config: {elements: [{x: 3, b: 1.5}]}}
    - type: Flatten
      name: Both
      input: [A, B]
    - type: MapToFields
      name: Doubled
      input: Both
      config: {language: sql, append: true, fields: {y: x * 2}}
    - type: AssertEqual
      input: Doubled
      config:
        elements: [{x: 1, a: one, y: 2}, {x: 2, a: two, y: 4}, {x: 3, b: 1.5, y: 6}]
"#;
    // Flatten and what follows it run in both producing stages: nothing is materialized.
    let plan = riverbank_pipeline::load_plan(yaml, &Default::default(), "t").unwrap();
    let flatten = plan
        .graph
        .transforms
        .iter()
        .position(|t| t.name == "Both")
        .unwrap();
    assert_eq!(
        plan.stages
            .iter()
            .filter(|s| s.ops.iter().any(|o| o.transform == flatten))
            .count(),
        2
    );
    let o = run_ok(yaml).await;
    assert_eq!(o.count("Both"), 3);
    assert_eq!(o.count("Doubled"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn implicit_flatten_of_a_list_input() {
    let o = run_ok(
        r#"
pipeline:
  transforms:
    - {type: Create, name: A, config: {elements: [{x: 1}, {x: 2}]}}
    - {type: Create, name: B, config: {elements: [{x: 3}]}}
    - type: Filter
      name: Odd
      input: [A, B]
      config: {language: sql, keep: "x % 2 = 1"}
    - type: AssertEqual
      input: Odd
      config: {elements: [{x: 1}, {x: 3}]}
"#,
    )
    .await;
    assert_eq!(o.count("Odd"), 2);
    assert_eq!(o.count("Odd/Flatten"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_outputs_unknown_output_and_by_expression() {
    let o = run_ok(
        r#"
pipeline:
  transforms:
    - type: Create
      name: In
      config:
        elements: [{n: 1, kind: fruit}, {n: 2, kind: veg}, {n: 3, kind: rock}, {n: 4, kind: fruit}, {n: 5}]
    # generic: the field value names the output
    - type: Partition
      name: ByKind
      input: In
      config:
        by: kind
        outputs: [fruit, veg]
        unknown_output: other
    - {type: AssertEqual, name: Fruit, input: ByKind.fruit, config: {elements: [{n: 1, kind: fruit}, {n: 4, kind: fruit}]}}
    - {type: AssertEqual, name: Veg, input: ByKind.veg, config: {elements: [{n: 2, kind: veg}]}}
    - {type: AssertEqual, name: Other, input: ByKind.other, config: {elements: [{n: 3, kind: rock}, {n: 5}]}}
    # sql: an expression computes the output name
    - type: Partition
      name: BySize
      input: In
      config:
        language: sql
        by: "CASE WHEN n > 2 THEN 'big' ELSE 'small' END"
        outputs: [big, small]
    - {type: AssertEqual, name: Big, input: BySize.big, config: {elements: [{n: 3, kind: rock}, {n: 4, kind: fruit}, {n: 5}]}}
    - {type: AssertEqual, name: Small, input: BySize.small, config: {elements: [{n: 1, kind: fruit}, {n: 2, kind: veg}]}}
"#,
    )
    .await;
    assert_eq!(o.count("In"), 5);
    // Without unknown_output, an unknown name fails the run and names the value.
    let e = plan_error(
        run_err(
            r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{kind: fruit}, {kind: rock}]}}
    - {type: Partition, name: P, input: In, config: {by: kind, outputs: [fruit]}}
    - {type: LogForTesting, input: P.fruit}
"#,
        )
        .await,
    );
    assert!(e.contains("'P'") && e.contains("rock"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reshuffle_and_log_for_testing_pass_elements_through() {
    let o = run_ok(
        r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{x: 1}, {x: 2}, {x: 3}]}}
    - {type: Reshuffle, name: Shuffled, input: In}
    - {type: LogForTesting, name: Log, input: Shuffled, config: {level: INFO, prefix: "row: "}}
    - {type: AssertEqual, input: Log, config: {elements: [{x: 1}, {x: 2}, {x: 3}]}}
"#,
    )
    .await;
    assert_eq!(o.count("Shuffled"), 3);
    assert_eq!(o.count("Log"), 3);
}

// ---------------------------------------------------------------- Combine

const SALES: &str = r#"
    - type: Create
      name: Sales
      config:
        elements:
          - {shop: a, item: x, n: 1, price: 1.0, ok: true, tag: p}
          - {shop: a, item: x, n: 2, price: 3.0, ok: true, tag: q}
          - {shop: a, item: y, n: 3, price: 2.0, ok: false, tag: r}
          - {shop: b, item: x, n: 4, price: 5.0, ok: true, tag: s}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn combine_every_fn_grouped_by_one_field() {
    let yaml = format!(
        r#"
pipeline:
  transforms:{SALES}
    - type: Combine
      name: PerShop
      input: Sales
      config:
        group_by: shop
        combine:
          total: {{fn: sum, value: n}}
          top: {{fn: max, value: price}}
          low: {{fn: min, value: price}}
          all_ok: {{fn: all, value: ok}}
          any_ok: {{fn: any, value: ok}}
          avg: {{fn: mean, value: n}}
          rows: {{fn: count}}
          price: sum
    - type: AssertEqual
      input: PerShop
      config:
        elements:
          - {{shop: a, total: 6, top: 3.0, low: 1.0, all_ok: false, any_ok: true, avg: 2.0, rows: 3, price: 6.0}}
          - {{shop: b, total: 4, top: 5.0, low: 5.0, all_ok: true, any_ok: true, avg: 4.0, rows: 1, price: 5.0}}
    - type: Combine
      name: Collect
      input: Sales
      config:
        group_by: [shop]
        combine:
          tags: {{fn: group, value: tag}}
          joined: {{fn: concat, value: tag}}
    - type: WriteToJson
      input: Collect
      config: {{path: "$DIR/collect.jsonl"}}
"#
    );
    let dir = tempfile::tempdir().unwrap();
    run_ok(&at(&yaml, dir.path())).await;
    // group and concat have no defined order: compare sorted.
    let rows = read_jsonl(dir.path(), "collect");
    assert_eq!(rows.len(), 2);
    for r in rows {
        let mut tags: Vec<String> = r["tags"]
            .as_array()
            .unwrap_or_else(|| panic!("tags list in {r}"))
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        tags.sort();
        let mut joined: Vec<char> = r["joined"]
            .as_str()
            .unwrap_or_else(|| panic!("joined in {r}"))
            .chars()
            .collect();
        joined.sort();
        let (want_tags, want_joined) = match r["shop"].as_str() {
            Some("a") => (vec!["p", "q", "r"], vec!['p', 'q', 'r']),
            Some("b") => (vec!["s"], vec!['s']),
            other => panic!("unexpected shop {other:?}"),
        };
        assert_eq!(tags, want_tags);
        assert_eq!(joined, want_joined);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn combine_by_several_fields_and_globally() {
    run_ok(&format!(
        r#"
pipeline:
  transforms:{SALES}
    - type: Combine
      name: PerShopItem
      input: Sales
      config:
        group_by: [shop, item]
        combine:
          n: sum
          rows: {{fn: count, value: tag}}
    - type: AssertEqual
      input: PerShopItem
      config:
        elements:
          - {{shop: a, item: x, n: 3, rows: 2}}
          - {{shop: a, item: y, n: 3, rows: 1}}
          - {{shop: b, item: x, n: 4, rows: 1}}
    - type: Combine
      name: Everything
      input: Sales
      config:
        group_by: []
        combine:
          n: sum
          mean_price: {{fn: mean, value: price}}
          shops: {{fn: count}}
    - type: AssertEqual
      input: Everything
      config:
        elements: [{{n: 10, mean_price: 2.75, shops: 4}}]
    # language: sql values are expressions
    - type: Combine
      name: Revenue
      input: Sales
      config:
        language: sql
        group_by: shop
        combine:
          revenue: {{fn: sum, value: "n * price"}}
    - type: AssertEqual
      input: Revenue
      config:
        elements: [{{shop: a, revenue: 13.0}}, {{shop: b, revenue: 20.0}}]
"#
    ))
    .await;
}

// ---------------------------------------------------------------- time and windows

const EVENTS: &str = r#"
    - type: Create
      name: Events
      config:
        elements:
          - {user: a, t: "2024-01-15T10:00:05Z", v: 1}
          - {user: b, t: "2024-01-15T10:00:50Z", v: 2}
          - {user: a, t: "2024-01-15T10:01:10Z", v: 3}
          - {user: a, t: "2024-01-15T10:02:00Z", v: 4}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assign_timestamps_window_into_fixed_and_extract_windowing_info() {
    run_ok(&format!(
        r#"
pipeline:
  transforms:{EVENTS}
    - type: AssignTimestamps
      name: Stamped
      input: Events
      config: {{timestamp: t}}
    - type: WindowInto
      name: Minutes
      input: Stamped
      windowing: {{type: fixed, size: 60s}}
    - type: ExtractWindowingInfo
      name: Info
      input: Minutes
      config:
        fields: [window_start, window_end, window_string, window_type]
    - type: MapToFields
      name: Shown
      input: Info
      config:
        language: sql
        fields:
          v: v
          ws: "CAST(window_start AS VARCHAR)"
          we: "CAST(window_end AS VARCHAR)"
          s: window_string
          ty: window_type
    - type: AssertEqual
      input: Shown
      config:
        elements:
          - {{v: 1, ws: "2024-01-15T10:00:00Z", we: "2024-01-15T10:01:00Z", s: "[1705312800.0, 1705312860.0)", ty: IntervalWindow}}
          - {{v: 2, ws: "2024-01-15T10:00:00Z", we: "2024-01-15T10:01:00Z", s: "[1705312800.0, 1705312860.0)", ty: IntervalWindow}}
          - {{v: 3, ws: "2024-01-15T10:01:00Z", we: "2024-01-15T10:02:00Z", s: "[1705312860.0, 1705312920.0)", ty: IntervalWindow}}
          - {{v: 4, ws: "2024-01-15T10:02:00Z", we: "2024-01-15T10:03:00Z", s: "[1705312920.0, 1705312980.0)", ty: IntervalWindow}}
    # The element timestamp, as a field named by a mapping (Beam: new name -> parameter).
    - type: ExtractWindowingInfo
      name: Ts
      input: Stamped
      config: {{fields: {{event_time: timestamp}}}}
    - type: MapToFields
      name: TsShown
      input: Ts
      config: {{language: sql, fields: {{v: v, ts: "CAST(event_time AS VARCHAR)"}}}}
    - type: AssertEqual
      input: TsShown
      config:
        elements:
          - {{v: 1, ts: "2024-01-15T10:00:05Z"}}
          - {{v: 2, ts: "2024-01-15T10:00:50Z"}}
          - {{v: 3, ts: "2024-01-15T10:01:10Z"}}
          - {{v: 4, ts: "2024-01-15T10:02:00Z"}}
"#
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn combine_per_fixed_sliding_and_global_window() {
    run_ok(&format!(
        r#"
pipeline:
  transforms:{EVENTS}
    - type: AssignTimestamps
      name: Stamped
      input: Events
      config: {{language: sql, timestamp: "CAST(t AS TIMESTAMP)"}}
    # fixed: one result per key and minute
    - type: WindowInto
      name: Fixed
      input: Stamped
      windowing: {{type: fixed, size: 1m}}
    - type: Combine
      name: PerMinute
      input: Fixed
      config:
        group_by: user
        combine: {{v: sum}}
    - type: ExtractWindowingInfo
      name: PerMinuteInfo
      input: PerMinute
      config: {{fields: [window_start, timestamp]}}
    - type: MapToFields
      name: PerMinuteShown
      input: PerMinuteInfo
      config:
        language: sql
        fields:
          user: user
          v: v
          start: "CAST(window_start AS VARCHAR)"
          ts: "CAST(timestamp AS VARCHAR)"
    - type: AssertEqual
      input: PerMinuteShown
      config:
        elements:
          - {{user: a, v: 1, start: "2024-01-15T10:00:00Z", ts: "2024-01-15T10:00:59.999999Z"}}
          - {{user: b, v: 2, start: "2024-01-15T10:00:00Z", ts: "2024-01-15T10:00:59.999999Z"}}
          - {{user: a, v: 3, start: "2024-01-15T10:01:00Z", ts: "2024-01-15T10:01:59.999999Z"}}
          - {{user: a, v: 4, start: "2024-01-15T10:02:00Z", ts: "2024-01-15T10:02:59.999999Z"}}
    # sliding: 2-minute windows every minute; each element is in two windows
    - type: WindowInto
      name: Sliding
      input: Stamped
      windowing: {{type: sliding, size: 2m, period: 1m}}
    - type: Combine
      name: PerSlide
      input: Sliding
      config:
        group_by: []
        combine: {{v: sum, n: {{fn: count}}}}
    - type: ExtractWindowingInfo
      name: SlideInfo
      input: PerSlide
      config: {{fields: [window_start]}}
    - type: MapToFields
      name: SlideShown
      input: SlideInfo
      config: {{language: sql, fields: {{v: v, n: n, start: "CAST(window_start AS VARCHAR)"}}}}
    - type: AssertEqual
      input: SlideShown
      config:
        elements:
          - {{v: 3, n: 2, start: "2024-01-15T09:59:00Z"}}
          - {{v: 6, n: 3, start: "2024-01-15T10:00:00Z"}}
          - {{v: 7, n: 2, start: "2024-01-15T10:01:00Z"}}
          - {{v: 4, n: 1, start: "2024-01-15T10:02:00Z"}}
    # global: back to one window for everything
    - type: WindowInto
      name: Global
      input: Fixed
      windowing: {{type: global}}
    - type: Combine
      name: PerUser
      input: Global
      config: {{group_by: user, combine: {{v: sum}}}}
    - type: ExtractWindowingInfo
      name: GlobalInfo
      input: PerUser
      config: {{fields: [window_type]}}
    - type: AssertEqual
      input: GlobalInfo
      config:
        elements: [{{user: a, v: 8, window_type: GlobalWindow}}, {{user: b, v: 2, window_type: GlobalWindow}}]
"#
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windowing_on_a_transform_windows_its_input() {
    run_ok(&format!(
        r#"
pipeline:
  transforms:{EVENTS}
    - type: AssignTimestamps
      name: Stamped
      input: Events
      config: {{timestamp: t}}
    - type: Combine
      name: PerMinute
      input: Stamped
      windowing: {{type: fixed, size: 60}}
      config:
        group_by: []
        combine: {{v: sum}}
    - type: AssertEqual
      input: PerMinute
      config:
        elements: [{{v: 3}}, {{v: 3}}, {{v: 4}}]
"#
    ))
    .await;
}

// ---------------------------------------------------------------- Sql and Join

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_over_one_input_and_over_named_inputs() {
    run_ok(&format!(
        r#"
pipeline:
  transforms:{SALES}
    - type: Sql
      name: Single
      input: Sales
      config:
        query: "SELECT shop, SUM(n) AS n FROM PCOLLECTION WHERE ok GROUP BY shop"
    - type: AssertEqual
      input: Single
      config: {{elements: [{{shop: a, n: 3}}, {{shop: b, n: 4}}]}}
    - type: Create
      name: Shops
      config: {{elements: [{{shop: a, city: Paris}}, {{shop: b, city: Oslo}}]}}
    - type: Sql
      name: Named
      input: {{sales: Sales, shops: Shops}}
      config:
        query: "SELECT s.city, COUNT(*) AS sold FROM sales JOIN shops s ON sales.shop = s.shop GROUP BY s.city"
    - type: AssertEqual
      input: Named
      config: {{elements: [{{city: Paris, sold: 3}}, {{city: Oslo, sold: 1}}]}}
"#
    ))
    .await;
}

/// Beam SQL aggregates per window: on windowed input the query runs once per window and its
/// rows keep their window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_on_windowed_input_aggregates_per_window() {
    run_ok(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/windowed_sql.yaml"
        ))
        .unwrap(),
    )
    .await;
}

/// A windowed input joined with an unwindowed one (a side input, named first here): every
/// window sees all of the side input's rows, and the output keeps the windowed input's window,
/// so a count after it is per window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_input_is_seen_from_every_window_of_a_windowed_join() {
    run_ok(
        r#"
pipeline:
  transforms:
    - type: Create
      name: Names
      config:
        elements: [{k: a, name: ann}, {k: b, name: bob}]
    - type: Create
      name: Events
      config:
        elements: [{k: a, t: 0}, {k: a, t: 30}, {k: b, t: 70}, {k: a, t: 80}, {k: c, t: 90}]
    - type: AssignTimestamps
      input: Events
      config: {timestamp: t}
    - type: WindowInto
      name: Minutes
      input: AssignTimestamps
      windowing: {type: fixed, size: 60s}
    - type: Join
      name: Named
      input: {names: Names, e: Minutes}
      config: {type: inner, equalities: k, fields: {e: {k: k, t: t}, names: {name: name}}}
    - type: Combine
      name: PerWindow
      input: Named
      config:
        group_by: [name]
        combine: {n: {value: t, fn: count}}
    - type: ExtractWindowingInfo
      input: PerWindow
      config: {fields: [window_start]}
    - type: AssertEqual
      input: ExtractWindowingInfo
      config:
        elements:
          - {name: ann, n: 2, window_start: "1970-01-01T00:00:00Z"}
          - {name: ann, n: 1, window_start: "1970-01-01T00:01:00Z"}
          - {name: bob, n: 1, window_start: "1970-01-01T00:01:00Z"}
"#,
    )
    .await;
}

/// Beside session windows, a side input's rows meet every session of their key: the sessions
/// merge across the windowed input only, and each keeps its merged bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_input_is_seen_from_every_session_of_its_key() {
    run_ok(
        r#"
pipeline:
  transforms:
    - type: Create
      name: Names
      config:
        elements: [{k: a, name: ann}, {k: b, name: bob}]
    - type: Create
      name: Events
      config:
        elements: [{k: a, t: 0}, {k: a, t: 30}, {k: a, t: 200}, {k: b, t: 10}, {k: c, t: 20}]
    - type: AssignTimestamps
      input: Events
      config: {timestamp: t}
    - type: WindowInto
      name: Visits
      input: AssignTimestamps
      windowing: {type: sessions, gap: 60s}
    - type: Join
      name: Named
      input: {names: Names, v: Visits}
      config: {type: inner, equalities: k, fields: {v: {k: k, t: t}, names: {name: name}}}
    - type: Combine
      name: PerVisit
      input: Named
      config:
        group_by: [name]
        combine: {n: {value: t, fn: count}}
    - type: ExtractWindowingInfo
      input: PerVisit
      config: {fields: [window_start, window_end]}
    - type: AssertEqual
      input: ExtractWindowingInfo
      config:
        elements:
          - {name: ann, n: 2, window_start: "1970-01-01T00:00:00Z", window_end: "1970-01-01T00:01:30Z"}
          - {name: ann, n: 1, window_start: "1970-01-01T00:03:20Z", window_end: "1970-01-01T00:04:20Z"}
          - {name: bob, n: 1, window_start: "1970-01-01T00:00:10Z", window_end: "1970-01-01T00:01:10Z"}
"#,
    )
    .await;
}

const JOIN_INPUTS: &str = r#"
    - type: Create
      name: Orders
      config:
        elements: [{id: 1, cust: 10, amount: 5.0}, {id: 2, cust: 11, amount: 7.0}, {id: 3, cust: 99, amount: 1.0}]
    - type: Create
      name: Customers
      config:
        elements: [{cust: 10, name: ann}, {cust: 11, name: bob}, {cust: 12, name: cy}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_inner_left_and_outer() {
    run_ok(&format!(
        r#"
pipeline:
  transforms:{JOIN_INPUTS}
    - type: Join
      name: Inner
      input: {{orders: Orders, customers: Customers}}
      config: {{type: inner, equalities: cust}}
    - type: AssertEqual
      input: Inner
      config:
        elements: [{{id: 1, cust: 10, amount: 5.0, cust0: 10, name: ann}}, {{id: 2, cust: 11, amount: 7.0, cust0: 11, name: bob}}]
    - type: Join
      name: Left
      input: {{orders: Orders, customers: Customers}}
      config:
        type: left
        equalities: [{{orders: cust, customers: cust}}]
    - type: AssertEqual
      input: Left
      config:
        elements: [{{id: 1, cust: 10, amount: 5.0, cust0: 10, name: ann}}, {{id: 2, cust: 11, amount: 7.0, cust0: 11, name: bob}}, {{id: 3, cust: 99, amount: 1.0}}]
    - type: Join
      name: Outer
      input: {{orders: Orders, customers: Customers}}
      config:
        type: outer
        equalities: cust
        fields:
          orders: [id]
          customers: [name]
    - type: AssertEqual
      input: Outer
      config:
        elements: [{{id: 1, name: ann}}, {{id: 2, name: bob}}, {{id: 3}}, {{name: cy}}]
"#
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_fields_rename_and_default_to_all_fields_of_unlisted_inputs() {
    // Beam: an input missing from `fields` contributes all of its fields; a mapping renames.
    run_ok(&format!(
        r#"
pipeline:
  transforms:{JOIN_INPUTS}
    - type: Join
      name: J
      input: {{orders: Orders, customers: Customers}}
      config:
        equalities: cust
        fields:
          orders: {{order_id: id, total: amount}}
    - type: AssertEqual
      input: J
      config:
        elements: [{{order_id: 1, total: 5.0, cust: 10, name: ann}}, {{order_id: 2, total: 7.0, cust: 11, name: bob}}]
"#
    ))
    .await;
}

// ---------------------------------------------------------------- YAML forms

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chain_with_source_and_sink() {
    let dir = tempfile::tempdir().unwrap();
    let o = run_ok(&at(
        r#"
pipeline:
  type: chain
  source:
    type: Create
    config: {elements: [{n: 1}, {n: 2}, {n: 3}]}
  transforms:
    - type: Filter
      config: {language: sql, keep: "n > 1"}
    - type: MapToFields
      config: {language: sql, fields: {sq: n * n}}
  sink:
    type: WriteToJson
    config: {path: "$DIR/squares.jsonl"}
"#,
        dir.path(),
    ))
    .await;
    assert_eq!(o.count("Filter"), 2);
    assert_eq!(
        sorted(read_jsonl_file(
            &dir.path().join("squares.jsonl-00000-of-00001")
        )),
        [json!({"sq": 4}), json!({"sq": 9})]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_composites_with_inputs_and_outputs() {
    let o = run_ok(
        r#"
pipeline:
  transforms:
    - {type: Create, name: Nums, config: {elements: [{n: 1}, {n: 2}, {n: 3}, {n: 4}]}}
    - type: composite
      name: Outer
      input: Nums
      transforms:
        - type: Filter
          name: Even
          input: input
          config: {language: sql, keep: "n % 2 = 0"}
        - type: composite
          name: Inner
          input: Even
          transforms:
            - type: MapToFields
              name: Tenfold
              input: input
              config: {language: sql, fields: {n: n * 10}}
          output: Tenfold
      output:
        big: Inner
        even: Even
    - {type: AssertEqual, name: CheckBig, input: Outer.big, config: {elements: [{n: 20}, {n: 40}]}}
    - {type: AssertEqual, name: CheckEven, input: Outer.even, config: {elements: [{n: 2}, {n: 4}]}}
"#,
    )
    .await;
    assert_eq!(o.count("Outer/Inner/Tenfold"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assert_equal_failure_lists_missing_and_unexpected() {
    let e = run_err(
        r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{x: 1}, {x: 2}, {x: 3}]}}
    - type: AssertEqual
      name: Check
      input: In
      config: {elements: [{x: 1}, {x: 2}, {x: 4}]}
"#,
    )
    .await;
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            Failure::Run(riverbank_engine::RunError::Assertion { .. })
        ),
        "{msg}"
    );
    assert!(msg.contains("'Check'"), "{msg}");
    assert!(
        msg.contains("missing 1") && msg.contains("\"x\":4"),
        "{msg}"
    );
    assert!(
        msg.contains("unexpected 1") && msg.contains("\"x\":3"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_read_only_used_fields_and_drop_still_works() {
    // Projection pushdown must not break a MapToFields that drops a field nothing else uses.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.jsonl"), "{\"id\": 1, \"name\": \"ann\", \"junk\": 0}\n{\"id\": 2, \"name\": \"bob\", \"junk\": 0}\n").unwrap();
    run_ok(&at(
        r#"
pipeline:
  transforms:
    - type: ReadFromJson
      name: In
      config: {path: "$DIR/a.jsonl"}
    - type: MapToFields
      name: NoJunk
      input: In
      config: {append: true, drop: [junk]}
    - type: AssertEqual
      input: NoJunk
      config: {elements: [{id: 1, name: ann}, {id: 2, name: bob}]}
    - type: MapToFields
      name: OnlyId
      input: In
      config: {fields: {id: id}}
    - type: AssertEqual
      input: OnlyId
      config: {elements: [{id: 1}, {id: 2}]}
"#,
        dir.path(),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_with_one_named_input_uses_that_name() {
    run_ok(
        r#"
pipeline:
  transforms:
    - {type: Create, name: A, config: {elements: [{n: 1}, {n: 2}]}}
    - type: Sql
      name: Named
      input: {input_rows: A}
      config: {query: "SELECT SUM(n) AS total FROM input_rows"}
    - {type: AssertEqual, input: Named, config: {elements: [{total: 3}]}}
    - type: Sql
      name: Listed
      input: [A]
      config: {query: "SELECT COUNT(*) AS c FROM PCOLLECTION"}
    - {type: AssertEqual, input: Listed, config: {elements: [{c: 2}]}}
"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_renames_clashing_fields_as_beams_own_tests_expect() {
    // apache_beam/yaml/yaml_join_test.py: test_join_three_inputs and test_join_with_fields.
    let inputs = r#"
    - type: Create
      name: Fruits
      config: {elements: [{id: 1, name: raspberry}, {id: 2, name: blackberry}, {id: 3, name: blueberry}]}
    - type: Create
      name: Quantities
      config: {elements: [{name: raspberry, quantity: 1}, {name: blackberry, quantity: 2}]}
    - type: Create
      name: Categories
      config: {elements: [{name: raspberry, category: juicy}, {name: blackberry, category: dry}]}
"#;
    run_ok(&format!(
        r#"
pipeline:
  transforms:{inputs}
    - type: Join
      name: Three
      input: {{f: Fruits, q: Quantities, c: Categories}}
      config: {{type: inner, equalities: name}}
    - type: AssertEqual
      input: Three
      config:
        elements:
          - {{id: 1, name: raspberry, name0: raspberry, quantity: 1, name1: raspberry, category: juicy}}
          - {{id: 2, name: blackberry, name0: blackberry, quantity: 2, name1: blackberry, category: dry}}
    - type: Join
      name: WithFields
      input: {{f: Fruits, q: Quantities, c: Categories}}
      config:
        type: inner
        equalities: [{{f: name, q: name}}, {{f: name, c: name}}]
        fields: {{f: {{f_id: id}}, q: [name, quantity]}}
    - type: AssertEqual
      input: WithFields
      config:
        elements:
          - {{f_id: 1, name: raspberry, quantity: 1, name0: raspberry, category: juicy}}
          - {{f_id: 2, name: blackberry, quantity: 2, name0: blackberry, category: dry}}
"#
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_of_three_inputs_with_chained_equalities() {
    // Beam relates each equality's first input to its others; they need not name the first input.
    run_ok(
        r#"
pipeline:
  transforms:
    - {type: Create, name: Orders, config: {elements: [{oid: 1, cust: 10}, {oid: 2, cust: 11}]}}
    - {type: Create, name: Customers, config: {elements: [{cid: 10, city: 100}, {cid: 11, city: 101}]}}
    - {type: Create, name: Cities, config: {elements: [{id: 100, cname: Paris}]}}
    - type: Join
      name: J
      input: {o: Orders, c: Customers, t: Cities}
      config:
        type: inner
        equalities:
          - {o: cust, c: cid}
          - {c: city, t: id}
        fields:
          o: [oid]
          t: [cname]
          c: []
    - {type: AssertEqual, input: J, config: {elements: [{oid: 1, cname: Paris}]}}
"#,
    )
    .await;
    let e = plan_error(
        run_err(
            r#"
pipeline:
  transforms:
    - {type: Create, name: A, config: {elements: [{x: 1}]}}
    - {type: Create, name: B, config: {elements: [{x: 1}]}}
    - {type: Create, name: C, config: {elements: [{y: 1}]}}
    - type: Join
      name: J
      input: {a: A, b: B, c: C}
      config: {equalities: [{a: x, b: x}]}
    - {type: LogForTesting, input: J}
"#,
        )
        .await,
    );
    assert!(
        e.contains("'J'") && e.contains("'c'"),
        "an input the equalities leave out is named: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reshuffle_keeps_timestamps_and_windows_and_sessions_merge() {
    run_ok(
        r#"
pipeline:
  transforms:
    - type: Create
      name: Clicks
      config:
        elements:
          - {user: a, t: 0}
          - {user: a, t: 20}
          - {user: a, t: 100}
          - {user: b, t: 10}
    - {type: AssignTimestamps, name: Stamped, input: Clicks, config: {timestamp: t}}
    - {type: WindowInto, name: Tens, input: Stamped, windowing: {type: fixed, size: 50s}}
    - {type: Reshuffle, name: Shuffled, input: Tens}
    - {type: Combine, name: PerWindow, input: Shuffled, config: {group_by: user, combine: {n: {fn: count}}}}
    - {type: ExtractWindowingInfo, name: Info, input: PerWindow, config: {fields: [window_start]}}
    - type: MapToFields
      name: Shown
      input: Info
      config: {language: sql, fields: {user: user, n: n, start: "CAST(window_start AS VARCHAR)"}}
    - type: AssertEqual
      input: Shown
      config:
        elements:
          - {user: a, n: 2, start: "1970-01-01T00:00:00Z"}
          - {user: a, n: 1, start: "1970-01-01T00:01:40Z"}
          - {user: b, n: 1, start: "1970-01-01T00:00:00Z"}
    # sessions with a 30s gap: a's clicks at 0 and 20 merge, 100 is alone.
    - {type: WindowInto, name: Sessions, input: Stamped, windowing: {type: sessions, gap: 30s}}
    - {type: Combine, name: PerSession, input: Sessions, config: {group_by: user, combine: {n: {fn: count}}}}
    - {type: ExtractWindowingInfo, name: SessionInfo, input: PerSession, config: {fields: [window_start, window_end]}}
    - type: MapToFields
      name: SessionShown
      input: SessionInfo
      config: {language: sql, fields: {user: user, n: n, start: "CAST(window_start AS VARCHAR)", end: "CAST(window_end AS VARCHAR)"}}
    - type: AssertEqual
      input: SessionShown
      config:
        elements:
          - {user: a, n: 2, start: "1970-01-01T00:00:00Z", end: "1970-01-01T00:00:50Z"}
          - {user: a, n: 1, start: "1970-01-01T00:01:40Z", end: "1970-01-01T00:02:10Z"}
          - {user: b, n: 1, start: "1970-01-01T00:00:10Z", end: "1970-01-01T00:00:40Z"}
"#,
    )
    .await;
}

/// Sessions under a Sql or Join (batch): they merge per key at the query's grouping, as Beam
/// SQL's GroupByKey merges them: a Sql's GROUP BY fields (none: every row one key), a Join's
/// equalities across its inputs (a purchase bridges a user's clicks into one session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_and_join_over_sessions_merge_them_per_key() {
    run_ok(
        r#"
pipeline:
  transforms:
    - type: Create
      name: Clicks
      config:
        elements:
          - {user: a, t: 0}
          - {user: a, t: 20}
          - {user: a, t: 100}
          - {user: b, t: 10}
    - {type: AssignTimestamps, name: StampedClicks, input: Clicks, config: {timestamp: t}}
    - {type: WindowInto, name: ClickSessions, input: StampedClicks, windowing: {type: sessions, gap: 30s}}
    - type: Sql
      name: PerUser
      input: ClickSessions
      config: {query: "SELECT user, COUNT(*) AS n FROM PCOLLECTION GROUP BY user"}
    - {type: ExtractWindowingInfo, name: PerUserInfo, input: PerUser, config: {fields: [window_start, window_end]}}
    - type: MapToFields
      name: PerUserShown
      input: PerUserInfo
      config: {language: sql, fields: {user: user, n: n, start: "EXTRACT(EPOCH FROM window_start)", end: "EXTRACT(EPOCH FROM window_end)"}}
    - type: AssertEqual
      input: PerUserShown
      config:
        elements:
          - {user: a, n: 2, start: 0, end: 50}
          - {user: a, n: 1, start: 100, end: 130}
          - {user: b, n: 1, start: 10, end: 40}
    - type: Sql
      name: Everyone
      input: ClickSessions
      config: {query: "SELECT COUNT(*) AS n FROM PCOLLECTION"}
    - {type: ExtractWindowingInfo, name: EveryoneInfo, input: Everyone, config: {fields: [window_start]}}
    - type: MapToFields
      name: EveryoneShown
      input: EveryoneInfo
      config: {language: sql, fields: {n: n, start: "EXTRACT(EPOCH FROM window_start)"}}
    - type: AssertEqual
      input: EveryoneShown
      config: {elements: [{n: 3, start: 0}, {n: 1, start: 100}]}
    - type: Create
      name: Purchases
      config:
        elements:
          - {buyer: a, pt: 45, amount: 5}
          - {buyer: b, pt: 100, amount: 7}
    - {type: AssignTimestamps, name: StampedPurchases, input: Purchases, config: {timestamp: pt}}
    - {type: WindowInto, name: PurchaseSessions, input: StampedPurchases, windowing: {type: sessions, gap: 30s}}
    - type: Join
      name: Bought
      input: {clicks: ClickSessions, purchases: PurchaseSessions}
      config:
        type: inner
        equalities:
          - clicks: user
            purchases: buyer
    - {type: ExtractWindowingInfo, name: BoughtInfo, input: Bought, config: {fields: [window_start, window_end]}}
    - type: MapToFields
      name: BoughtShown
      input: BoughtInfo
      config: {language: sql, fields: {user: user, t: t, amount: amount, start: "EXTRACT(EPOCH FROM window_start)", end: "EXTRACT(EPOCH FROM window_end)"}}
    - type: AssertEqual
      input: BoughtShown
      config:
        elements:
          - {user: a, t: 0, amount: 5, start: 0, end: 75}
          - {user: a, t: 20, amount: 5, start: 0, end: 75}
"#,
    )
    .await;
    // A Join whose equalities do not all name every input has no one key to merge by.
    let e = plan_error(
        run_err(
            r#"
pipeline:
  transforms:
    - {type: Create, name: A, config: {elements: [{x: 1, y: 1}]}}
    - {type: Create, name: B, config: {elements: [{x: 1, z: 1}]}}
    - {type: Create, name: C, config: {elements: [{y: 1, z: 1}]}}
    - {type: WindowInto, name: SA, input: A, windowing: {type: sessions, gap: 30s}}
    - {type: WindowInto, name: SB, input: B, windowing: {type: sessions, gap: 30s}}
    - {type: WindowInto, name: SC, input: C, windowing: {type: sessions, gap: 30s}}
    - type: Join
      name: Three
      input: {a: SA, b: SB, c: SC}
      config:
        type: inner
        equalities:
          - {a: x, b: x}
          - {b: z, c: z}
    - {type: LogForTesting, input: Three}
"#,
        )
        .await,
    );
    assert!(
        e.contains("Three") && e.contains("every equality must name every input"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assert_equal_on_an_empty_collection() {
    run_ok(
        r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{n: 1}]}}
    - {type: Filter, name: None, input: In, config: {language: sql, keep: "n > 5"}}
    - {type: AssertEqual, input: None, config: {elements: []}}
    - {type: Combine, name: NoGroups, input: None, config: {group_by: [], combine: {n: sum}}}
    - {type: AssertEqual, input: NoGroups, config: {elements: []}}
"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_join_reads_the_same_collection_twice() {
    run_ok(
        r#"
pipeline:
  transforms:
    - {type: Create, name: People, config: {elements: [{id: 1, boss: 2, name: ann}, {id: 2, boss: 2, name: bob}]}}
    - type: Join
      name: WithBoss
      input: {e: People, b: People}
      config:
        equalities: [{e: boss, b: id}]
        fields: {e: [name], b: {boss_name: name}}
    - {type: AssertEqual, input: WithBoss, config: {elements: [{name: ann, boss_name: bob}, {name: bob, boss_name: bob}]}}
"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_counts_the_elements_it_routes() {
    let o = run_ok(
        r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{k: a}, {k: b}, {k: c}]}}
    - {type: Partition, name: P, input: In, config: {by: k, outputs: [a, b], unknown_output: other}}
    - {type: LogForTesting, input: [P.a, P.b, P.other]}
"#,
    )
    .await;
    assert_eq!(o.count("P"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_accepts_inputs_named_like_beams_examples() {
    // From Beam's yaml-join docs: inputs named input1, input2.
    run_ok(
        r#"
pipeline:
  transforms:
    - {type: Create, name: First Input, config: {elements: [{col1: 1, a: x}, {col1: 2, a: z}]}}
    - {type: Create, name: Second Input, config: {elements: [{col2: 1, b: y}]}}
    - type: Join
      input:
        input1: First Input
        input2: Second Input
      config:
        equalities:
          - input1: col1
            input2: col2
    - {type: AssertEqual, input: Join, config: {elements: [{col1: 1, a: x, col2: 1, b: y}]}}
"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flatten_of_differing_field_types_keeps_every_value() {
    // Beam keeps each row as it is; one Arrow schema widens instead: integers and floats to
    // float, nested rows field by field, any other pair to `Any`, which keeps each value as it
    // was. No value may be lost or changed.
    let dir = tempfile::tempdir().unwrap();
    run_ok(&at(
        r#"
pipeline:
  transforms:
    - type: Create
      name: Ints
      config: {elements: [{id: 1, value: 100, score: 2, ok: true, big: 1.0e+20, pos: {a: 1}, tags: [1]}]}
    - type: Create
      name: Texts
      config: {elements: [{id: x3, value: text, score: 2.5, ok: 'no', big: 'n/a', pos: {a: b, c: true}, tags: [1.5]}]}
    - {type: Flatten, name: Both, input: [Ints, Texts]}
    - {type: WriteToJson, input: Both, config: {path: "$DIR/out/both.jsonl"}}
"#,
        dir.path(),
    ))
    .await;
    assert_eq!(
        sorted(read_jsonl(&dir.path().join("out"), "both")),
        sorted(vec![
            json!({"id": 1, "value": 100, "score": 2.0, "ok": true, "big": 1.0e+20, "pos": {"a": 1, "c": null}, "tags": [1.0]}),
            json!({"id": "x3", "value": "text", "score": 2.5, "ok": "no", "big": "n/a", "pos": {"a": "b", "c": true}, "tags": [1.5]}),
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_of_differing_field_types_keeps_every_value() {
    let dir = tempfile::tempdir().unwrap();
    run_ok(&at(
        r#"
pipeline:
  transforms:
    - {type: Create, name: Mixed, config: {elements: [{v: 1, w: 1}, {v: 'a', w: 2.5}]}}
    - {type: WriteToJson, input: Mixed, config: {path: "$DIR/out/mixed.jsonl"}}
"#,
        dir.path(),
    ))
    .await;
    assert_eq!(
        sorted(read_jsonl(&dir.path().join("out"), "mixed")),
        sorted(vec![json!({"v": 1, "w": 1.0}), json!({"v": "a", "w": 2.5})])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elements_without_timestamps_are_windowed_at_the_minimum_timestamp() {
    // As Beam: a Create's elements have the minimum timestamp, so every window fn puts them
    // in its first window(s); the global window needs no timestamp at all. (Beam's own
    // windowinto.yaml shape: chains nested in a composite.)
    let o = run_ok(
        r#"
pipeline:
  type: composite
  transforms:
    - type: Create
      config: {elements: [{k: x, t: 1}, {k: x, t: 8}, {k: y, t: 101}]}
    - type: chain
      name: Global
      input: Create
      transforms:
        - {type: WindowInto, config: {windowing: {type: global}}}
        - {type: Combine, config: {group_by: k, combine: {t: sum}}}
        - {type: AssertEqual, config: {elements: [{k: x, t: 9}, {k: y, t: 101}]}}
    - type: chain
      name: Fixed
      input: Create
      transforms:
        - {type: WindowInto, config: {windowing: {type: fixed, size: 10s, offset: 5s}}}
        - {type: Combine, config: {group_by: k, combine: {t: sum}}}
        - {type: AssertEqual, config: {elements: [{k: x, t: 9}, {k: y, t: 101}]}}
    - type: chain
      name: Sliding
      input: Create
      transforms:
        - {type: WindowInto, config: {windowing: {type: sliding, size: 20s, period: 10s}}}
        - {type: Combine, config: {group_by: k, combine: {t: sum}}}
        - {type: AssertEqual, config: {elements: [{k: x, t: 9}, {k: x, t: 9}, {k: y, t: 101}, {k: y, t: 101}]}}
    - type: chain
      name: Sessions
      input: Create
      transforms:
        - {type: WindowInto, config: {windowing: {type: sessions, gap: 5s}}}
        - {type: Combine, config: {group_by: k, combine: {t: sum}}}
        - {type: AssertEqual, config: {elements: [{k: x, t: 9}, {k: y, t: 101}]}}
    - type: chain
      name: PerWindowSql
      input: Create
      windowing: {type: fixed, size: 60s}
      transforms:
        - {type: Sql, config: {query: "SELECT k, SUM(t) AS t FROM PCOLLECTION GROUP BY k"}}
        - {type: ExtractWindowingInfo, config: {fields: [window_type]}}
        - {type: AssertEqual, config: {elements: [{k: x, t: 9, window_type: IntervalWindow}, {k: y, t: 101, window_type: IntervalWindow}]}}
"#,
    )
    .await;
    assert_eq!(o.count("Global/WindowInto"), 3);
    assert_eq!(o.count("Sliding/WindowInto"), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_language_takes_literals_and_one_comparison() {
    // Beam's generic language: a field, a literal (integer, float, "quoted string"), or in
    // MapToFields and Filter one comparison of two of those, with Python's meaning.
    run_ok(
        r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{a: x, col2: 5, f: 1.5}, {a: y, col2: -1, f: 2.0}, {col2: 0, f: 0.5}]}}
    - type: MapToFields
      name: Lits
      input: In
      config:
        fields:
          a: a
          n: 389
          neg: -7
          r: 1.9
          s: '"text"'
          pos: "col2 > 0"
          is_x: "a == 'x'"
          is_y: 'a == "y"'
          ge: "f >= 2"
          ne: "col2 != 5"
          mixed: "a == 1"
          lit_cmp: "1 < 2.5"
    - type: AssertEqual
      input: Lits
      config:
        elements:
          - {a: x, n: 389, neg: -7, r: 1.9, s: text, pos: true, is_x: true, is_y: false, ge: false, ne: false, mixed: false, lit_cmp: true}
          - {a: y, n: 389, neg: -7, r: 1.9, s: text, pos: false, is_x: false, is_y: true, ge: true, ne: true, mixed: false, lit_cmp: true}
          - {n: 389, neg: -7, r: 1.9, s: text, pos: false, is_x: false, is_y: false, ge: false, ne: true, mixed: false, lit_cmp: true}
    - type: Filter
      name: Positive
      input: In
      config: {keep: "col2 > 0"}
    - {type: AssertEqual, input: Positive, config: {elements: [{a: x, col2: 5, f: 1.5}]}}
    - type: Partition
      name: Split
      input: In
      config: {by: '"all"', outputs: [all]}
    - {type: AssertEqual, input: Split.all, config: {elements: [{a: x, col2: 5, f: 1.5}, {a: y, col2: -1, f: 2.0}, {col2: 0, f: 0.5}]}}
"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explode_of_a_string_iterates_its_characters() {
    // Beam iterates the field in Python: a string gives its characters (code points).
    run_ok(
        r#"
pipeline:
  transforms:
    - type: Create
      name: In
      config:
        elements:
          - {id: 1, w: ab, l: [1, 2, 3]}
          - {id: 2, w: "é✓", l: [4]}
          - {id: 3, w: "", l: [5]}
    - type: Explode
      name: Chars
      input: In
      config: {fields: w}
    - type: AssertEqual
      input: Chars
      config:
        elements:
          - {id: 1, w: a, l: [1, 2, 3]}
          - {id: 1, w: b, l: [1, 2, 3]}
          - {id: 2, w: "é", l: [4]}
          - {id: 2, w: "✓", l: [4]}
    - type: Explode
      name: Zip
      input: In
      config: {fields: [w, l], cross_product: false}
    - type: AssertEqual
      input: Zip
      config:
        elements:
          - {id: 1, w: a, l: 1}
          - {id: 1, w: b, l: 2}
          - {id: 1, l: 3}
          - {id: 2, w: "é", l: 4}
          - {id: 2, w: "✓"}
          - {id: 3, l: 5}
"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_with_schema_passes_valid_rows_and_sends_the_others_to_the_error_output() {
    // Beam's validate_with_schema.yaml (its mixed-type Create aside: one Arrow schema widens
    // such fields, see flatten_of_differing_field_types_keeps_every_value), plus the numeric
    // bounds, enum, pattern, nested rows and lists JSON schema has.
    let o = run_ok(
        r#"
pipeline:
  type: composite
  transforms:
    - type: chain
      name: AllValid
      transforms:
        - type: Create
          config:
            elements:
              - {name: "Alice", age: 30, score: 95.5}
              - {name: "Bob", age: 25, score: 88.0}
        - type: ValidateWithSchema
          config:
            schema:
              type: object
              properties:
                name: {type: string}
                age: {type: integer}
                score: {type: number}
        - type: AssertEqual
          config:
            elements:
              - {name: "Alice", age: 30, score: 95.5}
              - {name: "Bob", age: 25, score: 88.0}
    - type: Create
      config:
        elements:
          - {name: "Alice", age: 30.0, score: 95.5}
          - {name: "Bob", age: 25.0, score: 88.0}
          - {name: "Charlie", age: 27.5, score: 90.0}
          - {name: "David", score: 90.0}
    - type: ValidateWithSchema
      input: Create
      config:
        schema:
          type: object
          properties:
            name: {type: string}
            age: {type: integer}
            score: {type: number}
          required: [name, age, score]
        error_handling:
          output: invalid_rows
    - type: MapToFields
      name: Invalid
      input: ValidateWithSchema.invalid_rows
      config:
        language: sql
        fields:
          name: "element['name']"
          msg: msg
    - type: AssertEqual
      input: Invalid
      config:
        elements:
          - {name: "Charlie", msg: "field 'age': 27.5 is not of type 'integer'"}
          - {name: "David", msg: "'age' is a required property"}
    - type: AssertEqual
      input: ValidateWithSchema
      config:
        elements:
          - {name: "Alice", age: 30, score: 95.5}
          - {name: "Bob", age: 25, score: 88.0}
    - type: Create
      name: More
      config:
        elements:
          - {id: 1, kind: a, pos: {lat: 10.0}, tags: [x, y], code: AB1}
          - {id: 0, kind: a, pos: {lat: 10.0}, tags: [x], code: AB2}
          - {id: 2, kind: c, pos: {lat: 10.0}, tags: [x], code: AB3}
          - {id: 3, kind: b, pos: {lat: 95.5}, tags: [x], code: AB4}
          - {id: 4, kind: b, pos: {lat: 1.0}, tags: [], code: AB5}
          - {id: 5, kind: b, pos: {lat: 1.0}, tags: [x], code: X}
          - {id: 6, kind: b, tags: [x], code: AB6}
    - type: ValidateWithSchema
      name: Rules
      input: More
      config:
        schema:
          type: object
          properties:
            id: {type: integer, minimum: 1}
            kind: {enum: [a, b]}
            pos:
              type: object
              properties: {lat: {type: number, exclusiveMaximum: 90}}
              required: [lat]
            tags: {type: array, items: {type: string}, minItems: 1}
            code: {type: string, pattern: "^AB[0-9]$"}
          required: [pos]
        error_handling: {output: bad}
    - type: MapToFields
      name: RulesBroken
      input: Rules.bad
      config: {language: sql, fields: {id: "element['id']", msg: msg}}
    - type: AssertEqual
      input: RulesBroken
      config:
        elements:
          - {id: 0, msg: "field 'id': 0 is less than the minimum of 1"}
          - {id: 2, msg: "field 'kind': \"c\" is not one of [\"a\",\"b\"]"}
          - {id: 3, msg: "field 'pos.lat': 95.5 is greater than or equal to the maximum of 90"}
          - {id: 4, msg: "field 'tags': [] is too short"}
          - {id: 5, msg: "field 'code': \"X\" does not match \"^AB[0-9]$\""}
          - {id: 6, msg: "'pos' is a required property"}
    - {type: AssertEqual, input: Rules, config: {elements: [{id: 1, kind: a, pos: {lat: 10.0}, tags: [x, y], code: AB1}]}}
"#,
    )
    .await;
    assert_eq!(o.count("ValidateWithSchema"), 2);
}
