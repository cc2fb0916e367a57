//! Conformance with Beam: every case `conformance/record.py` recorded (Beam YAML's documented
//! pipelines, run by Beam to record its outputs) runs through `riverbank run`, and its sinks'
//! rows are compared with Beam's. The table in docs/conformance.md is this test's output: the
//! test fails when it differs (`RIVERBANK_CONFORMANCE_WRITE=1` rewrites it).
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Case {
    id: String,
    meta: Value,
    /// `pass`, or why not.
    result: Result<(), String>,
    compared: bool,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The rows of the files in `dir` whose names start with `prefix` (all of them: ""), as JSON
/// values (a line that is not JSON: a string). Beam's file sinks leave an empty `.temp…`
/// directory beside their files: directories are skipped.
fn rows(dir: &Path, prefix: &str) -> Vec<Value> {
    let mut out = vec![];
    let Ok(files) = std::fs::read_dir(dir) else {
        return out;
    };
    let mut files: Vec<PathBuf> = files
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .collect();
    files.sort();
    for f in files {
        for line in std::fs::read_to_string(&f).unwrap().lines() {
            if !line.is_empty() {
                out.push(serde_json::from_str(line).unwrap_or(Value::String(line.into())));
            }
        }
    }
    out
}

/// An error output's row (`element`, `msg`, `stack`): its `msg` and `stack` are each runner's own
/// words (Beam's stack walks Beam's Python), so rows of errors compare by their `element`.
fn error_row(v: &Value) -> Option<&Value> {
    let o = v.as_object()?;
    (o.len() == 3 && o.contains_key("msg") && o.contains_key("stack"))
        .then(|| o.get("element"))
        .flatten()
}

/// Equal as Beam's rows: numbers by value (1 and 1.0 alike, floats to 1e-9).
fn same(a: &Value, b: &Value) -> bool {
    if let (Some(x), Some(y)) = (error_row(a), error_row(b)) {
        return same(x, y);
    }
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// Compares rows as multisets; the first difference, if any.
fn compare(sink: &str, want: &[Value], got: &[Value]) -> Result<(), String> {
    let mut left: Vec<&Value> = got.iter().collect();
    for w in want {
        match left.iter().position(|g| same(w, g)) {
            Some(i) => {
                left.swap_remove(i);
            }
            None => {
                let near = got
                    .first()
                    .map(|g| format!("; Riverbank wrote e.g. {g}"))
                    .unwrap_or_default();
                return Err(format!("{sink}: Beam's row {w} is missing{near}"));
            }
        }
    }
    match left.first() {
        Some(extra) => Err(format!(
            "{sink}: Riverbank wrote {} extra row(s), e.g. {extra}",
            left.len()
        )),
        None => Ok(()),
    }
}

fn run_case(dir: &Path) -> Case {
    let id = dir.file_name().unwrap().to_string_lossy().to_string();
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
    let beam = meta["beam"].as_str().unwrap_or("?").to_string();
    // A case Beam refuses (its test's assertRaises): Riverbank must refuse it too.
    let refused = beam.starts_with("refuses: ");
    if beam != "ok" && !refused {
        return Case {
            id,
            result: Err(format!(
                "not compared: {}",
                meta["beam"].as_str().unwrap_or("?")
            )),
            meta,
            compared: false,
        };
    }
    // `str()` of a schema'd row names its class, which Beam makes up per run
    // (`BeamSchema_<uuid>`): no second run, Beam's or Riverbank's, can give that text again.
    let expected_text: String = std::fs::read_dir(dir.join("expected"))
        .map(|d| {
            d.map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
                .collect()
        })
        .unwrap_or_default();
    if expected_text.contains("BeamSchema_") {
        return Case {
            id,
            result: Err("not compared: Beam's output holds a name it makes up per run (str() of a row is BeamSchema_<uuid>(…); Riverbank's is Row(…))".into()),
            meta,
            compared: false,
        };
    }
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
        }
    }
    keep_mtimes(dir, tmp.path());
    let yaml = std::fs::read_to_string(dir.join("pipeline.yaml"))
        .unwrap()
        .replace("$CASE", &tmp.path().to_string_lossy());
    let file = tmp.path().join("pipeline.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_riverbank"))
        .args([
            "run",
            &file.to_string_lossy(),
            "--no-progress",
            "--slots",
            "1",
        ])
        .env("RIVERBANK_LOG", "error")
        .env("PYTHONPATH", beam_site())
        .env("RIVERBANK_PYTHON_ENVS", tmp.path().join("envs"))
        .output()
        .unwrap();
    let result = if refused {
        if out.status.success() {
            Err(format!("Riverbank runs what Beam refuses ({})", &beam[9..]))
        } else {
            Ok(())
        }
    } else if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        // The message without the temp dir's path: the first lines that say something.
        let first: Vec<&str> = err
            .lines()
            .map(|l| {
                l.trim()
                    .trim_start_matches("error: ")
                    .trim_start_matches("- ")
            })
            .filter(|l| !l.is_empty())
            .take(2)
            .collect();
        let text = first
            .join(" ")
            .replace(&tmp.path().to_string_lossy().to_string(), "$CASE");
        Err(format!("Riverbank fails: {text}"))
    } else {
        let mut r = Ok(());
        let mut sinks: Vec<PathBuf> = std::fs::read_dir(dir.join("expected"))
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        sinks.sort();
        for s in sinks {
            let name = s.file_stem().unwrap().to_string_lossy().to_string();
            let want = rows_of_file(&s);
            // Paths as the case names them.
            let case_dir = tmp.path().to_string_lossy().to_string();
            let got = match name.strip_prefix("file-") {
                // The files the case's own sink wrote (`NAME-SSSSS-of-NNNNN`).
                Some(prefix) => rows(tmp.path(), prefix),
                None => rows(&tmp.path().join("out").join(&name), ""),
            };
            let got: Vec<Value> = got
                .iter()
                .map(|r| serde_json::from_str(&r.to_string().replace(&case_dir, "$CASE")).unwrap())
                .collect();
            if let Err(e) = compare(&name, &want, &got) {
                r = Err(e);
                break;
            }
        }
        r
    };
    Case {
        id,
        meta,
        result,
        compared: true,
    }
}

/// A file's mtime as Beam saw it (MatchAll's `last_updated_in_seconds` in the expected rows), set
/// on the case's copy in `tmp`: a checkout does not keep mtimes.
fn keep_mtimes(dir: &Path, tmp: &Path) {
    let Ok(sinks) = std::fs::read_dir(dir.join("expected")) else {
        return;
    };
    for sink in sinks {
        for row in rows_of_file(&sink.unwrap().path()) {
            let (Some(path), Some(secs)) = (
                row["path"].as_str().and_then(|p| p.strip_prefix("$CASE/")),
                row["last_updated_in_seconds"].as_f64(),
            ) else {
                continue;
            };
            let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(secs);
            if let Ok(f) = std::fs::File::options().write(true).open(tmp.join(path)) {
                f.set_modified(when).unwrap();
            }
        }
    }
}

/// Apache Beam's `site-packages`, for the worker's Python: Beam's test runs its cases with Beam
/// installed, and some name Beam's own callables and CombineFns
/// (`apache_beam.transforms.combiners.TopCombineFn`). `dev/setup.sh` makes the venv.
fn beam_site() -> PathBuf {
    let venv = std::env::var_os("RIVERBANK_BEAM_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/riverbank/beam-venv")
        });
    let lib = venv.join("lib");
    std::fs::read_dir(&lib)
        .ok()
        .into_iter()
        .flatten()
        .map(|e| e.unwrap().path().join("site-packages"))
        .find(|p| p.join("apache_beam").is_dir())
        .unwrap_or_else(|| {
            panic!(
                "no apache_beam under {}: run dev/setup.sh, or python3 -m venv {} && {}/bin/pip install 'apache-beam[yaml]==2.77.0'",
                lib.display(),
                venv.display(),
                venv.display()
            )
        })
}

fn rows_of_file(f: &Path) -> Vec<Value> {
    std::fs::read_to_string(f)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn cell(s: &str) -> String {
    let s = s.replace('|', "\\|").replace('\n', " ");
    if s.chars().count() > 280 {
        format!("{}…", s.chars().take(280).collect::<String>())
    } else {
        s
    }
}

fn table(cases: &[Case]) -> String {
    let strs = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut by_lang: BTreeMap<String, [usize; 3]> = BTreeMap::new();
    let mut by_transform: BTreeMap<String, [usize; 3]> = BTreeMap::new();
    for c in cases {
        let k = match (&c.result, c.compared) {
            (Ok(()), _) => 0,
            (Err(_), true) => 1,
            (Err(_), false) => 2,
        };
        for l in strs(&c.meta["languages"]) {
            by_lang.entry(l).or_default()[k] += 1;
        }
        for t in strs(&c.meta["transforms"]) {
            by_transform.entry(t).or_default()[k] += 1;
        }
    }
    let passing = cases.iter().filter(|c| c.result.is_ok()).count();
    let compared = cases.iter().filter(|c| c.compared).count();
    let mut s = format!(
        "# Conformance with Beam\n\n\
         Written by `cli/tests/conformance.rs` (do not edit: `RIVERBANK_CONFORMANCE_WRITE=1 cargo nextest run -p riverbank --test conformance`).\n\
         The cases are the pipelines of Beam YAML's documentation that Beam's `readme_test.py` runs, with its\n\
         test inputs, recorded by `conformance/record.py`, and the `YamlTransform`s of Beam's own test suite\n\
         (`apache_beam/yaml/*_test.py`: `suite_*` cases, `doc` is the test module) with the inputs its tests\n\
         give them, recorded by `conformance/record_suite.py`. Both run Beam (the oracle) and record its\n\
         outputs; Riverbank's are compared sink by sink (rows of an error output by their `element`: the\n\
         message and stack are each runner's own words), and what Beam refuses Riverbank must refuse.\n\n\
         Riverbank runs them with Apache Beam 2.77 importable in the worker's Python, as Beam's test runs with\n\
         Beam installed (some cases name Beam's own callables and CombineFns).\n\n\
         **{passing} of {compared} compared cases pass**; {} more are not compared (Beam's test does not run them,\n\
         runs them on its test fakes or on mocks of Google Cloud services, needs Java, gives them inputs only\n\
         Python can make, or Beam's output cannot be had twice: no oracle).\n\n",
        cases.len() - compared
    );
    for (title, m) in [("UDF language", &by_lang), ("transform", &by_transform)] {
        s += &format!("| {title} | pass | fail | not compared |\n|---|---:|---:|---:|\n");
        for (k, [p, f, n]) in m {
            s += &format!("| {k} | {p} | {f} | {n} |\n");
        }
        s += "\n";
    }
    s += "| case | doc:line | languages | result |\n|---|---|---|---|\n";
    for c in cases {
        let r = match &c.result {
            Ok(()) => "pass".to_string(),
            Err(e) => cell(e),
        };
        s += &format!(
            "| {} | {}:{} | {} | {} |\n",
            c.id,
            c.meta["doc"].as_str().unwrap_or(""),
            c.meta["line"],
            strs(&c.meta["languages"]).join(", "),
            r
        );
    }
    s
}

#[test]
fn beams_documented_pipelines_give_beams_results() {
    let dir = root().join("conformance/cases");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("conformance/cases (conformance/record.py)")
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let cases: Vec<Case> = std::thread::scope(|s| {
        let halves: Vec<_> = dirs
            .chunks(dirs.len().div_ceil(2).max(1))
            .map(|chunk| s.spawn(move || chunk.iter().map(|d| run_case(d)).collect::<Vec<_>>()))
            .collect();
        halves.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let text = table(&cases);
    let doc = root().join("docs/conformance.md");
    if std::env::var("RIVERBANK_CONFORMANCE_WRITE").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(doc.parent().unwrap()).unwrap();
        std::fs::write(&doc, &text).unwrap();
    }
    let committed = std::fs::read_to_string(&doc).unwrap_or_default();
    assert!(
        committed == text,
        "docs/conformance.md is not what the cases give now (RIVERBANK_CONFORMANCE_WRITE=1 rewrites it):\n{text}"
    );
}
