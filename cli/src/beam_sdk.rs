//! Pipelines that run on Beam's Python SDK through Riverbank's portable runner, submitted to a
//! job service started in this process:
//! - a Beam Python SDK pipeline file (`riverbank run pipeline.py -- ARGS`, and `riverbank plan`
//!   of one, which shows the stages the runner fused without running them);
//! - a streaming Beam YAML pipeline with a `PyTransform` (a Beam Python PTransform, applied to
//!   whole PCollections), whose PyTransform the Arrow engine runs in batch jobs only
//!   (`python_sdk`): it goes through Beam's own YAML expansion in Python
//!   (`apache_beam.yaml.main`), the user's Python on an SDK harness in the submitting process
//!   (LOOPBACK).
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use riverbank_portable::{JobServer, JobServerOptions, PreparedJob};
use serde_json::Value;

use crate::PipelineArgs;

/// The pipeline (Jinja rendered, as Beam reads YAML) when it streams and holds a PyTransform
/// anywhere: the engine runs a batch pipeline's PyTransforms as stages of their own, a
/// streaming one goes whole through Beam's Python SDK.
pub(crate) fn streaming_with_py_transform(args: &PipelineArgs) -> Result<Option<Value>> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let vars = match &args.jinja_variables {
        Some(s) => match serde_json::from_str(s) {
            Ok(Value::Object(m)) => m,
            _ => return Ok(None), // `load` reports a bad --jinja-variables
        },
        None => Default::default(),
    };
    let Ok(source) = riverbank_pipeline::parse_source(&text, &vars) else {
        return Ok(None); // `load` reports it, with the file's name
    };
    if !has_py_transform(&source.pipeline) {
        return Ok(None);
    }
    let streams = riverbank_pipeline::load_plan(&text, &vars, "pipeline")
        .is_ok_and(|plan| plan.is_streaming());
    Ok(streams.then_some(source.pipeline))
}

fn has_py_transform(v: &Value) -> bool {
    match v {
        Value::Object(m) => {
            m.get("type").and_then(Value::as_str) == Some("PyTransform")
                || m.values().any(has_py_transform)
        }
        Value::Array(a) => a.iter().any(has_py_transform),
        _ => false,
    }
}

/// The Python that runs Beam: `RIVERBANK_BEAM_PYTHON`, else `python3` (with the caller's
/// `PYTHONPATH`).
pub(crate) fn beam_python() -> PathBuf {
    std::env::var_os("RIVERBANK_BEAM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// `python` if it can import `module`, else an error saying what `what` needs.
pub(crate) fn python_with(module: &str, what: &str) -> Result<PathBuf> {
    let python = beam_python();
    let probe = Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !probe.status.success() {
        bail!(
            "{what}, which runs on Apache Beam's Python SDK, and {} cannot import {module}: \
             set RIVERBANK_BEAM_PYTHON to a Python with apache-beam installed (dev/setup.sh makes one)",
            python.display()
        );
    }
    Ok(python)
}

/// A job server in this process, on loopback, holding up to `memory_mb` of each job's
/// materialized data in memory.
pub(crate) async fn job_server(
    sdk_workers: usize,
    plan_only: bool,
    memory_mb: usize,
) -> Result<JobServer> {
    Ok(JobServer::start(JobServerOptions {
        bind: ([127, 0, 0, 1], 0).into(),
        fn_bind: ([127, 0, 0, 1], 0).into(),
        fn_advertise: "127.0.0.1".into(),
        sdk_workers,
        artifacts_dir: None,
        plan_only,
        progress_every: std::time::Duration::from_secs(10),
        memory_mb,
        object_storage: Some(crate::beam_k8s::stored::object_storage()),
        worker_pools: Vec::new(),
    })
    .await?)
}

/// How a submitted program ended.
enum Ended {
    /// It exited by itself, with this status.
    Exited(std::process::ExitStatus),
    /// Ctrl-C: its streaming jobs were drained (they ended, their windows fired).
    Drained,
}

/// Runs `python ARGS` submitting to `server` (see [`submission`]) to its end; its output is the
/// user's. Ctrl-C reaches this process only (the program has its own process group): its
/// streaming jobs are drained and its batch jobs cancelled, and the program is awaited as they
/// end; a second Ctrl-C leaves at once.
async fn submit(
    python: &Path,
    args: &[OsString],
    server: &JobServer,
    environment: &[String],
) -> Result<Ended> {
    let mut child = submission(python, args, server, environment)
        .process_group(0)
        .spawn()
        .with_context(|| format!("running {}", python.display()))?;
    tokio::select! {
        status = child.wait() => return Ok(Ended::Exited(status?)),
        interrupted = tokio::signal::ctrl_c() => interrupted?,
    }
    let stopped = server.stop_all();
    eprintln!(
        "Ctrl-C: {} streaming job(s) draining (their sources stop, what they read is finished), {} batch job(s) cancelled; Ctrl-C again to leave now",
        stopped.drained, stopped.cancelled
    );
    tokio::select! {
        status = child.wait() => {
            let status = status?;
            if stopped.drained > 0 && stopped.cancelled == 0 {
                // Beam's Python client calls a drained job's end an error; it is the end asked for.
                eprintln!("drained ({} exited {status})", python.display());
                return Ok(Ended::Drained);
            }
            Ok(Ended::Exited(status))
        }
        interrupted = tokio::signal::ctrl_c() => {
            interrupted?;
            child.kill().await?;
            bail!("interrupted")
        }
    }
}

/// `python ARGS` submitting to `server` with Beam's portable runner options after the caller's
/// (the last of a repeated option wins in Beam's parser). The environment is `environment`
/// unless the caller's arguments choose one.
fn submission(
    python: &Path,
    args: &[OsString],
    server: &JobServer,
    environment: &[String],
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(python);
    command
        .args(args)
        .args(portable_runner(server))
        .kill_on_drop(true);
    let chosen = args
        .iter()
        .any(|a| a.to_string_lossy().starts_with("--environment_type"));
    if !chosen {
        command.args(environment);
    }
    command
}

/// Beam's options for `harnesses` PROCESS harnesses running `python`'s SDK worker.
pub(crate) fn process_environment(python: &Path, harnesses: usize) -> [String; 3] {
    let command = format!(
        "{} -m apache_beam.runners.worker.sdk_worker_main",
        python.display()
    );
    [
        "--environment_type=PROCESS".to_string(),
        format!(
            "--environment_config={}",
            serde_json::json!({ "command": command })
        ),
        format!("--sdk_worker_parallelism={harnesses}"),
    ]
}

/// Beam's options submitting to `server` with its portable runner.
pub(crate) fn portable_runner(server: &JobServer) -> [String; 2] {
    [
        "--runner=PortableRunner".to_string(),
        format!("--job_endpoint={}", server.addr),
    ]
}

/// Runs `pipeline` through Beam's Python YAML expansion on a Riverbank job service.
pub(crate) fn run(pipeline: Value, memory_mb: usize) -> Result<()> {
    let python = python_with("apache_beam.yaml.main", "this pipeline has a PyTransform")?;
    eprintln!(
        "this pipeline has a PyTransform: running it through Beam's Python SDK on Riverbank's portable runner"
    );
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("pipeline.yaml");
    // JSON is YAML; the values are already typed as Beam's loader types them.
    std::fs::write(
        &file,
        serde_json::to_string(&serde_json::json!({ "pipeline": pipeline }))?,
    )?;
    let args: Vec<OsString> = vec![
        "-m".into(),
        "apache_beam.yaml.main".into(),
        format!("--yaml_pipeline_file={}", file.display()).into(),
    ];
    crate::runtime(2)?.block_on(async move {
        let server = job_server(1, false, memory_mb).await?;
        let loopback = ["--environment_type=LOOPBACK".to_string()];
        match submit(&python, &args, &server, &loopback).await? {
            Ended::Exited(status) if !status.success() => {
                bail!("the pipeline failed on Beam's Python SDK ({status}); its output is above")
            }
            Ended::Exited(_) | Ended::Drained => Ok(()),
        }
    })
}

/// A Beam Python SDK pipeline: a `.py` file.
pub(crate) fn is_python_pipeline(args: &PipelineArgs) -> bool {
    args.file.extension().is_some_and(|e| e == "py")
}

fn script_args(args: &PipelineArgs) -> Result<Vec<OsString>> {
    if args.jinja_variables.is_some() {
        bail!(
            "--jinja-variables is for Beam YAML; give a Python pipeline its arguments after `--`"
        );
    }
    let mut all = vec![args.file.clone().into_os_string()];
    all.extend(args.sdk_args.iter().map(OsString::from));
    Ok(all)
}

/// Runs a Beam Python SDK pipeline file on a job server in this process, as
/// `python FILE ARGS --runner=PortableRunner`: its user code on `harnesses` PROCESS harnesses
/// of the same Python (unless its arguments choose another environment).
pub(crate) fn run_python(args: &PipelineArgs, harnesses: usize, memory_mb: usize) -> Result<()> {
    let script = script_args(args)?;
    let python = python_with("apache_beam", "a Python pipeline")?;
    let process = process_environment(&python, harnesses);
    crate::runtime(2)?.block_on(async move {
        let server = job_server(harnesses, false, memory_mb).await?;
        match submit(&python, &script, &server, &process).await? {
            Ended::Exited(status) if !status.success() => bail!(
                "{} failed ({status}); its output is above",
                args.file.display()
            ),
            Ended::Exited(_) | Ended::Drained => Ok(()),
        }
    })
}

/// Plans a Beam Python SDK pipeline file: runs it against a job server that plans what is
/// submitted and runs nothing, and gives each pipeline it submitted with its plan.
pub(crate) fn plan_python(args: &PipelineArgs) -> Result<Vec<PreparedJob>> {
    let script = script_args(args)?;
    let python = python_with("apache_beam", "a Python pipeline")?;
    crate::runtime(2)?.block_on(async move {
        let server = job_server(1, true, 1024).await?;
        let loopback = ["--environment_type=LOOPBACK".to_string()];
        // Its run is refused, so the script fails: its output matters only when nothing was
        // submitted.
        let out = submission(&python, &script, &server, &loopback)
            .output()
            .await
            .with_context(|| format!("running {}", python.display()))?;
        let prepared = server.prepared();
        if prepared.is_empty() {
            bail!(
                "{} submitted no pipeline ({}):\n{}{}",
                args.file.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(prepared)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_py_transform_inside_a_composite() {
        let p = serde_json::json!({"transforms": [
            {"type": "Create", "config": {"elements": [1]}},
            {"type": "composite", "transforms": [{"type": "PyTransform", "config": {"constructor": "x.Y"}}]}
        ]});
        assert!(has_py_transform(&p));
        assert!(!has_py_transform(
            &serde_json::json!({"type": "MapToFields", "config": {"fields": {"PyTransform": 1}}})
        ));
    }
}
