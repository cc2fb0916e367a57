//! Snapshots and updates (Dataflow's `snapshots create` and `--update`, Flink's savepoints).
//!
//! A snapshot is a completed checkpoint kept under a name: its record (source offsets,
//! watermarks, the signature of every keyed state) and every state shard's checkpoint files,
//! copied to `{checkpoints}/snapshots/{name}/`. A job started `--from-snapshot` begins where
//! the snapshot's job was, with its state, and may be a *changed* pipeline: sources and
//! Combines are matched by name (after `transformNameMapping`), and a change that would
//! misread the state (a Combine whose keys or accumulators differ, a source with other
//! partitions, another shard count) is refused with its reason before anything runs.
use super::checkpoints::{CheckpointLog, CheckpointRecord};
use super::shard::state_name;
use object_store::{ObjectStoreExt, PutPayload};
use riverbank_engine::compile::{CompiledPlan, CompiledTransform, SqlKeys};
use riverbank_io::location::{Resolved, resolve};
use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("{location}: {message}")]
    Store { location: String, message: String },
    #[error("the job at {0} has no completed checkpoint to snapshot yet")]
    NothingYet(String),
    /// The new pipeline cannot take the snapshot's state; nothing was started.
    #[error("the update is incompatible with the snapshot: {0}")]
    Incompatible(String),
}

/// How a signature says a Sql keeps aggregates rather than rows (`sql_keyed`): its groups'
/// aggregates, merged by the query after it; or an inner aggregate's rows and the sums of
/// the aggregates over them, merged by the two queries after it.
const KEPT_AS: &str = "; kept as ";
const AGGREGATES: &str = "aggregates merged by ";
const NESTED: &str = "inner aggregates and their sums merged by ";

/// Every keyed state's signature: a Combine's keys, and each accumulator's fn and columns; a
/// streaming Sql/Join's buffered input rows (or its groups' aggregates).
pub fn state_signatures(plan: &CompiledPlan) -> Vec<(String, String)> {
    plan.transforms
        .iter()
        .enumerate()
        .filter_map(|(t, ct)| match ct {
            CompiledTransform::Combine(op) => {
                let state = op.spec.state_schema().ok()?;
                let nk = op.spec.key_fields.len();
                let column =
                    |f: &arrow::datatypes::FieldRef| format!("{}: {}", f.name(), f.data_type());
                let keys: Vec<String> = state.fields()[..nk].iter().map(column).collect();
                let fns: Vec<String> = op
                    .spec
                    .aggregates
                    .iter()
                    .map(|a| format!("{} = {}", a.output, a.func.name()))
                    .collect();
                let columns: Vec<String> = state.fields()[nk..].iter().map(column).collect();
                // State per slice cannot become state per window, nor the other way round.
                let slices = op.slices.map_or(String::new(), |s| {
                    format!(
                        ", per slice of {} µs of windows of {} µs",
                        s.period_us, s.size_us
                    )
                });
                Some((
                    plan.plan.graph.transforms[t].name.clone(),
                    format!(
                        "keys [{}], {}, state [{}]{slices}",
                        keys.join(", "),
                        fns.join(", "),
                        columns.join(", ")
                    ),
                ))
            }
            // A streaming Sql/Join buffers its inputs' rows per window (or, in the global
            // window, per key): their schemas.
            CompiledTransform::Sql(op)
                if (op.windowed || op.keyed.is_some()) && plan.plan.is_streaming() =>
            {
                let tables: Vec<String> = op
                    .tables
                    .iter()
                    .map(|(table, c)| {
                        let fields: Vec<String> = plan.schemas[c]
                            .fields()
                            .iter()
                            .map(|f| format!("{}: {}", f.name(), f.data_type()))
                            .collect();
                        format!("{table} [{}]", fields.join(", "))
                    })
                    .collect();
                let buffers = match &op.keyed {
                    Some(k) => format!("key buffers (keys {:?}) of", k.fields),
                    None => "window buffers of".to_string(),
                };
                // Aggregates kept in place of rows are another state (`sql_keyed`).
                let merged = match op.keyed.as_ref() {
                    Some(SqlKeys { merge: Some(m), .. }) => format!("{KEPT_AS}{AGGREGATES}`{m}`"),
                    Some(SqlKeys {
                        nested: Some(n), ..
                    }) => format!("{KEPT_AS}{NESTED}`{}`", n.form()),
                    _ => String::new(),
                };
                Some((
                    plan.plan.graph.transforms[t].name.clone(),
                    format!("{buffers} {}{merged}", tables.join(", ")),
                ))
            }
            _ => None,
        })
        .collect()
}

/// Keeps the job's last completed checkpoint as snapshot `name`; returns its record.
pub async fn take(root: &str, name: &str) -> Result<CheckpointRecord, SnapshotError> {
    let log = CheckpointLog::open(root).map_err(store(root))?;
    let record = log
        .resume()
        .await
        .map_err(store(root))?
        .last
        .ok_or_else(|| SnapshotError::NothingYet(root.to_string()))?;
    let to = format!("{}/snapshots/{name}", root.trim_end_matches('/'));
    for (combine, _) in &record.states {
        for shard in 0..record.shards {
            let dir = format!("{}/shard-{shard}", state_name(combine));
            copy_shard(
                &format!("{}/state/{dir}", root.trim_end_matches('/')),
                &format!("{to}/state/{dir}"),
                record.id,
            )
            .await?;
        }
    }
    let json = serde_json::to_vec_pretty(&record).map_err(store(&to))?;
    put(&to, "record.json", json).await?;
    Ok(record)
}

/// Starts a job at `root` (which has no checkpoints yet) from the snapshot at `snapshot`,
/// renaming transforms by `mapping` (old name → new name; an empty new name drops a state).
/// Refuses an update that cannot take the snapshot's state, before writing anything.
pub async fn restore(
    snapshot: &str,
    root: &str,
    plan: &CompiledPlan,
    shards: u32,
    mapping: &BTreeMap<String, String>,
) -> Result<CheckpointRecord, SnapshotError> {
    let old: CheckpointRecord =
        serde_json::from_slice(&get(snapshot, "record.json").await?).map_err(store(snapshot))?;
    let log = CheckpointLog::open(root).map_err(store(root))?;
    let resume = log.resume().await.map_err(store(root))?;
    if resume.last.is_some() || resume.pending.is_some() {
        return Err(SnapshotError::Incompatible(format!(
            "{root} already holds a job's checkpoints: resume that job, or start from the snapshot in a new checkpoint directory"
        )));
    }
    let new = check(&old, plan, shards, mapping).map_err(SnapshotError::Incompatible)?;
    for ((old_name, _), (new_name, _)) in old
        .states
        .iter()
        .filter(|(n, _)| renamed(mapping, n).is_some())
        .zip(&new.states)
    {
        for shard in 0..old.shards {
            copy_shard(
                &format!("{snapshot}/state/{}/shard-{shard}", state_name(old_name)),
                &format!(
                    "{}/state/{}/shard-{shard}",
                    root.trim_end_matches('/'),
                    state_name(new_name)
                ),
                old.id,
            )
            .await?;
        }
    }
    let json = serde_json::to_vec_pretty(&new).map_err(store(root))?;
    put(
        &format!("{}/checkpoints", root.trim_end_matches('/')),
        &format!("{:010}.done.json", new.id),
        json,
    )
    .await?;
    Ok(new)
}

/// Could `plan` continue the job whose checkpoints are at `root`, keeping its state? Checks
/// against its last completed checkpoint, as an update would restore it (a job without one has
/// no state to keep: anything goes).
pub async fn check_update(
    root: &str,
    plan: &CompiledPlan,
    shards: u32,
    mapping: &BTreeMap<String, String>,
) -> Result<(), SnapshotError> {
    let log = CheckpointLog::open(root).map_err(store(root))?;
    match log.resume().await.map_err(store(root))?.last {
        None => Ok(()),
        Some(last) => check(&last, plan, shards, mapping)
            .map(drop)
            .map_err(SnapshotError::Incompatible),
    }
}

fn renamed<'a>(mapping: &'a BTreeMap<String, String>, name: &'a str) -> Option<&'a str> {
    match mapping.get(name) {
        Some(n) if n.is_empty() => None,
        Some(n) => Some(n),
        None => Some(name),
    }
}

/// The snapshot's record as the new pipeline sees it, or why the pipeline cannot take it.
fn check(
    old: &CheckpointRecord,
    plan: &CompiledPlan,
    shards: u32,
    mapping: &BTreeMap<String, String>,
) -> Result<CheckpointRecord, String> {
    if old.shards != shards {
        return Err(format!(
            "the snapshot's state is in {} shards and this run has {shards}: run with --shuffle-partitions {}",
            old.shards, old.shards
        ));
    }
    let signatures: BTreeMap<String, String> = state_signatures(plan).into_iter().collect();
    let mut states = vec![];
    for (name, sig) in &old.states {
        let Some(new_name) = renamed(mapping, name) else {
            continue;
        };
        match signatures.get(new_name) {
            None => {
                return Err(format!(
                    "the snapshot holds the state of Combine '{name}', and the pipeline has no Combine '{new_name}': keep its name, map it with transformNameMapping, or map it to \"\" to drop its state"
                ));
            }
            // A Sql's rows, kept before it could keep aggregates, go on as rows (`sql_keyed`).
            Some(s) if s != sig && !s.starts_with(&format!("{sig}{KEPT_AS}")) => {
                return Err(format!(
                    "Combine '{new_name}' keeps other state than '{name}' did: the snapshot's is ({sig}), the pipeline's is ({s})"
                ));
            }
            Some(_) => states.push((new_name.to_string(), sig.clone())),
        }
    }
    // Sources by name, with their partitions when the config fixes them (a generator's; a
    // log's are the broker's, which the offsets follow as they are).
    let sources: BTreeMap<String, Option<u32>> = plan
        .transforms
        .iter()
        .enumerate()
        .filter_map(|(t, ct)| match ct {
            CompiledTransform::ReadStream(r) => Some((
                plan.plan.graph.transforms[t].name.clone(),
                match &r.spec {
                    riverbank_engine::compile::StreamSpec::Generator(c) => Some(c.partitions()),
                    riverbank_engine::compile::StreamSpec::Connector(_) => None,
                    riverbank_engine::compile::StreamSpec::Bounded(b) => Some(b.partitions()),
                },
            )),
            _ => None,
        })
        .collect();
    let mut partitions: BTreeMap<&str, u32> = BTreeMap::new();
    for (name, p, _) in &old.offsets {
        let e = partitions.entry(name).or_default();
        *e = (*e).max(p + 1);
    }
    for (name, n) in &partitions {
        let Some(new_name) = renamed(mapping, name) else {
            continue;
        };
        match sources.get(new_name) {
            None => {
                return Err(format!(
                    "the snapshot read source '{name}', and the pipeline has no unbounded source '{new_name}'"
                ));
            }
            Some(Some(m)) if m != n => {
                return Err(format!(
                    "source '{new_name}' has {m} partitions, the snapshot's '{name}' had {n}: its offsets would not line up"
                ));
            }
            Some(_) => {}
        }
    }
    let rename = |v: &[(String, u32, u64)]| -> Vec<(String, u32, u64)> {
        v.iter()
            .filter_map(|(n, p, x)| Some((renamed(mapping, n)?.to_string(), *p, *x)))
            .collect()
    };
    Ok(CheckpointRecord {
        offsets: rename(&old.offsets),
        watermarks: old
            .watermarks
            .iter()
            .filter_map(|(n, p, w)| Some((renamed(mapping, n)?.to_string(), *p, *w)))
            .collect(),
        states,
        committed: vec![],
        ..old.clone()
    })
}

/// Copies one shard's checkpoint `id`: its manifest and the files it names.
async fn copy_shard(from: &str, to: &str, id: u64) -> Result<(), SnapshotError> {
    let manifest = match get_opt(from, &format!("manifest-{id}.json")).await? {
        Some(m) => m,
        // A shard that never held state has no checkpoint: nothing to copy.
        None => return Ok(()),
    };
    let m: super::state::Manifest = serde_json::from_slice(&manifest).map_err(store(from))?;
    for f in m.files() {
        put(to, &f, get(from, &f).await?).await?;
    }
    put(to, &format!("manifest-{id}.json"), manifest).await
}

fn store<E: std::fmt::Display>(at: &str) -> impl Fn(E) -> SnapshotError + '_ {
    move |e| SnapshotError::Store {
        location: at.to_string(),
        message: e.to_string(),
    }
}

fn object(prefix: &str, name: &str) -> Result<(Resolved, object_store::path::Path), SnapshotError> {
    let r = resolve(prefix).map_err(store(prefix))?;
    let key = if r.key.is_empty() {
        name.to_string()
    } else {
        format!("{}/{name}", r.key.trim_end_matches('/'))
    };
    let path = r.with_key(key).path().map_err(store(prefix))?;
    Ok((r, path))
}

async fn put(prefix: &str, name: &str, bytes: Vec<u8>) -> Result<(), SnapshotError> {
    let (r, path) = object(prefix, name)?;
    r.store
        .put(&path, PutPayload::from(bytes))
        .await
        .map(|_| ())
        .map_err(store(prefix))
}

async fn get_opt(prefix: &str, name: &str) -> Result<Option<Vec<u8>>, SnapshotError> {
    let (r, path) = object(prefix, name)?;
    match r.store.get(&path).await {
        Ok(g) => Ok(Some(g.bytes().await.map_err(store(prefix))?.to_vec())),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(store(prefix)(e)),
    }
}

async fn get(prefix: &str, name: &str) -> Result<Vec<u8>, SnapshotError> {
    get_opt(prefix, name)
        .await?
        .ok_or_else(|| SnapshotError::Store {
            location: format!("{prefix}/{name}"),
            message: "not found".into(),
        })
}
