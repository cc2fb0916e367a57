//! `language: javascript` UDFs end to end: Beam's own JavaScript examples (its YAML UDF tests,
//! `yaml_udf_test.py`) with their exact expected rows, every place a UDF is taken, error
//! outputs with the JS stack, and the errors found before running.
mod common;

use common::{Failure, read_jsonl, run_err, run_ok, run_with, sorted};
use riverbank_engine::RunError;
use riverbank_pipeline::config::{TransformConfig, UdfForm};
use serde_json::{Map, json};
use std::path::Path;

fn at(yaml: &str, dir: &Path) -> String {
    yaml.replace("$DIR", dir.to_string_lossy().as_ref())
}

/// The compile-time issues of a pipeline that must not compile, one per line.
async fn plan_error(yaml: &str) -> String {
    match run_err(yaml).await {
        Failure::Run(e @ RunError::Plan(_)) => e.to_string(),
        Failure::Pipeline(p) => p.to_string(),
        Failure::Run(other) => panic!("expected a compile (plan) error, got: {other}"),
    }
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

// ---------------------------------------------------------------- Beam's examples

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beam_map_to_fields_with_inline_callables() {
    // test_map_to_fields_filter_inline_js
    let o = run_ok(&format!(
        r#"
pipeline:
  transforms:{ROWS}
    - type: MapToFields
      name: Map
      input: In
      config:
        language: javascript
        fields:
          label:
            callable: "function label_map(x) {{return x.label + 'x'}}"
          conductor:
            callable: "function conductor_map(x) {{return x.conductor + 1}}"
    - type: AssertEqual
      input: Map
      config:
        elements:
          - {{label: '11ax', conductor: 12}}
          - {{label: '37ax', conductor: 38}}
          - {{label: '389ax', conductor: 390}}
"#
    ))
    .await;
    assert_eq!(o.count("Map"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beam_filter_with_an_inline_callable() {
    // test_filter_inline_js
    let o = run_ok(&format!(
        r#"
pipeline:
  transforms:{ROWS}
    - type: Filter
      name: Keep
      input: In
      config:
        language: javascript
        keep:
          callable: "function filter(x) {{return x.rank > 0}}"
    - type: AssertEqual
      input: Keep
      config:
        elements:
          - {{label: '37a', conductor: 37, rank: 1}}
          - {{label: '389a', conductor: 389, rank: 2}}
"#
    ))
    .await;
    assert_eq!(o.count("Keep"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beam_filter_with_an_expression_kept_by_truthiness() {
    // test_filter_expression_js: `&& conductor` makes the result a number, kept when non-zero.
    let o = run_ok(&format!(
        r#"
pipeline:
  transforms:{ROWS}
    - type: Filter
      name: Keep
      input: In
      config:
        language: javascript
        keep:
          expression: "label.toUpperCase().indexOf('3') == -1 && conductor"
    - type: AssertEqual
      input: Keep
      config:
        elements:
          - {{label: '11a', conductor: 11, rank: 0}}
"#
    ))
    .await;
    assert_eq!(o.count("Keep"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beam_filter_with_a_function_from_a_file() {
    // test_filter_inline_js_file: the file defines two functions; `name` picks one.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("udf.js"),
        "function f(x) {\n  return x.rank > 0\n}\n\nfunction g(x) {\n  return x.rank > 1\n}\n",
    )
    .unwrap();
    let o = run_ok(&at(
        &format!(
            r#"
pipeline:
  transforms:{ROWS}
    - type: Filter
      name: KeepF
      input: In
      config:
        language: javascript
        keep:
          path: "$DIR/udf.js"
          name: "f"
    - type: Filter
      name: KeepG
      input: In
      config:
        language: javascript
        keep: {{path: "$DIR/udf.js", name: g}}
    - type: AssertEqual
      input: KeepF
      config:
        elements:
          - {{label: '37a', conductor: 37, rank: 1}}
          - {{label: '389a', conductor: 389, rank: 2}}
    - type: AssertEqual
      input: KeepG
      config:
        elements:
          - {{label: '389a', conductor: 389, rank: 2}}
"#
        ),
        dir.path(),
    ))
    .await;
    assert_eq!((o.count("KeepF"), o.count("KeepG")), (2, 1));

    // The plan shipped to workers carries the file's text: they need not have the file.
    let yaml = at(
        &format!(
            "pipeline:\n  transforms:{ROWS}    - {{type: Filter, name: F, input: In, config: {{language: javascript, keep: {{path: \"$DIR/udf.js\", name: f}}}}}}\n"
        ),
        dir.path(),
    );
    let plan = riverbank_pipeline::load_plan(&yaml, &Map::new(), "t").unwrap();
    let compiled = riverbank_engine::compile(plan, 1024).await.unwrap();
    std::fs::remove_file(dir.path().join("udf.js")).unwrap();
    let TransformConfig::Filter { keep } = &compiled.plan.graph.get("F").unwrap().config else {
        panic!("a Filter")
    };
    assert!(
        matches!(&keep.form, UdfForm::File { source: Some(s), .. } if s.contains("function g(x)")),
        "{keep:?}"
    );
    let again = riverbank_engine::compile::compile_with_known(
        compiled.plan.clone(),
        1024,
        &Default::default(),
    )
    .await;
    assert!(again.is_ok(), "a worker compiles it without the file");
}

// ---------------------------------------------------------------- values in, values out

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expressions_see_fields_as_variables_and_results_keep_their_types() {
    run_ok(
        r#"
pipeline:
  transforms:
    - type: Create
      name: In
      config:
        elements:
          - {name: ann, n: 11, x: 1.5, ok: true, tags: [p, q], pos: {lat: 1.0, lon: 2.0}, note: null}
          - {name: bob, n: 4, x: 2.0, ok: false, tags: [], pos: {lat: 3.5, lon: 4.0}, note: hi}
    - type: MapToFields
      name: Map
      input: In
      config:
        language: javascript
        fields:
          name: name
          upper: "name.toUpperCase()"
          twice: "n * 2"
          half: "n / 2"
          scaled: "x * 2"
          flag: "!ok"
          count: "tags.length"
          joined: "tags.join('+')"
          lat: "pos.lat"
          noted: "note === null ? 'none' : note"
          parts: "[name, String(name.length)]"
          where:
            callable: |
              function (row) {
                return {lat: row.pos.lat, label: row.name + '@' + row.pos.lon};
              }
          kept:
            expression: "n > 5 ? n : null"
            output_type: integer
          tagged:
            expression: "tags"
            output_type: {type: array, items: {type: string}}
    - type: AssertEqual
      input: Map
      config:
        elements:
          - {name: ann, upper: ANN, twice: 22, half: 5.5, scaled: 3.0, flag: false, count: 2,
             joined: p+q, lat: 1.0, noted: none, parts: [ann, "3"], where: {lat: 1.0, label: ann@2},
             kept: 11, tagged: [p, q]}
          - {name: bob, upper: BOB, twice: 8, half: 2.0, scaled: 4.0, flag: true, count: 0,
             joined: '', lat: 3.5, noted: hi, parts: [bob, "3"], where: {lat: 3.5, label: bob@4},
             tagged: []}
"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integral_results_are_integers_and_others_doubles_as_beam_writes_them() {
    let dir = tempfile::tempdir().unwrap();
    run_ok(&at(
        &format!(
            r#"
pipeline:
  transforms:{ROWS}
    - type: MapToFields
      name: Map
      input: In
      config:
        language: javascript
        fields:
          label: label
          plus_one: "conductor + 1"
          half: "conductor / 2"
          ratio: "rank / 4"
          rank_float:
            expression: "rank"
            output_type: number
          isogeny: "label[label.length - 1]"
          big: "conductor > 30"
    - type: WriteToJson
      input: Map
      config: {{path: "$DIR/out/rows.jsonl"}}
"#
        ),
        dir.path(),
    ))
    .await;
    assert_eq!(
        sorted(read_jsonl(&dir.path().join("out"), "rows")),
        sorted(vec![
            json!({"label": "11a", "plus_one": 12, "half": 5.5, "ratio": 0.0, "rank_float": 0.0, "isogeny": "a", "big": false}),
            json!({"label": "37a", "plus_one": 38, "half": 18.5, "ratio": 0.25, "rank_float": 1.0, "isogeny": "a", "big": true}),
            json!({"label": "389a", "plus_one": 390, "half": 194.5, "ratio": 0.5, "rank_float": 2.0, "isogeny": "a", "big": true}),
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_assign_timestamps_and_combine_take_javascript() {
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
    # Beam's partition.yaml example with unknown_output, written in JavaScript.
    - type: Partition
      name: ByVowel
      input: Fruits
      config:
        language: javascript
        by:
          callable: |
            function partition(row) {
              if ('AEIOU'.indexOf(row.produce[0].toUpperCase()) >= 0) {
                return 'vowel_fruits';
              } else if (['Date', 'Mango'].indexOf(row.produce) >= 0) {
                return 'yummy_fruits';
              }
            }
        outputs: [vowel_fruits, yummy_fruits]
        unknown_output: unknown_fruits
    - type: MapToFields
      name: Vowels
      input: ByVowel.vowel_fruits
      config: {fields: {produce: produce}}
    - type: AssertEqual
      input: Vowels
      config: {elements: [{produce: Apple}, {produce: Apricot}]}
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
    # A Date as the event timestamp; timestamps come back to JavaScript as Dates.
    - type: AssignTimestamps
      name: Stamped
      input: Fruits
      config:
        language: javascript
        timestamp: "new Date(secs * 1000)"
    - type: WindowInto
      name: Minutes
      input: Stamped
      windowing: {type: fixed, size: 60s}
    - type: Combine
      name: PerMinute
      input: Minutes
      config:
        language: javascript
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
        language: javascript
        fields:
          start: "window_start.toISOString()"
          total: total
          names: names
    - type: AssertEqual
      input: Shown
      config:
        elements:
          - {start: "2024-01-15T10:00:00.000Z", total: 30, names: 2}
          - {start: "2024-01-15T10:01:00.000Z", total: 180, names: 4}
"#,
    )
    .await;
}

// ---------------------------------------------------------------- failures

const THROWING: &str = r#"
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
        language: javascript
        fields:
          id: id
          first:
            callable: |
              function first(row) {
                if (row.s === null) {
                  throw new Error('no s in row ' + row.id);
                }
                return row.s.split(',')[0];
              }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throwing_udf_sends_its_record_to_the_error_output_with_the_js_stack() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = THROWING.to_string()
        + r#"        error_handling: {output: bad}
    - type: WriteToJson
      name: Good
      input: Split
      config: {path: "$DIR/out/good.jsonl"}
    - type: WriteToJson
      name: Bad
      input: Split.bad
      config: {path: "$DIR/out/bad.jsonl"}
"#;
    let o = run_ok(&at(&yaml, dir.path())).await;
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
    assert_eq!(
        bad[0]["msg"], "Error evaluating javascript expression: Error: no s in row 2",
        "Beam's message, with the error's name"
    );
    let stack = bad[0]["stack"].as_str().unwrap();
    assert!(
        stack.contains("at first (callable:3:"),
        "the JS stack, with the function and its line: {stack}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_error_output_a_throwing_udf_fails_the_run_naming_transform_and_record() {
    let msg = run_with(THROWING, &Map::new(), |_| {})
        .await
        .err()
        .expect("must fail")
        .to_string();
    assert!(
        msg.contains("failed 4 times")
            && msg.contains("transform 'Split' failed: Error evaluating javascript expression: Error: no s in row 2")
            && msg.contains("at first (callable:3:")
            && msg.contains(r#"offending record: {"id":2}"#),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_that_does_not_fit_the_type_is_a_record_failure() {
    let dir = tempfile::tempdir().unwrap();
    run_ok(&at(
        r#"
pipeline:
  transforms:
    - type: Create
      name: In
      config: {elements: [{a: 4}, {a: 3}, {a: 0}]}
    - type: MapToFields
      name: Halve
      input: In
      config:
        language: javascript
        fields:
          half: {expression: "a / 2", output_type: integer}
          label: {callable: "r => r.a > 0 ? 'pos' : 0", output_type: string}
        error_handling: {output: bad}
    - type: WriteToJson
      input: Halve
      config: {path: "$DIR/good.jsonl"}
    - type: WriteToJson
      input: Halve.bad
      config: {path: "$DIR/bad.jsonl"}
"#,
        dir.path(),
    ))
    .await;
    assert_eq!(
        read_jsonl(dir.path(), "good"),
        vec![json!({"half": 2, "label": "pos"})]
    );
    let bad = read_jsonl(dir.path(), "bad");
    let mut msgs: Vec<&str> = bad.iter().map(|r| r["msg"].as_str().unwrap()).collect();
    msgs.sort();
    assert_eq!(
        msgs,
        [
            "javascript callable 'r => r.a > 0 ? 'pos' : 0' returned the number 0 where a string is expected",
            "javascript expression 'a / 2' returned the number 1.5 where an integer is expected",
        ],
        "{bad:?}"
    );
}

// ---------------------------------------------------------------- errors before running

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_before_running_name_the_transform_and_field() {
    let e = plan_error(&format!(
        r#"
pipeline:
  transforms:{ROWS}
    - type: MapToFields
      name: Map
      input: In
      config:
        language: javascript
        fields:
          ok: "conductor + 1"
          bad: "label.toUpperCase("
          worse: {{callable: "function (row) {{ return row.label +; }}"}}
          mixed: "rank > 5 ? label : rank"
          never: {{callable: "function (row) {{ if (row.rank > 100) return 1; }}"}}
          typo: {{expression: "rank", output_type: float}}
    - type: Filter
      name: F
      input: In
      config:
        language: javascript
        keep: {{path: /nonexistent/udf.js, name: f}}
"#
    ))
    .await;
    for want in [
        "transform 'Map', field 'fields.bad': cannot compile javascript expression 'label.toUpperCase(': SyntaxError",
        "transform 'Map', field 'fields.worse': cannot compile javascript callable 'function (row) { return row.label +; }': SyntaxError: unexpected token in expression: ';' (at callable:1:",
        "transform 'Map', field 'fields.typo': unknown output_type 'float'",
        "transform 'F', field 'keep': cannot read /nonexistent/udf.js",
    ] {
        assert!(e.contains(want), "missing «{want}» in:\n{e}");
    }
    // Results of several types, or none on sample rows, are Beam's `Any`: not errors.
    for fine in ["fields.ok", "fields.mixed", "fields.never"] {
        assert!(!e.contains(fine), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_without_the_named_function_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("udf.js"), "function f(x) { return 1 }\n").unwrap();
    let e = plan_error(&at(
        &format!(
            r#"
pipeline:
  transforms:{ROWS}
    - type: MapToFields
      name: Map
      input: In
      config:
        language: javascript
        fields:
          x: {{path: "$DIR/udf.js", name: g}}
"#
        ),
        dir.path(),
    ))
    .await;
    assert!(
        e.contains("transform 'Map', field 'fields.x': cannot compile javascript function 'g' of")
            && e.contains("no function 'g' in"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_is_refused_naming_the_transform() {
    for (lang, want) in [(
        "java",
        "transform 'Map', field 'language': language java is not supported in transform MapToFields: Riverbank runs no Java UDFs",
    )] {
        let e = plan_error(&format!(
            r#"
pipeline:
  transforms:{ROWS}
    - {{type: MapToFields, name: Map, input: In, config: {{language: {lang}, fields: {{x: "label"}}}}}}
"#
        ))
        .await;
        assert!(e.contains(want), "{e}");
    }
}
