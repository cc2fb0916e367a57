//! The worker image runs every pipeline the README documents, Python included, checked without
//! Docker: `e2e/images-from-binaries.sh` writes the image's root file system (`ROOTFS_ONLY`),
//! and the `riverbank` inside it runs jobs as a pod would run them — `chroot`ed into it, as the
//! nonroot user 65532, with the root file system mounted read-only, `/tmp` a fresh tmpfs and
//! the job's directory the only other writable place. Needs root (for chroot and mounts), as
//! CI has; anywhere it cannot build or enter the root file system, the test fails.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

/// The root file system of `image` (`worker`, `worker-beam`), from this build's binary.
fn image_rootfs(dir: &Path, image: &str) -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut script = Command::new("bash");
    script
        .arg(repo.join("e2e/images-from-binaries.sh"))
        .env("IMAGES_ONLY", "1")
        .env("IMAGES", image)
        .env("ROOTFS_ONLY", dir)
        .env("RIVERBANK_BIN", env!("CARGO_BIN_EXE_riverbank"));
    if image == "worker-beam" {
        // dev/setup.sh's venv: the worker's Python with apache-beam.
        script.env(
            "BEAM_VENV",
            common::beam_python().parent().unwrap().parent().unwrap(),
        );
    }
    let out = script.output().expect("bash runs");
    assert!(
        out.status.success(),
        "images-from-binaries.sh could not build the {image} root file system:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let root = dir.join(image);
    assert!(root.join("usr/local/bin/riverbank").is_file());
    root
}

/// Runs `riverbank ARGS` inside `root` as a pod runs it: user 65532, read-only root, a tmpfs
/// `/tmp`, `/proc` and `/dev`, and `work` (the job's disk) bind-mounted at `/work`.
fn run_in(root: &Path, work: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test chroots into the image's root file system: run it as root (CI does)"
    );
    for d in ["work", "proc", "dev"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let mut script = String::from(
        "set -e\n\
         chroot=$(command -v chroot)\n\
         mount --bind \"$ROOT\" \"$ROOT\"\n\
         mount -o remount,bind,ro \"$ROOT\"\n\
         mount -t tmpfs -o mode=1777 tmpfs \"$ROOT/tmp\"\n\
         mount -t proc proc \"$ROOT/proc\"\n\
         mount --rbind /dev \"$ROOT/dev\"\n\
         mount --bind \"$WORK\" \"$ROOT/work\"\n\
         exec env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/home/nonroot",
    );
    for (k, v) in env {
        script.push_str(&format!(" {k}={v}"));
    }
    script.push_str(" \"$chroot\" --userspec=65532:65532 \"$ROOT\"");
    script.push_str(" /usr/local/bin/riverbank");
    for a in args {
        script.push_str(&format!(" '{a}'"));
    }
    script.push('\n');
    Command::new("unshare")
        .args(["--mount", "--fork", "--", "sh", "-c", &script])
        .env("ROOT", root)
        .env("WORK", work)
        .output()
        .expect("unshare runs")
}

/// `riverbank run` of `job` (written to `work/job.yaml`) inside `root` as a pod runs it, its
/// spill directory on the job's disk (`/work/spill`).
fn run_job(root: &Path, work: &Path, job: &str, env: &[(&str, &str)]) -> Output {
    std::fs::write(work.join("job.yaml"), job).unwrap();
    // The job's disk belongs to the pod's user (fsGroup in a pod).
    let chown = Command::new("chown")
        .args(["-R", "65532:65532"])
        .arg(work)
        .status()
        .unwrap();
    assert!(chown.success());
    let args = [
        "run",
        "/work/job.yaml",
        "--no-progress",
        "--spill-dir",
        "/work/spill",
    ];
    run_in(root, work, &args, env)
}

/// Every JSON row written under `dir`, sorted.
fn rows(dir: &Path) -> Vec<serde_json::Value> {
    let mut out: Vec<serde_json::Value> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
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

/// A one-module wheel, written as a zip by the host's Python (a wheel needs no build tools).
fn write_wheel(dir: &Path) -> String {
    let name = "rb_image_dep-0.1-py3-none-any.whl";
    let script = r#"
import sys, zipfile
files = {
    "rb_image_dep.py": "def tag(s):\n    return '<' + s + '>'\n",
    "rb_image_dep-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: rb-image-dep\nVersion: 0.1\n",
    "rb_image_dep-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: riverbank-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
files["rb_image_dep-0.1.dist-info/RECORD"] = "".join(f"{n},,\n" for n in files) + "rb_image_dep-0.1.dist-info/RECORD,,\n"
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for n, c in files.items():
        z.writestr(n, c)
"#;
    let out = Command::new("python3")
        .args(["-c", script, &dir.join(name).to_string_lossy()])
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    format!("/work/{name}")
}

#[test]
fn the_worker_image_runs_python_callables_and_dependencies_read_only_as_nonroot() {
    let dir = tempfile::tempdir().unwrap();
    let root = image_rootfs(&dir.path().join("roots"), "worker");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let wheel = write_wheel(&work);
    let job = format!(
        r#"
pipeline:
  transforms:
    - type: Create
      name: Words
      config:
        elements: [{{w: "ab", n: 2}}, {{w: "xyz", n: 3}}]
    - type: MapToFields
      name: Callable
      input: Words
      config:
        language: python
        fields:
          w: w
          twice:
            callable: |
              def f(row):
                  return row.w * row.n
    - type: MapToFields
      name: WithDependency
      input: Words
      config:
        language: python
        dependencies: ['{wheel}']
        fields:
          tagged:
            callable: |
              import rb_image_dep
              def f(row):
                  return rb_image_dep.tag(row.w)
    - type: WriteToJson
      input: Callable
      config: {{path: /work/out/twice/part.json}}
    - type: WriteToJson
      input: WithDependency
      config: {{path: /work/out/tagged/part.json}}
"#
    );
    let out = run_job(
        &root,
        &work,
        &job,
        &[
            ("PIP_NO_INDEX", "1"),
            ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
            ("RIVERBANK_LOG", "info"),
            ("NO_COLOR", "1"),
        ],
    );
    assert!(
        out.status.success(),
        "riverbank run inside the worker image failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(
        rows(&work.join("out/twice")),
        [
            serde_json::json!({"w": "ab", "twice": "abab"}),
            serde_json::json!({"w": "xyz", "twice": "xyzxyzxyz"})
        ]
    );
    let tagged: Vec<String> = rows(&work.join("out/tagged"))
        .iter()
        .map(|r| r["tagged"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tagged, ["<ab>", "<xyz>"]);
    // The venv was made by the image's own interpreter, on the job's disk (under the spill
    // directory, as a pod's are under its data directory).
    assert!(
        text(&out.stderr).contains("python dependencies: installing"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        work.join("spill/riverbank-python-envs")
            .read_dir()
            .unwrap()
            .next()
            .is_some()
    );
}

/// The worker image with Beam (`worker-beam`, what the operator runs a pipeline with a
/// `PyTransform` on) runs one read-only as the nonroot user, with nothing but the image's own
/// environment: `RIVERBANK_BEAM_PYTHON` as the image sets it, Beam's Python SDK in the image's
/// venv, the PTransform's rows through Parquet on the job's disk and a job server in the process.
#[test]
fn the_worker_image_with_beam_runs_a_py_transform_read_only_as_nonroot() {
    let dir = tempfile::tempdir().unwrap();
    let root = image_rootfs(&dir.path().join("roots"), "worker-beam");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    // The venv's Python, at the same path inside the image.
    let python = common::beam_python().display().to_string();
    let out = run_job(
        &root,
        &work,
        r#"
pipeline:
  type: chain
  transforms:
    - type: Create
      config:
        elements: [{n: 1}, {n: 2}, {n: 3}]
    - type: PyTransform
      name: Squares
      config:
        constructor: __callable__
        kwargs:
          source: |
            def squares(pcoll):
              import apache_beam as beam
              return pcoll | beam.Map(lambda r: beam.Row(n=r.n, square=r.n * r.n))
    - type: WriteToJson
      config: {path: /work/out/squares.json}
"#,
        &[("RIVERBANK_BEAM_PYTHON", &python), ("NO_COLOR", "1")],
    );
    assert!(
        out.status.success(),
        "riverbank run of a PyTransform inside the worker-beam image failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(
        rows(&work.join("out")),
        [
            serde_json::json!({"n": 1, "square": 1}),
            serde_json::json!({"n": 2, "square": 4}),
            serde_json::json!({"n": 3, "square": 9})
        ]
    );
}
