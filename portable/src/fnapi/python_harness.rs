//! Riverbank's start of Beam's Python SDK harness (`portable/python/riverbank_harness`): Beam's
//! own `sdk_worker_main` with lean chains installed, which run a fused stage's simple
//! transforms (Map, Filter, FlatMap, DoFns that need only the element, WindowInto, a lifted
//! combine's precombine) as one loop over batches of elements. A PROCESS environment whose
//! command is Beam's Python harness (`PYTHON -m apache_beam.runners.worker.sdk_worker_main`)
//! runs `PYTHON -m riverbank_harness` instead, with the package written beside the harness;
//! `--experiments=riverbank_harness=off` keeps Beam's harness as given.
use std::path::{Path, PathBuf};

use crate::options;

/// The package's files, as shipped in the binary.
const FILES: [(&str, &str); 3] = [
    (
        "__init__.py",
        include_str!("../../python/riverbank_harness/__init__.py"),
    ),
    (
        "__main__.py",
        include_str!("../../python/riverbank_harness/__main__.py"),
    ),
    (
        "chains.py",
        include_str!("../../python/riverbank_harness/chains.py"),
    ),
];

const BEAM_HARNESS: &str = "apache_beam.runners.worker.sdk_worker_main";

/// The command to run in place of a PROCESS environment's `command`, if it is Beam's Python
/// harness run by one interpreter and the job did not turn Riverbank's off.
pub fn command_for(command: &str, job_options: &prost_types::Struct) -> Option<String> {
    if options::experiment(job_options, "riverbank_harness").as_deref() == Some("off") {
        return None;
    }
    match command.split_whitespace().collect::<Vec<_>>()[..] {
        [python, "-m", BEAM_HARNESS] => Some(format!("{python} -m riverbank_harness")),
        _ => None,
    }
}

/// Writes the package under `dir` (a harness's own directory); returns the directory to put on
/// the harness's `PYTHONPATH`.
pub fn write_under(dir: &Path) -> std::io::Result<PathBuf> {
    let root = dir.join("riverbank-python");
    let package = root.join("riverbank_harness");
    std::fs::create_dir_all(&package)?;
    for (name, text) in FILES {
        std::fs::write(package.join(name), text)?;
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::value::Kind;
    use prost_types::{ListValue, Struct, Value};

    fn with_experiments(list: &[&str]) -> Struct {
        let values = list
            .iter()
            .map(|e| Value {
                kind: Some(Kind::StringValue(e.to_string())),
            })
            .collect();
        Struct {
            fields: [(
                "beam:option:experiments:v1".to_string(),
                Value {
                    kind: Some(Kind::ListValue(ListValue { values })),
                },
            )]
            .into(),
        }
    }

    #[test]
    fn beams_python_harness_is_started_as_riverbanks() {
        let none = Struct::default();
        assert_eq!(
            command_for(
                "/venv/bin/python -m apache_beam.runners.worker.sdk_worker_main",
                &none
            )
            .as_deref(),
            Some("/venv/bin/python -m riverbank_harness")
        );
        assert_eq!(
            command_for(
                " python3  -m  apache_beam.runners.worker.sdk_worker_main ",
                &none
            )
            .as_deref(),
            Some("python3 -m riverbank_harness")
        );
        // Anything else is the user's own command, run as given.
        for other in [
            "/opt/apache/beam/boot",
            "python -m apache_beam.runners.worker.worker_pool_main",
            "env X=1 python -m apache_beam.runners.worker.sdk_worker_main",
        ] {
            assert_eq!(command_for(other, &none), None, "{other}");
        }
        let off = with_experiments(&["use_runner_v2", "riverbank_harness=off"]);
        assert_eq!(
            command_for("python -m apache_beam.runners.worker.sdk_worker_main", &off),
            None
        );
    }

    #[test]
    fn the_package_is_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let root = write_under(dir.path()).unwrap();
        for (name, text) in FILES {
            let written = std::fs::read_to_string(root.join("riverbank_harness").join(name));
            assert_eq!(written.unwrap(), text, "{name}");
        }
    }
}
