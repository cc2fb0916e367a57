//! Python UDFs in the binary: the hidden `udf-host` subcommand (a process that runs Python UDF
//! batches for a worker, so that the GIL does not hold it to one core), starting hosts for a
//! run, and the UDF lines of `riverbank plan`.
use anyhow::Result;
use riverbank_engine::CompiledPlan;
#[cfg(feature = "python")]
use riverbank_engine::compile::CompiledTransform;
#[cfg(feature = "python")]
use riverbank_engine::ops::Kind;

/// Lets a process with `slots` work slots run Python UDF batches in up to `slots - 1` hosts.
pub fn enable_hosts(slots: usize) {
    #[cfg(feature = "python")]
    if let Ok(exe) = std::env::current_exe() {
        riverbank_udf::python::hosts::enable(exe, slots.saturating_sub(1));
    }
    #[cfg(not(feature = "python"))]
    let _ = slots;
}

/// Keeps the venvs of jobs' python `dependencies:` under `dir` (a local run's temp dir).
pub fn set_env_root(dir: &std::path::Path) {
    #[cfg(feature = "python")]
    riverbank_udf::python::env::set_root(dir.join("riverbank-python-envs"));
    #[cfg(not(feature = "python"))]
    let _ = dir;
}

/// Stops the run's UDF hosts.
pub fn stop_hosts() {
    #[cfg(feature = "python")]
    riverbank_udf::python::hosts::shutdown();
}

/// `riverbank udf-host`: serve batches on stdin/stdout until the worker closes stdin.
pub fn host() -> Result<()> {
    #[cfg(feature = "python")]
    return Ok(riverbank_udf::python::hosts::serve()?);
    #[cfg(not(feature = "python"))]
    anyhow::bail!("this riverbank was built without Python (the `python` feature)")
}

/// One line per python UDF: where it is and which path it takes (vectorized as SQL, or in the
/// interpreter). Empty when the pipeline has none.
pub fn paths(compiled: &CompiledPlan) -> String {
    #[cfg(feature = "python")]
    {
        use std::fmt::Write;
        let mut out = String::new();
        for (t, c) in compiled
            .plan
            .graph
            .transforms
            .iter()
            .zip(&compiled.transforms)
        {
            let CompiledTransform::Element(op) = c else {
                continue;
            };
            let exprs: Vec<(String, &riverbank_udf::expr::Compiled)> = match &op.kind {
                Kind::MapToFields { fields, .. } => fields
                    .iter()
                    .map(|(n, e)| (format!("fields.{n}"), e))
                    .collect(),
                Kind::Filter { keep } => vec![("keep".into(), keep)],
                Kind::Partition { by, .. } => vec![("by".into(), by)],
                Kind::AssignTimestamps { timestamp } => vec![("timestamp".into(), timestamp)],
                _ => vec![],
            };
            for (field, e) in exprs {
                if let Some(path) = riverbank_udf::python::path_of(&e.expr) {
                    let _ = writeln!(out, "  {} {field}: python '{}' — {path}", t.name, e.text);
                }
            }
        }
        if out.is_empty() {
            out
        } else {
            format!("Python UDFs:\n{out}")
        }
    }
    #[cfg(not(feature = "python"))]
    {
        let _ = compiled;
        String::new()
    }
}
