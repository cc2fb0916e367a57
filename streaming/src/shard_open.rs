//! State shards kept open between checkpoints on the worker that owns them. Opening a redb
//! store every checkpoint costs its open and, worse, forgets the chain of incremental
//! checkpoints, so every checkpoint uploaded a full copy of the store. A shard stays open
//! while its checkpoints keep coming here in order; one that moved away and back, or whose
//! checkpoint failed, is reopened (or restored) by its version. A shard that moved away for
//! good (a rescale, a drained job) is closed once it has been idle for [`IDLE`], so its cache
//! and file handle do not outlive its ownership.
use super::shard::state_name;
use super::state::ShardStore;
use riverbank_engine::error::RunError;
use riverbank_engine::shards::ShardOutput;
use riverbank_engine::work::CheckpointCtx;
use riverbank_io::unbounded::END_OF_TIME;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an open shard may go without a checkpoint before it is closed: far longer than
/// any checkpoint interval, so a shard in use is never closed between two of its checkpoints.
pub const IDLE: Duration = Duration::from_secs(120);

type Open = HashMap<(PathBuf, u32), (ShardStore, Instant)>;

fn open() -> &'static Mutex<Open> {
    static OPEN: OnceLock<Mutex<Open>> = OnceLock::new();
    OPEN.get_or_init(Default::default)
}

/// The open store of shard `shard` under `dir` if it is at checkpoint `version`; an open
/// store at another version is closed (the caller opens the file or restores it).
pub fn take(dir: &Path, shard: u32, version: u64) -> Option<ShardStore> {
    let (store, _) = open()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&(dir.to_path_buf(), shard))?;
    match store.version() {
        Ok(v) if v == version && version > 0 => Some(store),
        _ => None,
    }
}

/// Keeps `store` open for the shard's next checkpoint, and closes the shards idle too long.
pub fn keep(dir: &Path, store: ShardStore) {
    let now = Instant::now();
    let key = (dir.to_path_buf(), store.shard());
    let mut open = open().lock().unwrap_or_else(|p| p.into_inner());
    close_idle(&mut open, now);
    open.insert(key, (store, now));
}

/// A state shard's store for one checkpoint, and where its checkpoints go.
pub struct ShardAt {
    pub store: ShardStore,
    dir: PathBuf,
    prefix: String,
    name: String,
}

/// A state error of transform `name`'s shard.
pub fn state_err(name: &str) -> impl Fn(super::state::StateError) -> RunError + '_ {
    move |source| RunError::State {
        transform: name.to_string(),
        source: Box::new(source),
    }
}

impl ShardAt {
    /// Shard `shard` of transform `name` as of the checkpoint before `ctx.id`: the store kept
    /// open here, else the local file or a restore from `tempLocation`. Named after the
    /// transform, not its stage: an updated pipeline finds its state by name.
    pub async fn open(
        state_dir: &Path,
        name: &str,
        shard: u32,
        cache_bytes: usize,
        ctx: &CheckpointCtx,
    ) -> Result<ShardAt, RunError> {
        let dir = state_dir.join(state_name(name));
        let prefix = format!("{}/{}/shard-{shard}", ctx.state_prefix, state_name(name));
        let at = ctx.restore_from(name);
        let store = match take(&dir, shard, at) {
            Some(s) => s,
            None => open_at(&dir, shard, cache_bytes, &prefix, at)
                .await
                .map_err(state_err(name))?,
        };
        Ok(ShardAt {
            store,
            dir,
            prefix,
            name: name.to_string(),
        })
    }

    /// Checkpoints the store as `ctx.id` (the drain's, the last, names any full copy written
    /// meanwhile), notes the state's and the upload's bytes in `out`, and keeps the store open
    /// for the shard's next checkpoint here. Only a store whose checkpoint succeeded stays
    /// open: a failed one is reopened from disk or restored, by its version.
    pub async fn checkpoint(
        mut self,
        ctx: &CheckpointCtx,
        out: &mut ShardOutput,
    ) -> Result<(), RunError> {
        let serr = state_err(&self.name);
        self.store.set_version(ctx.id).map_err(&serr)?;
        if ctx.watermark == END_OF_TIME {
            self.store.settle().await;
        }
        let manifest = self
            .store
            .checkpoint(ctx.id, &self.prefix)
            .await
            .map_err(&serr)?;
        out.checkpoint_bytes = manifest.uploaded_bytes;
        out.state_bytes = self.store.disk_bytes();
        keep(&self.dir, self.store);
        Ok(())
    }
}

/// The shard as of checkpoint `id`: the local store if it is there already (the usual case: a
/// shard stays on its worker), else restored from `tempLocation` (it moved, or the worker
/// lost its disk), or empty before the first checkpoint.
async fn open_at(
    dir: &Path,
    shard: u32,
    cache: usize,
    prefix: &str,
    id: u64,
) -> Result<ShardStore, super::state::StateError> {
    if id == 0 {
        let _ = std::fs::remove_file(dir.join(format!("shard-{shard}.redb")));
        return ShardStore::open(dir, shard, cache);
    }
    if dir.join(format!("shard-{shard}.redb")).exists() {
        let local = ShardStore::open(dir, shard, cache)?;
        if local.version()? == id {
            return Ok(local);
        }
        drop(local);
    }
    ShardStore::restore(dir, shard, cache, prefix, id).await
}

/// Drops (closes) every store last kept more than [`IDLE`] before `now`.
fn close_idle(open: &mut Open, now: Instant) {
    open.retain(|(dir, shard), (_, kept)| {
        let idle = now.saturating_duration_since(*kept) > IDLE;
        if idle {
            tracing::debug!(dir = %dir.display(), shard, "closing a state shard idle since its last checkpoint here");
        }
        !idle
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_idle_past_the_limit_is_closed_and_one_in_use_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut open = Open::new();
        let now = Instant::now();
        for shard in [0, 1] {
            let store = ShardStore::open(dir.path(), shard, 1 << 20).unwrap();
            open.insert((dir.path().to_path_buf(), shard), (store, now));
        }
        let later = now + IDLE + Duration::from_secs(1);
        // Shard 1 had a checkpoint recently; shard 0 moved away.
        open.get_mut(&(dir.path().to_path_buf(), 1)).unwrap().1 = later;
        close_idle(&mut open, later);
        let left: Vec<u32> = open.keys().map(|(_, s)| *s).collect();
        assert_eq!(left, [1]);
        // The closed shard's file can be opened again (its handle was released).
        ShardStore::open(dir.path(), 0, 1 << 20).unwrap();
    }
}
