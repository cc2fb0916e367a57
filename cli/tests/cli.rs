//! The `riverbank` binary, as users run it: exit codes, what it prints, what it writes.
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn riverbank(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_riverbank"))
        .args(args)
        .env("RIVERBANK_LOG", "warn")
        .env("NO_COLOR", "1")
        .output()
        .expect("the riverbank binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

fn taxi_yaml() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/taxi/taxi.yaml")
}

fn write(dir: &Path, name: &str, yaml: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, yaml).unwrap();
    p.to_string_lossy().to_string()
}

#[test]
fn validate_lists_every_error_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    // Structural errors: all reported by one validate.
    let f = write(
        dir.path(),
        "structure.yaml",
        r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{n: 1}]}}
    - {type: MapToFeilds, name: Typo, input: In, config: {fields: {x: n}}}
    - {type: Filter, name: NoInput, config: {keep: n}}
    - {type: Combine, name: BadFn, input: In, config: {group_by: [], combine: {m: {fn: median, value: n}}}}
    - {type: LogForTesting, input: Nowhere}
"#,
    );
    let out = riverbank(&["validate", &f]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("4 errors"), "{err}");
    for want in [
        "MapToFeilds",
        "did you mean MapToFields",
        "'NoInput'",
        "median",
        "Nowhere",
    ] {
        assert!(err.contains(want), "missing {want:?} in: {err}");
    }
    // Schema-aware errors: also all at once.
    let f = write(
        dir.path(),
        "fields.yaml",
        r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{amount: 1, city: a}]}}
    - {type: MapToFields, name: SqlField, input: In, config: {language: sql, fields: {x: "amout * 2"}}}
    - {type: Filter, name: BadSql, input: In, config: {language: sql, keep: "amount +* 1 > 0"}}
    - {type: Combine, name: Grouped, input: In, config: {group_by: [town], combine: {amount: sum}}}
    - {type: LogForTesting, input: SqlField}
    - {type: LogForTesting, input: BadSql}
    - {type: LogForTesting, input: Grouped}
"#,
    );
    let out = riverbank(&["validate", &f]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("3 errors"), "{err}");
    let issues: Vec<&str> = err
        .lines()
        .filter(|l| l.trim_start().starts_with("- "))
        .collect();
    assert_eq!(issues.len(), 3, "one line per issue: {err}");
    assert!(
        issues
            .iter()
            .any(|l| l.contains("'SqlField'") && l.contains("amout") && l.contains("amount, city")),
        "{err}"
    );
    assert!(
        issues
            .iter()
            .any(|l| l.contains("'BadSql'") && l.contains("syntax error")),
        "{err}"
    );
    assert!(
        issues
            .iter()
            .any(|l| l.contains("'Grouped'") && l.contains("town")),
        "{err}"
    );
    // --structure-only does not look at fields, so this one passes.
    let out = riverbank(&["validate", "--structure-only", &f]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("valid"), "{}", text(&out.stdout));
}

#[test]
fn plan_as_json_and_dot() {
    let vars = r#"{"input": "data/taxi/*.parquet", "output": "out/taxi"}"#;
    let taxi = taxi_yaml();
    let taxi = taxi.to_str().unwrap();
    let out = riverbank(&["plan", taxi, "--jinja-variables", vars, "--format", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let j: Value = serde_json::from_slice(&out.stdout).expect("plan --format json prints JSON");
    let stages = j["executionPipelineStage"]
        .as_array()
        .expect("executionPipelineStage");
    assert_eq!(stages.len(), 3, "{j:#}");
    assert_eq!(stages[0]["id"], "S00");

    let out = riverbank(&["plan", taxi, "--jinja-variables", vars, "--format", "dot"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dot = text(&out.stdout);
    assert!(dot.trim_start().starts_with("digraph"), "{dot}");
    assert!(dot.trim_end().ends_with('}'), "{dot}");
    assert!(dot.contains("S00 -> S01"), "{dot}");

    let out = riverbank(&["plan", taxi, "--jinja-variables", vars]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("S02"), "{}", text(&out.stdout));
}

#[test]
fn generate_taxi_csv_writes_the_requested_rows() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("X.csv");
    let out = riverbank(&[
        "generate",
        "taxi",
        "--rows-per-day",
        "2000",
        "--format",
        "csv",
        "--out",
        csv.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let body = std::fs::read_to_string(&csv).unwrap();
    let mut lines = body.lines();
    assert!(
        lines
            .next()
            .unwrap()
            .starts_with("VendorID,tpep_pickup_datetime"),
        "header"
    );
    assert_eq!(lines.count(), 2000);
}

#[test]
fn run_prints_a_summary_and_commits_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "tiny.yaml",
        r#"
pipeline:
  type: chain
  transforms:
    - {type: Create, name: Nums, config: {elements: [{n: 1}, {n: 2}, {n: 3}]}}
    - {type: Filter, name: Odd, config: {language: sql, keep: "n % 2 = 1"}}
    - {type: WriteToJson, name: Write, config: {path: "{{ out }}/odd.jsonl"}}
"#,
    );
    let vars = serde_json::json!({"out": dir.path().join("out")}).to_string();
    let out = riverbank(&[
        "run",
        &f,
        "--jinja-variables",
        &vars,
        "--no-progress",
        "--parallelism",
        "2",
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("transform") && err.contains("elements"),
        "summary table: {err}"
    );
    let odd = err
        .lines()
        .find(|l| l.starts_with("Odd "))
        .unwrap_or_else(|| panic!("a line for Odd: {err}"));
    assert!(odd.trim_end().ends_with(" 2"), "{odd}");
    assert!(
        err.contains("Write: committed") && err.contains("odd.jsonl-00000-of-00001"),
        "{err}"
    );
    assert!(err.contains("done in"), "{err}");
    let written = std::fs::read_to_string(dir.path().join("out/odd.jsonl-00000-of-00001")).unwrap();
    assert_eq!(written.lines().count(), 2);
}

/// A file sink's output is the files it wrote (Beam's `FileResult`s), committed before what
/// reads it runs: in process and across worker processes (the commit item's parts travel in
/// its lease). Its summary row stays the rows it wrote.
#[test]
fn reading_a_sink_gives_the_files_it_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "files.yaml",
        r#"
pipeline:
  transforms:
    - {type: Create, name: Nums, config: {elements: [{n: 1}, {n: 2}, {n: 3}, {n: 4}, {n: 5}]}}
    - {type: WriteToJson, name: Write, input: Nums, config: {path: "{{ out }}/nums.jsonl", num_shards: 2}}
    - type: MapToFields
      name: Names
      input: Write
      config: {language: python, fields: {line: "f'{shard_index}/{total_shards} {file_name}'"}}
    - {type: WriteToText, name: List, input: Names, config: {path: "{{ out }}/list.txt", num_shards: 1}}
"#,
    );
    for (run, extra) in [("in-process", vec![]), ("workers", vec!["--workers", "2"])] {
        let out_dir = dir.path().join(run);
        let vars = serde_json::json!({"out": out_dir}).to_string();
        let mut args = vec!["run", &f, "--jinja-variables", &vars, "--no-progress"];
        args.extend(extra);
        let out = riverbank(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{run}: {err}");
        let mut list: Vec<String> =
            std::fs::read_to_string(out_dir.join("list.txt-00000-of-00001"))
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect();
        list.sort();
        let shard = |i| out_dir.join(format!("nums.jsonl-0000{i}-of-00002"));
        assert_eq!(
            list,
            vec![
                format!("0/2 {}", shard(0).display()),
                format!("1/2 {}", shard(1).display())
            ],
            "{run}"
        );
        let rows: usize = (0..2)
            .map(|i| std::fs::read_to_string(shard(i)).unwrap().lines().count())
            .sum();
        assert_eq!(rows, 5, "{run}");
        let write = err
            .lines()
            .find(|l| l.starts_with("Write "))
            .unwrap_or_else(|| panic!("a line for Write: {err}"));
        assert!(write.trim_end().ends_with(" 5"), "{run}: {write}");
    }
}

/// Reading what a broker sink wrote, or a file sink's files in a streaming job, is refused
/// before anything runs, naming the transform.
#[test]
fn a_sink_output_that_cannot_be_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "streaming.yaml",
        r#"
pipeline:
  transforms:
    - {type: ReadFromSynthetic, name: Events, config: {rate: 100, keys: 4, count: 10}}
    - {type: WriteToJson, name: Write, input: Events, config: {path: "/tmp/never/x.jsonl"}}
    - {type: LogForTesting, input: Write}
options: {streaming: true}
"#,
    );
    let out = riverbank(&["validate", &f]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("'Write'") && err.contains("in a batch job only"),
        "{err}"
    );
}

#[test]
fn run_fails_with_exit_code_1_on_a_bad_record() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "bad.yaml",
        r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{s: "1"}, {s: abc}]}}
    - {type: MapToFields, name: Cast, input: In, config: {language: sql, fields: {n: "CAST(s AS INT)"}}}
    - {type: WriteToJson, name: Write, input: Cast, config: {path: "{{ out }}/n.jsonl"}}
"#,
    );
    let vars = serde_json::json!({"out": dir.path().join("out")}).to_string();
    let out = riverbank(&["run", &f, "--jinja-variables", &vars, "--no-progress"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let last = err
        .lines()
        .skip_while(|l| !l.starts_with("error:"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        last.contains("failed 4 times")
            && last.contains("'Cast'")
            && last.contains("abc")
            && last.contains(r#"{"s":"abc"}"#),
        "{err}"
    );
    assert!(
        !dir.path().join("out").exists()
            || std::fs::read_dir(dir.path().join("out"))
                .unwrap()
                .next()
                .is_none(),
        "no output"
    );
}
