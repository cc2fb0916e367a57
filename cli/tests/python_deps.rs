//! `language: python` beyond one row at a time, through the binary: `dependencies:` installed
//! into a per-job venv (from a wheel this test builds: no network, `PIP_NO_INDEX`) and reused by
//! the next run, a missing package named in the error, and custom CombineFns run lifted
//! (partial accumulators pickled through the shuffle, across worker processes too).
use std::path::Path;
use std::process::{Command, Output};

fn riverbank(args: &[&str], envs: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_riverbank"))
        .args(args)
        .env("RIVERBANK_LOG", "info")
        .env("NO_COLOR", "1")
        // pip must not reach for an index: the tests' packages are local files.
        .env("PIP_NO_INDEX", "1")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .envs(envs.iter().copied())
        .output()
        .expect("the riverbank binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

/// Every JSON row the sink wrote under `dir`, sorted.
fn rows(dir: &Path) -> Vec<serde_json::Value> {
    let mut out: Vec<serde_json::Value> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .flat_map(|p| {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort_by_key(|v| v.to_string());
    out
}

/// A wheel of the package `rb_tiny` (a function and a CombineFn), written by hand: a wheel is
/// a zip with the package and its dist-info.
fn build_wheel(dir: &Path) -> String {
    let wheel = dir.join("rb_tiny-0.1-py3-none-any.whl");
    let script = r#"
import sys, zipfile
code = '''
def shout(s):
    return s.upper() + "!"

class LongestFn:
    """The longest string, ties to the smaller (a CombineFn with keyword arguments)."""
    def __init__(self, suffix=""):
        self.suffix = suffix
    def create_accumulator(self):
        return None
    def add_input(self, acc, v):
        if acc is None or len(v) > len(acc) or (len(v) == len(acc) and v < acc):
            return v
        return acc
    def merge_accumulators(self, accs):
        out = None
        for a in accs:
            if a is not None:
                out = self.add_input(out, a)
        return out
    def extract_output(self, acc):
        return None if acc is None else acc + self.suffix
'''
files = {
    "rb_tiny/__init__.py": code,
    "rb_tiny-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: rb-tiny\nVersion: 0.1\n",
    "rb_tiny-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: riverbank-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
files["rb_tiny-0.1.dist-info/RECORD"] = "".join(f"{n},,\n" for n in files) + "rb_tiny-0.1.dist-info/RECORD,,\n"
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for n, c in files.items():
        z.writestr(n, c)
"#;
    let out = Command::new("python3")
        .args(["-c", script, &wheel.to_string_lossy()])
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    wheel.to_string_lossy().to_string()
}

#[test]
fn dependencies_are_installed_once_per_job_into_a_venv_and_reused_by_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = build_wheel(dir.path());
    let out_dir = dir.path().join("out");
    let yaml = format!(
        r#"
pipeline:
  transforms:
    - type: Create
      name: Words
      config:
        elements: [{{k: a, w: ab}}, {{k: a, w: abc}}, {{k: a, w: xyz}}, {{k: b, w: q}}]
    - type: MapToFields
      name: Shout
      input: Words
      config:
        language: python
        dependencies: ['{wheel}']
        append: true
        fields:
          loud:
            callable: |
              import rb_tiny
              def f(row):
                return rb_tiny.shout(row.w)
    - type: Combine
      name: Longest
      input: Shout
      config:
        language: python
        group_by: k
        combine:
          longest:
            value: w
            fn:
              type: rb_tiny.LongestFn
              config: {{suffix: "."}}
          n: {{fn: count, value: w}}
    - type: WriteToJson
      input: Shout
      config: {{path: "{out}/loud/part.json"}}
    - type: WriteToJson
      input: Longest
      config: {{path: "{out}/longest/part.json"}}
"#,
        out = out_dir.display()
    );
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, yaml).unwrap();
    let spill = dir.path().join("spill");
    let spill_s = spill.to_string_lossy().to_string();
    let run = |envs: &[(&str, &str)]| {
        let o = riverbank(
            &[
                "run",
                &file.to_string_lossy(),
                "--no-progress",
                "--spill-dir",
                &spill_s,
            ],
            envs,
        );
        assert!(o.status.success(), "{}", text(&o.stderr));
        text(&o.stderr)
    };
    let first = run(&[]);
    assert!(
        first.contains("python dependencies: installing"),
        "the first run installs: {first}"
    );
    let loud = rows(&out_dir.join("loud"));
    assert_eq!(
        loud.iter()
            .map(|r| r["loud"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["AB!", "ABC!", "XYZ!", "Q!"]
    );
    assert_eq!(
        rows(&out_dir.join("longest")),
        [
            serde_json::json!({"k": "a", "longest": "abc.", "n": 3}),
            serde_json::json!({"k": "b", "longest": "q.", "n": 1})
        ]
    );
    let venvs: Vec<_> = std::fs::read_dir(spill.join("riverbank-python-envs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(venvs.len(), 1, "one venv, no leftovers: {venvs:?}");
    let listed = std::fs::read_to_string(venvs[0].join("riverbank-requirements.txt")).unwrap();
    assert!(listed.contains("rb_tiny-0.1"), "{listed}");

    // The second run sends every UDF batch to `riverbank udf-host` processes: they find the
    // venv through the program they are sent.
    std::fs::remove_dir_all(&out_dir).unwrap();
    let second = run(&[("RIVERBANK_UDF_HOSTS", "always")]);
    assert!(
        second.contains("python dependencies: reusing the venv")
            && !second.contains("python dependencies: installing"),
        "the second run reuses the venv: {second}"
    );
    assert_eq!(rows(&out_dir.join("loud")), loud);
}

#[test]
fn a_dependency_that_cannot_be_installed_fails_the_job_naming_the_package_and_transform() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.yaml");
    std::fs::write(
        &file,
        r#"
pipeline:
  type: chain
  transforms:
    - type: Create
      config: {elements: [{x: 1}]}
    - type: MapToFields
      name: UsesIt
      config:
        language: python
        dependencies: ['riverbank-no-such-package==1.0']
        fields: {y: "x + 1"}
    - type: LogForTesting
"#,
    )
    .unwrap();
    let o = riverbank(
        &[
            "run",
            &file.to_string_lossy(),
            "--no-progress",
            "--spill-dir",
        ]
        .into_iter()
        .chain([dir.path().to_str().unwrap()])
        .collect::<Vec<_>>(),
        &[],
    );
    let err = text(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("UsesIt")
            && err.contains("dependencies")
            && err.contains("riverbank-no-such-package"),
        "{err}"
    );
}

#[test]
fn a_python_combine_fn_runs_lifted_and_gives_the_built_ins_result_across_workers() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let o = riverbank(
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
            data.to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let yaml = format!(
        r#"
pipeline:
  transforms:
    - type: ReadFromParquet
      name: Trips
      config: {{path: "{data}/*.parquet"}}
    - type: Combine
      name: PerZone
      input: Trips
      config:
        language: python
        group_by: PULocationID
        combine:
          builtin: {{fn: sum, value: DOLocationID}}
          custom:
            value: DOLocationID
            fn:
              type: |
                class ScaledSum:
                  def __init__(self, scale):
                    self.scale = scale
                  def create_accumulator(self):
                    return (0, 0)
                  def add_input(self, acc, v):
                    return (acc[0] + v, acc[1] + 1)
                  def merge_accumulators(self, accs):
                    return (sum(a[0] for a in accs), sum(a[1] for a in accs))
                  def extract_output(self, acc):
                    return acc[0] * self.scale
              config: {{scale: 3}}
          top: {{value: DOLocationID, fn: {{type: "lambda vs: sorted(vs)[-2:]"}}}}
    - type: WriteToJson
      input: PerZone
      config: {{path: "{out}/part.json"}}
"#,
        data = data.display(),
        out = dir.path().join("out").display()
    );
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, yaml).unwrap();
    for workers in ["1", "2"] {
        let _ = std::fs::remove_dir_all(dir.path().join("out"));
        let mut args = vec![
            "run",
            file.to_str().unwrap(),
            "--no-progress",
            "--shuffle-partitions",
            "3",
        ];
        if workers == "2" {
            args.extend(["--workers", "2"]);
        }
        let o = riverbank(&args, &[]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let got = rows(&dir.path().join("out"));
        assert!(got.len() > 20, "zones: {}", got.len());
        for r in &got {
            let builtin = r["builtin"].as_i64().unwrap();
            assert_eq!(r["custom"].as_i64().unwrap(), 3 * builtin, "{r}");
            let top = r["top"].as_array().unwrap();
            assert!(!top.is_empty() && top.len() <= 2, "{r}");
        }
    }
}

#[test]
fn a_combine_fn_that_does_not_load_fails_validation_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.yaml");
    std::fs::write(
        &file,
        r#"
pipeline:
  type: chain
  transforms:
    - type: Create
      config: {elements: [{k: a, x: 1}]}
    - type: Combine
      name: C
      config:
        language: python
        group_by: k
        combine:
          best: {value: x, fn: {type: riverbank_no_such_module.BestFn}}
    - type: LogForTesting
"#,
    )
    .unwrap();
    let o = riverbank(&["validate", file.to_str().unwrap()], &[]);
    let err = text(&o.stderr) + &text(&o.stdout);
    assert!(!o.status.success());
    assert!(
        err.contains("'C'")
            && err.contains("combine.best.fn")
            && err.contains("riverbank_no_such_module"),
        "{err}"
    );
}

#[test]
fn an_exception_in_a_combine_fn_fails_the_job_with_the_python_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.yaml");
    std::fs::write(
        &file,
        r#"
pipeline:
  type: chain
  transforms:
    - type: Create
      config: {elements: [{k: a, x: 1}, {k: a, x: 0}]}
    - type: Combine
      name: C
      config:
        language: python
        group_by: k
        combine:
          inv: {value: x, fn: {type: "lambda xs: sum(1 / x for x in xs)"}}
    - type: LogForTesting
"#,
    )
    .unwrap();
    let o = riverbank(&["run", file.to_str().unwrap(), "--no-progress"], &[]);
    let err = text(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("python CombineFn inv") && err.contains("ZeroDivisionError"),
        "{err}"
    );
}
