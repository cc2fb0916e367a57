//! `dependencies:` of `language: python` transforms (Beam YAML's pip requirements): installed
//! once into a venv under the worker's data directory, keyed by a hash of the requirement list,
//! so a restarted worker (or the next run on the same disk) reuses it; its `site-packages` is
//! then put first on the interpreter's `sys.path`, in this process and in the UDF hosts (the
//! directories travel with each `Program`).
//!
//! A venv is built under a temporary name and renamed into place once pip succeeded, so a crash
//! mid-install leaves nothing that looks complete, and two processes installing the same list at
//! once both end with one complete venv.
use pyo3::prelude::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Where venvs go when the process does not say (`set_root`): `RIVERBANK_PYTHON_ENVS`, else the
/// temp dir.
static ROOT: Mutex<Option<PathBuf>> = Mutex::new(None);
/// The `site-packages` directories of the venvs this process prepared, in order.
static SITE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Sets the directory venvs are kept in (a worker's data directory: its persistent disk).
pub fn set_root(dir: PathBuf) {
    *ROOT.lock().expect("not poisoned") = Some(dir);
}

fn root() -> PathBuf {
    if let Some(r) = ROOT.lock().expect("not poisoned").clone() {
        return r;
    }
    match std::env::var_os("RIVERBANK_PYTHON_ENVS") {
        Some(d) => PathBuf::from(d),
        None => std::env::temp_dir().join("riverbank-python-envs"),
    }
}

/// The `site-packages` directories prepared so far (what a `Program` carries to the hosts).
pub fn site_dirs() -> Vec<String> {
    SITE.lock().expect("not poisoned").clone()
}

/// The venv for `requirements` (installed now unless a complete one exists), with its
/// `site-packages` put on this process's `sys.path`. Errors name the requirements and quote
/// pip's own message (which names the package that is missing or failed to build).
pub fn prepare(requirements: &[String]) -> Result<PathBuf, String> {
    let mut reqs = requirements.to_vec();
    reqs.sort();
    reqs.dedup();
    if reqs.is_empty() {
        return Err("no dependencies".into());
    }
    let dir = root().join(key(&reqs));
    if !dir.join(COMPLETE).is_file() {
        install(&dir, &reqs)?;
    } else {
        tracing::info!(venv = %dir.display(), "python dependencies: reusing the venv");
    }
    let site = site_packages(&dir)?;
    let site = site.to_string_lossy().into_owned();
    {
        let mut s = SITE.lock().expect("not poisoned");
        if !s.contains(&site) {
            s.push(site.clone());
        }
    }
    add_to_path(&[site])?;
    Ok(dir)
}

/// Puts `dirs` first on `sys.path` (their `.pth` files processed), once each.
pub fn add_to_path(dirs: &[String]) -> Result<(), String> {
    if dirs.is_empty() {
        return Ok(());
    }
    super::available()?;
    Python::attach(|py| -> PyResult<()> {
        super::runtime(py)?
            .getattr("add_site_dirs")?
            .call1((dirs.to_vec(),))?;
        Ok(())
    })
    .map_err(|e| format!("cannot add {} to sys.path: {e}", dirs.join(", ")))
}

/// Marks a venv whose install finished (with the requirement list, for people looking).
const COMPLETE: &str = "riverbank-requirements.txt";

/// A stable name for a requirement list: FNV-1a over the sorted list (stable across builds,
/// unlike `DefaultHasher`), plus the interpreter's version (a venv is tied to it).
fn key(reqs: &[String]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in reqs.join("\n").bytes().chain(super::STDLIB.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("venv-{h:016x}")
}

fn install(dir: &Path, reqs: &[String]) -> Result<(), String> {
    let what = || format!("installing python dependencies [{}]", reqs.join(", "));
    let parent = dir.parent().expect("a venv dir has a parent");
    std::fs::create_dir_all(parent)
        .map_err(|e| format!("{}: cannot create {}: {e}", what(), parent.display()))?;
    let tmp = parent.join(format!(
        ".{}.tmp-{}",
        dir.file_name().and_then(|n| n.to_str()).unwrap_or("venv"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    let python = base_python()?;
    tracing::info!(venv = %dir.display(), requirements = ?reqs, "python dependencies: installing");
    run(
        Command::new(&python).args(["-m", "venv"]).arg(&tmp),
        &format!("{}: creating a venv with {}", what(), python.display()),
    )?;
    let pip = run(
        Command::new(tmp.join("bin").join("python"))
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
            ])
            .args(reqs),
        &what(),
    );
    if let Err(e) = pip {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    std::fs::write(tmp.join(COMPLETE), reqs.join("\n") + "\n")
        .map_err(|e| format!("{}: {e}", what()))?;
    if std::fs::rename(&tmp, dir).is_err() {
        // Another process finished the same venv first: keep its.
        let _ = std::fs::remove_dir_all(&tmp);
        if !dir.join(COMPLETE).is_file() {
            return Err(format!(
                "{}: cannot move the venv to {}",
                what(),
                dir.display()
            ));
        }
    }
    Ok(())
}

/// Runs a command; on failure, the error is `what` and the end of its output.
fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what}: cannot run {:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        return Ok(());
    }
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    // pip's last lines say which requirement failed and why.
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.contains("[notice]"))
        .collect();
    let tail = lines[lines.len().saturating_sub(6)..].join("\n  ");
    Err(format!("{what} failed ({}):\n  {tail}", out.status))
}

/// The interpreter matching the embedded libpython, to create venvs with.
fn base_python() -> Result<PathBuf, String> {
    super::available()?;
    let (prefix, version): (String, String) = Python::attach(|py| -> PyResult<_> {
        let sys = py.import("sys")?;
        let prefix: String = sys.getattr("base_prefix")?.extract()?;
        let v = sys.getattr("version_info")?;
        let (major, minor): (u32, u32) = (
            v.getattr("major")?.extract()?,
            v.getattr("minor")?.extract()?,
        );
        Ok((prefix, format!("{major}.{minor}")))
    })
    .map_err(|e| format!("cannot read the interpreter's prefix: {e}"))?;
    let bin = Path::new(&prefix).join("bin");
    [format!("python{version}"), "python3".into()]
        .iter()
        .map(|n| bin.join(n))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "python dependencies need a Python {version} executable to create a venv with, not found in {}",
                bin.display()
            )
        })
}

fn site_packages(venv: &Path) -> Result<PathBuf, String> {
    let lib = venv.join("lib");
    std::fs::read_dir(&lib)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.is_dir())
        .ok_or_else(|| format!("venv {} has no lib/python*/site-packages", venv.display()))
}
