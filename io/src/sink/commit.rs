//! Committing a sink (temp parts into their final names, stale shards deleted) and
//! throwing its temp parts away.

use std::ops::Range;

use arrow::datatypes::SchemaRef;
use futures::TryStreamExt;
use object_store::{ObjectMeta, ObjectStoreExt};

use super::super::IoError;
use super::super::location::{Resolved, TEMP_DIR_PREFIX, key_to_path, resolve};
use super::merge::write_merged;
use super::naming::Naming;
use super::{TempPart, WriteOptions};

/// Moves parts into their final names and returns those names (in shard order).
///
/// - Shard count: `num_shards` if set; else one shard per part (at least one).
///   With nothing written at all, empty shard(s) are still written: CSV gets a
///   header when the schema is known, Parquet a zero-row file with the schema,
///   JSON/text an empty file.
/// - When the shard count differs from the number of parts, shard `i` gets a
///   contiguous run of parts (runs differ in length by at most one; when there
///   are fewer parts than shards, the last shards are empty). Text formats are
///   concatenated byte-wise (CSV keeps only the first header); Parquet parts are
///   re-read and re-written.
/// - Moving: a lone part is renamed (an atomic `rename(2)` locally; copy + delete
///   on stores without rename). Merged shards are written through a staging
///   file / multipart upload, so they appear atomically too.
/// - Stale shards: Beam does not do this, but existing files matching the
///   template with any shard count (`{prefix}-?????-of-?????{suffix}` by
///   default) that are not part of this commit are deleted, because shards of an
///   earlier run with a different count would be read together with the new ones.
/// - Re-running after a failure (a coordinator that died mid-commit commits again
///   after its restart): a lone part whose temp file is gone but whose final file
///   exists counts as already moved. Merged parts are only deleted once every
///   shard is written, so a merged shard with a part gone was written by the
///   earlier run and is kept (gone with no shard written is data lost: an error);
///   otherwise merged shards are rebuilt from their parts.
/// - Finally the sink's temp directory is removed (best effort).
pub async fn commit_sink(
    opts: &WriteOptions,
    schema: Option<SchemaRef>,
    parts: Vec<TempPart>,
) -> Result<Vec<String>, IoError> {
    let (finals, temps) = commit_parts(opts, schema, parts).await?;
    remove_temps(&temps).await;
    Ok(finals)
}

/// As [`commit_sink`], for one of several sets of shards a sink commits from its temp
/// directory (a streaming sink's windows): only these parts' temp files are deleted, the
/// directory stays for the other sets ([`cleanup_temp`] removes it after the last).
pub async fn commit_sink_set(
    opts: &WriteOptions,
    schema: Option<SchemaRef>,
    parts: Vec<TempPart>,
) -> Result<Vec<String>, IoError> {
    let (finals, temps) = commit_parts(opts, schema, parts).await?;
    delete_temp_files(&temps).await;
    Ok(finals)
}

async fn commit_parts(
    opts: &WriteOptions,
    schema: Option<SchemaRef>,
    parts: Vec<TempPart>,
) -> Result<(Vec<String>, Vec<Resolved>), IoError> {
    let naming = Naming::new(opts)?;
    let mut parts = parts;
    parts.sort_by(|a, b| (a.part, &a.location).cmp(&(b.part, &b.location)));
    let shards = naming.shard_count(opts.num_shards, parts.len())?;
    let finals = (0..shards)
        .map(|i| resolve(&naming.file_name(i, shards)))
        .collect::<Result<Vec<_>, _>>()?;
    let temps = parts
        .iter()
        .map(|p| resolve(&p.location))
        .collect::<Result<Vec<_>, _>>()?;

    for (shard, range) in shard_ranges(parts.len(), shards).into_iter().enumerate() {
        let target = &finals[shard];
        if range.len() == 1 {
            move_part(&temps[range.start], target).await?;
        } else if merged_by_an_earlier_run(&temps[range.clone()], target).await? {
            tracing::info!(shard, location = %target.display(), "written by an earlier commit");
        } else {
            let group: Vec<(&TempPart, &Resolved)> =
                parts[range.clone()].iter().zip(&temps[range]).collect();
            write_merged(opts.format, &schema, &group, &parts, &temps, target).await?;
        }
        tracing::debug!(shard, location = %target.display(), "committed shard");
    }

    delete_stale(&naming, &finals).await?;
    Ok((finals.iter().map(Resolved::display).collect(), temps))
}

/// True when a merged shard's part is gone, which only the cleanup after every shard was
/// written does, and the shard exists. A part gone with the shard missing is data lost.
async fn merged_by_an_earlier_run(temps: &[Resolved], target: &Resolved) -> Result<bool, IoError> {
    for temp in temps {
        if !exists(temp).await? {
            return if exists(target).await? {
                Ok(true)
            } else {
                Err(IoError::Commit {
                    location: target.display(),
                    detail: format!(
                        "temp part {} is gone but this shard was never written",
                        temp.display()
                    ),
                })
            };
        }
    }
    Ok(false)
}

async fn exists(r: &Resolved) -> Result<bool, IoError> {
    match r.store.head(&r.path()?).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(IoError::store("check", r.display(), e)),
    }
}

/// Deletes the temp files of `parts` (best effort; failures are logged). Only those files:
/// the sink's temp directory also holds the parts of other items, which a discarded attempt
/// must not take with it ([`cleanup_temp`] removes the directory at the job's end). Final
/// files are never touched.
pub async fn abort_sink(opts: &WriteOptions, parts: Vec<TempPart>) {
    let temps: Vec<Resolved> = parts
        .iter()
        .filter_map(|p| match resolve(&p.location) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(sink = %opts.path, error = %e, "cannot resolve temp part");
                None
            }
        })
        .collect();
    delete_temp_files(&temps).await;
}

/// Removes this sink's whole temp directory for a job, including files of
/// writers that never reported a part (crashed workers). Best effort.
pub async fn cleanup_temp(opts: &WriteOptions, job_token: &str) {
    let result = async {
        let naming = Naming::new(opts)?;
        let (resolved, dir) = naming.temp_dir_key(job_token)?;
        remove_temp_dir(&resolved.with_key(dir)).await;
        Ok::<_, IoError>(())
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(sink = %opts.path, error = %e, "cannot clean up sink temp directory");
    }
}

/// Contiguous part ranges per shard: boundaries at ceil(i * parts / shards).
fn shard_ranges(parts: usize, shards: usize) -> Vec<Range<usize>> {
    let bound = |i: usize| (i * parts).div_ceil(shards);
    (0..shards).map(|i| bound(i)..bound(i + 1)).collect()
}

async fn move_part(temp: &Resolved, target: &Resolved) -> Result<(), IoError> {
    let from = temp.path()?;
    let to = target.path()?;
    let err = match temp.store.rename(&from, &to).await {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    if matches!(err, object_store::Error::NotFound { .. }) && target.store.head(&to).await.is_ok() {
        // Moved by an earlier, interrupted commit.
        return Ok(());
    }
    Err(IoError::store(
        "move temp part into place:",
        format!("{} -> {}", temp.display(), target.display()),
        err,
    ))
}

/// Deletes files from earlier runs that match the shard pattern but are not ours.
async fn delete_stale(naming: &Naming, finals: &[Resolved]) -> Result<(), IoError> {
    let Some(glob) = naming.stale_name_glob() else {
        return Ok(());
    };
    let matcher = globset::GlobBuilder::new(&glob)
        .literal_separator(true)
        .build()
        .map_err(|e| IoError::SinkOptions {
            location: naming.prefix.clone(),
            message: format!("cannot build a pattern for stale shards: {e}"),
        })?
        .compile_matcher();
    let (resolved, dir) = naming.dir()?;
    let dir_path = key_to_path(&dir, &resolved.display_key(&dir))?;
    let listing = match resolved.store.list_with_delimiter(Some(&dir_path)).await {
        Ok(listing) => listing,
        Err(object_store::Error::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(IoError::store("list", resolved.display_key(&dir), e)),
    };
    for object in listing.objects {
        let is_ours = finals.iter().any(|f| f.key == object.location.as_ref());
        let matches = object
            .location
            .filename()
            .is_some_and(|name| matcher.is_match(name));
        if matches && !is_ours {
            tracing::info!(location = %resolved.display_path(&object.location), "deleting stale shard");
            match resolved.store.delete(&object.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    return Err(IoError::store(
                        "delete stale shard",
                        resolved.display_path(&object.location),
                        e,
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Deletes temp files and then their (sink) temp directories: after a commit, when every
/// part of the sink has been moved or merged.
async fn remove_temps(temps: &[Resolved]) {
    delete_temp_files(temps).await;
    let mut dirs: Vec<Resolved> = Vec::new();
    for temp in temps {
        let dir = temp.with_key(temp.parent_key());
        if !dirs.iter().any(|d| d.key == dir.key) {
            dirs.push(dir);
        }
    }
    for dir in dirs {
        remove_temp_dir(&dir).await;
    }
}

/// Deletes temp files, and nothing else.
async fn delete_temp_files(temps: &[Resolved]) {
    for temp in temps {
        if let Ok(path) = temp.path() {
            match temp.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    tracing::warn!(location = %temp.display(), error = %e, "cannot delete temp part")
                }
            }
        }
    }
}

/// Removes a sink temp dir (`.../.temp-riverbank-{token}/{sink}`) and everything in
/// it, then the job dir if that became empty. Refuses any other directory.
async fn remove_temp_dir(dir: &Resolved) {
    let parent = dir.parent_key();
    let job_dir_name = parent.rsplit('/').next().unwrap_or("");
    if !job_dir_name.starts_with(TEMP_DIR_PREFIX) {
        tracing::warn!(location = %dir.display(), "not a sink temp directory; leaving it alone");
        return;
    }
    if dir.is_local() {
        let local = dir.local_path(&dir.key);
        if let Err(e) = tokio::fs::remove_dir_all(&local).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(location = %dir.display(), error = %e, "cannot remove temp directory");
        }
        // Succeeds only once every sink of the job has cleaned up.
        let _ = tokio::fs::remove_dir(dir.local_path(&parent)).await;
        return;
    }
    let Ok(path) = dir.path() else { return };
    let listed: Result<Vec<ObjectMeta>, _> = dir.store.list(Some(&path)).try_collect().await;
    match listed {
        Ok(objects) => {
            for object in objects {
                if let Err(e) = dir.store.delete(&object.location).await {
                    tracing::warn!(location = %dir.display_path(&object.location), error = %e, "cannot delete temp file");
                }
            }
        }
        Err(e) => {
            tracing::warn!(location = %dir.display(), error = %e, "cannot list temp directory")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_contiguous_and_balanced() {
        assert_eq!(shard_ranges(5, 3), [0..2, 2..4, 4..5]);
        assert_eq!(shard_ranges(2, 3), [0..1, 1..2, 2..2]);
        assert_eq!(shard_ranges(0, 2), [0..0, 0..0]);
        assert_eq!(shard_ranges(4, 4), [0..1, 1..2, 2..3, 3..4]);
    }
}
