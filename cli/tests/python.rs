//! `language: python` through the binary: `riverbank plan` names each UDF's path, and batches
//! sent to `riverbank udf-host` processes give what the in-process interpreter gives.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn riverbank(args: &[&str], envs: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_riverbank"))
        .args(args)
        .env("RIVERBANK_LOG", "warn")
        .env("NO_COLOR", "1")
        .envs(envs.iter().copied())
        .output()
        .expect("the riverbank binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/taxi")
        .join(name)
        .to_string_lossy()
        .to_string()
}

fn ok(out: &Output) -> String {
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        !err.contains("Python UDF host"),
        "hosts must start and answer: {err}"
    );
    text(&out.stdout)
}

/// The outputs of a run, by file name.
fn outputs(dir: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p: PathBuf| {
            (
                p.file_name().unwrap().to_string_lossy().to_string(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn the_taxi_job_in_python_gives_the_sql_jobs_results_in_process_and_in_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_s = data.to_string_lossy().to_string();
    ok(&riverbank(
        &[
            "generate",
            "taxi",
            "--days",
            "2",
            "--rows-per-day",
            "3000",
            "--format",
            "parquet",
            "--out",
            &data_s,
        ],
        &[],
    ));
    let run = |yaml: &str, out: &str, envs: &[(&str, &str)]| {
        let vars = format!(
            r#"{{"input": "{data_s}/*.parquet", "output": "{}"}}"#,
            dir.path().join(out).display()
        );
        ok(&riverbank(
            &[
                "run",
                &example(yaml),
                "--slots",
                "2",
                "--no-progress",
                "--jinja-variables",
                &vars,
            ],
            envs,
        ));
        outputs(&dir.path().join(out))
    };
    let sql = run("taxi.yaml", "sql", &[]);
    assert_eq!(sql.len(), 2);
    assert_eq!(run("taxi_python.yaml", "python", &[]), sql);
    assert_eq!(run("taxi_python_callable.yaml", "callable", &[]), sql);
    // Every batch through `riverbank udf-host` processes.
    let hosts = [("RIVERBANK_UDF_HOSTS", "always")];
    assert_eq!(run("taxi_python_callable.yaml", "hosts", &hosts), sql);
    assert_eq!(run("taxi_python.yaml", "hosts-translated", &hosts), sql);

    let vars = format!(r#"{{"input": "{data_s}/*.parquet", "output": "unused"}}"#);
    let plan = ok(&riverbank(
        &[
            "plan",
            &example("taxi_python.yaml"),
            "--jinja-variables",
            &vars,
        ],
        &[],
    ));
    assert!(
        plan.contains(
            "Python UDFs:\n  Valid keep: python 'total_amount > 0' — vectorized, as SQL: "
        ),
        "{plan}"
    );
    let plan = ok(&riverbank(
        &[
            "plan",
            &example("taxi_python_callable.yaml"),
            "--jinja-variables",
            &vars,
        ],
        &[],
    ));
    assert!(
        plan.contains("ZoneAmount fields.amount: python 'lambda row: round(row.total_amount, 2)' — in the Python interpreter, a batch at a time"),
        "{plan}"
    );
}

#[test]
fn a_record_failure_in_a_host_reaches_the_error_output_with_its_traceback() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("p.yaml");
    std::fs::write(
        &yaml,
        format!(
            r#"
pipeline:
  transforms:
    - {{type: Create, name: In, config: {{elements: [{{n: 1}}, {{n: 0}}, {{n: 4}}]}}}}
    - type: MapToFields
      name: Inverse
      input: In
      config:
        language: python
        fields:
          inv:
            callable: "lambda row: 1 / row.n"
        error_handling: {{output: bad}}
    - {{type: WriteToJson, name: Good, input: Inverse, config: {{path: "{d}/good.jsonl"}}}}
    - {{type: WriteToJson, name: Bad, input: Inverse.bad, config: {{path: "{d}/bad.jsonl"}}}}
"#,
            d = dir.path().join("out").display()
        ),
    )
    .unwrap();
    ok(&riverbank(
        &["run", &yaml.to_string_lossy(), "--no-progress"],
        &[("RIVERBANK_UDF_HOSTS", "always")],
    ));
    let out = outputs(&dir.path().join("out"));
    let (good, bad) = (&out[1].1, &out[0].1);
    assert_eq!(good, "{\"inv\":1.0}\n{\"inv\":0.25}\n");
    let bad: serde_json::Value = serde_json::from_str(bad.trim()).unwrap();
    assert_eq!(bad["msg"], "ZeroDivisionError: division by zero");
    assert!(
        bad["stack"]
            .as_str()
            .unwrap()
            .contains("File \"<callable>\", line 1, in <lambda>"),
        "{bad}"
    );
}
