//! `language: python` UDFs end to end: Beam's YAML UDF test cases written in Python, every
//! place a UDF is taken, error outputs with the Python traceback, and errors found before
//! running.
mod common;

use common::{Failure, read_jsonl, run_err, run_ok, sorted};
use riverbank_engine::RunError;
use serde_json::json;
use std::path::Path;

fn at(yaml: &str, dir: &Path) -> String {
    yaml.replace("$DIR", dir.to_string_lossy().as_ref())
}

/// Beam's test data (`YamlUDFMappingTest.data`).
const ROWS: &str = r#"
    - type: Create
      name: In
      config:
        elements:
          - {label: '11a', conductor: 11, rank: 0}
          - {label: '37a', conductor: 37, rank: 1}
          - {label: '389a', conductor: 389, rank: 2}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beam_map_to_fields_and_filter_with_inline_python() {
    // test_map_to_fields_filter_inline_py
    run_ok(&format!(
        r#"
pipeline:
  transforms:{ROWS}
    - type: MapToFields
      name: Map
      input: In
      config:
        language: python
        fields:
          label:
            callable: "lambda x: x.label + 'x'"
          conductor:
            callable: "lambda x: x.conductor + 1"
          row_number:
            expression: rank
    - type: Filter
      name: Keep
      input: Map
      config:
        language: python
        keep: "row_number > 0 and label.endswith('ax')"
    - type: AssertEqual
      input: Keep
      config:
        elements:
          - {{label: '37ax', conductor: 38, row_number: 1}}
          - {{label: '389ax', conductor: 390, row_number: 2}}
"#
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_from_a_file_and_a_def_callable() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("udfs.py"),
        "import re\n\ndef digits(row):\n    return int(re.sub(r'[^0-9]', '', row.label))\n",
    )
    .unwrap();
    run_ok(&at(
        &format!(
            r#"
pipeline:
  transforms:{ROWS}
    - type: MapToFields
      name: Map
      input: In
      config:
        language: python
        fields:
          n:
            path: $DIR/udfs.py
            name: digits
          big:
            output_type: string
            callable: |
              def big(row):
                  if row.conductor > 20:
                      return 'big'
                  return None
    - type: AssertEqual
      input: Map
      config:
        elements:
          - {{n: 11, big: null}}
          - {{n: 37, big: big}}
          - {{n: 389, big: big}}
"#
        ),
        dir.path(),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_assign_timestamps_and_combine_take_python() {
    run_ok(
        r#"
pipeline:
  transforms:
    - type: Create
      name: Fruits
      config:
        elements:
          - {produce: Apple, secs: 1705312800, n: 1}
          - {produce: Apricot, secs: 1705312830, n: 2}
          - {produce: Blueberry, secs: 1705312870, n: 3}
          - {produce: Date, secs: 1705312875, n: 4}
          - {produce: Fig, secs: 1705312880, n: 5}
          - {produce: Mango, secs: 1705312890, n: 6}
    # Beam's partition.yaml example with unknown_output.
    - type: Partition
      name: ByVowel
      input: Fruits
      config:
        language: python
        by:
          callable: |
            def partition(row):
              if row.produce[0] in 'AEIOU':
                return 'vowel_fruits'
              elif row.produce in ('Date', 'Mango'):
                return 'yummy_fruits'
        outputs: [vowel_fruits, yummy_fruits]
        unknown_output: unknown_fruits
    - type: MapToFields
      name: Yummy
      input: ByVowel.yummy_fruits
      config: {fields: {produce: produce}}
    - type: AssertEqual
      input: Yummy
      config: {elements: [{produce: Date}, {produce: Mango}]}
    - type: MapToFields
      name: Unknown
      input: ByVowel.unknown_fruits
      config: {fields: {produce: produce}}
    - type: AssertEqual
      input: Unknown
      config: {elements: [{produce: Blueberry}, {produce: Fig}]}
    # A number of seconds as the event timestamp; timestamps come back as Beam Timestamps.
    - type: AssignTimestamps
      name: Stamped
      input: Fruits
      config:
        language: python
        timestamp: "Timestamp(secs)"
    - type: WindowInto
      name: Minutes
      input: Stamped
      windowing: {type: fixed, size: 60s}
    - type: Combine
      name: PerMinute
      input: Minutes
      config:
        language: python
        group_by: []
        combine:
          total: {fn: sum, value: "n * 10"}
          names: {fn: count}
    - type: ExtractWindowingInfo
      name: Info
      input: PerMinute
      config: {fields: [window_start]}
    - type: MapToFields
      name: Shown
      input: Info
      config:
        language: python
        fields:
          start: "window_start.to_rfc3339()"
          total: total
          names: names
    - type: AssertEqual
      input: Shown
      config:
        elements:
          - {start: "2024-01-15T10:00:00Z", total: 30, names: 2}
          - {start: "2024-01-15T10:01:00Z", total: 180, names: 4}
"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raising_udf_sends_its_record_to_the_error_output_with_the_traceback() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = r#"
pipeline:
  transforms:
    - type: Create
      name: In
      config:
        elements: [{id: 1, s: "a,b"}, {id: 2, s: null}, {id: 3, s: "c"}]
    - type: MapToFields
      name: Split
      input: In
      config:
        language: python
        fields:
          id: id
          first:
            callable: |
              def first(row):
                  if row.s is None:
                      raise ValueError('no s in row %d' % row.id)
                  return row.s.split(',')[0]
        error_handling: {output: bad}
    - type: WriteToJson
      name: Good
      input: Split
      config: {path: "$DIR/out/good.jsonl"}
    - type: WriteToJson
      name: Bad
      input: Split.bad
      config: {path: "$DIR/out/bad.jsonl"}
"#;
    let o = run_ok(&at(yaml, dir.path())).await;
    assert_eq!((o.count("Split"), o.count("Bad")), (2, 1));
    assert_eq!(
        sorted(read_jsonl(&dir.path().join("out"), "good")),
        sorted(vec![
            json!({"id": 1, "first": "a"}),
            json!({"id": 3, "first": "c"})
        ])
    );
    let bad = read_jsonl(&dir.path().join("out"), "bad");
    assert_eq!(bad.len(), 1);
    // The row as it was, its null field written as `null` (as Beam's WriteToJson writes None).
    assert_eq!(bad[0]["element"], json!({"id": 2, "s": null}), "{}", bad[0]);
    assert_eq!(bad[0]["msg"], "ValueError: no s in row 2");
    let stack = bad[0]["stack"].as_str().unwrap();
    assert!(
        stack.starts_with("Traceback (most recent call last):")
            && stack.contains("File \"<callable>\", line 3, in first"),
        "the Python traceback, with the function and its line: {stack}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_before_running_name_the_transform_and_field() {
    let e = match run_err(&format!(
        r#"
pipeline:
  transforms:{ROWS}
    - type: MapToFields
      name: Map
      input: In
      config:
        language: python
        fields:
          x: "label +"
          y:
            callable: "lambda row: row.label.nope()"
"#
    ))
    .await
    {
        Failure::Run(e @ RunError::Plan(_)) => e.to_string(),
        Failure::Pipeline(p) => p.to_string(),
        Failure::Run(other) => panic!("expected a compile error, got: {other}"),
    };
    assert!(
        e.contains("transform 'Map', field 'fields.x': cannot compile python expression 'label +': SyntaxError"),
        "{e}"
    );
}

/// Beam types a field `Any` when the sample rows tell nothing and runs: rows that raise go to
/// the error output (`element * element` on a string), and the main output is also `.good`.
/// Explode takes what Python iterates (a range), and `output_schema` checks a transform's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untyped_fields_explode_of_iterables_and_output_schema() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = r#"
pipeline:
  transforms:
    - type: Create
      name: In
      config:
        elements: [{s: "a", n: 2}, {s: "b", n: 0}, {s: "c", n: 3}]
    - type: MapToFields
      name: Square
      input: In
      config:
        language: python
        fields:
          sq: "s * s"
        error_handling: {output: bad}
    - type: WriteToJson
      name: Squared
      input: Square.good
      config: {path: "$DIR/out/squared.jsonl"}
    - type: WriteToJson
      name: Unsquared
      input: Square.bad
      config: {path: "$DIR/out/unsquared.jsonl"}
    - type: MapToFields
      name: Ranges
      input: In
      config:
        language: python
        fields:
          s: s
          i: "range(n)"
          t: "(n, n + 1)"
    - type: Explode
      name: Each
      input: Ranges
      config:
        fields: [i]
    - type: MapToFields
      name: Checked
      input: Each
      config:
        language: python
        fields:
          s: s
          i: i
        error_handling: {output: bad}
        output_schema:
          type: object
          properties:
            i: {type: integer, maximum: 1}
    - type: WriteToJson
      name: Small
      input: Checked
      config: {path: "$DIR/out/small.jsonl"}
    - type: WriteToJson
      name: Big
      input: Checked.bad
      config: {path: "$DIR/out/big.jsonl"}
"#;
    run_ok(&at(yaml, dir.path())).await;
    let out = dir.path().join("out");
    let bad = read_jsonl(&out, "unsquared");
    assert_eq!(bad.len(), 3);
    assert!(
        bad[0]["msg"]
            .as_str()
            .unwrap()
            .starts_with("TypeError: can't multiply sequence"),
        "{}",
        bad[0]
    );
    assert_eq!(
        sorted(read_jsonl(&out, "small")),
        sorted(vec![
            json!({"s": "a", "i": 0}),
            json!({"s": "a", "i": 1}),
            json!({"s": "c", "i": 0}),
            json!({"s": "c", "i": 1}),
        ])
    );
    let big = read_jsonl(&out, "big");
    assert_eq!(big.len(), 1, "{big:?}");
    let e = &big[0]["element"];
    assert_eq!((&e["s"], &e["i"]), (&json!("c"), &json!(2)), "{}", big[0]);
    assert!(
        big[0]["msg"].as_str().unwrap().contains("maximum"),
        "{}",
        big[0]
    );
}
