//! Garbage collection of a streaming job's checkpoint directory: only the last `retained`
//! checkpoints can be resumed from, so older log entries go, and every state file (full copy,
//! delta, manifest) that no retained checkpoint's manifest names. Named snapshots are copies
//! under `snapshots/`, never touched. Runs on the driver between checkpoints, when no shard
//! item of the job is writing; files of checkpoints at or after the oldest retained one are
//! never deleted.
use super::state::Manifest;
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use riverbank_io::location::{Resolved, resolve};
use std::collections::{BTreeMap, BTreeSet};

/// What one collection deleted.
#[derive(Debug, Default, PartialEq)]
pub struct Collected {
    pub log_files: usize,
    pub state_files: usize,
}

/// Deletes what checkpoints before `last - retained + 1` alone needed, under `root` (the
/// checkpoint directory). `retained == 0` keeps everything.
pub async fn collect(root: &str, last: u64, retained: u64) -> Result<Collected, String> {
    let mut out = Collected::default();
    if retained == 0 || last < retained {
        return Ok(out);
    }
    let oldest = last + 1 - retained;
    let root = root.trim_end_matches('/');
    for (name, path, r) in list(&format!("{root}/checkpoints")).await? {
        let id = name
            .strip_suffix(".plan.json")
            .or_else(|| name.strip_suffix(".done.json"))
            .and_then(|n| n.parse::<u64>().ok());
        if id.is_some_and(|id| id < oldest) {
            delete(&r, &path).await?;
            out.log_files += 1;
        }
    }
    // State: per shard directory, the manifests still needed and the files they name.
    let mut shards: BTreeMap<String, Vec<(String, object_store::path::Path, Resolved)>> =
        BTreeMap::new();
    for f in list(&format!("{root}/state")).await? {
        let dir =
            f.1.as_ref()
                .rsplit_once('/')
                .map_or("", |d| d.0)
                .to_string();
        shards.entry(dir).or_default().push(f);
    }
    for files in shards.values() {
        let ids = |prefix: &str, suffix: &str| -> Vec<u64> {
            files
                .iter()
                .filter_map(|f| f.0.strip_prefix(prefix)?.strip_suffix(suffix)?.parse().ok())
                .collect()
        };
        let manifests = ids("manifest-", ".json");
        // A shard without a manifest since `oldest` keeps its newest one.
        let newest_before = manifests.iter().copied().filter(|m| *m < oldest).max();
        let kept: BTreeSet<u64> = manifests
            .iter()
            .copied()
            .filter(|m| *m >= oldest || Some(*m) == newest_before)
            .collect();
        let mut named = BTreeSet::new();
        // The newest full copy a manifest is based on: a newer one is a dump being written
        // (or written and not named yet) that a coming checkpoint bases itself on.
        let mut newest_full = 0;
        for m in &kept {
            let f = files
                .iter()
                .find(|f| f.0 == format!("manifest-{m}.json"))
                .expect("listed");
            let bytes =
                f.2.store
                    .get(&f.1)
                    .await
                    .map_err(|e| e.to_string())?
                    .bytes()
                    .await
                    .map_err(|e| e.to_string())?;
            let manifest: Manifest =
                serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", f.1))?;
            newest_full = newest_full.max(manifest.full);
            named.extend(manifest.files());
        }
        for (name, path, r) in files {
            let id = ["manifest-", "full-", "delta-"]
                .iter()
                .find_map(|p| name.strip_prefix(p))
                .and_then(|n| n.split('.').next())
                .and_then(|n| n.parse::<u64>().ok());
            let Some(id) = id else { continue };
            let needed = if name.starts_with("manifest-") {
                kept.contains(&id)
            } else {
                named.contains(name) || (name.starts_with("full-") && id > newest_full)
            };
            if !needed && id < oldest {
                delete(r, path).await?;
                out.state_files += 1;
            }
        }
    }
    Ok(out)
}

/// Every object under `location`: (file name, path, its store).
async fn list(location: &str) -> Result<Vec<(String, object_store::path::Path, Resolved)>, String> {
    let r = resolve(location).map_err(|e| e.to_string())?;
    let prefix = r.path().map_err(|e| e.to_string())?;
    let metas: Vec<object_store::ObjectMeta> = match r.store.list(Some(&prefix)).try_collect().await
    {
        Ok(m) => m,
        Err(object_store::Error::NotFound { .. }) => vec![],
        Err(e) => return Err(format!("{location}: {e}")),
    };
    Ok(metas
        .into_iter()
        .map(|m| {
            let name = m.location.filename().unwrap_or_default().to_string();
            (name, m.location, r.clone())
        })
        .collect())
}

async fn delete(r: &Resolved, path: &object_store::path::Path) -> Result<(), String> {
    match r.store.delete(path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(format!("delete {path}: {e}")),
    }
}
