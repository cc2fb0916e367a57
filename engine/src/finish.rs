//! The end of a job's sinks, in process and on the coordinator alike: commit every sink's temp
//! parts to their final names once every item is done, or abort them when the job failed or
//! was cancelled; either way remove the job's temp directories.
use crate::compiled::{CompiledPlan, CompiledTransform};
use riverbank_io::{self as io, IoError, TempPart};
use std::collections::BTreeMap;

/// Why a commit did not finish: which sink, and the store's error.
#[derive(Debug, thiserror::Error)]
#[error("committing {path}: {source}")]
pub struct CommitError {
    pub path: String,
    #[source]
    pub source: IoError,
}

/// The committed files: (sink transform name, files), in plan order.
pub type Committed = Vec<(String, Vec<String>)>;

/// Commits the sinks' parts (per sink transform, in part order). Stops at the first sink that
/// cannot be committed: a commit run again (a restarted coordinator) finishes what is left.
pub async fn commit_sinks(
    plan: &CompiledPlan,
    mut parts: BTreeMap<usize, Vec<TempPart>>,
    job_token: &str,
) -> Result<Committed, CommitError> {
    let mut files = vec![];
    for (t, options, schema) in sinks(plan) {
        let written = io::commit_sink(
            options,
            Some(schema.clone()),
            parts.remove(&t).unwrap_or_default(),
        )
        .await;
        io::cleanup_temp(options, job_token).await;
        let written = written.map_err(|source| CommitError {
            path: options.path.clone(),
            source,
        })?;
        files.push((plan.plan.graph.transforms[t].name.clone(), written));
    }
    Ok(files)
}

/// Deletes the sinks' temp parts and temp directories: nothing of the job becomes visible.
pub async fn abort_sinks(
    plan: &CompiledPlan,
    mut parts: BTreeMap<usize, Vec<TempPart>>,
    job_token: &str,
) {
    for (t, options, _) in sinks(plan) {
        io::abort_sink(options, parts.remove(&t).unwrap_or_default()).await;
        io::cleanup_temp(options, job_token).await;
    }
}

fn sinks(
    plan: &CompiledPlan,
) -> impl Iterator<Item = (usize, &io::WriteOptions, &arrow::datatypes::SchemaRef)> {
    plan.transforms
        .iter()
        .enumerate()
        .filter_map(|(t, ct)| match ct {
            CompiledTransform::Write { options, schema } => Some((t, options, schema)),
            _ => None,
        })
}
