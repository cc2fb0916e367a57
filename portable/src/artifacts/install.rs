//! What Beam's container boot does with the packages staged with a job, for PROCESS harnesses
//! (whose command runs without boot): the `--extra_package`s (listed in `extra_packages.txt`),
//! a `--setup_file`'s package (`workflow.tar.gz`) and a `--requirements_file`
//! (`requirements.txt`) are pip-installed with the command's own Python into a prefix the
//! job's harnesses share, on their `PYTHONPATH`; the interpreter itself is left as it was. As
//! boot does, from the staged files alone first (no package index), and only if that fails with
//! the index too. Requirements already met by the interpreter are not installed again.
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::PortableError;

/// The staged names boot installs, in its order.
const EXTRA_PACKAGES: &str = "extra_packages.txt";
const SETUP_PACKAGE: &str = "workflow.tar.gz";
const REQUIREMENTS: &str = "requirements.txt";

/// What pip is asked to install from `staged`: package files, then `-r requirements.txt`.
/// Empty when the job staged no package.
pub fn to_install(staged: &Path) -> Result<Vec<OsString>, PortableError> {
    let mut args: Vec<OsString> = vec![];
    let list = staged.join(EXTRA_PACKAGES);
    if list.exists() {
        let text = std::fs::read_to_string(&list).map_err(|e| {
            PortableError::Artifacts(format!("cannot read the staged {EXTRA_PACKAGES}: {e}"))
        })?;
        for name in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let file = staged.join(name);
            if !file.exists() {
                return Err(PortableError::Artifacts(format!(
                    "extra package '{name}' is listed in {EXTRA_PACKAGES} but was not staged"
                )));
            }
            args.push(file.into_os_string());
        }
    }
    for (name, flag) in [(SETUP_PACKAGE, None), (REQUIREMENTS, Some("-r"))] {
        let file = staged.join(name);
        if file.exists() {
            args.extend(flag.map(OsString::from));
            args.push(file.into_os_string());
        }
    }
    Ok(args)
}

/// Installs the packages staged in `staged` into `prefix` with the Python that starts the
/// PROCESS environment's `command`; the `site-packages` directory to put on the harnesses'
/// `PYTHONPATH` (None: nothing was staged, or nothing needed installing).
pub async fn install(
    command: &str,
    staged: &Path,
    prefix: &Path,
) -> Result<Option<PathBuf>, PortableError> {
    let packages = to_install(staged)?;
    if packages.is_empty() {
        return Ok(None);
    }
    let python = interpreter(command).ok_or_else(|| {
        PortableError::Harness(format!(
            "the job staged Python packages, which are installed with the PROCESS \
             environment's Python, and its command '{command}' does not start with one: give a \
             command such as 'python -m apache_beam.runners.worker.sdk_worker_main', or install \
             the packages into its Python yourself"
        ))
    })?;
    let first = pip(python, prefix, staged, &packages, true).await;
    if let Err(offline) = first {
        tracing::info!(
            error = %offline,
            "the staged packages alone did not install: trying again with the package index"
        );
        pip(python, prefix, staged, &packages, false)
            .await
            .map_err(|e| {
                PortableError::Harness(format!("installing the job's staged packages: {e}"))
            })?;
    }
    let site = site_packages(prefix);
    tracing::info!(
        packages = ?packages,
        into = ?site,
        "installed the job's staged packages for its PROCESS harnesses"
    );
    Ok(site)
}

/// The interpreter a command starts with, when it is a Python (`python`, `python3.11`, a
/// venv's `bin/python`).
fn interpreter(command: &str) -> Option<&str> {
    let first = command.split_whitespace().next()?;
    let name = Path::new(first).file_name()?.to_str()?;
    name.starts_with("python").then_some(first)
}

async fn pip(
    python: &str,
    prefix: &Path,
    staged: &Path,
    packages: &[OsString],
    offline: bool,
) -> Result<(), String> {
    let mut c = tokio::process::Command::new(python);
    c.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
    ])
    .args(["--no-warn-script-location", "--prefix"])
    .arg(prefix)
    .arg("--find-links")
    .arg(staged);
    if offline {
        // Building a staged sdist with the interpreter's own setuptools (no index to fetch
        // a build environment from).
        c.args(["--no-index", "--no-build-isolation"]);
    }
    let out = c
        .args(packages)
        .output()
        .await
        .map_err(|e| format!("cannot run '{python} -m pip': {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = text.lines().rev().take(12).collect();
    Err(format!(
        "'{python} -m pip install' failed ({}): {}",
        out.status,
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    ))
}

/// `prefix/lib/pythonX.Y/site-packages`, if pip made it.
fn site_packages(prefix: &Path) -> Option<PathBuf> {
    std::fs::read_dir(prefix.join("lib"))
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Boot's order and names: extra packages as listed, the setup package, then the
    /// requirements file; a listed package that was not staged is an error naming it.
    #[test]
    fn staged_packages_are_installed_in_boots_order() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert!(to_install(d).unwrap().is_empty());
        std::fs::write(d.join(REQUIREMENTS), "six\n").unwrap();
        std::fs::write(d.join(SETUP_PACKAGE), b"sdist").unwrap();
        std::fs::write(d.join("a-1.0-py3-none-any.whl"), b"wheel").unwrap();
        std::fs::write(d.join(EXTRA_PACKAGES), "a-1.0-py3-none-any.whl\n\n").unwrap();
        let got: Vec<String> = to_install(d)
            .unwrap()
            .into_iter()
            .map(|a| a.to_string_lossy().replace(&*d.to_string_lossy(), "D"))
            .collect();
        assert_eq!(
            got,
            [
                "D/a-1.0-py3-none-any.whl",
                "D/workflow.tar.gz",
                "-r",
                "D/requirements.txt"
            ]
        );
        std::fs::write(d.join(EXTRA_PACKAGES), "missing.tar.gz\n").unwrap();
        let err = to_install(d).unwrap_err().to_string();
        assert!(err.contains("'missing.tar.gz'"), "{err}");
    }

    #[test]
    fn the_interpreter_is_the_commands_first_word_when_it_is_a_python() {
        let cases = [
            (
                "python -m apache_beam.runners.worker.sdk_worker_main",
                Some("python"),
            ),
            ("/v/bin/python3.11 -m x", Some("/v/bin/python3.11")),
            ("/opt/apache/beam/boot", None),
            ("", None),
        ];
        for (command, want) in cases {
            assert_eq!(interpreter(command), want, "{command}");
        }
    }
}
