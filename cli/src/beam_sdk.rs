//! A Beam YAML pipeline with a `PyTransform` (a Beam Python PTransform, applied to whole
//! PCollections) cannot run on Riverbank's Arrow engine. `riverbank run` runs it the way Beam
//! does, through Beam's own YAML expansion in Python (`apache_beam.yaml.main`), submitted to a
//! Riverbank job service started in this process: the portable runner fuses and runs it, the
//! user's Python on an SDK harness in the submitting process (LOOPBACK).
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::PipelineArgs;

/// The pipeline (Jinja rendered, as Beam reads YAML) when it holds a PyTransform anywhere.
pub(crate) fn pipeline_with_py_transform(args: &PipelineArgs) -> Result<Option<Value>> {
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
    Ok(has_py_transform(&source.pipeline).then_some(source.pipeline))
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
fn beam_python() -> PathBuf {
    std::env::var_os("RIVERBANK_BEAM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// Runs `pipeline` through Beam's Python YAML expansion on a Riverbank job service.
pub(crate) fn run(pipeline: Value) -> Result<()> {
    let python = beam_python();
    let probe = Command::new(&python)
        .args(["-c", "import apache_beam.yaml.main"])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !probe.status.success() {
        bail!(
            "this pipeline has a PyTransform, which runs on Apache Beam's Python SDK, and {} cannot import apache_beam.yaml: \
             set RIVERBANK_BEAM_PYTHON to a Python with apache-beam[yaml] installed (dev/setup.sh makes one)",
            python.display()
        );
    }
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
    crate::runtime(2)?.block_on(async move {
        let server = riverbank_portable::JobServer::start(riverbank_portable::JobServerOptions {
            bind: ([127, 0, 0, 1], 0).into(),
            fn_bind: ([127, 0, 0, 1], 0).into(),
            fn_advertise: "127.0.0.1".into(),
            sdk_workers: 1,
            artifacts_dir: None,
        })
        .await?;
        let mut child = tokio::process::Command::new(&python)
            .arg("-m")
            .arg("apache_beam.yaml.main")
            .arg(format!("--yaml_pipeline_file={}", file.display()))
            .arg("--runner=PortableRunner")
            .arg(format!("--job_endpoint={}", server.addr))
            .arg("--environment_type=LOOPBACK")
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("running {}", python.display()))?;
        let status = child.wait().await?;
        if !status.success() {
            bail!("the pipeline failed on Beam's Python SDK ({status}); its output is above");
        }
        Ok(())
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
